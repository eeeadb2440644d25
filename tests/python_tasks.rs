//! Python tasks against a real cluster: the executor's warm Python workers run pickled calls
//! and maps, send back pickled results and exceptions with their tracebacks, name a module
//! that is not importable, and are replaced when they die; a timeout and a kill reach them and
//! what they started; `--no-python` refuses them. The pickles are made by `python3` itself
//! (plain pickle of built-ins, so no package is needed); the tests skip, saying so, where
//! there is no `python3`.

mod common;

use common::{eventually, within, TestCluster};
use ember::client::EmberClient;
use ember::executor::{Handlers, PythonConfig};
use ember::protocol::{JobState, JobSummary, SubmitJob, TaskOutcome, TaskSpec, TaskState};
use nix::errno::Errno;
use nix::sys::signal::killpg;
use nix::unistd::Pid;
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(30);

/// Whether `python3` runs here; if not, says why the test is skipped.
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
    assert!(
        out.status.success(),
        "python3 -c {code:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `pickle.dumps(<expr>)` in base64.
fn pickled(expr: &str) -> String {
    python(&format!(
        "import base64, os, pickle, time\nprint(base64.b64encode(pickle.dumps({expr})).decode())"
    ))
}

/// The `repr` of the value pickled in `b64`.
fn unpickled(b64: &str) -> String {
    python(&format!(
        "import base64, pickle\nprint(repr(pickle.loads(base64.b64decode({b64:?}))))"
    ))
}

fn call(function: &str, args: &str, timeout_ms: Option<u64>) -> TaskSpec {
    TaskSpec::Python {
        function: pickled(function),
        args: pickled(args),
        map: false,
        timeout_ms,
        function_object: None,
        args_object: None,
        objects: Vec::new(),
        upstream: Vec::new(),
        no_retry_on: Vec::new(),
        retry_on: Vec::new(),
    }
}

fn job(tasks: Vec<TaskSpec>) -> SubmitJob {
    SubmitJob {
        name: "python".into(),
        max_failures: 1,
        ..SubmitJob::new(tasks)
    }
}

async fn ended(api: &EmberClient, job_id: u64) -> JobSummary {
    eventually(LIMIT, "the job to end", || async {
        let summary = api.job(job_id).await.ok()?;
        (summary.state != JobState::Running).then_some(summary)
    })
    .await
}

/// Runs `tasks` as one job and returns its outcomes once it has ended.
async fn run(api: &EmberClient, tasks: Vec<TaskSpec>) -> Vec<TaskOutcome> {
    let job_id = api.submit(job(tasks)).await.expect("submit");
    ended(api, job_id).await;
    api.results(job_id).await.expect("results")
}

fn pickle_of(outcome: &TaskOutcome) -> &str {
    assert_eq!(outcome.state, TaskState::Finished, "{outcome:?}");
    outcome.result.as_ref().unwrap()["pickle"].as_str().unwrap()
}

fn error_of(outcome: &TaskOutcome) -> &str {
    assert_eq!(outcome.state, TaskState::Failed, "{outcome:?}");
    outcome.error.as_deref().unwrap()
}

/// A cluster with a driver and one executor of `cores` whose python is `python`.
struct Setup {
    cluster: TestCluster,
    _driver: common::Running<Result<(), ember::driver::DriverError>>,
    _executor: common::Running<Result<(), ember::executor::ExecutorError>>,
    api: EmberClient,
}

async fn cluster(name: &str, cores: u32, python: Option<PythonConfig>) -> Setup {
    let cluster = TestCluster::start(name);
    let driver = cluster.driver().await;
    let executor = cluster
        .executor_configured("a", cores, Handlers::builtin(), |config| {
            config.python = python
        })
        .await;
    let api = cluster.api(cluster.client().await);
    Setup {
        cluster,
        _driver: driver,
        _executor: executor,
        api,
    }
}

fn workers(n: u32) -> Option<PythonConfig> {
    Some(PythonConfig {
        interpreter: "python3".into(),
        workers: n,
        ..PythonConfig::default()
    })
}

#[tokio::test]
async fn calls_and_maps_return_their_pickled_results_in_order() {
    if !have_python() {
        return;
    }
    let setup = cluster("py-calls", 2, workers(0)).await;
    let api = &setup.api;
    let map = TaskSpec::Python {
        function: pickled("abs"),
        args: pickled("[-1, 2, -3]"),
        map: true,
        timeout_ms: None,
        function_object: None,
        args_object: None,
        objects: Vec::new(),
        upstream: Vec::new(),
        no_retry_on: Vec::new(),
        retry_on: Vec::new(),
    };
    let outcomes = run(
        api,
        vec![
            call("pow", "((2, 10), {})", None),
            map,
            call("sorted", "(([3, 1, 2],), {'reverse': True})", None),
        ],
    )
    .await;
    assert_eq!(unpickled(pickle_of(&outcomes[0])), "1024");
    assert_eq!(unpickled(pickle_of(&outcomes[1])), "[1, 2, 3]");
    assert_eq!(unpickled(pickle_of(&outcomes[2])), "[3, 2, 1]");
}

#[tokio::test]
async fn a_python_exception_fails_its_task_with_the_remote_traceback() {
    if !have_python() {
        return;
    }
    let setup = cluster("py-raise", 1, workers(1)).await;
    let api = &setup.api;
    let outcomes = run(api, vec![call("int", "(('seven',), {})", None)]).await;
    let error = error_of(&outcomes[0]);
    assert!(
        error.starts_with("the task raised: ValueError: invalid literal for int()"),
        "{error}"
    );
    assert!(
        error.contains("Traceback (most recent call last)"),
        "{error}"
    );
    let detail = outcomes[0].result.as_ref().expect("the worker's answer");
    assert_eq!(detail["type"], "ValueError");
    assert!(detail["traceback"].as_str().unwrap().contains("ValueError"));
    let exception = detail["exception"].as_str().expect("the pickled exception");
    assert_eq!(
        unpickled(exception),
        r#"ValueError("invalid literal for int() with base 10: 'seven'")"#
    );
    // The worker lived through it: the next call on the one worker runs.
    let outcomes = run(api, vec![call("len", "(('abc',), {})", None)]).await;
    assert_eq!(unpickled(pickle_of(&outcomes[0])), "3");
}

#[tokio::test]
async fn a_function_whose_module_is_not_importable_says_which() {
    if !have_python() {
        return;
    }
    let setup = cluster("py-import", 1, workers(1)).await;
    let api = &setup.api;
    // A pickle (protocol 2) of the global `ember_no_such_module.f`.
    use base64::Engine;
    let function = base64::engine::general_purpose::STANDARD
        .encode(b"\x80\x02cember_no_such_module\nf\nq\x00.");
    let spec = TaskSpec::Python {
        function,
        args: pickled("((), {})"),
        map: false,
        timeout_ms: None,
        function_object: None,
        args_object: None,
        objects: Vec::new(),
        upstream: Vec::new(),
        no_retry_on: Vec::new(),
        retry_on: Vec::new(),
    };
    let outcomes = run(api, vec![spec]).await;
    let error = error_of(&outcomes[0]);
    assert!(
        error.contains(
            "the task's function needs module 'ember_no_such_module', which is not importable \
             on this executor"
        ),
        "{error}"
    );
    assert_eq!(
        outcomes[0].result.as_ref().unwrap()["unimportable"],
        "ember_no_such_module"
    );
}

#[tokio::test]
async fn a_worker_that_dies_fails_only_its_task_and_is_replaced() {
    if !have_python() {
        return;
    }
    let setup = cluster("py-die", 1, workers(1)).await;
    let api = &setup.api;
    let getpid = || call("os.getpid", "((), {})", None);
    let first: u32 = unpickled(pickle_of(&run(api, vec![getpid()]).await[0]))
        .parse()
        .unwrap();
    let again: u32 = unpickled(pickle_of(&run(api, vec![getpid()]).await[0]))
        .parse()
        .unwrap();
    assert_eq!(first, again, "one warm worker serves both calls");
    let outcomes = run(api, vec![call("os._exit", "((3,), {})", None)]).await;
    let error = error_of(&outcomes[0]);
    assert!(
        error.starts_with("the python worker running the task exited (exit status: 3)"),
        "{error}"
    );
    assert!(error.contains("a new worker takes its place"), "{error}");
    let outcomes = run(api, vec![getpid()]).await;
    let replaced: u32 = unpickled(pickle_of(&outcomes[0])).parse().unwrap();
    assert_ne!(replaced, first, "a new worker runs the next task");
}

/// A call of `os.system` whose shell writes its pid (in the worker's process group) to a file
/// and sleeps.
fn sleeper(file: &std::path::Path, timeout_ms: Option<u64>) -> TaskSpec {
    let script = format!(
        "echo $$ > {0}.tmp && mv {0}.tmp {0}; sleep 600",
        file.display()
    );
    call("os.system", &format!("(({script:?},), {{}})"), timeout_ms)
}

fn pid_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "ember-py-{name}-{}.pid",
        uuid::Uuid::new_v4().simple()
    ))
}

async fn shell_of(file: &std::path::Path) -> Pid {
    eventually(LIMIT, "the shell's pid", || async {
        let text = std::fs::read_to_string(file).ok()?;
        text.trim().parse().ok().map(Pid::from_raw)
    })
    .await
}

async fn assert_gone(pid: Pid) {
    eventually(LIMIT, "the worker's shell to end", || async {
        (nix::sys::signal::kill(pid, None) == Err(Errno::ESRCH)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_timeout_stops_the_worker_and_what_it_started() {
    if !have_python() {
        return;
    }
    let setup = cluster("py-timeout", 1, workers(1)).await;
    let api = &setup.api;
    let file = pid_file("timeout");
    let started = Instant::now();
    let job_id = api
        .submit(job(vec![sleeper(&file, Some(1500))]))
        .await
        .unwrap();
    let shell = shell_of(&file).await;
    let summary = ended(api, job_id).await;
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(summary.state, JobState::Failed);
    let reason = summary.reason.unwrap();
    assert!(
        reason.contains("timed out after 1.5s; its python worker was stopped"),
        "{reason}"
    );
    assert_gone(shell).await;
    let _ = killpg(shell, None);
    let _ = std::fs::remove_file(&file);
    // The pool goes on with a new worker.
    let outcomes = run(api, vec![call("len", "(('ab',), {})", None)]).await;
    assert_eq!(unpickled(pickle_of(&outcomes[0])), "2");
}

#[tokio::test]
async fn a_kill_reaches_the_worker() {
    if !have_python() {
        return;
    }
    let setup = cluster("py-kill", 1, workers(1)).await;
    let api = &setup.api;
    let file = pid_file("kill");
    let job_id = api.submit(job(vec![sleeper(&file, None)])).await.unwrap();
    let shell = shell_of(&file).await;
    within(LIMIT, api.kill(job_id)).await.unwrap();
    let summary = eventually(LIMIT, "the task's KILLED status", || async {
        let summary = api.job(job_id).await.ok()?;
        (summary.running == 0 && summary.killed == 1).then_some(summary)
    })
    .await;
    assert_eq!(summary.state, JobState::Killed);
    assert_gone(shell).await;
    let _ = std::fs::remove_file(&file);
}

#[tokio::test]
async fn a_stopped_worker_gets_sigterm_first_so_what_it_runs_may_clean_up() {
    if !have_python() {
        return;
    }
    let setup = cluster("py-grace", 1, workers(1)).await;
    let api = &setup.api;
    let file = pid_file("grace");
    let cleaned = file.with_extension("cleaned");
    // A shell that, told to stop, leaves a file behind: only SIGTERM lets it.
    let script = format!(
        "trap 'echo cleaned > {1}; exit 0' TERM; echo $$ > {0}.tmp && mv {0}.tmp {0}; \
         while true; do sleep 0.1; done",
        file.display(),
        cleaned.display()
    );
    let task = call("os.system", &format!("(({script:?},), {{}})"), Some(1500));
    let job_id = api.submit(job(vec![task])).await.unwrap();
    let shell = shell_of(&file).await;
    let summary = ended(api, job_id).await;
    assert_eq!(summary.state, JobState::Failed);
    eventually(LIMIT, "the shell's clean-up on SIGTERM", || async {
        std::fs::read_to_string(&cleaned)
            .ok()
            .filter(|text| text.trim() == "cleaned")
    })
    .await;
    assert_gone(shell).await;
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&cleaned);
}

#[tokio::test]
async fn no_python_refuses_python_tasks_and_a_missing_interpreter_is_named() {
    if !have_python() {
        return;
    }
    let setup = cluster("py-none", 1, None).await;
    let api = &setup.api;
    let outcomes = run(api, vec![call("len", "(('ab',), {})", None)]).await;
    assert_eq!(
        error_of(&outcomes[0]),
        "this executor runs no python tasks (it was started with --no-python)"
    );
    let missing = Some(PythonConfig {
        interpreter: "/nonexistent/python3".into(),
        workers: 1,
        ..PythonConfig::default()
    });
    let setup = cluster("py-missing", 1, missing).await;
    let api = &setup.api;
    let outcomes = run(api, vec![call("len", "(('ab',), {})", None)]).await;
    let error = error_of(&outcomes[0]);
    assert!(
        error.starts_with("could not start the python interpreter \"/nonexistent/python3\""),
        "{error}"
    );
}

#[tokio::test]
async fn a_python_task_spec_over_the_size_limit_is_refused() {
    if !have_python() {
        return;
    }
    let setup = cluster("py-size", 1, workers(1)).await;
    let api = &setup.api;
    let limit = api.nats().server_info().max_payload;
    let spec = TaskSpec::Python {
        function: pickled("len"),
        args: "A".repeat(limit + 4),
        map: false,
        timeout_ms: None,
        function_object: None,
        args_object: None,
        objects: Vec::new(),
        upstream: Vec::new(),
        no_retry_on: Vec::new(),
        retry_on: Vec::new(),
    };
    let error = api.submit(job(vec![spec])).await.unwrap_err().to_string();
    assert!(error.contains("over the server's limit"), "{error}");
    // Bad base64 is refused by the driver, naming the field.
    let reply = api
        .nats()
        .request(
            setup.cluster.subjects.api(),
            r#"{"type":"SubmitJob","tasks":[{"kind":"python","function":"not base64!","args":""}]}"#.into(),
        )
        .await
        .unwrap();
    let reply: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(reply["type"], "Error", "{reply}");
    assert!(
        reply["message"]
            .as_str()
            .unwrap()
            .contains("`function` must be a pickle in base64"),
        "{reply}"
    );
}

#[test]
fn the_executor_refuses_bad_python_flags_with_a_clear_error() {
    let executor = env!("CARGO_BIN_EXE_ember-executor");
    for (args, needle) in [
        (
            vec!["--python", ""],
            "invalid value '' for '--python <PYTHON>': name an interpreter, such as python3",
        ),
        (
            vec!["--python-workers", "0"],
            "invalid value '0' for '--python-workers <PYTHON_WORKERS>'",
        ),
        (
            vec!["--no-python", "--python-workers", "2"],
            "the argument '--no-python' cannot be used with '--python-workers <PYTHON_WORKERS>'",
        ),
    ] {
        let out = Command::new(executor)
            .args(&args)
            .env_remove("EMBER_PYTHON")
            .env_remove("EMBER_PYTHON_WORKERS")
            .env_remove("EMBER_NO_PYTHON")
            .output()
            .expect("run ember-executor");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
