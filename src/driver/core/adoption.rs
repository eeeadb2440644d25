//! Adoption: a new leader takes over the attempts its predecessors launched that still run,
//! rather than run their tasks again. An executor that registers with a driver other than the
//! one it was registered with lists the attempts it holds, each named `(task_id, attempt,
//! term)`; the driver adopts those its journal says it may, each under a new attempt number
//! of its own term, and the executor drops the rest. Until executors have had time to come
//! back, a leader that restored running jobs holds its offers, so that a task still running on
//! an executor that has not registered yet is not started a second time elsewhere.

use super::jobs::TaskStatus;
use super::Core;
use crate::ids::{ExecutorId, JobId};
use crate::protocol::{Adopted, Event, ExecutorTasks, RunningAttempt, TaskStarted};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long a leader that restored running jobs holds offers for executors to register again
/// and have their attempts adopted: longer than an executor's heartbeat interval (2 s by
/// default), after which it hears that the driver does not know it.
pub const DEFAULT_ADOPT_WAIT: Duration = Duration::from_secs(3);

impl Core {
    /// After a replay: holds offers for the adoption wait, if jobs run on that executors may
    /// still be running tasks of.
    pub(super) fn start_adopting(&mut self, running_jobs: usize, now: u64) {
        let wait = self.liveness.adopt_wait_ms;
        if self.config.term > 0 && running_jobs > 0 && wait > 0 {
            self.adopting_until = Some(now.saturating_add(wait));
        }
    }

    /// Whether offers are still held for adoption at `now`; the hold ends for good the first
    /// time they are not.
    pub(super) fn adopting(&mut self, now: u64) -> bool {
        match self.adopting_until {
            Some(until) if now < until => true,
            Some(_) => {
                self.adopting_until = None;
                false
            }
            None => false,
        }
    }

    /// When offers held for adoption are made, if they are held.
    pub fn adopting_until(&self) -> Option<u64> {
        self.adopting_until
    }

    /// Adopts what a newly registered executor holds of earlier terms, as far as it may, and
    /// returns what it adopted. The attempts adopted start under this term (a `TaskStart`
    /// each) as if launched here, holding their cores; the rest the executor drops.
    pub(super) fn adopt_held(
        &mut self,
        executor: &ExecutorId,
        held: &[RunningAttempt],
        now: u64,
    ) -> Vec<Adopted> {
        let mut adopted = Vec::new();
        if self.config.term == 0 {
            return adopted;
        }
        // Of several attempts of one task (an ended one not yet acknowledged, and the one that
        // ran after it), the newest.
        let mut newest: BTreeMap<_, &RunningAttempt> = BTreeMap::new();
        for attempt in held.iter().filter(|a| a.term < self.config.term) {
            let entry = newest.entry(attempt.task_id).or_insert(attempt);
            if (attempt.term, attempt.attempt) > (entry.term, entry.attempt) {
                *entry = attempt;
            }
        }
        let mut started: BTreeMap<JobId, Vec<TaskStarted>> = BTreeMap::new();
        for held in newest.into_values() {
            let Some((job_id, index)) = self.adoptable(executor, held) else {
                continue;
            };
            let new_attempt = self.start_attempt(job_id, index, executor, now);
            self.hand_out(job_id, index, new_attempt, executor);
            started.entry(job_id).or_default().push(TaskStarted {
                task_id: held.task_id,
                index,
                attempt: new_attempt,
            });
            adopted.push(Adopted {
                task_id: held.task_id,
                attempt: held.attempt,
                term: held.term,
                new_attempt,
            });
        }
        for (job_id, tasks) in started {
            tracing::info!(executor = %executor, job = job_id, tasks = tasks.len(), "adopted attempts of an earlier leader");
            self.publish(Event::TaskStart {
                time_ms: now,
                job_id,
                executors: vec![ExecutorTasks {
                    executor_id: executor.clone(),
                    tasks,
                }],
                term: self.config.term,
            });
        }
        adopted
    }

    /// The job and index of the task `held` ran, if this driver may adopt it on `executor`,
    /// and takes the task out of the waiting lines. It may when the job runs and was known to
    /// the leader that launched the attempt (its term is at least the job's: an earlier
    /// leader may have given the same task ids to a job it never stored), the task waits to
    /// run (it has not finished, and no attempt of this driver runs it), its job asks for no
    /// custom resources (which addresses the attempt holds is not reported), and the
    /// executor has its cores free.
    fn adoptable(&mut self, executor: &ExecutorId, held: &RunningAttempt) -> Option<(JobId, u32)> {
        let (job_id, index) = self.locate(held.task_id)?;
        let free = self.executors.get(executor)?.free_cores;
        let job = self.jobs.get_mut(&job_id)?;
        let known = job.term.is_some_and(|term| held.term >= term);
        let fits = job.cpus_per_task <= free && job.resources.is_empty();
        let waits = job.tasks[index].status == TaskStatus::Pending;
        if !(job.is_active() && known && fits && waits) {
            return None;
        }
        job.tasks.take_waiting(index).then_some((job_id, index))
    }
}
