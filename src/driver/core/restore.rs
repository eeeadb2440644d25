//! Restoring the job table from the journal a previous driver kept: [`Core::replay`] applies
//! one record, [`Core::resume`] then queues what is left to run. Replay emits nothing and is
//! idempotent, since a publish retried after a lost acknowledgement may store a record twice.
//!
//! What comes back is what the journal holds: every job with its ids, name, tasks and end, and
//! each task that ended for good with its outcome, and the retries that wait out a backoff.
//! Attempts in flight, and failures retried at once, are not journaled: those tasks run again,
//! with a fresh failure budget.

use super::jobs::{validate_job, Job, TaskStatus};
use super::snapshot::SnapshotIds;
use super::Core;
use crate::ids::{JobId, TaskId};
use crate::protocol::JobState;
use crate::protocol::{
    Event, ExecutorTasks, JournalRecord, JournaledTask, SubmitJob, TaskEnded, TaskState,
};
use serde_json::Value;

/// Why a journal record, or some entries of a `TasksEnded` record, was skipped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplayError {
    #[error("job {job_id} cannot be restored: {reason}")]
    InvalidJob { job_id: JobId, reason: String },
    #[error("job {job_id} (first task {first_task}) overlaps the ids of a job before it")]
    IdsOverlap { job_id: JobId, first_task: TaskId },
    #[error("an end of job {0}, which the journal never submitted")]
    UnknownJob(JobId),
    /// Entries of a `TasksEnded` record that were skipped; its other entries were applied.
    #[error(
        "entries skipped, the others applied: {}",
        skipped_entries(unknown, unsettled)
    )]
    EntriesSkipped {
        /// Tasks the journal never submitted.
        unknown: Vec<TaskId>,
        /// Tasks journaled in a state that does not end a task for good.
        unsettled: Vec<(TaskId, TaskState)>,
    },
    #[error(transparent)]
    Snapshot(#[from] super::snapshot::SnapshotError),
}

impl ReplayError {
    /// Whether the record was applied in part (some of its entries were), not skipped whole.
    pub fn applied_in_part(&self) -> bool {
        matches!(self, ReplayError::EntriesSkipped { .. })
    }
}

fn skipped_entries(unknown: &[TaskId], unsettled: &[(TaskId, TaskState)]) -> String {
    let mut parts = Vec::new();
    if !unknown.is_empty() {
        parts.push(format!("tasks the journal never submitted {unknown:?}"));
    }
    if !unsettled.is_empty() {
        parts.push(format!(
            "tasks in a state that does not end them for good {unsettled:?}"
        ));
    }
    parts.join("; ")
}

/// What a replay restored, for the log line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restored {
    pub jobs: usize,
    /// Jobs that had not ended, and run on.
    pub running_jobs: usize,
    /// Tasks of those jobs that will run (again).
    pub pending_tasks: u64,
    /// Whether the journal ended inside a snapshot (a driver stopped while it wrote one).
    pub incomplete_snapshot: bool,
}

impl Core {
    /// Applies one journal record. A record that does not fit what came before it is refused
    /// and changes nothing, except a `TasksEnded` record: its entries are outcomes of tasks
    /// each on its own, so those that fit are applied and the rest are named in
    /// [`ReplayError::EntriesSkipped`]. The caller logs either and goes on.
    pub fn replay(&mut self, record: JournalRecord) -> Result<(), ReplayError> {
        if !matches!(record, JournalRecord::SnapshotPart { .. }) {
            self.note_between_parts(&record);
        }
        match record {
            JournalRecord::SnapshotPart {
                snapshot,
                part,
                parts,
                next_job,
                next_task,
                records,
                ..
            } => {
                let ids = SnapshotIds {
                    next_job,
                    next_task,
                };
                self.replay_snapshot_part(snapshot, part, parts, ids, records)
            }
            JournalRecord::JobSubmitted {
                job_id,
                first_task,
                time_ms,
                job,
                term,
                tenant,
            } => self.replay_submitted(job_id, first_task, time_ms, *job, (term, tenant)),
            JournalRecord::TasksEnded { tasks, .. } => self.replay_tasks(tasks),
            JournalRecord::ResultsDropped { job_id } => self.replay_results_dropped(job_id),
            JournalRecord::TaskKilledByRequest { job_id, index, .. } => {
                self.replay_task_killed(job_id, index)
            }
            JournalRecord::TaskRetryWaits {
                job_id,
                index,
                failures,
                until_ms,
            } => self.replay_retry_wait(job_id, index, failures, until_ms),
            JournalRecord::KeyLimitsSet { key, limits, .. } => {
                self.replay_key_limits(&key, limits);
                Ok(())
            }
            // Who led changes nothing in the jobs.
            JournalRecord::Leader { .. } => Ok(()),
            JournalRecord::JobEnded {
                job_id,
                state,
                time_ms,
                reason,
            } => {
                let job = self
                    .jobs
                    .get_mut(&job_id)
                    .ok_or(ReplayError::UnknownJob(job_id))?;
                if job.is_open() {
                    job.state = state;
                    job.ended_at_ms = Some(time_ms);
                    job.reason = reason;
                    self.retire(job_id);
                }
                Ok(())
            }
        }
    }

    /// Ends the replay: the restored jobs that had not ended queue their unfinished tasks, in
    /// submission order; those that had ended count them killed.
    pub fn resume(&mut self, now: u64) -> Restored {
        let mut restored = Restored {
            jobs: self.jobs.len(),
            // A snapshot whose last part never came: the records before it stand.
            incomplete_snapshot: self.staging.take().is_some(),
            ..Restored::default()
        };
        self.queue.clear();
        self.pin_restored();
        let failing = self.resume_waiting();
        let mut done = Vec::new();
        for job in self.jobs.values_mut() {
            if job.state == JobState::Waiting {
                // It waits for the jobs it runs after: nothing of it is queued.
                restored.running_jobs += 1;
                continue;
            }
            let waiting = job.tasks.requeue_pending();
            if job.is_active() && job.succeeded + job.killed == job.len() {
                // Its last task's end was stored but not the job's (a driver that stopped
                // between two writes): it ends now rather than run on with nothing to run.
                done.push(job.id);
            } else if job.is_active() {
                restored.running_jobs += 1;
                restored.pending_tasks += u64::from(waiting);
                if waiting > 0 {
                    self.queue.push_back(job.id);
                }
            } else {
                job.killed += job.tasks.close();
            }
        }
        self.order_restored();
        for job_id in done {
            self.end_job_if_done(job_id, now);
        }
        for (job_id, reason) in failing {
            self.end_job(job_id, JobState::Failed, Some(reason), now);
        }
        self.placement_resumed(now);
        let active: Vec<JobId> = self
            .jobs
            .values()
            .filter(|job| job.is_active())
            .map(|job| job.id)
            .collect();
        for job_id in active {
            self.start_queue_clock(job_id, now);
        }
        self.start_adopting(restored.running_jobs, now);
        let ids: Vec<JobId> = self.jobs.keys().copied().collect();
        for job_id in ids {
            self.track_speculation(job_id);
        }
        restored
    }

    fn replay_submitted(
        &mut self,
        job_id: JobId,
        first_task: TaskId,
        time_ms: u64,
        submit: SubmitJob,
        (term, tenant): (Option<u64>, Option<String>),
    ) -> Result<(), ReplayError> {
        // A repeat, or a job forgotten already (a retried write stored after a snapshot).
        if self.jobs.contains_key(&job_id) || job_id < self.next_job {
            return Ok(());
        }
        // A stored record fit when it was written: its size is not checked again.
        validate_job(&submit, self.config.max_reply_bytes, false)
            .map_err(|reason| ReplayError::InvalidJob { job_id, reason })?;
        if first_task < self.next_task {
            return Err(ReplayError::IdsOverlap { job_id, first_task });
        }
        let mut job = Job::new(job_id, first_task, submit, time_ms);
        job.term = term;
        job.tenant = tenant;
        self.next_job = job_id + 1;
        self.next_task = first_task + u64::from(job.len());
        self.add_job(job);
        Ok(())
    }

    /// Marks task `index` KILLED by request, unless it has an outcome already.
    fn replay_task_killed(&mut self, job_id: JobId, index: u32) -> Result<(), ReplayError> {
        let job = self
            .jobs
            .get_mut(&job_id)
            .ok_or(ReplayError::UnknownJob(job_id))?;
        if index >= job.len() {
            return Err(ReplayError::InvalidJob {
                job_id,
                reason: format!("a kill of task {index}, past its {} tasks", job.len()),
            });
        }
        if job.tasks.kill_waiting(index) {
            job.killed += 1;
            job.errors
                .insert(index, super::jobs::KILLED_BY_REQUEST.into());
        }
        Ok(())
    }

    /// Applies every outcome of a known task that ended it for good; names the rest.
    fn replay_tasks(&mut self, tasks: Vec<JournaledTask>) -> Result<(), ReplayError> {
        let (mut unknown, mut unsettled) = (Vec::new(), Vec::new());
        for task in tasks {
            let Some((job_id, index)) = self.locate(task.task_id) else {
                // A task of a job forgotten already: one that ended after its job did.
                if task.task_id >= self.next_task {
                    unknown.push(task.task_id);
                }
                continue;
            };
            let job = self.jobs.get_mut(&job_id).expect("located");
            match settle(job, index, task) {
                Ok(Some(result)) => self.keep_result(job_id, index, Some(result), true),
                Ok(None) => {}
                Err(entry) => unsettled.push(entry),
            }
        }
        match unknown.is_empty() && unsettled.is_empty() {
            true => Ok(()),
            false => Err(ReplayError::EntriesSkipped { unknown, unsettled }),
        }
    }
}

/// Records task `index`'s final outcome, unless it has one already; returns its result, for
/// the caller to keep; an entry in a state that does not end a task is left out and returned.
fn settle(
    job: &mut Job,
    index: u32,
    task: JournaledTask,
) -> Result<Option<Value>, (TaskId, TaskState)> {
    let status = match task.state {
        TaskState::Finished => TaskStatus::Finished,
        TaskState::Failed => TaskStatus::Failed,
        state => return Err((task.task_id, state)),
    };
    let record = &mut job.tasks[index];
    match record.status {
        TaskStatus::Pending => {}
        // The attempt a kill was asked of finished first: the finish counts, as it did live.
        TaskStatus::Killed if status == TaskStatus::Finished => {
            job.killed = job.killed.saturating_sub(1);
            job.errors.remove(&index);
        }
        _ => return Ok(None),
    }
    record.status = status;
    record.attempts = task.attempt.saturating_add(1);
    record.executor = Some(task.executor_id);
    match status {
        TaskStatus::Finished => job.succeeded += 1,
        _ => job.failed += 1,
    }
    if let Some(error) = task.error {
        job.errors.insert(index, error);
    }
    if task.in_bucket {
        job.put_in_bucket(index);
    }
    if let Some(object) = task.result_object {
        job.result_bytes += object.bytes;
        job.result_objects.insert(index, object);
    }
    if !task.objects.is_empty() {
        job.outputs.insert(index, task.objects);
    }
    Ok(task.result)
}

impl Core {
    /// The events a driver published for what `records` made true, told again from the
    /// journal for a history that lacks them (see `driver::history`): a `JobStart` for each
    /// job submitted, a `TaskEnd` for each task that ended for good (its `duration_ms` 0: the
    /// journal keeps no durations), and a `JobEnd` with the job's final counts. Called after
    /// the replay; jobs forgotten since are left out. Snapshot parts and leadership marks tell
    /// nothing new.
    pub fn retell(&self, records: &[JournalRecord]) -> Vec<Event> {
        let mut events = Vec::new();
        for record in records {
            match record {
                JournalRecord::JobSubmitted {
                    job_id, time_ms, ..
                } => {
                    if let Some(job) = self.jobs.get(job_id) {
                        events.push(Event::JobStart {
                            time_ms: *time_ms,
                            job_id: *job_id,
                            name: job.name.clone(),
                            tasks: job.len(),
                        });
                    }
                }
                JournalRecord::TasksEnded {
                    time_ms,
                    tasks,
                    term,
                } => self.retell_task_ends(*time_ms, *term, tasks, &mut events),
                JournalRecord::JobEnded {
                    job_id,
                    state,
                    time_ms,
                    reason,
                } => {
                    if let Some(job) = self.jobs.get(job_id) {
                        let summary = job.summary();
                        events.push(Event::JobEnd {
                            time_ms: *time_ms,
                            job_id: *job_id,
                            state: *state,
                            succeeded: summary.succeeded,
                            failed: summary.failed,
                            killed: summary.killed,
                            reason: reason.clone(),
                        });
                    }
                }
                JournalRecord::TaskKilledByRequest { .. }
                | JournalRecord::TaskRetryWaits { .. }
                | JournalRecord::ResultsDropped { .. }
                | JournalRecord::KeyLimitsSet { .. }
                | JournalRecord::Leader { .. }
                | JournalRecord::SnapshotPart { .. } => {}
            }
        }
        events
    }

    /// One `TaskEnd` per job of `tasks`, in the order each job first appears, its entries
    /// grouped by executor.
    fn retell_task_ends(
        &self,
        time_ms: u64,
        term: u64,
        tasks: &[JournaledTask],
        events: &mut Vec<Event>,
    ) {
        let mut jobs: Vec<(JobId, Vec<ExecutorTasks<TaskEnded>>)> = Vec::new();
        for task in tasks {
            let Some((job_id, index)) = self.locate(task.task_id) else {
                continue;
            };
            let ended = TaskEnded {
                task_id: task.task_id,
                index,
                attempt: task.attempt,
                state: task.state,
                duration_ms: 0,
                error: task.error.clone(),
            };
            let at = match jobs.iter().position(|(id, _)| *id == job_id) {
                Some(at) => at,
                None => {
                    jobs.push((job_id, Vec::new()));
                    jobs.len() - 1
                }
            };
            let executors = &mut jobs[at].1;
            match executors
                .iter_mut()
                .find(|group| group.executor_id == task.executor_id)
            {
                Some(group) => group.tasks.push(ended),
                None => executors.push(ExecutorTasks {
                    executor_id: task.executor_id.clone(),
                    tasks: vec![ended],
                }),
            }
        }
        events.extend(jobs.into_iter().map(|(job_id, executors)| Event::TaskEnd {
            time_ms,
            job_id,
            executors,
            term,
        }));
    }
}
