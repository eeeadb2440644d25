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

    /// Adopts what a newly registered executor holds of earlier terms, as far as it may, and
    /// returns what it adopted. The attempts adopted start under this term (a `TaskStart`
    /// per job) as if launched here, holding their cores; the rest the executor drops.
    pub(super) fn adopt_held(
        &mut self,
        executor: &ExecutorId,
        held: &[RunningAttempt],
        now: u64,
    ) -> Vec<Adopted> {
        if self.config.term == 0 || held.is_empty() {
            return Vec::new();
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
        // What may be adopted, by job and index, while the executor's cores last, the attempts
        // that still run first: one that ended is adopted only for its end to count, and must
        // not take the cores of one that runs (which would run again); then taken out of each
        // job's waiting lines at once.
        let mut free = self.executors.get(executor).map_or(0, |e| e.free_cores);
        let mut wanted: BTreeMap<JobId, BTreeMap<u32, &RunningAttempt>> = BTreeMap::new();
        let mut candidates: Vec<&RunningAttempt> = newest.into_values().collect();
        candidates.sort_by_key(|held| held.ended);
        for held in candidates {
            if let Some((job_id, index, cpus)) = self.adoptable(held, free) {
                free -= cpus;
                wanted.entry(job_id).or_default().insert(index, held);
            }
        }
        let mut adopted = Vec::new();
        for (job_id, attempts) in wanted {
            let Some(job) = self.jobs.get_mut(&job_id) else {
                continue;
            };
            let taken = job.tasks.take_waiting(attempts.keys().copied().collect());
            self.unqueue_if_dry(job_id);
            let mut started = Vec::with_capacity(taken.len());
            for index in taken {
                let held = attempts[&index];
                let new_attempt = self.start_attempt(job_id, index, executor, now);
                self.hand_out(job_id, index, new_attempt, executor, now);
                started.push(TaskStarted {
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
            if started.is_empty() {
                continue;
            }
            tracing::info!(executor = %executor, job = job_id, tasks = started.len(), "adopted attempts of an earlier leader");
            self.publish(Event::TaskStart {
                time_ms: now,
                job_id,
                executors: vec![ExecutorTasks {
                    executor_id: executor.clone(),
                    tasks: started,
                }],
                term: self.config.term,
            });
        }
        adopted
    }

    /// The job, index and cores of the task `held` ran, if this driver may adopt it with
    /// `free` cores left on the executor. It may when the job runs and was known to the
    /// leader that launched the attempt (its term is at least the job's: an earlier leader
    /// may have given the same task ids to a job it never stored), the task waits to run (it
    /// has not finished, and no attempt of this driver runs it), its job asks for no custom
    /// resources (which addresses the attempt holds is not reported), and its cores fit.
    fn adoptable(&self, held: &RunningAttempt, free: u32) -> Option<(JobId, u32, u32)> {
        let (job_id, index) = self.locate(held.task_id)?;
        let job = self.jobs.get(&job_id)?;
        let known = job.term.is_some_and(|term| held.term >= term);
        let fits = job.cpus_per_task <= free && job.resources.is_empty();
        let waits = job.tasks[index].status == TaskStatus::Pending;
        (job.is_active() && known && fits && waits).then_some((job_id, index, job.cpus_per_task))
    }
}
