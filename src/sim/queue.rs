//! The virtual clock and its event queue: events wait in (time, sequence) order, so two events
//! due at the same millisecond run in the order they were scheduled, on every run.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// An event with when it is due; ordered by (time, sequence) alone.
#[derive(Debug)]
struct Due<E> {
    key: (u64, u64),
    event: E,
}

impl<E> PartialEq for Due<E> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl<E> Eq for Due<E> {}

impl<E> PartialOrd for Due<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Due<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key.cmp(&other.key)
    }
}

/// A discrete-event queue; popping an event moves the clock to its time.
#[derive(Debug)]
pub struct Queue<E> {
    events: BinaryHeap<Reverse<Due<E>>>,
    seq: u64,
    now: u64,
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Self {
            events: BinaryHeap::new(),
            seq: 0,
            now: 0,
        }
    }
}

impl<E> Queue<E> {
    /// Virtual milliseconds since the run began.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Schedules `event` `delay` ms from now.
    pub fn after(&mut self, delay: u64, event: E) {
        self.at(self.now + delay, event);
    }

    /// Schedules `event` at `time` (now, if that has passed).
    pub fn at(&mut self, time: u64, event: E) {
        self.seq += 1;
        let key = (time.max(self.now), self.seq);
        self.events.push(Reverse(Due { key, event }));
    }

    /// The next event, with the clock moved to its time.
    pub fn pop(&mut self) -> Option<E> {
        let Reverse(due) = self.events.pop()?;
        self.now = due.key.0;
        Some(due.event)
    }
}

#[cfg(test)]
mod tests {
    use super::Queue;

    #[test]
    fn events_come_in_time_then_schedule_order() {
        let mut queue = Queue::default();
        queue.at(5, "late");
        queue.at(1, "first");
        queue.at(1, "second");
        let order: Vec<_> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(order, ["first", "second", "late"]);
        assert_eq!(queue.now(), 5);
    }
}
