//! Snapshots of the journal, on the shell's side: when one is due, how it is cut into parts
//! that each fit in one message, and storing them. Once every part is stored, the journal is
//! purged before the first part, so a restart reads one snapshot and what came after it.
//!
//! A part is published (queued on the connection) in the step that took the snapshot, before
//! any later record: every record stored after it has a higher sequence, and the purge below
//! the first part removes only records the snapshot holds. A record of an earlier step whose
//! write is retried may land after the parts; replaying it again changes nothing.

use super::core::SnapshotIds;
use crate::protocol::fit;
use crate::protocol::JournalRecord;
use bytes::{BufMut, Bytes, BytesMut};
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

/// How long a driver waits to try again after a snapshot could not be stored.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// Room in a part for everything but its records.
const PART_HEADER: usize = 512;

/// What a stored snapshot left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub parts: usize,
    pub bytes: u64,
    /// The stream sequence of the first part: everything before it was purged.
    pub first_sequence: u64,
    pub purged: u64,
}

/// When the next snapshot is due: once the journal has grown by twice the last snapshot's
/// size since it (and by at least `min_growth`), so snapshots cost at most about a
/// third of what is written and the journal holds about three snapshots' worth at most; or
/// once the last one is older than half the journal's max age, so live jobs never age out.
#[derive(Debug)]
pub struct Schedule {
    grown: u64,
    min_growth: u64,
    last_size: u64,
    last_at: Instant,
    max_age: Duration,
    writing: bool,
    not_before: Instant,
}

impl Schedule {
    /// A schedule for a journal that has `grown` bytes since its last snapshot (all of it,
    /// after a replay: a long history is snapshotted at once), taking one each time it grows
    /// by `min_growth` or more.
    pub fn new(grown: u64, min_growth: u64, max_age: Duration) -> Self {
        let now = Instant::now();
        Self {
            grown,
            min_growth: min_growth.max(1),
            last_size: 0,
            last_at: now,
            max_age,
            writing: false,
            not_before: now,
        }
    }

    /// Counts `bytes` more written to the journal.
    pub fn wrote(&mut self, bytes: usize) {
        self.grown += bytes as u64;
    }

    /// Whether the journal has grown enough for a snapshot: a check without the clock, for
    /// every step of the actor.
    pub fn grown_enough(&self) -> bool {
        self.grown >= self.min_growth.max(2 * self.last_size)
    }

    pub fn due(&self, now: Instant) -> bool {
        if self.writing || now < self.not_before {
            return false;
        }
        self.grown_enough() || now.duration_since(self.last_at) >= self.max_age / 2
    }

    /// A snapshot is being written from now.
    pub fn started(&mut self, now: Instant) {
        self.writing = true;
        self.last_at = now;
        self.grown = 0;
    }

    /// The snapshot being written was stored, or could not be (`None`).
    pub fn finished(&mut self, stored: Option<&Stored>, now: Instant) {
        self.writing = false;
        match stored {
            Some(stored) => self.last_size = stored.bytes,
            None => {
                // What the failed snapshot was to replace is still in the journal.
                self.grown += self.min_growth.max(2 * self.last_size);
                self.not_before = now + RETRY_AFTER;
            }
        }
    }
}

/// The parts of snapshot `id`, in order: `records` packed into messages of at most
/// `max_bytes`, each the encoding of one [`JournalRecord::SnapshotPart`]. A record too large
/// for one part is cut in halves first (task outcomes); one that cannot be cut is dropped
/// with a warning, as any message over `max_payload` is.
#[cfg(test)]
fn pack(
    id: Uuid,
    time_ms: u64,
    ids: SnapshotIds,
    records: Vec<JournalRecord>,
    max_bytes: usize,
) -> Vec<Bytes> {
    let mut encoded = Encoded::new(max_bytes);
    records.into_iter().for_each(|record| encoded.add(record));
    encoded.pack(id, time_ms, ids)
}

/// A snapshot's records, encoded as they come, each cut to fit in a part.
pub struct Encoded {
    records: Vec<Bytes>,
    max_bytes: usize,
}

impl Encoded {
    pub fn new(max_bytes: usize) -> Self {
        Self {
            records: Vec::new(),
            max_bytes,
        }
    }

    fn room(&self) -> usize {
        self.max_bytes.saturating_sub(PART_HEADER).max(1)
    }

    pub fn add(&mut self, record: JournalRecord) {
        let room = self.room();
        self.records.extend(fit(record, room, "a snapshot"));
    }

    /// The parts of snapshot `id`, in order.
    pub fn pack(self, id: Uuid, time_ms: u64, ids: SnapshotIds) -> Vec<Bytes> {
        pack_encoded(id, time_ms, ids, &self.records, self.room())
    }
}

fn pack_encoded(
    id: Uuid,
    time_ms: u64,
    ids: SnapshotIds,
    encoded: &[Bytes],
    room: usize,
) -> Vec<Bytes> {
    let mut groups: Vec<&[Bytes]> = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (at, record) in encoded.iter().enumerate() {
        if at > start && size + record.len() + 1 > room {
            groups.push(&encoded[start..at]);
            (start, size) = (at, 0);
        }
        size += record.len() + 1;
    }
    groups.push(&encoded[start..]);
    let parts = groups.len() as u32;
    groups
        .iter()
        .enumerate()
        .map(|(part, records)| write_part(id, part as u32, parts, time_ms, ids, records))
        .collect()
}

/// One part, written around records encoded already: the bytes `encode` gives for the same
/// [`JournalRecord::SnapshotPart`] (a test holds them to it), without encoding each record
/// twice.
fn write_part(
    id: Uuid,
    part: u32,
    parts: u32,
    time_ms: u64,
    ids: SnapshotIds,
    records: &[Bytes],
) -> Bytes {
    let size: usize = records.iter().map(|r| r.len() + 1).sum();
    let mut out = BytesMut::with_capacity(size + PART_HEADER);
    let header = format!(
        r#"{{"type":"SnapshotPart","snapshot":"{id}","part":{part},"parts":{parts},"time_ms":{time_ms},"next_job":{},"next_task":{},"records":["#,
        ids.next_job, ids.next_task
    );
    out.put_slice(header.as_bytes());
    for (at, record) in records.iter().enumerate() {
        if at > 0 {
            out.put_u8(b',');
        }
        out.put_slice(record);
    }
    out.put_slice(b"]}");
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{decode, encode, JournaledTask, SubmitJob, TaskSpec, TaskState};

    fn records(tasks: u64) -> Vec<JournalRecord> {
        let submitted = JournalRecord::JobSubmitted {
            job_id: 3,
            first_task: 10,
            time_ms: 5,
            job: Box::new(SubmitJob {
                name: "n".into(),
                repeat: tasks as u32,
                max_failures: 4,
                ..SubmitJob::new(vec![TaskSpec::Handler {
                    name: "noop".into(),
                    arg: serde_json::Value::Null,
                }])
            }),
            term: None,
            tenant: None,
        };
        let ended = (0..tasks).map(|i| JournaledTask {
            task_id: 10 + i,
            attempt: 0,
            executor_id: crate::ids::ExecutorId::parse("e1").unwrap(),
            state: TaskState::Finished,
            result: Some(serde_json::json!(format!("result {i}"))),
            error: None,
            in_bucket: false,
            result_object: None,
            objects: Vec::new(),
        });
        vec![
            submitted,
            JournalRecord::TasksEnded {
                time_ms: 6,
                tasks: ended.collect(),
                term: 0,
            },
        ]
    }

    const MIN: u64 = 8 << 20;

    const IDS: SnapshotIds = SnapshotIds {
        next_job: 4,
        next_task: 2000,
    };

    fn unpack(parts: &[Bytes]) -> Vec<JournalRecord> {
        let mut all = Vec::new();
        for (at, part) in parts.iter().enumerate() {
            match decode::<JournalRecord>(part, usize::MAX).unwrap() {
                JournalRecord::SnapshotPart {
                    part,
                    parts: n,
                    records,
                    next_job,
                    next_task,
                    ..
                } => {
                    assert_eq!((part as usize, n as usize), (at, parts.len()));
                    assert_eq!((next_job, next_task), (IDS.next_job, IDS.next_task));
                    all.extend(records);
                }
                other => panic!("not a part: {other:?}"),
            }
        }
        all
    }

    #[test]
    fn a_part_is_the_encoding_of_its_record() {
        let id = Uuid::from_u128(7);
        let records = records(3);
        let parts = pack(id, 9, IDS, records.clone(), 1 << 20);
        assert_eq!(parts.len(), 1);
        let expected = JournalRecord::SnapshotPart {
            snapshot: id,
            part: 0,
            parts: 1,
            time_ms: 9,
            next_job: IDS.next_job,
            next_task: IDS.next_task,
            records,
        };
        assert_eq!(parts[0], encode(&expected));
    }

    #[test]
    fn records_are_packed_into_parts_that_fit_and_come_back_in_order() {
        let all = records(1000);
        let parts = pack(Uuid::from_u128(1), 9, IDS, all.clone(), 8 * 1024);
        assert!(parts.len() > 3, "{} parts", parts.len());
        assert!(parts.iter().all(|p| p.len() <= 8 * 1024));
        let back = unpack(&parts);
        // The task outcomes were cut to fit: the same outcomes, in the same order.
        let tasks = |records: &[JournalRecord]| -> Vec<JournaledTask> {
            records
                .iter()
                .flat_map(|r| match r {
                    JournalRecord::TasksEnded { tasks, .. } => tasks.clone(),
                    _ => vec![],
                })
                .collect()
        };
        assert_eq!(back[0], all[0]);
        assert_eq!(tasks(&back), tasks(&all));
    }

    #[test]
    fn an_empty_snapshot_is_one_part() {
        let parts = pack(Uuid::from_u128(2), 9, IDS, vec![], 1 << 20);
        assert_eq!(parts.len(), 1);
        assert!(unpack(&parts).is_empty());
    }

    #[test]
    fn snapshots_come_as_the_journal_grows_and_before_it_ages_out() {
        let mut schedule = Schedule::new(0, MIN, Duration::from_secs(100));
        let start = Instant::now();
        assert!(!schedule.due(start));
        schedule.wrote(MIN as usize);
        assert!(schedule.due(start));
        schedule.started(start);
        assert!(!schedule.due(start), "one at a time");
        let stored = Stored {
            parts: 2,
            bytes: 3 * MIN,
            first_sequence: 9,
            purged: 8,
        };
        schedule.finished(Some(&stored), start);
        schedule.wrote(MIN as usize * 5);
        assert!(
            !schedule.due(start),
            "not before twice the last snapshot's size"
        );
        schedule.wrote(MIN as usize);
        assert!(schedule.due(start));
        let mut idle = Schedule::new(0, MIN, Duration::from_secs(100));
        let start = Instant::now();
        assert!(
            idle.due(start + Duration::from_secs(51)),
            "half the max age"
        );
        idle.started(start);
        idle.finished(None, start);
        assert!(!idle.due(start + Duration::from_secs(1)), "a failure waits");
        assert!(idle.due(start + RETRY_AFTER));
    }
}
