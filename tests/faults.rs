//! Faults with real processes, real signals and real nats-servers, each bounded in time and
//! judged by a ledger of task outcomes: lost (no accepted success), duplicated (more than one
//! accepted success), unexpected (an end for an attempt never launched) must all be zero.

mod common;

use common::{eventually, sh, sleepers, within, TestCluster, FAST_EXECUTOR as FAST};
use ember::driver::core::Liveness;
use ember::protocol::{decode, Event, JobState, SubmitJob, TaskState};
use ember::server::NatsServer;
use futures::StreamExt;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Child;
use tokio::sync::oneshot;

const LIMIT: Duration = Duration::from_secs(60);

fn fast_liveness() -> Liveness {
    Liveness {
        executor_timeout_ms: 1_500,
        no_executors_timeout_ms: 3_000,
        reconcile_grace_ms: 1_000,
        adopt_wait_ms: 1_000,
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
    /// The epoch of every event, in the order they came.
    epochs: Vec<u64>,
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
                        ledger.epochs.push(ember::epoch::of(&message));
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
async fn a_driver_whose_server_is_down_past_its_lease_leads_on_when_it_returns() {
    let store = std::env::temp_dir().join(format!("ember-deposed-{}", uuid::Uuid::new_v4()));
    let store_arg = store.display().to_string();
    let js = ["-js", "--store_dir", store_arg.as_str()];
    let mut cluster = TestCluster::start("fault-deposed");
    let port = ember::server::free_port().unwrap();
    cluster.server = NatsServer::start_on(port, &js).unwrap();
    let driver_flags = [
        "--journal",
        "on",
        "--lease",
        "1s",
        "--executor-timeout",
        "3s",
    ];
    let mut driver = cluster.driver_process(&driver_flags).spawn().unwrap();
    let executors = spawn_executors(&cluster, 2).await;
    let api = cluster.api(cluster.client().await);
    wait_registered(&api, 2).await;
    let job_id = api.submit(sleepers(40, 100)).await.unwrap();
    eventually(LIMIT, "some tasks done", || async {
        (api.job(job_id).await.ok()?.succeeded >= 5).then_some(())
    })
    .await;
    cluster.server.kill();
    // Longer than the lease, so the lease lapses, and than a request's patience, so each
    // renewal fails while the server is away.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(
        driver.try_wait().unwrap().is_none(),
        "the driver ended while its server was down"
    );
    cluster.server = NatsServer::start_on(port, &js).unwrap();
    let summary = wait_end(&api, job_id).await;
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    assert_eq!(api.results(job_id).await.unwrap().len(), 40);
    let holder = cluster.lease_holder().await.expect("a leader");
    assert_eq!(Some(holder.pid), driver.id(), "the same driver leads again");
    drop((driver, executors));
    drop(cluster);
    let _ = std::fs::remove_dir_all(&store);
}

/// A leader whose NATS connection is lost stops sending at once (a standby that hears of the
/// close from the server may take the lease within `--disconnect-grace`), and once connected
/// again leads on in the same leadership as soon as its renewal of the revision it holds
/// succeeds, rather than wait out its lease and start a new one from the journal.
#[tokio::test]
async fn a_leader_that_loses_its_connection_leads_on_once_it_renews() {
    let store = std::env::temp_dir().join(format!("ember-lostconn-{}", uuid::Uuid::new_v4()));
    let store_arg = store.display().to_string();
    let js = ["-js", "--store_dir", store_arg.as_str()];
    let mut cluster = TestCluster::start("fault-lostconn");
    let port = ember::server::free_port().unwrap();
    cluster.server = NatsServer::start_on(port, &js).unwrap();
    // A lease far longer than the server is away: renewals alone would keep the leadership.
    let lease = Duration::from_secs(30);
    let driver = cluster
        .driver_process(&["--journal", "on", "--lease", "30s"])
        .spawn()
        .unwrap();
    let first = eventually(LIMIT, "the driver leads", || cluster.lease_holder()).await;
    assert!(
        first.connection.is_some(),
        "the key names the leader's connection"
    );
    cluster.server.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.server = NatsServer::start_on(port, &js).unwrap();
    let back = std::time::Instant::now();
    // Renewed through its new connection, which the key now names.
    let again = eventually(LIMIT, "a renewal through the new connection", || async {
        let holder = cluster.lease_holder().await?;
        (holder.connection != first.connection).then_some(holder)
    })
    .await;
    let took = back.elapsed();
    eprintln!(
        "a leader's connection lost for 0.3 s: it renewed its lease {:.2} s after its server \
         returned",
        took.as_secs_f64()
    );
    assert_eq!(
        (again.driver_instance, again.driver_run, Some(again.pid)),
        (first.driver_instance, first.driver_run, driver.id()),
        "the same leadership goes on"
    );
    assert!(
        took < lease / 2,
        "it renewed only after {took:?}, as if it waited out its own {lease:?} lease"
    );
    let api = cluster.api(cluster.client().await);
    eventually(LIMIT, "the api answers", || async {
        api.executors().await.ok()
    })
    .await;
    drop(driver);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&store);
}

/// Three nats-servers routed into one cluster named `name`, node i started with `extra(i)`
/// beside the cluster flags: their client ports and the servers, in order.
fn three_nodes(name: &str, extra: impl Fn(usize) -> Vec<String>) -> (Vec<u16>, Vec<NatsServer>) {
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
    let nodes = (0..3)
        .map(|i| {
            let mut args = extra(i);
            args.extend([
                "--cluster_name".into(),
                name.into(),
                "--cluster".into(),
                format!("nats://127.0.0.1:{}", routes_ports[i]),
                "--routes".into(),
                routes.clone(),
                "-n".into(),
                format!("n{i}"),
            ]);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            NatsServer::start_on(ports[i], &args).unwrap()
        })
        .collect();
    (ports, nodes)
}

#[tokio::test]
async fn losing_one_node_of_a_three_node_nats_cluster_loses_nothing() {
    let (ports, mut nodes) = three_nodes("ember-test", |_| Vec::new());
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
        revive_interval: Duration::from_millis(200),
        liveness: fast_liveness(),
        ..ember::driver::DriverConfig::new(cluster.subjects.clone())
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
        speculation: None,
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
        speculation: None,
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
    let job_id = mid_job(&api).await;
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
    let job_id = mid_job(&api).await;
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

/// The flags of the failover tests' drivers: a 1 s lease, a journal, a quick verdict on a
/// silent executor.
const FAILOVER_DRIVER: [&str; 6] = [
    "--executor-timeout",
    "2s",
    "--journal",
    "on",
    "--lease",
    "1s",
];

/// Two driver processes with a 1 s lease and three executors, once the executors have
/// registered: the drivers, the executors, an api client and which driver leads.
async fn two_drivers(
    cluster: &TestCluster,
) -> (Vec<Child>, Vec<Child>, ember::client::EmberClient, usize) {
    two_drivers_with(cluster, &FAILOVER_DRIVER).await
}

/// [`two_drivers`], the drivers started with `flags`.
async fn two_drivers_with(
    cluster: &TestCluster,
    flags: &[&str],
) -> (Vec<Child>, Vec<Child>, ember::client::EmberClient, usize) {
    let drivers = vec![
        cluster.driver_process(flags).spawn().unwrap(),
        cluster.driver_process(flags).spawn().unwrap(),
    ];
    let executors = spawn_executors(cluster, 3).await;
    let api = cluster.api(cluster.client().await);
    wait_registered(&api, 3).await;
    let leader = cluster
        .leader_among(&[&drivers[0], &drivers[1]], None)
        .await;
    (drivers, executors, api, leader)
}

/// Submits 40 tasks of 300 ms and returns the job's id once ten of them are done.
async fn mid_job(api: &ember::client::EmberClient) -> u64 {
    let job_id = api.submit(sleepers(40, 300)).await.unwrap();
    eventually(LIMIT, "some tasks done", || async {
        (api.job(job_id).await.ok()?.succeeded >= 10).then_some(())
    })
    .await;
    job_id
}

#[tokio::test]
async fn a_standby_driver_takes_over_when_the_leader_is_sigkilled_mid_job() {
    let cluster = TestCluster::start_with_jetstream("failover-kill");
    let (ledger, stop) = follow(&cluster).await;
    let lease = Duration::from_secs(1);
    let (mut drivers, executors, api, leader) = two_drivers(&cluster).await;
    // 40 tasks of 300 ms on 6 cores: about 2 s of work, a third of it done at the kill.
    let job_id = mid_job(&api).await;
    let mut dead = drivers.remove(leader);
    let dead_pid = dead.id();
    signal(&dead, Signal::SIGKILL);
    let _ = dead.wait().await;
    let killed_at = Instant::now();
    cluster.leader_among(&[&drivers[0]], dead_pid).await;
    let took_over = killed_at.elapsed();
    let summary = within(LIMIT, api.wait(job_id, |_| {})).await.unwrap();
    let done = killed_at.elapsed();
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let results = api.results(job_id).await.unwrap();
    assert_eq!(results.len(), 40);
    stop.send(()).unwrap();
    let ledger = ledger.await.unwrap();
    ledger.assert_nothing_lost(&results);
    assert_eq!(ledger.job_ends, [(job_id, JobState::Succeeded)]);
    let resumed = ledger
        .start_times
        .iter()
        .find(|t| **t > killed_at)
        .expect("the new leader launched the rest")
        .duration_since(killed_at);
    assert!(
        took_over <= lease + Duration::from_secs(1),
        "the standby led {took_over:?} after the kill, past the lease and a second"
    );
    eprintln!(
        "failover after SIGKILL: the standby led {took_over:?} after the kill, first launch \
         {resumed:?}, job done {done:?}; ledger lost=0 duplicated=0 unexpected=0"
    );
    drop(executors);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_drivers_started_at_the_same_instant_exactly_one_leads_every_time() {
    let cluster = TestCluster::start_with_jetstream("failover-race");
    let client = cluster.client().await;
    for round in 0..100 {
        let subjects = ember::subjects::Subjects::new(&format!("race{round}")).unwrap();
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(2));
        let (stops, drivers): (Vec<_>, Vec<_>) = (0..2)
            .map(|_| {
                let (stop, stopped) = oneshot::channel::<()>();
                // A hundred clusters' streams on one server: small ones, since JetStream
                // reserves each stream's byte limit against the disk it may use.
                let config = ember::driver::DriverConfig {
                    journal: ember::driver::JournalMode::On,
                    results_max_bytes: 1 << 20,
                    events_max_bytes: 1 << 20,
                    ..ember::driver::DriverConfig::new(subjects.clone())
                };
                let (start, url) = (start.clone(), cluster.url());
                let driver = tokio::spawn(async move {
                    let client = async_nats::connect(url).await.unwrap();
                    start.wait().await;
                    ember::driver::run(client, config, async {
                        let _ = stopped.await;
                    })
                    .await
                });
                (stop, driver)
            })
            .unzip();
        // Every driver that leads answers the api; count the answers to one request.
        let inbox = client.new_inbox();
        let mut answers = client.subscribe(inbox.clone()).await.unwrap();
        let request = ember::protocol::encode(&ember::protocol::ApiRequest::ListExecutors {
            offset: 0,
            limit: Some(0),
        });
        let api = ember::client::EmberClient::new(client.clone(), subjects.clone());
        eventually(LIMIT, "a driver leads", || async {
            api.executors().await.ok()
        })
        .await;
        // A second leader would have subscribed by now: the leader answers only after taking
        // the lease, and the other driver's compare-and-set was decided before that.
        client
            .publish_with_reply(subjects.api(), inbox, request)
            .await
            .unwrap();
        client.flush().await.unwrap();
        let mut count = 0;
        while let Ok(Some(_)) =
            tokio::time::timeout(Duration::from_millis(100), answers.next()).await
        {
            count += 1;
        }
        assert_eq!(count, 1, "round {round}: {count} drivers answered");
        for stop in stops {
            let _ = stop.send(());
        }
        for driver in drivers {
            within(LIMIT, driver).await.unwrap().unwrap();
        }
    }
}

/// The message ids of the journal's messages, in order.
async fn journal_message_ids(cluster: &TestCluster) -> Vec<String> {
    let messages = cluster.journal_messages().await;
    let id = |m: &async_nats::jetstream::message::StreamMessage| {
        m.headers.get("Nats-Msg-Id").map(|v| v.to_string())
    };
    messages.iter().map(|m| id(m).unwrap_or_default()).collect()
}

#[tokio::test]
async fn a_leader_paused_past_its_lease_is_fenced_when_it_wakes() {
    let cluster = TestCluster::start_with_jetstream("failover-pause");
    let (ledger, stop) = follow(&cluster).await;
    let (mut drivers, executors, api, leader) = two_drivers(&cluster).await;
    let job_id = mid_job(&api).await;
    let paused = drivers.remove(leader);
    signal(&paused, Signal::SIGSTOP);
    let paused_at = Instant::now();
    cluster.leader_among(&[&drivers[0]], paused.id()).await;
    let took_over = paused_at.elapsed();
    // The new leader has the executors again and runs the job; then the old one wakes, its
    // lease long gone, with statuses and heartbeats queued for it and timers overdue.
    eventually(
        LIMIT,
        "executors registered with the new leader",
        || async { (api.executors().await.ok()?.registered_executors == 3).then_some(()) },
    )
    .await;
    signal(&paused, Signal::SIGCONT);
    let summary = within(LIMIT, api.wait(job_id, |_| {})).await.unwrap();
    // A job submitted once the old leader is awake: were it still acting, it would take the
    // submission too (both hear the api subject until it stands down), launch it and tell of it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = within(LIMIT, api.run_job(sleepers(10, 100), |_| {}))
        .await
        .unwrap();
    // Time for whatever else the old leader would do on waking.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    assert_eq!(second.state, JobState::Succeeded, "{second:?}");
    let mut results = api.results(job_id).await.unwrap();
    assert_eq!(results.len(), 40);
    results.extend(api.results(second.job_id).await.unwrap());
    stop.send(()).unwrap();
    let ledger = ledger.await.unwrap();
    ledger.assert_nothing_lost(&results);
    assert_eq!(
        ledger.job_ends,
        [
            (job_id, JobState::Succeeded),
            (second.job_id, JobState::Succeeded)
        ]
    );
    // Every event carries its leader's epoch: none of the old one's after the new one's.
    let (old_epoch, new_epoch) = (ledger.epochs[0], *ledger.epochs.last().unwrap());
    assert!(
        old_epoch < new_epoch,
        "two leaderships: {:?}",
        ledger.epochs
    );
    assert!(
        ledger.epochs.windows(2).all(|w| w[0] <= w[1]),
        "an event of an older epoch after a newer one's: {:?}",
        ledger.epochs
    );
    // The journal after the new leader's mark holds its writes alone.
    let ids = journal_message_ids(&cluster).await;
    let mark = ids
        .iter()
        .position(|id| *id == format!("{new_epoch}.lead"))
        .expect("the new leader's mark");
    let foreign: Vec<_> = ids[mark + 1..]
        .iter()
        .filter(|id| !id.starts_with(&format!("{new_epoch}.")))
        .collect();
    assert!(
        foreign.is_empty(),
        "writes of another leader after the mark: {foreign:?}"
    );
    let holder = cluster.lease_holder().await.expect("a leader");
    assert_eq!(
        Some(holder.pid),
        drivers[0].id(),
        "the new leader still leads"
    );
    eprintln!(
        "failover after SIGSTOP: the standby led {took_over:?} after the pause (epoch \
         {old_epoch} -> {new_epoch}); after SIGCONT no event, launch or journal write of the old \
         epoch was acted on; ledger lost=0 duplicated=0 unexpected=0"
    );
    drop((executors, paused));
}

#[tokio::test]
async fn ember_up_with_two_drivers_survives_a_sigkill_of_the_leader_mid_job() {
    let dir = std::env::temp_dir().join(format!("ember-up-failover-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = ember::server::free_port().unwrap();
    let mut up = tokio::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["--cluster", "upfail", "up", "--port", &port.to_string()])
        .args(["--drivers", "2", "--executors", "3", "--cores", "2"])
        .current_dir(&dir)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let url = format!("nats://127.0.0.1:{port}");
    let client = eventually(LIMIT, "ember up's nats-server", || async {
        async_nats::connect(url.as_str()).await.ok()
    })
    .await;
    let subjects = ember::subjects::Subjects::new("upfail").unwrap();
    let api = ember::client::EmberClient::new(client.clone(), subjects.clone());
    wait_registered(&api, 3).await;
    let job_id = api.submit(sleepers(30, 300)).await.unwrap();
    eventually(LIMIT, "some tasks done", || async {
        (api.job(job_id).await.ok()?.succeeded >= 6).then_some(())
    })
    .await;
    let leader = common::holder_of(&client, &subjects)
        .await
        .expect("a leader")
        .pid;
    kill(Pid::from_raw(leader as i32), Signal::SIGKILL).unwrap();
    let killed_at = Instant::now();
    let summary = within(LIMIT, api.wait(job_id, |_| {})).await.unwrap();
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    assert_eq!(summary.succeeded, 30);
    let next = common::holder_of(&client, &subjects)
        .await
        .expect("a leader")
        .pid;
    assert_ne!(next, leader, "the standby leads");
    eprintln!(
        "ember up --drivers 2: the job ended SUCCEEDED {:?} after the leader's SIGKILL",
        killed_at.elapsed()
    );
    signal(&up, Signal::SIGTERM);
    let _ = tokio::time::timeout(LIMIT, up.wait()).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_rolling_restart_of_every_driver_mid_job_loses_nothing() {
    let cluster = TestCluster::start_with_jetstream("failover-rolling");
    let (ledger, stop) = follow(&cluster).await;
    let (mut drivers, executors, api, _) = two_drivers(&cluster).await;
    // 60 tasks of 300 ms on 6 cores: about 3 s of work, through three restarts.
    let job_id = api.submit(sleepers(60, 300)).await.unwrap();
    for restart in 0..3 {
        eventually(LIMIT, "progress", || async {
            (api.job(job_id).await.ok()?.succeeded >= 10 * (restart + 1)).then_some(())
        })
        .await;
        // Each driver in turn, the leader first: SIGTERM, and a new one in its place.
        let refs: Vec<&Child> = drivers.iter().collect();
        let leader = cluster.leader_among(&refs, None).await;
        let mut stopping = drivers.remove(leader);
        signal(&stopping, Signal::SIGTERM);
        let exited = within(LIMIT, stopping.wait()).await.unwrap();
        assert!(exited.success(), "a driver stopped with {exited:?}");
        drivers.push(cluster.driver_process(&FAILOVER_DRIVER).spawn().unwrap());
    }
    let summary = within(LIMIT, api.wait(job_id, |_| {})).await.unwrap();
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let results = api.results(job_id).await.unwrap();
    assert_eq!(results.len(), 60);
    stop.send(()).unwrap();
    let ledger = ledger.await.unwrap();
    ledger.assert_nothing_lost(&results);
    assert_eq!(ledger.job_ends, [(job_id, JobState::Succeeded)]);
    drop(executors);
}

#[tokio::test]
async fn losing_the_leaders_node_of_a_three_node_jetstream_cluster_loses_nothing() {
    let store = std::env::temp_dir().join(format!("ember-r3-{}", std::process::id()));
    let (ports, mut nodes) = three_nodes("ember-r3", |i| {
        let dir = store.join(format!("n{i}"));
        vec![
            "-js".into(),
            "--store_dir".into(),
            dir.display().to_string(),
        ]
    });
    // Node i first, then the others: where a process connects, and where it goes next.
    let urls_from = |i: usize| {
        (0..3)
            .map(|k| format!("nats://127.0.0.1:{}", ports[(i + k) % 3]))
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut cluster = TestCluster::start("fault-r3");
    let doomed = nodes.remove(0);
    // The helpers (listener, api) reach the cluster through node 1, which stays.
    cluster.server = nodes.remove(0);
    let jetstream = async_nats::jetstream::new(cluster.client().await);
    eventually(LIMIT, "JetStream to form its cluster", || async {
        jetstream.query_account().await.ok()
    })
    .await;
    let (ledger, stop) = follow(&cluster).await;
    let flags = [
        "--executor-timeout",
        "3s",
        "--journal",
        "on",
        "--lease",
        "1s",
    ];
    let driver = |i: usize| {
        cluster
            .process_at(&urls_from(i), env!("CARGO_BIN_EXE_ember-driver"), &flags)
            .spawn()
            .unwrap()
    };
    // The first driver, on the node that dies, leads; the second stands by on another.
    let first = driver(0);
    eventually(LIMIT, "the first driver to lead", || async {
        (cluster.lease_holder().await?.pid == first.id()?).then_some(())
    })
    .await;
    let second = driver(1);
    let executors: Vec<Child> = (0..3)
        .map(|i| {
            let id = format!("x{i}");
            let mut args = vec!["--executor-id", id.as_str()];
            args.extend(FAST);
            cluster
                .process_at(
                    &urls_from(1 + i % 2),
                    env!("CARGO_BIN_EXE_ember-executor"),
                    &args,
                )
                .spawn()
                .unwrap()
        })
        .collect();
    let api = cluster.api(cluster.client().await);
    wait_registered(&api, 3).await;
    let mut journal = jetstream
        .get_stream(cluster.subjects.journal_stream())
        .await
        .unwrap();
    let replicas = journal.info().await.unwrap().config.num_replicas;
    assert_eq!(replicas, 3, "auto keeps three copies on a cluster of three");
    let job_id = mid_job(&api).await;
    let killed_at = Instant::now();
    drop(doomed);
    // On a loaded machine the raft elections after losing a node can outlast a client's
    // failover patience; what this test judges is that nothing is lost, so it waits longer.
    let summary = wait_end(&api, job_id).await;
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let results = api.results(job_id).await.unwrap();
    assert_eq!(results.len(), 40);
    stop.send(()).unwrap();
    let ledger = ledger.await.unwrap();
    // Events published while the listener's node re-routed may be gone (the bus is
    // at-most-once): lost and duplicated are judged from the results and what was seen.
    let (lost, duplicated, _) = ledger.verdict(&results);
    assert_eq!((lost, duplicated), (0, 0));
    let holder = cluster.lease_holder().await.expect("a leader");
    eprintln!(
        "three-node JetStream cluster, R{replicas}: the leader's node killed; the job ended \
         {:?} later, led by the {} driver; lost=0 duplicated=0",
        killed_at.elapsed(),
        if Some(holder.pid) == first.id() {
            "first (reconnected)"
        } else {
            "second"
        }
    );
    drop((first, second, executors));
    let _ = std::fs::remove_dir_all(&store);
}

/// The shipped server config that exports the connection advisories to Ember's account.
const ADVISORIES_CONF: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/nats-advisories.conf");

/// A directory removed on drop.
struct Store(std::path::PathBuf);

impl Drop for Store {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A cluster on a server of the shipped advisories config, its store moved to a directory of
/// its own (removed on drop).
fn advisory_cluster(name: &str) -> (Store, TestCluster) {
    let store = Store(std::env::temp_dir().join(format!("ember-{name}-{}", uuid::Uuid::new_v4())));
    let config = std::fs::read_to_string(ADVISORIES_CONF)
        .unwrap()
        .replace(".nats/jetstream", &store.0.join("js").display().to_string());
    std::fs::create_dir_all(&store.0).unwrap();
    let config_path = store.0.join("nats.conf");
    std::fs::write(&config_path, config).unwrap();
    let cluster = TestCluster::start_with(name, &["-c", config_path.to_str().unwrap()]);
    (store, cluster)
}

/// Waits for the first `TaskStart` of `job_id` on `executor`; when it arrived.
async fn first_start_on(
    events: &mut async_nats::Subscriber,
    job_id: u64,
    executor: &str,
) -> Instant {
    within(LIMIT, async {
        while let Some(message) = events.next().await {
            let Ok(event) = decode::<Event>(&message.payload, usize::MAX) else {
                continue;
            };
            if let Event::TaskStart { job_id: job, .. } = &event {
                let arrived = Instant::now();
                if *job == job_id && event.started().any(|(on, _)| on.as_str() == executor) {
                    return arrived;
                }
            }
        }
        panic!("the events subscription ended");
    })
    .await
}

/// With the advisories imported, an executor killed with SIGKILL is removed when its server
/// says its connection closed, not after `--executor-timeout` (30 s here), and its tasks start
/// again on another executor: ten kills, each timed from the signal to the new `TaskStart`.
#[tokio::test]
async fn a_killed_executor_is_removed_at_its_servers_disconnect_advisory() {
    let (_store, cluster) = advisory_cluster("advisories");
    let liveness = Liveness {
        executor_timeout_ms: 30_000,
        ..fast_liveness()
    };
    let _driver = cluster.driver_with(liveness).await;
    let api = cluster.api(cluster.client().await);
    let client = cluster.client().await;
    let mut events = client
        .subscribe(cluster.subjects.events_all())
        .await
        .unwrap();
    client.flush().await.unwrap();
    let mut delays = Vec::new();
    for round in 0..10 {
        let victim_id = format!("victim-{round}");
        let mut victim = cluster.executor_process(&victim_id, &FAST).spawn().unwrap();
        wait_registered(&api, 1).await;
        let job_id = api.submit(sleepers(2, 60_000)).await.unwrap();
        eventually(LIMIT, "both tasks running on the victim", || async {
            (api.job(job_id).await.ok()?.running == 2).then_some(())
        })
        .await;
        let spare_id = format!("spare-{round}");
        let mut spare = cluster.executor_process(&spare_id, &FAST).spawn().unwrap();
        wait_registered(&api, 2).await;
        let killed_at = Instant::now();
        signal(&victim, Signal::SIGKILL);
        let started = first_start_on(&mut events, job_id, &spare_id).await;
        delays.push(started - killed_at);
        victim.wait().await.unwrap();
        api.kill(job_id).await.unwrap();
        signal(&spare, Signal::SIGKILL);
        spare.wait().await.unwrap();
        let registry = eventually(LIMIT, "the spare removed too", || async {
            let registry = api.executors().await.ok()?;
            (registry.registered_executors == 0).then_some(registry)
        })
        .await;
        assert_eq!(registry.total_cores, 0);
    }
    delays.sort();
    let p50 = delays[delays.len() / 2];
    eprintln!(
        "advisories: SIGKILL to the new TaskStart over 10 kills: p50 {p50:?}, all {delays:?}"
    );
    // Far inside the 30 s timeout: the advisory, not the heartbeats, removed every victim.
    assert!(
        delays.iter().all(|d| *d < Duration::from_secs(5)),
        "{delays:?}"
    );
}

/// With the advisories imported, a standby leads as soon as the server says the leader's
/// connection closed, well inside the default 3 s lease, and the job loses nothing.
#[tokio::test]
async fn a_standby_leads_at_the_leaders_disconnect_advisory_not_after_the_lease() {
    let (_store, cluster) = advisory_cluster("advisory-failover");
    let (ledger, stop) = follow(&cluster).await;
    let flags = [
        "--executor-timeout",
        "2s",
        "--journal",
        "on",
        "--lease",
        "3s",
    ];
    let (mut drivers, executors, api, leader) = two_drivers_with(&cluster, &flags).await;
    let job_id = mid_job(&api).await;
    let mut dead = drivers.remove(leader);
    let dead_pid = dead.id();
    let killed_at = Instant::now();
    signal(&dead, Signal::SIGKILL);
    cluster.leader_among(&[&drivers[0]], dead_pid).await;
    let took_over = killed_at.elapsed();
    let _ = dead.wait().await;
    let summary = within(LIMIT, api.wait(job_id, |_| {})).await.unwrap();
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let results = api.results(job_id).await.unwrap();
    stop.send(()).unwrap();
    ledger.await.unwrap().assert_nothing_lost(&results);
    eprintln!("advisories: the standby led {took_over:?} after the leader's SIGKILL (lease 3 s)");
    // The lease alone would take 3 s and a grace: the advisory did it.
    assert!(
        took_over < Duration::from_secs(2),
        "the standby led after {took_over:?}"
    );
    drop(executors);
}
