//! The driver's journal: records the driver appends to a JetStream stream on
//! `<p>.journal` so that a driver started after it restores its jobs. Only the driver writes
//! them; only the driver reads them back.

use super::{Batch, JobState, SubmitJob, TaskState};
use crate::ids::{ExecutorId, JobId, TaskId};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// One record of the journal. A restored driver replays them in order; replaying one twice
/// changes nothing (a publish retried after a lost ack may store it twice).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum JournalRecord {
    /// A job was accepted with these ids.
    JobSubmitted {
        job_id: JobId,
        first_task: TaskId,
        time_ms: u64,
        job: Box<SubmitJob>,
        /// The term of the leader that accepted it: only a leader of this term or a later one
        /// knew the job, so only their attempts of its tasks may be adopted. Absent in records
        /// from before terms: none of their attempts is adopted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        term: Option<u64>,
        /// The tenant whose job it is (the NATS account that asked through an import of the
        /// api); absent for a job of the cluster's own account.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tenant: Option<String>,
    },
    /// Tasks ended for good: FINISHED, or FAILED for the last time. One record per status batch.
    /// A run of plain finishes of consecutive task ids, one attempt and one executor is written
    /// `[first_task_id, attempt, executor_id, count]`.
    TasksEnded {
        time_ms: u64,
        #[serde(with = "super::compact::runs")]
        tasks: Vec<JournaledTask>,
        /// The term of the leader whose attempts these were (0 in a snapshot, which tells
        /// nothing again, and without a journal's mark).
        #[serde(default, skip_serializing_if = "super::is_zero")]
        term: u64,
    },
    /// A job ended.
    JobEnded {
        job_id: JobId,
        state: JobState,
        time_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Task `index` of a running job was killed by request and is not to run again (a kill
    /// with `retry` writes nothing: a restarted driver runs unfinished tasks again anyway).
    /// Written when the request is answered; a FINISHED outcome of the attempt that was being
    /// stopped, journaled after it, still counts.
    TaskKilledByRequest {
        job_id: JobId,
        index: u32,
        time_ms: u64,
    },
    /// Task `index` of a job with a retry backoff failed for the `failures`-th time and waits
    /// until `until_ms` (the driver's clock, ms since the epoch) before it runs again. A
    /// restarted driver counts its failures on from there and keeps the wait.
    TaskRetryWaits {
        job_id: JobId,
        index: u32,
        failures: u32,
        until_ms: u64,
    },
    /// The limits of concurrency key `key` were set (neither limit: cleared).
    KeyLimitsSet {
        key: String,
        #[serde(flatten)]
        limits: super::KeyLimits,
        time_ms: u64,
    },
    /// A finished job's results were dropped, to keep all results under the driver's cap.
    ResultsDropped { job_id: JobId },
    /// A driver took the lead of the cluster's drivers, with this epoch (the lease's
    /// revision), and read the journal up to here. Every write an earlier leader attempts
    /// after it is refused, so what follows is this leader's alone.
    Leader {
        epoch: u64,
        driver_instance: Uuid,
        time_ms: u64,
    },
    /// Part `part` (from 0) of `parts` of a snapshot: together, the records that rebuild every
    /// job the driver held when it took the snapshot, and the ids it would give next. Once
    /// every part is stored, the records before the first part are purged.
    SnapshotPart {
        snapshot: Uuid,
        part: u32,
        parts: u32,
        time_ms: u64,
        next_job: JobId,
        next_task: TaskId,
        records: Vec<JournalRecord>,
    },
}

/// A task's final outcome, as `GetResults` shows it. A plain finish (`FINISHED`, no result,
/// no error, nothing in the results bucket) is written `[task_id, attempt, executor_id]`,
/// anything else as an object (see `compact.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct JournaledTask {
    pub task_id: TaskId,
    pub attempt: u32,
    pub executor_id: ExecutorId,
    pub state: TaskState,
    pub result: Option<Value>,
    pub error: Option<String>,
    /// Whether the result is in the cluster's results bucket rather than here.
    pub in_bucket: bool,
    /// A result the executor stored in the results bucket in chunks.
    pub result_object: Option<super::ResultObject>,
    /// The objects its result names (a command's outputs): kept while its job is.
    pub objects: Vec<crate::objects::ObjectRef>,
}

impl Batch for JournalRecord {
    fn split(self) -> Result<(Self, Self), Self> {
        match self {
            JournalRecord::TasksEnded {
                time_ms,
                tasks,
                term,
            } => {
                let part = |tasks| JournalRecord::TasksEnded {
                    time_ms,
                    tasks,
                    term,
                };
                super::batch::halve(tasks)
                    .map(|(a, b)| (part(a), part(b)))
                    .map_err(part)
            }
            other => Err(other),
        }
    }
}
