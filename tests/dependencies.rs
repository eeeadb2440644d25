//! Jobs that run after other jobs, on a real nats-server: `ember submit --after` and
//! `--after-any`, a failure that ends the jobs after it, what `ember jobs` and `ember status`
//! say of a waiting job, and a chain of three jobs through a SIGKILL of the driver.

mod common;

use common::{eventually, sleepers, within, TestCluster};
use ember::executor::Handlers;
use ember::protocol::{JobState, SubmitJob};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

fn after(mut job: SubmitJob, after: &[u64], after_any: &[u64]) -> SubmitJob {
    job.after = after.to_vec();
    job.after_any = after_any.to_vec();
    job
}

/// A job of one task of the built-in `fail` handler.
fn failing() -> SubmitJob {
    let mut job = common::noops(1);
    job.tasks = vec![ember::protocol::TaskSpec::Handler {
        name: "fail".into(),
        arg: serde_json::json!({"message": "upstream broke"}),
    }];
    job
}

#[tokio::test]
async fn a_job_after_another_waits_then_runs_and_a_failure_ends_the_jobs_after_it() {
    let cluster = TestCluster::start("dependencies");
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("exec-1", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);

    // A job after a running one waits, and says so in `ember jobs` and `ember status`.
    let first = api.submit(sleepers(2, 1500)).await.unwrap();
    let second = api
        .submit(after(common::noops(2), &[first], &[]))
        .await
        .unwrap();
    let waiting = api.job(second).await.unwrap();
    assert_eq!(waiting.state, JobState::Waiting);
    assert_eq!(waiting.waits_for, [first]);
    let jobs = cluster.cli_stdout(&["jobs"]).await;
    assert!(
        jobs.contains(&format!("job {second} waits: runs after job {first}")),
        "{jobs}"
    );
    let status = cluster.cli_stdout(&["status"]).await;
    assert!(
        status.contains(&format!("waits for job {first} to end")),
        "{status}"
    );
    let done = within(LIMIT, api.wait(second, |_| {})).await.unwrap();
    assert_eq!(done.state, JobState::Succeeded, "{done:?}");
    let upstream = api.job(first).await.unwrap();
    assert!(
        done.ended_at_ms >= upstream.ended_at_ms,
        "the second job ended before the first"
    );

    // A failure ends the job after it and the one after that; a job after it however it
    // ends runs.
    let broken = api.submit(failing()).await.unwrap();
    let next = api
        .submit(after(common::noops(1), &[broken], &[]))
        .await
        .unwrap();
    let last = api
        .submit(after(common::noops(1), &[next], &[]))
        .await
        .unwrap();
    let cleanup = api
        .submit(after(common::noops(1), &[], &[last]))
        .await
        .unwrap();
    let ended = within(LIMIT, api.wait(last, |_| {})).await.unwrap();
    assert_eq!(ended.state, JobState::Failed);
    let reason = ended.reason.unwrap_or_default();
    assert!(
        reason.starts_with(&format!(
            "job {next}, which this job runs after, FAILED: job {broken}, which this job runs \
             after, FAILED: "
        )) && reason.contains("upstream broke"),
        "{reason}"
    );
    assert_eq!((ended.succeeded, ended.failed), (0, 0), "nothing of it ran");
    let cleaned = within(LIMIT, api.wait(cleanup, |_| {})).await.unwrap();
    assert_eq!(cleaned.state, JobState::Succeeded);

    // Only jobs the driver keeps may be named.
    let refused = api
        .submit(after(common::noops(1), &[999], &[]))
        .await
        .expect_err("an unknown job");
    assert!(refused.to_string().contains("job 999"), "{refused}");
}

#[tokio::test]
async fn ember_submit_after_waits_for_the_job_and_fails_with_it() {
    let cluster = TestCluster::start("dependencies-cli");
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("exec-1", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let first = api.submit(failing()).await.unwrap();
    let out = within(
        LIMIT,
        cluster
            .cli(&["submit", "--after", &first.to_string(), "--json"])
            .output(),
    )
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(summary["state"], "FAILED", "{summary}");
    let out = within(
        LIMIT,
        cluster
            .cli(&["submit", "--after-any", &first.to_string(), "--json"])
            .output(),
    )
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    // --detach prints the id and returns at once; a job after it waits for it.
    let detached = cluster
        .cli_stdout(&[
            "submit",
            "--detach",
            "--kind",
            "sleep",
            "--arg",
            r#"{"ms": 300}"#,
        ])
        .await;
    let detached: u64 = detached.trim().parse().expect("a job id");
    let chained = within(
        LIMIT,
        cluster.cli_stdout(&["submit", "--json", "--after", &detached.to_string()]),
    )
    .await;
    let chained: serde_json::Value = serde_json::from_str(&chained).expect("json");
    assert_eq!(chained["state"], "SUCCEEDED", "{chained}");
    assert_eq!(api.job(detached).await.unwrap().state, JobState::Succeeded);
    let refused = cluster
        .cli(&["submit", "--after", "4242"])
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("job 4242") && stderr.contains("does not exist"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_chain_of_three_jobs_runs_through_a_sigkill_of_the_driver() {
    let cluster = TestCluster::start_with_jetstream("dependencies-kill");
    let flags = ["--journal", "on"];
    let mut driver = cluster.driver_process(&flags).spawn().unwrap();
    let _executor = cluster.executor("exec-1", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let first = eventually(LIMIT, "the driver leads", || async {
        api.submit(sleepers(2, 2000)).await.ok()
    })
    .await;
    let second = api
        .submit(after(sleepers(1, 100), &[first], &[]))
        .await
        .unwrap();
    let third = api
        .submit(after(common::noops(1), &[second], &[]))
        .await
        .unwrap();
    assert_eq!(api.job(third).await.unwrap().state, JobState::Waiting);
    driver.kill().await.expect("SIGKILL the driver");
    let _driver = cluster.driver_process(&flags).spawn().unwrap();
    // The new driver knows what waits for what, and runs the chain in order.
    let ended = within(LIMIT, api.wait(third, |_| {})).await.unwrap();
    assert_eq!(ended.state, JobState::Succeeded, "{ended:?}");
    let (a, b) = (
        api.job(first).await.unwrap(),
        api.job(second).await.unwrap(),
    );
    assert_eq!(
        (a.state, b.state),
        (JobState::Succeeded, JobState::Succeeded)
    );
    assert!(a.ended_at_ms <= b.ended_at_ms && b.ended_at_ms <= ended.ended_at_ms);
}
