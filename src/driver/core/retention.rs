//! What the driver keeps of finished jobs: the last [`Retention::jobs`] of them, as Spark's
//! `spark.ui.retainedJobs` does. Older ones are forgotten, in memory and in what a snapshot
//! carries to the next driver; running and queued jobs never are. Ids keep counting up, so an
//! id below the next one that names no job was forgotten, and the api says so.

use super::jobs::{Job, Pin, TaskStatus};
use super::ReplayError;
use super::{Core, Effect};
use crate::ids::JobId;
use crate::protocol::{ApiReply, JobSummary, JournalRecord, ResultObject, StatusUpdate};
use serde_json::Value;

/// Finished jobs a driver keeps unless told otherwise (Spark's `spark.ui.retainedJobs`).
pub const DEFAULT_RETAIN_JOBS: u32 = 1000;

/// Bytes of task results the driver holds in all, unless told otherwise.
pub const DEFAULT_MAX_RESULT_BYTES: u64 = 256 << 20;
/// Bytes of task results one job may hold (Spark's `spark.driver.maxResultSize`).
pub const DEFAULT_MAX_JOB_RESULT_BYTES: u64 = 64 << 20;

/// How much of its past the driver keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Finished jobs kept, with their results (at least 1: a client waiting on a job reads
    /// its end).
    pub jobs: usize,
    /// Bytes of results held in all: past it, the oldest finished jobs' results are dropped.
    pub result_bytes: u64,
    /// Bytes of results one job may hold: results past it are refused, the tasks still count.
    pub job_result_bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            jobs: DEFAULT_RETAIN_JOBS as usize,
            result_bytes: DEFAULT_MAX_RESULT_BYTES,
            job_result_bytes: DEFAULT_MAX_JOB_RESULT_BYTES,
        }
    }
}

/// The note a task's error gets when its result of `size` bytes is past job `job_id`'s `cap`.
fn refused_note(size: u64, job_id: JobId, cap: u64) -> String {
    format!(
        "result of {size} bytes refused: job {job_id}'s results may take {} \
         (--max-job-result-bytes)",
        mib(cap)
    )
}

/// The size of `value` as JSON, counted without building it.
fn json_size(value: &Value) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len() as u64;
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_or(0, |()| count.0)
}

/// "64 MiB", for messages about the caps.
fn mib(bytes: u64) -> String {
    match bytes % (1 << 20) {
        0 => format!("{} MiB", bytes >> 20),
        _ => format!("{bytes} bytes"),
    }
}

impl Core {
    /// Keeps `job_id`, which has just ended, among the finished jobs, and forgets the oldest
    /// past the limit.
    pub(super) fn retire(&mut self, job_id: JobId) {
        let upstreams = self
            .jobs
            .get(&job_id)
            .map(|job| job.after.clone())
            .unwrap_or_default();
        self.let_go_of_upstreams(&upstreams);
        self.ended.push_back(job_id);
        self.trim_ended();
    }

    /// A new job runs after `upstreams`: they are kept, with their results, until it ends.
    pub(super) fn hold_upstreams(&mut self, upstreams: &[JobId]) {
        for id in upstreams {
            *self.readers.entry(*id).or_default() += 1;
        }
    }

    /// A new job's python tasks read the results of the jobs `read`: each is pinned, and the
    /// results it has in the bucket already are copied to the pinned stream.
    pub(super) fn pin_results(&mut self, read: &[JobId]) {
        if !self.config.results_bucket {
            return;
        }
        for id in read {
            let Some(job) = self.jobs.get_mut(id) else {
                continue;
            };
            if job.pin == Pin::Pinned {
                continue;
            }
            job.pin = Pin::Pinned;
            let indices = job.bucket_indices();
            if !indices.is_empty() {
                self.effects.push(Effect::PinResults {
                    job_id: *id,
                    indices,
                });
            }
        }
    }

    /// After a restart: the journal does not say where each job's results are, so each may be
    /// pinned, and those the open jobs read are pinned again (copied where they are not yet).
    pub(super) fn pin_restored(&mut self) {
        if !self.config.results_bucket {
            return;
        }
        let mut read = Vec::new();
        for job in self.jobs.values_mut() {
            job.pin = Pin::Unknown;
            if job.is_open() {
                read.extend(job.reads_results_of());
            }
        }
        read.sort_unstable();
        read.dedup();
        self.pin_results(&read);
    }

    /// A job that ran after `upstreams` has ended: one no other open job runs after, kept
    /// past the limit only for it, is forgotten now.
    fn let_go_of_upstreams(&mut self, upstreams: &[JobId]) {
        for id in upstreams {
            match self.readers.get_mut(id) {
                Some(count) if *count > 1 => *count -= 1,
                Some(_) => {
                    self.readers.remove(id);
                    if let Some(at) = self.held.iter().position(|held| held == id) {
                        self.held.swap_remove(at);
                        self.let_go(*id);
                    }
                }
                None => {}
            }
        }
    }

    /// Whether an open job runs after `job_id`: it and its results are kept.
    pub(super) fn is_read(&self, job_id: JobId) -> bool {
        self.readers.contains_key(&job_id)
    }

    /// Forgets the oldest finished jobs past the limit. One whose killed attempts have not
    /// reported yet is forgotten when they have: their statuses must still find it, to give
    /// their cores back. One an open job runs after is forgotten once no open job does.
    fn trim_ended(&mut self) {
        let keep = self.config.retention.jobs.max(1);
        while self.ended.len() > keep {
            let Some(id) = self.ended.pop_front() else {
                break;
            };
            if self.is_read(id) {
                self.held.push(id);
            } else {
                self.let_go(id);
            }
        }
    }

    /// Forgets `job_id`, past the limit, now or once its killed attempts have reported.
    fn let_go(&mut self, job_id: JobId) {
        match self.jobs.get(&job_id) {
            Some(job) if job.attempts_out() => self.forgetting.push(job_id),
            _ => self.forget(job_id),
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
            if let Some(key) = job.submission_key() {
                self.submissions.remove(&key);
            }
            self.result_bytes -= job.held_bytes;
            if job.pin != Pin::Never && job.any_in_bucket() {
                self.effects.push(Effect::UnpinResults { job_id });
            }
        }
    }

    /// Why the result a FINISHED `update` brings for task `index` cannot be kept, if it
    /// cannot: it would take the job past its cap. Such a task fails with this reason rather
    /// than succeed without its result.
    pub(super) fn result_refusal(
        &self,
        job_id: JobId,
        index: u32,
        update: &StatusUpdate,
    ) -> Option<String> {
        let job = self.jobs.get(&job_id)?;
        let cap = self.config.retention.job_result_bytes;
        // An inline result came in one message: where a whole message fits, so does it, and
        // it is not measured twice (keep_result measures what it keeps).
        let message = (self.config.max_reply_bytes + crate::PAYLOAD_HEADROOM) as u64;
        let size = match (&update.result, &update.result_object) {
            (_, Some(object)) => object.bytes,
            (Some(_), None) if job.result_bytes + message <= cap => return None,
            (Some(result), None) if !result.is_null() => json_size(result),
            _ => return None,
        };
        // What an earlier attempt of the task left (a failed command's output) is replaced.
        let held = job.results.get(&index).map_or(0, json_size);
        (job.result_bytes - held + size > cap).then(|| {
            format!(
                "the task's result of {size} bytes is over job {job_id}'s limit: its \
                 results may take {} in all (--max-job-result-bytes), {} taken already",
                mib(cap),
                job.result_bytes - held
            )
        })
    }

    /// Keeps the result an executor put in the object store as task `index`'s, once the task
    /// has ended for good and within the job's cap (refused with a note in the task's error
    /// past it: a failed attempt's; a finished one past it has failed the task).
    pub(super) fn keep_result_object(&mut self, job_id: JobId, index: u32, object: ResultObject) {
        let cap = self.config.retention.job_result_bytes;
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        let settled = matches!(
            job.tasks[index].status,
            TaskStatus::Finished | TaskStatus::Failed
        );
        if !settled {
            return;
        }
        if job.result_bytes + object.bytes > cap {
            job.errors
                .insert(index, refused_note(object.bytes, job_id, cap));
            return;
        }
        job.result_bytes += object.bytes;
        job.result_objects.insert(index, object);
    }

    /// Keeps `result` as task `index`'s (none clears it): within the job's cap, or refused
    /// with a note in the task's error; then, past the cap of all results, drops the results
    /// of the oldest finished jobs, and journals that it did unless `replaying`.
    pub(super) fn keep_result(
        &mut self,
        job_id: JobId,
        index: u32,
        result: Option<Value>,
        replaying: bool,
    ) {
        let cap = self.config.retention.job_result_bytes;
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        if let Some(old) = job.results.remove(&index) {
            let size = json_size(&old);
            job.result_bytes -= size;
            job.held_bytes -= size;
            self.result_bytes -= size;
        }
        let Some(result) = result else {
            return;
        };
        let size = json_size(&result);
        let to_bucket = self.config.results_bucket && !replaying;
        let settled = matches!(
            job.tasks[index].status,
            TaskStatus::Finished | TaskStatus::Failed
        );
        if to_bucket && !settled {
            // The bucket takes a task's result once, when the task has ended for good.
            return;
        }
        if job.result_bytes + size > cap {
            job.errors.insert(index, refused_note(size, job_id, cap));
            return;
        }
        job.result_bytes += size;
        if to_bucket {
            job.put_in_bucket(index);
            let pinned = job.pin == Pin::Pinned;
            self.effects.push(Effect::StoreResult {
                job_id,
                index,
                result,
                pinned,
            });
            return;
        }
        job.results.insert(index, result);
        job.held_bytes += size;
        self.result_bytes += size;
        self.trim_results(replaying);
    }

    /// Drops the results of the oldest finished jobs while all results pass the cap.
    fn trim_results(&mut self, replaying: bool) {
        let cap = self.config.retention.result_bytes;
        let mut at = 0;
        while self.result_bytes > cap && at < self.ended.len() {
            let id = self.ended[at];
            at += 1;
            if self.is_read(id) {
                continue;
            }
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            if job.held_bytes > 0 {
                self.result_bytes -= job.drop_results();
                if !replaying {
                    self.journal(|| JournalRecord::ResultsDropped { job_id: id });
                }
            }
        }
    }

    /// Replays the drop of job `job_id`'s results.
    pub(super) fn replay_results_dropped(&mut self, job_id: JobId) -> Result<(), ReplayError> {
        let job = match self.jobs.get_mut(&job_id) {
            Some(job) => job,
            None if job_id < self.next_job => return Ok(()),
            None => return Err(ReplayError::UnknownJob(job_id)),
        };
        self.result_bytes -= job.drop_results();
        Ok(())
    }

    /// The answer for the results of a job whose results were dropped.
    pub(super) fn results_dropped(&self, job_id: JobId) -> ApiReply {
        ApiReply::Error {
            message: format!(
                "the results of job {job_id} were dropped: finished jobs' results are kept up \
                 to {} in all, oldest dropped first (--max-result-bytes)",
                mib(self.config.retention.result_bytes)
            ),
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
    /// exact while older jobs are forgotten between pages. With `tenant`, only its jobs.
    pub(super) fn jobs_page(
        &self,
        from_job: JobId,
        offset: u32,
        limit: Option<u32>,
        tenant: Option<&str>,
        now: u64,
    ) -> ApiReply {
        let listed = self.listed_jobs(from_job, tenant).skip(offset as usize);
        let (jobs, next) = super::page(
            listed.map(|job| self.job_summary(job, now)),
            offset,
            limit,
            self.config.max_reply_bytes,
        );
        let next_job = next.and_then(|_| self.first_job_after(&jobs, from_job, offset, tenant));
        ApiReply::Jobs {
            next_offset: next.filter(|_| next_job.is_some()),
            jobs,
            next_job,
        }
    }

    /// The newest `limit` jobs before job `before` (0: the newest of all), newest first, as
    /// `Jobs` whose `next_job` is the `before` of the page after it, if there are older jobs:
    /// what a page that shows the latest jobs first asks for.
    pub fn recent_jobs(&self, before: JobId, limit: u32, now: u64) -> ApiReply {
        let end = if before == 0 { JobId::MAX } else { before };
        let listed = self
            .jobs
            .range(..end)
            .rev()
            .map(|(_, job)| self.job_summary(job, now));
        let (jobs, next) = super::page(listed, 0, Some(limit.max(1)), self.config.max_reply_bytes);
        ApiReply::Jobs {
            next_offset: None,
            next_job: next.and_then(|_| jobs.last().map(|job| job.job_id)),
            jobs,
        }
    }

    /// The jobs from id `from_job` on, in order; with `tenant`, only its jobs.
    fn listed_jobs<'a>(
        &'a self,
        from_job: JobId,
        tenant: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Job> + 'a {
        self.jobs
            .range(from_job..)
            .map(|(_, job)| job)
            .filter(move |job| tenant.is_none() || job.tenant.as_deref() == tenant)
    }

    /// The id of the first job after this page, if there is one.
    fn first_job_after(
        &self,
        page: &[JobSummary],
        from_job: JobId,
        offset: u32,
        tenant: Option<&str>,
    ) -> Option<JobId> {
        let (start, skipped) = match page.last() {
            Some(last) => (last.job_id + 1, 0),
            None => (from_job, offset as usize),
        };
        let after = self.listed_jobs(start, tenant).nth(skipped);
        after.map(|job| job.id)
    }
}
