//! Exclusion on failure on a real nats-server (`ember-driver --exclude-on-failure`): a task that
//! fails on one executor runs again on another, and the first is excluded, from the task, the
//! job and then every job; a job whose only executor is excluded fails, saying so.

mod common;

use common::*;
use ember::driver::core::ExclusionConfig;
use ember::executor::Handlers;
use ember::protocol::{
    Event, ExclusionScope, JobState, JobSummary, SubmitJob, TaskSpec, TaskState,
};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);

/// Handlers whose `work` fails at once (`fails`) or succeeds after 500 ms, long enough for a
/// failure elsewhere to be heard first.
fn work(fails: bool) -> Handlers {
    let mut handlers = Handlers::builtin();
    handlers.register("work", move |_, _| {
        if fails {
            return Err("the disk is full".into());
        }
        std::thread::sleep(Duration::from_millis(500));
        Ok(serde_json::Value::Null)
    });
    handlers
}

fn work_job(tasks: u32) -> SubmitJob {
    SubmitJob {
        name: "work".into(),
        repeat: tasks,
        max_failures: 4,
        ..SubmitJob::new(vec![TaskSpec::Handler {
            name: "work".into(),
            arg: serde_json::Value::Null,
        }])
    }
}

async fn until_ended(api: &ember::client::EmberClient, job_id: u64) -> JobSummary {
    eventually(LIMIT, "the job to end", || async {
        let job = api.job(job_id).await.ok()?;
        (job.state != JobState::Running).then_some(job)
    })
    .await
}

/// The exclusions among `events`: (executor, scope, job, index).
fn exclusions(events: &[Event]) -> Vec<(String, ExclusionScope, Option<u64>, Option<u32>)> {
    events
        .iter()
        .filter_map(|event| match event {
            Event::ExecutorExcluded {
                executor_id,
                scope,
                job_id,
                index,
                ..
            } => Some((executor_id.to_string(), *scope, *job_id, *index)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn failed_tasks_run_on_the_other_executor_and_the_first_is_excluded() {
    let cluster = TestCluster::start("exclusion");
    let _driver = cluster
        .driver_configured(|config| config.exclusion = Some(ExclusionConfig::default()))
        .await;
    let mut events = cluster
        .listen(cluster.subjects.event("executor.excluded"))
        .await;
    let _bad = cluster.executor("bad", 1, work(true)).await;
    let _good = cluster.executor("good", 1, work(false)).await;
    let api = cluster.api(cluster.client().await);
    eventually(LIMIT, "both executors", || async {
        (api.executors().await.ok()?.executors.len() == 2).then_some(())
    })
    .await;

    // Tasks 0 and 2 go to bad (the first in id order, then the free one) and fail there; each
    // runs again on good, and bad is excluded from each, then from the job, and, once the job
    // has succeeded, from every job.
    let job_id = api.submit(work_job(3)).await.unwrap();
    let ended = until_ended(&api, job_id).await;
    assert_eq!((ended.state, ended.succeeded), (JobState::Succeeded, 3));
    let results = api.results(job_id).await.unwrap();
    for task in &results {
        assert_eq!(task.state, TaskState::Finished);
        assert_eq!(task.executor_id.as_ref().unwrap().as_str(), "good");
    }
    assert_eq!(
        results.iter().map(|t| t.attempts).collect::<Vec<_>>(),
        [2, 1, 2]
    );
    let seen = collect_events(&mut events, 4, LIMIT).await;
    let bad = || "bad".to_string();
    assert_eq!(
        exclusions(&seen),
        [
            (bad(), ExclusionScope::Task, Some(job_id), Some(0)),
            (bad(), ExclusionScope::Task, Some(job_id), Some(2)),
            (bad(), ExclusionScope::Job, Some(job_id), None),
            (bad(), ExclusionScope::Cluster, None, None),
        ]
    );

    // The cluster exclusion outlives the job: `ember executors` shows it, and the next job
    // runs on good alone.
    let registry = api.executors().await.unwrap();
    let shown: Vec<_> = registry
        .executors
        .iter()
        .map(|e| (e.executor_id.to_string(), e.exclusions.len()))
        .collect();
    assert_eq!(shown, [(bad(), 1), ("good".into(), 0)]);
    let exclusion = &registry.executors[0].exclusions[0];
    assert_eq!(exclusion.scope, ExclusionScope::Cluster);
    assert!(
        exclusion
            .reason
            .contains("2 tasks failed on it in jobs that succeeded"),
        "{}",
        exclusion.reason
    );
    let out = cluster.cli(&["executors"]).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("executor bad is excluded from every job until"),
        "{stdout}"
    );
    let job_id = api.submit(noops(2)).await.unwrap();
    let ended = until_ended(&api, job_id).await;
    assert_eq!(ended.state, JobState::Succeeded);
    for task in api.results(job_id).await.unwrap() {
        assert_eq!(task.executor_id.unwrap().as_str(), "good");
    }
}

#[tokio::test]
async fn a_job_whose_only_executor_is_excluded_fails_saying_so() {
    let cluster = TestCluster::start("exclusion-unschedulable");
    let _driver = cluster
        .driver_configured(|config| {
            config.exclusion = Some(ExclusionConfig {
                unschedulable_timeout_ms: 1_000,
                ..ExclusionConfig::default()
            })
        })
        .await;
    let _only = cluster.executor("only", 1, work(true)).await;
    let api = cluster.api(cluster.client().await);
    let job_id = eventually(LIMIT, "the driver to take the job", || async {
        api.submit(work_job(1)).await.ok()
    })
    .await;
    // Without exclusion, the task would run 4 times on the one executor; with it, it runs
    // once, and the job fails after the unschedulable timeout.
    let ended = until_ended(&api, job_id).await;
    assert_eq!((ended.state, ended.failed), (JobState::Failed, 1));
    let reason = ended.reason.unwrap();
    for says in [
        "task 0 cannot run anywhere",
        "the one live executor is excluded after failures",
        "only (this task)",
        "last error: the disk is full",
    ] {
        assert!(reason.contains(says), "{says:?} in {reason}");
    }
    let results = api.results(job_id).await.unwrap();
    assert_eq!(
        (results[0].state, results[0].attempts),
        (TaskState::Failed, 1)
    );
    assert!(results[0]
        .error
        .as_deref()
        .unwrap()
        .contains("cannot run anywhere"));
}

#[tokio::test]
async fn a_job_excluded_from_every_executor_meeting_its_constraints_fails_though_others_are_free() {
    let cluster = TestCluster::start("exclusion-constrained");
    let _driver = cluster
        .driver_configured(|config| {
            config.exclusion = Some(ExclusionConfig {
                unschedulable_timeout_ms: 3_000,
                ..ExclusionConfig::default()
            })
        })
        .await;
    let rack = |rack: &str| {
        let attributes = [("rack".to_string(), rack.to_string())].into();
        move |config: &mut ember::executor::ExecutorConfig| config.attributes = attributes
    };
    let _bad = cluster
        .executor_configured("bad", 1, work(true), rack("r1"))
        .await;
    let _idle = cluster
        .executor_configured("idle", 1, work(false), rack("r2"))
        .await;
    let api = cluster.api(cluster.client().await);
    eventually(LIMIT, "both executors", || async {
        (api.executors().await.ok()?.executors.len() == 2).then_some(())
    })
    .await;
    // Both tasks fail on bad, the one executor on rack r1: it is excluded from the job. idle
    // is free and not excluded, but the job may not run there.
    let job = SubmitJob {
        placement: ember::placement::Placement {
            constraints: vec!["rack=r1".into()],
            ..Default::default()
        },
        ..work_job(2)
    };
    let job_id = api.submit(job).await.unwrap();
    let waiting = eventually(LIMIT, "the job to say why it waits", || async {
        api.job(job_id).await.ok()?.waiting
    })
    .await;
    assert!(
        waiting.starts_with("every live executor meeting its constraints is excluded"),
        "{waiting}"
    );
    let ended = until_ended(&api, job_id).await;
    assert_eq!(ended.state, JobState::Failed);
    let reason = ended.reason.unwrap();
    for says in [
        "cannot run anywhere",
        "the one live executor meeting its constraints is excluded after failures",
        "bad (this job)",
        "last error: the disk is full",
    ] {
        assert!(reason.contains(says), "{says:?} in {reason}");
    }
    for task in api.results(job_id).await.unwrap() {
        assert_eq!(task.attempts, 1, "{task:?}");
        assert_eq!(task.executor_id.unwrap().as_str(), "bad");
    }
}

#[tokio::test]
async fn exclusion_flags_that_make_no_sense_are_refused() {
    let cluster = TestCluster::start("exclusion-flags");
    for (args, says) in [
        (&["--exclude-timeout", "5m"][..], "--exclude-on-failure"),
        (
            &["--exclude-on-failure", "--exclude-task-failures", "0"][..],
            "--exclude-task-failures",
        ),
        (
            &[
                "--exclude-on-failure",
                "--exclude-unschedulable-timeout",
                "0s",
            ][..],
            "--exclude-unschedulable-timeout",
        ),
    ] {
        let out = cluster.driver_process(args).output().await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
