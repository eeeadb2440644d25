//! The invariants, checked after every step against what the run really did: the ground truth of
//! which executor process was sent which attempt, and the driver's events and registry.
//!
//! - cores are never negative or over an executor's total, and its busy cores are its attempts;
//! - a task ends FINISHED at most once, and a job that succeeded has every task finished once;
//! - a job ends at most once, and every job ends once the faults stop;
//! - no attempt's work starts before its objects are fetched on its executor, which fetches
//!   each at most once (kept in [`super::fetches`]);
//! - an attempt's end (other than LOST, which the driver decides) counts only from the executor
//!   the attempt was sent to;
//! - `ExecutorAdded` and `ExecutorRemoved` alternate for each id within one leadership,
//!   starting with an add, and an executor that is gone has been removed by the last leader.
//!
//! With the journal and the lease, across leaderships (checked here and where they happen):
//!
//! - no task finishes twice, whichever leaders published its ends;
//! - no acknowledged success is lost: a new leader restores every job the client was told was
//!   accepted and every success a listener saw, job or task;
//! - at most one epoch's messages are acted on at a time: a driver sends only while it holds
//!   the lease, the journal stores writes only of the newest mark's epoch, and no executor
//!   acts on a message of an older epoch than one it has acted on.
//!
//! With jobs that run after jobs (checked where the driver launches, and at the end):
//!
//! - no task of a job is launched before the end of each job it runs after is stored;
//! - a job after one that did not succeed failed, and one that succeeded ran after jobs that
//!   all succeeded.
//!
//! On the runs of attempts (kept and checked in [`super::runs`]):
//!
//! - a FINISHED task's result was made by a run of that task, under the attempt it is
//!   recorded under, on the executor it is recorded under;
//! - no two runs share an attempt's identity `(task_id, attempt, term)`;
//! - with the journal, a failover alone never starts a second run of a task whose run is still
//!   alive on a connected executor (judged at the end of a run).

use super::fetches::Fetches;
use super::network::{Pid, Sender};
use super::runs::Runs;
use crate::driver::core::Core;
use crate::epoch::Fence;
use crate::ids::{ExecutorId, JobId, TaskId};
use crate::protocol::{Event, JobState, TaskEnded, TaskState};
use crate::FixedHasher;
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// What one job of the workload has come to.
#[derive(Debug, Clone, Default)]
struct JobEntry {
    /// The workload's job this is (submitted again under a new id after a driver restart).
    origin: usize,
    /// Which submission made it: a job id a lost leader gave out may name another job later.
    submission: u64,
    tasks: u32,
    /// Tasks whose FINISHED end was published, by whichever leader.
    published: HashSet<TaskId, FixedHasher>,
    /// Those, and those a new leader restored finished (their events lost with the leader
    /// that stored them, and no later leader runs them again).
    finished: HashSet<TaskId, FixedHasher>,
    /// Whether a `JobEnd` was published for it.
    ended: bool,
    /// Whether its failure's reason was checked, heard or learned by asking.
    failure_checked: bool,
    /// Whether the client was told it was accepted.
    accepted: bool,
    /// Whether the listener saw it succeed, and which of its tasks finish.
    seen_succeeded: bool,
    seen_finished: Vec<TaskId>,
}

/// What a listener or the client was told of a job, which no later leader may take back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acknowledged {
    pub accepted: bool,
    pub succeeded: bool,
    pub finished: Vec<TaskId>,
}

impl Acknowledged {
    /// Whether anyone was told anything of the job.
    pub fn any(&self) -> bool {
        self.accepted || self.succeeded || !self.finished.is_empty()
    }
}

/// The ledger of the whole run. Without the journal every leadership starts its job and task
/// ids anew, so they are told apart by leadership (the era); with it they carry on.
pub struct Ledger {
    journal: bool,
    leadership: u32,
    /// Per leadership and executor id: whether that leadership counts it added now.
    present: BTreeMap<(u32, ExecutorId), bool>,
    /// Which processes each attempt was sent to, by which leadership (a duplicated or delayed
    /// launch may reach more than one).
    launched: HashSet<(u32, TaskId, u32, Pid), FixedHasher>,
    jobs: BTreeMap<(u32, JobId), JobEntry>,
    /// The listener's epoch filter, as `ember events` applies it.
    fence: Fence,
    /// Which of the workload's jobs have ended (under any driver).
    pub origins_ended: Vec<bool>,
    /// How each of the workload's jobs ended, as far as anyone heard.
    pub origin_states: Vec<Option<JobState>>,
    pub tasks_finished: u64,
    /// `SpeculativeTaskStart`s heard.
    pub copies: u64,
    /// Every run of an attempt on an executor.
    pub runs: Runs,
    /// Every object fetch on an executor.
    pub fetches: Fetches,
    submissions: u64,
}

impl Ledger {
    pub fn new(jobs: usize, journal: bool) -> Self {
        let patience = crate::DEFAULT_EXECUTOR_TIMEOUT.as_millis() as u64;
        Self {
            journal,
            leadership: 0,
            present: BTreeMap::new(),
            launched: HashSet::default(),
            jobs: BTreeMap::new(),
            fence: Fence::new(patience),
            origins_ended: vec![false; jobs],
            origin_states: vec![None; jobs],
            tasks_finished: 0,
            copies: 0,
            runs: Runs::new(journal),
            fetches: Fetches::default(),
            submissions: 0,
        }
    }

    fn era(&self, leadership: u32) -> u32 {
        if self.journal {
            0
        } else {
            leadership
        }
    }

    /// A new leadership: it knows nothing of the old one's executors; without the journal,
    /// nothing of its tasks or jobs either.
    pub fn new_leadership(&mut self, leadership: u32) {
        self.leadership = leadership;
    }

    pub fn submitted(&mut self, job_id: JobId, origin: usize, tasks: u32) {
        self.submissions += 1;
        let entry = JobEntry {
            origin,
            submission: self.submissions,
            tasks,
            ..JobEntry::default()
        };
        self.jobs.insert((self.era(self.leadership), job_id), entry);
    }

    /// The client was told job `job_id` was accepted.
    pub fn accepted(&mut self, origin: usize, job_id: JobId) {
        let era = self.era(self.leadership);
        if let Some(job) = self.jobs.get_mut(&(era, job_id)) {
            debug_assert_eq!(job.origin, origin);
            job.accepted = true;
        }
    }

    /// The jobs of the current era, and what anyone was told of each.
    pub fn acknowledged(&self) -> Vec<(JobId, Acknowledged)> {
        let era = self.era(self.leadership);
        self.jobs
            .range((era, 0)..=(era, JobId::MAX))
            .map(|(&(_, id), job)| {
                let told = Acknowledged {
                    accepted: job.accepted,
                    succeeded: job.seen_succeeded,
                    finished: job.seen_finished.clone(),
                };
                (id, told)
            })
            .collect()
    }

    /// A new leader restored job `job_id` with the tasks `finished` finished.
    pub fn restored(&mut self, job_id: JobId, finished: &BTreeSet<TaskId>) {
        let era = self.era(self.leadership);
        let Some(job) = self.jobs.get_mut(&(era, job_id)) else {
            return;
        };
        for task in finished {
            if job.finished.insert(*task) {
                self.tasks_finished += 1;
            }
        }
    }

    /// The client learned by asking that job `job_id` ended, in `state` for `reason`.
    pub fn ended_unseen(
        &mut self,
        job_id: JobId,
        state: JobState,
        reason: Option<&str>,
    ) -> Result<(), String> {
        let era = self.era(self.leadership);
        if let Some(job) = self.jobs.get(&(era, job_id)) {
            self.origins_ended[job.origin] = true;
            self.origin_states[job.origin] = Some(state);
        }
        self.check_failure(era, job_id, state, reason)
    }

    /// The reason of job `job_id`, which ended in `state`, if it failed and its reason has not
    /// been checked yet (its end may be both heard and learned by asking).
    fn check_failure(
        &mut self,
        era: u32,
        job_id: JobId,
        state: JobState,
        reason: Option<&str>,
    ) -> Result<(), String> {
        let Some(job) = self.jobs.get_mut(&(era, job_id)) else {
            return Ok(());
        };
        if state != JobState::Failed || std::mem::replace(&mut job.failure_checked, true) {
            return Ok(());
        }
        self.fetches.job_failed(job_id, reason)
    }

    /// The workload's jobs that have not ended.
    pub fn unfinished(&self) -> impl Iterator<Item = usize> + '_ {
        self.origins_ended
            .iter()
            .enumerate()
            .filter(|(_, ended)| !**ended)
            .map(|(origin, _)| origin)
    }

    /// The workload's job job `job_id` of the current era is, if it is one.
    pub fn origin_of(&self, job_id: JobId) -> Option<usize> {
        let era = self.era(self.leadership);
        self.jobs.get(&(era, job_id)).map(|job| job.origin)
    }

    /// The job of the current era that the workload's job `origin` was submitted as last.
    pub fn job_of(&self, origin: usize) -> Option<JobId> {
        let era = self.era(self.leadership);
        self.jobs
            .iter()
            .filter(|((e, _), job)| *e == era && job.origin == origin)
            .max_by_key(|(_, job)| job.submission)
            .map(|((_, id), _)| *id)
    }

    /// At the end of a run with the journal: a job after one that did not succeed failed, and
    /// one that succeeded ran after jobs that all succeeded (a failure reached every job after
    /// it, down the chain).
    pub fn check_dependencies(&self, config: &super::SimConfig) -> Result<(), String> {
        if !self.journal {
            return Ok(());
        }
        for (origin, state) in self.origin_states.iter().enumerate() {
            let Some(state) = state else { continue };
            for upstream in config.upstreams(origin).0 {
                let up = self.origin_states[upstream];
                let broken = matches!(up, Some(JobState::Failed | JobState::Killed));
                if broken && *state != JobState::Failed {
                    return Err(format!(
                        "sim-{origin} ended {state} after sim-{upstream}, which it runs after, \
                         ended {up:?}"
                    ));
                }
                if *state == JobState::Succeeded && up != Some(JobState::Succeeded) {
                    return Err(format!(
                        "sim-{origin} succeeded though sim-{upstream}, which it runs after, \
                         ended {up:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn all_ended(&self) -> bool {
        self.origins_ended.iter().all(|e| *e)
    }

    /// Leadership `leadership`'s launch of an attempt reached executor process `pid`.
    pub fn launched(&mut self, leadership: u32, task_id: TaskId, attempt: u32, pid: Pid) {
        self.launched.insert((leadership, task_id, attempt, pid));
    }

    /// Checks one event a driver published, as it reaches the listener at `now`; `pid_of`
    /// names the process an id belongs to.
    pub fn on_event(
        &mut self,
        sender: Sender,
        now: u64,
        event: &Event,
        pid_of: impl Fn(&ExecutorId) -> Option<Pid>,
    ) -> Result<(), String> {
        let seen = self.fence.admit(sender.epoch, now);
        let leadership = sender.leadership;
        match event {
            Event::ExecutorAdded { executor_id, .. } => self.added(leadership, executor_id),
            Event::ExecutorRemoved { executor_id, .. } => self.removed(leadership, executor_id),
            Event::TaskEnd { job_id, .. } => event.ended().try_for_each(|(from, end)| {
                self.task_ended(leadership, *job_id, from, end, seen, &pid_of)
            }),
            Event::JobEnd {
                job_id,
                state,
                reason,
                ..
            } => {
                self.job_ended(leadership, *job_id, *state, seen)?;
                self.check_failure(self.era(leadership), *job_id, *state, reason.as_deref())
            }
            Event::JobStart { .. }
            | Event::TaskStart { .. }
            | Event::ExecutorTarget { .. }
            | Event::ExecutorExcluded { .. }
            | Event::ExecutorUnexcluded { .. } => Ok(()),
            Event::SpeculativeTaskStart { .. } => {
                self.copies += 1;
                Ok(())
            }
        }
    }

    fn added(&mut self, leadership: u32, id: &ExecutorId) -> Result<(), String> {
        let present = self.present.entry((leadership, id.clone())).or_default();
        if std::mem::replace(present, true) {
            return Err(format!("ExecutorAdded twice for {id} without a removal"));
        }
        Ok(())
    }

    fn removed(&mut self, leadership: u32, id: &ExecutorId) -> Result<(), String> {
        match self.present.get_mut(&(leadership, id.clone())) {
            Some(present) if *present => {
                *present = false;
                Ok(())
            }
            _ => Err(format!("ExecutorRemoved for {id}, which was not added")),
        }
    }

    fn task_ended(
        &mut self,
        leadership: u32,
        job_id: JobId,
        from: &ExecutorId,
        end: &TaskEnded,
        seen: bool,
        pid_of: &impl Fn(&ExecutorId) -> Option<Pid>,
    ) -> Result<(), String> {
        let (task, attempt) = (end.task_id, end.attempt);
        if end.state != TaskState::Lost {
            let sent = pid_of(from)
                .is_some_and(|pid| self.launched.contains(&(leadership, task, attempt, pid)));
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
        let era = self.era(leadership);
        let Some(job) = self.jobs.get_mut(&(era, job_id)) else {
            return Err(format!(
                "task {task} of job {job_id}, which was not submitted"
            ));
        };
        if !job.published.insert(task) {
            return Err(format!("task {task} finished twice (attempt {attempt})"));
        }
        if job.finished.insert(task) {
            self.tasks_finished += 1;
        }
        if seen {
            job.seen_finished.push(task);
        }
        Ok(())
    }

    fn job_ended(
        &mut self,
        leadership: u32,
        job_id: JobId,
        state: JobState,
        seen: bool,
    ) -> Result<(), String> {
        let era = self.era(leadership);
        let Some(job) = self.jobs.get_mut(&(era, job_id)) else {
            return Err(format!("JobEnd for job {job_id}, which was not submitted"));
        };
        if std::mem::replace(&mut job.ended, true) {
            return Err(format!("job {job_id} ended twice"));
        }
        if state == JobState::Succeeded && job.finished.len() != job.tasks as usize {
            return Err(format!(
                "job {job_id} succeeded with {} of its {} tasks finished",
                job.finished.len(),
                job.tasks
            ));
        }
        job.seen_succeeded = seen && state == JobState::Succeeded;
        self.origins_ended[job.origin] = true;
        self.origin_states[job.origin] = Some(state);
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

    /// At the end of a run: every executor that is gone has been removed by the last leader.
    pub fn check_gone(&self, gone: impl Iterator<Item = ExecutorId>) -> Result<(), String> {
        for id in gone {
            let key = (self.leadership, id);
            if self.present.get(&key).copied().unwrap_or(false) {
                let id = key.1;
                return Err(format!("executor {id} is gone but was never removed"));
            }
        }
        Ok(())
    }
}

#[path = "ledger_runs.rs"]
mod runs_of;
