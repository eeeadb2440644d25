//! Killing one task (`KillJobTask`): a waiting task ends KILLED at once, a running one when its
//! executor says it stopped; neither runs again unless asked to, and a restarted driver agrees.

use super::*;

fn kill_task(core: &mut Core, job_id: JobId, index: u32, retry: bool, now: u64) -> ApiReply {
    let request = ApiRequest::KillJobTask {
        job_id,
        index,
        retry,
    };
    core.api(request, now)
}

fn task_killed(job_id: JobId, index: u32, attempt: Option<u32>, retry: bool) -> ApiReply {
    ApiReply::TaskKilled {
        job_id,
        index,
        attempt,
        retry,
    }
}

fn job_killed(time_ms: u64, job_id: JobId, succeeded: u32, killed: u32, reason: &str) -> Event {
    Event::JobEnd {
        time_ms,
        job_id,
        state: JobState::Killed,
        succeeded,
        failed: 0,
        killed,
        reason: Some(reason.into()),
    }
}

#[test]
fn a_waiting_task_ends_killed_at_once_and_never_runs() {
    let mut core = journaled_core(0);
    add(&mut core, "a", 1, 1);
    let (job_id, _) = start(&mut core, job(3, 1, 4), 2); // task 0 runs; 1 and 2 wait
    let reply = kill_task(&mut core, job_id, 2, false, 3);
    assert_eq!(reply, task_killed(job_id, 2, None, false));
    let mut journal = Vec::new();
    let effects = take_journal(&mut core, &mut journal);
    assert_eq!(
        journal,
        [JournalRecord::TaskKilledByRequest {
            job_id,
            index: 2,
            time_ms: 3
        }]
    );
    assert!(kill_tasks(&effects).is_empty(), "nothing ran to kill");
    check_invariants(&core);
    let got = outcome(&mut core, job_id, 2);
    assert_eq!((got.state, got.attempts), (TaskState::Killed, 0));
    assert_eq!(got.error.as_deref(), Some("killed by request"));
    // Task 0 finishes, task 1 runs and finishes; task 2 is passed over.
    let effects = report(&mut core, "a", vec![finished(1, 0)], 4);
    assert_eq!(launches(&effects), [("a".into(), vec![(2, 1, 0)])]);
    let effects = report(&mut core, "a", vec![finished(2, 0)], 5);
    assert_eq!(launches(&effects), []);
    assert_eq!(
        job_ends(&effects),
        [job_killed(
            5,
            job_id,
            2,
            1,
            "1 task killed by request; the other 2 finished"
        )]
    );
    check_invariants(&core);
}

#[test]
fn a_running_task_is_told_to_stop_ends_killed_and_is_not_retried() {
    let mut core = new_core(0);
    add(&mut core, "a", 2, 1);
    let (job_id, _) = start(&mut core, job(2, 1, 4), 2);
    let reply = kill_task(&mut core, job_id, 1, false, 3);
    assert_eq!(reply, task_killed(job_id, 1, Some(0), false));
    let effects = core.take_effects();
    check_effects(&core, &effects);
    assert_eq!(
        kill_tasks(&effects),
        [("a".into(), 2, 0, "killed by request".into())]
    );
    // It runs until the executor says it stopped: its core is not free before.
    assert_eq!(free(&core, "a"), 0);
    assert_eq!(outcome(&mut core, job_id, 1).state, TaskState::Running);
    // Asked again (the first KillTask may be lost): sent again, the same answer.
    assert_eq!(
        kill_task(&mut core, job_id, 1, false, 4),
        task_killed(job_id, 1, Some(0), false)
    );
    assert_eq!(kill_tasks(&core.take_effects()).len(), 1);
    // A retry now would undo what was answered: refused.
    let error = unchanged(&mut core, |core| {
        api_error(kill_task(core, job_id, 1, true, 4))
    });
    assert!(error.contains("without retry already"), "{error}");
    let effects = report(&mut core, "a", vec![killed(2, 0)], 5);
    assert_eq!(
        the_task_end(&effects),
        (0, TaskState::Killed, Some("killed by request".into()))
    );
    assert_eq!(launches(&effects), [], "not run again");
    assert_eq!(free(&core, "a"), 1);
    check_invariants(&core);
    let effects = report(&mut core, "a", vec![finished(1, 0)], 6);
    assert_eq!(
        job_ends(&effects),
        [job_killed(
            6,
            job_id,
            1,
            1,
            "1 task killed by request; the other 1 finished"
        )]
    );
    check_invariants(&core);
}

#[test]
fn an_attempt_that_finishes_before_the_kill_reaches_it_counts_as_finished() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    let (job_id, _) = start(&mut core, job(1, 1, 4), 2);
    kill_task(&mut core, job_id, 0, false, 3);
    core.take_effects();
    let effects = report(&mut core, "a", vec![finished(1, 0)], 4);
    assert_eq!(job_ends(&effects), [job_succeeded(4, job_id, 1)]);
}

#[test]
fn a_lost_attempt_of_a_task_being_killed_ends_it_killed() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    add(&mut core, "b", 1, 1);
    let (job_id, _) = start(&mut core, job(1, 1, 4), 2);
    kill_task(&mut core, job_id, 0, false, 3);
    core.take_effects();
    core.remove_executor(&eid("a"), "gone".into(), 4);
    let effects = core.take_effects();
    check_effects(&core, &effects);
    assert_eq!(launches(&effects), [], "not run again elsewhere");
    assert_eq!(summary(&mut core, job_id).state, JobState::Killed);
    check_invariants(&core);
}

#[test]
fn with_retry_the_running_attempt_stops_and_the_task_runs_again() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    let (job_id, _) = start(&mut core, job(1, 1, 1), 2);
    let reply = kill_task(&mut core, job_id, 0, true, 3);
    assert_eq!(reply, task_killed(job_id, 0, Some(0), true));
    assert_eq!(
        kill_tasks(&core.take_effects()),
        [("a".into(), 1, 0, "killed by request; it runs again".into())]
    );
    // The kill is not a failure: a job of max_failures 1 goes on.
    let effects = report(&mut core, "a", vec![killed(1, 0)], 4);
    assert_eq!(launches(&effects), [("a".into(), vec![(1, 0, 1)])]);
    let effects = report(&mut core, "a", vec![finished(1, 1)], 5);
    assert_eq!(job_ends(&effects), [job_succeeded(5, job_id, 1)]);
    check_invariants(&core);
}

#[test]
fn kills_that_cannot_be_done_are_refused_and_change_nothing() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    let (job_id, _) = start(&mut core, job(3, 1, 4), 2);
    report(&mut core, "a", vec![finished(1, 0)], 3); // task 0 finished, task 1 runs
    let cases = [
        (99, 0, false, "no job with id 99"),
        (job_id, 3, false, "job 1 has 3 tasks; there is no task 3"),
        (
            job_id,
            0,
            false,
            "task 0 of job 1 has already ended (FINISHED)",
        ),
        (job_id, 2, true, "waits to run: it has no attempt to kill"),
    ];
    for (job, index, retry, expected) in cases {
        let error = unchanged(&mut core, |core| {
            api_error(kill_task(core, job, index, retry, 4))
        });
        assert!(error.contains(expected), "{error}");
    }
    kill_task(&mut core, job_id, 2, false, 5);
    let error = unchanged(&mut core, |core| {
        api_error(kill_task(core, job_id, 2, false, 6))
    });
    assert!(error.contains("has already ended (KILLED)"), "{error}");
    core.api(ApiRequest::KillJob { job_id }, 7);
    core.take_effects();
    let error = unchanged(&mut core, |core| {
        api_error(kill_task(core, job_id, 1, false, 8))
    });
    assert!(
        error.contains("job 1 has already ended (KILLED)"),
        "{error}"
    );
}

#[test]
fn a_restarted_driver_does_not_run_a_killed_task_again() {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    add(&mut core, "a", 1, 1);
    let job_id = submit(&mut core, job(4, 1, 4), 2); // task 0 runs
    kill_task(&mut core, job_id, 0, false, 3); // running: its kill is on the way
    kill_task(&mut core, job_id, 3, false, 3); // waiting, past every launched task
    take_journal(&mut core, &mut journal);
    let snapshot = snapshot_record(&core, 1, 4);
    for journal in [journal, vec![snapshot]] {
        let mut restored = restored(&journal, 2);
        check_invariants(&restored);
        let job = summary(&mut restored, job_id);
        assert_eq!((job.state, job.killed), (JobState::Running, 2), "{job:?}");
        let effects = add(&mut restored, "b", 4, 10);
        let mut launched: Vec<u32> = launches(&effects)
            .iter()
            .flat_map(|(_, tasks)| tasks.iter().map(|t| t.1))
            .collect();
        launched.sort();
        assert_eq!(launched, [1, 2], "the killed tasks do not run again");
        let effects = report(&mut restored, "b", vec![finished(2, 0), finished(3, 0)], 11);
        assert_eq!(
            job_ends(&effects),
            [job_killed(
                11,
                job_id,
                2,
                2,
                "2 tasks killed by request; the other 2 finished"
            )]
        );
    }
}

#[test]
fn a_finish_journaled_after_the_kill_counts_on_replay_as_it_did_live() {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    add(&mut core, "a", 1, 1);
    let job_id = submit(&mut core, job(2, 1, 4), 2);
    kill_task(&mut core, job_id, 0, false, 3);
    take_journal(&mut core, &mut journal);
    // The finish came first; task 1 runs next.
    assert_eq!(status(&mut core, "a", vec![finished(1, 0)], 4), (1, vec![]));
    take_journal(&mut core, &mut journal);
    let live = summary(&mut core, job_id);
    assert_eq!((live.succeeded, live.killed), (1, 0));
    let mut restored = restored(&journal, 2);
    let job = summary(&mut restored, job_id);
    assert_eq!((job.succeeded, job.killed), (1, 0), "{job:?}");
    assert_eq!(outcome(&mut restored, job_id, 0).state, TaskState::Finished);
    check_invariants(&restored);
}
