//! Speculative execution on a real nats-server: with one executor slow, a job with
//! `speculation` finishes well before the slow executor would, every task FINISHES exactly once
//! on the listener bus, and the slow executor gets its cores back.

mod common;

use common::*;
use ember::protocol::{Event, JobState, Speculation, SpeculativeCounts, SubmitJob, TaskState};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);
/// How long a task sleeps on the slow executor; elsewhere it sleeps 0.3 s.
const SLOW_SECS: u64 = 8;

const EXECUTOR_FLAGS: [&str; 4] = ["--cores", "2", "--heartbeat-interval", "200ms"];

/// Six tasks that each sleep 0.3 s, or `SLOW_SECS` on the executor started with
/// `EMBER_TEST_SLOW` set (command tasks inherit the executor's environment).
fn job(speculation: Option<Speculation>) -> SubmitJob {
    let script =
        format!(r#"if [ -n "$EMBER_TEST_SLOW" ]; then sleep {SLOW_SECS}; else sleep 0.3; fi"#);
    SubmitJob {
        speculation,
        name: "slow-one".into(),
        repeat: 6,
        max_failures: 1,
        ..SubmitJob::new(vec![sh(&script)])
    }
}

/// Every FINISHED end per task index and the speculative launches of job `job_id`, heard on
/// the bus until its `JobEnd`.
async fn ledger(
    events: &mut async_nats::Subscriber,
    job_id: u64,
) -> (BTreeMap<u32, u32>, u32, JobState) {
    let mut finished = BTreeMap::new();
    let mut copies = 0;
    within(LIMIT, async {
        loop {
            let message = events.next().await.expect("subscription open");
            let event: Event = ember::protocol::decode(&message.payload, usize::MAX).unwrap();
            if event.job_id() != Some(job_id) {
                continue;
            }
            match &event {
                Event::TaskEnd { .. } => {
                    for (_, end) in event.ended() {
                        if end.state == TaskState::Finished {
                            *finished.entry(end.index).or_insert(0) += 1;
                        }
                    }
                }
                Event::SpeculativeTaskStart { .. } => copies += 1,
                Event::JobEnd { state, .. } => return (finished, copies, *state),
                _ => {}
            }
        }
    })
    .await
}

#[tokio::test]
async fn with_one_slow_executor_speculation_finishes_sooner_and_each_task_once() {
    let cluster = TestCluster::start("speculation");
    let _driver = cluster.driver().await;
    let _fast1 = cluster
        .executor_process("a-fast", &EXECUTOR_FLAGS)
        .spawn()
        .unwrap();
    let _fast2 = cluster
        .executor_process("b-fast", &EXECUTOR_FLAGS)
        .spawn()
        .unwrap();
    let _slow = cluster
        .executor_process("c-slow", &EXECUTOR_FLAGS)
        .env("EMBER_TEST_SLOW", "1")
        .spawn()
        .unwrap();
    let api = cluster.api(cluster.client().await);
    eventually(LIMIT, "three executors", || async {
        (api.executors().await.ok()?.registered_executors == 3).then_some(())
    })
    .await;
    let mut events = cluster.listen(cluster.subjects.events_all()).await;

    // Spread over the three, two tasks land on the slow one; four finish in 0.3 s (the
    // quantile of 6), and the slow two are copied once past 1.5 x 0.3 s.
    let started = Instant::now();
    let job_id = api.submit(job(Some(Speculation::default()))).await.unwrap();
    let (finished, copies, state) = ledger(&mut events, job_id).await;
    let elapsed = started.elapsed();
    assert_eq!(state, JobState::Succeeded);
    assert!(
        elapsed < Duration::from_secs(SLOW_SECS / 2),
        "took {elapsed:?} with speculation; the slow executor takes {SLOW_SECS} s"
    );
    assert_eq!(finished, (0..6).map(|index| (index, 1)).collect());
    assert_eq!(copies, 2);
    let summary = api.job(job_id).await.unwrap();
    assert_eq!(summary.succeeded, 6);
    assert_eq!(
        summary.speculative,
        Some(SpeculativeCounts {
            launched: 2,
            won: 2
        })
    );
    let results = api.results(job_id).await.unwrap();
    for outcome in &results {
        assert_eq!(outcome.state, TaskState::Finished);
        assert_ne!(outcome.executor_id.as_ref().unwrap().as_str(), "c-slow");
    }
    // The losers are killed: the slow executor's cores come back long before its sleeps end.
    eventually(
        Duration::from_secs(SLOW_SECS / 2),
        "the slow executor's cores",
        || async {
            let executors = api.executors().await.ok()?.executors;
            let slow = executors
                .iter()
                .find(|e| e.executor_id.as_str() == "c-slow")?;
            (slow.free_cores == 2).then_some(())
        },
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(SLOW_SECS));
    let first = job_id;

    // `ember jobs` says what speculation did, under the table.
    let stdout = cluster.cli_stdout(&["jobs"]).await;
    assert!(
        stdout.contains(&format!(
            "job {first} speculative copies: 2 launched, 2 finished first"
        )),
        "{stdout}"
    );

    // The same job without speculation waits for the slow executor.
    let started = Instant::now();
    let job_id = api.submit(job(None)).await.unwrap();
    let (finished, copies, state) = ledger(&mut events, job_id).await;
    let elapsed = started.elapsed();
    assert_eq!(state, JobState::Succeeded);
    assert!(
        elapsed >= Duration::from_secs(SLOW_SECS),
        "took {elapsed:?}"
    );
    assert_eq!(finished, (0..6).map(|index| (index, 1)).collect());
    assert_eq!(copies, 0);
    assert_eq!(api.job(job_id).await.unwrap().speculative, None);
    let stdout = cluster.cli_stdout(&["jobs"]).await;
    assert_eq!(
        stdout.matches("speculative copies").count(),
        1,
        "only the first job speculates: {stdout}"
    );
}
