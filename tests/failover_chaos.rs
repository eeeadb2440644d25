//! Standby chaos on a real cluster: two drivers with a journal, executors and a nats-server,
//! all real processes, while jobs of command tasks run. The leader is SIGKILLed and a new
//! driver started, the standby is SIGSTOPped past its lease and resumed, executors are killed
//! and started again or paused, and the nats-server is killed and started again on its store.
//! Each task prints its own job's tag and index, and appends its attempt's identity (attempt
//! number and term) to a file of its own. Judged at the end: every job succeeds, every
//! FINISHED result is its own task's output, and no two runs of a task share an attempt
//! identity.
//!
//! Faults come one round after another while a job runs, each kind at least once, up to 10
//! rounds. `EMBER_CHAOS_TASKS` (tasks per job) and `EMBER_CHAOS_ROUNDS` (the most rounds) make
//! it larger, and `EMBER_CHAOS_RUNS` runs it that many times in a row.

mod common;

use common::{eventually, sh, within, TestCluster, FAST_EXECUTOR};
use ember::client::EmberClient;
use ember::protocol::{JobState, SubmitJob, TaskState};
use ember::server::NatsServer;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::process::Child;

/// The longest one run may take, faults and all.
const LIMIT: Duration = Duration::from_secs(120);
/// Jobs submitted at once, each from a client of its own and with a tag of its own.
const JOBS: [&str; 3] = ["alpha", "beta", "gamma"];
const EXECUTORS: usize = 4;
/// The kinds of fault, one a round in turn.
const FAULT_KINDS: usize = 5;
/// At most this many rounds (each kind twice), however long the jobs run: each failover
/// slows the jobs, so faults for as long as they run would feed on themselves.
const MAX_ROUNDS: usize = 10;
/// The drivers: a journal, a 1 s lease, a quick verdict on silent executors and an adoption
/// wait of ten of the executors' heartbeat intervals (200 ms).
const DRIVER: [&str; 8] = [
    "--journal",
    "on",
    "--lease",
    "1s",
    "--executor-timeout",
    "2s",
    "--adopt-wait",
    "2s",
];

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn signal(child: &Child, signal: Signal) {
    if let Some(pid) = child.id() {
        let _ = kill(Pid::from_raw(pid as i32), signal);
    }
}

/// A nats-server with JetStream in a store of the test's own, which survives its restarts.
struct Server {
    port: u16,
    store: PathBuf,
}

impl Server {
    fn start(&self) -> NatsServer {
        let store = self.store.display().to_string();
        NatsServer::start_on(self.port, &["-js", "-sd", &store]).expect("start nats-server")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

/// Job `tag`'s tasks: each appends `<attempt> <term>` to `<dir>/<tag>.<index>` when it starts,
/// works a little, and prints `<tag>:<index>`.
fn job(tag: &str, tasks: u32, dir: &Path) -> SubmitJob {
    let script = format!(
        "echo \"$EMBER_TASK_ATTEMPT $EMBER_TASK_TERM\" >> {dir}/{tag}.$EMBER_TASK_INDEX; \
         sleep 0.$(( EMBER_TASK_INDEX % 3 + 2 )); printf '%s' {tag}:$EMBER_TASK_INDEX",
        dir = dir.display()
    );
    SubmitJob {
        name: tag.into(),
        tasks: vec![sh(&script)],
        repeat: tasks,
        max_failures: 8,
        ..common::noops(1)
    }
}

/// The processes of one run, and how to start more.
struct Cluster {
    cluster: TestCluster,
    server: Server,
    drivers: Vec<Child>,
    executors: Vec<(String, Child)>,
    started: usize,
}

impl Cluster {
    fn driver(&mut self) {
        let driver = self.cluster.driver_process(&DRIVER).spawn().unwrap();
        self.drivers.push(driver);
    }

    fn executor(&mut self) {
        let id = format!("x{}", self.started);
        self.started += 1;
        let child = self
            .cluster
            .executor_process(&id, &FAST_EXECUTOR)
            .spawn()
            .unwrap();
        self.executors.push((id, child));
    }

    /// The driver that holds the lease now, if one of ours does.
    async fn leader(&self) -> Option<usize> {
        let client = self.cluster.client().await;
        let jetstream = async_nats::jetstream::new(client);
        let bucket = jetstream
            .get_key_value(self.cluster.subjects.leader_bucket())
            .await
            .ok()?;
        let entry = bucket.entry("leader").await.ok()??;
        let holder: ember::driver::lease::Holder = serde_json::from_slice(&entry.value).ok()?;
        if holder.released {
            return None;
        }
        self.drivers.iter().position(|d| d.id() == Some(holder.pid))
    }

    /// One round of faults, each chosen by `round`.
    async fn fault(&mut self, round: usize) {
        match round % FAULT_KINDS {
            0 => {
                // The leader killed, and a new driver started in its place.
                if let Some(leader) = self.leader().await {
                    let mut dead = self.drivers.remove(leader);
                    signal(&dead, Signal::SIGKILL);
                    let _ = dead.wait().await;
                    self.driver();
                }
            }
            1 => {
                // The standby paused past its lease, then resumed.
                let leader = self.leader().await;
                if let Some(standby) = (0..self.drivers.len()).find(|i| Some(*i) != leader) {
                    signal(&self.drivers[standby], Signal::SIGSTOP);
                    tokio::time::sleep(Duration::from_millis(1_500)).await;
                    signal(&self.drivers[standby], Signal::SIGCONT);
                }
            }
            2 => {
                // An executor killed, and another started.
                let (_, mut dead) = self.executors.remove(round % self.executors.len());
                signal(&dead, Signal::SIGKILL);
                let _ = dead.wait().await;
                self.executor();
            }
            3 => {
                // An executor paused past the driver's timeout, and the leader killed meanwhile.
                let paused = round % self.executors.len();
                signal(&self.executors[paused].1, Signal::SIGSTOP);
                tokio::time::sleep(Duration::from_millis(500)).await;
                if let Some(leader) = self.leader().await {
                    let mut dead = self.drivers.remove(leader);
                    signal(&dead, Signal::SIGKILL);
                    let _ = dead.wait().await;
                    self.driver();
                }
                tokio::time::sleep(Duration::from_millis(2_000)).await;
                signal(&self.executors[paused].1, Signal::SIGCONT);
            }
            _ => {
                // The nats-server killed and started again on its store.
                self.cluster.server.kill();
                tokio::time::sleep(Duration::from_millis(300)).await;
                self.cluster.server = self.server.start();
            }
        }
    }
}

/// What one run found.
#[derive(Debug, Default)]
struct Verdict {
    /// FINISHED results that are not their own task's output: (job, index, output).
    foreign: Vec<(String, u32, String)>,
    /// Tasks with two runs under one attempt identity: (job, index, identity).
    doubled: Vec<(String, u32, String)>,
    /// Tasks that ran more than once (under different identities).
    rerun: usize,
    /// Their runs' identities ("attempt term", in the order they started): (job, index, runs).
    reruns: Vec<(String, u32, Vec<String>)>,
    runs: usize,
}

async fn submit_all(cluster: &TestCluster, tasks: u32, dir: &Path) -> Vec<(String, u64)> {
    let submissions = JOBS.iter().map(|tag| async move {
        let api = cluster.api(cluster.client().await);
        let id = within(LIMIT, api.submit(job(tag, tasks, dir)))
            .await
            .expect("submitted");
        (tag.to_string(), id)
    });
    futures::future::join_all(submissions).await
}

async fn judge(api: &EmberClient, jobs: &[(String, u64)], tasks: u32, dir: &Path) -> Verdict {
    let mut verdict = Verdict::default();
    for (tag, job_id) in jobs {
        let results = eventually(LIMIT, "the results", || async {
            api.results(*job_id).await.ok()
        })
        .await;
        assert_eq!(results.len(), tasks as usize, "job {tag}");
        for outcome in results {
            assert_eq!(outcome.state, TaskState::Finished, "{tag}: {outcome:?}");
            let output = outcome
                .result
                .as_ref()
                .and_then(|r| r.get("stdout"))
                .and_then(|s| s.as_str())
                .unwrap_or_default()
                .to_string();
            if output != format!("{tag}:{}", outcome.index) {
                verdict.foreign.push((tag.clone(), outcome.index, output));
            }
        }
        for index in 0..tasks {
            let lines =
                std::fs::read_to_string(dir.join(format!("{tag}.{index}"))).unwrap_or_default();
            let identities: Vec<&str> = lines.lines().collect();
            verdict.runs += identities.len();
            verdict.rerun += usize::from(identities.len() > 1);
            if identities.len() > 1 {
                let runs = identities.iter().map(|i| i.to_string()).collect();
                verdict.reruns.push((tag.clone(), index, runs));
            }
            let mut seen = BTreeSet::new();
            for identity in identities {
                if !seen.insert(identity) {
                    verdict
                        .doubled
                        .push((tag.clone(), index, identity.to_string()));
                }
            }
        }
    }
    verdict
}

/// Whether every job has ended, as far as the api says now.
async fn all_ended(api: &EmberClient, jobs: &[(String, u64)]) -> bool {
    for (_, job_id) in jobs {
        match api.job(*job_id).await {
            Ok(summary) if summary.state != JobState::Running => {}
            _ => return false,
        }
    }
    true
}

/// Two drivers and the executors, once these have registered: the cluster, an api client,
/// and the directory the tasks write their runs into.
async fn start(name: &str) -> (Cluster, EmberClient, PathBuf) {
    let mut cluster = TestCluster::start(name);
    let server = Server {
        // Picked while the first server holds its port, so it cannot be that one.
        port: ember::server::free_port().unwrap(),
        store: std::env::temp_dir().join(format!("ember-{name}-{}", uuid::Uuid::new_v4())),
    };
    cluster.server = server.start();
    let dir = server.store.join("runs");
    std::fs::create_dir_all(&dir).unwrap();
    let mut chaos = Cluster {
        cluster,
        server,
        drivers: Vec::new(),
        executors: Vec::new(),
        started: 0,
    };
    chaos.driver();
    chaos.driver();
    for _ in 0..EXECUTORS {
        chaos.executor();
    }
    let api = chaos.cluster.api(chaos.cluster.client().await);
    eventually(LIMIT, "the executors registered", || async {
        let registered = api.executors().await.ok()?.registered_executors;
        (registered == EXECUTORS as u64).then_some(())
    })
    .await;
    (chaos, api, dir)
}

/// One run: the cluster, the jobs, the faults, the verdict.
async fn run(tasks: u32) -> Verdict {
    let (mut chaos, api, dir) = start("chaos").await;
    let jobs = submit_all(&chaos.cluster, tasks, &dir).await;
    let started = Instant::now();
    let mut rounds = 0;
    let most = env_or("EMBER_CHAOS_ROUNDS", MAX_ROUNDS);
    while rounds < most && !all_ended(&api, &jobs).await {
        tokio::time::sleep(Duration::from_millis(500)).await;
        chaos.fault(rounds).await;
        rounds += 1;
    }
    assert!(
        rounds >= FAULT_KINDS,
        "the jobs ended after {rounds} rounds of faults, before each kind had come: make them longer"
    );
    for (tag, job_id) in &jobs {
        let summary = within(LIMIT, api.wait(*job_id, |_| {}))
            .await
            .unwrap_or_else(|e| panic!("job {tag}: {e}"));
        assert_eq!(summary.state, JobState::Succeeded, "job {tag}: {summary:?}");
    }
    let verdict = judge(&api, &jobs, tasks, &dir).await;
    eprintln!(
        "chaos: {} tasks, {rounds} rounds of faults, done in {:?}: {} runs, {} tasks ran more \
         than once, {} foreign results, {} identities run twice",
        tasks as usize * JOBS.len(),
        started.elapsed(),
        verdict.runs,
        verdict.rerun,
        verdict.foreign.len(),
        verdict.doubled.len()
    );
    verdict
}

#[tokio::test]
async fn under_standby_chaos_every_result_is_its_own_and_every_attempt_runs_once() {
    let tasks = env_or("EMBER_CHAOS_TASKS", 70) as u32;
    for attempt in 0..env_or("EMBER_CHAOS_RUNS", 1) {
        let verdict = run(tasks).await;
        assert!(
            verdict.foreign.is_empty(),
            "run {attempt}: results that are not their task's own: {:?}",
            verdict.foreign
        );
        assert!(
            verdict.doubled.is_empty(),
            "run {attempt}: two runs under one attempt identity: {:?}",
            verdict.doubled
        );
    }
}

/// A failover alone runs no task twice: the leader is SIGKILLed while every core runs a task,
/// and the new leader adopts those runs rather than start them again.
#[tokio::test]
async fn a_leader_killed_mid_job_runs_no_task_twice() {
    let (mut chaos, api, dir) = start("adopt").await;
    // Tasks of 1.2 to 1.6 s on 8 cores: the kill finds 8 of them running.
    let script = format!(
        "echo \"$EMBER_TASK_ATTEMPT $EMBER_TASK_TERM\" >> {dir}/solo.$EMBER_TASK_INDEX; \
         sleep 1.$(( EMBER_TASK_INDEX % 3 * 2 + 2 )); printf '%s' solo:$EMBER_TASK_INDEX",
        dir = dir.display()
    );
    let tasks = 24;
    let submit = SubmitJob {
        name: "solo".into(),
        tasks: vec![sh(&script)],
        repeat: tasks,
        ..common::noops(1)
    };
    let job_id = within(LIMIT, api.submit(submit)).await.unwrap();
    eventually(LIMIT, "the first tasks done", || async {
        (api.job(job_id).await.ok()?.succeeded >= 4).then_some(())
    })
    .await;
    let leader = eventually(LIMIT, "a leader", || chaos.leader()).await;
    let mut dead = chaos.drivers.remove(leader);
    signal(&dead, Signal::SIGKILL);
    let _ = dead.wait().await;
    let summary = within(LIMIT, api.wait(job_id, |_| {})).await.unwrap();
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let jobs = [("solo".to_string(), job_id)];
    let verdict = judge(&api, &jobs, tasks, &dir).await;
    assert!(verdict.foreign.is_empty(), "{:?}", verdict.foreign);
    assert!(verdict.doubled.is_empty(), "{:?}", verdict.doubled);
    assert_eq!(
        (verdict.runs, verdict.rerun),
        (tasks as usize, 0),
        "every task ran once: the runs the killed leader had launched were adopted; ran again \
         (job, index, [\"attempt term\" of each run]): {:?}",
        verdict.reruns
    );
}
