//! A job's three timeouts over a real nats-server: a task with no free core to start on fails
//! its job within the queue timeout, an attempt that runs too long is stopped and its core
//! freed, and a job past its deadline fails with its running tasks stopped.

mod common;

use common::{eventually, sleepers, within, TestCluster};
use ember::executor::Handlers;
use ember::protocol::{decode, Event, JobState, JobTimeouts, SubmitJob, WaitReason};
use futures::StreamExt;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// The job's start and end times, as the driver's events say, once it has ended.
async fn start_and_end(events: &mut async_nats::Subscriber, job_id: u64) -> (u64, u64) {
    let (mut start, mut end) = (None, None);
    while start.is_none() || end.is_none() {
        let message = within(LIMIT, events.next()).await.unwrap();
        match decode::<Event>(&message.payload, usize::MAX) {
            Ok(Event::JobStart {
                time_ms, job_id: j, ..
            }) if j == job_id => start = Some(time_ms),
            Ok(Event::JobEnd {
                time_ms, job_id: j, ..
            }) if j == job_id => end = Some(time_ms),
            _ => {}
        }
    }
    (start.unwrap(), end.unwrap())
}

/// Waits until every core of the cluster is free again.
async fn all_cores_free(api: &ember::client::EmberClient) {
    eventually(LIMIT, "every core free", || async {
        let snapshot = api.executors().await.ok()?;
        let free: u64 = snapshot
            .executors
            .iter()
            .map(|e| u64::from(e.free_cores))
            .sum();
        (free == snapshot.total_cores).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_on_a_cluster_with_no_free_core_fails_with_the_queue_timeout_reason() {
    let cluster = TestCluster::start("timeouts-queue");
    let mut events = cluster.listen(cluster.subjects.event("job.*")).await;
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 1, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    // The one core is busy for a minute.
    let busy = api.submit(sleepers(1, 60_000)).await.unwrap();
    let waiting = SubmitJob {
        timeouts: JobTimeouts {
            queue_timeout_ms: Some(1000),
            ..Default::default()
        },
        ..sleepers(2, 10)
    };
    let job_id = api.submit(waiting).await.unwrap();
    let summary = within(LIMIT, api.wait(job_id, |_| {})).await.unwrap();
    assert_eq!(summary.state, JobState::Failed, "{summary:?}");
    let reason = summary.reason.clone().unwrap_or_default();
    assert!(
        reason.starts_with("task 0 did not start within the queue timeout (1s)"),
        "{reason}"
    );
    let (start, end) = start_and_end(&mut events, job_id).await;
    let revive = ember::DEFAULT_REVIVE_INTERVAL.as_millis() as u64;
    assert!(
        (1000..=1000 + revive).contains(&(end - start)),
        "the job ended {} ms after it started",
        end - start
    );
    // The other job runs on.
    assert_eq!(api.job(busy).await.unwrap().state, JobState::Running);

    // A job that waits with a longer timeout says why, and until when.
    let patient = SubmitJob {
        timeouts: JobTimeouts {
            queue_timeout_ms: Some(600_000),
            ..Default::default()
        },
        ..sleepers(2, 10)
    };
    let patient = api.submit(patient).await.unwrap();
    let summary = api.job(patient).await.unwrap();
    match summary.waits.as_slice() {
        [WaitReason::QueueTimeout { tasks: 2, until_ms }] => {
            assert!(
                (summary.submitted_at_ms + 600_000..=summary.submitted_at_ms + 601_000)
                    .contains(until_ms),
                "{summary:?}"
            );
        }
        other => panic!("waits {other:?}"),
    }
    let waiting = summary.waiting.unwrap_or_default();
    assert!(
        waiting.starts_with("2 tasks wait for a free core; the job fails at "),
        "{waiting}"
    );
    api.kill(patient).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_past_the_attempt_timeout_is_stopped_and_its_core_freed() {
    let cluster = TestCluster::start("timeouts-attempt");
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let job = SubmitJob {
        max_failures: 2,
        timeouts: JobTimeouts {
            attempt_timeout_ms: Some(300),
            ..Default::default()
        },
        ..sleepers(1, 60_000)
    };
    let summary = within(LIMIT, api.run_job(job, |_| {})).await.unwrap();
    assert_eq!(summary.state, JobState::Failed, "{summary:?}");
    let reason = summary.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("ran longer than the job's attempt timeout (300ms)"),
        "{reason}"
    );
    let outcome = &api.results(summary.job_id).await.unwrap()[0];
    assert_eq!(outcome.attempts, 2);
    all_cores_free(&api).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_deadline_fails_and_its_running_tasks_stop() {
    let cluster = TestCluster::start("timeouts-deadline");
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let job = SubmitJob {
        timeouts: JobTimeouts {
            deadline_ms: Some(500),
            ..Default::default()
        },
        ..sleepers(4, 60_000)
    };
    let summary = within(LIMIT, api.run_job(job, |_| {})).await.unwrap();
    assert_eq!(summary.state, JobState::Failed, "{summary:?}");
    let reason = summary.reason.clone().unwrap_or_default();
    assert!(
        reason.starts_with("the job passed its deadline (500ms after its submission)"),
        "{reason}"
    );
    // The running ones end KILLED once their executor has stopped them.
    let job_id = summary.job_id;
    eventually(LIMIT, "every task killed", || async {
        let summary = api.job(job_id).await.ok()?;
        (summary.running == 0).then_some(summary)
    })
    .await;
    let summary = api.job(job_id).await.unwrap();
    assert_eq!((summary.succeeded, summary.killed), (0, 4), "{summary:?}");
    all_cores_free(&api).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ember_submit_takes_the_timeouts_and_refuses_a_bad_one() {
    let cluster = TestCluster::start("timeouts-cli");
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 1, Handlers::builtin()).await;
    let output = cluster
        .cli(&[
            "submit",
            "--kind",
            "sleep",
            "--arg",
            r#"{"ms": 60000}"#,
            "--deadline",
            "300ms",
            "--json",
        ])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap();
    assert_eq!(last["state"], "FAILED", "{stdout}");

    for (flag, value, error) in [
        ("--queue-timeout", "0s", "is zero"),
        ("--deadline", "40days", "is more than the cap of 30days"),
    ] {
        let output = cluster
            .cli(&["submit", flag, value])
            .output()
            .await
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(error), "{flag} {value}: {stderr}");
    }
}
