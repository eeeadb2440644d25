//! What the driver keeps of finished jobs: the last [`Retention::jobs`] of them, as Spark's
//! `spark.ui.retainedJobs` does. Older ones are forgotten, in memory and in what a snapshot
//! carries to the next driver; running and queued jobs never are. Ids keep counting up, so an
//! id below the next one that names no job was forgotten, and the api says so.

use super::Core;
use crate::ids::JobId;
use crate::protocol::{ApiReply, JobSummary};

/// Finished jobs a driver keeps unless told otherwise (Spark's `spark.ui.retainedJobs`).
pub const DEFAULT_RETAIN_JOBS: u32 = 1000;

/// How much of its past the driver keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Finished jobs kept, with their results (at least 1: a client waiting on a job reads
    /// its end).
    pub jobs: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            jobs: DEFAULT_RETAIN_JOBS as usize,
        }
    }
}

impl Core {
    /// Keeps `job_id`, which has just ended, among the finished jobs, and forgets the oldest
    /// past the limit.
    pub(super) fn retire(&mut self, job_id: JobId) {
        self.ended.push_back(job_id);
        self.trim_ended();
    }

    /// Forgets the oldest finished jobs past the limit. One whose killed attempts have not
    /// reported yet is forgotten when they have: their statuses must still find it, to give
    /// their cores back.
    fn trim_ended(&mut self) {
        let keep = self.config.retention.jobs.max(1);
        while self.ended.len() > keep {
            let Some(id) = self.ended.pop_front() else {
                break;
            };
            match self.jobs.get(&id) {
                Some(job) if job.running > 0 => self.forgetting.push(id),
                _ => self.forget(id),
            }
        }
    }

    /// Called when the last attempt of ended job `job_id` has ended: forgets it if it is past
    /// the limit already.
    pub(super) fn last_attempt_ended(&mut self, job_id: JobId) {
        if let Some(at) = self.forgetting.iter().position(|id| *id == job_id) {
            self.forgetting.swap_remove(at);
            self.forget(job_id);
        }
    }

    fn forget(&mut self, job_id: JobId) {
        if let Some(job) = self.jobs.remove(&job_id) {
            self.first_tasks.remove(&job.first_task);
        }
    }

    /// The answer about a job this driver does not hold: forgotten, or never submitted.
    pub(super) fn no_such_job(&self, job_id: JobId) -> ApiReply {
        let message = if job_id >= 1 && job_id < self.next_job {
            format!(
                "job {job_id} was forgotten: only the last {} finished jobs are kept \
                 (--retain-jobs)",
                self.config.retention.jobs.max(1)
            )
        } else {
            format!("no job with id {job_id}")
        };
        ApiReply::Error { message }
    }

    /// A page of the jobs from id `from_job` on, skipping `offset` of them: paging by id stays
    /// exact while older jobs are forgotten between pages.
    pub(super) fn jobs_page(&self, from_job: JobId, offset: u32, limit: Option<u32>) -> ApiReply {
        let listed = self.jobs.range(from_job..).skip(offset as usize);
        let (jobs, next) = super::page(
            listed.map(|(_, job)| job.summary()),
            offset,
            limit,
            self.config.max_reply_bytes,
        );
        let next_job = next.and_then(|_| self.first_job_after(&jobs, from_job, offset));
        ApiReply::Jobs {
            next_offset: next.filter(|_| next_job.is_some()),
            jobs,
            next_job,
        }
    }

    /// The id of the first job after this page, if there is one.
    fn first_job_after(&self, page: &[JobSummary], from_job: JobId, offset: u32) -> Option<JobId> {
        let after = match page.last() {
            Some(last) => self.jobs.range(last.job_id + 1..).next(),
            None => self.jobs.range(from_job..).nth(offset as usize),
        };
        after.map(|(id, _)| *id)
    }
}
