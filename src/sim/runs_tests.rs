//! The run invariants fed wrong inputs by hand: each must be reported.

use super::*;

/// Run `run` of `pid` starting task `task_id` as `attempt` of `term`, launched by leadership
/// `leadership` at `now` (journal on: one era).
fn start(
    leadership: u32,
    key: RunKey,
    task_id: TaskId,
    attempt: u32,
    term: u64,
    now: u64,
) -> Start {
    Start {
        leadership,
        era: 0,
        key,
        task_id,
        job: (1, 1),
        attempt,
        term,
        now,
        instant: false,
    }
}

/// A FINISHED outcome of `task_id` as attempt `attempts - 1` on `e{pid}`, its result `result`.
fn finished(task_id: TaskId, attempts: u32, pid: Pid, result: serde_json::Value) -> TaskOutcome {
    TaskOutcome {
        index: 0,
        task_id,
        state: TaskState::Finished,
        attempts,
        executor_id: ExecutorId::parse(format!("e{pid}")).ok(),
        result: Some(result),
        error: None,
        result_object: None,
        started_ms: None,
        duration_ms: None,
    }
}

/// `e{n}` is process `n`.
fn pid_of(id: &ExecutorId) -> Option<Pid> {
    id.as_str().strip_prefix('e')?.parse().ok()
}

#[test]
fn a_result_must_be_its_own_tasks_under_its_attempt_on_its_executor() {
    let mut runs = Runs::new(true);
    runs.start(start(0, (1, 7), 10, 0, 5, 0)).unwrap();
    runs.start(start(0, (2, 3), 11, 0, 5, 0)).unwrap();
    let check = |o: TaskOutcome| runs.check_result(0, &o, pid_of);
    assert_eq!(check(finished(10, 1, 1, result_of(1, 7))), Ok(()));
    let other_task = check(finished(10, 1, 2, result_of(2, 3))).unwrap_err();
    assert!(other_task.contains("a run of task 11"), "{other_task}");
    let other_attempt = check(finished(10, 2, 1, result_of(1, 7))).unwrap_err();
    assert!(
        other_attempt.contains("as attempt Some(1)"),
        "{other_attempt}"
    );
    let other_executor = check(finished(10, 1, 2, result_of(1, 7))).unwrap_err();
    assert!(other_executor.contains("finished on"), "{other_executor}");
    let never_ran = check(finished(10, 1, 1, result_of(1, 8))).unwrap_err();
    assert!(never_ran.contains("never ran"), "{never_ran}");
    let no_run = check(finished(10, 1, 1, serde_json::json!("output"))).unwrap_err();
    assert!(no_run.contains("names no run"), "{no_run}");
}

#[test]
fn an_adopted_run_answers_for_its_new_name_too() {
    let mut runs = Runs::new(true);
    runs.start(start(0, (1, 7), 10, 0, 5, 0)).unwrap();
    runs.adopt(1, 0, 1, (10, 0, 5), 3, 9).unwrap();
    assert_eq!(runs.adopted, 1);
    let outcome = finished(10, 4, 1, result_of(1, 7));
    assert_eq!(runs.check_result(0, &outcome, pid_of), Ok(()));
}

#[test]
fn two_runs_under_one_name_are_reported() {
    let mut runs = Runs::new(true);
    runs.start(start(0, (1, 7), 10, 0, 5, 0)).unwrap();
    let again = runs.start(start(0, (1, 8), 10, 0, 5, 1)).unwrap_err();
    assert!(again.contains("names two runs"), "{again}");
    // An adoption may not rename a run to a name another run holds.
    let mut runs = Runs::new(true);
    runs.start(start(0, (1, 7), 10, 0, 5, 0)).unwrap();
    runs.start(start(1, (2, 1), 10, 0, 9, 1)).unwrap();
    let renamed = runs.adopt(1, 0, 1, (10, 0, 5), 0, 9).unwrap_err();
    assert!(renamed.contains("names two runs"), "{renamed}");
    // The same attempt of another term is another name.
    let mut runs = Runs::new(true);
    runs.start(start(0, (1, 7), 10, 0, 5, 0)).unwrap();
    assert_eq!(runs.start(start(1, (2, 1), 10, 0, 9, 1)), Ok(()));
}

#[test]
fn a_second_run_after_a_failover_alone_is_reported_unless_the_link_was_disturbed() {
    let stored = |_: JobKey| true;
    let mut runs = Runs::new(true);
    runs.start(start(0, (1, 7), 10, 0, 5, 100)).unwrap();
    runs.start(start(1, (2, 1), 10, 0, 9, 4_000)).unwrap();
    let broken = runs.check_suspects(stored).unwrap_err();
    assert!(broken.contains("still ran"), "{broken}");
    // A lost message on the way disturbs the link: a legitimate run again.
    runs.disturb(1, 2_000, 2_000);
    assert_eq!(runs.check_suspects(stored), Ok(()));
    // So does a job never stored, or a launching leader that was stopped.
    let mut runs = Runs::new(true);
    runs.start(start(0, (1, 7), 10, 0, 5, 100)).unwrap();
    runs.start(start(1, (2, 1), 10, 0, 9, 4_000)).unwrap();
    assert_eq!(runs.check_suspects(|_| false), Ok(()));
    let mut runs = Runs::new(true);
    runs.start(start(0, (1, 7), 10, 0, 5, 100)).unwrap();
    runs.pause(1);
    runs.start(start(1, (2, 1), 10, 0, 9, 4_000)).unwrap();
    assert_eq!(runs.check_suspects(stored), Ok(()));
}

#[test]
fn a_run_dropped_unadopted_counts_as_a_failover_alone_but_one_adopted_or_ended_does_not() {
    let stored = |_: JobKey| true;
    let mut runs = Runs::new(true);
    runs.start(start(0, (1, 7), 10, 0, 5, 100)).unwrap();
    runs.sync(1, 3_000, true, |_| None);
    runs.start(start(1, (2, 1), 10, 0, 9, 6_000)).unwrap();
    let broken = runs.check_suspects(stored).unwrap_err();
    assert!(broken.contains("dropped unadopted at 3000 ms"), "{broken}");
    // Adopted by the new leader: its copy (speculation) is no failover's doing.
    let mut runs = Runs::new(true);
    runs.start(start(0, (1, 7), 10, 0, 5, 100)).unwrap();
    runs.adopt(1, 0, 1, (10, 0, 5), 0, 9).unwrap();
    runs.start(start(1, (2, 1), 10, 1, 9, 6_000)).unwrap();
    assert_eq!(runs.check_suspects(stored), Ok(()));
    // Ended before the new leader ran it again.
    let mut runs = Runs::new(true);
    runs.start(start(0, (1, 7), 10, 0, 5, 100)).unwrap();
    runs.sync(1, 3_000, false, |_| None);
    runs.start(start(1, (2, 1), 10, 0, 9, 6_000)).unwrap();
    assert_eq!(runs.check_suspects(stored), Ok(()));
}
