//! Status updates from executors: Spark's `StatusUpdate` handling. A status counts only from the
//! executor its attempt was launched on; a repeat of one already handled is acknowledged and
//! changes nothing, so executors can resend until they hear back.

use super::jobs::TaskStatus;
use super::Core;
use crate::ids::{ExecutorId, JobId};
use crate::protocol::{
    Event, JobState, JournalRecord, JournaledTask, RefusedStatus, StatusReply, StatusRequest,
    StatusUpdate, TaskEnded, TaskState,
};
use std::collections::BTreeMap;

pub use crate::protocol::MAX_UPDATES_PER_BATCH;

/// What one update did.
enum Applied {
    /// It ended an attempt: cores were freed and an event is due; the job must end too if the
    /// task has used up its attempts (the reason).
    Ended(JobId, TaskEnded, Option<String>),
    /// It was accepted and changed nothing more (a RUNNING report, or a repeat).
    Noted,
}

impl Core {
    /// Handles a status request that arrived on the subject of `subject_id`. A batch meant for
    /// another driver instance, from an executor registered with this one, is refused whole:
    /// it was sent before this driver started, and its task ids name other tasks here.
    pub fn status_request(
        &mut self,
        subject_id: &str,
        request: StatusRequest,
        now: u64,
    ) -> StatusReply {
        let StatusRequest::StatusUpdates {
            executor_id,
            updates,
            driver_instance,
        } = request;
        let ours = self.config.driver_instance;
        let registered = self.executors.contains_key(&executor_id);
        match driver_instance {
            Some(theirs) if theirs != ours && registered && subject_id == executor_id.as_str() => {
                StatusReply::Error {
                    message: format!(
                        "this batch is for driver instance {theirs}; this driver is {ours}"
                    ),
                }
            }
            _ => self.status_updates(subject_id, &executor_id, updates, now),
        }
    }

    /// `answer` to a batch of `executor_id`, encoded as it goes out. Launches ride on the
    /// acknowledgement when it fits in one reply; when it does not, they go to the executor's
    /// inbox in a `LaunchTasks` of their own, and the acknowledgement goes without them.
    pub fn encode_status_reply(
        &mut self,
        executor_id: Option<ExecutorId>,
        mut answer: StatusReply,
    ) -> bytes::Bytes {
        let payload = crate::protocol::encode(&answer);
        if payload.len() <= self.config.max_reply_bytes {
            return payload;
        }
        match (&mut answer, executor_id) {
            (StatusReply::StatusAck { launch, .. }, Some(executor_id)) => {
                self.launch_separately(executor_id, std::mem::take(launch));
                crate::protocol::encode(&answer)
            }
            _ => payload,
        }
    }

    /// Handles a batch of status updates that arrived on the subject of `subject_id`.
    pub fn status_updates(
        &mut self,
        subject_id: &str,
        executor_id: &ExecutorId,
        updates: Vec<StatusUpdate>,
        now: u64,
    ) -> StatusReply {
        if subject_id != executor_id.as_str() {
            return StatusReply::Error {
                message: format!(
                    "executor id {:?} in the message does not match {subject_id:?} in the subject",
                    executor_id.as_str()
                ),
            };
        }
        if updates.len() > MAX_UPDATES_PER_BATCH {
            return StatusReply::Error {
                message: format!(
                    "a batch may carry at most {MAX_UPDATES_PER_BATCH} updates; got {}",
                    updates.len()
                ),
            };
        }
        // The registry's own copy of the id from here on: the attempts launched below keep it,
        // and two copies of one id compare without being read.
        let Some(registered) = self
            .executors
            .get_key_value(executor_id)
            .map(|(id, _)| id.clone())
        else {
            return StatusReply::UnknownExecutor {
                message: format!("executor {executor_id} is not registered"),
            };
        };
        let executor_id = &registered;
        if let Some(executor) = self.executors.get_mut(executor_id) {
            executor.last_seen_ms = now;
        }
        let mut accepted = 0;
        let mut refused = Vec::new();
        let mut ended: BTreeMap<JobId, Vec<TaskEnded>> = BTreeMap::new();
        let mut aborts: BTreeMap<JobId, String> = BTreeMap::new();
        let mut settled = Vec::new();
        for update in updates {
            match self.apply_status(executor_id, &update, now) {
                Ok(Applied::Ended(job_id, end, abort)) => {
                    settled.extend(self.settled(job_id, executor_id, &end));
                    ended.entry(job_id).or_default().push(end);
                    if let Some(reason) = abort {
                        aborts.entry(job_id).or_insert(reason);
                    }
                    accepted += 1;
                }
                Ok(Applied::Noted) => accepted += 1,
                Err(reason) => refused.push(RefusedStatus {
                    task_id: update.task_id,
                    attempt: update.attempt,
                    reason,
                }),
            }
        }
        if !settled.is_empty() {
            let term = self.config.term;
            self.journal(|| JournalRecord::TasksEnded {
                time_ms: now,
                tasks: settled,
                term,
            });
        }
        let freed = !ended.is_empty();
        // A failed task should rather run elsewhere, so a failure offers every executor's cores.
        let failed = ended
            .values()
            .flatten()
            .any(|end| end.state != TaskState::Finished);
        for (job_id, tasks) in ended {
            self.publish(Event::task_end_on(
                executor_id,
                now,
                job_id,
                self.config.term,
                tasks,
            ));
            // After the TaskEnd, so listeners see the failure that ended the job first.
            match aborts.remove(&job_id) {
                Some(reason) => self.end_job(job_id, JobState::Failed, Some(reason), now),
                None => self.end_job_if_done(job_id, now),
            }
        }
        if failed || self.take_offer_all() {
            self.make_offers(None, now);
        } else if freed {
            self.make_offers(Some(executor_id), now);
        }
        StatusReply::StatusAck {
            accepted,
            refused,
            launch: self.take_launches(executor_id),
        }
    }

    fn apply_status(
        &mut self,
        from: &ExecutorId,
        update: &StatusUpdate,
        now: u64,
    ) -> Result<Applied, String> {
        let Some((job_id, index)) = self.locate(update.task_id) else {
            // Task ids are handed out in one run, so one below the next that no job holds
            // belongs to a forgotten job, which has no attempt left running: a late repeat.
            if update.task_id < self.next_task && update.task_id >= 1 {
                return Ok(Applied::Noted);
            }
            return Err(format!(
                "task {} is not known to this driver",
                update.task_id
            ));
        };
        let job = &self.jobs[&job_id];
        let record = &job.tasks[index];
        let current = record.attempts.checked_sub(1);
        if job.executor_of(index, update.attempt) != Some(from) {
            return Err(format!(
                "task {} attempt {} was not launched on executor {from}",
                update.task_id, update.attempt
            ));
        }
        let live = current == Some(update.attempt) && record.status == TaskStatus::Running;
        if !update.state.is_terminal() {
            return Ok(Applied::Noted);
        }
        if !live {
            // The other attempt of a task that runs twice, or a late repeat.
            let speculative = job.speculation.is_some();
            return Ok(speculative
                .then(|| self.other_attempt_ended(job_id, index, from, update, now))
                .flatten()
                .map_or(Applied::Noted, |(end, abort)| {
                    Applied::Ended(job_id, end, abort)
                }));
        }
        if record.timed_out && update.state != TaskState::Finished {
            // Stopped for the job's attempt timeout: a failure, which may run again.
            let failed = StatusUpdate {
                state: TaskState::Failed,
                error: Some(self.timed_out_error(job_id, update.attempt)),
                result_object: None,
                no_retry: false,
                ..update.clone()
            };
            let (end, abort) = self.end_attempt(job_id, index, from, &failed, true, now);
            return Ok(Applied::Ended(job_id, end, abort));
        }
        if update.state == TaskState::Finished {
            if let Some(reason) = self.result_refusal(job_id, index, update) {
                // Run again, it would make the same result: the task fails for good.
                let failed = StatusUpdate {
                    state: TaskState::Failed,
                    error: Some(reason),
                    result: None,
                    result_object: None,
                    ..update.clone()
                };
                let (end, abort) = self.end_attempt(job_id, index, from, &failed, false, now);
                return Ok(Applied::Ended(job_id, end, abort));
            }
        }
        // A failure the task's own code said is final does not run again.
        let retry = !update.no_retry;
        let (end, abort) = self.end_attempt(job_id, index, from, update, retry, now);
        Ok(Applied::Ended(job_id, end, abort))
    }

    /// An attempt's error, cut here too, whatever the executor sent: it goes into the journal
    /// record of the task's end, the job's reason and their events, and each must fit in a
    /// message.
    pub(super) fn clipped_error(&self, update: &StatusUpdate) -> Option<String> {
        let cap = crate::text::error_cap(self.config.max_reply_bytes);
        update
            .error
            .as_deref()
            .map(|e| crate::text::clip(e, cap).into_owned())
    }

    /// Ends the live attempt of task `index`: frees its cores and records the outcome. Returns
    /// the event entry, and the reason the job must fail if the task used up its attempts
    /// (or failed where running again cannot help: `retry` false).
    pub(super) fn end_attempt(
        &mut self,
        job_id: JobId,
        index: u32,
        from: &ExecutorId,
        update: &StatusUpdate,
        retry: bool,
        now: u64,
    ) -> (TaskEnded, Option<String>) {
        let mut error = self.clipped_error(update);
        let job = self.jobs.get_mut(&job_id).expect("located above");
        let speculative = job.speculation.is_some();
        let timed = job.timeouts.attempt_timeout_ms.is_some();
        if speculative {
            if let Some(ended) = self.first_attempt_ended(job_id, index, from, update, now) {
                return ended;
            }
        }
        if timed {
            self.clear_attempt_timer(job_id, index, update.attempt);
        }
        let job = self.jobs.get_mut(&job_id).expect("located above");
        let task_id = update.task_id;
        if let Some(executor) = self.executors.get_mut(from) {
            executor.attempt_ended(task_id, job.cpus_per_task, !job.resources.is_empty(), now);
        }
        if let Some(pools) = self.pools.as_deref_mut() {
            pools.ended(job_id, job.cpus_per_task);
        }
        if let Some(key) = &job.concurrency_key {
            self.keys.ended(key);
        }
        job.running -= 1;
        let active = job.is_active();
        let record = &mut job.tasks[index];
        record.last_failed = update.state == TaskState::Failed;
        let duration_ms = now.saturating_sub(record.started_ms);
        record.duration_ms = u32::try_from(duration_ms).map_or(super::jobs::NO_DURATION - 1, |d| {
            d.min(super::jobs::NO_DURATION - 1)
        });
        let mut abort = None;
        let mut rest = None;
        // The last attempt's result is kept whatever its end (a failed command's output
        // explains the failure), and only the last one's.
        let result = update.result.clone().filter(|r| !r.is_null());
        match update.state {
            TaskState::Finished => {
                record.status = TaskStatus::Finished;
                record.kill_requested = false;
                job.succeeded += 1;
                job.errors.remove(&index);
            }
            _ if !active => {
                record.status = TaskStatus::Killed;
                job.killed += 1;
            }
            // A kill without retry was asked for: whatever else stopped it, it ends here.
            _ if record.kill_requested => {
                record.status = TaskStatus::Killed;
                job.killed += 1;
                error = Some(super::jobs::KILLED_BY_REQUEST.into());
                job.errors
                    .insert(index, super::jobs::KILLED_BY_REQUEST.into());
            }
            TaskState::Failed => {
                record.failures += 1;
                let message = error.get_or_insert_with(|| "task failed".into()).clone();
                job.errors.insert(index, message.clone());
                if !retry || record.failures >= job.max_failures {
                    record.status = TaskStatus::Failed;
                    job.failed += 1;
                    abort = Some(format!(
                        "task {index} failed {}; last error: {message}",
                        crate::text::times(record.failures)
                    ));
                } else {
                    record.status = TaskStatus::Pending;
                    match job.retry_backoff {
                        Some(backoff) => rest = Some((record.failures, backoff)),
                        None => job.tasks.wait_again(index),
                    }
                }
            }
            // Killed or lost while the job runs: not the task's fault, so run it again.
            _ => {
                record.status = TaskStatus::Pending;
                job.tasks.wait_again(index);
            }
        }
        let last_of_ended = !active && !job.attempts_out();
        // A failure counts against the executor only when its task runs again.
        if self.exclusion.is_some()
            && update.state == TaskState::Failed
            && job.tasks[index].status == TaskStatus::Pending
        {
            self.note_failure(
                job_id,
                index,
                from,
                error.as_deref().unwrap_or_default(),
                now,
            );
        }
        if let Some((failures, backoff)) = rest {
            self.rest_retry(job_id, index, failures, backoff, now);
        }
        self.keep_outputs(job_id, index, update.result.as_ref());
        self.keep_result(job_id, index, result, false);
        if let Some(object) = update.result_object.clone() {
            self.keep_result_object(job_id, index, object);
        }
        let job = self.jobs.get_mut(&job_id).expect("located above");
        // A gang whose attempt will run again starts again whole: its others stop, once the
        // rest of the batch is in (an attempt it ends is not told to stop).
        if job.gang && active && job.tasks[index].status == TaskStatus::Pending {
            self.gangs_to_stop.push(job_id);
        }
        if active && job.tasks.has_waiting() && !self.queue.contains(&job_id) {
            // Keep the queue in its order: a retry does not jump ahead of older jobs.
            self.enqueue(job_id);
        }
        if last_of_ended {
            self.last_attempt_ended(job_id);
        }
        if speculative {
            self.after_attempt_ended(job_id, index);
        }
        (
            TaskEnded {
                task_id,
                index,
                attempt: update.attempt,
                state: update.state,
                duration_ms,
                error,
            },
            abort,
        )
    }

    /// The journal's entry for an attempt that ended its task for good (FINISHED, or FAILED
    /// the last time) on executor `from`; none for one that will run again, or when nothing
    /// keeps a journal.
    fn settled(&self, job_id: JobId, from: &ExecutorId, end: &TaskEnded) -> Option<JournaledTask> {
        let job = self.jobs.get(&job_id).filter(|_| self.config.journal)?;
        let record = &job.tasks[end.index];
        // Only the attempt that ended the task: not the loser of a speculative pair.
        let ended_it = record.attempts == end.attempt + 1;
        let settled = matches!(record.status, TaskStatus::Finished | TaskStatus::Failed);
        (settled && ended_it).then(|| JournaledTask {
            task_id: end.task_id,
            attempt: end.attempt,
            executor_id: from.clone(),
            state: end.state,
            result: job.results.get(&end.index).cloned(),
            error: job.errors.get(&end.index).cloned(),
            in_bucket: job.in_bucket(end.index),
            result_object: job.result_objects.get(&end.index).cloned(),
            objects: job.outputs_of(end.index),
        })
    }

    /// Ends job `job_id` if it runs and every task has ended: SUCCEEDED if all finished, KILLED
    /// if some were killed by request (a running job's tasks end KILLED no other way).
    pub(super) fn end_job_if_done(&mut self, job_id: JobId, now: u64) {
        let Some(job) = self.jobs.get(&job_id).filter(|j| j.is_active()) else {
            return;
        };
        if job.succeeded + job.killed != job.len() {
            return;
        }
        if job.killed == 0 {
            self.end_job(job_id, JobState::Succeeded, None, now);
        } else {
            let reason = format!(
                "{} killed by request; the other {} finished",
                crate::text::count(job.killed, "task", "tasks"),
                job.succeeded
            );
            self.end_job(job_id, JobState::Killed, Some(reason), now);
        }
    }

    /// Takes back what an ended attempt held on `executor` (if it is still registered), and
    /// takes its cores off its job's pool's count: for the ends of speculative copies, which
    /// hold no job. A task's own attempt does the same in `end_attempt`.
    pub(super) fn free_attempt(
        &mut self,
        job_id: JobId,
        executor: &ExecutorId,
        task_id: crate::ids::TaskId,
        cpus: u32,
        resources: bool,
        now: u64,
    ) {
        if let Some(data) = self.executors.get_mut(executor) {
            data.attempt_ended(task_id, cpus, resources, now);
        }
        if let Some(pools) = self.pools.as_deref_mut() {
            pools.ended(job_id, cpus);
        }
        if let Some(key) = self
            .jobs
            .get(&job_id)
            .and_then(|j| j.concurrency_key.as_ref())
        {
            self.keys.ended(key);
        }
    }
}
