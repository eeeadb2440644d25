//! Task events, coalesced: `TaskStart` and `TaskEnd` entries wait a moment and go out together,
//! one event per job and kind, so that at one core per executor (one task per status batch)
//! the listener bus does not cost two messages per task. Any other event first flushes what
//! waits, so a job's `JobEnd` always follows its last `TaskEnd`.

use crate::ids::JobId;
use crate::protocol::Event;
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
    entries: usize,
    since: Option<Instant>,
}

impl TaskEvents {
    /// Takes `event` in if it is a task event (returning `None`); hands any other back.
    pub fn absorb(&mut self, event: Event) -> Option<Event> {
        let (job, count) = match &event {
            Event::TaskStart { job_id, tasks, .. } => (*job_id, tasks.len()),
            Event::TaskEnd { job_id, tasks, .. } => (*job_id, tasks.len()),
            _ => return Some(event),
        };
        self.since.get_or_insert_with(Instant::now);
        self.entries += count;
        match self.waiting.iter_mut().find(|w| same_kind(w, &event, job)) {
            Some(existing) => merge(existing, event),
            None => self.waiting.push(event),
        }
        None
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

fn merge(into: &mut Event, event: Event) {
    match (into, event) {
        (Event::TaskStart { tasks, .. }, Event::TaskStart { tasks: more, .. }) => {
            tasks.extend(more)
        }
        (Event::TaskEnd { tasks, .. }, Event::TaskEnd { tasks: more, .. }) => tasks.extend(more),
        _ => {}
    }
}
