//! Concurrency keys (Hatchet's): limits that belong to a key, not to a job. A job names a key
//! (`SubmitJob.concurrency_key`); the attempts of all jobs that name it, speculative copies
//! and adopted attempts included, count against the key's limits: at most `max_concurrent`
//! running at once, and at most the rate's count started in any window of its length. Offers
//! pass over a job whose key is full, as over one that does not fit, and a key at its rate
//! sets a timer for when its window opens again.
//!
//! The limits are journaled (`KeyLimitsSet`, repeated by snapshots). What a key runs is
//! counted again from the attempts a restarted driver adopts; the starts in a rate's window
//! are not kept, so a window starts afresh on takeover.

use super::timeouts::Timer;
use super::Core;
use crate::protocol::{ApiReply, JournalRecord, KeyLimits, KeySummary, WaitReason, MAX_KEY_LEN};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The most keys that may have limits at once: what one `SetKeyLimits` after another may make
/// the driver hold is bounded.
pub const MAX_LIMITED_KEYS: usize = 10_000;

/// Every key with limits or with attempts running.
#[derive(Debug, Default)]
pub(super) struct Keys {
    keys: BTreeMap<String, Key>,
}

/// One key: its limits, what runs under it, and its recent starts.
#[derive(Debug, Default)]
struct Key {
    limits: KeyLimits,
    running: u32,
    /// Starts within the rate's window, oldest first (kept only under a rate).
    starts: VecDeque<u64>,
}

impl Key {
    /// How many of `starts` fall in the window that ends at `now`.
    fn started_in_window(&self, now: u64) -> u32 {
        let Some(rate) = self.limits.rate else {
            return 0;
        };
        let old = self
            .starts
            .partition_point(|t| t.saturating_add(rate.per_ms) <= now);
        (self.starts.len() - old) as u32
    }

    /// Why nothing more may start now under this key, if it may not.
    fn refusal(&self, key: &str, now: u64) -> Option<WaitReason> {
        if let Some(max) = self
            .limits
            .max_concurrent
            .filter(|max| self.running >= *max)
        {
            return Some(WaitReason::KeyConcurrency {
                key: key.to_string(),
                running: self.running,
                max_concurrent: max,
            });
        }
        let rate = self.limits.rate?;
        let in_window = self.started_in_window(now);
        if in_window < rate.count {
            return None;
        }
        // The start that leaves the window first makes room.
        let first = self.starts[self.starts.len() - in_window as usize];
        Some(WaitReason::KeyRate {
            key: key.to_string(),
            rate,
            until_ms: first.saturating_add(rate.per_ms),
        })
    }

    fn is_idle(&self) -> bool {
        self.limits.is_none() && self.running == 0
    }
}

/// Checks a key's name.
pub(super) fn validate_key(key: &str) -> Result<(), String> {
    crate::text::validate_key("concurrency key", key, MAX_KEY_LEN)
}

impl Keys {
    /// Whether an attempt under `key` may start at `now`.
    pub(super) fn admits(&self, key: &str, now: u64) -> bool {
        self.keys
            .get(key)
            .map_or(true, |state| state.refusal(key, now).is_none())
    }

    /// How many more attempts under `key` may start at `now` (`u32::MAX`: no limit).
    pub(super) fn room(&self, key: &str, now: u64) -> u32 {
        let Some(state) = self.keys.get(key) else {
            return u32::MAX;
        };
        let by_count = state
            .limits
            .max_concurrent
            .map_or(u32::MAX, |max| max.saturating_sub(state.running));
        let by_rate = state.limits.rate.map_or(u32::MAX, |rate| {
            rate.count.saturating_sub(state.started_in_window(now))
        });
        by_count.min(by_rate)
    }

    /// Why tasks under `key` wait at `now`, if its limits hold them.
    pub(super) fn refusal(&self, key: &str, now: u64) -> Option<WaitReason> {
        self.keys.get(key)?.refusal(key, now)
    }

    /// The limits of `key` (none set: the default, which limits nothing).
    pub(super) fn limits(&self, key: &str) -> KeyLimits {
        self.keys.get(key).map(|k| k.limits).unwrap_or_default()
    }

    /// An attempt under `key` started at `now`.
    pub(super) fn started(&mut self, key: &str, now: u64) {
        // The name is copied only for a key not yet held, not on every launch.
        if !self.keys.contains_key(key) {
            self.keys.insert(key.to_string(), Key::default());
        }
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        state.running += 1;
        if let Some(rate) = state.limits.rate {
            while state
                .starts
                .front()
                .is_some_and(|t| t.saturating_add(rate.per_ms) <= now)
            {
                state.starts.pop_front();
            }
            state.starts.push_back(now);
        }
    }

    /// An attempt under `key` ended.
    pub(super) fn ended(&mut self, key: &str) {
        if let Some(state) = self.keys.get_mut(key) {
            state.running = state.running.saturating_sub(1);
            if state.is_idle() {
                self.keys.remove(key);
            }
        }
    }

    /// Sets the limits of `key`; refused past [`MAX_LIMITED_KEYS`] keys with limits.
    fn set(&mut self, key: &str, limits: KeyLimits) -> Result<(), String> {
        let limited = self.keys.values().filter(|k| !k.limits.is_none()).count();
        let new = self.keys.get(key).map_or(true, |k| k.limits.is_none());
        if !limits.is_none() && new && limited >= MAX_LIMITED_KEYS {
            return Err(format!(
                "{MAX_LIMITED_KEYS} keys have limits already; clear one first"
            ));
        }
        let state = self.keys.entry(key.to_string()).or_default();
        state.limits = limits;
        if limits.rate.is_none() {
            state.starts.clear();
        }
        if state.is_idle() {
            self.keys.remove(key);
        }
        Ok(())
    }

    /// Every key with limits, with them.
    pub(super) fn limited(&self) -> impl Iterator<Item = (&str, KeyLimits)> {
        self.keys
            .iter()
            .filter(|(_, k)| !k.limits.is_none())
            .map(|(key, k)| (key.as_str(), k.limits))
    }

    /// When the first key at its rate may start a task again, if one is at it.
    fn next_window(&self, now: u64) -> Option<u64> {
        self.keys
            .iter()
            .filter(|(_, k)| k.limits.rate.is_some())
            .filter_map(|(key, k)| match k.refusal(key, now)? {
                WaitReason::KeyRate { until_ms, .. } => Some(until_ms),
                _ => None,
            })
            .min()
    }

    /// What each key counts as running, with its `max_concurrent`.
    #[cfg(test)]
    pub(super) fn running_counts(&self) -> BTreeMap<&str, (u32, Option<u32>)> {
        self.keys
            .iter()
            .filter(|(_, k)| k.running > 0)
            .map(|(key, k)| (key.as_str(), (k.running, k.limits.max_concurrent)))
            .collect()
    }

    /// Whether any key has a rate.
    fn any_rate(&self) -> bool {
        self.keys.values().any(|k| k.limits.rate.is_some())
    }
}

impl Core {
    /// `SetKeyLimits`: sets (or clears) `key`'s limits, journaled, and offers at once, since
    /// more may run now.
    pub(super) fn on_set_key_limits(
        &mut self,
        key: String,
        limits: KeyLimits,
        now: u64,
    ) -> ApiReply {
        let checked = validate_key(&key).and_then(|()| limits.validate());
        if let Err(message) = checked.and_then(|()| self.keys.set(&key, limits)) {
            return ApiReply::Error { message };
        }
        self.journal(|| JournalRecord::KeyLimitsSet {
            key: key.clone(),
            limits,
            time_ms: now,
        });
        self.make_offers(None, now);
        ApiReply::Keys {
            keys: vec![self.key_summary(&key, now)],
        }
    }

    /// Replays a `KeyLimitsSet` record.
    pub(super) fn replay_key_limits(&mut self, key: &str, limits: KeyLimits) {
        // A record the driver wrote passed these checks; one that does not is left out.
        if validate_key(key).is_ok() && limits.validate().is_ok() {
            let _ = self.keys.set(key, limits);
        }
    }

    /// `ListKeys`: every key with limits or with an open job that names it, in key order.
    pub(super) fn keys_reply(&self, now: u64) -> ApiReply {
        let mut named: BTreeSet<&str> = self
            .jobs
            .values()
            .filter(|job| job.is_open())
            .filter_map(|job| job.concurrency_key.as_deref())
            .collect();
        named.extend(self.keys.keys.keys().map(String::as_str));
        let keys = named
            .into_iter()
            .map(|key| self.key_summary(key, now))
            .collect();
        ApiReply::Keys { keys }
    }

    fn key_summary(&self, key: &str, now: u64) -> KeySummary {
        let state = self.keys.keys.get(key);
        let jobs = self
            .jobs
            .values()
            .filter(|job| job.is_open() && job.concurrency_key.as_deref() == Some(key))
            .count() as u32;
        KeySummary {
            key: key.to_string(),
            limits: self.keys.limits(key),
            running: state.map_or(0, |k| k.running),
            jobs,
            started_in_window: state
                .filter(|k| k.limits.rate.is_some())
                .map(|k| k.started_in_window(now)),
        }
    }

    /// Why tasks of `job` that are ready to run wait for its concurrency key at `now`, if they
    /// do.
    pub(super) fn key_wait(&self, job: &super::Job, now: u64) -> Option<WaitReason> {
        if !job.is_active() || !job.tasks.has_waiting() {
            return None;
        }
        self.keys.refusal(job.concurrency_key.as_deref()?, now)
    }

    /// Sets a timer for when the first key held at its rate may start a task again, if tasks
    /// wait and one is: an offer round then.
    pub(super) fn arm_key_window(&mut self, now: u64) {
        if self.queue.is_empty() || !self.keys.any_rate() {
            return;
        }
        if let Some(due) = self.keys.next_window(now) {
            self.timers.insert((due, Timer::KeyWindow));
        }
    }
}
