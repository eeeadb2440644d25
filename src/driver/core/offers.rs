//! Resource offers: Spark's `makeOffers()` and `makeOffers(executorId)`. Free cores are dealt
//! round-robin across executors, one task at a time, so work spreads; each executor then gets
//! one `LaunchTasks` for the whole round, and each job one `TaskStart` event.

use super::jobs::TaskStatus;
use super::{Core, Effect};
use crate::ids::{ExecutorId, JobId};
use crate::protocol::{Event, ExecutorMessage, ExecutorTasks, TaskDescription, TaskStarted};
use std::collections::BTreeMap;

/// What one deal of a free core to an executor found.
enum Deal {
    /// A task, launched.
    Task(TaskDescription),
    /// A gang first in line for the executor: it starts whole, or holds the jobs behind it.
    Gang(JobId),
}

/// How far past the head of a job's queue the scheduler looks for a task that did not last fail
/// on the executor being offered.
const AVOID_LOOKAHEAD: usize = 8;

impl Core {
    /// Offers free cores to waiting tasks: of every executor, or only of `only`.
    pub(super) fn make_offers(&mut self, only: Option<&ExecutorId>, now: u64) {
        if !self.gangs_to_stop.is_empty() {
            for job_id in std::mem::take(&mut self.gangs_to_stop) {
                self.stop_gang(job_id);
            }
        }
        if self.gate.is_some() && !self.gate_open(now) {
            return;
        }
        if self.adopting_until.is_some() && self.adopting(now) {
            return;
        }
        // The queue holds the active jobs with waiting tasks, and no other: each change that
        // leaves a job without any takes it out (`unqueue_if_dry`).
        if self.queue.is_empty() {
            return;
        }
        self.offer_rounds += 1;
        // Each executor offered, in id order, with what it is dealt.
        let mut offers: Vec<(ExecutorId, Vec<TaskDescription>)> = match only {
            Some(id) => self
                .executors
                .get(id)
                .filter(|e| !e.decommissioning)
                .map(|_| (id.clone(), Vec::new()))
                .into_iter()
                .collect(),
            None => self
                .executors
                .iter()
                .filter(|(_, e)| e.free_cores > 0 && !e.decommissioning)
                .map(|(id, _)| (id.clone(), Vec::new()))
                .collect(),
        };
        // Those that may still take a task. `launch_one` passes over a job that runs dry; it
        // leaves the queue once the round is dealt.
        let mut open: Vec<usize> = (0..offers.len()).collect();
        // Gangs started whole this round, wherever their tasks went, and gangs that did not
        // fit: an executor that reaches one of those takes nothing more this round.
        let mut gangs: Vec<(ExecutorId, TaskDescription)> = Vec::new();
        let mut held: Vec<JobId> = Vec::new();
        // Gangs the executors could not hold even idle: passed over, holding nothing back.
        let mut passed: Vec<JobId> = Vec::new();
        while !open.is_empty() {
            open.retain(|&i| {
                let (executor, dealt) = &mut offers[i];
                match self.launch_one(executor, &passed, now) {
                    Some(Deal::Task(description)) => {
                        dealt.push(description);
                        true
                    }
                    Some(Deal::Gang(job_id)) if !held.contains(&job_id) => {
                        match self.launch_gang(job_id, now) {
                            Some(started) => {
                                gangs.extend(started);
                                true
                            }
                            None if self.gang_could_fit(job_id) => {
                                held.push(job_id);
                                false
                            }
                            None => {
                                passed.push(job_id);
                                true
                            }
                        }
                    }
                    Some(Deal::Gang(_)) | None => false,
                }
            });
        }
        for (executor, description) in gangs {
            match offers.iter_mut().find(|(id, _)| *id == executor) {
                Some((_, dealt)) => dealt.push(description),
                None => offers.push((executor, vec![description])),
            }
        }
        offers.retain(|(_, dealt)| !dealt.is_empty());
        let started = started_by_job(&offers);
        for job_id in started.keys() {
            self.unqueue_if_dry(*job_id);
        }
        for (to, tasks) in offers {
            self.send_launch(to, tasks);
        }
        for (job_id, executors) in started {
            self.publish(Event::TaskStart {
                time_ms: now,
                job_id,
                executors,
                term: self.config.term,
            });
        }
        self.arm_key_window(now);
    }

    /// Takes the launches queued for `executor` out of the effects, to go in the answer to its
    /// status batch: the executor gets its next tasks with the acknowledgement, in one message.
    pub(super) fn take_launches(&mut self, executor: &ExecutorId) -> Vec<TaskDescription> {
        let mut launch = Vec::new();
        self.effects.retain_mut(|effect| match effect {
            Effect::Send {
                to,
                message: ExecutorMessage::LaunchTasks { tasks, .. },
            } if to == executor => {
                launch.append(tasks);
                false
            }
            _ => true,
        });
        launch
    }

    /// Sends `tasks` to `executor` in a `LaunchTasks` after all: for the launches of an
    /// acknowledgement too large to carry them.
    pub(super) fn launch_separately(&mut self, executor: ExecutorId, tasks: Vec<TaskDescription>) {
        if !tasks.is_empty() {
            self.send_launch(executor, tasks);
        }
    }

    /// A `LaunchTasks` that says which driver instance launched its tasks.
    fn send_launch(&mut self, to: ExecutorId, tasks: Vec<TaskDescription>) {
        let driver_instance = Some(self.config.driver_instance);
        self.send(
            to,
            ExecutorMessage::LaunchTasks {
                tasks,
                driver_instance,
            },
        );
    }

    /// Takes job `job_id` out of the offer queue if it is there and has no task left to
    /// offer (or has ended).
    pub(super) fn unqueue_if_dry(&mut self, job_id: JobId) {
        let dry = self
            .jobs
            .get(&job_id)
            .map_or(true, |job| !job.is_active() || !job.tasks.has_waiting());
        if dry {
            self.unqueue(job_id);
        }
    }

    /// Takes job `job_id` out of the offer queue, looked for from the front, where the jobs
    /// being dealt are.
    pub(super) fn unqueue(&mut self, job_id: JobId) {
        if let Some(at) = self.queue.iter().position(|id| *id == job_id) {
            self.queue.remove(at);
        }
    }

    /// Launches one waiting task on `executor` if one fits: of the first job that has one, in
    /// the order `--scheduling` gives the jobs.
    /// A gang first in that order is handed back to be started whole instead.
    fn launch_one(&mut self, executor: &ExecutorId, passed: &[JobId], now: u64) -> Option<Deal> {
        let data = self.executors.get(executor)?;
        let free = data.free_cores;
        if free == 0 {
            // Every task takes a core at least: no need to look through the queue.
            return None;
        }
        let fits = |id: &JobId| {
            let job = self.jobs.get(id)?;
            // A gang is started whole by the caller, or holds back the jobs behind it.
            if job.gang {
                return (job.tasks.has_waiting() && !passed.contains(id)).then_some(Err(*id));
            }
            if job.cpus_per_task > free || self.excluded(*id, None, executor) {
                return None;
            }
            // One branch for the jobs that ask for no custom resources.
            if !job.resources.is_empty() && !data.resources.fits(&job.resources) {
                return None;
            }
            // One branch for the jobs without constraints or preferences.
            if let Some(placement) = &job.placement {
                if !self.placement_allows(placement, executor, now) {
                    return None;
                }
            }
            // And one for the jobs that name no concurrency key.
            if let Some(key) = &job.concurrency_key {
                if !self.keys.admits(key, now) {
                    return None;
                }
            }
            let pick = job.tasks.find_waiting(AVOID_LOOKAHEAD, |index, record| {
                !self.excluded(*id, Some(index), executor)
                    && (!last_failed_on(record, executor)
                        || !self.another_can_take(executor, *id, index, job))
            })?;
            Some(Ok((*id, pick)))
        };
        // FIFO: the queue's order; FAIR: the pools'.
        let found = match self.pools.as_deref() {
            None => self.queue.iter().find_map(fits),
            Some(pools) => pools.order().find_map(fits),
        }?;
        let (job_id, position) = match found {
            Ok(task) => task,
            Err(gang) => return Some(Deal::Gang(gang)),
        };
        let job = self.jobs.get_mut(&job_id)?;
        let index = job.tasks.take(position)?;
        if let Some(placement) = &mut job.placement {
            placement.launched(executor, now);
        }
        let attempt = self.start_attempt(job_id, index, executor, now);
        self.hand_out(job_id, index, attempt, executor, now)
            .map(Deal::Task)
    }

    /// Records the start of task `index`'s next attempt on `executor`, taken out of the
    /// waiting lines already, and returns its number.
    pub(super) fn start_attempt(
        &mut self,
        job_id: JobId,
        index: u32,
        executor: &ExecutorId,
        now: u64,
    ) -> u32 {
        let job = self.jobs.get_mut(&job_id).expect("a job the caller found");
        let record = &mut job.tasks[index];
        if let (Some(previous), true) = (record.executor.take(), record.attempts > 0) {
            // Kept if known: a speculative copy may have used the number.
            job.past_attempts
                .entry((index, record.attempts - 1))
                .or_insert(previous);
        }
        let record = &mut job.tasks[index];
        let attempt = record.attempts;
        record.attempts += 1;
        record.status = TaskStatus::Running;
        record.executor = Some(executor.clone());
        record.started_ms = now;
        record.duration_ms = super::jobs::NO_DURATION;
        record.timed_out = false;
        job.running += 1;
        if let Some(limit) = job.attempt_timeout_of(index) {
            self.start_attempt_timer(job_id, index, attempt, now.saturating_add(limit));
        }
        attempt
    }

    /// Takes attempt `attempt` of task `index` of job `job_id` out of `executor`'s free cores
    /// (and resources) and its pool's share: the launch of a task's own attempt or of a
    /// speculative copy, whose description it returns.
    pub(super) fn hand_out(
        &mut self,
        job_id: JobId,
        index: u32,
        attempt: u32,
        executor: &ExecutorId,
        now: u64,
    ) -> Option<TaskDescription> {
        let job = self.jobs.get(&job_id)?;
        let cpus = job.cpus_per_task;
        let task_id = job.first_task + u64::from(index);
        let spec = job.spec(index).clone();
        let data = self.executors.get_mut(executor)?;
        data.free_cores -= cpus;
        data.running.insert(task_id, attempt);
        if let Some(key) = &job.concurrency_key {
            self.keys.started(key, now);
        }
        if let Some(pools) = self.pools.as_deref_mut() {
            pools.started(job_id, cpus);
        }
        let resources = match job.resources.is_empty() {
            true => Default::default(),
            false => data.resources.take(task_id, &job.resources),
        };
        Some(TaskDescription {
            task_id,
            job_id,
            index,
            attempt,
            cpus,
            spec,
            resources,
            gang_peers: Vec::new(),
        })
    }
}

impl Core {
    /// Whether an executor other than `executor`, not excluded from task `index` of job
    /// `job_id`, has the cores and resources a task of `job` needs free right now. A retry
    /// avoids the executor it failed on only then, so it never waits for cores that may not
    /// come.
    fn another_can_take(
        &self,
        executor: &ExecutorId,
        job_id: JobId,
        index: u32,
        job: &super::Job,
    ) -> bool {
        self.executors.iter().any(|(id, data)| {
            id != executor
                && data.free_cores >= job.cpus_per_task
                && !data.decommissioning
                && (job.resources.is_empty() || data.resources.fits(&job.resources))
                && job.placement.as_ref().map_or(true, |p| p.admits(id))
                && !self.excluded(job_id, Some(index), id)
        })
    }
}

/// A round's launches, by executor in id order, as each job's `TaskStart` lists them: each
/// executor named once per job, its tasks in the order it was dealt them.
fn started_by_job(
    launches: &[(ExecutorId, Vec<TaskDescription>)],
) -> BTreeMap<JobId, Vec<ExecutorTasks<TaskStarted>>> {
    let mut started: BTreeMap<JobId, Vec<ExecutorTasks<TaskStarted>>> = BTreeMap::new();
    for (executor, tasks) in launches {
        for task in tasks {
            let groups = started.entry(task.job_id).or_default();
            // Executors come one at a time, so this executor's group, if any, is the last.
            if groups.last().map(|group| &group.executor_id) != Some(executor) {
                groups.push(ExecutorTasks {
                    executor_id: executor.clone(),
                    tasks: Vec::new(),
                });
            }
            if let Some(group) = groups.last_mut() {
                group.tasks.push(TaskStarted {
                    task_id: task.task_id,
                    index: task.index,
                    attempt: task.attempt,
                });
            }
        }
    }
    started
}

/// Whether task `index`'s last attempt failed on `executor` (a retry should prefer another).
fn last_failed_on(record: &super::tasks::TaskRecord, executor: &ExecutorId) -> bool {
    record.last_failed && record.executor.as_ref() == Some(executor)
}
