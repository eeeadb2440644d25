//! Task events, coalesced: `TaskStart` and `TaskEnd` entries wait a moment and go out together,
//! one event per job and kind that names each executor once, so that at one core per executor
//! (one task per status batch) the listener bus does not cost two messages per task. Any other
//! event first flushes what waits, so a job's `JobEnd` always follows its last `TaskEnd`.
//!
//! What waits goes out starts first, so a listener hears of an attempt's start before its end
//! even when the job's ends began to gather first. A retry's start is not gathered while ends
//! of its job wait (one of them may be the previous attempt's): it goes after them.

use crate::ids::{ExecutorId, JobId};
use crate::protocol::{Event, ExecutorTasks};
use std::collections::hash_map::{Entry, HashMap};
use std::time::Duration;
use tokio::time::Instant;

/// How long a task event may wait for company: at one core per executor, a job's starts and
/// ends of 8 ms go out as one event of each kind (and, with a journal, one stored copy of
/// each), a small part of a message per task. A listener hears of a task up to this much
/// later; what a client waits for (a job's end, an answer) never waits for it.
pub const EVENT_DELAY: Duration = Duration::from_millis(8);
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
    /// Takes `event` in if it is a task event that may wait (returning `None`); hands back any
    /// other, which must follow what waits: events other than task events, and the start of a
    /// retry while ends of its job wait.
    pub fn absorb(&mut self, event: Event) -> Option<Event> {
        if self.retry_after_ends(&event) {
            return Some(event);
        }
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
        // One driver's events, of its one term.
        self.waiting.push(match *event {
            Event::TaskStart { term, .. } => Event::TaskStart {
                time_ms,
                job_id,
                executors: Vec::new(),
                term,
            },
            Event::TaskEnd { term, .. } => Event::TaskEnd {
                time_ms,
                job_id,
                executors: Vec::new(),
                term,
            },
            _ => unreachable!("only task events wait"),
        });
        self.waiting.len() - 1
    }

    /// Whether `event` starts a retry of a job whose ends wait.
    fn retry_after_ends(&self, event: &Event) -> bool {
        let Event::TaskStart { job_id, .. } = event else {
            return false;
        };
        // The few waiting events first: the event's attempts are many, and seldom retries.
        self.waiting
            .iter()
            .any(|w| matches!(w, Event::TaskEnd { job_id: job, .. } if job == job_id))
            && event.started().any(|(_, task)| task.attempt > 0)
    }

    /// Whether what waits should go now.
    pub fn is_full(&self) -> bool {
        self.entries >= MAX_WAITING
    }

    /// When what waits is due, if anything waits.
    pub fn due(&self) -> Option<Instant> {
        self.since.map(|since| since + EVENT_DELAY)
    }

    /// Everything waiting: the starts, then the ends, each in the order it first arrived.
    pub fn take(&mut self) -> Vec<Event> {
        self.since = None;
        self.entries = 0;
        self.groups.clear();
        let (mut starts, ends): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|event| matches!(event, Event::TaskStart { .. }));
        starts.extend(ends);
        starts
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{TaskEnded, TaskStarted, TaskState};

    fn id(name: &str) -> ExecutorId {
        ExecutorId::parse(name).unwrap()
    }

    fn ended(task_id: u64) -> TaskEnded {
        TaskEnded {
            task_id,
            index: task_id as u32,
            attempt: 0,
            state: TaskState::Finished,
            duration_ms: 1,
            error: None,
        }
    }

    fn task_end(time_ms: u64, job_id: JobId, executor: &str, ids: &[u64]) -> Event {
        Event::TaskEnd {
            time_ms,
            job_id,
            executors: vec![ExecutorTasks {
                executor_id: id(executor),
                tasks: ids.iter().copied().map(ended).collect(),
            }],
            term: 0,
        }
    }

    fn task_start(job_id: JobId, executor: &str, ids: &[u64]) -> Event {
        attempt_start(job_id, executor, ids, 0)
    }

    fn attempt_start(job_id: JobId, executor: &str, ids: &[u64], attempt: u32) -> Event {
        let tasks = ids
            .iter()
            .map(|&task_id| TaskStarted {
                task_id,
                index: task_id as u32,
                attempt,
            })
            .collect();
        Event::TaskStart {
            time_ms: 1,
            job_id,
            executors: vec![ExecutorTasks {
                executor_id: id(executor),
                tasks,
            }],
            term: 0,
        }
    }

    /// (executor, task ids) in an event's order.
    type Groups = Vec<(String, Vec<u64>)>;

    /// Each event as (kind, job, groups).
    fn shape(events: &[Event]) -> Vec<(&'static str, JobId, Groups)> {
        events
            .iter()
            .map(|event| {
                let job = match event {
                    Event::TaskStart { job_id, .. } | Event::TaskEnd { job_id, .. } => *job_id,
                    other => panic!("not a task event: {other:?}"),
                };
                let mut groups = Groups::new();
                let pairs = event
                    .started()
                    .map(|(e, t)| (e, t.task_id))
                    .chain(event.ended().map(|(e, t)| (e, t.task_id)));
                for (executor, task_id) in pairs {
                    match groups.last_mut() {
                        Some((last, ids)) if last == executor.as_str() => ids.push(task_id),
                        _ => groups.push((executor.to_string(), vec![task_id])),
                    }
                }
                (event.kind(), job, groups)
            })
            .collect()
    }

    #[test]
    fn entries_of_one_job_and_kind_go_out_together_each_executor_named_once() {
        let mut events = TaskEvents::default();
        for event in [
            task_end(10, 1, "a", &[1, 2]),
            task_end(11, 1, "b", &[3]),
            task_start(1, "a", &[7]),
            task_end(12, 1, "a", &[4]),
            task_end(12, 2, "a", &[5]),
            task_end(13, 1, "b", &[6]),
        ] {
            assert!(events.absorb(event).is_none());
        }
        assert!(events.due().is_some());
        let taken = events.take();
        assert_eq!(
            shape(&taken),
            [
                ("task.start", 1, vec![("a".into(), vec![7])]),
                (
                    "task.end",
                    1,
                    vec![("a".into(), vec![1, 2, 4]), ("b".into(), vec![3, 6])]
                ),
                ("task.end", 2, vec![("a".into(), vec![5])]),
            ]
        );
        // The first event's time stands for the merged one.
        assert!(matches!(taken[1], Event::TaskEnd { time_ms: 10, .. }));
        assert!(events.due().is_none());

        // What was taken is forgotten: a new round starts new events.
        events.absorb(task_end(20, 2, "b", &[8]));
        events.absorb(task_end(20, 2, "a", &[9]));
        assert_eq!(
            shape(&events.take()),
            [(
                "task.end",
                2,
                vec![("b".into(), vec![8]), ("a".into(), vec![9])]
            )]
        );
    }

    #[test]
    fn other_events_are_handed_back_and_a_full_store_says_so() {
        let mut events = TaskEvents::default();
        let job_start = Event::JobStart {
            time_ms: 1,
            job_id: 1,
            name: String::new(),
            tasks: 1,
        };
        assert_eq!(events.absorb(job_start.clone()), Some(job_start));
        assert!(events.due().is_none());
        let ids: Vec<u64> = (0..MAX_WAITING as u64 - 1).collect();
        events.absorb(task_end(1, 1, "a", &ids));
        assert!(!events.is_full());
        events.absorb(task_end(1, 1, "b", &[u64::MAX]));
        assert!(events.is_full());
        assert_eq!(events.take()[0].task_count(), MAX_WAITING);
        assert!(!events.is_full());
    }

    /// An attempt's end can gather before its start does (the job's ends began to wait first,
    /// then the attempt started and ended within the same moment): the start still goes first.
    #[test]
    fn an_attempt_that_starts_and_ends_while_ends_wait_is_heard_starting_first() {
        let mut events = TaskEvents::default();
        events.absorb(task_end(10, 1, "a", &[1]));
        events.absorb(task_start(1, "a", &[2]));
        events.absorb(task_end(11, 1, "a", &[2]));
        let taken = events.take();
        assert_eq!(
            shape(&taken),
            [
                ("task.start", 1, vec![("a".into(), vec![2])]),
                ("task.end", 1, vec![("a".into(), vec![1, 2])]),
            ]
        );
    }

    /// A retry's start must follow the previous attempt's end, which may be among the ends
    /// waiting: it is handed back, to go after them. With no end of its job waiting, or for a
    /// first attempt, it waits like any other start.
    #[test]
    fn a_retry_is_not_gathered_while_ends_of_its_job_wait() {
        let mut events = TaskEvents::default();
        events.absorb(task_end(10, 1, "a", &[1]));
        let retry = attempt_start(1, "b", &[1], 1);
        assert_eq!(events.absorb(retry.clone()), Some(retry.clone()));
        assert!(events.absorb(attempt_start(2, "b", &[5], 1)).is_none());
        assert!(events.absorb(task_start(1, "b", &[3])).is_none());
        events.take();
        assert!(events.absorb(retry).is_none());
    }
}
