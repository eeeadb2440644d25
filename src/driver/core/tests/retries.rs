//! Failures and retries: a failed attempt runs again, on another executor if one has room right
//! now and on the same one otherwise, until the task has used up its attempts and fails its job.

use super::*;
use serde_json::json;

#[test]
fn a_repeated_failure_after_the_retry_launched_changes_nothing() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    add(&mut core, "b", 1, 1);
    start(&mut core, job(1, 1, 4), 2);
    // Repeated in the batch that reports it, while the task waits to run again: counted once,
    // and the retry goes to b, which has room, in the same call.
    let effects = report(
        &mut core,
        "a",
        vec![failed(1, 0, "boom"), failed(1, 0, "boom")],
        3,
    );
    assert_eq!(
        the_task_end(&effects),
        (0, TaskState::Failed, Some("boom".into()))
    );
    assert_eq!(launches(&effects), [("b".into(), vec![(1, 0, 1)])]);
    assert_eq!(core.jobs[&1].tasks[0].failures, 1);
    // Repeated after the retry runs elsewhere: accepted, and nothing changes.
    for now in [4, 5] {
        let reply = unchanged(&mut core, |core| {
            core.status_updates("a", &eid("a"), vec![failed(1, 0, "boom")], now)
        });
        assert_eq!(reply, ack(1));
    }
    // The old attempt never ran on b, so b cannot report it.
    let (accepted, refused) = unchanged(&mut core, |core| {
        status(core, "b", vec![failed(1, 0, "boom")], 6)
    });
    assert_eq!((accepted, refused.len()), (0, 1));
    check_invariants(&core);
}

#[test]
fn a_task_that_fails_twice_then_finishes_ends_finished_after_three_attempts() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    add(&mut core, "b", 1, 1);
    let (job_id, launched) = start(&mut core, job(1, 1, 4), 10);
    assert_eq!(launched, [("a".into(), vec![(1, 0, 0)])]);

    // Failure 1 on a: b has a free core, so the retry goes there in the same call, and a's
    // freed core stays free.
    let effects = report(&mut core, "a", vec![failed(1, 0, "boom 0")], 20);
    assert_eq!(
        the_task_end(&effects),
        (0, TaskState::Failed, Some("boom 0".into()))
    );
    assert_eq!(event_kinds(&effects), ["task.end", "task.start"]);
    assert_eq!(launches(&effects), [("b".into(), vec![(1, 0, 1)])]);
    assert_eq!((free(&core, "a"), free(&core, "b")), (1, 0));
    assert_eq!(summary(&mut core, job_id).state, JobState::Running);
    check_invariants(&core);

    // Failure 2 on b: now a has the free core, so the retry goes back to a.
    let effects = report(&mut core, "b", vec![failed(1, 1, "boom 1")], 30);
    assert_eq!(
        the_task_end(&effects),
        (1, TaskState::Failed, Some("boom 1".into()))
    );
    assert_eq!(launches(&effects), [("a".into(), vec![(1, 0, 2)])]);
    assert_eq!((free(&core, "a"), free(&core, "b")), (0, 1));
    assert_eq!(
        outcome(&mut core, job_id, 0).error.as_deref(),
        Some("boom 1")
    );

    let effects = report(&mut core, "a", vec![finished_with(1, 2, json!("ok"))], 40);
    assert_eq!(the_task_end(&effects), (2, TaskState::Finished, None));
    assert_eq!(job_ends(&effects), [job_succeeded(40, job_id, 1)]);
    let got = outcome(&mut core, job_id, 0);
    // The third attempt's time, from its launch to its end at 40.
    let started = got.started_ms.expect("launched");
    assert_eq!(got.duration_ms, Some(40 - started));
    assert_eq!(
        got,
        TaskOutcome {
            index: 0,
            task_id: 1,
            state: TaskState::Finished,
            attempts: 3,
            executor_id: Some(eid("a")),
            result: Some(json!("ok")),
            error: None,
            result_object: None,
            started_ms: Some(started),
            duration_ms: Some(40 - started),
        }
    );
    assert_eq!(core.jobs[&job_id].tasks[0].failures, 2);
    assert_eq!((free(&core, "a"), free(&core, "b")), (1, 1));
    check_invariants(&core);
}

#[test]
fn a_retry_prefers_another_executor_as_soon_as_it_frees_up() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    add(&mut core, "b", 1, 1);
    start(&mut core, job(2, 1, 4), 10); // task 1 on a, task 2 on b
                                        // b is busy: the retry does not wait for it but goes straight back to a.
    let effects = report(&mut core, "a", vec![failed(1, 0, "boom")], 20);
    assert_eq!(launches(&effects), [("a".into(), vec![(1, 0, 1)])]);
    // b frees up; nothing waits, so it stays idle.
    let effects = report(&mut core, "b", vec![finished(2, 0)], 30);
    assert_eq!(event_kinds(&effects), ["task.end"]);
    assert_eq!(free(&core, "b"), 1);
    // Now b has room, so the next retry goes there in the same call, and a stays free.
    let effects = report(&mut core, "a", vec![failed(1, 1, "boom")], 40);
    assert_eq!(launches(&effects), [("b".into(), vec![(1, 0, 2)])]);
    assert_eq!((free(&core, "a"), free(&core, "b")), (1, 0));
    check_invariants(&core);
}

#[test]
fn a_retry_runs_again_when_no_other_executor_can_take_it() {
    let mut core = new_core(0);
    add(&mut core, "a", 2, 1);
    add(&mut core, "b", 1, 1);
    let (job_id, launched) = start(&mut core, job(1, 2, 4), 10);
    assert_eq!(launched, [("a".into(), vec![(1, 0, 0)])]);
    // b can never run a task of 2 cpus, so the retry goes straight back to a, in the call
    // that reports the failure.
    let effects = report(&mut core, "a", vec![failed(1, 0, "boom")], 20);
    assert_eq!(launches(&effects), [("a".into(), vec![(1, 0, 1)])]);
    assert_eq!((free(&core, "a"), free(&core, "b")), (0, 1));
    assert_eq!(summary(&mut core, job_id).running, 1);
    unchanged(&mut core, |core| core.tick(21)); // nothing waits
    check_invariants(&core);
}

#[test]
fn with_one_executor_a_retry_goes_back_to_it_at_once() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    start(&mut core, job(1, 1, 4), 10);
    let no_error = update(1, 0, TaskState::Failed);
    let effects = report(&mut core, "a", vec![no_error], 20);
    assert_eq!(launches(&effects), [("a".into(), vec![(1, 0, 1)])]);
    assert_eq!(
        the_task_end(&effects),
        (0, TaskState::Failed, Some("task failed".into()))
    );
    // KILLED and LOST of a running job's task are not its fault: retried, no failure counted.
    let effects = report(&mut core, "a", vec![killed(1, 1)], 30);
    assert_eq!(launches(&effects), [("a".into(), vec![(1, 0, 2)])]);
    let effects = report(&mut core, "a", vec![update(1, 2, TaskState::Lost)], 40);
    assert_eq!(launches(&effects), [("a".into(), vec![(1, 0, 3)])]);
    assert_eq!(core.jobs[&1].tasks[0].failures, 1);
    assert_eq!(summary(&mut core, 1).state, JobState::Running);
    check_invariants(&core);
}

#[test]
fn a_lost_or_killed_attempt_is_offered_every_executors_cores() {
    for state in [TaskState::Lost, TaskState::Killed] {
        let mut core = new_core(0);
        add(&mut core, "a", 1, 1);
        add(&mut core, "b", 1, 1);
        start(&mut core, job(2, 1, 4), 10); // task 1 on a, task 2 on b
        report(&mut core, "a", vec![finished(1, 0)], 20); // a idles
                                                          // The round after b's report offers a's core too (a comes first), not only b's.
        let effects = report(&mut core, "b", vec![update(2, 0, state)], 30);
        assert_eq!(
            launches(&effects),
            [("a".into(), vec![(2, 1, 1)])],
            "{state:?}"
        );
        assert_eq!((free(&core, "a"), free(&core, "b")), (0, 1), "{state:?}");
        assert_eq!(core.jobs[&1].tasks[1].failures, 0, "{state:?}");
        check_invariants(&core);
    }
}

#[test]
fn a_batch_that_fails_a_job_ends_its_other_updates_first() {
    let mut core = new_core(0);
    add(&mut core, "a", 4, 1);
    let (job_id, _) = start(&mut core, job(4, 1, 1), 10); // tasks 1..=4 run on a
                                                          // One batch: task 1 fails for good, task 2 finishes, task 3 fails for good too.
    let effects = report(
        &mut core,
        "a",
        vec![
            failed(1, 0, "first"),
            finished(2, 0),
            failed(3, 0, "second"),
        ],
        20,
    );
    assert_eq!(event_kinds(&effects), ["task.end", "job.end"]);
    assert_eq!(task_ends(&effects).len(), 3);
    // Only task 4 still runs, so only it is killed.
    let reason = "task 0 failed once; last error: first";
    assert_eq!(
        kill_tasks(&effects),
        [("a".into(), 4, 0, format!("job {job_id} ended: {reason}"))]
    );
    assert_eq!(
        job_ends(&effects),
        [job_failed(20, job_id, (1, 2, 1), reason)]
    );
    assert!(launches(&effects).is_empty());
    assert_eq!(free(&core, "a"), 3);
    check_invariants(&core);
}

/// Two executors with two cores; a job of three tasks whose task 1 (index 0) always fails.
/// Returns the effects of the last failure, which fails the job.
fn fail_a_job(core: &mut Core) -> Vec<Effect> {
    add(core, "a", 2, 1);
    add(core, "b", 2, 1);
    let (job_id, launched) = start(core, job(3, 1, crate::DEFAULT_MAX_FAILURES), 10);
    assert_eq!(job_id, 1);
    assert_eq!(
        launched,
        [
            ("a".into(), vec![(1, 0, 0), (3, 2, 0)]),
            ("b".into(), vec![(2, 1, 0)])
        ]
    );
    // Each failure frees a core while the other executor has one free, so each retry goes to
    // the other executor in the call that reports the failure: a, b, a, b.
    let on = |attempt: u32| if attempt % 2 == 0 { "a" } else { "b" };
    for attempt in 0..crate::DEFAULT_MAX_FAILURES {
        let now = 20 + 10 * u64::from(attempt);
        let error = format!("boom {attempt}");
        let effects = report(core, on(attempt), vec![failed(1, attempt, &error)], now);
        check_invariants(core);
        if attempt + 1 == crate::DEFAULT_MAX_FAILURES {
            return effects;
        }
        assert!(job_ends(&effects).is_empty());
        assert_eq!(
            launches(&effects),
            [(on(attempt + 1).into(), vec![(1, 0, attempt + 1)])]
        );
    }
    unreachable!("max_failures is at least 1")
}

#[test]
fn a_task_that_always_fails_fails_its_job_and_kills_the_rest() {
    let mut core = new_core(0);
    let effects = fail_a_job(&mut core);
    let reason = "task 0 failed 4 times; last error: boom 3";
    let kill_reason = format!("job 1 ended: {reason}");
    assert_eq!(
        kill_tasks(&effects),
        [
            ("b".into(), 2, 0, kill_reason.clone()),
            ("a".into(), 3, 0, kill_reason)
        ]
    );
    assert_eq!(job_ends(&effects), [job_failed(50, 1, (0, 1, 2), reason)]);
    assert_eq!(
        the_task_end(&effects),
        (3, TaskState::Failed, Some("boom 3".into()))
    );
    assert!(launches(&effects).is_empty());
    let s = summary(&mut core, 1);
    assert_eq!(
        (s.state, s.failed, s.killed, s.running, s.reason.as_deref()),
        (JobState::Failed, 1, 0, 2, Some(reason))
    );
    let o = outcome(&mut core, 1, 0);
    assert_eq!((o.state, o.attempts), (TaskState::Failed, 4));
    assert_eq!(o.error.as_deref(), Some("boom 3"));
    // a runs task 3, b runs task 2.
    assert_eq!((free(&core, "a"), free(&core, "b")), (1, 1));

    // The executors answer the kills: cores come back, nothing is retried, no second JobEnd.
    let effects = report(&mut core, "b", vec![killed(2, 0)], 60);
    assert_eq!(the_task_end(&effects).1, TaskState::Killed);
    assert_eq!(event_kinds(&effects), ["task.end"]);
    assert_eq!(effects.len(), 1);
    assert_eq!(free(&core, "b"), 2);
    // A kill that races a failure is still a kill: no retry, no failure counted.
    let effects = report(&mut core, "a", vec![failed(3, 0, "interrupted")], 70);
    assert_eq!(event_kinds(&effects), ["task.end"]);
    assert_eq!(effects.len(), 1);
    assert_eq!(free(&core, "a"), 2);
    let s = summary(&mut core, 1);
    assert_eq!(
        (s.state, s.failed, s.killed, s.running),
        (JobState::Failed, 1, 2, 0)
    );
    check_invariants(&core);

    // The cores serve the next job.
    let (_, launched) = start(&mut core, job(4, 1, 4), 80);
    let count: usize = launched.iter().map(|(_, t)| t.len()).sum();
    assert_eq!(count, 4);
}

#[test]
fn the_failing_task_end_is_published_before_the_job_end() {
    let mut core = new_core(0);
    let effects = fail_a_job(&mut core);
    assert_eq!(event_kinds(&effects), ["task.end", "job.end"]);
    // The kills of the job's other attempts go out between the two.
    assert!(matches!(
        effects.first(),
        Some(Effect::Publish(Event::TaskEnd { .. }))
    ));
    assert!(matches!(
        effects.last(),
        Some(Effect::Publish(Event::JobEnd { .. }))
    ));
    assert_eq!(kill_tasks(&effects).len(), 2);
    assert_eq!(effects.len(), 4);
}
