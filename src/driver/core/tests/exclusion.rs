//! Exclusion on failure: an executor is excluded from a task that failed on it, from a job
//! of which several tasks failed on it, and from every job after failures across jobs that
//! succeeded; each exclusion ends after its timeout; a job with a task no live executor may
//! run fails after the unschedulable timeout.

use super::*;
use crate::driver::core::ExclusionConfig;
use crate::protocol::ExclusionScope;

/// Shorter than the executor timeout (10s), so that ticks past it lose no executor.
const TIMEOUT: u64 = 5_000;
const UNSCHEDULABLE: u64 = 1_000;

fn excluding() -> Core {
    let mut core = new_core(0);
    core.set_exclusion(ExclusionConfig {
        timeout_ms: TIMEOUT,
        unschedulable_timeout_ms: UNSCHEDULABLE,
        ..ExclusionConfig::default()
    });
    core
}

/// An exclusion's executor, scope, job and task.
type Target = (String, ExclusionScope, Option<JobId>, Option<u32>);

/// The exclusions published in `effects`: (executor, scope, job, index, until).
fn excluded(effects: &[Effect]) -> Vec<(Target, u64)> {
    events(effects)
        .into_iter()
        .filter_map(|event| match event {
            Event::ExecutorExcluded {
                executor_id,
                scope,
                job_id,
                index,
                until_ms,
                ..
            } => Some(((executor_id.to_string(), scope, job_id, index), until_ms)),
            _ => None,
        })
        .collect()
}

/// The exclusions that ended in `effects`: (executor, scope, job, index).
fn unexcluded(effects: &[Effect]) -> Vec<Target> {
    events(effects)
        .into_iter()
        .filter_map(|event| match event {
            Event::ExecutorUnexcluded {
                executor_id,
                scope,
                job_id,
                index,
                ..
            } => Some((executor_id.to_string(), scope, job_id, index)),
            _ => None,
        })
        .collect()
}

/// What `ListExecutors` shows of executor `id`'s exclusions: (scope, job, index).
fn shown(core: &Core, id: &str) -> Vec<(ExclusionScope, Option<JobId>, Option<u32>)> {
    let snapshot = core.executors_snapshot();
    let executor = snapshot
        .executors
        .iter()
        .find(|e| e.executor_id.as_str() == id)
        .expect("registered");
    executor
        .exclusions
        .iter()
        .map(|x| (x.scope, x.job_id, x.index))
        .collect()
}

#[test]
fn a_task_is_not_retried_where_it_failed_even_when_no_other_executor_has_room() {
    let mut core = excluding();
    add(&mut core, "a", 1, 1);
    add(&mut core, "b", 1, 1);
    let (job_id, launched) = start(&mut core, job(2, 1, 4), 10);
    assert_eq!(
        launched,
        [("a".into(), vec![(1, 0, 0)]), ("b".into(), vec![(2, 1, 0)])]
    );
    // Without exclusion the retry would go straight back to a (b is busy); with it, a is
    // excluded from task 0, which waits for b.
    let effects = report(&mut core, "a", vec![failed(1, 0, "boom")], 20);
    assert_eq!(
        excluded(&effects),
        [(
            ("a".into(), ExclusionScope::Task, Some(job_id), Some(0)),
            20 + TIMEOUT
        )]
    );
    assert_eq!(event_kinds(&effects), ["executor.excluded", "task.end"]);
    assert_eq!(launches(&effects), []);
    assert_eq!(
        shown(&core, "a"),
        [(ExclusionScope::Task, Some(job_id), Some(0))]
    );
    core.tick(25);
    assert_eq!(launches(&core.take_effects()), []);
    let effects = report(&mut core, "b", vec![finished(2, 0)], 30);
    assert_eq!(launches(&effects), [("b".into(), vec![(1, 0, 1)])]);
    let effects = report(&mut core, "b", vec![finished(1, 1)], 40);
    assert_eq!(job_ends(&effects), [job_succeeded(40, job_id, 2)]);
    // One failure in a job that succeeded: not yet enough for the cluster scope, and the
    // task's exclusion ended with its job.
    assert_eq!(excluded(&effects), []);
    assert_eq!(shown(&core, "a"), []);
    check_invariants(&core);
}

#[test]
fn two_tasks_failed_on_an_executor_exclude_it_from_the_job_and_then_from_every_job() {
    let mut core = excluding();
    add(&mut core, "a", 1, 1);
    add(&mut core, "b", 1, 1);
    let (job_id, _) = start(&mut core, job(3, 1, 4), 10);
    // Task 0 fails on a; a takes the next fresh task, 2, which fails there too.
    let effects = report(&mut core, "a", vec![failed(1, 0, "boom")], 20);
    assert_eq!(launches(&effects), [("a".into(), vec![(3, 2, 0)])]);
    let effects = report(&mut core, "a", vec![failed(3, 0, "boom")], 30);
    let until = 30 + TIMEOUT;
    assert_eq!(
        excluded(&effects),
        [
            (
                ("a".into(), ExclusionScope::Task, Some(job_id), Some(2)),
                until
            ),
            (("a".into(), ExclusionScope::Job, Some(job_id), None), until),
        ]
    );
    assert_eq!(launches(&effects), []);
    assert_eq!(
        shown(&core, "a"),
        [
            (ExclusionScope::Job, Some(job_id), None),
            (ExclusionScope::Task, Some(job_id), Some(0)),
            (ExclusionScope::Task, Some(job_id), Some(2)),
        ]
    );
    // Another job may still use a.
    let (other, launched) = start(&mut core, job(1, 1, 4), 35);
    assert_eq!(launched, [("a".into(), vec![(4, 0, 0)])]);
    report(&mut core, "a", vec![finished(4, 0)], 36);
    // b runs job 1's tasks one at a time.
    let effects = report(&mut core, "b", vec![finished(2, 0)], 40);
    assert_eq!(launches(&effects), [("b".into(), vec![(3, 2, 1)])]);
    let effects = report(&mut core, "b", vec![finished(3, 1)], 50);
    assert_eq!(launches(&effects), [("b".into(), vec![(1, 0, 1)])]);
    let effects = report(&mut core, "b", vec![finished(1, 1)], 60);
    // The job succeeded with two failures on a: a is excluded from every job, after JobEnd.
    assert_eq!(
        event_kinds(&effects),
        ["task.end", "job.end", "executor.excluded"]
    );
    assert_eq!(
        excluded(&effects),
        [(
            ("a".into(), ExclusionScope::Cluster, None, None),
            60 + TIMEOUT
        )]
    );
    assert_eq!(shown(&core, "a"), [(ExclusionScope::Cluster, None, None)]);
    assert_eq!(summary(&mut core, other).state, JobState::Succeeded);
    let (_, launched) = start(&mut core, job(2, 1, 4), 70);
    assert_eq!(launched, [("b".into(), vec![(5, 0, 0)])], "none on a");
    check_invariants(&core);

    // The timeout ends it: a is offered again.
    core.tick(60 + TIMEOUT - 1);
    assert_eq!(unexcluded(&core.take_effects()), []);
    core.tick(60 + TIMEOUT);
    let effects = core.take_effects();
    assert_eq!(
        unexcluded(&effects),
        [("a".into(), ExclusionScope::Cluster, None, None)]
    );
    assert_eq!(launches(&effects), [("a".into(), vec![(6, 1, 0)])]);
    assert_eq!(shown(&core, "a"), []);
    check_invariants(&core);
}

#[test]
fn failures_in_a_job_that_failed_do_not_count_across_jobs() {
    let mut core = excluding();
    add(&mut core, "a", 1, 1);
    add(&mut core, "b", 1, 1);
    let (job_id, _) = start(&mut core, job(3, 1, 2), 10);
    report(&mut core, "a", vec![failed(1, 0, "boom")], 20);
    report(&mut core, "a", vec![failed(3, 0, "boom")], 30);
    assert_eq!(shown(&core, "a").len(), 3);
    report(&mut core, "b", vec![finished(2, 0)], 40);
    // Task 2's second failure, on b, uses up its attempts: the job fails, and that failure
    // is not held against b.
    let effects = report(&mut core, "b", vec![failed(3, 1, "boom")], 50);
    assert_eq!(excluded(&effects), []);
    assert_eq!(summary(&mut core, job_id).state, JobState::Failed);
    assert_eq!((shown(&core, "a"), shown(&core, "b")), (vec![], vec![]));
    let (_, launched) = start(&mut core, job(2, 1, 4), 60);
    assert_eq!(
        launched,
        [("a".into(), vec![(4, 0, 0)]), ("b".into(), vec![(5, 1, 0)])]
    );
    check_invariants(&core);
}

#[test]
fn a_task_exclusion_ends_after_its_timeout_while_the_job_runs() {
    let mut core = excluding();
    add(&mut core, "a", 1, 1);
    add(&mut core, "b", 1, 1);
    let (job_id, _) = start(&mut core, job(2, 1, 4), 10);
    report(&mut core, "a", vec![failed(1, 0, "boom")], 20);
    // b runs a long task 1; task 0 waits for b, or for a's exclusion to end.
    core.tick(20 + TIMEOUT);
    let effects = core.take_effects();
    assert_eq!(
        unexcluded(&effects),
        [("a".into(), ExclusionScope::Task, Some(job_id), Some(0))]
    );
    assert_eq!(launches(&effects), [("a".into(), vec![(1, 0, 1)])]);
    check_invariants(&core);
}

#[test]
fn a_job_whose_task_no_live_executor_may_run_fails_after_the_unschedulable_timeout() {
    let mut core = excluding();
    add(&mut core, "a", 1, 1);
    let (job_id, _) = start(&mut core, job(1, 1, 4), 10);
    report(&mut core, "a", vec![failed(1, 0, "disk full")], 20);
    core.tick(30);
    assert_eq!(job_ends(&core.take_effects()), []);
    core.tick(30 + UNSCHEDULABLE - 1);
    assert_eq!(job_ends(&core.take_effects()), []);
    core.tick(30 + UNSCHEDULABLE);
    let effects = core.take_effects();
    let reason = "task 0 cannot run anywhere: the one live executor is excluded after \
                  failures: a (this task) (exclusion on failure), for 1s; last error: disk full";
    assert_eq!(
        job_ends(&effects),
        [job_failed(30 + UNSCHEDULABLE, job_id, (0, 1, 0), reason)]
    );
    let task = outcome(&mut core, job_id, 0);
    assert_eq!((task.state, task.attempts), (TaskState::Failed, 1));
    assert_eq!(task.error.as_deref(), Some(reason));
    check_invariants(&core);
}

#[test]
fn a_new_executor_makes_a_blocked_job_schedulable_again() {
    let mut core = excluding();
    add(&mut core, "a", 1, 1);
    let (job_id, _) = start(&mut core, job(1, 1, 4), 10);
    report(&mut core, "a", vec![failed(1, 0, "boom")], 20);
    core.tick(30);
    let effects = add(&mut core, "b", 1, 500);
    assert_eq!(launches(&effects), [("b".into(), vec![(1, 0, 1)])]);
    core.tick(30 + UNSCHEDULABLE);
    assert_eq!(job_ends(&core.take_effects()), []);
    // b fails it too: both are excluded from it, and the wait starts again from there.
    report(&mut core, "b", vec![failed(1, 1, "boom")], 2_000);
    core.tick(2_000);
    core.tick(2_000 + UNSCHEDULABLE - 1);
    assert_eq!(job_ends(&core.take_effects()), []);
    core.tick(2_000 + UNSCHEDULABLE);
    let ends = job_ends(&core.take_effects());
    let (reason, ..) = one_failure(&ends);
    assert!(
        reason.contains(
            "all 2 live executors are excluded after failures: a (this task), b (this task)"
        ),
        "{reason}"
    );
    assert_eq!(summary(&mut core, job_id).state, JobState::Failed);
    check_invariants(&core);
}

#[test]
fn every_executor_excluded_from_a_job_blocks_its_fresh_tasks_too() {
    let mut core = excluding();
    add(&mut core, "a", 1, 1);
    let (job_id, _) = start(&mut core, job(3, 1, 4), 10);
    report(&mut core, "a", vec![failed(1, 0, "boom")], 20);
    // a takes task 1, which fails too: a is excluded from the job, and task 2 has never run.
    report(&mut core, "a", vec![failed(2, 0, "boom")], 30);
    let waiting = summary(&mut core, job_id).waiting.unwrap_or_default();
    assert!(
        waiting.starts_with("every live executor is excluded from this job after failures"),
        "{waiting:?}"
    );
    core.tick(40);
    core.tick(40 + UNSCHEDULABLE);
    let ends = job_ends(&core.take_effects());
    let (reason, failed, killed) = one_failure(&ends);
    assert!(reason.contains("a (this job)"), "{reason}");
    assert_eq!((failed, killed), (1, 2));
    assert_eq!(summary(&mut core, job_id).state, JobState::Failed);
    check_invariants(&core);
}

#[test]
fn kills_and_losses_do_not_count_and_exclusion_is_off_by_default() {
    let mut core = excluding();
    add(&mut core, "a", 1, 1);
    start(&mut core, job(1, 1, 4), 10);
    let effects = report(&mut core, "a", vec![killed(1, 0)], 20);
    assert_eq!(excluded(&effects), []);
    assert_eq!(launches(&effects), [("a".into(), vec![(1, 0, 1)])]);
    core.remove_executor(&eid("a"), "gone".into(), 30);
    assert_eq!(excluded(&core.take_effects()), []);

    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    start(&mut core, job(1, 1, 4), 10);
    let effects = report(&mut core, "a", vec![failed(1, 0, "boom")], 20);
    assert_eq!(excluded(&effects), []);
    assert_eq!(launches(&effects), [("a".into(), vec![(1, 0, 1)])]);
    assert_eq!(shown(&core, "a"), []);
}

#[test]
fn a_job_failed_for_want_of_an_executor_is_restored_as_it_ended() {
    let mut core = excluding();
    core.config.journal = true;
    let mut journal = Vec::new();
    add(&mut core, "a", 1, 1);
    let job_id = submit(&mut core, job(2, 1, 4), 10);
    take_journal(&mut core, &mut journal);
    status(&mut core, "a", vec![failed(1, 0, "disk full")], 20);
    // a runs task 1 meanwhile, and finishes it; task 0 may not run on a.
    status(&mut core, "a", vec![finished(2, 0)], 30);
    core.tick(40);
    core.tick(40 + UNSCHEDULABLE);
    let effects = take_journal(&mut core, &mut journal);
    let ends = job_ends(&effects);
    assert!(
        matches!(
            &ends[..],
            [Event::JobEnd {
                state: JobState::Failed,
                failed: 1,
                ..
            }]
        ),
        "{ends:?}"
    );
    assert!(matches!(
        &journal[journal.len() - 2..],
        [
            JournalRecord::TasksEnded { .. },
            JournalRecord::JobEnded { .. }
        ]
    ));
    let mut restored = restored(&journal, 2);
    assert_eq!(summary(&mut restored, job_id), summary(&mut core, job_id));
    let task = outcome(&mut core, job_id, 0);
    assert_eq!((task.state, task.attempts), (TaskState::Failed, 1));
    assert_eq!(
        outcome(&mut restored, job_id, 0),
        TaskOutcome {
            started_ms: None,
            duration_ms: None,
            ..task
        }
    );
    check_invariants(&restored);
}

#[test]
fn a_new_job_fails_when_every_executor_is_excluded_from_every_job() {
    let mut core = excluding();
    add(&mut core, "a", 1, 1);
    let (first, _) = start(&mut core, job(3, 1, 4), 10);
    report(&mut core, "a", vec![failed(1, 0, "boom")], 20);
    report(&mut core, "a", vec![failed(2, 0, "boom")], 30);
    // A second executor runs the first job to its end: a is excluded from every job.
    add(&mut core, "b", 1, 40);
    for now in [50, 60, 70] {
        let running = running_attempts(&core);
        let [(_, task_id, attempt)] = running[..] else {
            panic!("one attempt runs: {running:?}");
        };
        report(&mut core, "b", vec![finished(task_id, attempt)], now);
    }
    assert_eq!(summary(&mut core, first).state, JobState::Succeeded);
    assert_eq!(shown(&core, "a"), [(ExclusionScope::Cluster, None, None)]);
    core.remove_executor(&eid("b"), "gone".into(), 80);
    let (second, launched) = start(&mut core, job(2, 1, 4), 90);
    assert_eq!(launched, []);
    core.tick(100);
    core.tick(100 + UNSCHEDULABLE);
    let ends = job_ends(&core.take_effects());
    let (reason, failed, killed) = one_failure(&ends);
    assert!(
        reason.starts_with("task 0 cannot run anywhere: the one live executor is excluded after failures: a (every job)"),
        "{reason}"
    );
    assert_eq!((failed, killed), (0, 2), "task 0 never ran");
    assert_eq!(summary(&mut core, second).state, JobState::Failed);
    check_invariants(&core);
}
