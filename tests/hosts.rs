//! Ember on many hosts, made of network namespaces (see `common/netns.rs`): a three-node NATS
//! cluster with JetStream replicated three ways, a driver, executors and a client each on a
//! host of its own, and faults judged by a ledger of every task's side effects.

mod common;

use common::netns::{Host, Net};
use common::within;
use ember::client::EmberClient;
use ember::protocol::{Event, JobState, SubmitJob, TaskState};
use ember::subjects::Subjects;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::process::Child;

const LIMIT: Duration = Duration::from_secs(90);

/// Three NATS nodes routed to each other, JetStream on each, one per host.
struct NatsCluster {
    nodes: Vec<Host>,
    /// The nodes' processes, killed on drop.
    _processes: Vec<Child>,
}

impl NatsCluster {
    fn start(nodes: Vec<Host>, dir: &Path) -> Self {
        let binary = ember::server::find_binary().expect("nats-server");
        let routes: Vec<String> = nodes
            .iter()
            .map(|n| format!("nats-route://{}:6222", n.addr))
            .collect();
        let processes = nodes
            .iter()
            .map(|node| {
                let store = dir.join(&node.name);
                let config = dir.join(format!("{}.conf", node.name));
                std::fs::write(
                    &config,
                    format!(
                        "server_name: {name}\nlisten: {addr}:4222\n\
                         jetstream {{ store_dir: \"{store}\" }}\n\
                         cluster {{ name: ember, listen: {addr}:6222, routes: [{routes}] }}\n",
                        name = node.name,
                        addr = node.addr,
                        store = store.display(),
                        routes = routes.join(", "),
                    ),
                )
                .unwrap();
                node.command(&binary)
                    .arg("-c")
                    .arg(&config)
                    .stdout(std::process::Stdio::null())
                    .stderr(match std::env::var("EMBER_TEST_LOG") {
                        Ok(_) => std::process::Stdio::inherit(),
                        Err(_) => std::process::Stdio::null(),
                    })
                    .spawn()
                    .expect("nats-server starts")
            })
            .collect();
        NatsCluster {
            nodes,
            _processes: processes,
        }
    }

    /// Waits until every node takes connections, as seen from `from`.
    async fn listening(&self, from: &Host) {
        let addrs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("{}:4222", n.addr))
            .collect();
        from.run(move || async move {
            let deadline = Instant::now() + LIMIT;
            for addr in addrs {
                while tokio::net::TcpStream::connect(&addr).await.is_err() {
                    assert!(Instant::now() < deadline, "{addr} listens within {LIMIT:?}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        })
        .await
    }

    /// Every node's client URL, for `--nats-url`.
    fn url(&self) -> String {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("nats://{}:4222", n.addr))
            .collect();
        urls.join(",")
    }
}

/// An Ember process on `host`, of `cluster` on `url`.
fn ember(host: &Host, binary: &str, url: &str, cluster: &str, args: &[&str]) -> Child {
    host.command(binary)
        .args(["--nats-url", url, "--cluster", cluster])
        .args(args)
        .env(
            "RUST_LOG",
            std::env::var("EMBER_TEST_LOG").unwrap_or("warn".into()),
        )
        .spawn()
        .expect("an ember process starts")
}

/// A client of `cluster` on `url`, connected from the host it runs on, once the cluster's
/// driver answers.
async fn client(url: String, cluster: String) -> EmberClient {
    let deadline = Instant::now() + LIMIT;
    loop {
        let servers: Vec<async_nats::ServerAddr> =
            url.split(',').map(|u| u.parse().unwrap()).collect();
        if let Ok(nats) = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(2))
            .connect(servers)
            .await
        {
            let api = EmberClient::new(nats, Subjects::new(&cluster).unwrap());
            if api.executors().await.is_ok() {
                return api;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no driver answered within {LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A job of `tasks` commands, each of which sleeps `sleep`, records its run in `ledger` (a
/// file per run) and prints its index.
fn ledgered(tasks: u32, sleep: &str, ledger: &Path) -> SubmitJob {
    let script = format!(
        "sleep {sleep}; echo run > {}/$EMBER_TASK_INDEX.$$; echo $EMBER_TASK_INDEX",
        ledger.display()
    );
    let mut job = common::noops(tasks);
    job.tasks = vec![common::sh(&script)];
    job.name = "ledgered".into();
    job.max_failures = 8;
    job
}

/// The runs each task index made, from the ledger's files.
fn runs(ledger: &Path) -> BTreeMap<u32, u32> {
    let mut runs = BTreeMap::new();
    for entry in std::fs::read_dir(ledger).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let index: u32 = name.split('.').next().unwrap().parse().unwrap();
        *runs.entry(index).or_default() += 1;
    }
    runs
}

/// A directory of its own under the system's temporary one, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ember-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("ledger")).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the job's outcome and the cluster's event history say, judged: the job succeeded,
/// every task finished once with its own index as its output, every task ran (re-runs
/// allowed), and the history holds each task's FINISHED end once.
async fn judge(
    api: &EmberClient,
    cluster: &str,
    job_id: u64,
    tasks: u32,
    ledger: &Path,
) -> BTreeMap<u32, u32> {
    let ended = api.job(job_id).await.unwrap();
    assert_eq!(ended.state, JobState::Succeeded, "{ended:?}");
    let outcomes = api.results(job_id).await.unwrap();
    assert_eq!(outcomes.len() as u32, tasks);
    for outcome in &outcomes {
        assert_eq!(outcome.state, TaskState::Finished);
        let stdout = outcome.result.as_ref().and_then(|r| r["stdout"].as_str());
        assert_eq!(
            stdout.map(str::trim),
            Some(outcome.index.to_string().as_str()),
            "task {}'s output",
            outcome.index
        );
    }
    let runs = runs(ledger);
    assert_eq!(runs.len() as u32, tasks, "every task ran: {runs:?}");
    let subjects = Subjects::new(cluster).unwrap();
    let mut reader =
        ember::history::Reader::open(api.nats(), &subjects, ember::history::Start::All)
            .await
            .expect("the event history");
    let mut finished: BTreeMap<u64, u32> = BTreeMap::new();
    within(LIMIT, async {
        loop {
            let stored = reader.next().await;
            if let Ok(event @ Event::TaskEnd { .. }) = &stored.event {
                for (_, end) in event.ended() {
                    if end.state == TaskState::Finished {
                        *finished.entry(end.task_id).or_default() += 1;
                    }
                }
            }
            if stored.pending == 0 && finished.len() as u32 >= tasks {
                break;
            }
        }
    })
    .await;
    reader.close().await;
    assert_eq!(finished.len() as u32, tasks, "a FINISHED end for each task");
    assert!(
        finished.values().all(|n| *n == 1),
        "each FINISHED end once: {finished:?}"
    );
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_across_hosts_loses_nothing_when_an_executor_host_is_cut_off() {
    let Some(mut net) = Net::new() else {
        return;
    };
    let nodes: Vec<Host> = (1..=3).map(|n| net.host(&format!("n{n}"))).collect();
    let (driver_host, client_host) = (net.host("d1"), net.host("c1"));
    let workers = [net.host("e1"), net.host("e2")];
    let scratch = Scratch::new("hosts-cut");
    let ledger = scratch.0.join("ledger");
    let nats = NatsCluster::start(nodes, &scratch.0);
    nats.listening(&client_host).await;
    let (url, cluster) = (nats.url(), format!("hosts{}", std::process::id()));
    let _driver = ember(
        &driver_host,
        env!("CARGO_BIN_EXE_ember-driver"),
        &url,
        &cluster,
        &[
            "--journal",
            "on",
            "--executor-timeout",
            "2s",
            "--revive-interval",
            "200ms",
        ],
    );
    let _executors: Vec<Child> = workers
        .iter()
        .map(|host| {
            let args = ["--executor-id", &host.name];
            let args: Vec<&str> = args.into_iter().chain(common::FAST_EXECUTOR).collect();
            ember(
                host,
                env!("CARGO_BIN_EXE_ember-executor"),
                &url,
                &cluster,
                &args,
            )
        })
        .collect();
    const TASKS: u32 = 40;
    let job = ledgered(TASKS, "0.3", &ledger);
    let (url2, cluster2) = (url.clone(), cluster.clone());
    let job_id = client_host
        .run(move || async move {
            let api = client(url2, cluster2).await;
            let deadline = Instant::now() + LIMIT;
            while api.executors().await.unwrap().registered_executors < 2 {
                assert!(Instant::now() < deadline, "two executors register");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            api.submit(job).await.expect("the job is accepted")
        })
        .await;
    // Cut e1 off once tasks run, for twice the executor timeout, then heal it.
    common::netns::wait_until(LIMIT, "tasks run", || runs(&ledger).len() >= 4);
    let cut_at = Instant::now();
    workers[0].cut();
    tokio::time::sleep(Duration::from_secs(4)).await;
    workers[0].heal();
    let (ledger2, url2, cluster2) = (ledger.clone(), url.clone(), cluster.clone());
    let runs = client_host
        .run(move || async move {
            let api = client(url2, cluster2.clone()).await;
            within(LIMIT, api.wait(job_id, |_| {})).await.unwrap();
            judge(&api, &cluster2, job_id, TASKS, &ledger2).await
        })
        .await;
    let reruns: u32 = runs.values().map(|n| n - 1).sum();
    eprintln!(
        "ledger: {TASKS} tasks, {reruns} re-runs; the job ended {:.1} s after the cut",
        cut_at.elapsed().as_secs_f64()
    );
    drop(nats);
}
