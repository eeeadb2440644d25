//! Speculative execution: a copy of a task that runs too long starts only past the job's
//! quantile and multiplier, only on another executor; the first attempt to finish counts once,
//! the other is killed and its end counts for nothing; and a restarted driver agrees.

use super::*;
use crate::protocol::{Speculation, SpeculativeCounts};

/// A job of `tasks` tasks with speculation: a copy once 3/4 have finished, past twice the
/// median and at least 100 ms.
fn speculative(tasks: u32) -> SubmitJob {
    SubmitJob {
        speculation: Some(Speculation {
            quantile: 0.75,
            multiplier: 2.0,
            min_runtime_ms: 100,
        }),
        ..job(tasks, 1, 4)
    }
}

/// Runs the periodic check at `now`; returns its effects, checked.
fn speculate(core: &mut Core, now: u64) -> Vec<Effect> {
    core.speculate(now);
    let effects = core.take_effects();
    check_effects(core, &effects);
    check_invariants(core);
    effects
}

fn copies(core: &mut Core, job_id: JobId) -> SpeculativeCounts {
    summary(core, job_id)
        .speculative
        .expect("a job with speculation shows its copies")
}

/// Executors `a` and `b` of 2 cores; a job of 4 tasks started at 1000 (tasks 1 and 3 on `a`,
/// 2 and 4 on `b`); tasks 1, 2 finish at 1100 and 3 at 1150. Task 4 (index 3, on `b`) still
/// runs: the median is 100 ms, so it is copied once it has run over 200 ms.
fn one_slow_task(core: &mut Core) -> JobId {
    add(core, "a", 2, 0);
    add(core, "b", 2, 0);
    let (job_id, launched) = start(core, speculative(4), 1000);
    assert_eq!(
        launched,
        [
            ("a".into(), vec![(1, 0, 0), (3, 2, 0)]),
            ("b".into(), vec![(2, 1, 0), (4, 3, 0)])
        ]
    );
    report(core, "a", vec![finished(1, 0)], 1100);
    report(core, "b", vec![finished(2, 0)], 1100);
    // Two of four finished: under the quantile, however long the last ones run.
    assert_eq!(launches(&speculate(core, 900_000)), []);
    report(core, "a", vec![finished(3, 0)], 1150);
    job_id
}

/// The copy of task 4 (attempt 1 on `a`) launched at 1201.
fn copied(core: &mut Core) -> JobId {
    let job_id = one_slow_task(core);
    assert_eq!(
        launches(&speculate(core, 1200)),
        [],
        "200 ms is not over 200 ms"
    );
    let effects = speculate(core, 1201);
    assert_eq!(launches(&effects), [("a".into(), vec![(4, 3, 1)])]);
    let copy = events(&effects)
        .into_iter()
        .find(|e| matches!(e, Event::SpeculativeTaskStart { .. }))
        .expect("a SpeculativeTaskStart");
    assert_eq!(
        copy,
        Event::SpeculativeTaskStart {
            time_ms: 1201,
            job_id,
            executor_id: eid("a"),
            task_id: 4,
            index: 3,
            attempt: 1,
            copy_of: 0,
            running_ms: 201,
            threshold_ms: 200,
        }
    );
    assert!(event_kinds(&effects).contains(&"task.start"));
    assert_eq!(free(core, "a"), 1);
    assert_eq!(
        copies(core, job_id),
        SpeculativeCounts {
            launched: 1,
            won: 0
        }
    );
    job_id
}

#[test]
fn a_copy_starts_only_past_the_quantile_and_the_multiplier_and_only_once() {
    let mut core = new_core(0);
    let job_id = copied(&mut core);
    // The task has had its copy: no second one, however long both run.
    assert_eq!(launches(&speculate(&mut core, 100_000)), []);
    assert_eq!(copies(&mut core, job_id).launched, 1);
    assert_eq!(
        summary(&mut core, job_id).running,
        1,
        "one task runs, twice"
    );
}

#[test]
fn the_minimum_runtime_holds_a_copy_back_past_the_multiplier() {
    let mut core = new_core(0);
    add(&mut core, "a", 2, 0);
    add(&mut core, "b", 2, 0);
    let submission = SubmitJob {
        speculation: Some(Speculation {
            quantile: 0.5,
            multiplier: 1.0,
            min_runtime_ms: 5_000,
        }),
        ..job(2, 1, 4)
    };
    let (_, launched) = start(&mut core, submission, 0);
    assert_eq!(launched.len(), 2);
    report(&mut core, "a", vec![finished(1, 0)], 10);
    assert_eq!(launches(&speculate(&mut core, 5_000)), []);
    assert_eq!(
        launches(&speculate(&mut core, 5_001)),
        [("a".into(), vec![(2, 1, 1)])]
    );
}

#[test]
fn a_copy_never_runs_where_its_task_runs() {
    let mut core = new_core(0);
    add(&mut core, "a", 4, 0);
    let (job_id, _) = start(&mut core, speculative(4), 1000);
    report(
        &mut core,
        "a",
        vec![finished(1, 0), finished(2, 0), finished(3, 0)],
        1100,
    );
    // Three cores free, all on the executor that runs the slow task.
    assert_eq!(free(&core, "a"), 3);
    assert_eq!(launches(&speculate(&mut core, 100_000)), []);
    // Another executor comes: the copy goes there.
    add(&mut core, "b", 1, 100_001);
    assert_eq!(
        launches(&speculate(&mut core, 100_002)),
        [("b".into(), vec![(4, 3, 1)])]
    );
    assert_eq!(copies(&mut core, job_id).launched, 1);
}

#[test]
fn waiting_tasks_take_free_cores_before_a_copy() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    add(&mut core, "b", 1, 0);
    let (job_id, _) = start(&mut core, speculative(4), 0);
    report(&mut core, "a", vec![finished(1, 0)], 10); // task 3 starts on a
    report(&mut core, "a", vec![finished(3, 0)], 20); // task 4 starts on a
    report(&mut core, "a", vec![finished(4, 0)], 30);
    // Task 2 on b is slow, and a core is free on a, but a later job waits: it goes first.
    let (_, launched) = start(&mut core, job(1, 1, 4), 40);
    assert_eq!(launched, [("a".into(), vec![(5, 0, 0)])]);
    assert_eq!(launches(&speculate(&mut core, 10_000)), []);
    report(&mut core, "a", vec![finished(5, 0)], 10_001);
    assert_eq!(
        launches(&speculate(&mut core, 10_002)),
        [("a".into(), vec![(2, 1, 1)])]
    );
    assert_eq!(copies(&mut core, job_id).launched, 1);
}

#[test]
fn the_copy_that_finishes_first_counts_once_and_the_first_is_killed() {
    let mut core = journaled_core(0);
    let job_id = copied(&mut core);
    let mut journal = Vec::new();
    let effects = take_journal(&mut core, &mut journal);
    assert!(effects.is_empty());
    let effects = report(&mut core, "a", vec![finished_with(4, 1, 7.into())], 1300);
    assert_eq!(
        kill_tasks(&effects),
        [(
            "b".into(),
            4,
            0,
            "another attempt of the task finished first".into()
        )]
    );
    assert_eq!(job_ends(&effects), [job_succeeded(1300, job_id, 4)]);
    let got = outcome(&mut core, job_id, 3);
    assert_eq!((got.state, got.attempts), (TaskState::Finished, 2));
    assert_eq!(got.executor_id, Some(eid("a")));
    assert_eq!((got.result, got.duration_ms), (Some(7.into()), Some(99)));
    assert_eq!(
        copies(&mut core, job_id),
        SpeculativeCounts {
            launched: 1,
            won: 1
        }
    );
    // The first attempt's cores stay taken until it says it stopped.
    assert_eq!(free(&core, "b"), 1);
    // It finished before the kill came: that counts for nothing but its cores.
    let effects = report(&mut core, "b", vec![finished_with(4, 0, 8.into())], 1400);
    assert_eq!(free(&core, "b"), 2);
    let ended = task_ends(&effects);
    assert_eq!(ended.len(), 1);
    assert_eq!((ended[0].attempt, ended[0].state), (0, TaskState::Killed));
    assert_eq!(
        ended[0].error.as_deref(),
        Some("another attempt of the task finished first")
    );
    assert!(job_ends(&effects).is_empty());
    assert!(
        !effects.iter().any(|e| matches!(e, Effect::Journal(_))),
        "the loser is not journaled"
    );
    let got = outcome(&mut core, job_id, 3);
    assert_eq!((got.result, got.attempts), (Some(7.into()), 2));
    assert_eq!(summary(&mut core, job_id).succeeded, 4);
    // A repeat of either is a repeat.
    unchanged(&mut core, |core| {
        assert_eq!(status(core, "b", vec![finished(4, 0)], 1500), (1, vec![]));
        assert_eq!(status(core, "a", vec![finished(4, 1)], 1500), (1, vec![]));
    });
}

#[test]
fn the_first_attempt_that_finishes_first_kills_the_copy_and_its_failure_is_not_counted() {
    let mut core = new_core(0);
    let job_id = copied(&mut core);
    let effects = report(&mut core, "b", vec![finished(4, 0)], 1300);
    assert_eq!(
        kill_tasks(&effects),
        [(
            "a".into(),
            4,
            1,
            "another attempt of the task finished first".into()
        )]
    );
    assert_eq!(job_ends(&effects), [job_succeeded(1300, job_id, 4)]);
    assert_eq!(
        copies(&mut core, job_id),
        SpeculativeCounts {
            launched: 1,
            won: 0
        }
    );
    let effects = report(&mut core, "a", vec![failed(4, 1, "killed")], 1350);
    assert_eq!(free(&core, "a"), 2);
    assert_eq!(task_ends(&effects)[0].state, TaskState::Killed);
    let job = summary(&mut core, job_id);
    assert_eq!(
        (job.state, job.succeeded, job.failed),
        (JobState::Succeeded, 4, 0)
    );
    let got = outcome(&mut core, job_id, 3);
    assert_eq!((got.attempts, got.executor_id), (1, Some(eid("b"))));
}

#[test]
fn a_failure_of_the_first_attempt_while_its_copy_runs_is_not_charged() {
    let mut core = journaled_core(0);
    let job_id = copied(&mut core);
    let effects = report(&mut core, "b", vec![failed(4, 0, "disk full")], 1300);
    assert_eq!(
        the_task_end(&effects),
        (0, TaskState::Failed, Some("disk full".into()))
    );
    assert_eq!(launches(&effects), [], "the task does not run again");
    assert_eq!(free(&core, "b"), 2);
    assert_eq!(core.jobs[&job_id].tasks[3].failures, 0);
    assert_eq!(summary(&mut core, job_id).running, 1);
    let effects = report(&mut core, "a", vec![finished(4, 1)], 1400);
    assert_eq!(job_ends(&effects), [job_succeeded(1400, job_id, 4)]);
    assert_eq!(kill_tasks(&effects), [], "nothing else runs");
    let got = outcome(&mut core, job_id, 3);
    assert_eq!((got.attempts, got.executor_id), (2, Some(eid("a"))));
    assert_eq!(copies(&mut core, job_id).won, 1);
}

#[test]
fn a_failed_copy_leaves_the_first_attempt_and_a_retry_takes_a_new_number() {
    let mut core = new_core(0);
    let job_id = copied(&mut core);
    let effects = report(&mut core, "a", vec![failed(4, 1, "oops")], 1300);
    assert_eq!(
        the_task_end(&effects),
        (1, TaskState::Failed, Some("oops".into()))
    );
    assert_eq!(free(&core, "a"), 2);
    assert_eq!(core.jobs[&job_id].tasks[3].failures, 0);
    // The first attempt fails too: the task runs again, as attempt 2.
    let effects = report(&mut core, "b", vec![failed(4, 0, "oops")], 1400);
    assert_eq!(core.jobs[&job_id].tasks[3].failures, 1);
    assert_eq!(launches(&effects), [("a".into(), vec![(4, 3, 2)])]);
    // A repeat of the copy's end is a repeat, not the retry's.
    unchanged(&mut core, |core| {
        assert_eq!(
            status(core, "a", vec![failed(4, 1, "oops")], 1450),
            (1, vec![])
        );
    });
    // No second copy.
    assert_eq!(launches(&speculate(&mut core, 100_000)), []);
    let effects = report(&mut core, "a", vec![finished(4, 2)], 100_001);
    assert_eq!(job_ends(&effects), [job_succeeded(100_001, job_id, 4)]);
}

#[test]
fn losing_the_executor_of_one_attempt_does_not_run_the_task_again() {
    let mut core = new_core(0);
    let job_id = copied(&mut core);
    core.remove_executor(&eid("b"), "gone".into(), 1300);
    let effects = core.take_effects();
    check_effects(&core, &effects);
    check_invariants(&core);
    assert_eq!(the_task_end(&effects).1, TaskState::Lost);
    assert_eq!(launches(&effects), []);
    assert!(!core.jobs[&job_id].tasks.has_waiting());
    let effects = report(&mut core, "a", vec![finished(4, 1)], 1400);
    assert_eq!(job_ends(&effects), [job_succeeded(1400, job_id, 4)]);

    // The copy's executor lost: the first attempt carries on.
    let mut core = new_core(0);
    let job_id = copied(&mut core);
    core.remove_executor(&eid("a"), "gone".into(), 1300);
    let effects = core.take_effects();
    check_invariants(&core);
    assert_eq!(task_ends(&effects)[0].attempt, 1);
    assert_eq!(launches(&effects), []);
    let effects = report(&mut core, "b", vec![finished(4, 0)], 1400);
    assert_eq!(job_ends(&effects), [job_succeeded(1400, job_id, 4)]);
}

#[test]
fn a_heartbeat_soon_after_the_copy_does_not_lose_it() {
    let mut core = new_core(0);
    let job_id = copied(&mut core);
    // `a`'s heartbeat does not list the copy yet: its launch is on the way.
    let running = vec![];
    let request = crate::protocol::HeartbeatRequest::Heartbeat {
        executor_id: eid("a"),
        instance_id: instance_of("a"),
        running,
        driver_instance: Some(InstanceId::from_u128(DRIVER)),
        objects: Default::default(),
        connection: None,
        abandoned: Vec::new(),
    };
    // Past the grace since the first attempt started, not since the copy did.
    core.heartbeat("a", request, 6100);
    let effects = core.take_effects();
    assert_eq!(task_ends(&effects), []);
    assert_eq!(outcome(&mut core, job_id, 3).state, TaskState::Running);
    check_invariants(&core);
}

#[test]
fn killing_the_job_or_the_task_stops_both_attempts() {
    let mut core = new_core(0);
    let job_id = copied(&mut core);
    let reply = core.api(ApiRequest::KillJob { job_id }, 1300);
    assert_eq!(reply, ApiReply::JobKilled { job_id });
    let effects = core.take_effects();
    let mut kills: Vec<_> = kill_tasks(&effects)
        .into_iter()
        .map(|k| (k.0, k.2))
        .collect();
    kills.sort();
    assert_eq!(kills, [("a".into(), 1), ("b".into(), 0)]);
    // The copy says it finished before it heard: it still counts for nothing.
    let effects = report(&mut core, "a", vec![finished(4, 1)], 1400);
    assert_eq!(task_ends(&effects)[0].state, TaskState::Killed);
    report(&mut core, "b", vec![killed(4, 0)], 1400);
    assert_eq!((free(&core, "a"), free(&core, "b")), (2, 2));
    assert_eq!(summary(&mut core, job_id).succeeded, 3);

    let mut core = new_core(0);
    let job_id = copied(&mut core);
    let request = ApiRequest::KillJobTask {
        job_id,
        index: 3,
        retry: false,
    };
    assert!(matches!(
        core.api(request, 1300),
        ApiReply::TaskKilled { .. }
    ));
    let effects = core.take_effects();
    assert_eq!(kill_tasks(&effects).len(), 2);
    report(&mut core, "a", vec![killed(4, 1)], 1400);
    let effects = report(&mut core, "b", vec![killed(4, 0)], 1400);
    assert_eq!(outcome(&mut core, job_id, 3).state, TaskState::Killed);
    assert_eq!(job_ends(&effects).len(), 1);
}

#[test]
fn a_restarted_driver_counts_the_winner_once() {
    let mut core = journaled_core(0);
    let job_id = copied(&mut core);
    report(&mut core, "a", vec![finished_with(4, 1, 7.into())], 1300);
    report(&mut core, "b", vec![finished(4, 0)], 1400);
    let snapshot = snapshot_record(&core, 1, 1500);
    let back = restored(&[snapshot], 2);
    let got = back.jobs[&job_id].summary();
    assert_eq!((got.state, got.succeeded), (JobState::Succeeded, 4));
    let record = &back.jobs[&job_id].tasks[3];
    assert_eq!(
        (record.attempts, record.executor.clone()),
        (2, Some(eid("a")))
    );
    assert_eq!(back.jobs[&job_id].results.get(&3), Some(&7.into()));
    assert_eq!(
        back.jobs[&job_id].submission().speculation,
        core.jobs[&job_id].submission().speculation
    );
}

#[test]
fn the_journal_holds_the_winner_once_and_a_replay_agrees() {
    let mut core = journaled_core(0);
    add(&mut core, "a", 2, 0);
    add(&mut core, "b", 2, 0);
    let mut journal = Vec::new();
    take_journal(&mut core, &mut journal);
    let job_id = submit(&mut core, speculative(4), 1000);
    take_journal(&mut core, &mut journal);
    for (from, task_id, at) in [("a", 1, 1100), ("b", 2, 1100), ("a", 3, 1150)] {
        status(&mut core, from, vec![finished(task_id, 0)], at);
        take_journal(&mut core, &mut journal);
    }
    core.speculate(1201);
    let effects = take_journal(&mut core, &mut journal);
    assert_eq!(launches(&effects), [("a".into(), vec![(4, 3, 1)])]);
    // Only a TasksEnded record names a task; the copy's launch is not journaled.
    assert_eq!(journal.len(), 4, "{journal:?}");
    status(&mut core, "a", vec![finished(4, 1)], 1300);
    status(&mut core, "b", vec![finished(4, 0)], 1400);
    take_journal(&mut core, &mut journal);
    let ends: Vec<(TaskId, u32)> = journal
        .iter()
        .filter_map(|r| match r {
            JournalRecord::TasksEnded { tasks, .. } => Some(tasks.clone()),
            _ => None,
        })
        .flatten()
        .map(|t| (t.task_id, t.attempt))
        .collect();
    assert_eq!(ends, [(1, 0), (2, 0), (3, 0), (4, 1)]);
    let back = restored(&journal, 2);
    let got = back.jobs[&job_id].summary();
    assert_eq!((got.state, got.succeeded), (JobState::Succeeded, 4));
}

#[test]
fn a_restarted_driver_resumes_speculation_for_a_running_job() {
    let mut core = journaled_core(0);
    add(&mut core, "a", 2, 0);
    let mut journal = Vec::new();
    let job_id = submit(&mut core, speculative(4), 1000);
    take_journal(&mut core, &mut journal);
    let mut back = restored(&journal, 1);
    assert!(back.speculating(), "the job asked for it");
    assert!(summary(&mut back, job_id).speculative.is_some());
}

#[test]
fn speculation_is_off_unless_asked_and_its_settings_are_checked() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 0);
    add(&mut core, "b", 1, 0);
    let (job_id, _) = start(&mut core, job(2, 1, 4), 0);
    assert!(!core.speculating());
    report(&mut core, "a", vec![finished(1, 0)], 10);
    assert_eq!(launches(&speculate(&mut core, 1_000_000)), []);
    assert_eq!(summary(&mut core, job_id).speculative, None);
    for (quantile, multiplier, min_runtime_ms, error) in [
        (0.0, 1.5, 100, "quantile"),
        (1.5, 1.5, 100, "quantile"),
        (f64::NAN, 1.5, 100, "quantile"),
        (0.75, 0.5, 100, "multiplier"),
        (0.75, f64::INFINITY, 100, "multiplier"),
        (0.75, 1.5, u64::MAX, "min_runtime_ms"),
    ] {
        let submission = SubmitJob {
            speculation: Some(Speculation {
                quantile,
                multiplier,
                min_runtime_ms,
            }),
            ..job(1, 1, 4)
        };
        let message = api_error(core.api(ApiRequest::SubmitJob(submission), 0));
        assert!(message.contains(error), "{message}");
    }
}
