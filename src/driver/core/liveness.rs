//! Executor liveness: heartbeats and their reconciliation, loss by timeout, decommission, and
//! failing jobs that have had no executor for too long. Spark's `HeartbeatReceiver`,
//! `executorLost` and decommissioning, on the driver's side.

use super::Core;
use crate::ids::{ExecutorId, InstanceId, JobId, TaskId};
use crate::protocol::{
    ApiReply, ConnectionId, Event, ExecutorMessage, HeartbeatReply, HeartbeatRequest, JobState,
    RunningAttempt, StatusUpdate, TaskEnded, TaskState,
};
use std::collections::{BTreeMap, HashSet};

/// How the driver judges executors alive, in milliseconds.
#[derive(Debug, Clone)]
pub struct Liveness {
    /// An executor silent this long is removed and its attempts run elsewhere.
    pub executor_timeout_ms: u64,
    /// A job with no executor registered for this long fails.
    pub no_executors_timeout_ms: u64,
    /// An attempt younger than this is not yet expected in a heartbeat (its launch may be on
    /// the way).
    pub reconcile_grace_ms: u64,
    /// How long a leader that restored running jobs holds offers, so that executors still
    /// running their tasks register and have them adopted rather than run twice.
    pub adopt_wait_ms: u64,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            executor_timeout_ms: crate::DEFAULT_EXECUTOR_TIMEOUT.as_millis() as u64,
            no_executors_timeout_ms: crate::DEFAULT_NO_EXECUTORS_TIMEOUT.as_millis() as u64,
            reconcile_grace_ms: 5_000,
            adopt_wait_ms: super::DEFAULT_ADOPT_WAIT.as_millis() as u64,
        }
    }
}

impl Core {
    /// Sets how executors are judged alive.
    pub fn set_liveness(&mut self, liveness: Liveness) {
        self.liveness = liveness;
    }

    /// Handles a message on executor `subject_id`'s heartbeat subject.
    pub fn heartbeat(
        &mut self,
        subject_id: &str,
        request: HeartbeatRequest,
        now: u64,
    ) -> HeartbeatReply {
        let (executor_id, instance_id) = match &request {
            HeartbeatRequest::Heartbeat {
                executor_id,
                instance_id,
                ..
            }
            | HeartbeatRequest::DecommissionExecutor {
                executor_id,
                instance_id,
            }
            | HeartbeatRequest::ExecutorExiting {
                executor_id,
                instance_id,
            } => (executor_id.clone(), *instance_id),
        };
        if executor_id.as_str() != subject_id {
            return HeartbeatReply::Error {
                message: format!(
                    "executor id {:?} in the message does not match {subject_id:?} in the subject",
                    executor_id.as_str()
                ),
            };
        }
        if !self.is_registered_instance(&executor_id, instance_id) {
            return HeartbeatReply::HeartbeatResponse { reregister: true };
        }
        // Registered here, but registered with another driver in its own eyes: the answer to
        // its registration here never reached it. It registers again, and learns this one.
        if let HeartbeatRequest::Heartbeat {
            driver_instance: Some(theirs),
            ..
        } = &request
        {
            if *theirs != self.config.driver_instance {
                return HeartbeatReply::HeartbeatResponse { reregister: true };
            }
        }
        match request {
            HeartbeatRequest::Heartbeat {
                running,
                objects,
                connection,
                abandoned,
                ..
            } => {
                if let Err(message) = ConnectionId::check(&connection) {
                    return HeartbeatReply::Error { message };
                }
                let mut had_abandoned = false;
                if let Some(data) = self.executors.get_mut(&executor_id) {
                    data.objects = objects;
                    if connection.is_some() {
                        data.connection = connection;
                    }
                    had_abandoned = !data.abandoned.is_empty();
                }
                // With nothing abandoned, now or before, this is all it costs.
                if !abandoned.is_empty() || had_abandoned {
                    let heard = self.abandoned_heard(&executor_id, &abandoned, &running, now);
                    if let Err(message) = heard {
                        return HeartbeatReply::Error { message };
                    }
                }
                self.reconcile(&executor_id, &running, now)
            }
            HeartbeatRequest::DecommissionExecutor { .. } => {
                if let Some(data) = self.executors.get_mut(&executor_id) {
                    data.decommissioning = true;
                    data.last_seen_ms = now;
                }
            }
            HeartbeatRequest::ExecutorExiting { .. } => {
                self.remove_executor(&executor_id, "decommissioned".into(), now);
            }
        }
        HeartbeatReply::HeartbeatResponse { reregister: false }
    }

    fn is_registered_instance(&self, id: &ExecutorId, instance: InstanceId) -> bool {
        self.executors
            .get(id)
            .is_some_and(|e| e.instance_id == instance)
    }

    /// Compares what the executor runs with what the driver thinks it runs: attempts it should
    /// run but does not are lost and run again; attempts it runs that it should not are killed.
    fn reconcile(&mut self, id: &ExecutorId, reported: &[RunningAttempt], now: u64) {
        let Some(data) = self.executors.get_mut(id) else {
            return;
        };
        data.last_seen_ms = now;
        let reported: HashSet<(TaskId, u32), crate::FixedHasher> =
            reported.iter().map(|r| (r.task_id, r.attempt)).collect();
        let assigned: Vec<(TaskId, u32)> = data.running.iter().map(|(t, a)| (*t, *a)).collect();
        // An attempt abandoned there runs no more, but its end is on the way (`abandoned.rs`).
        let abandoned: Vec<(TaskId, u32)> = data
            .abandoned
            .iter()
            .filter(|x| !x.counted)
            .map(|x| (x.task_id, x.attempt))
            .collect();
        let is_abandoned = |key: &&(TaskId, u32)| abandoned.contains(key);
        let missing: Vec<(TaskId, u32)> = assigned
            .iter()
            .filter(|key| !reported.contains(key))
            .filter(|key| abandoned.is_empty() || !is_abandoned(key))
            .filter(|(task_id, attempt)| {
                self.started_before(
                    *task_id,
                    *attempt,
                    now.saturating_sub(self.liveness.reconcile_grace_ms),
                )
            })
            .copied()
            .collect();
        for (task_id, attempt) in reported {
            let ours = assigned.contains(&(task_id, attempt));
            let job_over = self
                .locate(task_id)
                .is_some_and(|(job, _)| !self.jobs[&job].is_active());
            if !ours || job_over {
                let reason = if ours {
                    "its job has ended"
                } else {
                    "not assigned to this executor"
                };
                self.send_kill(id.clone(), task_id, attempt, reason.into());
            }
        }
        if !missing.is_empty() {
            let ends = self.lose_attempts(
                id,
                &missing,
                "the executor does not run it (a lost launch)",
                now,
            );
            self.publish_lost(id, ends, now);
            self.make_offers(None, now);
        }
    }

    fn started_before(&self, task_id: TaskId, attempt: u32, time: u64) -> bool {
        self.locate(task_id).is_some_and(|(job, index)| {
            let job = &self.jobs[&job];
            // A speculative copy started after the attempt the record holds.
            let started = job
                .speculation
                .as_deref()
                .and_then(|s| s.started(index, attempt))
                .unwrap_or(job.tasks[index].started_ms);
            started <= time
        })
    }

    /// Removes an executor (idempotent): its cores leave the totals, its attempts run again
    /// elsewhere without counting as failures, and `ExecutorRemoved` says why.
    pub fn remove_executor(&mut self, id: &ExecutorId, reason: String, now: u64) {
        let Some(data) = self.executors.remove(id) else {
            return;
        };
        self.total_cores -= u64::from(data.info.total_cores);
        let running: Vec<(TaskId, u32)> = data.running.into_iter().collect();
        let ends = self.lose_attempts(
            id,
            &running,
            &format!("executor {id} removed: {reason}"),
            now,
        );
        self.publish_lost(id, ends, now);
        self.publish(Event::ExecutorRemoved {
            time_ms: now,
            executor_id: id.clone(),
            reason,
        });
        self.make_offers(None, now);
    }

    /// Ends attempts as LOST: not the task's fault, so each runs again.
    fn lose_attempts(
        &mut self,
        id: &ExecutorId,
        attempts: &[(TaskId, u32)],
        reason: &str,
        now: u64,
    ) -> BTreeMap<JobId, Vec<TaskEnded>> {
        let mut ends: BTreeMap<JobId, Vec<TaskEnded>> = BTreeMap::new();
        for &(task_id, attempt) in attempts {
            let Some((job_id, index)) = self.locate(task_id) else {
                continue;
            };
            let update = StatusUpdate {
                task_id,
                attempt,
                state: TaskState::Lost,
                result: None,
                error: Some(reason.to_string()),
                result_object: None,
                no_retry: false,
            };
            let record = &self.jobs[&job_id].tasks[index];
            let live = record.attempts.checked_sub(1) == Some(attempt)
                && record.status == super::jobs::TaskStatus::Running;
            if live {
                let (end, _) = self.end_attempt(job_id, index, id, &update, true, now);
                ends.entry(job_id).or_default().push(end);
            } else if self.jobs[&job_id].speculation.is_some() {
                if let Some((end, _)) = self.other_attempt_ended(job_id, index, id, &update, now) {
                    ends.entry(job_id).or_default().push(end);
                }
            }
        }
        ends
    }

    /// One `TaskEnd` per job for the attempts `lose_attempts` ended on executor `id`.
    fn publish_lost(&mut self, id: &ExecutorId, ends: BTreeMap<JobId, Vec<TaskEnded>>, now: u64) {
        for (job_id, tasks) in ends {
            self.publish(Event::task_end_on(id, now, job_id, self.config.term, tasks));
            // A lost attempt runs again, unless a kill without retry was asked of it: that
            // may have been the job's last task.
            self.end_job_if_done(job_id, now);
        }
    }

    /// A NATS server said that connection `closed` ended (`reason`, as the server's disconnect
    /// advisory gives it), and no heartbeat since has named another: the executor speaking
    /// through it is removed at once, as one silent past the timeout would be, and its attempts
    /// run elsewhere. A connection no executor names now (an executor that moved to another
    /// server and said so, or one already gone) changes nothing.
    pub fn connection_closed(&mut self, closed: &ConnectionId, reason: &str, now: u64) {
        let gone = self
            .executors
            .iter()
            .find(|(_, e)| e.connection.as_ref() == Some(closed))
            .map(|(id, _)| id.clone());
        if let Some(id) = gone {
            let reason = format!("its NATS connection closed ({reason})");
            self.remove_executor(&id, reason, now);
        }
    }

    /// Removes executors that have been silent too long, and fails jobs that have had no
    /// executor for too long.
    pub(super) fn expire(&mut self, now: u64) {
        let deadline = now.saturating_sub(self.liveness.executor_timeout_ms);
        let silent: Vec<ExecutorId> = self
            .executors
            .iter()
            .filter(|(_, e)| e.last_seen_ms < deadline)
            .map(|(id, _)| id.clone())
            .collect();
        for id in silent {
            let reason = format!("no heartbeat for {} ms", self.liveness.executor_timeout_ms);
            self.remove_executor(&id, reason, now);
        }
        self.fail_jobs_without_executors(now);
    }

    fn fail_jobs_without_executors(&mut self, now: u64) {
        let waiting = self.jobs.values().any(|j| j.is_active());
        if !self.executors.is_empty() || !waiting {
            self.no_executors_since = None;
            return;
        }
        let since = *self.no_executors_since.get_or_insert(now);
        if now.saturating_sub(since) < self.liveness.no_executors_timeout_ms {
            return;
        }
        let active: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.is_active())
            .map(|j| j.id)
            .collect();
        let reason = format!(
            "no executors registered for {} ms",
            self.liveness.no_executors_timeout_ms
        );
        for job_id in active {
            self.end_job(job_id, JobState::Failed, Some(reason.clone()), now);
        }
    }

    /// `StopExecutor` / `StopAllExecutors`: each executor named is told to decommission.
    pub(super) fn on_stop_executors(&mut self, only: Option<ExecutorId>) -> ApiReply {
        let targets: Vec<ExecutorId> = match only {
            Some(id) if self.executors.contains_key(&id) => vec![id],
            Some(id) => {
                return ApiReply::Error {
                    message: format!("no executor with id {id}"),
                }
            }
            None => self.executors.keys().cloned().collect(),
        };
        for id in &targets {
            self.send(
                id.clone(),
                ExecutorMessage::StopExecutor {
                    reason: "stopped by request".into(),
                },
            );
        }
        ApiReply::Stopping {
            executors: targets.len() as u32,
        }
    }
}
