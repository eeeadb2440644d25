//! Jobs and their tasks: submission, kill, results, and the bookkeeping of each task's attempts.

use super::tasks::Tasks;
pub use super::tasks::{TaskStatus, NO_DURATION};
use super::Core;
use crate::ids::{ExecutorId, JobId, TaskId};
use crate::objects::ObjectRef;
use crate::protocol::{
    ApiReply, Event, JobState, JobSummary, JournalRecord, ResultObject, ResultsPage, SubmitJob,
    TaskOutcome, TaskSpec, TaskState,
};
use crate::IdHasher;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// The most tasks one job may have.
pub const MAX_TASKS_PER_JOB: u64 = 10_000_000;
/// The longest job name, in bytes.
pub const MAX_NAME_LEN: usize = 256;

/// The longest `SubmitJob.submission_id`, in bytes.
pub const MAX_SUBMISSION_ID_LEN: usize = 64;

/// A job: a set of tasks with a shared failure budget and cores per task.
#[derive(Debug)]
pub struct Job {
    pub id: JobId,
    pub name: String,
    specs: Vec<Arc<TaskSpec>>,
    pub first_task: TaskId,
    pub max_failures: u32,
    pub cpus_per_task: u32,
    /// Custom resources each task needs; empty for most jobs.
    pub resources: crate::resources::Request,
    /// Where its tasks may and would rather run; none for most jobs.
    pub placement: Option<Box<super::placement::JobPlacement>>,
    /// The pool it was submitted to, if it named one, and its priority.
    pub pool: Option<String>,
    pub priority: i32,
    /// Every task's record and which of them wait for cores.
    pub tasks: Tasks,
    /// Where superseded attempts ran: (index, attempt) -> executor; for telling a late repeat
    /// from a status that was never ours.
    pub past_attempts: HashMap<(u32, u32), ExecutorId, IdHasher>,
    pub results: HashMap<u32, Value, IdHasher>,
    /// The bytes of its results counted against its cap: those `results` holds, those in the
    /// results bucket and its result objects.
    pub result_bytes: u64,
    /// What `results` holds, as JSON bytes.
    pub held_bytes: u64,
    /// Whether the results were dropped to keep all results under the driver's cap.
    pub results_dropped: bool,
    /// Which tasks have their result in the results bucket, a bit each (empty until one has).
    in_bucket: Vec<u64>,
    /// Results too large for one message, which their executors put in the object store.
    pub result_objects: HashMap<u32, ResultObject, IdHasher>,
    /// The objects tasks' results name (commands' outputs), by task: kept while the job is.
    pub outputs: HashMap<u32, Vec<ObjectRef>, IdHasher>,
    pub errors: HashMap<u32, String, IdHasher>,
    pub state: JobState,
    pub succeeded: u32,
    pub failed: u32,
    pub killed: u32,
    pub running: u32,
    pub submitted_at_ms: u64,
    pub ended_at_ms: Option<u64>,
    pub reason: Option<String>,
    /// Speculative execution, when the job asked for it.
    pub speculation: Option<Box<super::speculation::Speculation>>,
    /// How its failed tasks wait before they run again; none: at once.
    pub retry_backoff: Option<crate::protocol::RetryBackoff>,
    /// How long a task may wait to start, an attempt run, and the job last.
    pub timeouts: crate::protocol::JobTimeouts,
    /// The concurrency key its attempts count under, if it names one.
    pub concurrency_key: Option<String>,
    /// Whether its tasks start together or not at all (see `gang`).
    pub gang: bool,
    /// Whether its running attempts were told to stop, for the gang to start again together.
    pub gang_stopping: bool,
    /// When its tasks could first run: when it started, or when this driver took it over.
    pub queued_at_ms: u64,
    /// The key its client gave to make the submission safe to send again.
    pub submission_id: Option<String>,
    /// The term of the leader that accepted it, if known (see [`JournalRecord::JobSubmitted`]).
    pub term: Option<u64>,
    /// The tenant whose job it is; none for the cluster's own account's (see
    /// [`super::tenants`]).
    pub tenant: Option<String>,
    /// The jobs it runs after once they succeed, and once they end however they end.
    pub after: Vec<JobId>,
    pub after_any: Vec<JobId>,
    /// Whether its results are pinned: kept where the results bucket's limits do not reach.
    pub pin: Pin,
}

/// Whether a job's results are pinned, in the results bucket's pinned stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// No task has read them: they are where the results bucket's limits reach.
    Never,
    /// A task reads them (a python task's `upstream`): results stored from then on go to the
    /// pinned stream, those stored before were copied there, and they stay until the job is
    /// forgotten.
    Pinned,
    /// Restored from the journal, which does not say: they may be in either place.
    Unknown,
}

impl Job {
    /// A job of `submit`'s tasks, all waiting; `submit` has been validated.
    pub fn new(id: JobId, first_task: TaskId, submit: SubmitJob, now: u64) -> Self {
        let count = submit.tasks.len() as u32 * submit.repeat;
        Job {
            id,
            name: submit.name,
            specs: submit.tasks.into_iter().map(Arc::new).collect(),
            first_task,
            max_failures: submit.max_failures,
            cpus_per_task: submit.cpus_per_task,
            resources: super::gang::with_port(submit.resources, submit.gang),
            placement: super::placement::JobPlacement::new(submit.placement, now),
            pool: submit.pool,
            priority: submit.priority,
            tasks: Tasks::new(count),
            past_attempts: HashMap::default(),
            results: HashMap::default(),
            result_bytes: 0,
            held_bytes: 0,
            results_dropped: false,
            in_bucket: Vec::new(),
            result_objects: HashMap::default(),
            outputs: HashMap::default(),
            errors: HashMap::default(),
            state: JobState::Running,
            succeeded: 0,
            failed: 0,
            killed: 0,
            running: 0,
            submitted_at_ms: now,
            ended_at_ms: None,
            reason: None,
            speculation: submit
                .speculation
                .map(|config| Box::new(super::speculation::Speculation::new(config))),
            retry_backoff: submit.retry_backoff,
            timeouts: submit.timeouts,
            concurrency_key: submit.concurrency_key,
            gang: submit.gang,
            gang_stopping: false,
            queued_at_ms: now,
            submission_id: submit.submission_id,
            term: None,
            tenant: None,
            after: submit.after,
            after_any: submit.after_any,
            pin: Pin::Never,
        }
    }

    /// The jobs whose results its python tasks read (their `upstream`), each once.
    pub fn reads_results_of(&self) -> Vec<JobId> {
        Self::results_read_by(self.specs.iter().map(|spec| &**spec))
    }

    /// The jobs whose results `specs` read, each once.
    pub(super) fn results_read_by<'a>(specs: impl IntoIterator<Item = &'a TaskSpec>) -> Vec<JobId> {
        let mut read: Vec<JobId> = specs
            .into_iter()
            .filter_map(|spec| match spec {
                TaskSpec::Python { upstream, .. } => Some(upstream.iter().copied()),
                _ => None,
            })
            .flatten()
            .collect();
        read.sort_unstable();
        read.dedup();
        read
    }

    /// Where its submission id is kept, if it has one.
    pub(super) fn submission_key(&self) -> Option<String> {
        let id = self.submission_id.as_deref()?;
        Some(submission_key(self.tenant.as_deref(), id))
    }

    /// The tasks whose results are in the results bucket.
    pub fn bucket_indices(&self) -> Vec<u32> {
        let mut indices = Vec::new();
        for (word, bits) in self.in_bucket.iter().enumerate() {
            let mut bits = *bits;
            while bits != 0 {
                let bit = bits.trailing_zeros();
                indices.push(word as u32 * 64 + bit);
                bits &= bits - 1;
            }
        }
        indices
    }

    pub fn len(&self) -> u32 {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Whether its tasks may run: it runs, and neither waits nor has ended.
    pub fn is_active(&self) -> bool {
        self.state == JobState::Running
    }

    /// Whether it has not ended: it runs or waits for the jobs it runs after.
    pub fn is_open(&self) -> bool {
        !self.state.is_ended()
    }

    /// Whether any attempt of the job still runs: one a task record holds, or a speculative
    /// copy (or the loser of a pair) beside it.
    pub fn attempts_out(&self) -> bool {
        self.running > 0 || self.speculation.as_ref().is_some_and(|s| s.any_other())
    }

    /// The submission this job was made from, as the journal records it.
    pub fn submission(&self) -> SubmitJob {
        SubmitJob {
            pool: self.pool.clone(),
            priority: self.priority,
            speculation: self.speculation.as_ref().map(|s| s.config),
            retry_backoff: self.retry_backoff,
            submission_id: self.submission_id.clone(),
            name: self.name.clone(),
            tasks: self
                .specs
                .iter()
                .map(|spec| TaskSpec::clone(spec))
                .collect(),
            repeat: self.len() / self.specs.len() as u32,
            max_failures: self.max_failures,
            cpus_per_task: self.cpus_per_task,
            resources: self.submitted_resources(),
            placement: self.submitted_placement().unwrap_or_default(),
            after: self.after.clone(),
            after_any: self.after_any.clone(),
            timeouts: self.timeouts,
            concurrency_key: self.concurrency_key.clone(),
            gang: self.gang,
        }
    }

    /// The custom resources the job was submitted with: not the gang port a gang's task holds.
    fn submitted_resources(&self) -> crate::resources::Request {
        let mut resources = self.resources.clone();
        if self.gang {
            resources.remove(crate::resources::GANG_PORT);
        }
        resources
    }

    /// The placement the job was submitted with, if any (not one the driver gave it).
    fn submitted_placement(&self) -> Option<crate::placement::Placement> {
        let placement = self.placement.as_ref().filter(|p| !p.from_inputs)?;
        Some(placement.wire.clone())
    }

    /// Whether task `index`'s result is in the results bucket.
    pub fn in_bucket(&self, index: u32) -> bool {
        let (word, bit) = (index as usize / 64, index % 64);
        self.in_bucket
            .get(word)
            .is_some_and(|w| w & (1 << bit) != 0)
    }

    /// Whether any task's result is in the results bucket.
    pub fn any_in_bucket(&self) -> bool {
        self.in_bucket.iter().any(|word| *word != 0)
    }

    /// Notes that task `index`'s result is in the results bucket.
    pub fn put_in_bucket(&mut self, index: u32) {
        if self.in_bucket.is_empty() {
            self.in_bucket = vec![0; (self.len() as usize).div_ceil(64)];
        }
        self.in_bucket[index as usize / 64] |= 1 << (index % 64);
    }

    /// Drops every result it holds, to make room for newer ones; returns their bytes.
    pub fn drop_results(&mut self) -> u64 {
        let freed = std::mem::take(&mut self.held_bytes);
        self.results = HashMap::default();
        self.result_bytes -= freed;
        self.results_dropped = true;
        freed
    }

    /// The objects task `index`'s result names.
    pub fn outputs_of(&self, index: u32) -> Vec<ObjectRef> {
        self.outputs.get(&index).cloned().unwrap_or_default()
    }

    /// Every object the job refers to: those its tasks name, those their results name, and
    /// the results too large for a message.
    pub fn objects(&self) -> impl Iterator<Item = &ObjectRef> {
        let named = self.specs.iter().flat_map(|spec| spec.objects());
        let results = self.result_objects.values().map(|r| &r.object);
        named.chain(self.outputs.values().flatten()).chain(results)
    }

    /// The spec of task `index`.
    pub fn spec(&self, index: u32) -> &Arc<TaskSpec> {
        &self.specs[index as usize % self.specs.len()]
    }

    /// Which executor ran `attempt` of task `index`, if it was launched at all.
    pub fn executor_of(&self, index: u32, attempt: u32) -> Option<&ExecutorId> {
        let record = &self.tasks[index];
        if record.attempts.checked_sub(1) == Some(attempt) {
            record.executor.as_ref()
        } else {
            self.past_attempts.get(&(index, attempt))
        }
    }

    pub fn summary(&self) -> JobSummary {
        JobSummary {
            pool: self.pool.clone(),
            priority: self.priority,
            job_id: self.id,
            name: self.name.clone(),
            state: self.state,
            tasks: self.len(),
            succeeded: self.succeeded,
            failed: self.failed,
            killed: self.killed,
            running: self.running,
            submitted_at_ms: self.submitted_at_ms,
            ended_at_ms: self.ended_at_ms,
            reason: self.reason.clone(),
            waiting: None,
            placement: self.submitted_placement(),
            speculative: self.speculation.as_ref().map(|s| s.counts()),
            waits_for: Vec::new(),
            waits: Vec::new(),
            concurrency_key: self.concurrency_key.clone(),
            key_limits: None,
        }
    }

    /// Task outcomes from `offset`, at most `limit` of them and about `max_bytes` in all.
    pub fn results_page(&self, offset: u32, limit: u32, max_bytes: usize) -> ResultsPage {
        let outcomes = (offset..self.len()).map(|index| self.outcome(index));
        let (results, next) = super::page(outcomes, offset, Some(limit.max(1)), max_bytes);
        ResultsPage {
            job_id: self.id,
            results,
            next_offset: next.filter(|n| *n < self.len()),
        }
    }

    fn outcome(&self, index: u32) -> TaskOutcome {
        let record = &self.tasks[index];
        let state = task_state(record.status);
        TaskOutcome {
            index,
            task_id: self.first_task + u64::from(index),
            state,
            attempts: record.attempts,
            executor_id: record.executor.clone(),
            result: self.results.get(&index).cloned(),
            error: self.errors.get(&index).cloned(),
            result_object: self.result_objects.get(&index).cloned(),
            started_ms: (record.started_ms != 0).then_some(record.started_ms),
            duration_ms: (record.started_ms != 0 && record.duration_ms != NO_DURATION)
                .then_some(u64::from(record.duration_ms)),
        }
    }
}

impl Core {
    /// The tasks of `page` whose results are in the results bucket, for the shell to read
    /// into the page before it answers.
    pub(super) fn results_in_bucket(&self, page: &ResultsPage) -> Vec<u32> {
        let Some(job) = self.jobs.get(&page.job_id) else {
            return Vec::new();
        };
        page.results
            .iter()
            .map(|outcome| outcome.index)
            .filter(|index| job.in_bucket(*index))
            .collect()
    }

    pub(super) fn on_submit_job(&mut self, submit: SubmitJob, now: u64) -> ApiReply {
        self.on_submit_job_of(None, submit, now)
    }

    /// A submission of `tenant` (none: of the cluster's own account), whose job is its own.
    pub(super) fn on_submit_job_of(
        &mut self,
        tenant: Option<&str>,
        submit: SubmitJob,
        now: u64,
    ) -> ApiReply {
        let journal = self.config.journal;
        if let Err(message) = validate_job(&submit, self.config.max_reply_bytes, journal) {
            return ApiReply::Error { message };
        }
        if let Some(message) = self.after_refusal(&submit) {
            return ApiReply::Error { message };
        }
        if let Some(message) = self.gang_refusal(&submit) {
            return ApiReply::Error { message };
        }
        if let Some(&id) = submit
            .submission_id
            .as_ref()
            .and_then(|key| self.submissions.get(&submission_key(tenant, key)))
        {
            return self.submitted_again(id, &submit);
        }
        let id = self.next_job;
        let first_task = self.next_task;
        let term = self.config.term;
        self.journal(|| JournalRecord::JobSubmitted {
            job_id: id,
            first_task,
            time_ms: now,
            job: Box::new(submit.clone()),
            term: Some(term),
            tenant: tenant.map(str::to_string),
        });
        let mut job = Job::new(id, first_task, submit, now);
        job.term = Some(self.config.term);
        job.tenant = tenant.map(str::to_string);
        self.next_job += 1;
        self.next_task += u64::from(job.len());
        let start = Event::JobStart {
            time_ms: now,
            job_id: id,
            name: job.name.clone(),
            tasks: job.len(),
        };
        let read = job.reads_results_of();
        self.add_job(job);
        // Once the job is known, so that its tenant hears of it too.
        self.publish(start);
        self.pin_results(&read);
        self.track_speculation(id);
        self.settle_waiting(id, None, now);
        self.make_offers(None, now);
        ApiReply::JobAccepted { job_id: id }
    }

    /// The answer to a submission whose id made job `id` already: that job's id, as the
    /// first answer said (behind the same record, so it too is stored before it is told).
    fn submitted_again(&self, id: JobId, submit: &SubmitJob) -> ApiReply {
        match self.jobs.get(&id) {
            Some(job) if job.submission() == *submit => ApiReply::JobAccepted { job_id: id },
            _ => ApiReply::Error {
                message: format!(
                    "submission id {:?} made job {id}, which was submitted with other settings; \
                     a new job needs a new submission id",
                    submit.submission_id.as_deref().unwrap_or_default()
                ),
            },
        }
    }

    /// Makes a new job known by its id, its tasks' ids and its submission id.
    pub(super) fn add_job(&mut self, job: Job) {
        let id = job.id;
        if let Some(key) = job.submission_key() {
            self.submissions.insert(key, id);
        }
        self.first_tasks.insert(job.first_task, id);
        self.hold_upstreams(&job.after);
        self.set_deadline(&job);
        self.jobs.insert(id, job);
        self.placement_job_added(id);
    }

    /// `KillJob`. Killing a job that ended KILLED answers as the kill did and changes
    /// nothing, so a client may send it again when the answer was lost.
    pub(super) fn on_kill_job(&mut self, job_id: JobId, now: u64) -> ApiReply {
        match self.jobs.get(&job_id) {
            None => self.no_such_job(job_id),
            Some(job) if job.state == JobState::Killed => ApiReply::JobKilled { job_id },
            Some(job) if !job.is_open() => ApiReply::Error {
                message: format!("job {job_id} has already ended ({})", job.state),
            },
            Some(_) => {
                self.end_job(
                    job_id,
                    JobState::Killed,
                    Some("killed by request".into()),
                    now,
                );
                // Jobs that ran after it however it ended may start now.
                self.make_offers(None, now);
                ApiReply::JobKilled { job_id }
            }
        }
    }

    /// `KillJobTask`: a waiting task ends KILLED at once; a running one is told to stop, and
    /// ends KILLED when it does (or runs again, with `retry`). A kill without retry is
    /// journaled before it is answered, so a restarted driver does not run the task again.
    pub(super) fn on_kill_task(
        &mut self,
        job_id: JobId,
        index: u32,
        retry: bool,
        now: u64,
    ) -> ApiReply {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return self.no_such_job(job_id);
        };
        let error = |message: String| ApiReply::Error { message };
        if job.state == JobState::Waiting {
            return error(format!(
                "job {job_id} waits for the jobs it runs after and has no task to kill yet; \
                 kill the job instead"
            ));
        }
        if !job.is_active() {
            return error(format!("job {job_id} has already ended ({})", job.state));
        }
        if index >= job.len() {
            return error(format!(
                "job {job_id} has {}; there is no task {index} (tasks count from 0)",
                crate::text::count(job.len(), "task", "tasks")
            ));
        }
        let record = &job.tasks[index];
        let attempt = record.attempts.checked_sub(1);
        match (record.status, &record.executor) {
            (TaskStatus::Running, Some(executor)) => {
                let (executor, attempt) = (executor.clone(), attempt.unwrap_or(0));
                let task_id = job.first_task + u64::from(index);
                if retry && record.kill_requested {
                    return error(format!(
                        "task {index} of job {job_id} is being killed without retry already"
                    ));
                }
                let first = !retry && !record.kill_requested;
                job.tasks[index].kill_requested = !retry;
                if first {
                    self.journal(|| JournalRecord::TaskKilledByRequest {
                        job_id,
                        index,
                        time_ms: now,
                    });
                }
                let reason = match retry {
                    true => "killed by request; it runs again",
                    false => "killed by request",
                };
                self.send_kill(executor, task_id, attempt, reason.into());
                // Without retry, a speculative copy stops too; with it, the copy carries on
                // as the task's attempt.
                if !retry {
                    self.stop_copies(job_id, Some(index), reason);
                }
                ApiReply::TaskKilled {
                    job_id,
                    index,
                    attempt: Some(attempt),
                    retry,
                }
            }
            (TaskStatus::Pending, _) if retry => error(format!(
                "task {index} of job {job_id} waits to run: it has no attempt to kill and run again"
            )),
            (TaskStatus::Pending, _) => {
                if !job.tasks.kill_waiting(index) {
                    return error(format!("task {index} of job {job_id} does not wait"));
                }
                job.killed += 1;
                job.errors.insert(index, KILLED_BY_REQUEST.into());
                self.unqueue_if_dry(job_id);
                self.journal(|| JournalRecord::TaskKilledByRequest {
                    job_id,
                    index,
                    time_ms: now,
                });
                self.end_job_if_done(job_id, now);
                ApiReply::TaskKilled {
                    job_id,
                    index,
                    attempt: None,
                    retry,
                }
            }
            (status, _) => error(format!(
                "task {index} of job {job_id} has already ended ({})",
                task_state(status)
            )),
        }
    }

    /// The job that task `task_id` belongs to, and its index there.
    pub(super) fn locate(&self, task_id: TaskId) -> Option<(JobId, u32)> {
        let (first, job_id) = self.first_tasks.range(..=task_id).next_back()?;
        let job = self.jobs.get(job_id)?;
        let index = task_id - first;
        (index < u64::from(job.len())).then_some((*job_id, index as u32))
    }

    /// Ends a job that has not ended: pending tasks are dropped and running ones killed.
    pub(super) fn end_job(
        &mut self,
        job_id: JobId,
        state: JobState,
        reason: Option<String>,
        now: u64,
    ) {
        self.clear_deadline(job_id);
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        let mut kills = Vec::new();
        // Only a job with tasks still to offer is in the offer queue.
        let queued = job.is_active() && job.tasks.has_waiting();
        if state != JobState::Succeeded {
            job.killed += job.tasks.close();
            for (index, record) in job.tasks.launched().iter().enumerate() {
                if let (TaskStatus::Running, Some(executor)) = (record.status, &record.executor) {
                    let task_id = job.first_task + index as u64;
                    kills.push((executor.clone(), task_id, record.attempts - 1));
                }
            }
        }
        let speculative = job.speculation.is_some();
        job.state = state;
        job.ended_at_ms = Some(now);
        job.reason = reason.clone();
        if speculative {
            let why = format!("job {job_id} ended");
            self.stop_copies(job_id, None, &why);
        }
        self.journal(|| JournalRecord::JobEnded {
            job_id,
            state,
            time_ms: now,
            reason: reason.clone(),
        });
        let job = &self.jobs[&job_id];
        let end = Event::JobEnd {
            time_ms: now,
            job_id,
            state,
            succeeded: job.succeeded,
            failed: job.failed,
            killed: job.killed + kills.len() as u32,
            reason: reason.clone(),
        };
        if queued {
            self.unqueue(job_id);
        }
        self.pools_job_ended(job_id);
        let reason = reason.unwrap_or_default();
        for (executor, task_id, attempt) in kills {
            let reason = format!("job {job_id} ended: {reason}");
            self.send_kill(executor, task_id, attempt, reason);
        }
        self.publish(end);
        self.exclusion_job_ended(job_id, state, now);
        self.retire(job_id);
        self.release_dependents(job_id, now);
    }
}

/// The error a task killed by request shows.
pub(super) const KILLED_BY_REQUEST: &str = "killed by request";

/// How a task's status reads on the wire.
fn task_state(status: TaskStatus) -> TaskState {
    match status {
        TaskStatus::Pending => TaskState::Launching,
        TaskStatus::Running => TaskState::Running,
        TaskStatus::Finished => TaskState::Finished,
        TaskStatus::Failed => TaskState::Failed,
        TaskStatus::Killed => TaskState::Killed,
    }
}

/// Checks a submission against the limits; with a `journal`, it must also fit in one journal
/// record, and that record in one snapshot part, to be stored before it is accepted.
pub(super) fn validate_job(
    submit: &SubmitJob,
    max_bytes: usize,
    journal: bool,
) -> Result<(), String> {
    let count = submit.tasks.len() as u64 * u64::from(submit.repeat);
    if count == 0 {
        return Err("a job needs at least one task (tasks is empty or repeat is 0)".into());
    }
    if count > MAX_TASKS_PER_JOB {
        return Err(format!(
            "a job may have at most {MAX_TASKS_PER_JOB} tasks; this one has {count}"
        ));
    }
    if submit.name.len() > MAX_NAME_LEN {
        return Err(format!("job name is longer than {MAX_NAME_LEN} bytes"));
    }
    if submit.max_failures == 0 {
        return Err("max_failures must be at least 1".into());
    }
    if submit.cpus_per_task == 0 || submit.cpus_per_task > super::registry::MAX_CORES {
        return Err(format!(
            "cpus_per_task must be between 1 and {}; got {}",
            super::registry::MAX_CORES,
            submit.cpus_per_task
        ));
    }
    crate::resources::validate_request(&submit.resources)?;
    submit.placement.validate()?;
    super::pools::validate_submission(submit)?;
    if let Some(key) = &submit.submission_id {
        crate::text::validate_key("submission id", key, MAX_SUBMISSION_ID_LEN)?;
    }
    if let Some(speculation) = &submit.speculation {
        super::speculation::validate(speculation)?;
    }
    super::timeouts::validate(&submit.timeouts)?;
    if let Some(key) = &submit.concurrency_key {
        super::keys::validate_key(key)?;
    }
    super::gang::validate(submit)?;
    if let Some(backoff) = &submit.retry_backoff {
        super::backoff::validate(backoff)?;
    }
    // A launch of one task must fit in one message: it is one group, the spec and under 250
    // bytes of ids and framing, so 1024 bytes of room is plenty.
    let spec_limit = max_bytes.saturating_sub(1024);
    for spec in &submit.tasks {
        let size = crate::protocol::encode(spec).len();
        if size > spec_limit {
            return Err(format!(
                "a task spec of {size} bytes exceeds the limit of {spec_limit} bytes \
                 (the server's max_payload less headroom); raise max_payload in nats.conf"
            ));
        }
        if let TaskSpec::Command {
            argv,
            inputs,
            outputs,
            ..
        } = spec
        {
            if argv.is_empty() {
                return Err("a command task needs a non-empty argv".into());
            }
            for path in inputs.keys() {
                crate::objects::check_task_path("input", path)?;
            }
            for pattern in outputs {
                crate::objects::check_task_path("output pattern", pattern)?;
            }
        }
        if let TaskSpec::Python {
            function,
            args,
            function_object,
            args_object,
            upstream,
            ..
        } = spec
        {
            if let Some(job) = upstream.iter().find(|job| !submit.after.contains(job)) {
                return Err(format!(
                    "a python task reads the results of job {job}, which the job does not run \
                     after: name it in `after`"
                ));
            }
            for (what, inline, object) in [
                ("function", function, function_object),
                ("args", args, args_object),
            ] {
                if inline.is_empty() == object.is_none() {
                    return Err(format!(
                        "a python task needs its `{what}` either inline or as `{what}_object`, \
                         not both nor neither"
                    ));
                }
            }
        }
    }
    let limit = max_bytes.saturating_sub(1024);
    let size = crate::protocol::encode(submit).len();
    if journal && size > limit {
        return Err(format!(
            "the job is {size} bytes; with a journal a job must fit in one journal record, \
             {limit} bytes (the server's max_payload less headroom): raise max_payload in \
             nats.conf, or send fewer, smaller tasks (use `repeat` for identical ones)"
        ));
    }
    Ok(())
}

/// Where a submission id is kept: a tenant's apart from the cluster's own and from every other
/// tenant's (a NUL, which no submission id holds, between the two).
pub(super) fn submission_key(tenant: Option<&str>, id: &str) -> String {
    match tenant {
        None => id.to_string(),
        Some(tenant) => format!("{tenant}\0{id}"),
    }
}
