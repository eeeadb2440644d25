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
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::process::Child;

const LIMIT: Duration = Duration::from_secs(90);

/// Three NATS nodes routed to each other, JetStream on each, one per host.
struct NatsCluster {
    nodes: Vec<Host>,
    binary: PathBuf,
    configs: Vec<PathBuf>,
    /// The nodes' processes, killed on drop; `None` for a node killed.
    processes: Vec<Option<Child>>,
}

/// The accounts of nats-advisories.conf: Ember's account imports its disconnect
/// advisories from the system account, and clients without credentials are its user.
const ACCOUNTS: &str = "system_account: SYS\n\
    accounts {\n\
      SYS: { exports: [{ stream: \"$SYS.ACCOUNT.*.DISCONNECT\", account_token_position: 3 }] }\n\
      EMBER: { jetstream: enabled, users: [{ user: ember, password: \"\" }], \
               imports: [{ stream: { account: SYS, subject: \"$SYS.ACCOUNT.EMBER.DISCONNECT\" } }] }\n\
    }\n\
    no_auth_user: ember\n";

impl NatsCluster {
    fn start(nodes: Vec<Host>, dir: &Path) -> Self {
        let routes: Vec<String> = nodes
            .iter()
            .map(|n| format!("nats-route://{}:6222", n.addr))
            .collect();
        let configs = nodes
            .iter()
            .map(|node| {
                let store = dir.join(&node.name);
                let config = dir.join(format!("{}.conf", node.name));
                std::fs::write(
                    &config,
                    format!(
                        "server_name: {name}\nlisten: {addr}:4222\nhttp: {addr}:8222\n\
                         jetstream {{ store_dir: \"{store}\" }}\n\
                         cluster {{ name: ember, listen: {addr}:6222, routes: [{routes}] }}\n\
                         {ACCOUNTS}",
                        name = node.name,
                        addr = node.addr,
                        store = store.display(),
                        routes = routes.join(", "),
                    ),
                )
                .unwrap();
                config
            })
            .collect();
        Self::with_configs(nodes, configs)
    }

    /// The servers of `configs`, each started on the host beside it.
    fn with_configs(nodes: Vec<Host>, configs: Vec<PathBuf>) -> Self {
        let binary = ember::server::find_binary().expect("nats-server");
        let mut cluster = NatsCluster {
            nodes,
            binary,
            configs,
            processes: Vec::new(),
        };
        cluster.processes = (0..cluster.nodes.len())
            .map(|n| Some(cluster.spawn(n)))
            .collect();
        cluster
    }

    fn spawn(&self, n: usize) -> Child {
        self.nodes[n]
            .command(&self.binary)
            .arg("-c")
            .arg(&self.configs[n])
            .stdout(std::process::Stdio::null())
            .stderr(match std::env::var("EMBER_TEST_LOG") {
                Ok(_) => std::process::Stdio::inherit(),
                Err(_) => self.log(n),
            })
            .spawn()
            .expect("nats-server starts")
    }

    /// Node `n`'s log, beside its configuration (`<config>.log`), appended to across restarts,
    /// for a kept scratch directory (`EMBER_TEST_KEEP`) to tell what the servers did.
    fn log(&self, n: usize) -> std::process::Stdio {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.configs[n].with_extension("log"))
            .map_or_else(|_| std::process::Stdio::null(), Into::into)
    }

    /// The index of the node named `name`.
    fn node(&self, name: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Kills node `n` with SIGKILL.
    async fn kill(&mut self, n: usize) {
        if let Some(mut process) = self.processes[n].take() {
            process.kill().await.expect("SIGKILL");
        }
    }

    /// Starts node `n` again, on its store.
    fn restart(&mut self, n: usize) {
        assert!(self.processes[n].is_none(), "node {n} runs");
        self.processes[n] = Some(self.spawn(n));
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
    ember_command(host, binary, url, cluster, args)
        .env(
            "RUST_LOG",
            std::env::var("EMBER_TEST_LOG").unwrap_or("warn".into()),
        )
        .spawn()
        .expect("an ember process starts")
}

/// An Ember process as [`ember`] starts it, logging at `info` (or `EMBER_TEST_LOG`) into
/// `log`, for a failure to tell what it did.
fn ember_logged(
    host: &Host,
    binary: &str,
    (url, cluster): (&str, &str),
    args: &[&str],
    log: &Path,
) -> Child {
    let file = std::fs::File::create(log).expect("a log file");
    ember_command(host, binary, url, cluster, args)
        .env(
            "RUST_LOG",
            std::env::var("EMBER_TEST_LOG").unwrap_or("info".into()),
        )
        .stderr(file)
        .spawn()
        .expect("an ember process starts")
}

fn ember_command(
    host: &Host,
    binary: &str,
    url: &str,
    cluster: &str,
    args: &[&str],
) -> tokio::process::Command {
    let mut command = host.command(binary);
    command
        .args(["--nats-url", url, "--cluster", cluster])
        .args(args);
    command
}

/// Ember's NATS flags for `cluster` on `url`, nothing else set.
fn nats_args(url: &str, cluster: &str) -> ember::connect::NatsArgs {
    ember::connect::NatsArgs {
        nats_url: Some(url.into()),
        cluster: cluster.into(),
        ..Default::default()
    }
}

/// A client of the cluster `args` name (with Ember's connection options), connected from the
/// host it runs on, once the cluster's driver answers.
async fn client(args: ember::connect::NatsArgs) -> EmberClient {
    answered_client(args)
        .await
        .unwrap_or_else(|| panic!("no driver answered within {LIMIT:?}"))
}

/// [`client`], or `None` when no driver answered within [`LIMIT`].
async fn answered_client(args: ember::connect::NatsArgs) -> Option<EmberClient> {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Ok(nats) = args.connect("hosts-test", None).await {
            let api = EmberClient::new(nats, Subjects::new(&args.cluster).unwrap());
            if api.executors().await.is_ok() {
                return Some(api);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
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
    /// Kept with `EMBER_TEST_KEEP=1`, for the drivers' logs.
    fn drop(&mut self) {
        if std::env::var("EMBER_TEST_KEEP").is_ok_and(|keep| keep == "1") {
            eprintln!("kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the job's outcome and the cluster's event history say, judged: the job succeeded,
/// every task finished once with its own index as its output, every task ran (re-runs
/// allowed), and the history holds each task's FINISHED end once.
/// What a faulted job left: how often each task ran, and the executors the driver removed
/// meanwhile (with why).
struct Judged {
    runs: BTreeMap<u32, u32>,
    removed: Vec<(String, String)>,
    /// When the job was seen to end: judged once it had (reading the history may wait for
    /// JetStream's elections, which the job did not).
    ended: Instant,
}

async fn judge(api: &EmberClient, cluster: &str, job_id: u64, tasks: u32, ledger: &Path) -> Judged {
    let seen_ended = Instant::now();
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
            "task {}'s output ({:?})",
            outcome.index,
            outcome.error
        );
    }
    let runs = runs(ledger);
    assert_eq!(runs.len() as u32, tasks, "every task ran: {runs:?}");
    let subjects = Subjects::new(cluster).unwrap();
    // Read once JetStream answers: a cluster just healed may still be electing leaders.
    let deadline = Instant::now() + LIMIT;
    let mut reader = loop {
        let start = ember::history::Start::All;
        match ember::history::Reader::open(api.nats(), &subjects, start).await {
            Ok(reader) => break reader,
            Err(error) => assert!(Instant::now() < deadline, "the event history: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut finished: BTreeMap<u64, u32> = BTreeMap::new();
    let mut removed = Vec::new();
    within(LIMIT, async {
        loop {
            let stored = reader.next().await;
            // An event of a deposed leader that reached the stream after its successor's
            // (sent before a cut, delivered after the heal) is superseded: readers leave it
            // out, as `ember events` does (see `driver::history`).
            let event = match &stored.event {
                Ok(event) if stored.current => Some(event),
                Ok(event) => {
                    eprintln!("a superseded event in the history, left out: {event:?}");
                    None
                }
                Err(_) => None,
            };
            if let Some(Event::ExecutorRemoved {
                executor_id,
                reason,
                ..
            }) = event
            {
                removed.push((executor_id.to_string(), reason.clone()));
            }
            if let Some(event @ Event::TaskEnd { .. }) = event {
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
    Judged {
        runs,
        removed,
        ended: seen_ended,
    }
}

/// The topology these tests share: three NATS nodes, `drivers` drivers, two executors and a
/// client, each on a host of its own; everything stopped and deleted on drop.
struct Site {
    // Dropped in order: the processes before the net they run in.
    drivers: Vec<Child>,
    _executors: Vec<Child>,
    nats: NatsCluster,
    driver_hosts: Vec<Host>,
    workers: Vec<Host>,
    client_host: Host,
    url: String,
    cluster: String,
    scratch: Scratch,
    _net: Net,
}

impl Site {
    /// The site, once two executors have registered with a leading driver; `None` when these
    /// tests are skipped.
    async fn start(tag: &str, drivers: usize) -> Option<Site> {
        let mut net = Net::new()?;
        let nodes: Vec<Host> = (1..=3).map(|n| net.host(&format!("n{n}"))).collect();
        let driver_hosts: Vec<Host> = (1..=drivers).map(|n| net.host(&format!("d{n}"))).collect();
        let workers = vec![net.host("e1"), net.host("e2")];
        let client_host = net.host("c1");
        let scratch = Scratch::new(tag);
        let nats = NatsCluster::start(nodes, &scratch.0);
        nats.listening(&client_host).await;
        let (url, cluster) = (nats.url(), format!("{tag}{}", std::process::id()));
        let flags = [
            "--journal",
            "on",
            "--executor-timeout",
            "2s",
            "--revive-interval",
            "200ms",
        ];
        let driver = env!("CARGO_BIN_EXE_ember-driver");
        let drivers = driver_hosts
            .iter()
            .map(|host| {
                let log = scratch.0.join(format!("{}.log", host.name));
                ember_logged(host, driver, (&url, &cluster), &flags, &log)
            })
            .collect();
        let executors = workers
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
        let site = Site {
            drivers,
            _executors: executors,
            nats,
            driver_hosts,
            workers,
            client_host,
            url,
            cluster,
            scratch,
            _net: net,
        };
        site.client(|api| async move {
            let deadline = Instant::now() + LIMIT;
            while api.executors().await.unwrap().registered_executors < 2 {
                assert!(Instant::now() < deadline, "two executors register");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        Some(site)
    }

    fn ledger(&self) -> PathBuf {
        self.scratch.0.join("ledger")
    }

    /// Runs `work` with a client on the client's host.
    async fn client<T, F, Fut>(&self, work: F) -> T
    where
        F: FnOnce(EmberClient) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
        T: Send + 'static,
    {
        let (url, cluster) = (self.url.clone(), self.cluster.clone());
        let done = self
            .client_host
            .run(move || async move {
                let api = answered_client(nats_args(&url, &cluster)).await?;
                Some(work(api).await)
            })
            .await;
        done.unwrap_or_else(|| {
            panic!(
                "no driver answered within {LIMIT:?}\n{}",
                self.drivers_said()
            )
        })
    }

    /// Whether each driver still runs, and the end of its log.
    fn drivers_said(&self) -> String {
        let mut said = String::new();
        for (driver, host) in self.drivers.iter().zip(&self.driver_hosts) {
            let state = driver
                .id()
                .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
                .and_then(|stat| Some(stat.rsplit_once(") ")?.1.chars().next()?.to_string()))
                .map_or("gone".to_string(), |state| match state.as_str() {
                    "Z" => "exited".to_string(),
                    _ => "running".to_string(),
                });
            let log = std::fs::read_to_string(self.scratch.0.join(format!("{}.log", host.name)))
                .unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(30)..].join("\n");
            said.push_str(&format!(
                "driver on {} ({state}), its log's end:\n{tail}\n",
                host.name
            ));
        }
        said
    }

    /// Submits a ledgered job of `tasks` tasks of `sleep` each.
    async fn submit(&self, tasks: u32, sleep: &str) -> u64 {
        let job = ledgered(tasks, sleep, &self.ledger());
        self.client(|api| async move { api.submit(job).await.expect("the job is accepted") })
            .await
    }

    /// Waits for job `job_id` to end and judges it (see [`judge`]); the runs of each task.
    async fn judge(&self, job_id: u64, tasks: u32) -> Judged {
        let (ledger, cluster) = (self.ledger(), self.cluster.clone());
        self.client(move |api| async move {
            within(LIMIT, api.wait(job_id, |_| {})).await.unwrap();
            judge(&api, &cluster, job_id, tasks, &ledger).await
        })
        .await
    }

    /// Which driver holds the lease now, by its index, if one does.
    /// Read from the key, not asked of the api: a request the old leader's server still
    /// takes for it goes unanswered for the client's whole timeout, which would be counted as
    /// time without a leader.
    async fn leader(&self) -> Option<usize> {
        let pids: Vec<Option<u32>> = self.drivers.iter().map(Child::id).collect();
        let args = nats_args(&self.url, &self.cluster);
        self.client_host
            .run(move || async move {
                let nats = args.connect("hosts-test", None).await.ok()?;
                let subjects = Subjects::new(&args.cluster).unwrap();
                let holder = common::holder_of(&nats, &subjects).await?;
                pids.iter().position(|pid| *pid == Some(holder.pid))
            })
            .await
    }
}

impl Site {
    /// Starts watching the api from the client's host: asked every 100 ms, each ask given 1 s.
    fn watch_api(&self) -> ApiWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let (url, cluster, host) = (
            self.url.clone(),
            self.cluster.clone(),
            self.client_host.clone(),
        );
        let stopped = stop.clone();
        let watching = tokio::spawn(async move {
            host.run(move || async move {
                // Counted from the watch's start: a first answer slow to come counts too.
                let started = Instant::now();
                let api = client(nats_args(&url, &cluster)).await;
                let mut answers = Answers {
                    started,
                    times: Vec::new(),
                };
                while !stopped.load(SeqCst) {
                    let asked = tokio::time::timeout(Duration::from_secs(1), api.executors()).await;
                    if matches!(asked, Ok(Ok(_))) {
                        answers.times.push(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                answers.times.push(Instant::now());
                answers
            })
            .await
        });
        ApiWatch { stop, watching }
    }

    /// The name of the NATS node that leads the cluster's journal stream.
    async fn journal_leader(&self) -> String {
        let stream = Subjects::new(&self.cluster).unwrap().journal_stream();
        self.client(move |api| async move {
            let js = async_nats::jetstream::new(api.nats().clone());
            let mut journal = js.get_stream(&stream).await.expect("the journal stream");
            let info = journal.info().await.expect("the journal's info");
            info.cluster
                .as_ref()
                .and_then(|c| c.leader.clone())
                .expect("the journal has a leader")
        })
        .await
    }
}

impl Site {
    /// The name of the NATS node that leads JetStream's meta group, from a node's monitoring
    /// port (`/jsz`), asked from the client's host.
    async fn meta_leader(&self) -> String {
        let addr = format!("{}:8222", self.nats.nodes[0].addr);
        self.client_host
            .run(move || async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let deadline = Instant::now() + LIMIT;
                loop {
                    let mut http = tokio::net::TcpStream::connect(&addr).await.expect("/jsz");
                    http.write_all(b"GET /jsz HTTP/1.0\r\n\r\n").await.unwrap();
                    let mut answer = String::new();
                    http.read_to_string(&mut answer).await.unwrap();
                    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
                    let jsz: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
                    if let Some(leader) = jsz["meta_cluster"]["leader"].as_str() {
                        return leader.to_string();
                    }
                    assert!(Instant::now() < deadline, "a meta leader: {answer}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await
    }
}

/// A watch of the api's answers, from [`Site::watch_api`].
struct ApiWatch {
    stop: Arc<AtomicBool>,
    watching: tokio::task::JoinHandle<Answers>,
}

impl ApiWatch {
    /// Stops watching: when the api answered.
    async fn stop(mut self) -> Answers {
        self.stop.store(true, SeqCst);
        (&mut self.watching).await.expect("the watch")
    }
}

/// When a watch heard the api answer, from its start; the watch's end counts as an answer.
struct Answers {
    started: Instant,
    times: Vec<Instant>,
}

impl Answers {
    /// The longest stretch without an answer.
    fn longest_silence(&self) -> Duration {
        let mut last = self.started;
        let mut longest = Duration::ZERO;
        for &time in &self.times {
            longest = longest.max(time - last);
            last = time;
        }
        longest
    }

    /// How long after `at` the api first answered.
    fn first_after(&self, at: Instant) -> Duration {
        self.times
            .iter()
            .find(|&&time| time >= at)
            .map_or(Duration::MAX, |&time| time - at)
    }
}

impl Drop for ApiWatch {
    /// A test that failed stops its watch too, or its runtime would wait for it for ever.
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
    }
}

/// The tasks of the jobs the faults interrupt.
const TASKS: u32 = 40;

impl Site {
    /// A site of `drivers` drivers, once a ledgered job of [`TASKS`] tasks of 0.3 s each is
    /// under way (four tasks have run); with the job's id.
    async fn mid_job(tag: &str, drivers: usize) -> Option<(Site, u64)> {
        let site = Site::start(tag, drivers).await?;
        let job_id = site.submit(TASKS, "0.3").await;
        let ledger = site.ledger();
        common::netns::wait_until(LIMIT, "tasks run", || runs(&ledger).len() >= 4);
        Some((site, job_id))
    }
}

/// Re-runs in a ledger: runs past each task's first.
fn reruns(runs: &BTreeMap<u32, u32>) -> u32 {
    runs.values().map(|n| n - 1).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_across_hosts_loses_nothing_when_an_executor_host_is_cut_off() {
    let Some((site, job_id)) = Site::mid_job("hostcut", 1).await else {
        return;
    };
    // Cut e1 off once tasks run, for twice the executor timeout, then heal it.
    let cut_at = Instant::now();
    site.workers[0].cut();
    tokio::time::sleep(Duration::from_secs(4)).await;
    site.workers[0].heal();
    let judged = site.judge(job_id, TASKS).await;
    eprintln!(
        "executor host cut: {TASKS} tasks, {} re-runs; the job ended {:.1} s after the cut",
        reruns(&judged.runs),
        (judged.ended - cut_at).as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_loses_nothing_while_every_executor_host_drops_two_percent_of_its_packets() {
    let Some(site) = Site::start("lossy", 1).await else {
        return;
    };
    for host in &site.workers {
        host.lossy(2);
    }
    const LOSSY_TASKS: u32 = 60;
    let started = Instant::now();
    let job_id = site.submit(LOSSY_TASKS, "0.1").await;
    let judged = site.judge(job_id, LOSSY_TASKS).await;
    for host in &site.workers {
        host.clear_loss();
    }
    eprintln!(
        "2% loss on every executor host: {LOSSY_TASKS} tasks, {} re-runs, {:.1} s",
        reruns(&judged.runs),
        (judged.ended - started).as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_leaders_host_is_cut_off_a_standby_leads_and_the_old_leader_stands_by() {
    let Some((site, job_id)) = Site::mid_job("leadercut", 2).await else {
        return;
    };
    let old = site.leader().await.expect("a driver leads");
    let watch = site.watch_api();
    let cut_at = Instant::now();
    site.driver_hosts[old].cut();
    // The other driver leads once the lease lapses; the cut one sends nothing acted upon.
    let deadline = Instant::now() + LIMIT;
    while site.leader().await != Some(1 - old) {
        assert!(Instant::now() < deadline, "the standby leads");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took_over = cut_at.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    site.driver_hosts[old].heal();
    let healed_at = Instant::now();
    let judged = site.judge(job_id, TASKS).await;
    let (runs, ended) = (judged.runs, judged.ended - cut_at);
    // Healed, the old leader stands by: the new one keeps the lease.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        site.leader().await,
        Some(1 - old),
        "the new leader keeps leading"
    );
    let answers = watch.stop().await;
    eprintln!(
        "leader's host cut: a standby led {:.1} s after the cut; the api went unanswered for \
         at most {:.1} s and answered {:.1} s after the heal; {TASKS} tasks, {} re-runs; the \
         job ended {:.1} s after the cut",
        took_over.as_secs_f64(),
        answers.longest_silence().as_secs_f64(),
        answers.first_after(healed_at).as_secs_f64(),
        reruns(&runs),
        ended.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ember_connection_leaves_a_nats_node_cut_off_for_a_live_one_within_seconds() {
    let Some(mut net) = Net::new() else {
        return;
    };
    let nodes: Vec<Host> = (1..=3).map(|n| net.host(&format!("n{n}"))).collect();
    let client_host = net.host("c1");
    let scratch = Scratch::new("nodecut");
    let nats = NatsCluster::start(nodes.clone(), &scratch.0);
    nats.listening(&client_host).await;
    let args = nats_args(&nats.url(), "nodecut");
    let (left_after, node) = client_host
        .run(move || async move {
            let client = args.connect("nodecut", None).await.expect("connects");
            let first = client.server_info().server_name;
            let node = nodes
                .iter()
                .find(|n| n.name == first)
                .expect("a node of ours");
            node.cut();
            let cut_at = Instant::now();
            // Connected again, to another node, and able to make a round trip there.
            let deadline = cut_at + LIMIT;
            loop {
                assert!(Instant::now() < deadline, "left {first} within {LIMIT:?}");
                if client.server_info().server_name != first
                    && client.connection_state() == async_nats::connection::State::Connected
                    && tokio::time::timeout(Duration::from_secs(1), client.flush())
                        .await
                        .is_ok_and(|flushed| flushed.is_ok())
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (cut_at.elapsed(), node.clone())
        })
        .await;
    node.heal();
    eprintln!(
        "a NATS node cut off: the connection on it was on another node {:.2} s later",
        left_after.as_secs_f64()
    );
    // NATS's own default (a ping every 60 s, two unanswered) would take minutes.
    assert!(
        left_after < Duration::from_secs(10),
        "the connection left the cut node only after {left_after:?}"
    );
}

/// What a NATS node killed in [`a_node_killed_mid_job`] does for the cluster.
#[derive(Clone, Copy, Debug)]
enum Role {
    /// It leads the journal's stream.
    JournalLeader,
    /// It leads JetStream's meta group (where streams are placed and their leaders chosen).
    MetaLeader,
    /// It leads neither.
    Follower,
}

/// Kills the node of `role` mid-job for 3 s, then restarts it on its store; judges the job
/// and prints the recovery's figures.
async fn a_node_killed_mid_job(tag: &str, role: Role) {
    let Some((mut site, job_id)) = Site::mid_job(tag, 1).await else {
        return;
    };
    let watch = site.watch_api();
    let (journal, meta) = (site.journal_leader().await, site.meta_leader().await);
    let node = match role {
        Role::JournalLeader => site.nats.node(&journal),
        Role::MetaLeader => site.nats.node(&meta),
        Role::Follower => (0..site.nats.nodes.len())
            .find(|&n| ![&journal, &meta].contains(&&site.nats.nodes[n].name))
            .expect("a node that leads neither"),
    };
    let name = site.nats.nodes[node].name.clone();
    let also = match (name == journal, name == meta) {
        (true, true) => "leads the journal's stream and the meta group",
        (true, false) => "leads the journal's stream",
        (false, true) => "leads the meta group",
        (false, false) => "leads neither the journal's stream nor the meta group",
    };
    let killed_at = Instant::now();
    site.nats.kill(node).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    site.nats.restart(node);
    let Judged {
        runs,
        removed,
        ended,
    } = site.judge(job_id, TASKS).await;
    // A server that dies tells nothing of its clients: they reconnect elsewhere, and none is
    // removed for a closed connection (one whose reconnect outlasts the 2 s heartbeat timeout
    // may be removed for that).
    let closed: Vec<_> = removed
        .iter()
        .filter(|(_, why)| why.contains("connection"))
        .collect();
    assert_eq!(
        closed,
        [] as [&(String, String); 0],
        "removed for a closed connection"
    );
    let ended = ended - killed_at;
    let answers = watch.stop().await;
    eprintln!(
        "a NATS node killed for 3 s ({role:?}: it {also}): {TASKS} tasks, {} re-runs; the api \
         went unanswered for at most {:.1} s; the job ended {:.1} s after the kill",
        reruns(&runs),
        answers.longest_silence().as_secs_f64(),
        ended.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_loses_nothing_when_the_journals_nats_node_is_killed_and_restarted() {
    a_node_killed_mid_job("nodekill", Role::JournalLeader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_loses_nothing_when_the_nats_meta_leader_is_killed_and_restarted() {
    a_node_killed_mid_job("metakill", Role::MetaLeader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_loses_nothing_when_a_nats_follower_is_killed_and_restarted() {
    a_node_killed_mid_job("followerkill", Role::Follower).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_loses_nothing_when_the_journals_nats_node_is_parted_from_the_other_two() {
    let Some((site, job_id)) = Site::mid_job("minority", 2).await else {
        return;
    };
    let watch = site.watch_api();
    let nodes = &site.nats.nodes;
    let parted = &nodes[site.nats.node(&site.journal_leader().await)];
    let others: Vec<&Host> = nodes.iter().filter(|n| n.name != parted.name).collect();
    let parted_at = Instant::now();
    parted.part_from(&others);
    tokio::time::sleep(Duration::from_secs(6)).await;
    parted.heal();
    let healed_at = Instant::now();
    let judged = site.judge(job_id, TASKS).await;
    let answers = watch.stop().await;
    eprintln!(
        "the journal's NATS node (its stream leader) parted from the other two for 6 s: \
         {TASKS} tasks, {} re-runs; the api went unanswered for at most {:.1} s and answered \
         {:.1} s after the heal; the job ended {:.1} s after the partition, {:.1} s after it \
         healed",
        reruns(&judged.runs),
        answers.longest_silence().as_secs_f64(),
        answers.first_after(healed_at).as_secs_f64(),
        (judged.ended - parted_at).as_secs_f64(),
        judged
            .ended
            .saturating_duration_since(healed_at)
            .as_secs_f64()
    );
}

/// The passwords `ember creds --password-file` wrote, by user.
fn passwords(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .expect("the password file")
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once(' '))
        .map(|(user, password)| (user.to_string(), password.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_sites_executors_finish_their_job_through_a_cut_of_the_leaf_link() {
    let Some(mut net) = Net::new() else {
        return;
    };
    let nodes: Vec<Host> = (1..=3).map(|n| net.host(&format!("n{n}"))).collect();
    let leaf = net.host("l1");
    let driver_host = net.host("d1");
    let edge = [net.host("x1"), net.host("x2")];
    let client_host = net.host("c1");
    let scratch = Scratch::new("edge");
    let cluster = format!("edge{}", std::process::id());
    // The servers' configs as `ember creds` writes them, with TLS on routes and leaf links.
    let (certs, conf, secrets) = (
        scratch.0.join("certs"),
        scratch.0.join("conf"),
        scratch.0.join("passwords"),
    );
    std::fs::create_dir_all(&certs).unwrap();
    let servers: Vec<&Host> = nodes.iter().chain([&leaf]).collect();
    let named: Vec<(&str, &str)> = servers
        .iter()
        .map(|h| (h.name.as_str(), h.addr.as_str()))
        .collect();
    common::make_certs(&certs, &named);
    let mut creds = std::process::Command::new(env!("CARGO_BIN_EXE_ember"));
    creds.args(["--cluster", &cluster, "creds", "--executor-id", "x1"]);
    creds.args([
        "--executor-id",
        "x2",
        "--leaf",
        &format!("l1={}", leaf.addr),
    ]);
    for node in &nodes {
        creds.args(["--node", &format!("{}={}", node.name, node.addr)]);
    }
    creds.arg("--password-file").arg(&secrets);
    creds.arg("--tls-dir").arg(&certs);
    creds.arg("--store-dir").arg(&scratch.0);
    creds.arg("--out-dir").arg(&conf);
    let wrote = creds.output().expect("ember creds runs");
    assert!(
        wrote.status.success(),
        "ember creds: {}",
        String::from_utf8_lossy(&wrote.stderr)
    );
    let passwords = passwords(&secrets);
    let login = |name: &str| {
        let user = format!("{cluster}.{name}");
        let password = passwords[&user].clone();
        (user, password)
    };
    let config = |host: &Host| conf.join(format!("{}.conf", host.name));
    let hub = NatsCluster::with_configs(nodes.clone(), nodes.iter().map(config).collect());
    let site = NatsCluster::with_configs(vec![leaf.clone()], vec![config(&leaf)]);
    hub.listening(&client_host).await;
    site.listening(&client_host).await;
    let (user, password) = login("driver");
    let flags = ["--executor-timeout", "2s", "--revive-interval", "200ms"];
    let login_flags = ["--user", &user, "--password", &password];
    let driver_flags: Vec<&str> = flags.into_iter().chain(login_flags).collect();
    let _driver = ember(
        &driver_host,
        env!("CARGO_BIN_EXE_ember-driver"),
        &hub.url(),
        &cluster,
        &driver_flags,
    );
    // The edge site's executors reach only their leaf server.
    let _executors: Vec<Child> = edge
        .iter()
        .map(|host| {
            let (user, password) = login(&host.name);
            let mut args = vec!["--executor-id", &host.name, "--site", "edge"];
            args.extend(common::FAST_EXECUTOR);
            args.extend(["--user", &user, "--password", &password]);
            let args: Vec<String> = args.into_iter().map(String::from).collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            ember(
                host,
                env!("CARGO_BIN_EXE_ember-executor"),
                &site.url(),
                &cluster,
                &args,
            )
        })
        .collect();
    let (user, password) = login("client");
    let client_args = ember::connect::NatsArgs {
        user: Some(user),
        password: Some(password),
        ..nats_args(&hub.url(), &cluster)
    };
    let ledger = scratch.0.join("ledger");
    let mut job = ledgered(TASKS, "0.3", &ledger);
    job.placement.constraints = vec!["site=edge".into()];
    let args = client_args.clone();
    let job_id = client_host
        .run(move || async move {
            let api = client(args).await;
            let deadline = Instant::now() + LIMIT;
            while api.executors().await.unwrap().registered_executors < 2 {
                assert!(Instant::now() < deadline, "the edge's executors register");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            api.submit(job).await.expect("the job is accepted")
        })
        .await;
    common::netns::wait_until(LIMIT, "tasks run", || runs(&ledger).len() >= 4);
    // The leaf link cut for 10 s while the edge runs tasks, then healed.
    let hub_nodes: Vec<&Host> = nodes.iter().collect();
    leaf.part_from(&hub_nodes);
    tokio::time::sleep(Duration::from_secs(10)).await;
    leaf.heal();
    let healed_at = Instant::now();
    let (args, ledger_dir, name) = (client_args.clone(), ledger.clone(), cluster.clone());
    let Judged {
        runs,
        removed,
        ended,
    } = client_host
        .run(move || async move {
            let api = client(args).await;
            within(LIMIT, api.wait(job_id, |_| {})).await.unwrap();
            judge(&api, &name, job_id, TASKS, &ledger_dir).await
        })
        .await;
    eprintln!(
        "the edge site's leaf link cut for 10 s: {TASKS} tasks, {} re-runs, {} executors \
         removed meanwhile; the job ended {:.1} s after the link healed",
        reruns(&runs),
        removed.len(),
        ended.saturating_duration_since(healed_at).as_secs_f64()
    );
}

/// A nats-server alone on `host`, JetStream on, with the accounts of the cluster's nodes.
fn single_server(host: &Host, dir: &Path) -> NatsCluster {
    let config = dir.join(format!("{}.conf", host.name));
    std::fs::write(
        &config,
        format!(
            "server_name: {name}\nlisten: {addr}:4222\n\
             jetstream {{ store_dir: \"{store}\" }}\n{ACCOUNTS}",
            name = host.name,
            addr = host.addr,
            store = dir.join(&host.name).display(),
        ),
    )
    .unwrap();
    NatsCluster::with_configs(vec![host.clone()], vec![config])
}

/// What [`measure`] found: no-op tasks per second over one job, and the p50 of one-task
/// jobs' round trips (submission to the job's end).
struct Speed {
    tasks_per_s: f64,
    round_trip_p50: Duration,
}

/// On `nats`, a journaled driver on `driver_host` and an executor of 64 cores on each of
/// `workers`: the speed a client on `client_host` sees, over a job of `tasks` no-op tasks and
/// `trips` one-task jobs one after another.
async fn measure(
    nats: &NatsCluster,
    driver_host: &Host,
    workers: &[Host],
    client_host: &Host,
    tasks: u32,
    trips: usize,
) -> Speed {
    let (url, cluster) = (
        nats.url(),
        format!("speed{}", uuid::Uuid::new_v4().simple()),
    );
    let driver = env!("CARGO_BIN_EXE_ember-driver");
    let _driver = ember(driver_host, driver, &url, &cluster, &["--journal", "on"]);
    let executor = env!("CARGO_BIN_EXE_ember-executor");
    let _executors: Vec<Child> = workers
        .iter()
        .map(|host| {
            let args = ["--executor-id", &host.name, "--cores", "64"];
            ember(host, executor, &url, &cluster, &args)
        })
        .collect();
    let expected = workers.len() as u64;
    let args = nats_args(&url, &cluster);
    client_host
        .run(move || async move {
            let api = client(args).await;
            let deadline = Instant::now() + LIMIT;
            while api.executors().await.unwrap().registered_executors < expected {
                assert!(Instant::now() < deadline, "the executors register");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let run = |tasks| {
                let api = api.clone();
                async move {
                    let ended = within(LIMIT, api.run_job(common::noops(tasks), |_| {})).await;
                    assert_eq!(ended.unwrap().state, JobState::Succeeded);
                }
            };
            run(tasks / 10).await; // warm-up
            let started = Instant::now();
            run(tasks).await;
            let tasks_per_s = f64::from(tasks) / started.elapsed().as_secs_f64();
            let mut trips: Vec<Duration> = Vec::with_capacity(trips);
            for _ in 0..trips.capacity() {
                let started = Instant::now();
                run(1).await;
                trips.push(started.elapsed());
            }
            trips.sort();
            Speed {
                tasks_per_s,
                round_trip_p50: trips[trips.len() / 2],
            }
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_per_second_and_round_trip_on_three_hosts_beside_one_server() {
    let Some(mut net) = Net::new() else {
        return;
    };
    let nodes: Vec<Host> = (1..=3).map(|n| net.host(&format!("n{n}"))).collect();
    let alone = net.host("s1");
    let driver_host = net.host("d1");
    let workers: Vec<Host> = (1..=3).map(|n| net.host(&format!("e{n}"))).collect();
    let client_host = net.host("c1");
    let scratch = Scratch::new("speed");
    const NOOPS: u32 = 100_000;
    const TRIPS: usize = 200;
    let one = {
        let server = single_server(&alone, &scratch.0);
        server.listening(&client_host).await;
        measure(&server, &driver_host, &workers, &client_host, NOOPS, TRIPS).await
    };
    let three = {
        let nodes = NatsCluster::start(nodes, &scratch.0);
        nodes.listening(&client_host).await;
        measure(&nodes, &driver_host, &workers, &client_host, NOOPS, TRIPS).await
    };
    eprintln!(
        "{NOOPS} no-op tasks on 3 executor hosts x 64 cores, journal on: {:.0} tasks/s on one \
         server, {:.0} on three nodes (R3; {:.2}x); one-task round trip p50 {:.2} ms on one \
         server, {:.2} ms on three nodes ({:.2}x)",
        one.tasks_per_s,
        three.tasks_per_s,
        three.tasks_per_s / one.tasks_per_s,
        one.round_trip_p50.as_secs_f64() * 1e3,
        three.round_trip_p50.as_secs_f64() * 1e3,
        three.round_trip_p50.as_secs_f64() / one.round_trip_p50.as_secs_f64()
    );
}
