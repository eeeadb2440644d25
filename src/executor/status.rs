//! Status batches: statuses queue while one batch is in flight; when it is acknowledged,
//! everything pending goes in the next (bounded by max_payload and the driver's batch limit).
//! An unacknowledged batch is sent again; the driver treats a repeat as a no-op. No I/O here:
//! the executor's shell encodes and sends the batch [`StatusQueue::take_batch`] sets aside.
//!
//! A batch is written by the protocol's writer of status batches, [`StatusBatch`], from what is
//! queued: a plain finish as the two numbers it is on the wire, and any other status as the
//! JSON it was encoded to once, when it was queued (its size decides what fits in a batch).

use crate::ids::{ExecutorId, InstanceId, TaskId};
use crate::protocol::MAX_UPDATES_PER_BATCH;
use crate::protocol::{
    RunningAttempt, StatusBatch, StatusReply, StatusUpdate, TaskDescription, TaskState,
};
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use tracing::{debug, warn};

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
    /// That driver's term, which names the attempts of the statuses with their numbers.
    pub term: u64,
    /// The largest batch, in bytes.
    pub limit: usize,
    /// Statuses waiting.
    pending: Vec<Queued>,
    sending: Vec<Queued>,
    in_flight: bool,
}

impl StatusQueue {
    pub fn new(executor_id: ExecutorId, limit: usize) -> Self {
        Self {
            executor_id,
            driver: None,
            term: 0,
            limit,
            pending: Vec::new(),
            sending: Vec::new(),
            in_flight: false,
        }
    }

    /// Queues a status, failing it instead if its result could never fit in a message. Its
    /// error text is cut to [`crate::text::error_cap`] of the limit, so that the records and
    /// events the driver makes of it fit in a message too.
    pub fn push(&mut self, mut update: StatusUpdate) {
        if update.is_plain_finish() {
            self.pending.push(Queued { update, json: None });
            return;
        }
        if let Some(error) = update.error.take() {
            let cap = crate::text::error_cap(self.limit);
            update.error = Some(crate::text::clip_owned(error, cap));
        }
        let mut json = to_json(&update);
        let size = json.get().len();
        if size > self.limit {
            update.state = TaskState::Failed;
            update.result = None;
            update.error = Some(format!(
                "the task's result is {size} bytes, over the limit of {} bytes \
                 (the server's max_payload less headroom); raise max_payload in nats.conf",
                self.limit
            ));
            json = to_json(&update);
        }
        self.pending.push(Queued {
            update,
            json: Some(json),
        });
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

    /// Keeps, of the statuses not yet acknowledged, those of the attempts a new driver
    /// adopted, each renamed to the number `adopted` gives it, and forgets the rest (they
    /// were for the driver before); the batch in flight waits again. Returns how many were
    /// forgotten.
    pub fn adopt(&mut self, adopted: impl Fn(TaskId, u32) -> Option<u32>) -> usize {
        self.in_flight = false;
        let before = self.pending.len() + self.sending.len();
        let mut kept = Vec::with_capacity(before);
        for queued in self.sending.drain(..).chain(self.pending.drain(..)) {
            let Some(attempt) = adopted(queued.update.task_id, queued.update.attempt) else {
                continue;
            };
            let mut update = queued.update;
            update.attempt = attempt;
            let json = queued.json.map(|_| to_json(&update));
            kept.push(Queued { update, json });
        }
        self.pending = kept;
        before - self.pending.len()
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
            .map(|q| RunningAttempt {
                task_id: q.update.task_id,
                attempt: q.update.attempt,
                term: self.term,
                ended: q.update.state.is_terminal(),
            })
    }

    /// The batch in flight.
    pub fn sending(&self) -> impl Iterator<Item = &StatusUpdate> + '_ {
        self.sending.iter().map(|q| &q.update)
    }

    /// The batch in flight as it goes on the wire: a
    /// [`crate::protocol::StatusRequest::StatusUpdates`], written from what is queued.
    pub fn encode_batch(&self) -> bytes::Bytes {
        let updates: usize = self.sending.iter().map(|q| q.size() + 1).sum();
        let mut batch = Vec::with_capacity(128 + self.executor_id.as_str().len() + updates);
        let written = StatusBatch {
            executor_id: &self.executor_id,
            updates: &self.sending,
            driver_instance: self.driver.as_ref(),
        };
        serde_json::to_writer(&mut batch, &written).expect("a status batch encodes to JSON");
        batch.into()
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
            .position(|queued| {
                size += queued.size() + 1;
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

/// `updates` as one status batch of the executor `executor_id`, registered with `driver`: the
/// bytes [`StatusQueue::encode_batch`] sends, put together the way it puts them together (each
/// status queued, then the batch taken). All of `updates` must fit in one batch.
pub fn encode_status_batch(
    executor_id: ExecutorId,
    driver: Option<InstanceId>,
    updates: Vec<StatusUpdate>,
) -> bytes::Bytes {
    let mut queue = StatusQueue::new(executor_id, crate::DEFAULT_MAX_PAYLOAD);
    queue.driver = driver;
    let count = updates.len();
    for update in updates {
        queue.push(update);
    }
    queue.take_batch();
    assert_eq!(queue.sending.len(), count, "the updates fit in one batch");
    queue.encode_batch()
}

/// A status waiting for a batch: a plain finish alone, any other with its JSON.
struct Queued {
    update: StatusUpdate,
    json: Option<Box<RawValue>>,
}

impl Queued {
    /// Its size in a batch, in bytes: a plain finish is `[task_id,attempt]`.
    fn size(&self) -> usize {
        match &self.json {
            Some(json) => json.get().len(),
            None => "[,]".len() + digits(self.update.task_id) + digits(self.update.attempt.into()),
        }
    }
}

/// A queued status writes as its update: a plain finish from its numbers, any other as the
/// JSON it was encoded to when queued.
impl Serialize for Queued {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.json {
            Some(json) => json.serialize(serializer),
            None => self.update.serialize(serializer),
        }
    }
}

fn to_json(update: &StatusUpdate) -> Box<RawValue> {
    serde_json::value::to_raw_value(update).expect("a status encodes to JSON")
}

/// How many digits `n` has in decimal.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{decode, encode, StatusRequest};
    use serde_json::json;

    fn update(task_id: u64, state: TaskState, result: Option<serde_json::Value>) -> StatusUpdate {
        StatusUpdate {
            task_id,
            attempt: 1,
            state,
            result,
            error: (state == TaskState::Failed).then(|| "a \"quoted\"\nerror".into()),
            result_object: None,
            no_retry: false,
        }
    }

    /// A batch put together from the statuses' encodings is byte for byte the encoding of the
    /// protocol's `StatusUpdates`, and decodes to it.
    #[test]
    fn an_assembled_batch_is_the_protocol_encoding() {
        let executor_id = ExecutorId::parse("exec-1").unwrap();
        let updates = vec![
            update(7, TaskState::Finished, None),
            update(
                8,
                TaskState::Finished,
                Some(json!({"k": ["v", 1, null], "ü": "\u{1}"})),
            ),
            update(9, TaskState::Failed, None),
            StatusUpdate {
                attempt: u32::MAX,
                ..update(u64::MAX, TaskState::Finished, None)
            },
            update(0, TaskState::Finished, None),
        ];
        for driver in [None, Some(uuid::Uuid::new_v4())] {
            let mut queue = StatusQueue::new(executor_id.clone(), 1 << 20);
            queue.driver = driver;
            for u in &updates {
                queue.push(u.clone());
            }
            assert!(queue.take_batch());
            let expected = StatusRequest::StatusUpdates {
                executor_id: executor_id.clone(),
                updates: updates.clone(),
                driver_instance: driver,
            };
            let batch = queue.encode_batch();
            assert_eq!(batch, encode(&expected));
            assert_eq!(decode::<StatusRequest>(&batch, 1 << 20).unwrap(), expected);
        }
    }

    /// The size a batch counts for a status is the size it writes, at every digit count.
    #[test]
    fn a_queued_status_counts_the_bytes_it_writes() {
        let mut queue = StatusQueue::new(ExecutorId::parse("e").unwrap(), 1 << 20);
        for task_id in [0, 9, 10, 99, 100, 123_456, u64::MAX] {
            queue.push(update(task_id, TaskState::Finished, None));
            queue.push(StatusUpdate {
                attempt: u32::MAX,
                ..update(task_id, TaskState::Finished, None)
            });
        }
        queue.push(update(1, TaskState::Failed, Some(json!({"exit_code": 3}))));
        for queued in &queue.pending {
            let written = serde_json::to_vec(queued).unwrap();
            assert_eq!(queued.size(), written.len(), "{written:?}");
        }
    }

    #[test]
    fn an_empty_batch_is_the_protocol_encoding() {
        let executor_id = ExecutorId::parse("e").unwrap();
        let queue = StatusQueue::new(executor_id.clone(), 1 << 20);
        let expected = StatusRequest::StatusUpdates {
            executor_id,
            updates: Vec::new(),
            driver_instance: None,
        };
        assert_eq!(queue.encode_batch(), encode(&expected));
    }
}
