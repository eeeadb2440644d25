//! Jobs that run after other jobs: they wait holding nothing, start when the last job they run
//! after ends as they need, fail down the chain when one did not succeed, and come back waiting
//! (or settled) from the journal.

use super::*;
use crate::driver::core::{Answer, Pin};
use serde_json::json;

/// A waiting job: nothing of it has run nor is queued; it waits for kept jobs that have not
/// ended (or whose end is not yet handed back stored), and each of them knows it.
pub(super) fn check_waiting(core: &Core, job: &crate::driver::core::Job, queue: &[JobId]) {
    let job_id = job.id;
    assert_eq!(
        (job.running, job.succeeded, job.failed),
        (0, 0, 0),
        "job {job_id}"
    );
    assert!(job.ended_at_ms.is_none() && job.reason.is_none());
    assert!(!queue.contains(&job_id), "waiting job {job_id} is queued");
    let waits = core.waits_for(job_id);
    assert!(!waits.is_empty(), "job {job_id} waits for nothing");
    for up in waits {
        assert!(
            core.jobs[&up].is_open() || core.unreleased.contains(&up),
            "job {job_id} waits for {up}"
        );
        assert!(
            core.dependents
                .get(&up)
                .is_some_and(|d| d.contains(&job_id)),
            "job {up} does not know that job {job_id} waits for it"
        );
    }
}

/// A job of `tasks` no-op tasks that runs after `after` and, however they end, `after_any`.
fn after(tasks: u32, after: &[JobId], after_any: &[JobId]) -> SubmitJob {
    SubmitJob {
        after: after.to_vec(),
        after_any: after_any.to_vec(),
        ..job(tasks, 1, 1)
    }
}

/// Hands back every [`Effect::Release`] in `effects` as the shell does once the writes before
/// them are stored, and those they lead to in turn; returns every effect, `effects` first.
fn hand_back(core: &mut Core, mut effects: Vec<Effect>) -> Vec<Effect> {
    let mut from = 0;
    while from < effects.len() {
        let releases: Vec<_> = effects[from..]
            .iter()
            .filter_map(|e| match e {
                Effect::Release {
                    job_id,
                    state,
                    reason,
                } => Some((*job_id, *state, reason.clone())),
                _ => None,
            })
            .collect();
        from = effects.len();
        for (job_id, state, reason) in releases {
            core.release(job_id, state, reason, 100);
        }
        effects.extend(core.take_effects());
    }
    effects
}

/// Finishes every launch in `launched` on `executor`, and returns the effects.
fn finish_all(core: &mut Core, executor: &str, launched: &[Launch], now: u64) -> Vec<Effect> {
    let updates = launched
        .iter()
        .flat_map(|(_, tasks)| tasks.iter().map(|&(id, _, attempt)| finished(id, attempt)))
        .collect();
    report(core, executor, updates, now)
}

#[test]
fn a_job_after_another_waits_holding_nothing_and_starts_in_the_round_the_other_succeeds() {
    let mut core = new_core(0);
    add(&mut core, "e1", 4, 0);
    let (first, launched) = start(&mut core, job(2, 1, 1), 1);
    assert_eq!(launched[0].1.len(), 2);
    let (second, none) = start(&mut core, after(2, &[first], &[]), 2);
    assert!(none.is_empty(), "a waiting job launches nothing: {none:?}");
    let waiting = summary(&mut core, second);
    assert_eq!(waiting.state, JobState::Waiting);
    assert_eq!(waiting.waits_for, [first]);
    let why = waiting.waiting.unwrap_or_default();
    assert!(why.contains(&format!("job {first}")), "{why}");
    // It holds no cores and blocks no other job: a third job runs on the free cores.
    let (_, third) = start(&mut core, job(2, 1, 1), 3);
    assert_eq!(third[0].1.len(), 2, "the free cores went to the third job");
    check_invariants(&core);

    let effects = finish_all(&mut core, "e1", &launched, 4);
    assert_eq!(summary(&mut core, first).state, JobState::Succeeded);
    assert_eq!(summary(&mut core, second).state, JobState::Running);
    let started = launches(&effects);
    let tasks: usize = started.iter().map(|(_, t)| t.len()).sum();
    assert_eq!(
        tasks, 2,
        "the second job launched in the same round: {started:?}"
    );
    check_invariants(&core);
}

#[test]
fn a_failure_ends_every_job_after_it_down_the_chain_naming_it() {
    let mut core = new_core(0);
    add(&mut core, "e1", 2, 0);
    let (first, launched) = start(&mut core, job(1, 1, 1), 1);
    let second = submit(&mut core, after(3, &[first], &[]), 2);
    let third = submit(&mut core, after(1, &[second], &[]), 3);
    let cleanup = submit(&mut core, after(1, &[], &[second]), 4);
    core.take_effects();
    let (task_id, _, attempt) = launched[0].1[0];
    let effects = report(&mut core, "e1", vec![failed(task_id, attempt, "boom")], 5);
    let ends = job_ends(&effects);
    let ended: Vec<(JobId, JobState)> = ends
        .iter()
        .map(|e| match e {
            Event::JobEnd { job_id, state, .. } => (*job_id, *state),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(
        ended,
        [
            (first, JobState::Failed),
            (second, JobState::Failed),
            (third, JobState::Failed)
        ]
    );
    let reason = summary(&mut core, second).reason.unwrap_or_default();
    assert!(
        reason.starts_with(&format!("job {first}, which this job runs after, FAILED: ")),
        "{reason}"
    );
    assert!(reason.contains("boom"), "{reason}");
    let reason = summary(&mut core, third).reason.unwrap_or_default();
    assert!(
        reason.starts_with(&format!(
            "job {second}, which this job runs after, FAILED: job {first}"
        )),
        "{reason}"
    );
    // Nothing of the failed jobs ran: their tasks count as killed.
    let s = summary(&mut core, second);
    assert_eq!((s.succeeded, s.failed, s.killed), (0, 0, 3));
    // The clean-up job ran after the second however it ended.
    assert_eq!(summary(&mut core, cleanup).state, JobState::Running);
    assert_eq!(launches(&effects).len(), 1, "{effects:?}");
    check_invariants(&core);
}

#[test]
fn a_job_after_one_that_has_ended_starts_or_fails_at_once() {
    let mut core = new_core(0);
    add(&mut core, "e1", 2, 0);
    let (done, launched) = start(&mut core, job(1, 1, 1), 1);
    finish_all(&mut core, "e1", &launched, 2);
    let (runs, started) = start(&mut core, after(1, &[done], &[]), 3);
    assert_eq!(summary(&mut core, runs).state, JobState::Running);
    assert_eq!(started.len(), 1);
    let (killed, _) = start(&mut core, job(1, 1, 1), 4);
    core.api(ApiRequest::KillJob { job_id: killed }, 5);
    core.take_effects();
    let failed = submit(&mut core, after(1, &[killed], &[]), 6);
    let s = summary(&mut core, failed);
    assert_eq!(s.state, JobState::Failed);
    assert_eq!(
        s.reason.as_deref(),
        Some(&*format!(
            "job {killed}, which this job runs after, KILLED: killed by request"
        ))
    );
    let any = submit(&mut core, after(1, &[], &[killed]), 7);
    assert_eq!(summary(&mut core, any).state, JobState::Running);
    check_invariants(&core);
}

#[test]
fn only_jobs_the_driver_keeps_may_be_named() {
    let mut core = core_retaining(1);
    add(&mut core, "e1", 2, 0);
    let (old, launched) = start(&mut core, job(1, 1, 1), 1);
    finish_all(&mut core, "e1", &launched, 2);
    let (newer, launched) = start(&mut core, job(1, 1, 1), 3);
    finish_all(&mut core, "e1", &launched, 4);
    let forgotten = api_error(core.api(ApiRequest::SubmitJob(after(1, &[old], &[])), 5));
    assert!(forgotten.contains("no longer kept"), "{forgotten}");
    let unknown = api_error(core.api(ApiRequest::SubmitJob(after(1, &[], &[99])), 5));
    assert!(
        unknown.contains("job 99") && unknown.contains("does not exist"),
        "{unknown}"
    );
    let too_many: Vec<JobId> = vec![newer; super::super::dependencies::MAX_AFTER + 1];
    let refused = api_error(core.api(ApiRequest::SubmitJob(after(1, &too_many, &[])), 5));
    assert!(refused.contains("at most"), "{refused}");
    assert_eq!(
        core.take_effects(),
        vec![],
        "a refused submission changes nothing"
    );
    check_invariants(&core);
}

#[test]
fn a_waiting_job_killed_ends_killed_and_the_jobs_after_it_follow() {
    let mut core = new_core(0);
    add(&mut core, "e1", 2, 0);
    let (first, _) = start(&mut core, job(1, 1, 1), 1);
    let waiting = submit(&mut core, after(2, &[first], &[]), 2);
    let next = submit(&mut core, after(1, &[waiting], &[]), 3);
    let refused = api_error(core.api(
        ApiRequest::KillJobTask {
            job_id: waiting,
            index: 0,
            retry: false,
        },
        4,
    ));
    assert!(refused.contains("kill the job instead"), "{refused}");
    assert_eq!(
        core.api(ApiRequest::KillJob { job_id: waiting }, 5),
        ApiReply::JobKilled { job_id: waiting }
    );
    assert_eq!(summary(&mut core, waiting).state, JobState::Killed);
    let s = summary(&mut core, next);
    assert_eq!(s.state, JobState::Failed);
    assert!(s.reason.unwrap_or_default().contains("KILLED"));
    // The first job runs on, and nothing waits for it now.
    assert_eq!(summary(&mut core, first).state, JobState::Running);
    core.take_effects();
    check_invariants(&core);
}

#[test]
fn a_restored_driver_knows_what_waits_and_settles_what_the_journal_left_unsettled() {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    add(&mut core, "e1", 2, 0);
    let first = submit(&mut core, job(1, 1, 1), 1);
    let launched = launches(&take_journal(&mut core, &mut journal));
    let second = submit(&mut core, after(1, &[first], &[]), 2);
    let third = submit(&mut core, after(1, &[second], &[]), 3);
    take_journal(&mut core, &mut journal);
    // Restored while the first runs: the others wait, nothing of them queued.
    let mut back = restored(&journal, 2);
    assert_eq!(summary(&mut back, second).state, JobState::Waiting);
    assert_eq!(summary(&mut back, third).waits_for, [second]);
    check_invariants(&back);

    // The first fails; a driver that stored its end but not what followed from it (the
    // records after the first job's end lost) fails the others when it resumes.
    let (task_id, _, attempt) = launched[0].1[0];
    status(&mut core, "e1", vec![failed(task_id, attempt, "boom")], 4);
    let effects = take_journal(&mut core, &mut journal);
    // As the shell does, each end is handed back once stored, and what follows is journaled.
    journal.extend(
        hand_back(&mut core, effects)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Journal(record) => Some(record),
                _ => None,
            }),
    );
    let ended_first = journal
        .iter()
        .position(|r| matches!(r, JournalRecord::JobEnded { job_id, .. } if *job_id == first))
        .expect("the first job's end is journaled");
    let mut back = core_retaining(crate::driver::core::DEFAULT_RETAIN_JOBS as usize);
    for record in &journal[..=ended_first] {
        back.replay(record.clone())
            .expect("a record the core wrote replays");
    }
    back.resume(10);
    // Their ends are journaled and told, as they would have been: the third once the
    // second's end is stored.
    let mut told = Vec::new();
    let effects = take_journal(&mut back, &mut told);
    let effects = hand_back(&mut back, effects);
    told.extend(effects.iter().filter_map(|e| match e {
        Effect::Journal(record) => Some(record.clone()),
        _ => None,
    }));
    let ended: Vec<JobId> = told
        .iter()
        .filter_map(|r| match r {
            JournalRecord::JobEnded { job_id, .. } => Some(*job_id),
            _ => None,
        })
        .collect();
    assert_eq!(ended, [second, third]);
    assert_eq!(job_ends(&effects).len(), 2);
    for id in [second, third] {
        let s = summary(&mut back, id);
        assert_eq!(s.state, JobState::Failed, "job {id}: {s:?}");
    }
    check_retention(&back);
    // With the whole journal, the same.
    let mut whole = restored(&journal, 1);
    assert_eq!(summary(&mut whole, third).state, JobState::Failed);
    // And from a snapshot.
    let snapshot = snapshot_record(&core, 1, 5);
    let mut from_snapshot = restored(&[snapshot], 1);
    assert_eq!(summary(&mut from_snapshot, third).state, JobState::Failed);
    check_retention(&from_snapshot);
}

#[test]
fn a_job_waiting_in_a_snapshot_waits_again_and_starts_when_its_upstream_succeeds() {
    let mut core = journaled_core(0);
    add(&mut core, "e1", 2, 0);
    let (first, launched) = start(&mut core, job(1, 1, 1), 1);
    let second = submit(&mut core, after(1, &[first], &[]), 2);
    core.take_effects();
    let snapshot = snapshot_record(&core, 1, 3);
    let mut back = restored(&[snapshot], 1);
    assert_eq!(summary(&mut back, second).state, JobState::Waiting);
    add(&mut back, "e1", 2, 4);
    // The first job's attempt is adopted when its executor registers again; here it is
    // simply launched again and finishes.
    back.tick(5);
    let effects = back.take_effects();
    let relaunched = launches(&effects);
    let runs = if relaunched.is_empty() {
        launched
    } else {
        relaunched
    };
    let effects = finish_all(&mut back, "e1", &runs, 6);
    let effects = hand_back(&mut back, effects);
    assert_eq!(summary(&mut back, first).state, JobState::Succeeded);
    assert_eq!(summary(&mut back, second).state, JobState::Running);
    assert_eq!(launches(&effects).len(), 1);
    check_invariants(&back);
}

#[test]
fn with_a_journal_a_job_starts_only_once_the_end_it_waits_for_is_handed_back_stored() {
    let mut core = journaled_core(0);
    add(&mut core, "e1", 2, 0);
    let (first, launched) = start(&mut core, job(1, 1, 1), 1);
    let second = submit(&mut core, after(1, &[first], &[]), 2);
    core.take_effects();
    let (task_id, _, attempt) = launched[0].1[0];
    match core.status_updates("e1", &eid("e1"), vec![finished(task_id, attempt)], 3) {
        StatusReply::StatusAck { launch, .. } => {
            assert!(launch.is_empty(), "launched with the ack: {launch:?}")
        }
        other => panic!("not acknowledged: {other:?}"),
    }
    let effects = core.take_effects();
    // The first job's end is journaled, then handed to the shell to be handed back once
    // stored; nothing of the second job is launched before.
    let position = |found: &dyn Fn(&Effect) -> bool| effects.iter().position(found);
    let ended = position(
        &|e| matches!(e, Effect::Journal(JournalRecord::JobEnded { job_id, .. }) if *job_id == first),
    );
    let release = position(&|e| matches!(e, Effect::Release { job_id, .. } if *job_id == first));
    assert!(
        ended.is_some() && release.is_some() && ended < release,
        "{effects:?}"
    );
    assert!(launches(&effects).is_empty(), "{effects:?}");
    let waiting = summary(&mut core, second);
    assert_eq!(
        (waiting.state, waiting.waits_for),
        (JobState::Waiting, vec![first])
    );
    check_invariants(&core);

    core.release(first, JobState::Succeeded, None, 4);
    let effects = core.take_effects();
    assert_eq!(summary(&mut core, second).state, JobState::Running);
    assert_eq!(launches(&effects).len(), 1, "{effects:?}");
    check_invariants(&core);
}

#[test]
fn a_job_is_kept_past_the_limit_with_its_results_while_a_job_after_it_is_open() {
    let mut core = core_retaining(1);
    add(&mut core, "e1", 2, 0);
    let (first, launched) = start(&mut core, job(1, 1, 1), 1);
    finish_all(&mut core, "e1", &launched, 2);
    // The job after it starts at once; while its task is out, others come and go past the
    // limit of one kept job.
    let (second, second_run) = start(&mut core, after(1, &[first], &[]), 3);
    assert_eq!(second_run.len(), 1);
    for now in 4..7 {
        let (_, launched) = start(&mut core, job(1, 1, 1), now);
        finish_all(&mut core, "e1", &launched, now);
    }
    assert_eq!(summary(&mut core, second).state, JobState::Running);
    check_retention(&core);
    assert_eq!(summary(&mut core, first).state, JobState::Succeeded);
    let read = core.api(
        ApiRequest::GetResults {
            job_id: first,
            offset: 0,
            limit: 10,
        },
        7,
    );
    assert!(
        matches!(&read, ApiReply::Results(page) if page.results.len() == 1),
        "the first job's results are there to read: {read:?}"
    );
    // A snapshot keeps it too.
    let mut back = restored(&[snapshot_record(&core, 1, 7)], 1);
    back.resume(7);
    assert_eq!(summary(&mut back, first).state, JobState::Succeeded);
    check_retention(&back);
    // Once the job after it ends, it goes.
    finish_all(&mut core, "e1", &second_run, 8);
    let gone = api_error(core.api(ApiRequest::GetJob { job_id: first }, 9));
    assert!(gone.contains("forgotten"), "{gone}");
    check_retention(&core);
}

#[test]
fn a_job_after_others_prefers_the_executor_that_made_its_largest_stored_input() {
    let mut core = new_core(0);
    add(&mut core, "e1", 1, 0);
    add(&mut core, "e2", 1, 0);
    let (upstream, launched) = start(&mut core, job(2, 1, 1), 1);
    let on = |executor: &str| {
        let (_, tasks) = launched
            .iter()
            .find(|(to, _)| to.as_str() == executor)
            .expect("a task on each executor");
        (tasks[0].0, tasks[0].2)
    };
    let (dependent, none) = start(&mut core, after(1, &[upstream], &[]), 2);
    assert!(none.is_empty());
    // e2's result is large (stored as an object, kept in its cache); e1's is small.
    let object = |name: &[u8], bytes| crate::protocol::ResultObject {
        object: crate::objects::ObjectRef::of(name),
        bytes,
    };
    let (task, attempt) = on("e1");
    let small = StatusUpdate {
        result_object: Some(object(b"small", 1 << 20)),
        ..finished(task, attempt)
    };
    report(&mut core, "e1", vec![small], 3);
    let (task, attempt) = on("e2");
    let large = StatusUpdate {
        result_object: Some(object(b"large", 16 << 20)),
        ..finished(task, attempt)
    };
    // Both executors are free when the dependent is released: e1 comes first in an offer
    // round, and is passed over for e2 (which gets the task in the answer to its status).
    let reply = send_status(&mut core, "e2", "e2", vec![large], 4);
    let StatusReply::StatusAck { launch, .. } = reply else {
        panic!("{reply:?}");
    };
    // The task goes to e2, in the answer or in a round of every executor; none to e1.
    let mut sent: Vec<(String, JobId)> = launch
        .iter()
        .map(|task| ("e2".to_string(), task.job_id))
        .collect();
    for (to, tasks) in launches(&core.take_effects()) {
        sent.extend(tasks.iter().map(|_| (to.to_string(), dependent)));
    }
    assert_eq!(sent, [("e2".to_string(), dependent)]);
    // The preference is the driver's, not the submission's.
    assert_eq!(summary(&mut core, dependent).placement, None);
    let Some(ApiReply::JobAccepted { job_id }) = Some(core.api(
        ApiRequest::SubmitJob(SubmitJob {
            submission_id: Some("again".into()),
            ..after(1, &[upstream], &[])
        }),
        5,
    )) else {
        panic!("a job after a succeeded one is accepted");
    };
    assert!(summary(&mut core, job_id).placement.is_none());
    check_invariants(&core);
}

/// The pins among `effects`: (job, tasks copied) for a copy, (job, none) for a deletion.
fn pins(effects: &[Effect]) -> Vec<(JobId, Option<Vec<u32>>)> {
    effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::PinResults { job_id, indices } => Some((*job_id, Some(indices.clone()))),
            Effect::UnpinResults { job_id } => Some((*job_id, None)),
            _ => None,
        })
        .collect()
}

/// Where each result stored among `effects` goes: (job, task, pinned).
fn stores(effects: &[Effect]) -> Vec<(JobId, u32, bool)> {
    effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::StoreResult {
                job_id,
                index,
                pinned,
                ..
            } => Some((*job_id, *index, *pinned)),
            _ => None,
        })
        .collect()
}

#[test]
fn the_results_a_python_task_reads_are_pinned_from_its_submission_until_their_job_is_forgotten() {
    let mut core = core_retaining(1);
    core.config.results_bucket = true;
    add(&mut core, "e1", 2, 0);
    let (upstream, launched) = start(&mut core, job(2, 1, 1), 1);
    let tasks: Vec<_> = launched[0].1.clone();
    let result = |(task, _, attempt): (TaskId, u32, u32)| finished_with(task, attempt, json!(1));
    let effects = report(&mut core, "e1", vec![result(tasks[0])], 2);
    assert_eq!(
        stores(&effects),
        [(upstream, 0, false)],
        "no task reads it yet"
    );
    // A python task reads the job's results: the one stored is copied where the bucket's
    // limits do not reach, the next goes there at once.
    let reads = |upstream: JobId| SubmitJob {
        tasks: vec![super::jobs::python_call("gAR9lC4=", None, vec![upstream])],
        after: vec![upstream],
        ..job(1, 1, 1)
    };
    let reader = submit(&mut core, reads(upstream), 3);
    assert_eq!(pins(&core.take_effects()), [(upstream, Some(vec![0]))]);
    let effects = report(&mut core, "e1", vec![result(tasks[1])], 4);
    assert_eq!(stores(&effects), [(upstream, 1, true)]);
    // A second reader finds them pinned: nothing to copy.
    let second = submit(&mut core, reads(upstream), 5);
    assert_eq!(pins(&core.take_effects()), []);
    let page = ApiRequest::GetResults {
        job_id: upstream,
        offset: 0,
        limit: 10,
    };
    let Answer::Results(read) = core.answer(page.clone(), 6) else {
        panic!("the results are read from the bucket");
    };
    assert_eq!((read.indices, read.pinned), (vec![0, 1], true));
    // A restored driver cannot know where each job's results are, and pins again those an
    // open job reads (copying what is not there yet).
    let mut back = core_retaining(1);
    back.config.results_bucket = true;
    back.replay(snapshot_record(&core, 1, 6)).unwrap();
    back.resume(6);
    assert_eq!(pins(&back.take_effects()), [(upstream, Some(vec![0, 1]))]);
    assert!(back.jobs.values().all(|job| job.pin
        == if job.id == upstream {
            Pin::Pinned
        } else {
            Pin::Unknown
        }));
    // The readers end past the limit of one kept job: the upstream, kept for them, goes
    // once the last has ended, and its pinned results with it (after the writes before).
    core.api(ApiRequest::KillJob { job_id: reader }, 7);
    assert_eq!(pins(&core.take_effects()), []);
    core.api(ApiRequest::KillJob { job_id: second }, 8);
    assert_eq!(pins(&core.take_effects()), [(upstream, None)]);
    let gone = api_error(core.api(ApiRequest::GetJob { job_id: upstream }, 11));
    assert!(gone.contains("forgotten"), "{gone}");
    check_retention(&core);
}
