//! The trace of a run: every step folded into one 64-bit hash (FNV-1a), and printed line by line
//! with `--trace`. Two runs with the same seed must give the same hash.

use crate::protocol::{Event, JobState, TaskState};
use std::fmt::Display;
use std::io::Write;

/// The trace so far.
pub struct Trace {
    hash: u64,
    print: bool,
}

impl Trace {
    pub fn new(print: bool) -> Self {
        Self {
            hash: 0xcbf2_9ce4_8422_2325,
            print,
        }
    }

    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// Folds numbers into the hash.
    pub fn fold(&mut self, words: &[u64]) {
        for word in words {
            for byte in word.to_le_bytes() {
                self.hash ^= u64::from(byte);
                self.hash = self.hash.wrapping_mul(0x100_0000_01b3);
            }
        }
    }

    /// Whether lines are printed (so callers build them only then).
    pub fn printing(&self) -> bool {
        self.print
    }

    /// Prints one line of the trace.
    pub fn line(&self, now: u64, what: impl Display) {
        if self.print {
            let _ = writeln!(std::io::stdout().lock(), "{now:>9} {what}");
        }
    }
}

/// What of a published event goes into the trace's hash: its kind and what it says of each task
/// and job.
pub fn event_words(event: &Event) -> Vec<u64> {
    match event {
        Event::ExecutorAdded { time_ms, .. } => vec![1, *time_ms],
        Event::ExecutorRemoved { time_ms, .. } => vec![2, *time_ms],
        Event::JobStart { job_id, .. } => vec![3, *job_id],
        Event::TaskStart { job_id, .. } => {
            let mut words = vec![4, *job_id];
            words.extend(
                event
                    .started()
                    .flat_map(|(_, t)| [t.task_id, u64::from(t.attempt)]),
            );
            words
        }
        Event::TaskEnd { job_id, .. } => {
            let mut words = vec![5, *job_id];
            words.extend(
                event
                    .ended()
                    .flat_map(|(_, t)| [t.task_id, u64::from(t.attempt), state_word(t.state)]),
            );
            words
        }
        Event::JobEnd { job_id, state, .. } => {
            vec![6, *job_id, u64::from(*state == JobState::Succeeded)]
        }
        Event::ExecutorTarget {
            target_executors, ..
        } => vec![7, *target_executors],
        Event::ExecutorExcluded { until_ms, .. } => vec![8, *until_ms],
        Event::ExecutorUnexcluded { .. } => vec![9],
        Event::SpeculativeTaskStart {
            task_id, attempt, ..
        } => vec![10, *task_id, u64::from(*attempt)],
    }
}

fn state_word(state: TaskState) -> u64 {
    state as u64
}
