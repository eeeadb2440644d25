//! Tenants: each sees and touches only its own jobs, through every request on jobs and across a
//! restore; the cluster's own account sees them all; the rest of the api is not for tenants.

use super::*;
use crate::driver::core::{Answer, Requester};

const ACME: Requester = Requester::Tenant("EMBER_c_TENANT_acme");
const GLOBEX: Requester = Requester::Tenant("EMBER_c_TENANT_globex");

fn ask(core: &mut Core, who: Requester, request: ApiRequest) -> ApiReply {
    match core.answer_for(who, request, 0) {
        Answer::Reply(reply) => reply,
        Answer::Results(read) => ApiReply::Results(read.page),
    }
}

fn submit_as(core: &mut Core, who: Requester, submission: SubmitJob) -> JobId {
    match ask(core, who, ApiRequest::SubmitJob(submission)) {
        ApiReply::JobAccepted { job_id } => job_id,
        other => panic!("submission refused: {other:?}"),
    }
}

fn listed(core: &mut Core, who: Requester) -> Vec<JobId> {
    let request = ApiRequest::ListJobs {
        offset: 0,
        limit: None,
        from_job: 0,
    };
    match ask(core, who, request) {
        ApiReply::Jobs { jobs, .. } => jobs.iter().map(|job| job.job_id).collect(),
        other => panic!("{other:?}"),
    }
}

fn refusal(reply: ApiReply) -> String {
    match reply {
        ApiReply::Error { message } => message,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn a_tenant_sees_and_touches_only_its_own_jobs() {
    let mut core = journaled_core(0);
    let acme = submit_as(&mut core, ACME, job(2, 1, 4));
    let home = submit(&mut core, job(2, 1, 4), 0);
    let globex = submit_as(&mut core, GLOBEX, job(2, 1, 4));
    assert_eq!(listed(&mut core, ACME), vec![acme]);
    assert_eq!(listed(&mut core, GLOBEX), vec![globex]);
    assert_eq!(listed(&mut core, Requester::Home), vec![acme, home, globex]);
    for other in [home, globex] {
        let asked = [
            ApiRequest::GetJob { job_id: other },
            ApiRequest::GetResults {
                job_id: other,
                offset: 0,
                limit: 10,
            },
            ApiRequest::KillJob { job_id: other },
            ApiRequest::KillJobTask {
                job_id: other,
                index: 0,
                retry: false,
            },
        ];
        for request in asked {
            let message = refusal(ask(&mut core, ACME, request));
            assert_eq!(message, format!("no job with id {other}"));
        }
    }
    assert_eq!(
        summary(&mut core, globex).state,
        JobState::Running,
        "not killed"
    );
    assert!(matches!(
        ask(&mut core, ACME, ApiRequest::GetJob { job_id: acme }),
        ApiReply::Job { job } if job.job_id == acme
    ));
    assert!(matches!(
        ask(&mut core, ACME, ApiRequest::KillJob { job_id: acme }),
        ApiReply::JobKilled { .. }
    ));
    assert_eq!(summary(&mut core, acme).state, JobState::Killed);
}

#[test]
fn a_tenant_may_not_wait_for_or_read_another_accounts_job_nor_reuse_its_submission_id() {
    let mut core = journaled_core(0);
    let home = submit(&mut core, job(1, 1, 4), 0);
    let mut after = job(1, 1, 4);
    after.after = vec![home];
    let message = refusal(ask(&mut core, ACME, ApiRequest::SubmitJob(after)));
    assert_eq!(
        message,
        format!("job {home}, which this job would run after, does not exist")
    );
    let mut keyed = job(1, 1, 4);
    keyed.submission_id = Some("nightly".into());
    let globex = submit_as(&mut core, GLOBEX, keyed.clone());
    // The same key from another tenant makes another job, not the first one's id.
    let acme = submit_as(&mut core, ACME, keyed.clone());
    assert_ne!(acme, globex);
    assert_eq!(
        submit_as(&mut core, ACME, keyed),
        acme,
        "sent again: the same job"
    );
}

#[test]
fn the_cluster_part_of_the_api_is_refused_to_tenants() {
    let mut core = journaled_core(0);
    add(&mut core, "e1", 2, 0);
    let before = fingerprint(&core);
    for request in [
        ApiRequest::list_executors(),
        ApiRequest::StopAllExecutors,
        ApiRequest::StopExecutor {
            executor_id: eid("e1"),
        },
        ApiRequest::ReleaseExecutor {
            executor_id: eid("e1"),
        },
        // Concurrency keys are the cluster's: a tenant may not set their limits.
        ApiRequest::SetKeyLimits {
            key: "api".into(),
            limits: crate::protocol::KeyLimits {
                max_concurrent: Some(1),
                rate: None,
            },
        },
        ApiRequest::ListKeys,
    ] {
        let message = refusal(ask(&mut core, ACME, request));
        assert!(message.starts_with("a tenant may submit jobs"), "{message}");
    }
    assert_eq!(fingerprint(&core), before, "nothing changed");
}

#[test]
fn a_jobs_tenant_is_kept_through_the_journal_and_a_snapshot() {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    let acme = submit_as(&mut core, ACME, job(2, 1, 4));
    let home = submit(&mut core, job(2, 1, 4), 0);
    take_journal(&mut core, &mut journal);
    let mut replayed = restored(&journal, 1);
    assert_eq!(listed(&mut replayed, ACME), vec![acme]);
    let snapshot = [snapshot_record(&core, 1, 0)];
    let mut from_snapshot = restored(&snapshot, 1);
    assert_eq!(listed(&mut from_snapshot, ACME), vec![acme]);
    assert_eq!(
        listed(&mut from_snapshot, Requester::Home),
        vec![acme, home]
    );
}

/// The events `effects` tell each tenant, in order, by the tenant's account.
fn told_tenants(effects: &[Effect]) -> Vec<(String, Event)> {
    effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::PublishToTenant { tenant, event } => Some((tenant.clone(), event.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_tenant_is_told_every_event_of_its_own_jobs_and_nothing_of_others() {
    let mut core = journaled_core(0);
    add(&mut core, "e1", 2, 0);
    let acme = submit_as(&mut core, ACME, job(1, 1, 4));
    let home = submit(&mut core, job(1, 1, 4), 0);
    let mut effects = core.take_effects();
    let ran: Vec<_> = launches(&effects)
        .into_iter()
        .flat_map(|(_, tasks)| tasks)
        .collect();
    for (task_id, _, attempt) in ran {
        effects.extend(report(&mut core, "e1", vec![finished(task_id, attempt)], 1));
    }
    let told = told_tenants(&effects);
    let acme_events: Vec<Event> = events(&effects)
        .into_iter()
        .filter(|event| event.job_id() == Some(acme))
        .collect();
    assert_eq!(
        acme_events.iter().map(Event::kind).collect::<Vec<_>>(),
        ["job.start", "task.start", "task.end", "job.end"]
    );
    // Each of them, to acme alone, in the order the listeners hear them.
    let expected: Vec<(String, Event)> = acme_events
        .into_iter()
        .map(|event| ("EMBER_c_TENANT_acme".to_string(), event))
        .collect();
    assert_eq!(told, expected);
    assert!(told.iter().all(|(_, event)| event.job_id() != Some(home)));
}
