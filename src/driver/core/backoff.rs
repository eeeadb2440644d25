//! Retries that wait: a job with a `retry_backoff` sets each failed task that will run again
//! aside (it rests, holding no cores) until its wait is over, then lines it up first to run
//! again. Each wait is journaled, so a restarted driver keeps it and counts the task's failures
//! on; the offer rounds (every revive interval) wake what is due.

use super::Core;
use crate::ids::JobId;
use crate::protocol::{JournalRecord, RetryBackoff};

/// The longest wait a backoff may name: a day.
pub const MAX_BACKOFF_MS: u64 = 24 * 3600 * 1000;

/// Checks a submitted backoff: waits of 1 ms to a day, a finite multiplier of 1 to 100, a cap
/// no shorter than the first wait, and jitter between 0 and 1.
pub fn validate(backoff: &RetryBackoff) -> Result<(), String> {
    if !(1..=MAX_BACKOFF_MS).contains(&backoff.initial_ms) {
        return Err(format!(
            "retry_backoff initial_ms must be between 1 and {MAX_BACKOFF_MS} (a day); got {}",
            backoff.initial_ms
        ));
    }
    if !(1.0..=100.0).contains(&backoff.multiplier) {
        return Err(format!(
            "retry_backoff multiplier must be between 1 and 100; got {}",
            backoff.multiplier
        ));
    }
    if let Some(max_ms) = backoff.max_ms {
        if !(backoff.initial_ms..=MAX_BACKOFF_MS).contains(&max_ms) {
            return Err(format!(
                "retry_backoff max_ms must be between initial_ms ({}) and {MAX_BACKOFF_MS} (a \
                 day); got {max_ms}",
                backoff.initial_ms
            ));
        }
    }
    if !(0.0..=1.0).contains(&backoff.jitter) {
        return Err(format!(
            "retry_backoff jitter must be between 0 and 1; got {}",
            backoff.jitter
        ));
    }
    Ok(())
}

/// A number in [0, 1) drawn from a task's ids and failure count: the same on every driver
/// and in every replay, and spread over tasks that failed together.
pub fn jitter_unit(job_id: JobId, index: u32, failures: u32) -> f64 {
    let mut x = job_id
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(index) << 20 | u64::from(failures));
    // splitmix64's finalizer.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

impl Core {
    /// Sets task `index` of job `job_id`, which failed for the `failures`-th time and will run
    /// again, aside until its backoff is over; journals the wait. Its record is `Pending`.
    pub(super) fn rest_retry(
        &mut self,
        job_id: JobId,
        index: u32,
        failures: u32,
        backoff: RetryBackoff,
        now: u64,
    ) {
        let wait = backoff.delay_ms(failures, jitter_unit(job_id, index, failures));
        let until_ms = now.saturating_add(wait);
        if let Some(job) = self.jobs.get_mut(&job_id) {
            job.tasks.rest(index, until_ms);
        }
        self.retry_waits.insert((until_ms, job_id, index));
        self.journal(|| JournalRecord::TaskRetryWaits {
            job_id,
            index,
            failures,
            until_ms,
        });
    }

    /// Lines up the retries whose wait is over by `now`, each first in its job's line; a job
    /// that had nothing else waiting goes back in the queue.
    pub(super) fn wake_retries(&mut self, now: u64) {
        while let Some(&(until_ms, job_id, index)) = self.retry_waits.first() {
            if until_ms > now {
                break;
            }
            self.retry_waits.pop_first();
            let Some(job) = self.jobs.get_mut(&job_id) else {
                continue; // forgotten
            };
            if job.is_active() && job.tasks.wake(index, until_ms) && !self.queue.contains(&job_id) {
                self.enqueue(job_id);
            }
        }
    }

    /// When the next resting retry may run, if one rests.
    pub fn next_retry_ms(&self) -> Option<u64> {
        self.retry_waits.first().map(|(until_ms, ..)| *until_ms)
    }

    /// Replays a journaled wait: the task rests until `until_ms` (at once, on the next offer
    /// round, if that has passed) with its failures counted, unless a later record settled it.
    pub(super) fn replay_retry_wait(
        &mut self,
        job_id: JobId,
        index: u32,
        failures: u32,
        until_ms: u64,
    ) -> Result<(), super::restore::ReplayError> {
        let job = self
            .jobs
            .get_mut(&job_id)
            .ok_or(super::restore::ReplayError::UnknownJob(job_id))?;
        if index >= job.len() {
            return Ok(());
        }
        let record = &mut job.tasks[index];
        if record.status != super::jobs::TaskStatus::Pending {
            return Ok(());
        }
        record.failures = record.failures.max(failures);
        // At least as many attempts ran; the next one is numbered after them.
        record.attempts = record.attempts.max(failures);
        record.last_failed = true;
        job.tasks.rest(index, until_ms);
        self.retry_waits.insert((until_ms, job_id, index));
        Ok(())
    }

    /// The waits of a job's resting tasks, for a snapshot.
    pub(super) fn retry_waits_of(
        job: &super::jobs::Job,
    ) -> impl Iterator<Item = JournalRecord> + '_ {
        job.tasks
            .resting_until()
            .map(|(index, until_ms)| JournalRecord::TaskRetryWaits {
                job_id: job.id,
                index,
                failures: job.tasks[index].failures,
                until_ms,
            })
    }
}
