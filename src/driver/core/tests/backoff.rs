//! Retries with a backoff: a failed task rests, holding no cores, until its wait is over, each
//! wait longer than the one before up to the cap and never shorter than the jitter allows; the
//! waits are journaled, so a restarted driver keeps them.

use super::*;
use crate::protocol::RetryBackoff;

fn backing_off(tasks: u32, max_failures: u32, backoff: RetryBackoff) -> SubmitJob {
    SubmitJob {
        retry_backoff: Some(backoff),
        ..job(tasks, 1, max_failures)
    }
}

fn no_jitter(initial_ms: u64) -> RetryBackoff {
    RetryBackoff {
        jitter: 0.0,
        ..RetryBackoff::starting_at(initial_ms)
    }
}

#[test]
fn a_failed_task_rests_holding_no_core_and_runs_again_once_its_wait_is_over() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    let (job_id, launched) = start(&mut core, backing_off(1, 4, no_jitter(1000)), 10);
    assert_eq!(launched, [("a".into(), vec![(1, 0, 0)])]);

    // The first failure: a waits a second with its core free; no offer round before then
    // launches the task again.
    let effects = report(&mut core, "a", vec![failed(1, 0, "boom")], 100);
    assert_eq!(launches(&effects), []);
    assert_eq!(free(&core, "a"), 1);
    assert_eq!(core.next_retry_ms(), Some(1100));
    check_invariants(&core);
    for now in [500, 1099] {
        core.tick(now);
        assert_eq!(launches(&core.take_effects()), [], "at {now}");
    }
    assert_eq!(summary(&mut core, job_id).state, JobState::Running);

    // Due: the next offer round runs it.
    core.tick(1100);
    assert_eq!(
        launches(&core.take_effects()),
        [("a".into(), vec![(1, 0, 1)])]
    );
    assert_eq!(core.next_retry_ms(), None);

    // The second failure waits twice as long.
    report(&mut core, "a", vec![failed(1, 1, "boom")], 1200);
    assert_eq!(core.next_retry_ms(), Some(3200));
    core.tick(3199);
    assert_eq!(launches(&core.take_effects()), []);
    core.tick(3200);
    assert_eq!(
        launches(&core.take_effects()),
        [("a".into(), vec![(1, 0, 2)])]
    );
    check_invariants(&core);
}

#[test]
fn waits_grow_by_the_multiplier_up_to_the_cap_and_jitter_only_shortens_them() {
    let backoff = RetryBackoff {
        initial_ms: 100,
        multiplier: 3.0,
        max_ms: Some(2000),
        jitter: 0.5,
    };
    let bases: Vec<u64> = (1..=5).map(|n| backoff.base_delay_ms(n)).collect();
    assert_eq!(bases, [100, 300, 900, 2000, 2000]);
    for failures in 1..=5 {
        let base = backoff.base_delay_ms(failures);
        for index in 0..200 {
            let unit = crate::driver::core::backoff::jitter_unit(7, index, failures);
            assert!((0.0..1.0).contains(&unit));
            let wait = backoff.delay_ms(failures, unit);
            assert!(
                wait <= base && wait as f64 >= base as f64 * 0.5 - 1.0,
                "{wait} of {base}"
            );
        }
    }
    // Spread: tasks that failed together do not all come back at once.
    let waits: BTreeSet<u64> = (0..50)
        .map(|index| backoff.delay_ms(1, crate::driver::core::backoff::jitter_unit(7, index, 1)))
        .collect();
    assert!(waits.len() > 20, "{waits:?}");
    // The default cap is a hundred times the first wait.
    assert_eq!(RetryBackoff::starting_at(10).base_delay_ms(40), 1000);
}

#[test]
fn a_job_killed_or_failed_while_a_task_rests_kills_the_resting_task() {
    let mut core = new_core(0);
    add(&mut core, "a", 2, 0);
    let (job_id, _) = start(&mut core, backing_off(2, 4, no_jitter(1000)), 10);
    report(&mut core, "a", vec![failed(1, 0, "boom")], 100);
    let reply = core.api(ApiRequest::KillJob { job_id }, 200);
    assert!(matches!(reply, ApiReply::JobKilled { .. }), "{reply:?}");
    core.take_effects();
    report(&mut core, "a", vec![killed(2, 0)], 300);
    let ended = summary(&mut core, job_id);
    assert_eq!((ended.state, ended.killed), (JobState::Killed, 2));
    // Its wait coming due launches nothing.
    core.tick(1100);
    assert_eq!(launches(&core.take_effects()), []);
    check_invariants(&core);
}

#[test]
fn the_last_failure_ends_the_job_without_a_wait() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    let (job_id, _) = start(&mut core, backing_off(1, 2, no_jitter(1000)), 10);
    report(&mut core, "a", vec![failed(1, 0, "boom")], 100);
    core.tick(1100);
    core.take_effects();
    let effects = report(&mut core, "a", vec![failed(1, 1, "boom again")], 1200);
    assert_eq!(job_ends(&effects).len(), 1);
    assert_eq!(summary(&mut core, job_id).state, JobState::Failed);
    assert_eq!(core.next_retry_ms(), None);
}

#[test]
fn a_restarted_driver_keeps_the_wait_and_counts_the_failures_on() {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    add(&mut core, "a", 1, 0);
    submit(&mut core, backing_off(1, 3, no_jitter(1000)), 10);
    take_journal(&mut core, &mut journal);
    status(&mut core, "a", vec![failed(1, 0, "boom")], 100);
    take_journal(&mut core, &mut journal);
    core.tick(1100);
    take_journal(&mut core, &mut journal);
    status(&mut core, "a", vec![failed(1, 1, "boom")], 1200);
    take_journal(&mut core, &mut journal);
    assert!(
        journal.contains(&JournalRecord::TaskRetryWaits {
            job_id: 1,
            index: 0,
            failures: 2,
            until_ms: 3200,
        }),
        "{journal:?}"
    );

    // Restored from the journal, replayed twice over, and from a snapshot of it.
    let from_snapshot = vec![snapshot_record(&restored(&journal, 1), 1, 1300)];
    for journal in [&journal, &from_snapshot] {
        let mut restored = restored(journal, 2);
        assert_eq!(restored.jobs[&1].tasks[0].failures, 2);
        add(&mut restored, "b", 1, 1300);
        assert_eq!(launches(&restored.take_effects()), [], "the wait goes on");
        restored.tick(3199);
        assert_eq!(launches(&restored.take_effects()), []);
        restored.tick(3200);
        let effects = restored.take_effects();
        assert_eq!(launches(&effects).len(), 1, "{effects:?}");
        // Its third failure is its last.
        let (executor, tasks) = &launches(&effects)[0];
        let (task_id, _, attempt) = tasks[0];
        let executor = executor.to_string();
        let effects = report(
            &mut restored,
            &executor,
            vec![failed(task_id, attempt, "boom")],
            3300,
        );
        assert_eq!(job_ends(&effects).len(), 1, "{effects:?}");
        check_invariants(&restored);
    }
}

#[test]
fn a_backoff_out_of_bounds_is_refused_with_its_reason() {
    let mut core = new_core(0);
    for (backoff, reason) in [
        (RetryBackoff::starting_at(0), "initial_ms must be between 1"),
        (
            RetryBackoff {
                multiplier: 0.5,
                ..RetryBackoff::starting_at(10)
            },
            "multiplier must be between 1 and 100",
        ),
        (
            RetryBackoff {
                multiplier: f64::NAN,
                ..RetryBackoff::starting_at(10)
            },
            "multiplier must be between 1 and 100",
        ),
        (
            RetryBackoff {
                max_ms: Some(5),
                ..RetryBackoff::starting_at(10)
            },
            "max_ms must be between initial_ms (10)",
        ),
        (
            RetryBackoff {
                jitter: 1.5,
                ..RetryBackoff::starting_at(10)
            },
            "jitter must be between 0 and 1",
        ),
    ] {
        let message = api_error(unchanged(&mut core, |core| {
            core.api(ApiRequest::SubmitJob(backing_off(1, 4, backoff)), 10)
        }));
        assert!(message.contains(reason), "{backoff:?}: {message}");
    }
}
