//! A job's three timeouts: a task that cannot start in time fails its job, an attempt that runs
//! too long is stopped and fails (and runs again within the job's attempts), and a job past its
//! deadline ends FAILED with its running tasks stopped; and a failure the task said is final
//! does not run again.

use super::*;
use crate::protocol::JobTimeouts;

fn timed(tasks: u32, max_failures: u32, timeouts: JobTimeouts) -> SubmitJob {
    SubmitJob {
        timeouts,
        ..job(tasks, 1, max_failures)
    }
}

fn queue_timeout(ms: u64) -> JobTimeouts {
    JobTimeouts {
        queue_timeout_ms: Some(ms),
        ..Default::default()
    }
}

fn attempt_timeout(ms: u64) -> JobTimeouts {
    JobTimeouts {
        attempt_timeout_ms: Some(ms),
        ..Default::default()
    }
}

fn deadline(ms: u64) -> JobTimeouts {
    JobTimeouts {
        deadline_ms: Some(ms),
        ..Default::default()
    }
}

#[test]
fn a_task_that_cannot_start_within_the_queue_timeout_fails_its_job() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    // The one core is busy with another job's task.
    start(&mut core, job(1, 1, 1), 0);
    let (job_id, launched) = start(&mut core, timed(2, 1, queue_timeout(5000)), 100);
    assert_eq!(launched, []);
    assert_eq!(core.next_due_ms(), Some(5100));
    core.on_timers(5099);
    assert_eq!(job_ends(&core.take_effects()), []);

    core.on_timers(5100);
    let effects = core.take_effects();
    let ends = job_ends(&effects);
    let (reason, failed, killed) = one_failure(&ends);
    assert!(
        reason.starts_with("task 0 did not start within the queue timeout (5s)"),
        "{reason}"
    );
    assert_eq!((failed, killed), (1, 1));
    assert_eq!(summary(&mut core, job_id).state, JobState::Failed);
    assert_eq!(outcome(&mut core, job_id, 0).error.as_deref(), Some(reason));
    check_invariants(&core);
}

#[test]
fn the_wait_for_the_jobs_a_job_runs_after_does_not_count() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    let (first, _) = start(&mut core, job(1, 1, 1), 0);
    let after = SubmitJob {
        after: vec![first],
        ..timed(1, 1, queue_timeout(1000))
    };
    let (second, _) = start(&mut core, after, 0);
    core.on_timers(5000);
    assert_eq!(summary(&mut core, second).state, JobState::Waiting);
    // A third job takes the core when the first ends, before the second is settled: the
    // second's clock starts then.
    let effects = report(&mut core, "a", vec![finished(1, 0)], 5000);
    assert_eq!(launches(&effects), [("a".into(), vec![(2, 0, 0)])]);
    report(&mut core, "a", vec![finished(2, 0)], 5500);
    assert_eq!(summary(&mut core, second).state, JobState::Succeeded);
    core.on_timers(7000);
    assert_eq!(core.take_effects(), []);
}

#[test]
fn a_retry_counts_its_queue_time_from_the_end_of_its_wait() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    let retried = SubmitJob {
        retry_backoff: Some(crate::protocol::RetryBackoff {
            jitter: 0.0,
            ..crate::protocol::RetryBackoff::starting_at(1000)
        }),
        ..timed(1, 3, queue_timeout(1000))
    };
    let (job_id, launched) = start(&mut core, retried, 0);
    assert_eq!(launched, [("a".into(), vec![(1, 0, 0)])]);
    let (blocker, _) = start(&mut core, job(1, 1, 1), 0);
    // It fails at 500 and rests until 1500; the other job takes the core meanwhile.
    let effects = report(&mut core, "a", vec![failed(1, 0, "boom")], 500);
    assert_eq!(launches(&effects), [("a".into(), vec![(2, 0, 0)])]);
    for now in [1000, 1500, 2499] {
        core.on_timers(now);
        assert_eq!(job_ends(&core.take_effects()), [], "at {now}");
    }
    assert_eq!(summary(&mut core, job_id).state, JobState::Running);
    core.on_timers(2500);
    let ends = job_ends(&core.take_effects());
    let (reason, ..) = one_failure(&ends);
    assert!(reason.starts_with("task 0 did not start"), "{reason}");
    assert_eq!(summary(&mut core, blocker).state, JobState::Running);
    check_invariants(&core);
}

#[test]
fn a_job_whose_tasks_all_start_in_time_is_not_failed_by_its_queue_timeout() {
    let mut core = new_core(0);
    add(&mut core, "a", 2, 0);
    let (job_id, launched) = start(&mut core, timed(2, 1, queue_timeout(1000)), 0);
    assert_eq!(launched.len(), 1);
    core.on_timers(999);
    report(&mut core, "a", vec![finished(1, 0), finished(2, 0)], 2000);
    assert_eq!(summary(&mut core, job_id).state, JobState::Succeeded);
    core.on_timers(10_000);
    assert_eq!(core.take_effects(), []);
}

#[test]
fn an_attempt_past_the_attempt_timeout_is_stopped_and_fails_then_runs_again() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    let (job_id, launched) = start(&mut core, timed(1, 2, attempt_timeout(3000)), 0);
    assert_eq!(launched, [("a".into(), vec![(1, 0, 0)])]);
    assert_eq!(core.next_due_ms(), Some(3000));
    core.on_timers(3000);
    let effects = core.take_effects();
    assert_eq!(
        kill_tasks(&effects),
        [("a".into(), 1, 0, "attempt 0 timed out after 3s".into())]
    );
    // Its core is busy until the executor says the attempt stopped.
    assert_eq!(free(&core, "a"), 0);
    let effects = report(&mut core, "a", vec![killed(1, 0)], 3100);
    let (attempt, state, error) = the_task_end(&effects);
    assert_eq!((attempt, state), (0, TaskState::Failed));
    assert_eq!(
        error.as_deref(),
        Some("attempt 0 ran longer than the job's attempt timeout (3s) and was stopped")
    );
    assert_eq!(launches(&effects), [("a".into(), vec![(1, 0, 1)])]);

    // The second attempt's clock starts at its own launch; one that ends in time clears it.
    report(&mut core, "a", vec![finished(1, 1)], 4000);
    assert_eq!(summary(&mut core, job_id).state, JobState::Succeeded);
    assert_eq!(core.next_due_ms(), None);
    check_invariants(&core);
}

#[test]
fn the_last_attempt_that_times_out_fails_the_job_with_the_timeout() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    let (job_id, _) = start(&mut core, timed(1, 1, attempt_timeout(100)), 0);
    core.on_timers(100);
    core.take_effects();
    let effects = report(&mut core, "a", vec![killed(1, 0)], 150);
    let ends = job_ends(&effects);
    let (reason, failed, _) = one_failure(&ends);
    assert!(reason.contains("attempt timeout (100ms)"), "{reason}");
    assert_eq!(failed, 1);
    assert_eq!(summary(&mut core, job_id).state, JobState::Failed);
}

#[test]
fn a_task_with_its_own_timeout_is_not_timed_by_the_driver() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    let command = TaskSpec::Command {
        argv: vec!["sleep".into(), "9".into()],
        env: Default::default(),
        cwd: None,
        timeout_ms: Some(60_000),
        inputs: Default::default(),
        outputs: Vec::new(),
    };
    let submission = SubmitJob {
        tasks: vec![command],
        ..timed(1, 1, attempt_timeout(100))
    };
    start(&mut core, submission, 0);
    assert_eq!(core.next_due_ms(), None);
}

#[test]
fn a_job_past_its_deadline_fails_and_its_running_tasks_are_stopped() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    let (job_id, launched) = start(&mut core, timed(3, 1, deadline(10_000)), 500);
    assert_eq!(launched, [("a".into(), vec![(1, 0, 0)])]);
    core.on_timers(10_499);
    assert_eq!(core.take_effects(), []);
    core.on_timers(10_500);
    let effects = core.take_effects();
    let ends = job_ends(&effects);
    let (reason, _, killed) = one_failure(&ends);
    assert!(
        reason.starts_with("the job passed its deadline (10s"),
        "{reason}"
    );
    assert_eq!(killed, 3);
    assert_eq!(kill_tasks(&effects).len(), 1);
    assert_eq!(summary(&mut core, job_id).state, JobState::Failed);
}

#[test]
fn a_job_that_ends_in_time_takes_its_deadline_off_the_timers() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    start(&mut core, timed(1, 1, deadline(10_000)), 0);
    assert_eq!(core.next_due_ms(), Some(10_000));
    report(&mut core, "a", vec![finished(1, 0)], 10);
    assert_eq!(core.next_due_ms(), None);
}

#[test]
fn a_restarted_driver_keeps_the_deadline_from_the_submission() {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    add(&mut core, "a", 1, 0);
    submit(&mut core, timed(1, 1, deadline(10_000)), 100);
    take_journal(&mut core, &mut journal);
    let mut restored = restored(&journal, 2);
    assert_eq!(restored.next_due_ms(), Some(10_100));
    let from_snapshot = vec![snapshot_record(&restored, 1, 200)];
    let mut again = super::restored(&from_snapshot, 1);
    assert_eq!(again.next_due_ms(), Some(10_100));
    restored.tick(10_100);
    again.tick(10_100);
    for core in [&mut restored, &mut again] {
        assert_eq!(summary(core, 1).state, JobState::Failed);
    }
}

#[test]
fn timeouts_out_of_range_are_refused() {
    let mut core = new_core(0);
    for (timeouts, field) in [
        (queue_timeout(0), "queue_timeout_ms"),
        (attempt_timeout(0), "attempt_timeout_ms"),
        (deadline(31 * 24 * 3600 * 1000), "deadline_ms"),
    ] {
        let reply = unchanged(&mut core, |core| {
            core.api(ApiRequest::SubmitJob(timed(1, 1, timeouts)), 0)
        });
        let message = api_error(reply);
        assert!(message.starts_with(field), "{message}");
    }
}

#[test]
fn a_failure_said_final_does_not_run_again_whatever_attempts_are_left() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    let (job_id, _) = start(&mut core, job(1, 1, 4), 0);
    let last = StatusUpdate {
        no_retry: true,
        ..failed(
            1,
            0,
            "ValueError: bad input (not retried: no_retry_on names ValueError)",
        )
    };
    let effects = report(&mut core, "a", vec![last], 10);
    assert_eq!(launches(&effects), []);
    let ends = job_ends(&effects);
    let (reason, failed, _) = one_failure(&ends);
    assert!(reason.starts_with("task 0 failed once"), "{reason}");
    assert_eq!(failed, 1);
    assert_eq!(summary(&mut core, job_id).state, JobState::Failed);
    check_invariants(&core);
}

#[test]
fn a_summary_says_why_tasks_wait_and_until_when() {
    use crate::protocol::WaitReason;
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    let (blocker, _) = start(&mut core, job(1, 1, 1), 0);
    let retried = SubmitJob {
        retry_backoff: Some(crate::protocol::RetryBackoff {
            jitter: 0.0,
            ..crate::protocol::RetryBackoff::starting_at(1000)
        }),
        ..timed(2, 3, queue_timeout(5000))
    };
    let (job_id, _) = start(&mut core, retried, 100);
    let after = SubmitJob {
        after: vec![job_id],
        ..job(1, 1, 1)
    };
    let (waiting, _) = start(&mut core, after, 100);

    // Both tasks wait for the busy core, the first since 100.
    let summary = summary(&mut core, job_id);
    assert_eq!(
        summary.waits,
        [WaitReason::QueueTimeout {
            tasks: 2,
            until_ms: 5100
        }]
    );
    assert_eq!(
        summary.waiting.as_deref(),
        Some(
            "2 tasks wait for a free core; the job fails at 1970-01-01T00:00:05Z if the first \
             has not started (queue timeout)"
        )
    );
    let summary = super::summary(&mut core, waiting);
    assert_eq!(summary.waits, [WaitReason::After { jobs: vec![job_id] }]);
    assert_eq!(
        summary.waiting.as_deref(),
        Some("runs after job 2, which has not ended")
    );

    // The core frees: one task runs and fails at 1500, and rests until 2500; the other
    // takes the core.
    report(&mut core, "a", vec![finished(1, 0)], 500);
    report(&mut core, "a", vec![failed(2, 0, "boom")], 1500);
    let summary = super::summary(&mut core, job_id);
    assert_eq!(
        summary.waits,
        [WaitReason::RetryBackoff {
            tasks: 1,
            until_ms: 2500
        }]
    );
    assert_eq!(
        summary.waiting.as_deref(),
        Some("1 task waits out a retry backoff, the next until 1970-01-01T00:00:02Z")
    );
    // A job that runs with nothing holding it back says nothing.
    assert_eq!(super::summary(&mut core, blocker).waits, []);
}

#[test]
fn the_kill_of_an_attempt_past_its_timeout_is_sent_again_until_the_attempt_ends() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    start(&mut core, timed(1, 2, attempt_timeout(3000)), 0);
    core.on_timers(3000);
    let reason = "attempt 0 timed out after 3s".to_string();
    assert_eq!(
        kill_tasks(&core.take_effects()),
        [("a".into(), 1, 0, reason.clone())]
    );
    // That KillTask was lost: nothing comes back, and the kill goes again.
    let again = 3000 + crate::driver::core::timeouts::KILL_RESEND_MS;
    assert_eq!(core.next_due_ms(), Some(again));
    core.on_timers(again - 1);
    assert_eq!(kill_tasks(&core.take_effects()), []);
    core.on_timers(again);
    assert_eq!(
        kill_tasks(&core.take_effects()),
        [("a".into(), 1, 0, reason)]
    );
    // Once the attempt has ended, nothing more is sent for it (its retry, attempt 1, is
    // timed on its own).
    let effects = report(&mut core, "a", vec![killed(1, 0)], again + 100);
    assert_eq!(the_task_end(&effects).1, TaskState::Failed);
    core.on_timers(again + crate::driver::core::timeouts::KILL_RESEND_MS);
    let kills = kill_tasks(&core.take_effects());
    assert!(
        kills.iter().all(|(.., attempt, _)| *attempt == 1),
        "{kills:?}"
    );
    check_invariants(&core);
}
