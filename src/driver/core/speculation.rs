//! Speculative execution: Spark's `TaskSetManager.checkSpeculatableTasks`. Once `quantile` of a
//! job's tasks have finished, a running attempt older than `multiplier` times the median
//! duration of those finished here (and at least `min_runtime_ms`) gets one copy, on another
//! executor, with cores the waiting tasks left free. The first of the two to finish ends the
//! task; the other is killed, and its end counts neither as a failure nor as a loss.
//!
//! While a task runs twice, its record holds the first attempt and [`Speculation`] the copy,
//! whose attempt number is the record's next one (so it is known to
//! [`super::Job::executor_of`] through `past_attempts`). If the copy finishes first it takes the
//! record's place; if the first attempt fails or is lost, the copy carries on as the task's
//! only attempt; if the copy fails or is lost, the first carries on. Once one has finished, the
//! other is kept here until it reports its end, to give its cores back.
//!
//! Nothing here runs for a job without speculation: the status path asks one `Option` per
//! attempt end, and the periodic check walks only the jobs that asked for it.

use super::jobs::{TaskStatus, NO_DURATION};
use super::Core;
use crate::ids::{ExecutorId, JobId};
use crate::protocol::{
    Event, ExecutorTasks, SpeculativeCounts, StatusUpdate, TaskDescription, TaskEnded, TaskStarted,
    TaskState,
};
use crate::IdHasher;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// How often the driver looks for tasks to copy (Spark's `spark.speculation.interval`).
pub const SPECULATION_INTERVAL: Duration = Duration::from_millis(100);

/// The error of an attempt killed because the other attempt of its task finished first.
pub(super) const LOST_THE_RACE: &str = "another attempt of the task finished first";

/// The bounds a job's settings must keep.
pub fn validate(config: &crate::protocol::Speculation) -> Result<(), String> {
    if !(config.quantile > 0.0 && config.quantile <= 1.0) {
        return Err(format!(
            "speculation quantile must be above 0 and at most 1; got {}",
            config.quantile
        ));
    }
    if !(1.0..=1000.0).contains(&config.multiplier) {
        return Err(format!(
            "speculation multiplier must be between 1 and 1000; got {}",
            config.multiplier
        ));
    }
    if config.min_runtime_ms > MAX_MIN_RUNTIME_MS {
        return Err(format!(
            "speculation min_runtime_ms must be at most {MAX_MIN_RUNTIME_MS} (a day); got {}",
            config.min_runtime_ms
        ));
    }
    Ok(())
}

const MAX_MIN_RUNTIME_MS: u64 = 24 * 3600 * 1000;

/// One job's speculation: its settings, the copies running, and what it did.
#[derive(Debug)]
pub struct Speculation {
    pub config: crate::protocol::Speculation,
    /// The other live attempt of each task that runs twice: the copy while both run, the
    /// loser once one has finished (until it reports its end).
    others: HashMap<u32, Other, IdHasher>,
    /// Tasks that have had their one copy, with its attempt number.
    copied: HashMap<u32, u32, IdHasher>,
    launched: u32,
    won: u32,
}

#[derive(Debug, Clone)]
struct Other {
    attempt: u32,
    executor: ExecutorId,
    started_ms: u64,
    /// Whether it was told to stop: the other attempt finished, or the task or job was killed.
    losing: bool,
}

impl Speculation {
    pub fn new(config: crate::protocol::Speculation) -> Self {
        Speculation {
            config,
            others: HashMap::default(),
            copied: HashMap::default(),
            launched: 0,
            won: 0,
        }
    }

    pub fn counts(&self) -> SpeculativeCounts {
        SpeculativeCounts {
            launched: self.launched,
            won: self.won,
        }
    }

    /// The other live attempt of task `index`, if it has one: its number, executor, and
    /// whether it was told to stop.
    pub fn other(&self, index: u32) -> Option<(u32, &ExecutorId, bool)> {
        let other = self.others.get(&index)?;
        Some((other.attempt, &other.executor, other.losing))
    }

    /// Whether an attempt beside a task's own is still out.
    pub fn any_other(&self) -> bool {
        !self.others.is_empty()
    }

    /// How many attempts beside the tasks' own are still out.
    pub fn others_out(&self) -> u32 {
        self.others.len() as u32
    }

    /// When the other live attempt of task `index` started, if `attempt` is it.
    pub(super) fn started(&self, index: u32, attempt: u32) -> Option<u64> {
        let other = self.others.get(&index)?;
        (other.attempt == attempt).then_some(other.started_ms)
    }
}

/// A task found running too long: its index, attempt and how long it has run.
struct Slow {
    index: u32,
    attempt: u32,
    running_ms: u64,
}

impl Core {
    /// Whether some running job has speculation on: the driver checks every
    /// [`SPECULATION_INTERVAL`] only then.
    pub fn speculating(&self) -> bool {
        !self.speculating.is_empty()
    }

    /// Notes job `job_id` for the periodic check, if it asked for speculation and runs.
    pub(super) fn track_speculation(&mut self, job_id: JobId) {
        let on = self
            .jobs
            .get(&job_id)
            .is_some_and(|j| j.speculation.is_some() && j.is_active());
        if on && !self.speculating.contains(&job_id) {
            self.speculating.push(job_id);
        }
    }

    /// The periodic check: waiting tasks are offered the free cores first; then each task of
    /// a job with speculation on that runs too long gets a copy on another executor with a
    /// free core, if there is one.
    pub fn speculate(&mut self, now: u64) {
        if self.speculating.is_empty() {
            return;
        }
        let jobs = &self.jobs;
        self.speculating
            .retain(|id| jobs.get(id).is_some_and(|j| j.is_active()));
        self.make_offers(None, now);
        if self.gate.is_some() && !self.gate_open(now) {
            return;
        }
        let mut launches: BTreeMap<ExecutorId, Vec<TaskDescription>> = BTreeMap::new();
        for job_id in self.speculating.clone() {
            let (slow, threshold_ms) = self.slow_tasks(job_id, now);
            let mut started: Vec<ExecutorTasks<TaskStarted>> = Vec::new();
            for task in slow {
                let Some(executor) = self.copy_target(job_id, task.index, now) else {
                    continue;
                };
                let Some(description) = self.launch_copy(job_id, task.index, &executor, now) else {
                    continue;
                };
                self.publish(Event::SpeculativeTaskStart {
                    time_ms: now,
                    job_id,
                    executor_id: executor.clone(),
                    task_id: description.task_id,
                    index: task.index,
                    attempt: description.attempt,
                    copy_of: task.attempt,
                    running_ms: task.running_ms,
                    threshold_ms,
                });
                started.push(ExecutorTasks {
                    executor_id: executor.clone(),
                    tasks: vec![TaskStarted {
                        task_id: description.task_id,
                        index: description.index,
                        attempt: description.attempt,
                    }],
                });
                launches.entry(executor).or_default().push(description);
            }
            if !started.is_empty() {
                // Every launch is in a TaskStart, so what counts launches and ends agrees.
                self.publish(Event::TaskStart {
                    time_ms: now,
                    job_id,
                    executors: started,
                    term: self.config.term,
                });
            }
        }
        for (to, mut tasks) in launches {
            // One LaunchTasks per executor a step: with the round's, if it has one.
            let round = self.effects.iter_mut().find_map(|effect| match effect {
                super::Effect::Send {
                    to: other,
                    message: crate::protocol::ExecutorMessage::LaunchTasks { tasks, .. },
                } if *other == to => Some(tasks),
                _ => None,
            });
            match round {
                Some(round) => round.append(&mut tasks),
                None => self.launch_separately(to, tasks),
            }
        }
    }

    /// The tasks of job `job_id` that run too long and have had no copy, with the threshold:
    /// none until `quantile` of its tasks have finished. One pass over its records.
    fn slow_tasks(&self, job_id: JobId, now: u64) -> (Vec<Slow>, u64) {
        let Some(job) = self.jobs.get(&job_id) else {
            return (Vec::new(), 0);
        };
        let Some(spec) = job.speculation.as_deref() else {
            return (Vec::new(), 0);
        };
        let config = &spec.config;
        // Spark's minFinishedForSpeculation.
        let needed = ((config.quantile * f64::from(job.len())).floor() as u32).max(1);
        if job.succeeded < needed || job.running == 0 {
            return (Vec::new(), 0);
        }
        let mut durations = Vec::new();
        let mut running = Vec::new();
        for (index, record) in job.tasks.launched().iter().enumerate() {
            let index = index as u32;
            match record.status {
                // A task a restarted driver restored has no duration here.
                TaskStatus::Finished if record.duration_ms != NO_DURATION => {
                    durations.push(record.duration_ms)
                }
                TaskStatus::Running
                    if !record.kill_requested && !spec.copied.contains_key(&index) =>
                {
                    running.push(Slow {
                        index,
                        attempt: record.attempts.saturating_sub(1),
                        running_ms: now.saturating_sub(record.started_ms),
                    })
                }
                _ => {}
            }
        }
        if durations.is_empty() || running.is_empty() {
            return (Vec::new(), 0);
        }
        let middle = durations.len() / 2;
        let median = *durations.select_nth_unstable(middle).1;
        let threshold_ms =
            ((config.multiplier * f64::from(median)) as u64).max(config.min_runtime_ms);
        running.retain(|task| task.running_ms > threshold_ms);
        (running, threshold_ms)
    }

    /// An executor other than the one task `index` runs on, with the cores and resources a
    /// copy needs free and not excluded from it: the one with the most free cores. None while
    /// the job's concurrency key may start nothing more.
    fn copy_target(&self, job_id: JobId, index: u32, now: u64) -> Option<ExecutorId> {
        let job = self.jobs.get(&job_id)?;
        if let Some(key) = &job.concurrency_key {
            if !self.keys.admits(key, now) {
                return None;
            }
        }
        let first = job.tasks[index].executor.as_ref()?;
        self.executors
            .iter()
            .filter(|(id, data)| {
                *id != first
                    && data.free_cores >= job.cpus_per_task
                    && !data.decommissioning
                    && (job.resources.is_empty() || data.resources.fits(&job.resources))
                    && !self.excluded(job_id, None, id)
                    && !self.excluded(job_id, Some(index), id)
                    && job.placement.as_ref().map_or(true, |p| p.admits(id))
            })
            .max_by_key(|(id, data)| (data.free_cores, std::cmp::Reverse(*id)))
            .map(|(id, _)| id.clone())
    }

    /// Launches the copy of running task `index` on `executor`: its attempt is the record's
    /// next number, and it is known as one of the task's attempts from now on.
    fn launch_copy(
        &mut self,
        job_id: JobId,
        index: u32,
        executor: &ExecutorId,
        now: u64,
    ) -> Option<TaskDescription> {
        let job = self.jobs.get_mut(&job_id)?;
        let attempt = job.tasks[index].attempts;
        let spec = job.speculation.as_deref_mut()?;
        spec.others.insert(
            index,
            Other {
                attempt,
                executor: executor.clone(),
                started_ms: now,
                losing: false,
            },
        );
        spec.copied.insert(index, attempt);
        spec.launched += 1;
        job.past_attempts.insert((index, attempt), executor.clone());
        self.hand_out(job_id, index, attempt, executor, now)
    }

    /// The end of an attempt that is not the one task `index`'s record holds: the copy that
    /// runs beside it, or the loser of the two. The copy that finishes first ends the task
    /// (and the first attempt is killed); any other end gives its cores back and changes
    /// nothing else. None if `update` names no such attempt (a late repeat).
    pub(super) fn other_attempt_ended(
        &mut self,
        job_id: JobId,
        index: u32,
        from: &ExecutorId,
        update: &StatusUpdate,
        now: u64,
    ) -> Option<(TaskEnded, Option<String>)> {
        let job = self.jobs.get_mut(&job_id)?;
        let active = job.is_active();
        let spec = job.speculation.as_deref_mut()?;
        let other = spec
            .others
            .get(&index)
            .filter(|o| o.attempt == update.attempt && &o.executor == from)?
            .clone();
        let record = &job.tasks[index];
        let first_runs = record.status == TaskStatus::Running;
        if !other.losing && update.state == TaskState::Finished && first_runs && active {
            // The copy finished first: it takes the record's place and ends the task.
            let first = record.executor.clone()?;
            let first_attempt = record.attempts.checked_sub(1)?;
            spec.others.insert(
                index,
                Other {
                    attempt: first_attempt,
                    executor: first.clone(),
                    started_ms: record.started_ms,
                    losing: true,
                },
            );
            copy_takes_the_record(job, index, &other, first.clone(), first_attempt);
            let task_id = job.first_task + u64::from(index);
            let ended = self.end_attempt(job_id, index, from, update, true, now);
            self.send_kill(first, task_id, first_attempt, LOST_THE_RACE.into());
            return Some(ended);
        }
        spec.others.remove(&index);
        // A copy that ends any other way, or the loser: only its cores come back. A loser
        // ends KILLED whatever it reports, so that a task is seen to finish once; one the
        // driver lost (its executor gone or silent about it) ends LOST.
        let task_id = update.task_id;
        let cpus = job.cpus_per_task;
        let resources = !job.resources.is_empty();
        let last_of_ended = !active && !job.attempts_out();
        let lost = update.state == TaskState::Lost;
        let (state, error) = match !lost && (other.losing || update.state == TaskState::Finished) {
            true => (TaskState::Killed, Some(LOST_THE_RACE.to_string())),
            false => (update.state, self.clipped_error(update)),
        };
        self.free_attempt(job_id, from, task_id, cpus, resources, now);
        if last_of_ended {
            self.last_attempt_ended(job_id);
        }
        Some((
            TaskEnded {
                task_id,
                index,
                attempt: update.attempt,
                state,
                duration_ms: now.saturating_sub(other.started_ms),
                error,
            },
            None,
        ))
    }

    /// The record's attempt of task `index` ended other than FINISHED while its copy runs,
    /// in a running job, without a kill asked of the task: the copy carries on as the task's
    /// attempt, and the end is not charged to the task (no failure counted, nothing
    /// re-queued). None, changing nothing, if the task has no running copy.
    pub(super) fn first_attempt_ended(
        &mut self,
        job_id: JobId,
        index: u32,
        from: &ExecutorId,
        update: &StatusUpdate,
        now: u64,
    ) -> Option<(TaskEnded, Option<String>)> {
        let job = self.jobs.get_mut(&job_id)?;
        let record = &job.tasks[index];
        if update.state == TaskState::Finished || !job.is_active() || record.kill_requested {
            return None;
        }
        let spec = job.speculation.as_deref_mut()?;
        let copy = spec.others.get(&index).filter(|o| !o.losing)?.clone();
        spec.others.remove(&index);
        let first_attempt = record.attempts.checked_sub(1)?;
        let started_ms = record.started_ms;
        copy_takes_the_record(job, index, &copy, from.clone(), first_attempt);
        let task_id = update.task_id;
        let cpus = job.cpus_per_task;
        let resources = !job.resources.is_empty();
        self.free_attempt(job_id, from, task_id, cpus, resources, now);
        let error = self.clipped_error(update);
        Some((
            TaskEnded {
                task_id,
                index,
                attempt: update.attempt,
                state: update.state,
                duration_ms: now.saturating_sub(started_ms),
                error,
            },
            None,
        ))
    }

    /// After the record's attempt of task `index` ended the usual way: a copy still running
    /// beside a task that finished is killed; and a task that waits to run again skips the
    /// attempt number its ended copy used, so that no two attempts share one.
    pub(super) fn after_attempt_ended(&mut self, job_id: JobId, index: u32) {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        let record = &job.tasks[index];
        let (status, attempts) = (record.status, record.attempts);
        if status == TaskStatus::Pending && job.past_attempts.contains_key(&(index, attempts)) {
            // The record keeps the executor the task last ran on (a retry prefers another);
            // the launch keeps the copy's entry in `past_attempts`.
            if let Some(first) = job.tasks[index].executor.clone() {
                job.past_attempts.insert((index, attempts - 1), first);
            }
            job.tasks[index].attempts += 1;
            return;
        }
        if status == TaskStatus::Finished {
            if let Some(spec) = job.speculation.as_deref_mut() {
                if spec.copied.get(&index) == Some(&(attempts - 1)) {
                    spec.won += 1;
                }
            }
            self.stop_copies(job_id, Some(index), LOST_THE_RACE);
        }
    }

    /// Tells the running copies of job `job_id` (of task `only`, if given) to stop, and
    /// keeps each until it reports its end.
    pub(super) fn stop_copies(&mut self, job_id: JobId, only: Option<u32>, reason: &str) {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        let first_task = job.first_task;
        let Some(spec) = job.speculation.as_deref_mut() else {
            return;
        };
        let mut kills = Vec::new();
        for (index, other) in spec.others.iter_mut() {
            if other.losing || only.is_some_and(|i| i != *index) {
                continue;
            }
            other.losing = true;
            kills.push((
                other.executor.clone(),
                first_task + u64::from(*index),
                other.attempt,
            ));
        }
        kills.sort();
        for (to, task_id, attempt) in kills {
            self.send_kill(to, task_id, attempt, reason.to_string());
        }
    }
}

/// Copy `copy` becomes task `index`'s attempt in its record, and the record's attempt
/// `first_attempt`, on `first`, one of its past attempts.
fn copy_takes_the_record(
    job: &mut super::Job,
    index: u32,
    copy: &Other,
    first: ExecutorId,
    first_attempt: u32,
) {
    job.past_attempts.insert((index, first_attempt), first);
    let record = &mut job.tasks[index];
    record.executor = Some(copy.executor.clone());
    record.attempts = copy.attempt + 1;
    record.started_ms = copy.started_ms;
}
