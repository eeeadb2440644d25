//! Status batches: statuses queue while one batch is in flight; when it is acknowledged,
//! everything pending goes in the next (bounded by max_payload and the driver's batch limit).
//! An unacknowledged batch is sent again; the driver treats a repeat as a no-op.

use super::backend::ExecutorConfig;
use crate::driver::core::MAX_UPDATES_PER_BATCH;
use crate::ids::ExecutorId;
use crate::protocol::{
    decode, encode, RunningAttempt, StatusReply, StatusUpdate, TaskDescription, TaskState,
};
use crate::{PAYLOAD_HEADROOM, REQUEST_TIMEOUT};
use async_nats::Client;
use futures::future::BoxFuture;
use std::time::Duration;
use tracing::{debug, warn};

pub(crate) type StatusResult = Result<StatusReply, String>;

/// [`crate::protocol::StatusRequest`] as it is encoded, borrowing the updates instead of
/// copying them.
#[derive(serde::Serialize)]
#[serde(tag = "type")]
enum StatusBatch<'a> {
    StatusUpdates {
        executor_id: &'a ExecutorId,
        updates: Vec<&'a StatusUpdate>,
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

pub(crate) struct StatusSender {
    client: Client,
    subject: String,
    executor_id: ExecutorId,
    pub limit: usize,
    /// Statuses waiting, each with its encoded size.
    pending: Vec<(StatusUpdate, usize)>,
    sending: Vec<(StatusUpdate, usize)>,
    request: Option<BoxFuture<'static, StatusResult>>,
}

impl StatusSender {
    pub fn new(client: &Client, config: &ExecutorConfig) -> Self {
        Self {
            client: client.clone(),
            subject: config.subjects.status(&config.executor_id),
            executor_id: config.executor_id.clone(),
            limit: client.server_info().max_payload.max(2 * PAYLOAD_HEADROOM) - PAYLOAD_HEADROOM,
            pending: Vec::new(),
            sending: Vec::new(),
            request: None,
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
        self.request = None;
        let n = self.pending.len() + self.sending.len();
        self.pending.clear();
        self.sending.clear();
        n
    }

    /// Whether every status has been acknowledged.
    pub fn is_idle(&self) -> bool {
        self.request.is_none() && self.pending.is_empty()
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

    /// Sends the pending statuses if no batch is in flight: as many as fit in one message.
    pub fn send_if_idle(&mut self) {
        if self.request.is_some() || self.pending.is_empty() {
            return;
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
        self.sending = self.pending.drain(..take).collect();
        let payload = encode(&StatusBatch::StatusUpdates {
            executor_id: &self.executor_id,
            updates: self.sending.iter().map(|(u, _)| u).collect(),
        });
        let (client, subject) = (self.client.clone(), self.subject.clone());
        self.request = Some(Box::pin(async move {
            let reply =
                tokio::time::timeout(REQUEST_TIMEOUT, client.request(subject, payload)).await;
            let result = match reply {
                Ok(Ok(message)) => {
                    decode::<StatusReply>(&message.payload, usize::MAX).map_err(|e| e.to_string())
                }
                Ok(Err(error)) => Err(error.to_string()),
                Err(_) => Err("timed out".into()),
            };
            if result.is_err() {
                // Back off a little before the batch goes again.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            result
        }));
    }

    /// Waits for the batch in flight; never completes when there is none.
    pub async fn in_flight(&mut self) -> StatusResult {
        match self.request.as_mut() {
            Some(request) => request.await,
            None => std::future::pending().await,
        }
    }

    pub fn settle(&mut self, result: StatusResult) -> Settled {
        self.request = None;
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
