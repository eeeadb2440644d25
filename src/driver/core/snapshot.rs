//! Snapshots: the journal records that rebuild every job the core holds ([`Core::snapshot`]),
//! and replaying a snapshot's parts, which replace what the records before them built once the
//! last part has been read. A snapshot lets the shell purge everything before it, so a restart
//! reads one snapshot and a short tail, whatever the history.

use super::jobs::TaskStatus;
use super::Core;
use crate::ids::{JobId, TaskId};
use crate::protocol::{JournalRecord, JournaledTask};
use uuid::Uuid;

/// The most task outcomes in one record of a snapshot: records are cut small so the shell can
/// pack them into parts under `max_payload`.
pub const SNAPSHOT_TASKS_PER_RECORD: usize = 4096;

/// What a snapshot holds beside its records: the ids the driver would give next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotIds {
    pub next_job: JobId,
    pub next_task: TaskId,
}

/// A snapshot being read, part by part.
#[derive(Debug)]
pub(super) struct Staging {
    snapshot: Uuid,
    next_part: u32,
    core: Core,
    /// Records stored between the parts (a retried write can land there), applied again once
    /// the snapshot is in: replay is idempotent.
    between: Vec<JournalRecord>,
}

/// Why a snapshot part was not used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SnapshotError {
    #[error("part {part} of snapshot {snapshot} came without the parts before it")]
    OutOfOrder { snapshot: Uuid, part: u32 },
    #[error("a snapshot part inside a snapshot part")]
    Nested,
}

impl Core {
    /// The records that rebuild every job held, in an order that replays: each job's
    /// submission and settled tasks by id, then the ends in the order the jobs ended. Jobs past
    /// the retention limit that wait for their last attempts are left out.
    pub fn snapshot(&self) -> (SnapshotIds, Vec<JournalRecord>) {
        let mut records = Vec::new();
        let ids = self.snapshot_each(|record| records.push(record));
        (ids, records)
    }

    /// The records of [`Core::snapshot`], handed to `emit` one at a time, so a caller that
    /// encodes them as they come never holds them all.
    pub fn snapshot_each(&self, mut emit: impl FnMut(JournalRecord)) -> SnapshotIds {
        for (key, limits) in self.keys.limited() {
            emit(JournalRecord::KeyLimitsSet {
                key: key.to_string(),
                limits,
                time_ms: 0,
            });
        }
        for job in self.jobs.values() {
            if self.forgetting.contains(&job.id) {
                continue;
            }
            emit(JournalRecord::JobSubmitted {
                job_id: job.id,
                first_task: job.first_task,
                time_ms: job.submitted_at_ms,
                job: Box::new(job.submission()),
                term: job.term,
                tenant: job.tenant.clone(),
            });
            let launched = job.tasks.launched();
            let settled = (0..launched.len() as u32).filter_map(|index| {
                let record = &launched[index as usize];
                let state = match record.status {
                    TaskStatus::Finished => crate::protocol::TaskState::Finished,
                    TaskStatus::Failed => crate::protocol::TaskState::Failed,
                    _ => return None,
                };
                Some(JournaledTask {
                    task_id: job.first_task + u64::from(index),
                    attempt: record.attempts.saturating_sub(1),
                    executor_id: record.executor.clone()?,
                    state,
                    result: job.results.get(&index).cloned(),
                    error: job.errors.get(&index).cloned(),
                    in_bucket: job.in_bucket(index),
                    result_object: job.result_objects.get(&index).cloned(),
                    objects: job.outputs_of(index),
                })
            });
            let mut settled = settled.peekable();
            while settled.peek().is_some() {
                let tasks: Vec<_> = settled.by_ref().take(SNAPSHOT_TASKS_PER_RECORD).collect();
                let time_ms = job.ended_at_ms.unwrap_or(job.submitted_at_ms);
                emit(JournalRecord::TasksEnded {
                    time_ms,
                    tasks,
                    term: 0,
                });
            }
            // A running job's KILLED tasks were killed by request, as are those whose attempt
            // is being stopped without retry (an ended job's are all killed again when it is
            // restored).
            if job.is_active() {
                let killed = launched
                    .iter()
                    .enumerate()
                    .filter(|(_, record)| {
                        record.status == TaskStatus::Killed
                            || (record.status == TaskStatus::Running && record.kill_requested)
                    })
                    .map(|(index, _)| index as u32)
                    .chain(job.tasks.skipped());
                for index in killed {
                    emit(JournalRecord::TaskKilledByRequest {
                        job_id: job.id,
                        index,
                        time_ms: job.submitted_at_ms,
                    });
                }
                Core::retry_waits_of(job).for_each(&mut emit);
            }
        }
        // Those kept past the limit for the open jobs that run after them ended first.
        for id in self.held.iter().chain(&self.ended) {
            let job = &self.jobs[id];
            emit(JournalRecord::JobEnded {
                job_id: job.id,
                state: job.state,
                time_ms: job.ended_at_ms.unwrap_or(job.submitted_at_ms),
                reason: job.reason.clone(),
            });
            if job.results_dropped {
                emit(JournalRecord::ResultsDropped { job_id: job.id });
            }
        }
        SnapshotIds {
            next_job: self.next_job,
            next_task: self.next_task,
        }
    }

    /// Applies part `part` of `parts` of a snapshot; the last part replaces the jobs with the
    /// snapshot's. Errors of the records inside are counted, the first one returned.
    pub(super) fn replay_snapshot_part(
        &mut self,
        snapshot: Uuid,
        part: u32,
        parts: u32,
        ids: SnapshotIds,
        records: Vec<JournalRecord>,
    ) -> Result<(), super::ReplayError> {
        if part == 0 {
            self.staging = Some(Box::new(Staging {
                snapshot,
                next_part: 0,
                core: Core::new(self.config.clone()),
                between: Vec::new(),
            }));
        }
        let staging = match self.staging.as_mut() {
            Some(s) if s.snapshot == snapshot && s.next_part == part => s,
            _ => return Err(SnapshotError::OutOfOrder { snapshot, part }.into()),
        };
        let mut first_error = None;
        for record in records {
            let applied = match record {
                JournalRecord::SnapshotPart { .. } => Err(SnapshotError::Nested.into()),
                record => staging.core.replay(record),
            };
            if let Err(error) = applied {
                first_error.get_or_insert(error);
            }
        }
        staging.next_part += 1;
        if staging.next_part >= parts {
            if let Some(staging) = self.staging.take() {
                self.adopt(staging.core, ids);
                for record in staging.between {
                    // Applied once already, before the snapshot was in: errors were reported.
                    let _ = self.replay(record);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Keeps `record`, a plain record read while a snapshot is being read, to apply it again
    /// once the snapshot is in.
    pub(super) fn note_between_parts(&mut self, record: &JournalRecord) {
        if let Some(staging) = self.staging.as_mut() {
            staging.between.push(record.clone());
        }
    }

    /// Takes the job table of `restored`, and ids at least `ids`.
    fn adopt(&mut self, restored: Core, ids: SnapshotIds) {
        self.jobs = restored.jobs;
        self.first_tasks = restored.first_tasks;
        self.submissions = restored.submissions;
        self.ended = restored.ended;
        self.forgetting = restored.forgetting;
        self.readers = restored.readers;
        self.held = restored.held;
        self.retry_waits = restored.retry_waits;
        self.timers = restored.timers;
        self.keys = restored.keys;
        self.result_bytes = restored.result_bytes;
        self.next_job = restored.next_job.max(ids.next_job);
        self.next_task = restored.next_task.max(ids.next_task);
    }
}
