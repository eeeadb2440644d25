//! Worker hygiene on real processes: an executor's Python workers retired after
//! `--python-max-tasks` calls or once past `--python-max-rss`, a worker killed in the middle of
//! a call that grows past it, and a worker the kernel's out-of-memory killer kills in a memory
//! cgroup of the test's own, named as such. The calls are built-ins pickled by `python3` (`exec`
//! of a few lines where a call must grow); the tests skip, saying so, where there is no
//! `python3`, and the cgroup test where it cannot make a memory cgroup (not root, none mounted).

mod common;

use common::{eventually, TestCluster};
use ember::client::EmberClient;
use ember::executor::{Handlers, PythonConfig};
use ember::protocol::{JobState, JobSummary, SubmitJob, TaskOutcome, TaskSpec, TaskState};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

fn have_python() -> bool {
    match Command::new("python3").arg("--version").output() {
        Ok(out) if out.status.success() => true,
        _ => {
            eprintln!("skipped: python3 is not installed (python tasks need an interpreter)");
            false
        }
    }
}

/// Runs `python3 -c`, returning its stdout, trimmed.
fn python(code: &str) -> String {
    let out = Command::new("python3")
        .args(["-c", code])
        .output()
        .expect("run python3");
    assert!(out.status.success(), "python3 -c {code:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A call of `function(*args)`, both Python expressions, pickled by `python3`.
fn call(function: &str, args: &str) -> TaskSpec {
    let pickled = |expr: &str| {
        python(&format!(
            "import base64, os, pickle\nprint(base64.b64encode(pickle.dumps({expr})).decode())"
        ))
    };
    TaskSpec::Python {
        function: pickled(function),
        args: pickled(&format!("({args}, {{}})")),
        map: false,
        timeout_ms: None,
        function_object: None,
        args_object: None,
        objects: Vec::new(),
        upstream: Vec::new(),
        no_retry_on: Vec::new(),
        retry_on: Vec::new(),
    }
}

/// A call that runs `code` (Python statements) with `exec`.
fn exec(code: &str) -> TaskSpec {
    call("exec", &format!("({code:?},)"))
}

fn getpid() -> TaskSpec {
    call("os.getpid", "()")
}

fn job(tasks: Vec<TaskSpec>, max_failures: u32) -> SubmitJob {
    SubmitJob {
        max_failures,
        name: "hygiene".into(),
        tasks,
        ..common::noops(1)
    }
}

async fn ended(api: &EmberClient, job_id: u64) -> JobSummary {
    eventually(LIMIT, "the job to end", || async {
        let summary = api.job(job_id).await.ok()?;
        (summary.state != JobState::Running).then_some(summary)
    })
    .await
}

async fn run(api: &EmberClient, job: SubmitJob) -> Vec<TaskOutcome> {
    let job_id = api.submit(job).await.expect("submit");
    ended(api, job_id).await;
    api.results(job_id).await.expect("results")
}

/// The pid a `getpid` call returned.
fn pid_of(outcome: &TaskOutcome) -> u32 {
    assert_eq!(outcome.state, TaskState::Finished, "{outcome:?}");
    let pickle = outcome.result.as_ref().unwrap()["pickle"].as_str().unwrap();
    python(&format!(
        "import base64, pickle\nprint(pickle.loads(base64.b64decode({pickle:?})))"
    ))
    .parse()
    .unwrap()
}

async fn one_pid(api: &EmberClient) -> u32 {
    pid_of(&run(api, job(vec![getpid()], 1)).await[0])
}

/// A driver and an executor of one core whose one worker has `config`'s limits.
struct Setup {
    _cluster: TestCluster,
    _driver: common::Running<Result<(), ember::driver::DriverError>>,
    _executor: common::Running<Result<(), ember::executor::ExecutorError>>,
    api: EmberClient,
}

async fn cluster(name: &str, max_tasks: Option<u32>, max_rss: Option<u64>) -> Setup {
    let cluster = TestCluster::start(name);
    let driver = cluster.driver().await;
    let python = PythonConfig {
        interpreter: "python3".into(),
        workers: 1,
        max_tasks,
        max_rss,
    };
    let executor = cluster
        .executor_configured("a", 1, Handlers::builtin(), |config| {
            config.python = Some(python)
        })
        .await;
    let api = cluster.api(cluster.client().await);
    Setup {
        _cluster: cluster,
        _driver: driver,
        _executor: executor,
        api,
    }
}

#[tokio::test]
async fn a_worker_is_retired_after_max_tasks_calls() {
    if !have_python() {
        return;
    }
    let setup = cluster("py-max-tasks", Some(2), None).await;
    let outcomes = run(&setup.api, job(vec![getpid(); 6], 1)).await;
    let mut uses = BTreeMap::new();
    for outcome in &outcomes {
        *uses.entry(pid_of(outcome)).or_insert(0) += 1;
    }
    assert_eq!(uses.len(), 3, "three workers for six calls: {uses:?}");
    assert!(uses.values().all(|&n| n == 2), "two calls each: {uses:?}");
}

/// A file of the test's own, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str) -> Self {
        let id = uuid::Uuid::new_v4().simple();
        Self(std::env::temp_dir().join(format!("ember-{name}-{id}")))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn a_worker_past_max_rss_after_its_call_is_retired_and_its_result_stands() {
    if !have_python() {
        return;
    }
    let setup = cluster("py-rss-after", None, Some(200 << 20)).await;
    let api = &setup.api;
    // The call answers at once; a thread it leaves grows the worker to 300 MiB afterwards,
    // between calls, so the next call starts on a worker already past the limit.
    let grown = TempFile::new("grown");
    let grow = format!(
        "import threading\n\
         def grow():\n    \
             import builtins, time\n    \
             time.sleep(0.3)\n    \
             builtins.ember_kept = b'x' * (300 << 20)\n    \
             open({:?}, 'w').write('grown')\n\
         threading.Thread(target=grow).start()",
        grown.0.display().to_string()
    );
    let outcomes = run(api, job(vec![exec(&grow)], 1)).await;
    assert_eq!(outcomes[0].state, TaskState::Finished, "{outcomes:?}");
    eventually(LIMIT, "the worker to grow", || async {
        std::fs::read_to_string(&grown.0)
            .ok()
            .filter(|t| t == "grown")
    })
    .await;
    let grown_pid = one_pid(api).await;
    let next_pid = one_pid(api).await;
    assert_ne!(grown_pid, next_pid, "the worker past the limit was retired");
    assert_eq!(one_pid(api).await, next_pid, "a worker under it is kept");
}

#[tokio::test]
async fn a_worker_growing_past_max_rss_during_a_call_is_killed_and_the_task_retried() {
    if !have_python() {
        return;
    }
    let setup = cluster("py-rss-during", None, Some(200 << 20)).await;
    let api = &setup.api;
    let before = one_pid(api).await;
    // 600 MiB in steps of 10, touched, over about 3 s: the worker passes 200 MiB on the way.
    let grow = "import time\nkept = []\nfor _ in range(60):\n    \
                kept.append(b'x' * (10 << 20))\n    time.sleep(0.05)";
    let outcomes = run(api, job(vec![exec(grow)], 2)).await;
    let outcome = &outcomes[0];
    assert_eq!(outcome.state, TaskState::Failed, "{outcome:?}");
    assert_eq!(
        outcome.attempts, 2,
        "retried within max_failures: {outcome:?}"
    );
    let error = outcome.error.as_deref().unwrap();
    eprintln!("the task's error: {error}");
    assert!(error.starts_with("its python worker used "), "{error}");
    assert!(
        error.ends_with(
            "more than the executor's --python-max-rss of 200 MiB, and was killed; a new \
             worker takes its place"
        ),
        "{error}"
    );
    let after = one_pid(api).await;
    assert_ne!(before, after, "a new worker runs the next call");
}

/// A memory cgroup of the test's own, with a limit; what runs in it is killed and the cgroup
/// removed when dropped.
struct TestCgroup {
    dir: PathBuf,
}

impl TestCgroup {
    /// A new cgroup of `limit` bytes at the top of whichever hierarchy holds the memory
    /// controller here, or why there can be none.
    fn make(limit: u64) -> Result<TestCgroup, String> {
        // /proc/self belongs to the process's effective user.
        let user = std::fs::metadata("/proc/self").map(|m| m.uid());
        if !matches!(user, Ok(0)) {
            return Err("not root".into());
        }
        let name = format!("ember-test-{}", uuid::Uuid::new_v4().simple());
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let v2 = Path::new("/sys/fs/cgroup");
        let (dir, limit_file) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(name), "memory.limit_in_bytes")
        } else if std::fs::read_to_string(v2.join("cgroup.subtree_control"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
        {
            (v2.join(name), "memory.max")
        } else {
            return Err("no memory cgroup controller is mounted".into());
        };
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let cgroup = TestCgroup { dir };
        std::fs::write(cgroup.dir.join(limit_file), limit.to_string())
            .map_err(|e| format!("setting {limit_file}: {e}"))?;
        // No swap to spill into, where the machine has any.
        let _ = std::fs::write(cgroup.dir.join("memory.swap.max"), "0");
        Ok(cgroup)
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    fn pids(&self) -> Vec<i32> {
        let text = std::fs::read_to_string(self.procs()).unwrap_or_default();
        text.lines().filter_map(|l| l.trim().parse().ok()).collect()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                let pid = nix::unistd::Pid::from_raw(pid);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!(
                "could not remove the test cgroup {}: {e}",
                self.dir.display()
            );
        }
    }
}

#[tokio::test]
async fn a_worker_the_oom_killer_kills_is_named_as_such() {
    if !have_python() {
        return;
    }
    let cgroup = match TestCgroup::make(300 << 20) {
        Ok(cgroup) => cgroup,
        Err(why) => {
            eprintln!("skipped: no memory cgroup of the test's own can be made ({why})");
            return;
        }
    };
    let cluster = TestCluster::start("py-oom");
    let _driver = cluster.driver().await;
    // The executor, and so its workers, in the cgroup: the shell moves itself in, then
    // becomes the executor.
    let procs = cgroup.procs().display().to_string();
    let mut executor = tokio::process::Command::new("sh")
        .args(["-c", &format!("echo $$ > {procs} && exec \"$@\""), "sh"])
        .arg(env!("CARGO_BIN_EXE_ember-executor"))
        .args(["--nats-url", &cluster.url(), "--cluster", &cluster.cluster])
        .args([
            "--executor-id",
            "oom",
            "--cores",
            "1",
            "--python",
            "python3",
        ])
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start ember-executor");
    let api = cluster.api(cluster.client().await);
    let outcomes = run(&api, job(vec![exec("kept = b'x' * (1 << 30)")], 1)).await;
    let outcome = &outcomes[0];
    assert_eq!(outcome.state, TaskState::Failed, "{outcome:?}");
    let error = outcome.error.as_deref().unwrap();
    eprintln!("the task's error: {error}");
    assert!(
        error.starts_with("its python worker was killed by the kernel's out-of-memory killer ("),
        "{error}"
    );
    assert!(
        error.ends_with("the executor's cgroup limit is 300 MiB); a new worker takes its place"),
        "{error}"
    );
    // The executor lived through it, and its next worker runs.
    let outcomes = run(&api, job(vec![getpid()], 1)).await;
    pid_of(&outcomes[0]);
    let _ = executor.start_kill();
    let _ = tokio::time::timeout(Duration::from_secs(10), executor.wait()).await;
    drop(cgroup);
}

#[test]
fn the_executor_refuses_bad_hygiene_flags_with_a_clear_error() {
    let executor = env!("CARGO_BIN_EXE_ember-executor");
    for (args, needle) in [
        (
            vec!["--python-max-tasks", "0"],
            "a worker must answer at least 1 call before it is retired",
        ),
        (
            vec!["--python-max-rss", "512"],
            "\"512\" is less than a python worker needs to start; give at least 32MiB",
        ),
        (vec!["--python-max-rss", "lots"], "\"lots\" is not a size"),
        (
            vec!["--no-python", "--python-max-rss", "1GiB"],
            "the argument '--no-python' cannot be used with '--python-max-rss <SIZE>'",
        ),
    ] {
        let out = Command::new(executor)
            .args(&args)
            .env_remove("EMBER_NO_PYTHON")
            .env_remove("EMBER_PYTHON_MAX_TASKS")
            .env_remove("EMBER_PYTHON_MAX_RSS")
            .output()
            .expect("run ember-executor");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
