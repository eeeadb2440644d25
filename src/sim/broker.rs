//! What JetStream holds for the drivers: the lease key, with its revision and compare-and-set,
//! and the journal stream, with the expected-last-sequence check that fences a deposed leader.
//! Both act at once when a request reaches them; the network decides when that is.
//!
//! As JetStream does, the journal stores a deposed leader's write that expects exactly the
//! sequence its successor's mark took (the write before it, expecting an older one, refused);
//! a restoring leader skips it, and any write stored off its leader's turn, by the rule
//! `driver::chain` that the journal replays with. The journal checks an invariant of its own: no write is
//! stored from an epoch newer than the newest mark, nor out of turn from an older one.

use crate::driver::chain::{Writer, Writers};
use crate::protocol::JournalRecord;

/// The lease key: its revision counts every write, as a KV key's does.
#[derive(Debug, Default)]
pub struct LeaseKey {
    pub revision: u64,
    /// The driver node that last wrote it, unless none has or it let go.
    pub holder: Option<u32>,
}

/// Why a journal write was not stored: the stream's last sequence was not the one expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrongLast(pub u64);

/// One journal message: a group of records, and who wrote it (as the real journal's message
/// ids say).
#[derive(Debug)]
struct Stored {
    writer: Writer,
    records: Vec<JournalRecord>,
}

#[derive(Debug, Default)]
pub struct Broker {
    pub lease: LeaseKey,
    /// The journal's messages; a message's sequence is its index plus one.
    journal: Vec<Stored>,
    /// The epoch of the newest leader mark in the journal.
    mark_epoch: u64,
}

impl Broker {
    /// A compare-and-set of the lease by `node` on `expected` (the revision it read, or last
    /// wrote): the new revision, or none if another write came first.
    pub fn write_lease(&mut self, node: u32, expected: u64) -> Option<u64> {
        if self.lease.revision != expected {
            return None;
        }
        self.lease.revision += 1;
        self.lease.holder = Some(node);
        Some(self.lease.revision)
    }

    /// Lets the lease go, if `node` still holds it at `expected`: a standby may take it at once.
    pub fn release_lease(&mut self, node: u32, expected: u64) {
        if self.lease.revision == expected && self.lease.holder == Some(node) {
            self.lease.revision += 1;
            self.lease.holder = None;
        }
    }

    /// The journal's last sequence.
    /// Whether the journal holds the end of job `job_id`.
    pub fn job_end_stored(&self, job_id: crate::ids::JobId) -> bool {
        self.journal.iter().flat_map(|m| &m.records).any(
            |record| matches!(record, JournalRecord::JobEnded { job_id: id, .. } if *id == job_id),
        )
    }

    pub fn last(&self) -> u64 {
        self.journal.len() as u64
    }

    /// Stores a new leader's mark, unconditionally (a mark fences whatever comes after it);
    /// returns its sequence.
    pub fn mark(&mut self, epoch: u64, mark: JournalRecord) -> Result<u64, String> {
        if epoch <= self.mark_epoch {
            return Err(format!(
                "a leader of epoch {epoch} marked the journal after epoch {}",
                self.mark_epoch
            ));
        }
        self.mark_epoch = epoch;
        self.journal.push(Stored {
            writer: Writer::Mark(epoch),
            records: vec![mark],
        });
        Ok(self.last())
    }

    /// The records a restoring leader applies, in order: those of every message the real
    /// journal's replay applies.
    pub fn replayed(&self) -> impl Iterator<Item = &JournalRecord> {
        let mut writers = Writers::default();
        self.journal
            .iter()
            .filter(move |stored| writers.admit(stored.writer))
            .flat_map(|stored| &stored.records)
    }

    /// How many messages a restoring leader skips: written off their leaders' turns.
    pub fn skipped(&self) -> u64 {
        let mut writers = Writers::default();
        let skipped = self.journal.iter().filter(|s| !writers.admit(s.writer));
        skipped.count() as u64
    }

    /// Stores one group of records written by the leader of `epoch`, if the journal's last
    /// sequence is `expected` (or whatever it is, `unfenced`); the outer error is a broken
    /// invariant.
    pub fn write(
        &mut self,
        epoch: u64,
        expected: u64,
        records: Vec<JournalRecord>,
        unfenced: bool,
    ) -> Result<Result<u64, WrongLast>, String> {
        let in_turn = expected == self.last();
        if !in_turn && !unfenced {
            return Ok(Err(WrongLast(self.last())));
        }
        if epoch > self.mark_epoch {
            return Err(format!(
                "the journal stored a write of epoch {epoch} before that epoch's mark (the \
                 newest is of epoch {})",
                self.mark_epoch
            ));
        }
        if epoch < self.mark_epoch && !in_turn {
            return Err(format!(
                "the journal stored a write of epoch {epoch} after the mark of epoch {}, out \
                 of its turn",
                self.mark_epoch
            ));
        }
        let writer = Writer::Write(epoch);
        self.journal.push(Stored { writer, records });
        Ok(Ok(self.last()))
    }
}
