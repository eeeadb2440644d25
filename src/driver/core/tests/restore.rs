//! Restoring from the journal: a job resumes where its journal left it, ids go on after the
//! restored ones, ended jobs stay listable, a record that does not fit changes nothing, and a `TasksEnded`
//! record applies the entries that fit.

use super::*;
use crate::driver::core::ReplayError;
use crate::protocol::JournaledTask;
use serde_json::json;

/// A job of 4 tasks on one 2-core executor, task 1 finished with a result: the journal so far.
fn journal_mid_job() -> Vec<JournalRecord> {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    add(&mut core, "e1", 2, 0);
    submit(&mut core, job(4, 1, 4), 10);
    take_journal(&mut core, &mut journal);
    status(&mut core, "e1", vec![finished_with(1, 0, json!("one"))], 20);
    take_journal(&mut core, &mut journal);
    // A failure that will be retried is not journaled.
    status(&mut core, "e1", vec![failed(2, 0, "boom")], 30);
    take_journal(&mut core, &mut journal);
    journal
}

#[test]
fn a_restored_job_runs_its_unfinished_tasks_and_ids_go_on() {
    let journal = journal_mid_job();
    assert_eq!(journal.len(), 2, "{journal:?}");
    let mut core = journaled_core(0);
    for record in journal {
        core.replay(record).unwrap();
    }
    let restored = core.resume(0);
    assert_eq!((restored.jobs, restored.running_jobs), (1, 1));
    assert_eq!(restored.pending_tasks, 3);
    let resumed = summary(&mut core, 1);
    assert_eq!(
        (resumed.state, resumed.succeeded, resumed.running),
        (JobState::Running, 1, 0)
    );
    assert_eq!(outcome(&mut core, 1, 0).result, Some(json!("one")));
    let effects = add(&mut core, "e2", 8, 100);
    let mut launched: Vec<TaskId> = launches(&effects)
        .iter()
        .flat_map(|(_, tasks)| tasks.iter().map(|t| t.0))
        .collect();
    launched.sort();
    assert_eq!(launched, [2, 3, 4]);
    let next = submit(&mut core, job(1, 1, 4), 200);
    assert_eq!(next, 2);
    assert!(
        core.locate(5).is_some_and(|(job, _)| job == 2),
        "task ids go on"
    );
}

#[test]
fn an_ended_job_stays_listable() {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    submit(&mut core, job(3, 1, 4), 10);
    core.api(ApiRequest::KillJob { job_id: 1 }, 20);
    take_journal(&mut core, &mut journal);
    let mut restored = restored(&journal, 1);
    let ended = summary(&mut restored, 1);
    assert_eq!((ended.state, ended.killed), (JobState::Killed, 3));
    assert_eq!(ended.reason.as_deref(), Some("killed by request"));
    assert_eq!(ended.ended_at_ms, Some(20));
    assert_eq!(restored.queue.len(), 0, "nothing of it runs again");
}

fn outcome_of(task_id: TaskId, state: TaskState) -> JournaledTask {
    JournaledTask {
        task_id,
        attempt: 0,
        executor_id: eid("e1"),
        state,
        result: None,
        error: None,
        in_bucket: false,
        result_object: None,
        objects: Vec::new(),
    }
}

#[test]
fn a_mixed_tasks_ended_record_applies_the_entries_that_fit_and_names_the_rest() {
    let mut core = restored(&journal_mid_job(), 1);
    let record = JournalRecord::TasksEnded {
        time_ms: 0,
        tasks: vec![
            outcome_of(2, TaskState::Finished),
            outcome_of(99, TaskState::Finished),
            outcome_of(3, TaskState::Running),
            outcome_of(4, TaskState::Failed),
        ],
        term: 0,
    };
    let error = core.replay(record).unwrap_err();
    assert_eq!(
        error,
        ReplayError::EntriesSkipped {
            unknown: vec![99],
            unsettled: vec![(3, TaskState::Running)],
        }
    );
    assert!(error.applied_in_part());
    let restored = core.resume(0);
    let job = summary(&mut core, 1);
    // Task 1 from the journal, task 2 from this record; task 4 after the skipped entries.
    assert_eq!((job.succeeded, job.failed), (2, 1), "{job:?}");
    assert_eq!(restored.pending_tasks, 1, "task 3 runs again");
}

#[test]
fn records_that_do_not_fit_are_refused_and_change_nothing() {
    let mut core = restored(&journal_mid_job(), 1);
    let print = fingerprint(&core);
    let refused = [
        (
            JournalRecord::TasksEnded {
                time_ms: 0,
                tasks: vec![outcome_of(99, TaskState::Finished)],
                term: 0,
            },
            ReplayError::EntriesSkipped {
                unknown: vec![99],
                unsettled: vec![],
            },
        ),
        (
            JournalRecord::TasksEnded {
                time_ms: 0,
                tasks: vec![outcome_of(3, TaskState::Lost)],
                term: 0,
            },
            ReplayError::EntriesSkipped {
                unknown: vec![],
                unsettled: vec![(3, TaskState::Lost)],
            },
        ),
        (
            JournalRecord::JobEnded {
                job_id: 7,
                state: JobState::Killed,
                time_ms: 0,
                reason: None,
            },
            ReplayError::UnknownJob(7),
        ),
        (
            JournalRecord::JobSubmitted {
                job_id: 2,
                first_task: 3,
                time_ms: 0,
                job: Box::new(job(1, 1, 4)),
                term: None,
                tenant: None,
            },
            ReplayError::IdsOverlap {
                job_id: 2,
                first_task: 3,
            },
        ),
    ];
    for (record, error) in refused {
        assert_eq!(core.replay(record), Err(error));
        assert_eq!(fingerprint(&core), print);
    }
    let empty = JournalRecord::JobSubmitted {
        job_id: 2,
        first_task: 5,
        time_ms: 0,
        job: Box::new(job(0, 1, 4)),
        term: None,
        tenant: None,
    };
    assert!(matches!(
        core.replay(empty),
        Err(ReplayError::InvalidJob { job_id: 2, .. })
    ));
    assert_eq!(fingerprint(&core), print);
}

#[test]
fn without_a_journal_the_core_emits_no_records() {
    let mut core = new_core(0);
    let mut journal = Vec::new();
    add(&mut core, "e1", 1, 0);
    submit(&mut core, job(1, 1, 4), 10);
    take_journal(&mut core, &mut journal);
    status(&mut core, "e1", vec![finished(1, 0)], 20);
    take_journal(&mut core, &mut journal);
    assert_eq!(journal, vec![]);
}

#[test]
fn a_job_whose_last_task_end_was_stored_but_not_its_own_end_ends_on_resume() {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    add(&mut core, "e1", 2, 0);
    submit(&mut core, job(1, 1, 4), 10);
    status(&mut core, "e1", vec![finished_with(1, 0, json!("one"))], 20);
    take_journal(&mut core, &mut journal);
    // The driver stopped after the task's end was stored and before the job's.
    let job_ended = |r: &JournalRecord| matches!(r, JournalRecord::JobEnded { .. });
    assert!(journal.iter().any(job_ended), "{journal:?}");
    journal.retain(|r| !job_ended(r));
    let mut core = journaled_core(0);
    for record in journal {
        core.replay(record).unwrap();
    }
    let restored = core.resume(30);
    assert_eq!((restored.running_jobs, restored.pending_tasks), (0, 0));
    let ended = summary(&mut core, 1);
    assert_eq!((ended.state, ended.succeeded), (JobState::Succeeded, 1));
    assert_eq!(ended.ended_at_ms, Some(30));
    let mut stored = Vec::new();
    take_journal(&mut core, &mut stored);
    assert!(
        stored.iter().any(job_ended),
        "its end is stored now: {stored:?}"
    );
}

/// The live events a journal's facts stand for: job starts, the ends of tasks that ended for
/// good (durations aside: the journal keeps none), and job ends.
fn journaled_facts(events: &[Event]) -> Vec<Event> {
    let mut facts = Vec::new();
    for event in events {
        match event {
            Event::JobStart { .. } | Event::JobEnd { .. } => facts.push(event.clone()),
            Event::TaskEnd { .. } => facts.extend(event.clone().keep_ended(|t| {
                t.duration_ms = 0;
                t.state == TaskState::Finished
                    || (t.state == TaskState::Failed && t.error.as_deref() == Some("last"))
            })),
            _ => {}
        }
    }
    facts
}

#[test]
fn a_journal_retells_the_job_starts_task_ends_and_job_ends_published_live() {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    let mut live = Vec::new();
    add(&mut core, "e1", 2, 0);
    add(&mut core, "e2", 2, 0);
    core.take_effects();
    let first = submit(&mut core, job(3, 1, 2), 10);
    let second = submit(&mut core, job(2, 1, 1), 11);
    live.extend(events(&take_journal(&mut core, &mut journal)));
    let placed: Vec<(String, TaskId)> = running_attempts(&core)
        .into_iter()
        .map(|(executor, task, _)| (executor.to_string(), task))
        .collect();
    let on = |task: TaskId| placed.iter().find(|(_, t)| *t == task).unwrap().0.clone();
    // One status batch ends tasks of both jobs; a retried failure is not journaled.
    for (task, update) in [
        (1, finished(1, 0)),
        (2, failed(2, 0, "retried")),
        (4, finished(4, 0)),
    ] {
        status(&mut core, &on(task), vec![update], 20);
        live.extend(events(&take_journal(&mut core, &mut journal)));
    }
    let retried = running_attempts(&core);
    for (executor, task, attempt) in retried {
        let update = match task {
            2 => failed(2, attempt, "last"),
            _ => finished(task, attempt),
        };
        status(&mut core, &executor.to_string(), vec![update], 30);
        live.extend(events(&take_journal(&mut core, &mut journal)));
    }
    let restored = restored(&journal, 1);
    let retold = restored.retell(&journal);
    assert_eq!(retold, journaled_facts(&live), "journal {journal:#?}");
    let kinds: Vec<_> = retold.iter().map(Event::kind).collect();
    assert!(
        kinds.contains(&"job.start") && kinds.contains(&"job.end"),
        "{kinds:?}"
    );
    assert!(retold.iter().any(|e| e.job_id() == Some(first)));
    assert!(retold.iter().any(|e| e.job_id() == Some(second)));
}
