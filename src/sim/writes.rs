//! A leader's journal writes, as the simulator runs them. The driver's own outbox decides what
//! is written when, and what waits for which write; this only keeps what the broker model
//! needs of each group write in flight, as `driver::journal` does: the journal sequence it
//! expects to follow (its predecessor's, counted from the leader's mark as the writes start),
//! and its records, sent again while the write before it is not stored yet. The leader's
//! side of the broker's answers is here too: what a stored write releases, a refusal.

use super::broker::WrongLast;
use super::driver::{AtDriver, ToBroker};
use super::network::{Pid, Reply};
use super::World;
use crate::driver::outbox::{self, Addressed, Group, Limits, Outbox};
use crate::ids::JobId;
use crate::protocol::{Event as DriverEvent, ExecutorMessage, JournalRecord};
use std::collections::BTreeMap;
use std::time::Duration;

/// The largest group the journal takes in one message, as the driver's with the server's
/// default `max_payload`.
const MAX_BYTES: usize = crate::DEFAULT_MAX_PAYLOAD - crate::PAYLOAD_HEADROOM;

/// What a leader sends, as its outbox holds it.
#[derive(Debug)]
pub enum Output {
    Publish(DriverEvent),
    /// The client's `JobAccepted`.
    Accepted {
        origin: usize,
        job_id: JobId,
    },
    /// The answer to executor `to`'s request `id`.
    Reply {
        to: Pid,
        id: u64,
        body: Reply,
    },
    /// A message to executor `to`'s inbox.
    Inbox {
        to: Pid,
        body: ExecutorMessage,
    },
    /// An ended job whose waiting jobs the core settles once its end is stored.
    Release {
        job_id: JobId,
        state: crate::protocol::JobState,
        reason: Option<String>,
    },
}

impl Addressed for Output {
    fn to_executor(&self) -> bool {
        matches!(self, Output::Reply { .. } | Output::Inbox { .. })
    }

    /// The client's answer, as the driver's: the group it waits behind goes at once.
    fn awaited(&self) -> bool {
        matches!(self, Output::Accepted { .. })
    }
}

/// A group write on its way to the journal.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    /// Its number in the outbox.
    pub write: u64,
    /// The journal's last sequence it expects: the one its predecessor takes.
    pub expected: u64,
    pub records: Vec<JournalRecord>,
}

/// Virtual time, as the outbox counts it.
pub fn at(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// A moment of the outbox, in virtual ms: the first whole ms at or after it.
pub fn ms(at: Duration) -> u64 {
    at.as_nanos().div_ceil(1_000_000) as u64
}

/// A leader's outbox and its group writes in flight.
pub struct Writes {
    outbox: Outbox<Output, JournalRecord, Duration>,
    /// The journal sequence the next group write expects to be last.
    next: u64,
    in_flight: BTreeMap<u64, Write>,
}

impl Writes {
    /// The writes of a leader whose mark is at sequence `mark` (0 without a journal), with
    /// the driver's limits but for `max_held`.
    pub fn new(mark: u64, max_held: usize) -> Self {
        Self {
            outbox: Outbox::new(Limits {
                max_held,
                ..Limits::default()
            }),
            next: mark,
            in_flight: BTreeMap::new(),
        }
    }

    /// A record of the core: it joins the group gathering, and the group before it is
    /// returned to be written now if it would not fit.
    pub fn record(&mut self, record: JournalRecord, now: u64) -> Option<Write> {
        let bytes = crate::protocol::encode(&record).len();
        let urgent = outbox::urgent(&record);
        let sealed = self
            .outbox
            .record(record, bytes, urgent, MAX_BYTES, at(now));
        self.start(sealed)
    }

    /// `output`, if it may leave now; else it waits behind the writes before it.
    pub fn send_or_hold(&mut self, output: Output) -> Option<Output> {
        self.outbox.send_or_hold(output)
    }

    /// The group gathering, to write now, if the outbox's rules say it may go.
    pub fn commit(&mut self, now: u64) -> Option<Write> {
        let group = self.outbox.commit(at(now));
        self.start(group)
    }

    /// When the group gathering is due, if it waits only for time to pass.
    pub fn commit_due(&self) -> Option<u64> {
        self.outbox.commit_due().map(ms)
    }

    /// Group write number `write`, if it is in flight and not yet stored.
    pub fn in_flight(&self, write: u64) -> Option<&Write> {
        self.in_flight.get(&write)
    }

    /// Write number `write` is stored at `sequence`: the outputs this releases, in order.
    pub fn stored(&mut self, write: u64, sequence: u64) -> Vec<Output> {
        self.in_flight.remove(&write);
        self.outbox.stored(write, Some(sequence))
    }

    fn start(&mut self, group: Option<Group<JournalRecord>>) -> Option<Write> {
        let Group { write, records } = group?;
        let expected = self.next;
        self.next += 1;
        let sent = Write {
            write,
            expected,
            records,
        };
        self.in_flight.insert(write, sent.clone());
        Some(sent)
    }
}

impl World {
    /// Writes leader `node`'s group gathering if the outbox says it may go now, and looks in
    /// again when it says it waits for time.
    pub(super) fn commit(&mut self, node: u32) -> Result<(), String> {
        let now = self.queue.now();
        let Some(leader) = self.drivers[node as usize].leader() else {
            return Ok(());
        };
        if leader.commit_at.is_some_and(|due| due <= now) {
            leader.commit_at = None;
        }
        let write = leader.writes.commit(now);
        let due = leader.writes.commit_due();
        if let Some(due) = due.filter(|&due| leader.commit_at != Some(due)) {
            leader.commit_at = Some(due);
            self.due(node, due - now, AtDriver::Commit);
        }
        match write {
            Some(write) => self.send_write(node, write),
            None => Ok(()),
        }
    }

    /// Sends a group write of leader `node` to the journal.
    pub(super) fn send_write(&mut self, node: u32, write: Write) -> Result<(), String> {
        let Some(leader) = self.drivers[node as usize].leader() else {
            return Ok(());
        };
        let write = ToBroker::Write {
            epoch: leader.epoch,
            expected: write.expected,
            write: write.write,
            records: write.records,
        };
        self.send_to_broker(node, write)
    }

    /// The answer to a journal write: what waited for it goes; a write refused because
    /// another driver wrote the journal deposes, one refused because the write before it is
    /// not stored yet goes again a little later, as `driver::journal` has it.
    pub(super) fn stored(
        &mut self,
        node: u32,
        write: u64,
        result: Result<u64, WrongLast>,
    ) -> Result<(), String> {
        let Some(leader) = self.drivers[node as usize].leader() else {
            return Ok(());
        };
        let Some(expected) = leader.writes.in_flight(write).map(|w| w.expected) else {
            return Err(format!(
                "d{node} got the answer to write {write}, not in flight"
            ));
        };
        let sequence = match result {
            Ok(sequence) => sequence,
            Err(WrongLast(last)) if last > expected => {
                self.depose(
                    node,
                    &format!("another driver wrote the journal (its last is {last})"),
                );
                return Ok(());
            }
            Err(WrongLast(_)) => {
                let turn = Self::ms(crate::driver::journal::TURN_DELAY);
                self.due(node, turn, AtDriver::Again { write });
                return Ok(());
            }
        };
        for output in leader.writes.stored(write, sequence) {
            self.release(node, output)?;
        }
        self.commit(node)
    }

    /// Write number `write` of leader `node` goes again, if it is still in flight.
    pub(super) fn again(&mut self, node: u32, write: u64) -> Result<(), String> {
        let Some(leader) = self.drivers[node as usize].leader() else {
            return Ok(());
        };
        match leader.writes.in_flight(write) {
            Some(write) => {
                let write = write.clone();
                self.send_write(node, write)
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
#[path = "writes_tests.rs"]
mod tests;
