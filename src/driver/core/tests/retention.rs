//! Retention: the last N finished jobs are kept, older ones forgotten with a clear answer;
//! running jobs never are; paging by id stays exact across the gaps; a replay keeps the same.

use super::*;

/// Runs a one-task job on executor "e1" to its end; returns its id.
fn run_one(core: &mut Core, now: u64) -> JobId {
    run_one_journaled(core, now, &mut Vec::new())
}

/// Runs a one-task job on executor "e1" to its end, its journal records going to `journal`.
fn run_one_journaled(core: &mut Core, now: u64, journal: &mut Vec<JournalRecord>) -> JobId {
    let job_id = submit(core, job(1, 1, 4), now);
    let launched = launches(&take_journal(core, journal));
    let (task_id, _, attempt) = launched[0].1[0];
    let (accepted, refused) = status(core, "e1", vec![finished(task_id, attempt)], now + 1);
    assert_eq!((accepted, refused), (1, vec![]));
    take_journal(core, journal);
    assert_eq!(summary(core, job_id).state, JobState::Succeeded);
    job_id
}

fn ids(jobs: &[JobSummary]) -> Vec<JobId> {
    jobs.iter().map(|j| j.job_id).collect()
}

#[test]
fn the_oldest_finished_jobs_are_forgotten_and_the_api_says_so() {
    let mut core = core_retaining(2);
    add(&mut core, "e1", 1, 0);
    for n in 0..4 {
        run_one(&mut core, 10 * n);
    }
    check_invariants(&core);
    assert_eq!(ids(&list_jobs(&mut core)), [3, 4]);
    let forgotten = "job 1 was forgotten: only the last 2 finished jobs are kept (--retain-jobs)";
    for request in [
        ApiRequest::GetJob { job_id: 1 },
        ApiRequest::KillJob { job_id: 1 },
        ApiRequest::GetResults {
            job_id: 1,
            offset: 0,
            limit: 10,
        },
    ] {
        assert_eq!(
            api_error(unchanged(&mut core, |c| c.api(request, 50))),
            forgotten
        );
    }
    assert_eq!(
        api_error(core.api(ApiRequest::GetJob { job_id: 5 }, 50)),
        "no job with id 5",
        "an id not yet given is not forgotten"
    );
    assert_eq!(run_one(&mut core, 100), 5, "ids keep counting up");
    // A late repeat of a forgotten job's status is acknowledged and changes nothing.
    let repeat = unchanged(&mut core, |c| status(c, "e1", vec![finished(1, 0)], 200));
    assert_eq!(repeat, (1, vec![]));
    let (_, refused) = status(&mut core, "e1", vec![finished(6, 0)], 200);
    assert_eq!(refused.len(), 1, "a task id not yet given is refused");
}

#[test]
fn running_jobs_are_never_forgotten() {
    let mut core = core_retaining(1);
    add(&mut core, "e1", 2, 0);
    let (long, _) = start(&mut core, job(1, 1, 4), 1);
    for n in 0..3 {
        run_one(&mut core, 10 + 10 * n);
    }
    assert_eq!(ids(&list_jobs(&mut core)), [long, 4]);
    assert_eq!(summary(&mut core, long).state, JobState::Running);
    check_invariants(&core);
}

#[test]
fn a_job_past_the_limit_waits_for_its_killed_attempts_and_their_cores_come_back() {
    let mut core = core_retaining(1);
    add(&mut core, "e1", 2, 0);
    let (victim, launched) = start(&mut core, job(1, 1, 4), 1);
    let (task_id, _, attempt) = launched[0].1[0];
    core.api(ApiRequest::KillJob { job_id: victim }, 2);
    core.take_effects();
    run_one(&mut core, 10);
    check_invariants(&core);
    assert_eq!(core.forgetting, [victim], "past the limit, still running");
    assert_eq!(free(&core, "e1"), 1);
    report(&mut core, "e1", vec![killed(task_id, attempt)], 20);
    assert_eq!(free(&core, "e1"), 2, "the killed attempt's core came back");
    assert!(!core.jobs.contains_key(&victim));
    check_invariants(&core);
}

#[test]
fn paging_by_id_neither_misses_nor_repeats_a_job_across_forgetting() {
    let mut core = core_retaining(3);
    add(&mut core, "e1", 2, 0);
    let (long, _) = start(&mut core, job(1, 1, 4), 0);
    for n in 0..5 {
        run_one(&mut core, 10 + 10 * n);
    }
    // Kept: the running job 1 and the last 3 finished, 4 to 6: a gap at 2 and 3.
    let mut seen = Vec::new();
    let mut from_job = 0;
    loop {
        let request = ApiRequest::ListJobs {
            offset: 0,
            limit: Some(1),
            from_job,
        };
        let ApiReply::Jobs { jobs, next_job, .. } = core.api(request, 100) else {
            panic!("not a page of jobs");
        };
        seen.extend(ids(&jobs));
        // Between the pages, another job ends and an older one is forgotten.
        if seen.len() == 2 {
            run_one(&mut core, 200);
        }
        match next_job {
            Some(next) => {
                assert!(next > from_job);
                from_job = next;
            }
            None => break,
        }
    }
    // Job 4 was forgotten after its page: by position, the next page would have skipped 5.
    assert_eq!(seen, [long, 4, 5, 6, 7]);
}

#[test]
fn a_replay_forgets_what_the_driver_forgot() {
    let mut core = core_retaining(2);
    let mut journal = Vec::new();
    add(&mut core, "e1", 1, 0);
    for n in 0..5 {
        run_one_journaled(&mut core, 10 * n, &mut journal);
    }
    let mut restored = core_retaining(2);
    for record in journal {
        restored.replay(record).expect("replays");
    }
    restored.resume(0);
    assert_eq!(ids(&list_jobs(&mut restored)), [4, 5]);
    assert_eq!(restored.next_job, 6);
    check_invariants(&restored);
}

/// Runs a job of `tasks` tasks on "e1" to its end, each finishing with a result of `size`
/// bytes of JSON; the journal records go to `journal`.
fn finish_all(core: &mut Core, tasks: u32, size: usize, journal: &mut Vec<JournalRecord>) -> JobId {
    let job_id = submit(core, job(tasks, 1, 4), 0);
    let mut launched = launches(&take_journal(core, journal));
    while let Some((_, tasks)) = launched.pop() {
        for (task_id, _, attempt) in tasks {
            // A JSON string of `size` bytes: the quotes and `size - 2` letters.
            let result = Value::String("r".repeat(size - 2));
            let update = finished_with(task_id, attempt, result);
            let (accepted, refused) = status(core, "e1", vec![update], 1);
            assert_eq!((accepted, refused), (1, vec![]));
            let effects = take_journal(core, journal);
            launched.extend(launches(&effects));
        }
    }
    assert_eq!(summary(core, job_id).state, JobState::Succeeded);
    job_id
}

#[test]
fn a_result_past_its_jobs_cap_fails_its_task_for_good_naming_the_limit() {
    let mut core = core_retaining(10);
    core.config.retention.job_result_bytes = 100;
    add(&mut core, "e1", 1, 0);
    let mut journal = Vec::new();
    let job_id = submit(&mut core, job(3, 1, 4), 0);
    let mut launched = launches(&take_journal(&mut core, &mut journal));
    let mut ended = Vec::new();
    while let Some((_, tasks)) = launched.pop() {
        for (task_id, _, attempt) in tasks {
            let update = finished_with(task_id, attempt, Value::String("r".repeat(38)));
            assert_eq!(status(&mut core, "e1", vec![update], 1), (1, vec![]));
            launched.extend(launches(&take_journal(&mut core, &mut journal)));
            ended.push(attempt);
        }
    }
    // Three attempts in all: the one refused is not run again, though four are allowed.
    assert_eq!(ended, [0, 0, 0]);
    let job = summary(&mut core, job_id);
    assert_eq!(
        (job.state, job.succeeded, job.failed),
        (JobState::Failed, 2, 1)
    );
    let refused = outcome(&mut core, job_id, 2);
    assert_eq!((refused.state, refused.result), (TaskState::Failed, None));
    let error = refused.error.unwrap();
    assert!(
        error.contains("result of 40 bytes")
            && error.contains("--max-job-result-bytes")
            && error.contains("80 taken already"),
        "{error}"
    );
    assert!(job
        .reason
        .unwrap_or_default()
        .contains("--max-job-result-bytes"));
    check_invariants(&core);
    // A restored driver holds the same ends.
    let mut restored = restored_keeping(&journal, 1, 10);
    assert_eq!(summary(&mut restored, job_id).state, JobState::Failed);
    assert_eq!(outcome(&mut restored, job_id, 2).state, TaskState::Failed);
}

#[test]
fn past_the_cap_of_all_results_the_oldest_finished_jobs_lose_theirs_and_say_so() {
    let mut core = core_retaining(10);
    core.config.retention.result_bytes = 150;
    let mut journal = Vec::new();
    add(&mut core, "e1", 1, 0);
    let first = finish_all(&mut core, 1, 60, &mut journal);
    let second = finish_all(&mut core, 1, 60, &mut journal);
    finish_all(&mut core, 1, 60, &mut journal);
    let request = ApiRequest::GetResults {
        job_id: first,
        offset: 0,
        limit: 10,
    };
    let dropped = api_error(core.api(request.clone(), 0));
    assert!(
        dropped.contains("results of job 1 were dropped") && dropped.contains("--max-result-bytes"),
        "{dropped}"
    );
    assert_eq!(
        summary(&mut core, first).succeeded,
        1,
        "the job itself stays"
    );
    assert!(outcome(&mut core, second, 0).result.is_some());
    check_invariants(&core);
    assert!(journal.contains(&JournalRecord::ResultsDropped { job_id: first }));
    for journal in [journal.clone(), vec![snapshot_record(&core, 1, 5)]] {
        let mut restored = restored_keeping(&journal, 1, 10);
        restored.config.retention.result_bytes = 150;
        assert_eq!(api_error(restored.api(request.clone(), 0)), dropped);
        assert!(outcome(&mut restored, second, 0).result.is_some());
        check_invariants(&restored);
    }
}

/// 2.5 MB of result in the object store.
fn big_result() -> ResultObject {
    ResultObject {
        object: crate::objects::ObjectRef::of(b"a large result"),
        bytes: 2_500_000,
    }
}

/// Launches a one-task job on "e1" and reports its finish with `big_result()`; returns the
/// job.
fn finish_with_an_object(core: &mut Core, journal: &mut Vec<JournalRecord>) -> JobId {
    add(core, "e1", 1, 0);
    let job_id = submit(core, job(1, 1, 4), 0);
    let (task_id, _, attempt) = launches(&take_journal(core, journal))[0].1[0];
    let update = finished_with_an_object(task_id, attempt, big_result());
    status(core, "e1", vec![update], 1);
    take_journal(core, journal);
    job_id
}

/// A status whose result the executor put in the object store.
fn finished_with_an_object(task_id: TaskId, attempt: u32, object: ResultObject) -> StatusUpdate {
    StatusUpdate {
        result_object: Some(object),
        ..finished(task_id, attempt)
    }
}

#[test]
fn a_result_object_is_kept_by_reference_journaled_restored_and_used_by_its_job() {
    let mut core = journaled_core(0);
    core.config.results_bucket = true;
    let mut journal = Vec::new();
    let job_id = finish_with_an_object(&mut core, &mut journal);
    assert_eq!(summary(&mut core, job_id).state, JobState::Succeeded);
    let kept = outcome(&mut core, job_id, 0);
    assert_eq!(
        (kept.result_object, kept.result),
        (Some(big_result()), None)
    );
    // The job refers to the object, so the store keeps it while the job is kept.
    assert_eq!(core.users_of(&[big_result().object]), [[job_id]]);
    // The journal holds the reference, and a restored driver has it too.
    let mut restored = restored(&journal, 1);
    assert_eq!(
        outcome(&mut restored, job_id, 0).result_object,
        Some(big_result())
    );
    assert_eq!(restored.users_of(&[big_result().object]), [[job_id]]);
    check_invariants(&restored);
}

#[test]
fn a_result_object_past_the_jobs_cap_fails_its_task() {
    let mut core = journaled_core(0);
    core.config.results_bucket = true;
    core.config.retention.job_result_bytes = 1_000_000;
    add(&mut core, "e1", 1, 0);
    let job_id = submit(&mut core, job(1, 1, 4), 0);
    let (task_id, _, attempt) = launches(&core.take_effects())[0].1[0];
    let update = finished_with_an_object(task_id, attempt, big_result());
    status(&mut core, "e1", vec![update], 1);
    let refused = outcome(&mut core, job_id, 0);
    assert_eq!(
        (refused.state, refused.result_object),
        (TaskState::Failed, None)
    );
    let error = refused.error.unwrap_or_default();
    assert!(error.contains("--max-job-result-bytes"), "{error}");
    assert_eq!(summary(&mut core, job_id).state, JobState::Failed);
    assert!(
        core.referenced_objects().is_empty(),
        "a refused result is not the job's"
    );
    check_invariants(&core);
}
