//! The job api: submission, refusal, kill, summaries and pages of results.

use super::*;
use serde_json::json;

#[test]
fn a_submitted_job_is_accepted_and_announced() {
    let mut core = new_core(0);
    let reply = core.api(ApiRequest::SubmitJob(job(3, 1, 4)), 10);
    assert_eq!(reply, ApiReply::JobAccepted { job_id: 1 });
    assert_eq!(
        core.take_effects(),
        vec![Effect::Publish(Event::JobStart {
            time_ms: 10,
            job_id: 1,
            name: "test-job".into(),
            tasks: 3,
        })]
    );
    assert_eq!(submit(&mut core, job(1, 1, 4), 11), 2);
    let s = summary(&mut core, 1);
    assert_eq!(
        (
            s.state,
            s.tasks,
            s.running,
            s.succeeded,
            s.submitted_at_ms,
            s.ended_at_ms
        ),
        (JobState::Running, 3, 0, 0, 10, None)
    );
    let ids: Vec<_> = list_jobs(&mut core).iter().map(|j| j.job_id).collect();
    assert_eq!(ids, [1, 2]);
    assert_eq!(
        api_error(core.api(ApiRequest::GetJob { job_id: 9 }, 0)),
        "no job with id 9"
    );
    check_invariants(&core);
}

/// A python call of `function` (inline; empty for none), its args inline and perhaps also as
/// `args_object`, reading `upstream`.
pub(super) fn python_call(
    function: &str,
    args_object: Option<crate::objects::ObjectRef>,
    upstream: Vec<JobId>,
) -> TaskSpec {
    TaskSpec::Python {
        function: function.into(),
        args: "gAR9lC4=".into(),
        map: false,
        timeout_ms: None,
        function_object: None,
        args_object,
        objects: Vec::new(),
        upstream,
        no_retry_on: Vec::new(),
        retry_on: Vec::new(),
    }
}

#[test]
fn invalid_jobs_are_refused() {
    let mut core = core_with(0, 64 * 1024);
    add(&mut core, "a", 4, 1);
    let no_tasks = "a job needs at least one task (tasks is empty or repeat is 0)";
    let cases: Vec<(&str, SubmitJob, String)> = vec![
        (
            "no tasks",
            SubmitJob {
                speculation: None,
                tasks: vec![],
                ..job(1, 1, 4)
            },
            no_tasks.into(),
        ),
        ("repeat 0", job(0, 1, 4), no_tasks.into()),
        (
            "max_failures 0",
            job(1, 1, 0),
            "max_failures must be at least 1".into(),
        ),
        (
            "cpus_per_task 0",
            job(1, 0, 4),
            "cpus_per_task must be between 1 and 65536; got 0".into(),
        ),
        (
            "cpus_per_task too large",
            job(1, 65_537, 4),
            "cpus_per_task must be between 1 and 65536; got 65537".into(),
        ),
        (
            "too many tasks",
            job(10_000_001, 1, 4),
            "a job may have at most 10000000 tasks; this one has 10000001".into(),
        ),
        (
            "name too long",
            SubmitJob {
                speculation: None,
                name: "n".repeat(257),
                ..job(1, 1, 4)
            },
            "job name is longer than 256 bytes".into(),
        ),
        (
            "empty argv",
            SubmitJob {
                speculation: None,
                tasks: vec![TaskSpec::Command {
                    argv: vec![],
                    env: BTreeMap::new(),
                    cwd: None,
                    timeout_ms: None,
                    inputs: Default::default(),
                    outputs: Vec::new(),
                }],
                ..job(1, 1, 4)
            },
            "a command task needs a non-empty argv".into(),
        ),
        (
            "a python task with neither function nor function_object",
            SubmitJob {
                speculation: None,
                tasks: vec![python_call("", None, Vec::new())],
                ..job(1, 1, 4)
            },
            "a python task needs its `function` either inline or as `function_object`, not \
             both nor neither"
                .into(),
        ),
        (
            "a python task that reads a job it does not run after",
            SubmitJob {
                speculation: None,
                tasks: vec![python_call("gAR9lC4=", None, vec![7])],
                ..job(1, 1, 4)
            },
            "a python task reads the results of job 7, which the job does not run after: name \
             it in `after`"
                .into(),
        ),
        (
            "a python task with args both inline and as an object",
            SubmitJob {
                speculation: None,
                tasks: vec![python_call(
                    "gAR9lC4=",
                    Some(crate::objects::ObjectRef::of(b"args")),
                    Vec::new(),
                )],
                ..job(1, 1, 4)
            },
            "a python task needs its `args` either inline or as `args_object`, not both nor \
             neither"
                .into(),
        ),
    ];
    for (what, submission, expected) in cases {
        let reply = unchanged(&mut core, |core| {
            core.api(ApiRequest::SubmitJob(submission), 2)
        });
        assert_eq!(api_error(reply), expected, "{what}");
    }
    // A spec too large for one message.
    let huge = SubmitJob {
        speculation: None,
        tasks: vec![TaskSpec::Handler {
            name: "echo".into(),
            arg: json!("x".repeat(64 * 1024)),
        }],
        ..job(1, 1, 4)
    };
    let message = api_error(unchanged(&mut core, |core| {
        core.api(ApiRequest::SubmitJob(huge), 2)
    }));
    assert!(
        message.contains("exceeds the limit of 64512 bytes"),
        "{message}"
    );
    assert!(list_jobs(&mut core).is_empty());
    // No job id was used up.
    assert_eq!(submit(&mut core, job(1, 1, 1), 4), 1);
}

#[test]
fn with_a_journal_a_job_that_would_not_fit_in_one_record_is_refused_before_it_is_accepted() {
    let mut core = journaled_core(0);
    core.config.max_reply_bytes = 16 * 1024;
    // Each spec fits in a launch, but all of them together not in one journal record.
    let specs: Vec<_> = (0..4)
        .map(|n| TaskSpec::Handler {
            name: "echo".into(),
            arg: json!(format!("{n}{}", "x".repeat(4000))),
        })
        .collect();
    let big = SubmitJob {
        speculation: None,
        tasks: specs,
        ..job(1, 1, 4)
    };
    let message = api_error(unchanged(&mut core, |core| {
        core.api(ApiRequest::SubmitJob(big.clone()), 2)
    }));
    assert!(
        message.contains("must fit in one journal record"),
        "{message}"
    );
    assert!(
        core.take_effects().is_empty(),
        "nothing to store, nothing told"
    );
    // Without a journal there is no record to fit.
    core.config.journal = false;
    assert!(matches!(
        core.api(ApiRequest::SubmitJob(big), 3),
        ApiReply::JobAccepted { .. }
    ));
}

#[test]
fn kill_job_kills_running_tasks_and_drops_waiting_ones() {
    let mut core = new_core(0);
    add(&mut core, "a", 2, 1);
    let (job_id, _) = start(&mut core, job(4, 1, 4), 10);
    let reply = core.api(ApiRequest::KillJob { job_id }, 20);
    assert_eq!(reply, ApiReply::JobKilled { job_id });
    let effects = core.take_effects();
    check_effects(&core, &effects);
    let reason = "job 1 ended: killed by request".to_string();
    assert_eq!(
        kill_tasks(&effects),
        [
            ("a".into(), 1, 0, reason.clone()),
            ("a".into(), 2, 0, reason)
        ]
    );
    assert_eq!(
        job_ends(&effects),
        [Event::JobEnd {
            time_ms: 20,
            job_id,
            state: JobState::Killed,
            succeeded: 0,
            failed: 0,
            killed: 4,
            reason: Some("killed by request".into()),
        }]
    );
    assert_eq!(effects.len(), 3);
    let s = summary(&mut core, job_id);
    assert_eq!(
        (s.state, s.killed, s.running, s.ended_at_ms),
        (JobState::Killed, 2, 2, Some(20))
    );
    let states: Vec<_> = results(&mut core, job_id, 0, 10)
        .results
        .iter()
        .map(|o| o.state)
        .collect();
    assert_eq!(
        states,
        [
            TaskState::Running,
            TaskState::Running,
            TaskState::Killed,
            TaskState::Killed
        ]
    );
    check_invariants(&core);

    let effects = report(&mut core, "a", vec![killed(1, 0), killed(2, 0)], 30);
    assert_eq!(task_ends(&effects).len(), 2);
    assert!(job_ends(&effects).is_empty() && launches(&effects).is_empty());
    assert_eq!(free(&core, "a"), 2);
    let s = summary(&mut core, job_id);
    assert_eq!((s.state, s.killed, s.running), (JobState::Killed, 4, 0));

    // Sent again (its answer lost, say), the kill is answered as before and changes nothing.
    let reply = unchanged(&mut core, |core| {
        core.api(ApiRequest::KillJob { job_id }, 40)
    });
    assert_eq!(reply, ApiReply::JobKilled { job_id });
    let reply = unchanged(&mut core, |core| {
        core.api(ApiRequest::KillJob { job_id: 99 }, 40)
    });
    assert_eq!(api_error(reply), "no job with id 99");
    check_invariants(&core);
}

#[test]
fn killing_a_job_that_never_ran_sends_no_kills() {
    let mut core = new_core(0);
    let (job_id, _) = start(&mut core, job(3, 1, 4), 10);
    assert_eq!(
        core.api(ApiRequest::KillJob { job_id }, 20),
        ApiReply::JobKilled { job_id }
    );
    let effects = core.take_effects();
    assert!(kill_tasks(&effects).is_empty());
    assert!(matches!(
        &job_ends(&effects)[..],
        [Event::JobEnd {
            killed: 3,
            state: JobState::Killed,
            ..
        }]
    ));
    // An executor that arrives later gets nothing of it.
    let effects = add(&mut core, "a", 4, 30);
    assert!(launches(&effects).is_empty());
    check_invariants(&core);
}

#[test]
fn a_succeeded_job_cannot_be_killed() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    let (job_id, _) = start(&mut core, job(1, 1, 4), 10);
    report(&mut core, "a", vec![finished(1, 0)], 20);
    let reply = unchanged(&mut core, |core| {
        core.api(ApiRequest::KillJob { job_id }, 30)
    });
    assert_eq!(api_error(reply), "job 1 has already ended (SUCCEEDED)");
}

#[test]
fn get_results_pages_through_a_job() {
    let mut core = new_core(0);
    add(&mut core, "a", 5, 1);
    let (job_id, _) = start(&mut core, job(5, 1, 4), 10);
    report(
        &mut core,
        "a",
        vec![
            finished_with(1, 0, json!(10)),
            finished_with(2, 0, json!(20)),
            failed(4, 0, "boom"),
        ],
        20,
    );
    let page = results(&mut core, job_id, 0, 2);
    assert_eq!(page.job_id, job_id);
    assert_eq!(page.next_offset, Some(2));
    let rows: Vec<_> = page
        .results
        .iter()
        .map(|o| (o.index, o.task_id, o.result.clone()))
        .collect();
    assert_eq!(rows, [(0, 1, Some(json!(10))), (1, 2, Some(json!(20)))]);

    let page = results(&mut core, job_id, 2, 2);
    assert_eq!(page.next_offset, Some(4));
    let states: Vec<_> = page.results.iter().map(|o| (o.index, o.state)).collect();
    // Index 3 failed once and was relaunched at once (one executor): running again.
    assert_eq!(states, [(2, TaskState::Running), (3, TaskState::Running)]);
    assert_eq!(page.results[1].attempts, 2);
    assert_eq!(page.results[1].error.as_deref(), Some("boom"));

    for (offset, limit, len, next) in [
        (4, 2, 1, None),
        (10, 2, 0, None),
        // A limit of 0 still makes progress.
        (0, 0, 1, Some(1)),
    ] {
        let page = results(&mut core, job_id, offset, limit);
        assert_eq!((page.results.len(), page.next_offset), (len, next));
    }
    let request = ApiRequest::GetResults {
        job_id: 99,
        offset: 0,
        limit: 1,
    };
    assert_eq!(api_error(core.api(request, 0)), "no job with id 99");
}

#[test]
fn get_results_pages_stop_short_of_the_reply_limit() {
    let mut core = core_with(0, 2048);
    add(&mut core, "a", 4, 1);
    let (job_id, _) = start(&mut core, job(4, 1, 4), 10);
    let big = |n: usize| json!("r".repeat(n));
    report(
        &mut core,
        "a",
        vec![
            finished_with(1, 0, big(550)),
            finished_with(2, 0, big(550)),
            finished_with(3, 0, big(550)),
            finished_with(4, 0, big(5000)),
        ],
        20,
    );
    let page = results(&mut core, job_id, 0, 100);
    assert_eq!(
        page.results.len(),
        2,
        "three results of 550 bytes exceed 2048 with overhead"
    );
    assert_eq!(page.next_offset, Some(2));
    assert!(crate::protocol::encode(&ApiReply::Results(page)).len() <= 2048);
    // One result larger than the limit still comes, alone, so paging makes progress.
    let page = results(&mut core, job_id, 3, 100);
    assert_eq!((page.results.len(), page.next_offset), (1, None));
    let page = results(&mut core, job_id, 2, 100);
    assert_eq!((page.results.len(), page.next_offset), (1, Some(3)));
}

#[test]
fn an_outcome_says_when_its_attempt_started_and_how_long_it_ran() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    let (job_id, _) = start(&mut core, job(2, 1, 4), 100);
    let waiting = outcome(&mut core, job_id, 1);
    assert_eq!((waiting.started_ms, waiting.duration_ms), (None, None));
    let running = outcome(&mut core, job_id, 0);
    assert_eq!((running.started_ms, running.duration_ms), (Some(100), None));
    report(&mut core, "a", vec![finished(1, 0)], 350);
    let ended = outcome(&mut core, job_id, 0);
    assert_eq!(
        (ended.started_ms, ended.duration_ms),
        (Some(100), Some(250))
    );
    // The second task, launched on the freed core, runs with no duration yet.
    let next = outcome(&mut core, job_id, 1);
    assert_eq!((next.started_ms, next.duration_ms), (Some(350), None));
}

#[test]
fn a_task_record_stays_small_with_its_duration() {
    assert!(std::mem::size_of::<super::super::tasks::TaskRecord>() <= 40);
}

#[test]
fn recent_jobs_come_newest_first_a_page_at_a_time() {
    let mut core = new_core(0);
    for _ in 0..5 {
        submit(&mut core, job(1, 1, 4), 1);
    }
    core.take_effects();
    let page =
        |core: &mut Core, before: JobId| match unchanged(core, |c| c.recent_jobs(before, 2, 0)) {
            ApiReply::Jobs { jobs, next_job, .. } => {
                (jobs.iter().map(|j| j.job_id).collect::<Vec<_>>(), next_job)
            }
            other => panic!("not a page of jobs: {other:?}"),
        };
    assert_eq!(page(&mut core, 0), (vec![5, 4], Some(4)));
    assert_eq!(page(&mut core, 4), (vec![3, 2], Some(2)));
    assert_eq!(page(&mut core, 2), (vec![1], None));
    assert_eq!(page(&mut core, 1), (vec![], None));
}

/// `job(tasks, 1, 4)` with submission id `key`.
fn keyed(tasks: u32, key: &str) -> SubmitJob {
    SubmitJob {
        submission_id: Some(key.into()),
        ..job(tasks, 1, 4)
    }
}

#[test]
fn a_submission_sent_again_is_answered_with_the_job_it_made() {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    assert_eq!(submit(&mut core, keyed(3, "k-1"), 0), 1);
    take_journal(&mut core, &mut journal);
    let again = unchanged(&mut core, |core| {
        core.api(ApiRequest::SubmitJob(keyed(3, "k-1")), 1)
    });
    assert_eq!(again, ApiReply::JobAccepted { job_id: 1 });
    // The same key with other settings is a mistake, not a retry.
    let other = unchanged(&mut core, |core| {
        core.api(ApiRequest::SubmitJob(keyed(4, "k-1")), 1)
    });
    assert_eq!(
        api_error(other),
        "submission id \"k-1\" made job 1, which was submitted with other settings; \
         a new job needs a new submission id"
    );
    // Another key, or none, is another job.
    assert_eq!(submit(&mut core, keyed(3, "k-2"), 2), 2);
    assert_eq!(submit(&mut core, job(3, 1, 4), 2), 3);
    take_journal(&mut core, &mut journal);
    check_invariants(&core);

    // A restarted driver knows the key, from the journal and from a snapshot of it.
    let mut restarted = restored(&journal, 1);
    let again = unchanged(&mut restarted, |core| {
        core.api(ApiRequest::SubmitJob(keyed(3, "k-1")), 3)
    });
    assert_eq!(again, ApiReply::JobAccepted { job_id: 1 });
    check_invariants(&restarted);
    let mut from_snapshot = restored(&[snapshot_record(&core, 1, 4)], 1);
    let again = unchanged(&mut from_snapshot, |core| {
        core.api(ApiRequest::SubmitJob(keyed(3, "k-2")), 5)
    });
    assert_eq!(again, ApiReply::JobAccepted { job_id: 2 });
    check_invariants(&from_snapshot);
}

#[test]
fn a_forgotten_jobs_submission_id_makes_a_new_job() {
    let mut core = core_retaining(1);
    add(&mut core, "e1", 1, 0);
    for (n, key) in ["a", "b"].into_iter().enumerate() {
        let (job_id, launched) = start(&mut core, keyed(1, key), 0);
        let (task_id, _, attempt) = launched[0].1[0];
        report(&mut core, "e1", vec![finished(task_id, attempt)], 1);
        assert_eq!(job_id, n as JobId + 1);
    }
    // Job 1 ("a") was forgotten when job 2 ended: its key is free again.
    assert_eq!(submit(&mut core, keyed(1, "a"), 2), 3);
    assert_eq!(
        core.api(ApiRequest::SubmitJob(keyed(1, "b")), 2),
        ApiReply::JobAccepted { job_id: 2 }
    );
    check_invariants(&core);
}

#[test]
fn a_malformed_submission_id_is_refused() {
    let mut core = new_core(0);
    for (key, expected) in [
        ("", "a submission id may not be empty".to_string()),
        (
            "a b",
            "submission id \"a b\" has ' ': use letters, digits, '_', '-' and '.'".into(),
        ),
        (
            &"k".repeat(65),
            format!(
                "submission id \"{} [cut: 65 bytes in all]\" is longer than 64 bytes",
                "k".repeat(9)
            ),
        ),
    ] {
        let reply = unchanged(&mut core, |core| {
            core.api(ApiRequest::SubmitJob(keyed(1, key)), 0)
        });
        assert_eq!(api_error(reply), expected, "{key:?}");
    }
}
