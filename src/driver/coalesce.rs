//! Task events, coalesced: `TaskStart` and `TaskEnd` entries wait a moment and go out together,
//! one event per job and kind that names each executor once, so that at one core per executor
//! (one task per status batch) the listener bus does not cost two messages per task. Any other
//! event first flushes what waits, so a job's `JobEnd` always follows its last `TaskEnd`.

use crate::ids::{ExecutorId, JobId};
use crate::protocol::{Event, ExecutorTasks};
use std::collections::hash_map::{Entry, HashMap};
use std::time::Duration;
use tokio::time::Instant;

/// How long a task event may wait for company.
pub const EVENT_DELAY: Duration = Duration::from_millis(2);
/// How many task entries may wait before they go out anyway.
const MAX_WAITING: usize = 4096;

/// Task events waiting to be published.
#[derive(Default)]
pub struct TaskEvents {
    waiting: Vec<Event>,
    /// Where each executor's group is in each waiting event: (the event's place in `waiting`,
    /// executor) to the group's place in its `executors`. Found by hashing rather than by
    /// looking through the groups, which with many executors of one core each would cost a
    /// look at every waiting group per status batch.
    groups: HashMap<(usize, ExecutorId), usize>,
    entries: usize,
    since: Option<Instant>,
}

impl TaskEvents {
    /// Takes `event` in if it is a task event (returning `None`); hands any other back.
    pub fn absorb(&mut self, event: Event) -> Option<Event> {
        let (time_ms, job_id) = match &event {
            Event::TaskStart {
                time_ms, job_id, ..
            }
            | Event::TaskEnd {
                time_ms, job_id, ..
            } => (*time_ms, *job_id),
            _ => return Some(event),
        };
        self.since.get_or_insert_with(Instant::now);
        self.entries += event.task_count();
        let at = self.place_for(&event, time_ms, job_id);
        match (&mut self.waiting[at], event) {
            (
                Event::TaskStart { executors, .. },
                Event::TaskStart {
                    executors: more, ..
                },
            ) => merge(&mut self.groups, at, executors, more),
            (
                Event::TaskEnd { executors, .. },
                Event::TaskEnd {
                    executors: more, ..
                },
            ) => merge(&mut self.groups, at, executors, more),
            _ => {}
        }
        None
    }

    /// The place in `waiting` of the event of `event`'s job and kind; a new one, empty, if
    /// none waits.
    fn place_for(&mut self, event: &Event, time_ms: u64, job_id: JobId) -> usize {
        if let Some(at) = self
            .waiting
            .iter()
            .position(|w| same_kind(w, event, job_id))
        {
            return at;
        }
        self.waiting.push(match event {
            Event::TaskStart { .. } => Event::TaskStart {
                time_ms,
                job_id,
                executors: Vec::new(),
            },
            _ => Event::TaskEnd {
                time_ms,
                job_id,
                executors: Vec::new(),
            },
        });
        self.waiting.len() - 1
    }

    /// Whether what waits should go now.
    pub fn is_full(&self) -> bool {
        self.entries >= MAX_WAITING
    }

    /// When what waits is due, if anything waits.
    pub fn due(&self) -> Option<Instant> {
        self.since.map(|since| since + EVENT_DELAY)
    }

    /// Everything waiting, in the order it first arrived.
    pub fn take(&mut self) -> Vec<Event> {
        self.since = None;
        self.entries = 0;
        self.groups.clear();
        std::mem::take(&mut self.waiting)
    }
}

fn same_kind(waiting: &Event, event: &Event, job: JobId) -> bool {
    matches!(
        (waiting, event),
        (Event::TaskStart { job_id, .. }, Event::TaskStart { .. })
            | (Event::TaskEnd { job_id, .. }, Event::TaskEnd { .. }) if *job_id == job
    )
}

/// Adds `more` to `into`, the groups of the waiting event at `at`: an executor's tasks go after
/// those of its group there, if it has one, and keep their order.
fn merge<T>(
    groups: &mut HashMap<(usize, ExecutorId), usize>,
    at: usize,
    into: &mut Vec<ExecutorTasks<T>>,
    more: Vec<ExecutorTasks<T>>,
) {
    for group in more {
        match groups.entry((at, group.executor_id.clone())) {
            Entry::Occupied(place) => into[*place.get()].tasks.extend(group.tasks),
            Entry::Vacant(place) => {
                place.insert(into.len());
                into.push(group);
            }
        }
    }
}

