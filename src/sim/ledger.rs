//! The invariants, checked after every step against what the run really did: the ground truth of
//! which executor process was sent which attempt, and the driver's events and registry.
//!
//! - cores are never negative or over an executor's total, and its busy cores are its attempts;
//! - a task ends FINISHED at most once, and a job that succeeded has every task finished once;
//! - a job ends at most once, and every job ends once the faults stop;
//! - an attempt's end (other than LOST, which the driver decides) counts only from the executor
//!   the attempt was sent to;
//! - `ExecutorAdded` and `ExecutorRemoved` alternate for each id, starting with an add, and an
//!   executor that is gone has been removed.

use super::network::Pid;
use crate::driver::core::Core;
use crate::ids::{ExecutorId, JobId, TaskId};
use crate::protocol::{Event, JobState, TaskEnded, TaskState};
use crate::FixedHasher;
use std::collections::{BTreeMap, HashSet};

/// What one job of the workload has come to.
#[derive(Debug, Clone, Copy)]
struct JobEntry {
    /// The workload's job this is (submitted again under a new id after a driver restart).
    origin: usize,
    tasks: u32,
    finished: u32,
    ended: bool,
}

/// The ledger of one driver instance's lifetime, and the workload's jobs across them.
#[derive(Default)]
pub struct Ledger {
    /// Per executor id: whether the driver counts it added now.
    present: BTreeMap<ExecutorId, bool>,
    /// FINISHED ends per task id.
    finished: Vec<u8>,
    /// Which processes each attempt was sent to by this driver instance (a duplicated or
    /// delayed launch may reach more than one).
    launched: HashSet<(TaskId, u32, Pid), FixedHasher>,
    jobs: BTreeMap<JobId, JobEntry>,
    /// Which of the workload's jobs have ended (under any driver).
    pub origins_ended: Vec<bool>,
    pub tasks_finished: u64,
}

impl Ledger {
    pub fn new(jobs: usize) -> Self {
        Self {
            origins_ended: vec![false; jobs],
            ..Self::default()
        }
    }

    /// A new driver instance: it knows nothing of the old one's executors, tasks or jobs.
    pub fn new_driver(&mut self) {
        self.present.clear();
        self.finished.clear();
        self.launched.clear();
        self.jobs.clear();
    }

    pub fn submitted(&mut self, job_id: JobId, origin: usize, tasks: u32) {
        let entry = JobEntry {
            origin,
            tasks,
            finished: 0,
            ended: false,
        };
        self.jobs.insert(job_id, entry);
    }

    /// The workload's jobs that have not ended.
    pub fn unfinished(&self) -> impl Iterator<Item = usize> + '_ {
        self.origins_ended
            .iter()
            .enumerate()
            .filter(|(_, ended)| !**ended)
            .map(|(origin, _)| origin)
    }

    pub fn all_ended(&self) -> bool {
        self.origins_ended.iter().all(|e| *e)
    }

    /// The current driver's launch of an attempt reached executor process `pid`.
    pub fn launched(&mut self, task_id: TaskId, attempt: u32, pid: Pid) {
        self.launched.insert((task_id, attempt, pid));
    }

    /// Checks one event the driver published; `pid_of` names the process an id belongs to.
    pub fn on_event(
        &mut self,
        event: &Event,
        pid_of: impl Fn(&ExecutorId) -> Option<Pid>,
    ) -> Result<(), String> {
        match event {
            Event::ExecutorAdded { executor_id, .. } => self.added(executor_id),
            Event::ExecutorRemoved { executor_id, .. } => self.removed(executor_id),
            Event::TaskEnd { job_id, .. } => event
                .ended()
                .try_for_each(|(from, end)| self.task_ended(*job_id, from, end, &pid_of)),
            Event::JobEnd { job_id, state, .. } => self.job_ended(*job_id, *state),
            Event::JobStart { .. } | Event::TaskStart { .. } => Ok(()),
        }
    }

    fn added(&mut self, id: &ExecutorId) -> Result<(), String> {
        let present = self.present.entry(id.clone()).or_default();
        if std::mem::replace(present, true) {
            return Err(format!("ExecutorAdded twice for {id} without a removal"));
        }
        Ok(())
    }

    fn removed(&mut self, id: &ExecutorId) -> Result<(), String> {
        match self.present.get_mut(id) {
            Some(present) if *present => {
                *present = false;
                Ok(())
            }
            _ => Err(format!("ExecutorRemoved for {id}, which was not added")),
        }
    }

    fn task_ended(
        &mut self,
        job_id: JobId,
        from: &ExecutorId,
        end: &TaskEnded,
        pid_of: &impl Fn(&ExecutorId) -> Option<Pid>,
    ) -> Result<(), String> {
        let (task, attempt) = (end.task_id, end.attempt);
        if end.state != TaskState::Lost {
            let sent =
                pid_of(from).is_some_and(|pid| self.launched.contains(&(task, attempt, pid)));
            if !sent {
                return Err(format!(
                    "task {task} attempt {attempt} ended {:?} from {}, which was not running it",
                    end.state, from
                ));
            }
        }
        if end.state != TaskState::Finished {
            return Ok(());
        }
        let index = task as usize;
        if self.finished.len() <= index {
            self.finished.resize(index + 1, 0);
        }
        self.finished[index] += 1;
        if self.finished[index] > 1 {
            return Err(format!("task {task} finished twice (attempt {attempt})"));
        }
        self.tasks_finished += 1;
        if let Some(job) = self.jobs.get_mut(&job_id) {
            job.finished += 1;
        }
        Ok(())
    }

    fn job_ended(&mut self, job_id: JobId, state: JobState) -> Result<(), String> {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Err(format!("JobEnd for job {job_id}, which was not submitted"));
        };
        if std::mem::replace(&mut job.ended, true) {
            return Err(format!("job {job_id} ended twice"));
        }
        if state == JobState::Succeeded && job.finished != job.tasks {
            return Err(format!(
                "job {job_id} succeeded with {} of its {} tasks finished",
                job.finished, job.tasks
            ));
        }
        self.origins_ended[job.origin] = true;
        Ok(())
    }

    /// Cores of executor `id` in the driver's registry: within its total, and its busy cores
    /// exactly its attempts (every task takes one core in the simulated workload).
    pub fn check_cores(core: &Core, id: &ExecutorId) -> Result<(), String> {
        let Some(data) = core.executors().get(id) else {
            return Ok(());
        };
        let total = data.info.total_cores;
        if data.free_cores > total {
            return Err(format!(
                "executor {id} has {} free cores of {total}",
                data.free_cores
            ));
        }
        let busy = (total - data.free_cores) as usize;
        if busy != data.running.len() {
            return Err(format!(
                "executor {id} has {busy} busy cores but {} attempts",
                data.running.len()
            ));
        }
        Ok(())
    }

    /// At the end of a run: every executor that is gone has been removed.
    pub fn check_gone(&self, gone: impl Iterator<Item = ExecutorId>) -> Result<(), String> {
        for id in gone {
            if self.present.get(&id).copied().unwrap_or(false) {
                return Err(format!("executor {id} is gone but was never removed"));
            }
        }
        Ok(())
    }
}
