//! Exclusion on failure: Spark's `HealthTracker` and `TaskSetExcludelist`. An executor on which
//! a task keeps failing gets no more of that task, then none of its job, then none of any job,
//! for a while; and a job that then cannot run anywhere fails with a message that says so,
//! rather than wait for ever.
//!
//! Off unless [`Core::set_exclusion`] turns it on (`ember-driver --exclude-on-failure`), as
//! Spark's `spark.excludeOnFailure.enabled`; when off, the offers pay one branch for it. Only a
//! FAILED attempt counts (not one killed or lost with its executor), and only while its task
//! runs again: the failure that fails the job is not held against the executor.
//!
//! - task scope: task `index` of a job failed `max_task_attempts_per_executor` times on the
//!   executor (Spark's `task.maxTaskAttemptsPerExecutor`, 1);
//! - job scope: `max_failed_tasks_per_executor` distinct tasks of the job failed on it (Spark's
//!   `stage.maxFailedTasksPerExecutor`, 2);
//! - cluster scope: when a job succeeds, the tasks that failed on each executor in it are added
//!   to that executor's count across jobs, each for `timeout_ms` from its failure; at
//!   `cluster_max_failed_tasks_per_executor` (Spark's `application.maxFailedTasksPerExecutor`,
//!   2) it is excluded from every job.
//!
//! Every exclusion lasts `timeout_ms` (Spark's `excludeOnFailure.timeout`, 1h); a task or job
//! exclusion also ends with its job. Spark's task-set exclusions last as long as the task set
//! and have no timeout: a job of Ember's may run for days, so here they expire too.
//! Exclusions are not journaled: a restarted driver starts with none, and failures count anew.

use super::jobs::TaskStatus;
use super::Core;
use crate::ids::{ExecutorId, JobId};
use crate::protocol::{
    Event, ExclusionScope, ExclusionStatus, JobState, JournalRecord, JournaledTask, TaskState,
    MAX_EXCLUSIONS_SHOWN,
};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How long an exclusion lasts (Spark's `spark.excludeOnFailure.timeout`).
pub const DEFAULT_EXCLUDE_TIMEOUT: Duration = Duration::from_secs(3600);
/// How long a job may have a task that no live executor may run before it fails (Spark's
/// `spark.scheduler.excludeOnFailure.unschedulableTaskSetTimeout`).
pub const DEFAULT_UNSCHEDULABLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Failures of a task on an executor that exclude it from that task (Spark's
/// `excludeOnFailure.task.maxTaskAttemptsPerExecutor`).
pub const DEFAULT_EXCLUDE_TASK_FAILURES: u32 = 1;
/// A job's tasks failed on an executor that exclude it from that job (Spark's
/// `excludeOnFailure.stage.maxFailedTasksPerExecutor`).
pub const DEFAULT_EXCLUDE_JOB_FAILURES: u32 = 2;
/// Tasks failed on an executor, in jobs that succeeded, that exclude it from every job (Spark's
/// `excludeOnFailure.application.maxFailedTasksPerExecutor`).
pub const DEFAULT_EXCLUDE_CLUSTER_FAILURES: u32 = 2;

/// The settings of exclusion on failure; the defaults are Spark's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExclusionConfig {
    /// Failures of one task on one executor that exclude it for that task.
    pub max_task_attempts_per_executor: u32,
    /// Distinct tasks of one job failed on one executor that exclude it for that job.
    pub max_failed_tasks_per_executor: u32,
    /// Distinct tasks failed on one executor, in jobs that succeeded, within `timeout_ms`,
    /// that exclude it for every job.
    pub cluster_max_failed_tasks_per_executor: u32,
    /// How long an exclusion lasts, and a failure counts towards the cluster scope.
    pub timeout_ms: u64,
    /// How long a job may have a task every live executor is excluded for before it fails.
    pub unschedulable_timeout_ms: u64,
}

impl Default for ExclusionConfig {
    fn default() -> Self {
        Self {
            max_task_attempts_per_executor: DEFAULT_EXCLUDE_TASK_FAILURES,
            max_failed_tasks_per_executor: DEFAULT_EXCLUDE_JOB_FAILURES,
            cluster_max_failed_tasks_per_executor: DEFAULT_EXCLUDE_CLUSTER_FAILURES,
            timeout_ms: DEFAULT_EXCLUDE_TIMEOUT.as_millis() as u64,
            unschedulable_timeout_ms: DEFAULT_UNSCHEDULABLE_TIMEOUT.as_millis() as u64,
        }
    }
}

/// The exclusion state: what failed where, and who is excluded from what.
#[derive(Debug)]
pub(super) struct Exclusion {
    config: ExclusionConfig,
    /// Running jobs that have had a failure counted.
    jobs: BTreeMap<JobId, JobHealth>,
    /// Executors excluded from every job.
    cluster: BTreeMap<ExecutorId, Excluded>,
    /// Failures in jobs that succeeded, by executor: (job, index, when it stops counting).
    cluster_failures: BTreeMap<ExecutorId, Vec<(JobId, u32, u64)>>,
}

#[derive(Debug, Clone)]
struct Excluded {
    until_ms: u64,
    reason: String,
}

/// One running job's failures and exclusions.
#[derive(Debug, Default)]
struct JobHealth {
    executors: BTreeMap<ExecutorId, Failures>,
    /// Executors excluded from the whole job.
    excluded: BTreeMap<ExecutorId, Excluded>,
    /// Since when a task of the job has had no live executor it may run on.
    unschedulable_since: Option<u64>,
    /// The error of the job's last counted failure.
    last_error: String,
}

/// One executor's failures in one job.
#[derive(Debug, Default)]
struct Failures {
    /// Task index -> (failures here, time of the last one).
    tasks: BTreeMap<u32, (u32, u64)>,
    /// Tasks it is excluded for.
    excluded_tasks: BTreeMap<u32, Excluded>,
}

/// A task no live executor may run: its index and why, in words.
struct Blocked {
    index: u32,
    why: String,
}

impl Exclusion {
    fn new(config: ExclusionConfig) -> Self {
        Self {
            config,
            jobs: BTreeMap::new(),
            cluster: BTreeMap::new(),
            cluster_failures: BTreeMap::new(),
        }
    }

    /// Whether `executor` may not run task `index` of job `job_id` (any of its tasks, without
    /// an index).
    fn excludes(&self, job_id: JobId, index: Option<u32>, executor: &ExecutorId) -> bool {
        if self.cluster.is_empty() && self.jobs.is_empty() {
            return false;
        }
        if self.cluster.contains_key(executor) {
            return true;
        }
        let Some(job) = self.jobs.get(&job_id) else {
            return false;
        };
        job.excluded.contains_key(executor)
            || index.is_some_and(|index| {
                job.executors
                    .get(executor)
                    .is_some_and(|f| f.excluded_tasks.contains_key(&index))
            })
    }

    /// Counts a failure of task `index` of job `job_id` on `executor`; the exclusions it
    /// caused, as events.
    fn failed(
        &mut self,
        job_id: JobId,
        index: u32,
        executor: &ExecutorId,
        error: &str,
        now: u64,
    ) -> Vec<Event> {
        let config = &self.config;
        let until_ms = now.saturating_add(config.timeout_ms);
        let job = self.jobs.entry(job_id).or_default();
        job.last_error = error.to_string();
        let failures = job.executors.entry(executor.clone()).or_default();
        let (count, at) = failures.tasks.entry(index).or_insert((0, now));
        *count += 1;
        *at = now;
        let count = *count;
        let mut events = Vec::new();
        let exclude = |scope, index, reason: String| Event::ExecutorExcluded {
            time_ms: now,
            executor_id: executor.clone(),
            scope,
            job_id: Some(job_id),
            index,
            reason,
            until_ms,
        };
        if count >= config.max_task_attempts_per_executor
            && !failures.excluded_tasks.contains_key(&index)
        {
            let reason = format!("task {index} failed {} on it", crate::text::times(count));
            events.push(exclude(ExclusionScope::Task, Some(index), reason.clone()));
            failures
                .excluded_tasks
                .insert(index, Excluded { until_ms, reason });
        }
        let distinct = failures.tasks.len() as u32;
        if distinct >= config.max_failed_tasks_per_executor && !job.excluded.contains_key(executor)
        {
            let reason = format!(
                "{} of job {job_id} failed on it",
                crate::text::count(distinct, "task", "tasks")
            );
            events.push(exclude(ExclusionScope::Job, None, reason.clone()));
            job.excluded
                .insert(executor.clone(), Excluded { until_ms, reason });
        }
        events
    }

    /// Forgets job `job_id`'s exclusions; if it succeeded, its failures count towards the
    /// cluster scope. The exclusions that caused, as events.
    fn job_ended(&mut self, job_id: JobId, succeeded: bool, now: u64) -> Vec<Event> {
        let Some(health) = self.jobs.remove(&job_id) else {
            return Vec::new();
        };
        let mut events = Vec::new();
        if !succeeded {
            return events;
        }
        let timeout = self.config.timeout_ms;
        for (executor, failures) in health.executors {
            let list = self.cluster_failures.entry(executor.clone()).or_default();
            list.extend(
                failures
                    .tasks
                    .iter()
                    .map(|(index, (_, at))| (job_id, *index, at.saturating_add(timeout))),
            );
            list.retain(|(_, _, expires)| *expires > now);
            let count = list.len() as u32;
            if count < self.config.cluster_max_failed_tasks_per_executor
                || self.cluster.contains_key(&executor)
            {
                continue;
            }
            // As Spark's, the count starts again once it has excluded the executor.
            self.cluster_failures.remove(&executor);
            let reason = format!(
                "{} failed on it in jobs that succeeded, within {}",
                crate::text::count(count, "task", "tasks"),
                humantime::format_duration(Duration::from_millis(timeout))
            );
            let until_ms = now.saturating_add(timeout);
            events.push(Event::ExecutorExcluded {
                time_ms: now,
                executor_id: executor.clone(),
                scope: ExclusionScope::Cluster,
                job_id: None,
                index: None,
                reason: reason.clone(),
                until_ms,
            });
            self.cluster.insert(executor, Excluded { until_ms, reason });
        }
        events
    }

    /// Ends the exclusions whose time has passed, and forgets failures that no longer count;
    /// the ends, as events. A job exclusion's end starts its count in that job again, and a
    /// task exclusion's that task's.
    fn expire(&mut self, now: u64) -> Vec<Event> {
        let mut events = Vec::new();
        let reason = || {
            format!(
                "excluded for {} (--exclude-timeout), which has passed",
                humantime::format_duration(Duration::from_millis(self.config.timeout_ms))
            )
        };
        let ended = |executor: &ExecutorId, scope, job_id, index| Event::ExecutorUnexcluded {
            time_ms: now,
            executor_id: executor.clone(),
            scope,
            job_id,
            index,
            reason: reason(),
        };
        self.cluster.retain(|executor, excluded| {
            let over = excluded.until_ms <= now;
            if over {
                events.push(ended(executor, ExclusionScope::Cluster, None, None));
            }
            !over
        });
        self.cluster_failures.retain(|_, list| {
            list.retain(|(_, _, expires)| *expires > now);
            !list.is_empty()
        });
        for (job_id, job) in &mut self.jobs {
            let executors = &mut job.executors;
            job.excluded.retain(|executor, excluded| {
                let over = excluded.until_ms <= now;
                if over {
                    events.push(ended(executor, ExclusionScope::Job, Some(*job_id), None));
                    if let Some(failures) = executors.get_mut(executor) {
                        failures.tasks.clear();
                    }
                }
                !over
            });
            for (executor, failures) in executors.iter_mut() {
                let tasks = &mut failures.tasks;
                failures.excluded_tasks.retain(|index, excluded| {
                    let over = excluded.until_ms <= now;
                    if over {
                        let event =
                            ended(executor, ExclusionScope::Task, Some(*job_id), Some(*index));
                        events.push(event);
                        tasks.remove(index);
                    }
                    !over
                });
            }
        }
        events
    }

    /// A waiting task of `job` that no executor of `live` may run, if there is one. `live` is
    /// not empty: the live executors the job's placement admits.
    fn blocked(&self, job: &super::Job, live: &[&ExecutorId]) -> Option<Blocked> {
        static NO_FAILURES: JobHealth = JobHealth {
            executors: BTreeMap::new(),
            excluded: BTreeMap::new(),
            unschedulable_since: None,
            last_error: String::new(),
        };
        let health = self.jobs.get(&job.id).unwrap_or(&NO_FAILURES);
        let wide = |e: &ExecutorId| self.cluster.contains_key(e) || health.excluded.contains_key(e);
        let names = |scope: &dyn Fn(&ExecutorId) -> &'static str| {
            let mut text: Vec<String> = live
                .iter()
                .take(5)
                .map(|e| format!("{e} ({})", scope(e)))
                .collect();
            if live.len() > 5 {
                text.push(format!("{} more", live.len() - 5));
            }
            text.join(", ")
        };
        let scope_of = |e: &ExecutorId| match (
            self.cluster.contains_key(e),
            health.excluded.contains_key(e),
        ) {
            (true, _) => "every job",
            (_, true) => "this job",
            _ => "this task",
        };
        let why = || {
            let meeting = meeting_constraints(job);
            let who = match live.len() {
                1 => format!("the one live executor{meeting} is"),
                n => format!("all {n} live executors{meeting} are"),
            };
            format!("{who} excluded after failures: {}", names(&scope_of))
        };
        if live.iter().all(|e| wide(e)) {
            let index = job.tasks.waiting_order(1).next()?;
            return Some(Blocked { index, why: why() });
        }
        let candidates: BTreeSet<u32> = health
            .executors
            .values()
            .flat_map(|f| f.excluded_tasks.keys().copied())
            .collect();
        candidates.into_iter().find_map(|index| {
            let waiting = index < job.len() && job.tasks[index].status == TaskStatus::Pending;
            let everywhere = live.iter().all(|e| {
                wide(e)
                    || health
                        .executors
                        .get(*e)
                        .is_some_and(|f| f.excluded_tasks.contains_key(&index))
            });
            (waiting && everywhere).then(|| Blocked { index, why: why() })
        })
    }

    /// `executor`'s exclusions, the widest first, at most [`MAX_EXCLUSIONS_SHOWN`].
    fn of(&self, executor: &ExecutorId) -> Vec<ExclusionStatus> {
        let status = |scope, job_id, index, excluded: &Excluded| ExclusionStatus {
            scope,
            job_id,
            index,
            reason: excluded.reason.clone(),
            until_ms: excluded.until_ms,
        };
        let cluster = self
            .cluster
            .get(executor)
            .map(|x| status(ExclusionScope::Cluster, None, None, x));
        let jobs = self.jobs.iter().filter_map(|(job_id, health)| {
            let x = health.excluded.get(executor)?;
            Some(status(ExclusionScope::Job, Some(*job_id), None, x))
        });
        let tasks = self.jobs.iter().flat_map(|(job_id, health)| {
            health
                .executors
                .get(executor)
                .into_iter()
                .flat_map(|f| f.excluded_tasks.iter())
                .map(|(index, x)| status(ExclusionScope::Task, Some(*job_id), Some(*index), x))
        });
        cluster
            .into_iter()
            .chain(jobs)
            .chain(tasks)
            .take(MAX_EXCLUSIONS_SHOWN)
            .collect()
    }
}

impl Core {
    /// Turns exclusion on failure on, with `config`.
    pub fn set_exclusion(&mut self, config: ExclusionConfig) {
        self.exclusion = Some(Box::new(Exclusion::new(config)));
    }

    /// Whether exclusion is on, some live executor (registered, not decommissioning) meets
    /// `job`'s constraints, and every such executor is excluded from the job (or from every
    /// job). With none meeting them, the job waits for its placement, not for exclusion.
    pub(super) fn every_live_executor_excludes(&self, job: &super::Job) -> bool {
        if self.exclusion.is_none() {
            return false;
        }
        let mut live = self.live_executors_for(job).peekable();
        live.peek().is_some() && live.all(|id| self.excluded(job.id, None, id))
    }

    /// The executors that may take tasks: registered and not decommissioning.
    fn live_executors(&self) -> impl Iterator<Item = &ExecutorId> {
        self.executors
            .iter()
            .filter(|(_, data)| !data.decommissioning)
            .map(|(id, _)| id)
    }

    /// The live executors that `job`'s constraints admit (every live one, without).
    fn live_executors_for<'a>(
        &'a self,
        job: &'a super::Job,
    ) -> impl Iterator<Item = &'a ExecutorId> + 'a {
        let placement = job.placement.as_deref();
        self.live_executors()
            .filter(move |id| placement.map_or(true, |p| p.admits(id)))
    }

    /// Whether `executor` is excluded from task `index` of job `job_id` (from any of its
    /// tasks, without an index). One branch when exclusion is off.
    #[inline]
    pub(super) fn excluded(
        &self,
        job_id: JobId,
        index: Option<u32>,
        executor: &ExecutorId,
    ) -> bool {
        match &self.exclusion {
            None => false,
            Some(exclusion) => exclusion.excludes(job_id, index, executor),
        }
    }

    /// Counts attempt failure of task `index` of job `job_id` on executor `from`, which runs
    /// again; publishes the exclusions it causes.
    pub(super) fn note_failure(
        &mut self,
        job_id: JobId,
        index: u32,
        from: &ExecutorId,
        error: &str,
        now: u64,
    ) {
        let Some(exclusion) = self.exclusion.as_deref_mut() else {
            return;
        };
        for event in exclusion.failed(job_id, index, from, error, now) {
            self.publish(event);
        }
    }

    /// Job `job_id` has ended as `state`: its exclusions end with it, and, if it succeeded,
    /// its failures count across jobs.
    pub(super) fn exclusion_job_ended(&mut self, job_id: JobId, state: JobState, now: u64) {
        let Some(exclusion) = self.exclusion.as_deref_mut() else {
            return;
        };
        for event in exclusion.job_ended(job_id, state == JobState::Succeeded, now) {
            self.publish(event);
        }
    }

    /// `executor`'s exclusions, for `ListExecutors`.
    pub(super) fn exclusions_of(&self, executor: &ExecutorId) -> Vec<ExclusionStatus> {
        self.exclusion
            .as_ref()
            .map_or_else(Vec::new, |exclusion| exclusion.of(executor))
    }

    /// The periodic part: ends the exclusions whose time has passed, and fails the jobs that
    /// have had a task no live executor may run for the unschedulable timeout.
    pub(super) fn exclusion_tick(&mut self, now: u64) {
        let Some(exclusion) = self.exclusion.as_deref_mut() else {
            return;
        };
        for event in exclusion.expire(now) {
            self.publish(event);
        }
        self.fail_unschedulable(now);
    }

    fn fail_unschedulable(&mut self, now: u64) {
        let Some(exclusion) = self.exclusion.as_deref() else {
            return;
        };
        let timeout = exclusion.config.unschedulable_timeout_ms;
        // The jobs with failures counted; and, while an executor is excluded from every job,
        // the queued jobs without (all of whose tasks it may keep from running).
        let mut candidates: Vec<JobId> = exclusion.jobs.keys().copied().collect();
        if !exclusion.cluster.is_empty() {
            candidates.extend(
                self.queue
                    .iter()
                    .filter(|id| !exclusion.jobs.contains_key(id)),
            );
        }
        let mut since = Vec::new();
        let mut doomed = Vec::new();
        for job_id in candidates {
            // Only the live executors the job's constraints admit count. With none, the
            // no-executors timeout applies, or the job waits for its placement.
            let blocked = self
                .jobs
                .get(&job_id)
                .filter(|job| job.is_active())
                .and_then(|job| {
                    let live: Vec<&ExecutorId> = self.live_executors_for(job).collect();
                    (!live.is_empty())
                        .then(|| exclusion.blocked(job, &live))
                        .flatten()
                });
            let health = exclusion.jobs.get(&job_id);
            let Some(blocked) = blocked else {
                if health.is_some() {
                    since.push((job_id, None));
                }
                continue;
            };
            let start = health.and_then(|h| h.unschedulable_since).unwrap_or(now);
            since.push((job_id, Some(start)));
            if now.saturating_sub(start) >= timeout {
                let last_error = health.map(|h| h.last_error.clone()).unwrap_or_default();
                doomed.push((job_id, blocked, last_error));
            }
        }
        if let Some(exclusion) = self.exclusion.as_deref_mut() {
            for (job_id, start) in since {
                let health = exclusion.jobs.entry(job_id).or_default();
                if health.unschedulable_since.is_none() && start.is_some() {
                    tracing::info!(
                        job_id,
                        "a task of the job cannot run on any live executor after failures; \
                         it fails unless that changes within --exclude-unschedulable-timeout"
                    );
                }
                health.unschedulable_since = start;
            }
        }
        for (job_id, blocked, last_error) in doomed {
            self.abort_unschedulable(job_id, blocked, &last_error, timeout, now);
        }
    }

    /// Fails job `job_id` because its task `blocked.index` cannot run anywhere (Spark's
    /// `abortSinceCompletelyExcludedOnFailure`). A task that has run ends FAILED, as its last
    /// attempt did, and the journal says so; one that has never run ends KILLED with the job's
    /// other waiting tasks, as a restarted driver would end it.
    fn abort_unschedulable(
        &mut self,
        job_id: JobId,
        blocked: Blocked,
        last_error: &str,
        timeout_ms: u64,
        now: u64,
    ) {
        let index = blocked.index;
        let last = if last_error.is_empty() {
            "none"
        } else {
            last_error
        };
        let cap = crate::text::error_cap(self.config.max_reply_bytes);
        let error = crate::text::clip_owned(
            format!(
                "task {index} cannot run anywhere: {} (exclusion on failure), for {}; last \
                 error: {last}",
                blocked.why,
                humantime::format_duration(Duration::from_millis(timeout_ms))
            ),
            cap,
        );
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        let ran = index < job.tasks.launched().len() as u32 && job.tasks[index].attempts > 0;
        let executor = job.tasks[index].executor.clone();
        if let (true, Some(executor_id)) = (ran, executor) {
            if !job.tasks.kill_waiting(index) {
                return;
            }
            let record = &mut job.tasks[index];
            record.status = TaskStatus::Failed;
            let attempt = record.attempts - 1;
            job.failed += 1;
            job.errors.insert(index, error.clone());
            let entry = JournaledTask {
                task_id: job.first_task + u64::from(index),
                attempt,
                executor_id,
                state: TaskState::Failed,
                result: job.results.get(&index).cloned(),
                error: Some(error.clone()),
                in_bucket: job.in_bucket(index),
                result_object: job.result_objects.get(&index).cloned(),
                objects: job.outputs_of(index),
            };
            let term = self.config.term;
            self.journal(|| JournalRecord::TasksEnded {
                time_ms: now,
                tasks: vec![entry],
                term,
            });
            self.unqueue_if_dry(job_id);
        }
        self.end_job(job_id, JobState::Failed, Some(error), now);
    }
}

/// How a reason names the executors that count for `job`: " meeting its constraints" if it has
/// constraints, else nothing.
pub(super) fn meeting_constraints(job: &super::Job) -> &'static str {
    match job.placement.as_ref().is_some_and(|p| p.constrains()) {
        true => " meeting its constraints",
        false => "",
    }
}
