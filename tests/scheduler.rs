//! The scheduler's controls on a real nats-server: killing one task of a job (`ember kill JOB
//! --task INDEX [--retry]`), across a driver restart too.

mod common;

use common::*;
use ember::client::{ClientError, EmberClient};
use ember::executor::Handlers;
use ember::protocol::{JobState, JobSummary, SubmitJob, TaskState};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);

/// A job of these shell commands, one task each.
fn commands(scripts: &[&str]) -> SubmitJob {
    SubmitJob {
        name: "commands".into(),
        max_failures: 1,
        ..SubmitJob::new(scripts.iter().map(|script| sh(script)).collect())
    }
}

/// Waits until task `index` of job `job_id` runs its attempt `attempt`.
async fn until_running(api: &EmberClient, job_id: u64, index: u32, attempt: u32) {
    eventually(LIMIT, "the task to run", || async {
        let results = api.results(job_id).await.ok()?;
        let task = &results[index as usize];
        (task.state == TaskState::Running && task.attempts == attempt + 1).then_some(())
    })
    .await
}

/// Waits until job `job_id` has ended.
async fn until_ended(api: &EmberClient, job_id: u64) -> JobSummary {
    eventually(LIMIT, "the job to end", || async {
        let job = api.job(job_id).await.ok()?;
        (job.state != JobState::Running).then_some(job)
    })
    .await
}

fn driver_said(result: Result<Option<u32>, ClientError>) -> String {
    match result {
        Err(ClientError::Driver(message)) => message,
        other => panic!("expected the driver to refuse, got {other:?}"),
    }
}

#[tokio::test]
async fn one_task_killed_ends_killed_one_killed_with_retry_runs_again() {
    let cluster = TestCluster::start("kill-task");
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("e1", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    // Tasks 0 and 1 take both cores; task 2 waits. Task 1 sleeps only in its first attempt.
    let job = commands(&[
        "sleep 60",
        r#"if [ "$EMBER_TASK_ATTEMPT" = 0 ]; then sleep 60; fi"#,
        "true",
    ]);
    let job_id = api.submit(job).await.unwrap();
    until_running(&api, job_id, 0, 0).await;
    until_running(&api, job_id, 1, 0).await;

    assert_eq!(api.kill_task(job_id, 2, false).await.unwrap(), None);
    assert_eq!(api.kill_task(job_id, 1, true).await.unwrap(), Some(0));
    // Task 1 runs again, this time to its end, and its core goes to nothing else: task 2
    // was killed before it ran.
    let results = eventually(LIMIT, "task 1 to finish", || async {
        let results = api.results(job_id).await.ok()?;
        (results[1].state == TaskState::Finished).then_some(results)
    })
    .await;
    assert_eq!(results[1].attempts, 2);
    assert_eq!(
        (results[2].state, results[2].attempts),
        (TaskState::Killed, 0)
    );
    assert_eq!(results[0].state, TaskState::Running);
    assert_eq!(api.job(job_id).await.unwrap().state, JobState::Running);

    assert_eq!(api.kill_task(job_id, 0, false).await.unwrap(), Some(0));
    let ended = until_ended(&api, job_id).await;
    assert_eq!(
        (ended.state, ended.succeeded, ended.failed, ended.killed),
        (JobState::Killed, 1, 0, 2)
    );
    assert_eq!(
        ended.reason.as_deref(),
        Some("2 tasks killed by request; the other 1 finished")
    );
    let results = api.results(job_id).await.unwrap();
    assert_eq!(
        (results[0].state, results[0].attempts),
        (TaskState::Killed, 1),
        "not run again"
    );
    assert_eq!(results[0].error.as_deref(), Some("killed by request"));

    let said = driver_said(api.kill_task(job_id, 0, false).await);
    assert!(said.contains("has already ended (KILLED)"), "{said}");
    let said = driver_said(api.kill_task(99, 0, false).await);
    assert!(said.contains("no job with id 99"), "{said}");
}

#[tokio::test]
async fn the_cli_kills_one_task_and_says_what_it_asked_for() {
    let cluster = TestCluster::start("kill-task-cli");
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("e1", 1, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let job_id = api.submit(commands(&["sleep 60", "true"])).await.unwrap();
    until_running(&api, job_id, 0, 0).await;
    let job = job_id.to_string();

    let out = cluster
        .cli(&["kill", &job, "--task", "7"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("there is no task 7"), "{stderr}");

    let out = cluster
        .cli(&["kill", &job, "--task", "1"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("killed before it ran"), "{stdout}");

    let out = cluster
        .cli(&["kill", &job, "--task", "0"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("it will not run again"), "{stdout}");
    let ended = until_ended(&api, job_id).await;
    assert_eq!((ended.state, ended.killed), (JobState::Killed, 2));

    let out = cluster
        .cli(&["kill", "1", "--retry"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success(), "--retry needs --task");
}

#[tokio::test]
async fn a_restarted_driver_does_not_run_a_task_killed_before_it() {
    let cluster = TestCluster::start_with_jetstream("kill-task-restart");
    let first = cluster.driver().await;
    let _executor = cluster.executor("e1", 1, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let job_id = api.submit(commands(&["sleep 60", "true"])).await.unwrap();
    until_running(&api, job_id, 0, 0).await;
    assert_eq!(api.kill_task(job_id, 1, false).await.unwrap(), None);
    first.stop().await.unwrap();

    // The next driver restores the job: task 0 runs again, task 1 stays killed.
    let _next = cluster.driver().await;
    eventually(LIMIT, "task 0 to run under the next driver", || async {
        let results = api.results(job_id).await.ok()?;
        (results[0].state == TaskState::Running).then_some(())
    })
    .await;
    let results = api.results(job_id).await.unwrap();
    assert_eq!(
        (results[1].state, results[1].attempts),
        (TaskState::Killed, 0)
    );
    assert_eq!(api.kill_task(job_id, 0, false).await.unwrap(), Some(0));
    let ended = until_ended(&api, job_id).await;
    // Had task 1 come back waiting, it would have run once task 0 was killed, and finished.
    assert_eq!(
        (ended.state, ended.succeeded, ended.killed),
        (JobState::Killed, 0, 2)
    );
}

#[tokio::test]
async fn the_start_gate_holds_a_job_until_the_second_executor_registers() {
    let cluster = TestCluster::start("start-gate");
    // The driver as ember-driver --expect-executors 2 --min-registered-ratio 1 starts it.
    let mut driver = cluster.driver_process(&[
        "--expect-executors",
        "2",
        "--min-registered-ratio",
        "1",
        "--max-registered-wait",
        "60s",
    ]);
    let _driver = driver.spawn().unwrap();
    let _first = cluster.executor("e1", 1, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let job_id = eventually(LIMIT, "the driver to take the job", || async {
        api.submit(noops(2)).await.ok()
    })
    .await;
    // Several offer rounds (every 200 ms) pass with one executor of the two: nothing runs.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let job = api.job(job_id).await.unwrap();
    assert_eq!(
        (job.state, job.running, job.succeeded),
        (JobState::Running, 0, 0)
    );
    let gate = api.executors().await.unwrap().start_gate.unwrap();
    assert_eq!((gate.min_registered, gate.opened_at_ms), (2, None));

    let _second = cluster.executor("e2", 1, Handlers::builtin()).await;
    let ended = until_ended(&api, job_id).await;
    assert_eq!((ended.state, ended.succeeded), (JobState::Succeeded, 2));
    let gate = api.executors().await.unwrap().start_gate.unwrap();
    assert_eq!(
        gate.reason.as_deref(),
        Some("2 executors registered, of the 2 required")
    );
    let out = cluster.cli(&["executors"]).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("start gate opened at"), "{stdout}");
}

#[tokio::test]
async fn with_a_short_longest_wait_the_job_runs_on_fewer_executors() {
    let cluster = TestCluster::start("start-gate-wait");
    let _driver = cluster
        .driver_configured(|config| {
            config.start_gate = Some(ember::driver::core::StartGate {
                min_registered: 2,
                max_wait_ms: 1_500,
            })
        })
        .await;
    let _only = cluster.executor("e1", 1, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let job_id = api.submit(noops(2)).await.unwrap();
    let ended = until_ended(&api, job_id).await;
    assert_eq!((ended.state, ended.succeeded), (JobState::Succeeded, 2));
    let gate = api.executors().await.unwrap().start_gate.unwrap();
    let opened = gate.opened_at_ms.unwrap();
    assert!(
        opened >= gate.opens_by_ms,
        "it opened by the wait, not before"
    );
    let reason = gate.reason.unwrap();
    assert!(reason.contains("longest wait"), "{reason}");
}

#[tokio::test]
async fn start_gate_flags_that_make_no_sense_are_refused() {
    let cluster = TestCluster::start("start-gate-flags");
    for (args, says) in [
        (&["--min-registered", "0"][..], "--min-registered"),
        (&["--min-registered-ratio", "1.5"][..], "ratio"),
        (&["--min-registered-ratio", "0.5"][..], "--expect-executors"),
        (
            &[
                "--min-registered",
                "1",
                "--min-registered-ratio",
                "1",
                "--expect-executors",
                "1",
            ][..],
            "cannot be used with",
        ),
        (&["--max-registered-wait", "5s"][..], "--min-registered"),
    ] {
        let out = cluster.driver_process(args).output().await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// Starts `ember-executor --executor-id ID --cores CORES --resource ...` and waits until the
/// driver has `registered` executors.
async fn executor_process_with(
    cluster: &TestCluster,
    api: &EmberClient,
    id: &str,
    args: &[&str],
    registered: u64,
) -> tokio::process::Child {
    let child = cluster.executor_process(id, args).spawn().unwrap();
    eventually(LIMIT, "the executor to register", || async {
        let snapshot = api.executors().await.ok()?;
        (snapshot.registered_executors == registered).then_some(())
    })
    .await;
    child
}

#[tokio::test]
async fn tasks_asking_for_a_gpu_run_one_at_a_time_where_it_is_and_see_its_address() {
    let cluster = TestCluster::start("resources-gpu");
    let _driver = cluster.driver().await;
    let api = cluster.api(cluster.client().await);
    let _plain = cluster.executor("e1", 2, Handlers::builtin()).await;
    let args = ["--cores", "2", "--resource", "gpu=1"];
    let _gpu = executor_process_with(&cluster, &api, "e2", &args, 2).await;
    let registry = api.executors().await.unwrap();
    let e2 = registry
        .executors
        .iter()
        .find(|e| e.executor_id.as_str() == "e2");
    let gpu = e2.and_then(|e| e.resources.get("gpu").copied()).unwrap();
    assert_eq!((gpu.total, gpu.free), (1, 1));

    // Each task holds a lock directory while it runs: a second task on the GPU at once would
    // find it taken and fail the job (one attempt each).
    let dir = std::env::temp_dir().join(format!("ember-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lock = dir.join("lock");
    let _ = std::fs::remove_dir(&lock);
    let script = format!(
        "mkdir {lock} || exit 3; sleep 0.2; rmdir {lock}; \
         printf '%s %s' \"$EMBER_RESOURCE_GPU\" \"$EMBER_TASK_RESOURCES\"",
        lock = lock.display()
    );
    let submit = cluster
        .cli(&[
            "submit",
            "--json",
            "--tasks",
            "4",
            "--max-failures",
            "1",
            "--resource",
            "gpu=1",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .output();
    let out = within(LIMIT, submit).await.unwrap();
    assert!(out.status.success(), "{out:?}");
    let results = api.results(1).await.unwrap();
    assert_eq!(results.len(), 4);
    for task in &results {
        assert_eq!(task.state, TaskState::Finished, "{task:?}");
        assert_eq!(task.executor_id.as_ref().unwrap().as_str(), "e2");
        let stdout = task.result.as_ref().unwrap()["stdout"].as_str().unwrap();
        assert_eq!(stdout, r#"0 {"gpu":["0"]}"#);
    }
    let registry = api.executors().await.unwrap();
    let e2 = registry
        .executors
        .iter()
        .find(|e| e.executor_id.as_str() == "e2");
    let gpu = e2.and_then(|e| e.resources.get("gpu").copied()).unwrap();
    assert_eq!(gpu.free, 1, "the GPU is free again");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_job_asking_more_gpus_than_any_executor_has_waits_and_the_cli_says_why() {
    let cluster = TestCluster::start("resources-wait");
    let _driver = cluster.driver().await;
    let api = cluster.api(cluster.client().await);
    let _plain = cluster.executor("e1", 2, Handlers::builtin()).await;
    let _gpu = executor_process_with(&cluster, &api, "e2", &["--resource", "gpu=1"], 2).await;
    let mut job = noops(2);
    job.resources = [("gpu".to_string(), 2)].into();
    let job_id = api.submit(job).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let job = api.job(job_id).await.unwrap();
    assert_eq!(
        (job.state, job.running, job.succeeded),
        (JobState::Running, 0, 0)
    );
    let why = "no executor has gpu=2; largest: gpu=1";
    assert_eq!(job.waiting.as_deref(), Some(why));

    let out = cluster.cli(&["jobs", "--json"]).output().await.unwrap();
    assert!(out.status.success(), "{out:?}");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["jobs"][0]["waiting"], why);
    let stdout = cluster.cli_stdout(&["jobs"]).await;
    assert!(
        stdout.contains(&format!("job {job_id} waits: {why}")),
        "{stdout}"
    );
    let out = cluster.cli(&["executors"]).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("gpu 1/1"), "{stdout}");

    // Bad requests are refused before they are sent, and by the driver.
    let out = cluster
        .cli(&["submit", "--resource", "gpu=0"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let mut bad = noops(1);
    bad.resources = [("GPU".to_string(), 1)].into();
    match api.submit(bad).await {
        Err(ClientError::Driver(message)) => assert!(message.contains("not valid"), "{message}"),
        other => panic!("an invalid resource name was accepted: {other:?}"),
    }
    // An executor whose flag makes no sense does not start.
    let out = cluster
        .executor_process("e3", &["--resource", "gpu=0,0"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("twice"));
}
