//! A job's three timeouts (Temporal's schedule-to-start, start-to-close and
//! schedule-to-close): how long a task may wait to start, how long an attempt may run, and how
//! long the job may last. Each is a timer in one ordered set; the actor wakes the core when
//! the first is due ([`Core::next_due_ms`]), and the offer rounds check them too.
//!
//! Nothing of them is journaled: a job's deadline counts from its submission, which the journal
//! keeps, and a restarted driver starts the other two clocks again (a wait may restart, never
//! be skipped).

use super::jobs::{Job, TaskStatus, NO_DURATION};
use super::tasks::Pick;
use super::Core;
use crate::ids::JobId;
use crate::protocol::{JobState, JobTimeouts, TaskSpec, WaitReason};

/// The longest timeout a job may set: thirty days.
pub const MAX_TIMEOUT_MS: u64 = 30 * 24 * 3600 * 1000;

/// How often the kill of an attempt past its timeout is sent again while the attempt has not
/// ended: longer than an executor's grace for stopping work (5 s), so a kill that arrived is
/// not repeated while it takes effect.
pub const KILL_RESEND_MS: u64 = 10_000;

/// What a due timer checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Timer {
    /// The job's deadline.
    Deadline(JobId),
    /// Whether a task of the job has waited to start longer than its queue timeout.
    Queue(JobId),
    /// Whether attempt `.2` of task `.1` still runs, past the job's attempt timeout.
    Attempt(JobId, u32, u32),
    /// A concurrency key's rate window opens: an offer round.
    KeyWindow,
}

/// Checks a submission's timeouts: each from 1 ms to thirty days.
pub fn validate(timeouts: &JobTimeouts) -> Result<(), String> {
    let fields = [
        ("queue_timeout_ms", timeouts.queue_timeout_ms),
        ("attempt_timeout_ms", timeouts.attempt_timeout_ms),
        ("deadline_ms", timeouts.deadline_ms),
    ];
    for (name, value) in fields {
        if let Some(ms) = value.filter(|ms| !(1..=MAX_TIMEOUT_MS).contains(ms)) {
            return Err(format!(
                "{name} must be between 1 and {MAX_TIMEOUT_MS} (thirty days); got {ms}"
            ));
        }
    }
    Ok(())
}

/// A duration as people write it: `5s`, `1m 30s`, `250ms`.
fn written(ms: u64) -> humantime::FormattedDuration {
    humantime::format_duration(std::time::Duration::from_millis(ms))
}

impl Job {
    /// The attempt timeout the driver keeps for task `index`: the job's, unless the task's
    /// spec has its own (which its executor keeps).
    pub(super) fn attempt_timeout_of(&self, index: u32) -> Option<u64> {
        let limit = self.timeouts.attempt_timeout_ms?;
        match self.spec(index).as_ref() {
            TaskSpec::Command {
                timeout_ms: Some(_),
                ..
            }
            | TaskSpec::Python {
                timeout_ms: Some(_),
                ..
            } => None,
            _ => Some(limit),
        }
    }

    /// When task `index`, waiting to start, became ready to: when its job started (or this
    /// driver took it over), or, for a task that ran before, when its last attempt ended and
    /// any retry wait after it was over.
    fn ready_since(&self, index: u32) -> u64 {
        let record = &self.tasks[index];
        if record.attempts == 0 || record.duration_ms == NO_DURATION {
            return self.queued_at_ms;
        }
        let mut ready = record.started_ms + u64::from(record.duration_ms);
        if let (true, Some(backoff)) = (record.last_failed, self.retry_backoff) {
            let unit = super::backoff::jitter_unit(self.id, index, record.failures);
            ready += backoff.delay_ms(record.failures, unit);
        }
        ready.max(self.queued_at_ms)
    }

    /// The task that has waited to start the longest, and since when; none if none waits.
    fn longest_waiting(&self) -> Option<(u32, u64)> {
        let again = self
            .tasks
            .again()
            .map(|index| (index, self.ready_since(index)));
        let fresh = self
            .tasks
            .next_fresh()
            .map(|index| (index, self.queued_at_ms));
        again
            .chain(fresh)
            .min_by_key(|(index, since)| (*since, *index))
    }
}

impl Core {
    /// When the next timer or retry wait is due, if any is.
    pub fn next_due_ms(&self) -> Option<u64> {
        let timer = self.timers.first().map(|(due, _)| *due);
        match (timer, self.next_retry_ms()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Acts on what is due by `now`: retries whose wait is over line up, and timeouts fail
    /// tasks and jobs; then an offer round if anything changed.
    pub fn on_timers(&mut self, now: u64) {
        let woke = self.next_retry_ms().is_some_and(|due| due <= now);
        self.wake_retries(now);
        if self.fire_timers(now) || woke {
            self.make_offers(None, now);
        }
    }

    /// Acts on the timers due by `now`; whether any ended a job or stopped an attempt.
    pub(super) fn fire_timers(&mut self, now: u64) -> bool {
        let mut acted = false;
        while let Some(&(due, timer)) = self.timers.first() {
            if due > now {
                break;
            }
            self.timers.pop_first();
            acted |= match timer {
                Timer::Deadline(job_id) => self.deadline_passed(job_id, now),
                Timer::Queue(job_id) => self.check_queue(job_id, now),
                Timer::Attempt(job_id, index, attempt) => {
                    self.attempt_timed_out(job_id, index, attempt, now)
                }
                Timer::KeyWindow => true,
            };
        }
        acted
    }

    /// Sets the deadline of a job just made known, if it has one.
    pub(super) fn set_deadline(&mut self, job: &Job) {
        if let Some(deadline) = job.timeouts.deadline_ms {
            let due = job.submitted_at_ms.saturating_add(deadline);
            self.timers.insert((due, Timer::Deadline(job.id)));
        }
    }

    /// Takes a job's deadline off the timers: it ended.
    pub(super) fn clear_deadline(&mut self, job_id: JobId) {
        if let Some(job) = self.jobs.get(&job_id) {
            if let Some(deadline) = job.timeouts.deadline_ms {
                let due = job.submitted_at_ms.saturating_add(deadline);
                self.timers.remove(&(due, Timer::Deadline(job_id)));
            }
        }
    }

    /// Starts the queue clock of job `job_id`, whose tasks may run from `now` on.
    pub(super) fn start_queue_clock(&mut self, job_id: JobId, now: u64) {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        job.queued_at_ms = now;
        if let Some(limit) = job.timeouts.queue_timeout_ms {
            self.timers
                .insert((now.saturating_add(limit), Timer::Queue(job_id)));
        }
    }

    /// Sets the timer of attempt `attempt` of task `index` of job `job_id`, due at `due`.
    pub(super) fn start_attempt_timer(
        &mut self,
        job_id: JobId,
        index: u32,
        attempt: u32,
        due: u64,
    ) {
        self.timers
            .insert((due, Timer::Attempt(job_id, index, attempt)));
    }

    /// Takes the timer of an attempt that ended off the timers.
    pub(super) fn clear_attempt_timer(&mut self, job_id: JobId, index: u32, attempt: u32) {
        let Some(job) = self.jobs.get(&job_id) else {
            return;
        };
        let Some(limit) = job.attempt_timeout_of(index) else {
            return;
        };
        let timer = Timer::Attempt(job_id, index, attempt);
        if job.tasks[index].timed_out {
            // Its kill is being sent again, at a time of its own: rare enough to look for.
            self.timers.retain(|(_, t)| *t != timer);
        } else {
            let due = job.tasks[index].started_ms.saturating_add(limit);
            self.timers.remove(&(due, timer));
        }
    }

    fn deadline_passed(&mut self, job_id: JobId, now: u64) -> bool {
        let Some(job) = self.jobs.get(&job_id).filter(|job| job.is_open()) else {
            return false;
        };
        let deadline = job.timeouts.deadline_ms.unwrap_or_default();
        let reason = format!(
            "the job passed its deadline ({} after its submission) before it ended; its \
             running tasks were stopped",
            written(deadline)
        );
        self.end_job(job_id, JobState::Failed, Some(reason), now);
        true
    }

    /// Fails job `job_id` if a task of it has waited to start for its queue timeout; else
    /// sets the timer again for when the one that has waited longest would have.
    fn check_queue(&mut self, job_id: JobId, now: u64) -> bool {
        let Some(job) = self.jobs.get(&job_id).filter(|job| job.is_active()) else {
            return false;
        };
        let Some(limit) = job.timeouts.queue_timeout_ms else {
            return false;
        };
        match job.longest_waiting() {
            Some((index, since)) if now.saturating_sub(since) >= limit => {
                let reason = self.fail_unstarted(job_id, index, limit);
                self.unqueue_if_dry(job_id);
                self.end_job(job_id, JobState::Failed, Some(reason), now);
                true
            }
            waiting => {
                let since = waiting.map_or(now, |(_, since)| since);
                let due = since.saturating_add(limit).max(now + 1);
                self.timers.insert((due, Timer::Queue(job_id)));
                false
            }
        }
    }

    /// Takes waiting task `index` of job `job_id` out of its line and ends it FAILED for not
    /// starting within `limit`; returns the reason, which its job fails with.
    fn fail_unstarted(&mut self, job_id: JobId, index: u32, limit: u64) -> String {
        let job = self.jobs.get_mut(&job_id).expect("checked by the caller");
        let pick = match job.tasks.again().position(|waiting| waiting == index) {
            Some(position) => Pick::Again(position),
            None => Pick::Fresh,
        };
        let index = job.tasks.take(pick).unwrap_or(index);
        let reason = format!(
            "task {index} did not start within the queue timeout ({}): no executor with a \
             free core could take it",
            written(limit)
        );
        if index < job.tasks.launched().len() as u32 {
            job.tasks[index].status = TaskStatus::Failed;
            job.failed += 1;
            job.errors.insert(index, reason.clone());
        }
        reason
    }

    /// Stops attempt `attempt` of task `index` if it still runs: its end, when the executor
    /// reports it, is a failure that says it timed out.
    ///
    /// A `KillTask` may be lost on the way: until the attempt's end comes, the kill is sent
    /// again every [`KILL_RESEND_MS`] (a repeat changes nothing on an executor that has it).
    fn attempt_timed_out(&mut self, job_id: JobId, index: u32, attempt: u32, now: u64) -> bool {
        let Some(job) = self.jobs.get_mut(&job_id).filter(|job| job.is_active()) else {
            return false;
        };
        let limit = job.timeouts.attempt_timeout_ms.unwrap_or_default();
        let task_id = job.first_task + u64::from(index);
        let record = &mut job.tasks[index];
        let current = record.status == TaskStatus::Running && record.attempts == attempt + 1;
        let Some(executor) = record.executor.clone().filter(|_| current) else {
            return false;
        };
        if record.kill_requested {
            return false;
        }
        let first = !std::mem::replace(&mut record.timed_out, true);
        let reason = format!("attempt {attempt} timed out after {}", written(limit));
        self.send_kill(executor, task_id, attempt, reason);
        let again = now.saturating_add(KILL_RESEND_MS);
        self.start_attempt_timer(job_id, index, attempt, again);
        first
    }

    /// The waits of `job`'s tasks that end at a known time: retries resting until their
    /// backoff is over, and, with a queue timeout, tasks waiting for cores until it fails
    /// the job.
    pub(super) fn timed_waits(job: &Job) -> impl Iterator<Item = WaitReason> {
        let active = job.is_active();
        let resting = job.tasks.resting();
        let backoff = job
            .tasks
            .resting_until()
            .map(|(_, until_ms)| until_ms)
            .min()
            .filter(|_| active)
            .map(|until_ms| WaitReason::RetryBackoff {
                tasks: resting,
                until_ms,
            });
        let queue = job
            .timeouts
            .queue_timeout_ms
            .filter(|_| active)
            .and_then(|limit| {
                let (_, since) = job.longest_waiting()?;
                Some(WaitReason::QueueTimeout {
                    tasks: job.tasks.waiting(),
                    until_ms: since.saturating_add(limit),
                })
            });
        backoff.into_iter().chain(queue)
    }

    /// The failure an attempt stopped for its timeout ends with.
    pub(super) fn timed_out_error(&self, job_id: JobId, attempt: u32) -> String {
        let limit = self.jobs[&job_id]
            .timeouts
            .attempt_timeout_ms
            .unwrap_or_default();
        format!(
            "attempt {attempt} ran longer than the job's attempt timeout ({}) and was stopped",
            written(limit)
        )
    }
}
