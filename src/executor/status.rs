//! Status batches: statuses queue while one batch is in flight; when it is acknowledged,
//! everything pending goes in the next (bounded by max_payload and the driver's batch limit).
//! An unacknowledged batch is sent again; the driver treats a repeat as a no-op. No I/O here:
//! the executor's shell encodes and sends the batch [`StatusQueue::take_batch`] sets aside.

use crate::driver::core::MAX_UPDATES_PER_BATCH;
use crate::ids::{ExecutorId, InstanceId};
use crate::protocol::{
    encode, RunningAttempt, StatusReply, StatusUpdate, TaskDescription, TaskState,
};
use tracing::{debug, warn};

/// [`crate::protocol::StatusRequest`] as it is encoded, borrowing the updates instead of
/// copying them.
#[derive(serde::Serialize)]
#[serde(tag = "type")]
enum StatusBatch<'a> {
    StatusUpdates {
        executor_id: &'a ExecutorId,
        updates: Vec<&'a StatusUpdate>,
        #[serde(skip_serializing_if = "Option::is_none")]
        driver_instance: Option<InstanceId>,
    },
}

/// What an acknowledged (or failed) batch means for the executor.
#[derive(Debug, PartialEq)]
pub(crate) enum Settled {
    /// The driver answered, with the tasks it launched on the cores the batch freed.
    Answered(Vec<TaskDescription>),
    /// The driver does not know this executor: register again; the batch waits.
    Unknown,
    /// No answer; the batch goes again.
    NoAnswer,
}

pub struct StatusQueue {
    executor_id: ExecutorId,
    /// The driver instance the statuses are for: the one the executor is registered with.
    pub driver: Option<InstanceId>,
    /// The largest batch, in bytes.
    pub limit: usize,
    /// Statuses waiting, each with its encoded size.
    pending: Vec<(StatusUpdate, usize)>,
    sending: Vec<(StatusUpdate, usize)>,
    in_flight: bool,
}

impl StatusQueue {
    pub fn new(executor_id: ExecutorId, limit: usize) -> Self {
        Self {
            executor_id,
            driver: None,
            limit,
            pending: Vec::new(),
            sending: Vec::new(),
            in_flight: false,
        }
    }

    /// Queues a status, failing it instead if its result could never fit in a message.
    pub fn push(&mut self, mut update: StatusUpdate) {
        let mut size = encode(&update).len();
        if size > self.limit {
            update.state = TaskState::Failed;
            update.result = None;
            update.error = Some(format!(
                "the task's result is {size} bytes, over the limit of {} bytes \
                 (the server's max_payload less headroom); raise max_payload in nats.conf",
                self.limit
            ));
            size = encode(&update).len();
        }
        self.pending.push((update, size));
    }

    /// Forgets every status not yet acknowledged (they were for another driver); returns how
    /// many.
    pub fn clear(&mut self) -> usize {
        self.in_flight = false;
        let n = self.pending.len() + self.sending.len();
        self.pending.clear();
        self.sending.clear();
        n
    }

    /// Whether every status has been acknowledged.
    pub fn is_idle(&self) -> bool {
        !self.in_flight && self.pending.is_empty()
    }

    /// The attempts whose end the driver has not yet acknowledged.
    pub fn unacknowledged(&self) -> impl Iterator<Item = RunningAttempt> + '_ {
        self.sending
            .iter()
            .chain(&self.pending)
            .map(|u| RunningAttempt {
                task_id: u.0.task_id,
                attempt: u.0.attempt,
            })
    }

    /// The batch in flight.
    pub fn sending(&self) -> impl Iterator<Item = &StatusUpdate> + '_ {
        self.sending.iter().map(|(u, _)| u)
    }

    /// The batch in flight as it goes on the wire.
    pub fn encode_batch(&self) -> bytes::Bytes {
        encode(&StatusBatch::StatusUpdates {
            executor_id: &self.executor_id,
            updates: self.sending().collect(),
            driver_instance: self.driver,
        })
    }

    /// If no batch is in flight and statuses wait, sets aside as many as fit in one message
    /// as the batch in flight, and returns true: it is to be sent.
    pub fn take_batch(&mut self) -> bool {
        if self.in_flight || self.pending.is_empty() {
            return false;
        }
        let mut size = 256;
        let take = self
            .pending
            .iter()
            .take(MAX_UPDATES_PER_BATCH)
            .position(|(_, bytes)| {
                size += bytes + 1;
                size > self.limit
            })
            .unwrap_or(self.pending.len().min(MAX_UPDATES_PER_BATCH))
            .max(1);
        self.sending.extend(self.pending.drain(..take));
        self.in_flight = true;
        true
    }

    /// The answer to the batch in flight, or why none came.
    pub(crate) fn settle(&mut self, result: Result<StatusReply, String>) -> Settled {
        self.in_flight = false;
        match result {
            Ok(StatusReply::StatusAck {
                refused, launch, ..
            }) => {
                for r in refused {
                    warn!(task = r.task_id, attempt = r.attempt, reason = %r.reason, "driver refused a status");
                }
                self.sending.clear();
                Settled::Answered(launch)
            }
            Ok(StatusReply::Error { message }) => {
                warn!(%message, "driver rejected a status batch");
                self.sending.clear();
                Settled::Answered(Vec::new())
            }
            Ok(StatusReply::UnknownExecutor { message }) => {
                debug!(%message, "driver does not know this executor");
                self.requeue();
                Settled::Unknown
            }
            Err(error) => {
                debug!(%error, "status batch not acknowledged; resending");
                self.requeue();
                Settled::NoAnswer
            }
        }
    }

    fn requeue(&mut self) {
        let mut batch = std::mem::take(&mut self.sending);
        batch.append(&mut self.pending);
        self.pending = batch;
    }
}
