//! Faults with real processes, real signals and real nats-servers, each bounded in time and
//! judged by a ledger of task outcomes: lost (no accepted success), duplicated (more than one
//! accepted success), unexpected (an end for an attempt never launched) must all be zero.

mod common;

use common::{eventually, sh, within, TestCluster};
use ember::driver::core::Liveness;
use ember::protocol::{decode, Event, JobState, SubmitJob, TaskSpec, TaskState};
use ember::server::NatsServer;
use futures::StreamExt;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Child;
use tokio::sync::oneshot;

const LIMIT: Duration = Duration::from_secs(60);
/// The executor flags of these tests: quick heartbeats, a quick verdict on the driver.
const FAST: [&str; 8] = [
    "--cores",
    "2",
    "--heartbeat-interval",
    "200ms",
    "--driver-timeout",
    "3s",
    "--decommission-timeout",
    "5s",
];

fn fast_liveness() -> Liveness {
    Liveness {
        executor_timeout_ms: 1_500,
        no_executors_timeout_ms: 3_000,
        reconcile_grace_ms: 1_000,
    }
}

fn sleepers(tasks: u32, ms: u64) -> SubmitJob {
    SubmitJob {
        name: "sleepers".into(),
        tasks: vec![TaskSpec::Handler {
            name: "sleep".into(),
            arg: json!({ "ms": ms }),
        }],
        repeat: tasks,
        max_failures: 4,
        cpus_per_task: 1,
    }
}

fn signal(child: &Child, signal: Signal) {
    kill(Pid::from_raw(child.id().expect("running") as i32), signal).expect("signal");
}

/// Everything the listener bus said, and what it means for each task.
#[derive(Default, Debug)]
struct Ledger {
    launched: HashSet<(u64, u32)>,
    /// When each `TaskStart` arrived.
    start_times: Vec<Instant>,
    /// `JobEnd` events: (job, state).
    job_ends: Vec<(u64, JobState)>,
    finished: HashMap<u64, u32>,
    unexpected: u32,
    removed: Vec<(String, String, Instant)>,
    added: Vec<String>,
}

impl Ledger {
    fn record(&mut self, event: Event) {
        match event {
            Event::TaskStart { .. } => {
                self.start_times.push(Instant::now());
                self.launched
                    .extend(event.started().map(|(_, t)| (t.task_id, t.attempt)))
            }
            Event::JobEnd { job_id, state, .. } => self.job_ends.push((job_id, state)),
            Event::TaskEnd { .. } => {
                for (_, t) in event.ended() {
                    if !self.launched.contains(&(t.task_id, t.attempt)) {
                        self.unexpected += 1;
                    }
                    if t.state == TaskState::Finished {
                        *self.finished.entry(t.task_id).or_default() += 1;
                    }
                }
            }
            Event::ExecutorRemoved {
                executor_id,
                reason,
                ..
            } => self
                .removed
                .push((executor_id.to_string(), reason, Instant::now())),
            Event::ExecutorAdded { executor_id, .. } => self.added.push(executor_id.to_string()),
            _ => {}
        }
    }

    /// That no task was lost, none finished twice and no end came for an attempt never
    /// started.
    fn assert_nothing_lost(&self, results: &[ember::protocol::TaskOutcome]) {
        assert_eq!(
            self.verdict(results),
            (0, 0, 0),
            "lost, duplicated, unexpected"
        );
    }

    /// (lost, duplicated, unexpected) for a job of `tasks` tasks, from the events and the
    /// driver's results.
    fn verdict(&self, results: &[ember::protocol::TaskOutcome]) -> (usize, usize, u32) {
        let lost = results
            .iter()
            .filter(|r| r.state != TaskState::Finished)
            .count();
        let duplicated = self.finished.values().filter(|&&n| n > 1).count();
        (lost, duplicated, self.unexpected)
    }
}

/// Follows the listener bus into a ledger until told to stop.
async fn follow(
    cluster: &TestCluster,
) -> (
    tokio::task::JoinHandle<Ledger>,
    tokio::sync::oneshot::Sender<()>,
) {
    let client = cluster.client().await;
    let mut events = client
        .subscribe(cluster.subjects.events_all())
        .await
        .unwrap();
    client.flush().await.unwrap();
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        let _keep = client;
        let mut ledger = Ledger::default();
        loop {
            tokio::select! {
                _ = &mut stopped => return ledger,
                Some(message) = events.next() => {
                    if let Ok(event) = decode::<Event>(&message.payload, usize::MAX) {
                        ledger.record(event);
                    }
                }
            }
        }
    });
    (handle, stop)
}

async fn spawn_executors(cluster: &TestCluster, n: usize) -> Vec<Child> {
    (0..n)
        .map(|i| {
            cluster
                .executor_process(&format!("x{i}"), &FAST)
                .spawn()
                .unwrap()
        })
        .collect()
}

async fn wait_registered(api: &ember::client::EmberClient, n: u64) {
    eventually(LIMIT, "executors registered", || async {
        (api.executors().await.ok()?.registered_executors == n).then_some(())
    })
    .await;
}

async fn wait_end(api: &ember::client::EmberClient, job_id: u64) -> ember::protocol::JobSummary {
    eventually(LIMIT, "the job's end", || async {
        let s = api.job(job_id).await.ok()?;
        (s.state != JobState::Running).then_some(s)
    })
    .await
}

#[tokio::test]
async fn sigkill_one_then_three_of_eight_executors_mid_job() {
    let cluster = TestCluster::start("fault-sigkill");
    let (ledger, stop) = follow(&cluster).await;
    let _driver = cluster.driver_with(fast_liveness()).await;
    let mut executors = spawn_executors(&cluster, 8).await;
    let api = cluster.api(cluster.client().await);
    wait_registered(&api, 8).await;
    let job_id = api.submit(sleepers(400, 50)).await.unwrap();

    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed_at = Instant::now();
    signal(&executors[0], Signal::SIGKILL);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for child in &executors[1..4] {
        signal(child, Signal::SIGKILL);
    }
    let summary = wait_end(&api, job_id).await;
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let results = api.results(job_id).await.unwrap();
    let registry = eventually(LIMIT, "4 removed", || async {
        let r = api.executors().await.ok()?;
        (r.registered_executors == 4).then_some(r)
    })
    .await;
    assert_eq!(registry.total_cores, 8);
    stop.send(()).unwrap();
    let ledger = ledger.await.unwrap();
    ledger.assert_nothing_lost(&results);
    assert_eq!(ledger.removed.len(), 4, "{:?}", ledger.removed);
    let mut removed: Vec<&str> = ledger
        .removed
        .iter()
        .map(|(id, _, _)| id.as_str())
        .collect();
    removed.sort();
    assert_eq!(removed, ["x0", "x1", "x2", "x3"]);
    assert!(ledger
        .removed
        .iter()
        .all(|(_, reason, _)| reason.contains("no heartbeat")));
    let detected = ledger
        .removed
        .iter()
        .find(|(id, _, _)| id == "x0")
        .unwrap()
        .2
        - killed_at;
    assert!(
        detected >= Duration::from_millis(1_500) && detected < Duration::from_secs(5),
        "detected after {detected:?}"
    );
    eprintln!("sigkill: x0 removed {detected:?} after SIGKILL (timeout 1.5s); ledger lost=0 duplicated=0 unexpected=0");
    for child in &mut executors[4..] {
        signal(child, Signal::SIGTERM);
        assert_eq!(within(LIMIT, child.wait()).await.unwrap().code(), Some(0));
    }
}

#[tokio::test]
async fn sigstop_past_the_timeout_then_sigcont() {
    let cluster = TestCluster::start("fault-sigstop");
    let (ledger, stop) = follow(&cluster).await;
    let _driver = cluster.driver_with(fast_liveness()).await;
    let executors = spawn_executors(&cluster, 3).await;
    let api = cluster.api(cluster.client().await);
    wait_registered(&api, 3).await;
    let job_id = api.submit(sleepers(120, 100)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(&executors[0], Signal::SIGSTOP);
    let stopped_at = Instant::now();
    eventually(LIMIT, "x0 removed", || async {
        (api.executors().await.ok()?.registered_executors == 2).then_some(())
    })
    .await;
    let detected = stopped_at.elapsed();
    signal(&executors[0], Signal::SIGCONT);
    // It notices the driver forgot it and registers again with the same id.
    wait_registered(&api, 3).await;
    let summary = wait_end(&api, job_id).await;
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let results = api.results(job_id).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.send(()).unwrap();
    let ledger = ledger.await.unwrap();
    ledger.assert_nothing_lost(&results);
    assert_eq!(ledger.removed.len(), 1);
    assert_eq!(
        ledger.added.iter().filter(|id| *id == "x0").count(),
        2,
        "x0 added, removed, added again"
    );
    assert!(detected < Duration::from_secs(5), "{detected:?}");
    eprintln!("sigstop: x0 removed {detected:?} after SIGSTOP (timeout 1.5s); re-registered after SIGCONT; ledger 0/0/0");
}

#[tokio::test]
async fn sigterm_decommissions_an_executor_mid_job() {
    let cluster = TestCluster::start("fault-sigterm");
    let (ledger, stop) = follow(&cluster).await;
    let _driver = cluster.driver_with(fast_liveness()).await;
    let mut executors = spawn_executors(&cluster, 3).await;
    let api = cluster.api(cluster.client().await);
    wait_registered(&api, 3).await;
    let job_id = api.submit(sleepers(150, 100)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(&executors[0], Signal::SIGTERM);
    let status = within(LIMIT, executors[0].wait()).await.unwrap();
    assert_eq!(status.code(), Some(0), "a decommissioned executor exits 0");
    let summary = wait_end(&api, job_id).await;
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let results = api.results(job_id).await.unwrap();
    stop.send(()).unwrap();
    let ledger = ledger.await.unwrap();
    ledger.assert_nothing_lost(&results);
    assert_eq!(ledger.removed.len(), 1);
    assert_eq!(
        (ledger.removed[0].0.as_str(), ledger.removed[0].1.as_str()),
        ("x0", "decommissioned")
    );

    // `ember stop-executor` does the same from the driver's side.
    let output = within(LIMIT, cluster.cli(&["stop-executor", "x1"]).output())
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        within(LIMIT, executors[1].wait()).await.unwrap().code(),
        Some(0)
    );
    let output = within(LIMIT, cluster.cli(&["shutdown"]).output())
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&output.stdout).contains("1 executors"));
    assert_eq!(
        within(LIMIT, executors[2].wait()).await.unwrap().code(),
        Some(0)
    );
    wait_registered(&api, 0).await;
}

/// With the server gone, a stopped driver and executor cannot send their last messages; they
/// say so and exit rather than wait for a server that may never come back.
#[tokio::test]
async fn a_driver_and_an_executor_stopped_while_nats_is_down_exit() {
    let mut cluster = TestCluster::start("fault-nats-gone");
    let mut driver = cluster.driver_process(&[]).spawn().unwrap();
    let mut executor = cluster.executor_process("x0", &FAST).spawn().unwrap();
    let api = cluster.api(cluster.client().await);
    wait_registered(&api, 1).await;
    cluster.server.kill();
    signal(&driver, Signal::SIGTERM);
    signal(&executor, Signal::SIGTERM);
    let (driver, executor) = within(LIMIT, async {
        tokio::join!(driver.wait(), executor.wait())
    })
    .await;
    // The executor's leaving needs nothing from the server; the driver's last messages are lost.
    assert_eq!(executor.unwrap().code(), Some(0));
    assert_eq!(driver.unwrap().code(), Some(1));
}

/// A relay in front of the server at `server_url` for one client: it passes what the client
/// sends up to the line holding `marker`, then drops that line and all the rest, while the
/// server's side still flows: from there on the server no longer hears the client, as across
/// a one-way partition. Returns the relay's URL, and a receiver that completes at the cut.
async fn one_way_cut(server_url: &str, marker: &'static str) -> (String, oneshot::Receiver<()>) {
    let upstream = server_url.trim_start_matches("nats://").to_string();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("nats://{}", listener.local_addr().unwrap());
    let (cut, cut_made) = oneshot::channel();
    tokio::spawn(async move {
        let (client, _) = listener.accept().await.unwrap();
        let server = TcpStream::connect(upstream).await.unwrap();
        let (mut from_client, mut to_client) = client.into_split();
        let (mut from_server, mut to_server) = server.into_split();
        tokio::spawn(async move { tokio::io::copy(&mut from_server, &mut to_client).await });
        let (mut sent, mut passed, mut cut) = (Vec::new(), 0, Some(cut));
        let mut chunk = [0u8; 4096];
        loop {
            let n = match from_client.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if cut.is_none() {
                continue;
            }
            sent.extend_from_slice(&chunk[..n]);
            let line = sent
                .windows(marker.len())
                .position(|window| window == marker.as_bytes())
                .map(|at| {
                    sent[..at]
                        .iter()
                        .rposition(|&b| b == b'\n')
                        .map_or(0, |nl| nl + 1)
                });
            let upto = line.unwrap_or(sent.len());
            if to_server.write_all(&sent[passed..upto]).await.is_err() {
                return;
            }
            passed = upto;
            if line.is_some() {
                let _ = cut.take().expect("not cut yet").send(());
            }
        }
    });
    (url, cut_made)
}

#[tokio::test]
async fn a_driver_not_told_whether_there_is_jetstream_stops_on_a_signal_or_refuses_to_start() {
    let cluster = TestCluster::start_with_jetstream("fault-js-unanswered");
    // The server never hears the driver ask about JetStream.
    let mut drivers = Vec::new();
    for journal in ["on", "auto"] {
        let (url, cut) = one_way_cut(&cluster.url(), "PUB $JS.API.INFO ").await;
        let driver = cluster
            .process_at(
                &url,
                env!("CARGO_BIN_EXE_ember-driver"),
                &["--journal", journal],
            )
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        within(LIMIT, cut).await.expect("the driver asked");
        drivers.push(driver);
    }
    let waiting = drivers.pop().unwrap();
    let signalled = drivers.pop().unwrap();
    // A signal while the driver waits for the answer is a clean stop.
    signal(&signalled, Signal::SIGTERM);
    let output = within(LIMIT, signalled.wait_with_output()).await.unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    // With no answer, `--journal auto` cannot tell that there is no journal to replay, so it
    // does not start without one.
    let output = within(LIMIT, waiting.wait_with_output()).await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("could not learn whether the NATS server offers JetStream (timed out)"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_nats_server_restart_mid_job_loses_nothing() {
    let mut cluster = TestCluster::start("fault-restart");
    // Picked while the first server holds its port, so it cannot be that one.
    let port = ember::server::free_port().unwrap();
    cluster.server = NatsServer::start_on(port, &[]).unwrap();
    let (ledger, stop) = follow(&cluster).await;
    let _driver = cluster.driver_with(fast_liveness()).await;
    let executors = spawn_executors(&cluster, 3).await;
    let api = cluster.api(cluster.client().await);
    wait_registered(&api, 3).await;
    let job_id = api.submit(sleepers(150, 50)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.server.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.server = NatsServer::start_on(port, &[]).unwrap();
    // The driver may be out of reach for a moment: wait_end retries.
    let summary = wait_end(&api, job_id).await;
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let results = api.results(job_id).await.unwrap();
    stop.send(()).unwrap();
    let ledger = ledger.await.unwrap();
    let (lost, duplicated, _) = ledger.verdict(&results);
    // Events published while the server was down are gone (the bus is at-most-once), so only
    // lost and duplicated are judged here, from the driver's results and the events seen.
    assert_eq!((lost, duplicated), (0, 0));
    assert_eq!(
        api.executors().await.unwrap().registered_executors,
        3,
        "no executor was refused as a duplicate"
    );
    drop(executors);
}

#[tokio::test]
async fn losing_one_node_of_a_three_node_nats_cluster_loses_nothing() {
    let ports: Vec<u16> = (0..3)
        .map(|_| ember::server::free_port().unwrap())
        .collect();
    let routes_ports: Vec<u16> = (0..3)
        .map(|_| ember::server::free_port().unwrap())
        .collect();
    let routes = routes_ports
        .iter()
        .map(|p| format!("nats://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes: Vec<NatsServer> = (0..3)
        .map(|i| {
            let cluster_listen = format!("nats://127.0.0.1:{}", routes_ports[i]);
            let name = format!("n{i}");
            NatsServer::start_on(
                ports[i],
                &[
                    "--cluster_name",
                    "ember-test",
                    "--cluster",
                    &cluster_listen,
                    "--routes",
                    &routes,
                    "-n",
                    &name,
                ],
            )
            .unwrap()
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let urls = ports
        .iter()
        .map(|p| format!("nats://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut cluster = TestCluster::start("fault-node");
    // The test cluster's own server is not used: everything connects to the three nodes.
    cluster.server = nodes.remove(0);
    let first = format!("nats://127.0.0.1:{}", ports[0]);
    let connect = |url: String| async move {
        async_nats::ConnectOptions::new()
            .connect(ember::connect::parse_urls(&url).unwrap())
            .await
            .unwrap()
    };
    let driver_client = connect(first.clone()).await;
    let config = ember::driver::DriverConfig {
        subjects: cluster.subjects.clone(),
        expect_executors: 0,
        revive_interval: Duration::from_millis(200),
        liveness: fast_liveness(),
        journal: Default::default(),
        journal_max_age: ember::DEFAULT_JOURNAL_MAX_AGE,
        retention: Default::default(),
        snapshot_after: ember::DEFAULT_SNAPSHOT_AFTER,
        results_max_age: ember::driver::results::DEFAULT_RESULTS_MAX_AGE,
        results_max_bytes: ember::driver::results::DEFAULT_RESULTS_MAX_BYTES,
    };
    let driver = tokio::spawn(ember::driver::run(
        driver_client,
        config,
        std::future::pending(),
    ));
    // Executors on the other nodes, all knowing every node.
    let mut executors = Vec::new();
    for i in 0..3 {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ember-executor"));
        let order = format!("nats://127.0.0.1:{},{urls}", ports[1 + i % 2]);
        command
            .args([
                "--nats-url",
                &order,
                "--cluster",
                &cluster.cluster,
                "--executor-id",
                &format!("x{i}"),
            ])
            .args(FAST)
            .env("RUST_LOG", "warn")
            .kill_on_drop(true);
        executors.push(command.spawn().unwrap());
    }
    let api =
        ember::client::EmberClient::new(connect(urls.clone()).await, cluster.subjects.clone());
    wait_registered(&api, 3).await;
    let job_id = api.submit(sleepers(150, 50)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Kill the node the driver is connected to.
    cluster.server.kill();
    // The driver may be out of reach for a moment: wait_end retries.
    let summary = wait_end(&api, job_id).await;
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let results = api.results(job_id).await.unwrap();
    assert!(
        results.iter().all(|r| r.state == TaskState::Finished),
        "none lost"
    );
    assert_eq!(api.executors().await.unwrap().registered_executors, 3);
    driver.abort();
    drop(executors);
    drop(nodes);
}

#[tokio::test]
async fn executors_register_with_the_next_driver_or_exit_56() {
    let cluster = TestCluster::start("fault-driver");
    let (ledger, stop) = follow(&cluster).await;
    let mut driver = cluster
        .driver_process(&["--executor-timeout", "2s"])
        .spawn()
        .unwrap();
    let mut stays = cluster.executor_process("stays", &FAST).spawn().unwrap();
    let mut leaves = {
        let mut flags = FAST.to_vec();
        flags.push("--exit-on-driver-loss");
        cluster.executor_process("leaves", &flags).spawn().unwrap()
    };
    let api = cluster.api(cluster.client().await);
    wait_registered(&api, 2).await;
    // The first driver's tasks are running when it dies; their task ids will be reused.
    let old = SubmitJob {
        tasks: vec![sh("sleep 5; echo old")],
        ..sleepers(4, 0)
    };
    api.submit(old).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(&driver, Signal::SIGKILL);
    let _ = driver.wait().await;
    let killed_at = Instant::now();
    let status = within(LIMIT, leaves.wait()).await.unwrap();
    assert_eq!(status.code(), Some(56), "--exit-on-driver-loss exits 56");
    let noticed = killed_at.elapsed();
    assert!(
        noticed < Duration::from_secs(6),
        "noticed after {noticed:?} (driver timeout 3s)"
    );

    let _next = cluster
        .driver_process(&["--executor-timeout", "2s"])
        .spawn()
        .unwrap();
    wait_registered(&api, 1).await;
    let registry = api.executors().await.unwrap();
    assert_eq!(registry.executors[0].executor_id.as_str(), "stays");
    let new = SubmitJob {
        tasks: vec![sh("sleep 3; echo new")],
        ..sleepers(4, 0)
    };
    let summary = within(LIMIT, api.run_job(new, |_| {})).await.unwrap();
    assert_eq!(
        summary.state,
        JobState::Succeeded,
        "the new driver runs work on the executor that stayed"
    );
    for r in api.results(summary.job_id).await.unwrap() {
        let stdout = &r.result.unwrap()["stdout"];
        assert_eq!(
            stdout, "new\n",
            "no status of the old driver's tasks counts for the new ones"
        );
    }
    stop.send(()).unwrap();
    let ledger = ledger.await.unwrap();
    assert_eq!(
        ledger.added.iter().filter(|id| *id == "stays").count(),
        2,
        "added by each driver"
    );
    eprintln!("driver loss: --exit-on-driver-loss exited 56 after {noticed:?}; the other registered with the next driver");
    signal(&stays, Signal::SIGTERM);
    assert_eq!(within(LIMIT, stays.wait()).await.unwrap().code(), Some(0));
}

/// SIGKILLs `driver`, starts the next with `flags`, and waits for its answer about `job_id`:
/// the next driver, when the first was killed, and the answer.
async fn replace_driver(
    cluster: &TestCluster,
    mut driver: Child,
    flags: &[&str],
    api: &ember::client::EmberClient,
    job_id: u64,
) -> (Child, Instant, ember::protocol::JobSummary) {
    signal(&driver, Signal::SIGKILL);
    let _ = driver.wait().await;
    let killed_at = Instant::now();
    let next = cluster.driver_process(flags).spawn().unwrap();
    let restored = eventually(LIMIT, "the next driver's answer", || async {
        api.job(job_id).await.ok()
    })
    .await;
    (next, killed_at, restored)
}

#[tokio::test]
async fn a_job_survives_a_driver_sigkill_and_completes_on_the_next_driver() {
    let cluster = TestCluster::start_with_jetstream("fault-journal");
    let (ledger, stop) = follow(&cluster).await;
    let driver_flags = ["--executor-timeout", "2s", "--journal", "on"];
    let driver = cluster.driver_process(&driver_flags).spawn().unwrap();
    let executors = spawn_executors(&cluster, 3).await;
    let api = cluster.api(cluster.client().await);
    wait_registered(&api, 3).await;
    // 40 tasks of 300 ms on 6 cores: about 2 s of work, a third of it done at the kill.
    let job_id = api.submit(sleepers(40, 300)).await.unwrap();
    eventually(LIMIT, "some tasks done", || async {
        (api.job(job_id).await.ok()?.succeeded >= 10).then_some(())
    })
    .await;
    let (_next, killed_at, restored) =
        replace_driver(&cluster, driver, &driver_flags, &api, job_id).await;
    let up = killed_at.elapsed();
    assert!(restored.succeeded >= 10, "restored: {restored:?}");
    let summary = wait_end(&api, job_id).await;
    let done = killed_at.elapsed();
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let results = api.results(job_id).await.unwrap();
    assert_eq!(results.len(), 40);
    stop.send(()).unwrap();
    let ledger = ledger.await.unwrap();
    ledger.assert_nothing_lost(&results);
    let resumed = ledger
        .start_times
        .iter()
        .find(|t| **t > killed_at)
        .expect("the next driver launched the rest")
        .duration_since(killed_at);
    assert_eq!(
        ledger.job_ends,
        [(job_id, JobState::Succeeded)],
        "one JobEnd, from the next driver"
    );
    assert_eq!(ledger.added.len(), 6, "each executor added by each driver");
    assert!(
        done < Duration::from_secs(20),
        "done {done:?} after the kill"
    );
    eprintln!(
        "driver sigkill: {} of 40 restored done; next driver up {up:?}, job resumed {resumed:?}, \
         done {done:?} after the kill; ledger lost=0 duplicated=0 unexpected=0",
        restored.succeeded
    );
    drop(executors);
}

#[tokio::test]
async fn a_job_with_no_executors_fails_after_the_timeout() {
    let cluster = TestCluster::start("fault-none");
    let _driver = cluster.driver_with(fast_liveness()).await;
    let mut lone = cluster.executor_process("lone", &FAST).spawn().unwrap();
    let api = cluster.api(cluster.client().await);
    wait_registered(&api, 1).await;
    let job_id = api.submit(sleepers(20, 200)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(&lone, Signal::SIGKILL);
    let _ = lone.wait().await;
    let started = Instant::now();
    let summary = wait_end(&api, job_id).await;
    assert_eq!(summary.state, JobState::Failed);
    assert!(
        summary
            .reason
            .as_deref()
            .unwrap()
            .contains("no executors registered for 3000 ms"),
        "{summary:?}"
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
}

/// A driver that keeps 2 finished jobs and snapshots its journal every few KiB: the journal is
/// purged behind each snapshot, and the next driver, started after a SIGKILL mid-job, restores
/// from the snapshot and its tail: the running job completes with nothing lost or doubled,
/// the retained jobs are listed, the forgotten ones say so, and ids go on.
#[tokio::test]
async fn a_driver_restored_from_a_snapshot_resumes_the_running_job_and_keeps_what_it_retained() {
    let cluster = TestCluster::start_with_jetstream("fault-snapshot");
    let (ledger, stop) = follow(&cluster).await;
    let driver_flags = [
        "--executor-timeout",
        "2s",
        "--journal",
        "on",
        "--retain-jobs",
        "2",
        "--snapshot-after",
        "2KiB",
    ];
    let driver = cluster.driver_process(&driver_flags).spawn().unwrap();
    let executors = spawn_executors(&cluster, 3).await;
    let api = cluster.api(cluster.client().await);
    wait_registered(&api, 3).await;
    for expected in 1..=4 {
        let job_id = api.submit(sleepers(6, 5)).await.unwrap();
        assert_eq!(job_id, expected);
        assert_eq!(wait_end(&api, job_id).await.state, JobState::Succeeded);
    }
    let job_id = api.submit(sleepers(40, 300)).await.unwrap();
    eventually(LIMIT, "some tasks done", || async {
        (api.job(job_id).await.ok()?.succeeded >= 10).then_some(())
    })
    .await;
    let jetstream = async_nats::jetstream::new(cluster.client().await);
    let journal = cluster.subjects.journal_stream();
    let state = eventually(LIMIT, "a purge behind a snapshot", || async {
        let mut stream = jetstream.get_stream(&journal).await.ok()?;
        let state = stream.info().await.ok()?.state.clone();
        (state.first_sequence > 1).then_some(state)
    })
    .await;
    let (_next, killed_at, restored) =
        replace_driver(&cluster, driver, &driver_flags, &api, job_id).await;
    let up = killed_at.elapsed();
    assert!(restored.succeeded >= 10, "restored: {restored:?}");
    let listed: Vec<u64> = api.jobs().await.unwrap().iter().map(|j| j.job_id).collect();
    // The 2 last finished jobs and the running one; or, if the running one has finished by
    // now, it and the one before it.
    assert!(
        listed == [3, 4, job_id] || listed == [4, job_id],
        "listed: {listed:?}"
    );
    let forgotten = api.job(1).await.unwrap_err().to_string();
    assert!(
        forgotten.contains("job 1 was forgotten") && forgotten.contains("--retain-jobs"),
        "{forgotten}"
    );
    let summary = wait_end(&api, job_id).await;
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let results = api.results(job_id).await.unwrap();
    assert_eq!(results.len(), 40);
    assert_eq!(api.submit(sleepers(1, 1)).await.unwrap(), job_id + 1);
    stop.send(()).unwrap();
    let ledger = ledger.await.unwrap();
    ledger.assert_nothing_lost(&results);
    eprintln!(
        "snapshot restore: journal held sequences {}..={} ({} records) at the kill; next \
         driver up {up:?}; ledger lost=0 duplicated=0 unexpected=0",
        state.first_sequence, state.last_sequence, state.messages
    );
    drop(executors);
}
