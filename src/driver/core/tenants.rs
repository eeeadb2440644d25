//! Tenants: NATS accounts other than the cluster's that reach the api through an import of its
//! service export (`ember creds --tenant`). The server names the asking account in the
//! `Nats-Request-Info` header of every request that crosses the import; the shell reads it and
//! asks here on the tenant's behalf. A tenant sees and touches only its own jobs: a job of
//! anyone else's is answered as one that does not exist, and requests about the cluster itself
//! (its executors, the object store) are refused. The events of a tenant's jobs are told to
//! it too ([`super::Effect::PublishToTenant`], made where the core publishes).

use super::{Answer, Core};
use crate::ids::JobId;
use crate::protocol::{ApiReply, ApiRequest, SubmitJob};

/// Who asks the api.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requester<'a> {
    /// A connection of the cluster's own account: everything is open to it.
    Home,
    /// A tenant, by the name of its account: its own jobs.
    Tenant(&'a str),
}

/// What a tenant is told of a request that is not open to tenants.
const NOT_FOR_TENANTS: &str = "a tenant may submit jobs and list, read, wait for and kill its \
     own (SubmitJob, ListJobs, GetJob, GetResults, KillJob, KillJobTask, ListPools); this \
     request is about the cluster, for its own account";

impl Core {
    /// Answers `request` as [`Core::answer`] does, for `requester`: a tenant's answers hold
    /// only its own jobs, and its submissions are its own.
    pub fn answer_for(&mut self, requester: Requester, request: ApiRequest, now: u64) -> Answer {
        let Requester::Tenant(tenant) = requester else {
            return self.answer(request, now);
        };
        let refused = |message: String| Answer::Reply(ApiReply::Error { message });
        match request {
            ApiRequest::SubmitJob(submit) => {
                match self.tenant_submission_refusal(tenant, &submit) {
                    Some(message) => refused(message),
                    None => Answer::Reply(self.on_submit_job_of(Some(tenant), submit, now)),
                }
            }
            ApiRequest::ListJobs {
                offset,
                limit,
                from_job,
            } => Answer::Reply(self.jobs_page(from_job, offset, limit, Some(tenant), now)),
            request @ (ApiRequest::GetJob { job_id }
            | ApiRequest::GetResults { job_id, .. }
            | ApiRequest::KillJob { job_id }
            | ApiRequest::KillJobTask { job_id, .. }) => match self.owns(tenant, job_id) {
                true => self.answer(request, now),
                false => refused(format!("no job with id {job_id}")),
            },
            request @ ApiRequest::ListPools => self.answer(request, now),
            _ => refused(NOT_FOR_TENANTS.into()),
        }
    }

    /// Whether job `job_id` is kept and is `tenant`'s.
    fn owns(&self, tenant: &str, job_id: JobId) -> bool {
        self.jobs
            .get(&job_id)
            .is_some_and(|job| job.tenant.as_deref() == Some(tenant))
    }

    /// Why a tenant's submission is refused, if it is: it may wait for and read the results of
    /// its own jobs alone, and it names no object (the object store is the cluster's).
    fn tenant_submission_refusal(&self, tenant: &str, submit: &SubmitJob) -> Option<String> {
        if let Some(id) = submit
            .after
            .iter()
            .chain(&submit.after_any)
            .find(|id| !self.owns(tenant, **id))
        {
            return Some(format!(
                "job {id}, which this job would run after, does not exist"
            ));
        }
        let reads = super::jobs::Job::results_read_by(&submit.tasks);
        if let Some(id) = reads.iter().find(|id| !self.owns(tenant, **id)) {
            return Some(format!(
                "job {id}, whose results a task reads, does not exist"
            ));
        }
        if submit
            .tasks
            .iter()
            .any(|spec| spec.objects().next().is_some())
        {
            return Some(
                "a tenant's job names no object: the object store is the cluster's own".into(),
            );
        }
        None
    }
}
