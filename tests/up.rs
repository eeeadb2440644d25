//! `ember up` as a user runs it: the real binary as a child process (killed if a test fails,
//! stopped with SIGINT as Ctrl-C would), jobs submitted through the cluster it starts or joins,
//! and `--autoscale` following a burst up and back down.

mod common;

use common::{eventually, sleepers, within, TestCluster};
use ember::client::EmberClient;
use ember::protocol::{Event, JobState, TaskState};
use ember::server::{free_port, NatsServer};
use ember::subjects::Subjects;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::process::{Child, Command};

/// A directory of the test's own, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "ember-test-{name}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&path).expect("make a temp dir");
        Self(path)
    }
    fn path(&self) -> &Path {
        &self.0
    }
    fn entries(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .expect("read the temp dir")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `ember up`, killed on drop.
struct Up {
    child: Child,
    cluster: String,
    url: String,
}

impl Up {
    /// `ember up` on cluster `cluster` with `args`, its temporary files in `tmp`, run from
    /// `tmp` (not the project), so that nothing of the source tree is at hand.
    fn start(cluster: &str, url: &str, tmp: &TempDir, args: &[&str]) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["--cluster", cluster, "up"])
            // Tests run side by side: none may take the web page's one default port.
            .args(["--http", "off"])
            .args(args)
            .env("TMPDIR", tmp.path())
            .env("RUST_LOG", "warn")
            .env_remove("EMBER_NATS_URL")
            .current_dir(tmp.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start ember up");
        Self {
            child,
            cluster: cluster.to_string(),
            url: url.to_string(),
        }
    }

    /// `ember up --autoscale RANGE` with `cores` per executor and the driver's `backlog` and
    /// `idle` timeouts, on a port and cluster of its own named after `tag`: the cluster, its
    /// temporary files (kept as long as it runs) and its cluster name.
    fn autoscaled(
        tag: &str,
        range: &str,
        cores: &str,
        backlog: &str,
        idle: &str,
    ) -> (Self, TempDir, String) {
        let tmp = TempDir::new(tag);
        let port = free_port().expect("a free port").to_string();
        let url = format!("nats://127.0.0.1:{port}");
        let name = cluster(tag);
        let args = [
            "--port",
            &port,
            "--autoscale",
            range,
            "--cores",
            cores,
            "--backlog-timeout",
            backlog,
            "--idle-timeout",
            idle,
        ];
        let up = Self::start(&name, &url, &tmp, &args);
        (up, tmp, name)
    }

    /// Connects as an api client (with `login`, a user and password) and waits until
    /// `executors` have registered.
    async fn client(&self, login: Option<(&str, &str)>, executors: u64) -> EmberClient {
        let mut options = async_nats::ConnectOptions::new();
        if let Some((user, password)) = login {
            options = options.user_and_password(user.into(), password.into());
        }
        let nats = eventually(Duration::from_secs(20), "ember up's server", || {
            let options = options.clone();
            async move { options.connect(self.url.as_str()).await.ok() }
        })
        .await;
        let api = EmberClient::new(nats, Subjects::new(&self.cluster).expect("valid cluster"));
        eventually(
            Duration::from_secs(20),
            "the executors to register",
            || async {
                let snapshot = api.executors().await.ok()?;
                (snapshot.registered_executors == executors).then_some(())
            },
        )
        .await;
        api
    }

    /// Stops it as Ctrl-C does and returns whether it exited 0.
    async fn interrupt(mut self) -> bool {
        let pid = self.child.id().expect("ember up runs");
        kill(Pid::from_raw(pid as i32), Signal::SIGINT).expect("send SIGINT");
        let status = within(Duration::from_secs(60), self.child.wait())
            .await
            .expect("wait for ember up");
        status.success()
    }
}

/// Runs `tasks` sleepers through `api` and returns the job's id, checking that it succeeded.
async fn run_job(api: &EmberClient, tasks: u32) -> u64 {
    let job = within(
        Duration::from_secs(30),
        api.run_job(sleepers(tasks, 5), |_| {}),
    )
    .await
    .expect("the job runs");
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    assert_eq!(job.succeeded, tasks);
    job.job_id
}

fn cluster(name: &str) -> String {
    format!("{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

#[tokio::test]
async fn up_runs_a_job_with_jetstream_from_its_built_in_config_and_leaves_nothing_behind() {
    let tmp = TempDir::new("up");
    let port = free_port().expect("a free port");
    let url = format!("nats://127.0.0.1:{port}");
    let name = cluster("up");
    let up = Up::start(
        &name,
        &url,
        &tmp,
        &[
            "--port",
            &port.to_string(),
            "--executors",
            "2",
            "--cores",
            "1",
        ],
    );
    let api = up.client(None, 2).await;
    assert_eq!(run_job(&api, 20).await, 1);
    // The driver found JetStream and journaled the job: the built-in config has it on.
    let jetstream = async_nats::jetstream::new(api.nats().clone());
    let journal = Subjects::new(&name).unwrap().journal_stream();
    assert!(
        jetstream.get_stream(&journal).await.is_ok(),
        "no journal stream {journal}: the server has no JetStream"
    );
    assert!(up.interrupt().await, "ember up exits 0 on SIGINT");
    assert!(tmp.entries().is_empty(), "left behind: {:?}", tmp.entries());
}

#[tokio::test]
async fn each_run_starts_empty_unless_given_a_store_dir_to_keep() {
    let tmp = TempDir::new("store");
    let store = TempDir::new("kept");
    let store_dir = store.path().display().to_string();
    // One cluster name for all: only the store decides what a run starts from.
    let name = cluster("store");
    let mut ids = Vec::new();
    for keep in [false, false, true, true] {
        let port = free_port().expect("a free port").to_string();
        let url = format!("nats://127.0.0.1:{port}");
        let mut args = vec!["--port", &port, "--executors", "1", "--cores", "2"];
        if keep {
            args.extend(["--store-dir", &store_dir]);
        }
        let up = Up::start(&name, &url, &tmp, &args);
        let api = up.client(None, 1).await;
        ids.push(run_job(&api, 4).await);
        assert!(up.interrupt().await);
    }
    assert_eq!(
        ids,
        [1, 1, 1, 2],
        "job ids of two fresh runs, then two that keep the store"
    );
    assert!(!store.entries().is_empty(), "the kept store is still there");
}

#[tokio::test]
async fn up_joins_the_server_at_nats_url_instead_of_starting_one() {
    let server = TestCluster::start_with_jetstream("join");
    let tmp = TempDir::new("join");
    let up = Up::start(
        &server.cluster,
        &server.url(),
        &tmp,
        &[
            "--nats-url",
            &server.url(),
            "--executors",
            "2",
            "--cores",
            "1",
        ],
    );
    let api = up.client(None, 2).await;
    run_job(&api, 10).await;
    assert!(up.interrupt().await);
    // The server was never ember up's: it still serves.
    assert!(server.client().await.flush().await.is_ok());
}

/// A locked-down server config (as `ember creds --full` writes) and its password file.
fn secure_files(tmp: &TempDir, cluster: &str) -> (PathBuf, PathBuf) {
    use ember::cli::creds;
    let subjects = Subjects::new(cluster).unwrap();
    let ids = [
        ember::ids::ExecutorId::parse("exec-1").unwrap(),
        ember::ids::ExecutorId::parse("exec-2").unwrap(),
    ];
    let users = creds::users(cluster, &ids, |user| {
        format!("pw-{user}-{}", uuid::Uuid::new_v4().simple())
    });
    let config = tmp.path().join("secure.conf");
    std::fs::write(&config, creds::server_config(&subjects, &users)).unwrap();
    let passwords = tmp.path().join("passwords");
    let lines: String = users
        .iter()
        .map(|u| format!("{} {}\n", u.name, u.password))
        .collect();
    std::fs::write(&passwords, lines).unwrap();
    (config, passwords)
}

fn password_of(file: &Path, user: &str) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{user} ")))
        .expect("the user is in the file")
        .to_string()
}

#[tokio::test]
async fn up_with_a_password_file_runs_a_job_on_a_locked_down_server() {
    let tmp = TempDir::new("secure");
    let state = TempDir::new("secure-run");
    let name = cluster("secure");
    let (config, passwords) = secure_files(&tmp, &name);
    let port = free_port().expect("a free port").to_string();
    let url = format!("nats://127.0.0.1:{port}");
    let (config, file) = (
        config.display().to_string(),
        passwords.display().to_string(),
    );
    let up = Up::start(
        &name,
        &url,
        &state,
        &[
            "--port",
            &port,
            "--config",
            &config,
            "--password-file",
            &file,
            "--executors",
            "2",
            "--cores",
            "1",
        ],
    );
    let user = ember::cli::creds::user_name(&name, "client");
    let client = password_of(&passwords, &user);
    let api = up.client(Some((&user, &client)), 2).await;
    run_job(&api, 10).await;
    // Nobody gets in without a password: the children did log in as their own users.
    assert!(
        async_nats::connect(url.as_str()).await.is_err(),
        "the server lets anyone in"
    );
    assert!(up.interrupt().await);
}

#[tokio::test]
async fn up_passes_its_nats_credentials_to_its_children() {
    let server =
        NatsServer::start(&["--user", "someone", "--pass", "s3cret"]).expect("start nats-server");
    let tmp = TempDir::new("creds");
    let name = cluster("creds");
    let url = server.url();
    let up = Up::start(
        &name,
        &url,
        &tmp,
        &[
            "--nats-url",
            &url,
            "--user",
            "someone",
            "--password",
            "s3cret",
            "--executors",
            "1",
            "--cores",
            "2",
        ],
    );
    let api = up.client(Some(("someone", "s3cret")), 1).await;
    run_job(&api, 6).await;
    assert!(up.interrupt().await);
}

/// One look at the cluster: seconds since the job was submitted, the target, and the
/// executors registered.
type Sample = (f64, u64, u64);

/// Samples the target and the registry every 100 ms until `stop` is set.
fn sample(api: EmberClient, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<Sample>> {
    tokio::spawn(async move {
        let start = std::time::Instant::now();
        let mut trace: Vec<Sample> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if let Ok(snapshot) = api.executors().await {
                let target = snapshot.allocation.map_or(0, |a| a.target_executors);
                let sample = (
                    start.elapsed().as_secs_f64(),
                    target,
                    snapshot.registered_executors,
                );
                if trace.last().map(|last| (last.1, last.2)) != Some((sample.1, sample.2)) {
                    trace.push(sample);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        trace
    })
}

/// Every attempt's end from `task.end` events, until job `job_id`'s `JobEnd` (subscribed
/// before the job was submitted).
async fn ends_until_job_end(
    sub: &mut async_nats::Subscriber,
    job_id: u64,
) -> Vec<(u32, TaskState, Option<String>)> {
    use futures::StreamExt;
    let mut ends = Vec::new();
    loop {
        let message = sub.next().await.expect("subscription open");
        match ember::protocol::decode::<Event>(&message.payload, usize::MAX).expect("event") {
            Event::JobEnd { job_id: id, .. } if id == job_id => return ends,
            event @ Event::TaskEnd { .. } => ends.extend(
                event
                    .ended()
                    .map(|(_, t)| (t.index, t.state, t.error.clone())),
            ),
            _ => {}
        }
    }
}

#[tokio::test]
async fn a_burst_scales_up_then_back_down_to_one_with_every_task_run_once() {
    let (up, _tmp, name) = Up::autoscaled("burst", "1..8", "2", "250ms", "4s");
    let api = up.client(None, 1).await;
    let subjects = Subjects::new(&name).unwrap();
    let mut events = api.nats().subscribe(subjects.event("*.end")).await.unwrap();
    api.nats().flush().await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(api.clone(), stop.clone());
    let job_id = api.submit(sleepers(2_000, 20)).await.expect("submit");
    let ends = within(
        Duration::from_secs(120),
        ends_until_job_end(&mut events, job_id),
    )
    .await;
    let job = api.job(job_id).await.expect("the job");
    // Back to one executor once they have been idle for the idle timeout.
    eventually(Duration::from_secs(60), "one executor again", || async {
        let snapshot = api.executors().await.ok()?;
        let target = snapshot.allocation?.target_executors;
        (target == 1 && snapshot.registered_executors == 1).then_some(())
    })
    .await;
    // One more sample, so that the trace ends on the scale-down.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let trace = sampler.await.expect("the sampler");
    println!("scale trace (seconds since submission, target, executors registered):");
    for (t, target, executors) in &trace {
        println!("  {t:6.2}s  target {target}  executors {executors}");
    }
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    assert_eq!((job.succeeded, job.failed, job.killed), (2_000, 0, 0));
    // Every task ended once, FINISHED: none killed, lost or handed back by a release.
    let not_finished: Vec<_> = ends.iter().filter(|e| e.1 != TaskState::Finished).collect();
    assert!(not_finished.is_empty(), "{not_finished:?}");
    let mut indexes: Vec<u32> = ends.iter().map(|e| e.0).collect();
    indexes.sort_unstable();
    assert_eq!(
        indexes,
        (0..2_000).collect::<Vec<_>>(),
        "each task ended exactly once"
    );
    // It scaled up: the target reached the maximum and more executors than one registered.
    assert!(
        trace.iter().any(|s| s.1 == 8),
        "the target never reached 8: {trace:?}"
    );
    assert!(
        trace.iter().any(|s| s.2 > 1),
        "no executor was added: {trace:?}"
    );
    assert!(up.interrupt().await);
}

#[tokio::test]
async fn an_executor_running_a_long_task_is_not_released() {
    let (up, _tmp, name) = Up::autoscaled("long", "1..3", "1", "200ms", "500ms");
    let api = up.client(None, 1).await;
    let subjects = Subjects::new(&name).unwrap();
    let mut events = api.nats().subscribe(subjects.event(">")).await.unwrap();
    api.nats().flush().await.unwrap();
    // Three tasks of 6 s: three executors, each silent far longer than the idle timeout.
    let job_id = api.submit(sleepers(3, 6_000)).await.expect("submit");
    let busy = eventually(Duration::from_secs(30), "three tasks running", || async {
        let snapshot = api.executors().await.ok()?;
        let busy: Vec<_> = snapshot
            .executors
            .iter()
            .filter(|e| e.free_cores == 0)
            .map(|e| e.executor_id.clone())
            .collect();
        (busy.len() == 3).then_some(busy)
    })
    .await;
    // Asked directly, the driver refuses to release a busy executor.
    let refused = api
        .release_executor(busy[0].clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("only an idle executor is released"),
        "{refused}"
    );
    use futures::StreamExt;
    let mut removed_during_job = Vec::new();
    let mut ends = Vec::new();
    within(Duration::from_secs(60), async {
        while let Some(message) = events.next().await {
            match ember::protocol::decode::<Event>(&message.payload, usize::MAX).expect("event") {
                Event::JobEnd { job_id: id, .. } if id == job_id => break,
                Event::ExecutorRemoved {
                    executor_id,
                    reason,
                    ..
                } => removed_during_job.push((executor_id, reason)),
                event @ Event::TaskEnd { .. } => {
                    ends.extend(event.ended().map(|(_, t)| (t.index, t.state)))
                }
                _ => {}
            }
        }
    })
    .await;
    // An executor may go once its task is done and it has idled; only so, and none lost work.
    assert!(
        removed_during_job
            .iter()
            .all(|(_, reason)| reason == "decommissioned"),
        "{removed_during_job:?}"
    );
    ends.sort_by_key(|e| e.0);
    assert_eq!(
        ends,
        [
            (0, TaskState::Finished),
            (1, TaskState::Finished),
            (2, TaskState::Finished)
        ]
    );
    // Idle now: released down to the minimum.
    eventually(Duration::from_secs(60), "one executor again", || async {
        (api.executors().await.ok()?.registered_executors == 1).then_some(())
    })
    .await;
    assert!(up.interrupt().await);
}
