//! Status updates: which are accepted, what a finished attempt records and frees, repeats,
//! and the result kept for each task.

use super::*;
use crate::protocol::StatusRequest;
use serde_json::json;

#[test]
fn finished_frees_cores_records_the_result_and_offers_that_executor() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    add(&mut core, "b", 1, 1);
    let (job_id, launched) = start(&mut core, job(3, 1, 4), 100);
    assert_eq!(
        launched,
        [("a".into(), vec![(1, 0, 0)]), ("b".into(), vec![(2, 1, 0)])]
    );

    let effects = report(
        &mut core,
        "a",
        vec![finished_with(1, 0, json!({"x": 1}))],
        150,
    );
    assert_eq!(
        effects[0],
        Effect::Publish(Event::TaskEnd {
            time_ms: 150,
            job_id,
            executors: vec![ExecutorTasks {
                executor_id: eid("a"),
                tasks: vec![TaskEnded {
                    task_id: 1,
                    index: 0,
                    attempt: 0,
                    state: TaskState::Finished,
                    duration_ms: 50,
                    error: None,
                }],
            }],
            term: 0,
        })
    );
    // The freed core is offered at once, to the executor that freed it.
    assert_eq!(launches(&effects), [("a".into(), vec![(3, 2, 0)])]);
    assert_eq!(event_kinds(&effects), ["task.end", "task.start"]);
    assert_eq!(effects.len(), 3);
    assert_eq!(free(&core, "a"), 0);
    let s = summary(&mut core, job_id);
    assert_eq!((s.succeeded, s.running), (1, 2));
    assert_eq!(
        outcome(&mut core, job_id, 0),
        TaskOutcome {
            index: 0,
            task_id: 1,
            state: TaskState::Finished,
            attempts: 1,
            executor_id: Some(eid("a")),
            result: Some(json!({"x": 1})),
            error: None,
            result_object: None,
            started_ms: Some(100),
            duration_ms: Some(50),
        }
    );

    // The last ones: cores come back, nothing more to launch, the job ends.
    let effects = report(&mut core, "b", vec![finished(2, 0)], 160);
    assert_eq!(event_kinds(&effects), ["task.end"]);
    assert_eq!(effects.len(), 1, "nothing to launch");
    assert_eq!(free(&core, "b"), 1);
    let effects = report(&mut core, "a", vec![finished_with(3, 0, Value::Null)], 170);
    assert_eq!(free(&core, "a"), 1);
    // The TaskEnd comes before the JobEnd.
    assert_eq!(event_kinds(&effects), ["task.end", "job.end"]);
    assert_eq!(job_ends(&effects), [job_succeeded(170, job_id, 3)]);
    let s = summary(&mut core, job_id);
    assert_eq!(
        (s.state, s.succeeded, s.running, s.ended_at_ms),
        (JobState::Succeeded, 3, 0, Some(170))
    );
    assert_eq!(outcome(&mut core, job_id, 2).result, None, "a null result");
    check_invariants(&core);
}

#[test]
fn a_repeated_status_is_accepted_and_changes_nothing() {
    let mut core = new_core(0);
    add(&mut core, "a", 2, 1);
    start(&mut core, job(3, 1, 4), 2);
    report(&mut core, "a", vec![finished_with(1, 0, json!(1))], 3);
    for now in [4, 5] {
        let reply = unchanged(&mut core, |core| {
            let repeat = vec![finished_with(1, 0, json!("other"))];
            core.status_updates("a", &eid("a"), repeat, now)
        });
        assert_eq!(reply, ack(1));
    }
    // The same terminal status twice in one batch ends the attempt once.
    let effects = report(&mut core, "a", vec![finished(2, 0), finished(2, 0)], 6);
    assert_eq!(task_ends(&effects).len(), 1);
    // A RUNNING report for a live attempt is accepted and changes nothing.
    let reply = unchanged(&mut core, |core| {
        let running = vec![update(3, 0, TaskState::Running)];
        core.status_updates("a", &eid("a"), running, 7)
    });
    assert_eq!(reply, ack(1));
    // Repeats after the job ended, too.
    report(&mut core, "a", vec![finished(3, 0)], 8);
    let reply = unchanged(&mut core, |core| {
        let repeats = vec![finished(1, 0), finished(2, 0), finished(3, 0)];
        core.status_updates("a", &eid("a"), repeats, 9)
    });
    assert_eq!(reply, ack(3));
    assert_eq!(summary(&mut core, 1).succeeded, 3);
    check_invariants(&core);
}

#[test]
fn a_status_from_the_wrong_executor_is_refused_and_changes_nothing() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    add(&mut core, "b", 1, 1);
    start(&mut core, job(2, 1, 4), 2);
    let refused = |task_id, attempt, reason: &str| RefusedStatus {
        task_id,
        attempt,
        reason: reason.into(),
    };
    for state in [
        TaskState::Finished,
        TaskState::Failed,
        TaskState::Killed,
        TaskState::Running,
    ] {
        let reply = unchanged(&mut core, |core| {
            status(core, "b", vec![update(1, 0, state)], 3)
        });
        let reason = "task 1 attempt 0 was not launched on executor b";
        assert_eq!(reply, (0, vec![refused(1, 0, reason)]), "{state:?}");
    }
    // An attempt that was never launched, and a task that does not exist.
    let reply = unchanged(&mut core, |core| {
        status(core, "a", vec![finished(1, 1), finished(999, 0)], 4)
    });
    assert_eq!(
        reply,
        (
            0,
            vec![
                refused(1, 1, "task 1 attempt 1 was not launched on executor a"),
                refused(999, 0, "task 999 is not known to this driver"),
            ]
        )
    );
    // A mixed batch: the good one counts, the bad one is listed.
    let (accepted, refusals) = status(&mut core, "b", vec![finished(2, 0), finished(1, 0)], 5);
    assert_eq!(accepted, 1);
    let reason = "task 1 attempt 0 was not launched on executor b";
    assert_eq!(refusals, [refused(1, 0, reason)]);
    assert_eq!(summary(&mut core, 1).succeeded, 1);
    assert_eq!(core.jobs[&1].tasks[0].status, TaskStatus::Running);
    check_invariants(&core);
}

#[test]
fn a_status_from_an_unregistered_executor_or_the_wrong_subject_is_refused() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    start(&mut core, job(1, 1, 4), 2);
    let last_seen = core.executors()[&eid("a")].last_seen_ms;
    let error = |message: &str| StatusReply::Error {
        message: message.into(),
    };

    let reply = unchanged(&mut core, |core| {
        core.status_updates("ghost", &eid("ghost"), vec![finished(1, 0)], 3)
    });
    assert_eq!(
        reply,
        StatusReply::UnknownExecutor {
            message: "executor ghost is not registered".into()
        },
        "an unknown executor is asked to register again"
    );
    let reply = unchanged(&mut core, |core| {
        core.status_updates("b", &eid("a"), vec![finished(1, 0)], 4)
    });
    assert_eq!(
        reply,
        error("executor id \"a\" in the message does not match \"b\" in the subject")
    );
    assert_eq!(core.executors()[&eid("a")].last_seen_ms, last_seen);
    check_invariants(&core);
}

#[test]
fn a_batch_for_another_driver_instance_is_refused_and_changes_nothing() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    start(&mut core, job(1, 1, 4), 2);
    let old_driver = InstanceId::from_u64_pair(1, 1);
    let stale = StatusRequest::StatusUpdates {
        executor_id: eid("a"),
        updates: vec![finished(1, 0)],
        driver_instance: Some(old_driver),
    };
    let reply = unchanged(&mut core, |core| core.status_request("a", stale, 3));
    assert!(
        matches!(&reply, StatusReply::Error { message } if message.contains("driver instance")),
        "{reply:?}"
    );
    // The same batch for this driver counts.
    let current = StatusRequest::StatusUpdates {
        executor_id: eid("a"),
        updates: vec![finished(1, 0)],
        driver_instance: Some(core.config.driver_instance),
    };
    assert_eq!(core.status_request("a", current, 4), ack(1));
    check_invariants(&core);
}

#[test]
fn a_status_for_attempt_u32_max_is_refused() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    start(&mut core, job(1, 1, 4), 10);
    let (accepted, refused) = unchanged(&mut core, |core| {
        status(core, "a", vec![finished(1, u32::MAX)], 20)
    });
    assert_eq!((accepted, refused.len()), (0, 1));
}

#[test]
fn results_and_errors_follow_the_last_attempt() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    let (job_id, _) = start(&mut core, job(1, 1, 4), 10);
    let failure = StatusUpdate {
        result: Some(json!({"stderr": "oops"})),
        ..failed(1, 0, "boom")
    };
    report(&mut core, "a", vec![failure], 20); // relaunched on a at once
    let o = outcome(&mut core, job_id, 0);
    assert_eq!((o.state, o.attempts), (TaskState::Running, 2));
    assert_eq!(o.result, Some(json!({"stderr": "oops"})));
    assert_eq!(o.error.as_deref(), Some("boom"));
    // A failure with no result clears the last one's; its error replaces the last one's.
    report(&mut core, "a", vec![failed(1, 1, "bang")], 30);
    let o = outcome(&mut core, job_id, 0);
    assert_eq!((o.state, o.attempts), (TaskState::Running, 3));
    assert_eq!((o.result, o.error.as_deref()), (None, Some("bang")));
    report(&mut core, "a", vec![finished_with(1, 2, json!("ok"))], 40);
    let o = outcome(&mut core, job_id, 0);
    assert_eq!(o.state, TaskState::Finished);
    assert_eq!(o.result, Some(json!("ok")));
    assert_eq!(o.error, None, "a finished task carries no error");
    check_invariants(&core);
}

#[test]
fn a_finished_task_does_not_show_a_failed_attempts_result() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    let (job_id, _) = start(&mut core, job(1, 1, 4), 10);
    let failure = StatusUpdate {
        result: Some(json!({"stderr": "oops"})),
        ..failed(1, 0, "boom")
    };
    report(&mut core, "a", vec![failure], 20);
    // The retry succeeds with no result (a handler that returns nothing, e.g. `noop`).
    report(&mut core, "a", vec![finished(1, 1)], 30);
    let o = outcome(&mut core, job_id, 0);
    assert_eq!(o.state, TaskState::Finished);
    assert_eq!(
        (o.result, o.error),
        (None, None),
        "failed attempt 0's output and error are not finished attempt 1's"
    );
}
