//! What the driver sends, held behind its writes. What a record makes true is told to no one
//! before the record is stored: a step's answers to clients and its events wait, in order,
//! behind the writes before them, and leave when those are stored.
//!
//! What goes to executors (status acknowledgements, launches, kills, heartbeat and
//! registration answers) need not wait: an executor is told nothing by them that a restarted
//! driver would have to remember. Should the driver die before a record is stored, the next
//! driver has another instance id, and an executor that registers with it drops the old
//! driver's attempts and statuses whether they were acknowledged or not, so the tasks run
//! again either way. Such messages leave at once, unless one is already waiting (they keep
//! their order) or too much waits behind the journal: then they wait too, and the executors,
//! getting no new tasks, slow down to what the journal stores.
//!
//! Records are stored in groups (group commit): while a group write is in flight, the records
//! of the steps that follow gather into the next group, which is written, one message of
//! records one per line, as soon as the write before it is stored (or once it is full). A
//! group of task ends alone also waits until `GROUP_INTERVAL` after the last write started,
//! so that a loop of one task at a time does not cost the broker a write per task; what waits
//! for it then is task events, which wait longer for company anyway. A group with any other
//! record (a job submitted or ended, which a client waits for), or that a client's answer waits
//! behind, goes at once, even beside a write in flight (what follows it still waits for both,
//! in order).
//!
//! [`Outbox`] is these rules alone: a state machine over numbered writes that does no I/O and
//! reads no clock. It says which group to write and when, and what may be sent once a write is
//! stored; whoever runs it does the writing. The driver's actor runs it with the journal's
//! writes as futures (`outgoing`), the simulator with its model of the broker.

use super::core::Effect;
use super::Moment;
use crate::protocol::JournalRecord;
use std::collections::VecDeque;
use std::time::Duration;

/// How many group writes may be in flight before the next group waits for one to be stored.
/// One: the records of the steps that follow gather into the next group meanwhile, so the
/// journal costs the broker one write per round trip of its own, however fast the loop runs.
pub const GROUPS_IN_FLIGHT: usize = 1;

/// How many writes may be in flight before an urgent group waits: one that a client waits for
/// (a job's end, say) need not wait for the write before it to be stored.
pub const URGENT_IN_FLIGHT: usize = 2;

/// How long after the last write started a group of task ends alone waits for more: at one
/// task per status batch, each write then carries the ends of a few milliseconds' work, so the
/// journal costs the broker and the driver a small part of a message per task. Only task
/// events wait for it (a client's answer makes the group go at once), and they wait longer.
pub const GROUP_INTERVAL: Duration = Duration::from_millis(4);

/// How many outputs may wait behind the journal before executors' messages wait too.
pub const MAX_HELD: usize = 8192;

/// Whether `record` is one a client waits for (anything but task ends), so that its group
/// goes without waiting for more.
pub fn urgent(record: &JournalRecord) -> bool {
    !matches!(record, JournalRecord::TasksEnded { .. })
}

/// An api request taken from the driver's NATS service endpoint, to be answered through it so
/// that `$SRV.STATS` counts it.
pub type ReplyTo = Box<async_nats::service::Request>;

/// A refusal, as a NATS micro service error (ADR-32): the answer keeps its JSON body and
/// carries `Nats-Service-Error` (the message) and `Nats-Service-Error-Code` beside it, so that
/// NATS tooling counts it as an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceError {
    pub code: u16,
    pub description: String,
}

impl ServiceError {
    /// The error `reply` stands for, if it refuses: 400 for a request refused, 503 while no
    /// driver can lead.
    pub fn of(reply: &crate::protocol::ApiReply) -> Option<Self> {
        use crate::protocol::ApiReply;
        let (code, message) = match reply {
            ApiReply::Error { message } => (400, message),
            ApiReply::Unavailable { message } => (503, message),
            _ => return None,
        };
        // A header value is one line.
        let description = message
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        Some(Self { code, description })
    }

    /// Adds the headers of the error `reply` stands for, if any, to `headers`.
    pub fn add_for(reply: &crate::protocol::ApiReply, headers: &mut async_nats::HeaderMap) {
        if let Some(error) = Self::of(reply) {
            error.add_to(headers);
        }
    }

    /// Adds the error's headers to `headers`.
    pub fn add_to(&self, headers: &mut async_nats::HeaderMap) {
        headers.insert(
            async_nats::service::NATS_SERVICE_ERROR,
            self.description.as_str(),
        );
        headers.insert(
            async_nats::service::NATS_SERVICE_ERROR_CODE,
            self.code.to_string().as_str(),
        );
    }
}

/// One thing the driver sends.
pub enum Output {
    /// The answer to a client's request: (where it goes, payload, the error it stands for).
    Reply(ReplyTo, bytes::Bytes, Option<ServiceError>),
    /// The answer to an executor's request: (reply subject, payload).
    ExecutorReply(async_nats::Subject, bytes::Bytes),
    /// An event or an executor's message.
    Effect(Effect),
    /// A page of results to fill from the results bucket before it is sent.
    Results {
        reply: ReplyTo,
        read: super::core::BucketRead,
    },
}

/// Who an output goes to, as far as the outbox cares.
pub trait Addressed {
    /// Whether it goes to an executor, and so need not wait for the journal.
    fn to_executor(&self) -> bool;

    /// Whether a client waits for it (an answer), so that the group it waits behind goes
    /// without waiting for more.
    fn awaited(&self) -> bool;
}

impl Addressed for Output {
    fn to_executor(&self) -> bool {
        matches!(
            self,
            Output::ExecutorReply(..) | Output::Effect(Effect::Send { .. })
        )
    }

    fn awaited(&self) -> bool {
        matches!(self, Output::Reply(..) | Output::Results { .. })
    }
}

/// How much the outbox lets through; the constants above unless a test asks for less.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub groups_in_flight: usize,
    pub urgent_in_flight: usize,
    pub interval: Duration,
    pub max_held: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            groups_in_flight: GROUPS_IN_FLIGHT,
            urgent_in_flight: URGENT_IN_FLIGHT,
            interval: GROUP_INTERVAL,
            max_held: MAX_HELD,
        }
    }
}

/// A group of records to write now, as write number `write`.
#[derive(Debug, PartialEq, Eq)]
pub struct Group<R> {
    pub write: u64,
    pub records: Vec<R>,
}

// Held outputs are the common case: boxing each would cost an allocation per message.
#[allow(clippy::large_enum_variant)]
enum Held<O> {
    /// Where write number `n` sits in the order.
    Write(u64),
    Output(O),
}

/// The records gathering for the next group write.
struct Gathering<R> {
    write: u64,
    records: Vec<R>,
    /// Their size as one message, a line each.
    bytes: usize,
}

/// A write started and not yet released.
struct InFlight {
    write: u64,
    /// Once stored: the journal sequence it took, if it is a journal write of a leader.
    stored: Option<Option<u64>>,
}

/// Outputs (`O`) waiting for the writes before them, and the journal records (`R`) gathering
/// for the next group write, on a clock of `T`.
pub struct Outbox<O, R, T> {
    limits: Limits,
    held: VecDeque<Held<O>>,
    /// Executors' messages among the held outputs.
    held_for_executors: usize,
    /// Outputs among `held`.
    held_outputs: usize,
    /// The writes started, in order, until the outputs behind them are released: a write
    /// stored before the one before it still counts as in flight until that one is stored.
    in_flight: VecDeque<InFlight>,
    /// The number of the last write started or gathering.
    writes: u64,
    /// The sequence of the last journal write whose outputs were released.
    released_through: u64,
    /// Its place in the order is the last `Held::Write`, which is not in `in_flight` yet.
    group: Option<Gathering<R>>,
    /// Whether the group holds a record someone waits for, so it goes without waiting.
    urgent: bool,
    /// When the last group write started.
    last_started: Option<T>,
}

impl<O, R, T> Default for Outbox<O, R, T> {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

impl<O, R, T> Outbox<O, R, T> {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            held: VecDeque::new(),
            held_for_executors: 0,
            held_outputs: 0,
            in_flight: VecDeque::new(),
            writes: 0,
            released_through: 0,
            group: None,
            urgent: false,
            last_started: None,
        }
    }

    /// Whether no write is in flight or gathering, so any output may leave at once.
    pub fn is_clear(&self) -> bool {
        self.in_flight.is_empty() && self.group.is_none()
    }

    /// Whether write number `write` was started and its outputs are not yet released.
    #[cfg(test)]
    pub fn is_in_flight(&self, write: u64) -> bool {
        self.in_flight.iter().any(|w| w.write == write)
    }

    /// The journal sequence of the last group write whose outputs [`Outbox::stored`] released
    /// (0 before any): every output held behind it, and behind the writes before it, has left.
    pub fn released_through(&self) -> u64 {
        self.released_through
    }

    /// How many outputs wait.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held_outputs
    }
}

impl<O: Addressed, R, T: Moment> Outbox<O, R, T> {
    /// An output of the step: given back if it may leave now, else held behind the writes
    /// before it. An executor's message leaves at once unless one already waits or too much
    /// does; anything else only while no write is in flight or gathering. An answer held
    /// behind the group gathering makes that group urgent.
    pub fn send_or_hold(&mut self, output: O) -> Option<O> {
        let to_executor = output.to_executor();
        let passes =
            to_executor && self.held_for_executors == 0 && self.held_outputs < self.limits.max_held;
        if self.is_clear() || passes {
            return Some(output);
        }
        if self.group.is_some() && output.awaited() {
            self.urgent = true;
        }
        self.held_outputs += 1;
        self.held_for_executors += usize::from(to_executor);
        self.held.push_back(Held::Output(output));
        None
    }

    /// Adds one journal record of `bytes` (at most `max_bytes`) to the group gathering; a
    /// group it would make larger than `max_bytes` is sealed first, and given back to be
    /// written now. An `urgent` record is one a client waits for: its group goes without
    /// waiting for more.
    pub fn record(
        &mut self,
        record: R,
        bytes: usize,
        urgent: bool,
        max_bytes: usize,
        now: T,
    ) -> Option<Group<R>> {
        let full = self
            .group
            .as_ref()
            .is_some_and(|group| group.bytes + 1 + bytes > max_bytes);
        let sealed = if full { self.seal(now) } else { None };
        match &mut self.group {
            Some(group) => {
                group.bytes += 1 + bytes;
                group.records.push(record);
            }
            None => {
                self.writes += 1;
                self.held.push_back(Held::Write(self.writes));
                self.group = Some(Gathering {
                    write: self.writes,
                    records: vec![record],
                    bytes,
                });
            }
        }
        self.urgent |= urgent;
        sealed
    }

    /// Starts a write that is not a journal record (a result for the results bucket): every
    /// output held after it waits for it. The group gathering is sealed first, to keep the
    /// writes in their order: start it, then the write of the number returned.
    pub fn write(&mut self, now: T) -> (Option<Group<R>>, u64) {
        let sealed = self.seal(now);
        self.writes += 1;
        self.held.push_back(Held::Write(self.writes));
        self.in_flight.push_back(InFlight {
            write: self.writes,
            stored: None,
        });
        (sealed, self.writes)
    }

    /// The group gathering, to write now, if the writes in flight leave room for it (more
    /// room for an urgent one), and it is urgent or `GROUP_INTERVAL` has passed since the last
    /// write started.
    pub fn commit(&mut self, now: T) -> Option<Group<R>> {
        let room = match self.urgent {
            true => self.limits.urgent_in_flight,
            false => self.limits.groups_in_flight,
        };
        if self.group.is_none() || self.in_flight.len() >= room {
            return None;
        }
        if self.urgent || self.commit_due().map_or(true, |due| now >= due) {
            return self.seal(now);
        }
        None
    }

    /// When the group gathering is due to be written, if it waits only for time to pass.
    pub fn commit_due(&self) -> Option<T> {
        let waits = self.group.is_some()
            && self.in_flight.len() < self.limits.groups_in_flight
            && !self.urgent;
        waits.then_some(self.last_started? + self.limits.interval)
    }

    /// The group gathering, to write now whatever the rules say, if there is one.
    pub fn seal(&mut self, now: T) -> Option<Group<R>> {
        let group = self.group.take()?;
        self.urgent = false;
        self.last_started = Some(now);
        self.in_flight.push_back(InFlight {
            write: group.write,
            stored: None,
        });
        Some(Group {
            write: group.write,
            records: group.records,
        })
    }

    /// Write number `write` is stored, at `sequence` if it is a journal write of a leader:
    /// the outputs it releases, in order, with those of the writes after it that were stored
    /// first. A write not in flight is ignored.
    pub fn stored(&mut self, write: u64, sequence: Option<u64>) -> Vec<O> {
        if let Some(w) = self.in_flight.iter_mut().find(|w| w.write == write) {
            w.stored = Some(sequence);
        }
        let mut released = Vec::new();
        while let Some(stored) = self.in_flight.front().and_then(|w| w.stored) {
            let write = self.in_flight.pop_front().map(|w| w.write);
            if let Some(sequence) = stored {
                self.released_through = sequence;
            }
            debug_assert!(matches!(self.held.front(), Some(Held::Write(w)) if Some(*w) == write));
            self.held.pop_front();
            while let Some(Held::Output(_)) = self.held.front() {
                if let Some(Held::Output(output)) = self.held.pop_front() {
                    self.held_outputs -= 1;
                    self.held_for_executors -= usize::from(output.to_executor());
                    released.push(output);
                }
            }
        }
        released
    }
}

#[cfg(test)]
#[path = "outbox_tests.rs"]
mod tests;
