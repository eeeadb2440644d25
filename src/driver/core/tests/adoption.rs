//! Adoption: a new leader takes over the attempts of an earlier one that executors still run,
//! under numbers of its own term, and holds its offers until executors have had time to come
//! back, so that a failover alone does not run a task twice.

use super::*;
use crate::driver::core::Liveness;
use crate::protocol::{Adopted, RunningAttempt};

/// A journaled core of leadership term `term`.
fn leader(term: u64) -> Core {
    let mut core = journaled_core(0);
    core.config.term = term;
    core.set_liveness(Liveness {
        adopt_wait_ms: 3_000,
        ..Liveness::default()
    });
    core
}

/// The journal of a leader of term 5 that accepted a job of 4 tasks and launched all of them
/// on executor e1, and the launches.
fn journal_of_first_leader() -> (Vec<JournalRecord>, Vec<Launch>) {
    let mut core = leader(5);
    let mut journal = Vec::new();
    register_holding(&mut core, "e1", 4, Vec::new(), 0);
    submit(&mut core, job(4, 1, 4), 10);
    let effects = take_journal(&mut core, &mut journal);
    (journal, launches(&effects))
}

/// A leader of `term` that restored `journal` at time 1,000.
fn successor(term: u64, journal: &[JournalRecord]) -> Core {
    let mut core = leader(term);
    for record in journal {
        core.replay(record.clone()).unwrap();
    }
    core.resume(1_000);
    core
}

fn held(task_id: TaskId, attempt: u32, term: u64) -> RunningAttempt {
    RunningAttempt {
        task_id,
        attempt,
        term,
        ended: false,
    }
}

/// Registers `id` holding `attempts`, and returns what the driver adopted and the effects.
fn register_holding(
    core: &mut Core,
    id: &str,
    cores: u32,
    attempts: Vec<RunningAttempt>,
    now: u64,
) -> (Vec<Adopted>, Vec<Effect>) {
    let request = RegisterExecutor {
        held: attempts,
        ..registration(id, cores)
    };
    match core.register(id, request, now) {
        RegisterReply::RegisteredExecutor { adopted, term, .. } => {
            assert_eq!(term, core.config.term);
            (adopted, core.take_effects())
        }
        other => panic!("{id} was not registered: {other:?}"),
    }
}

#[test]
fn a_new_leader_adopts_what_an_executor_still_runs_and_runs_the_rest_after_the_wait() {
    let (journal, launched) = journal_of_first_leader();
    assert_eq!(launched.len(), 1);
    let mut core = successor(9, &journal);
    // e2 comes back first, holding nothing: the restored tasks wait for the adoption.
    let (_, effects) = register_holding(&mut core, "e2", 4, Vec::new(), 1_100);
    assert!(launches(&effects).is_empty(), "{effects:?}");
    // e1 still runs tasks 1 and 2 (attempt 0 of term 5); task 3 it has dropped.
    let (adopted, effects) = register_holding(
        &mut core,
        "e1",
        4,
        vec![held(1, 0, 5), held(2, 0, 5)],
        1_200,
    );
    let renamed: Vec<(TaskId, u32, u64, u32)> = adopted
        .iter()
        .map(|a| (a.task_id, a.attempt, a.term, a.new_attempt))
        .collect();
    assert_eq!(renamed, [(1, 0, 5, 0), (2, 0, 5, 0)]);
    assert!(launches(&effects).is_empty(), "still waiting: {effects:?}");
    let started: Vec<TaskId> = events(&effects)
        .iter()
        .flat_map(|e| e.started().map(|(_, t)| t.task_id).collect::<Vec<_>>())
        .collect();
    assert_eq!(
        started,
        [1, 2],
        "the adopted attempts start under this term"
    );
    assert_eq!(
        free(&core, "e1"),
        2,
        "the adopted attempts hold their cores"
    );
    // Past the wait, the tasks nobody runs are offered; the adopted ones are not.
    core.tick(4_000);
    let effects = core.take_effects();
    let mut offered: Vec<TaskId> = launches(&effects)
        .iter()
        .flat_map(|(_, tasks)| tasks.iter().map(|t| t.0))
        .collect();
    offered.sort();
    assert_eq!(offered, [3, 4]);
    // The adopted run's end, under its new number, finishes its task.
    status(&mut core, "e1", vec![finished(1, 0), finished(2, 0)], 4_100);
    let summary = summary(&mut core, 1);
    assert_eq!((summary.succeeded, summary.running), (2, 2));
}

#[test]
fn attempts_of_a_leader_that_did_not_know_the_job_are_not_adopted() {
    // A leader of term 5 launched tasks 1-4 of a job it never stored; its successor of term
    // 7 gave the same ids to another job, and stored it; the next leader must not take the
    // first leader's runs for the second job's.
    let mut second = leader(7);
    let mut journal = Vec::new();
    submit(&mut second, job(4, 1, 4), 10);
    take_journal(&mut second, &mut journal);
    let mut core = successor(9, &journal);
    let (adopted, _) = register_holding(&mut core, "e1", 4, vec![held(1, 0, 5)], 1_100);
    assert!(adopted.is_empty(), "{adopted:?}");
    // The second leader's own run of task 2 is adopted.
    let (adopted, _) = register_holding(&mut core, "e2", 4, vec![held(2, 0, 7)], 1_100);
    assert_eq!(adopted.len(), 1, "{adopted:?}");
}

#[test]
fn nothing_is_adopted_twice_nor_beyond_free_cores_nor_of_a_newer_term() {
    let (journal, _) = journal_of_first_leader();
    let mut core = successor(9, &journal);
    let (adopted, _) = register_holding(
        &mut core,
        "e1",
        1,
        vec![held(1, 0, 5), held(2, 0, 5)],
        1_100,
    );
    assert_eq!(adopted.len(), 1, "one core: {adopted:?}");
    let taken = adopted[0].task_id;
    // Another executor that claims the same run (a stale copy) does not get it again, and a
    // term newer than this leader's is no earlier leader's.
    let (adopted, _) = register_holding(
        &mut core,
        "e2",
        4,
        vec![held(taken, 0, 5), held(3, 0, 11)],
        1_100,
    );
    assert!(adopted.is_empty(), "{adopted:?}");
}

#[test]
fn a_repeated_registration_is_answered_with_the_same_adoption() {
    let (journal, _) = journal_of_first_leader();
    let mut core = successor(9, &journal);
    let attempts = vec![held(1, 0, 5), held(4, 0, 5)];
    let (first, _) = register_holding(&mut core, "e1", 4, attempts.clone(), 1_100);
    let (again, effects) = register_holding(&mut core, "e1", 4, attempts, 1_150);
    assert_eq!(first, again);
    assert!(
        events(&effects).is_empty(),
        "nothing starts again: {effects:?}"
    );
    assert_eq!(summary(&mut core, 1).running, 2);
}

#[test]
fn without_a_journal_nothing_is_adopted_or_held() {
    let mut core = new_core(0);
    submit(&mut core, job(2, 1, 4), 0);
    core.take_effects();
    let (adopted, effects) = register_holding(&mut core, "e1", 4, vec![held(1, 0, 0)], 10);
    assert!(adopted.is_empty());
    assert_eq!(
        launches(&effects).len(),
        1,
        "offers are not held: {effects:?}"
    );
}

#[test]
fn the_attempts_that_still_run_are_adopted_before_those_that_ended() {
    let (journal, _) = journal_of_first_leader();
    let mut core = successor(9, &journal);
    // e1, of 2 cores, holds task 1's ended attempt (its end not acknowledged) and runs tasks
    // 2 and 3: the two that run take the cores, though task 1's id comes first.
    let ended = RunningAttempt {
        ended: true,
        ..held(1, 0, 5)
    };
    let (adopted, _) = register_holding(
        &mut core,
        "e1",
        2,
        vec![ended, held(2, 0, 5), held(3, 0, 5)],
        1_200,
    );
    let tasks: Vec<TaskId> = adopted.iter().map(|a| a.task_id).collect();
    assert_eq!(tasks, [2, 3]);
    assert_eq!(free(&core, "e1"), 0);
}
