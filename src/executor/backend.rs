//! Registration and the executor's main loop: one task on the messaging thread that reads the
//! inbox, collects attempt ends, and keeps at most one status batch in flight.

use super::runner::Runner;
use super::tasks::Handlers;
use crate::ids::{ExecutorId, InstanceId};
use crate::protocol::{
    decode, encode, ExecutorMessage, RegisterExecutor, RegisterReply, RegisterRequest,
    StatusReply, StatusRequest, StatusUpdate,
};
use crate::subjects::Subjects;
use crate::{PAYLOAD_HEADROOM, REQUEST_TIMEOUT};
use async_nats::{Client, Message};
use futures::future::BoxFuture;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Who the executor is and how it registers.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    pub subjects: Subjects,
    pub executor_id: ExecutorId,
    pub host_port: String,
    pub cores: u32,
    pub log_urls: BTreeMap<String, String>,
    pub attributes: BTreeMap<String, String>,
    /// How long to keep trying while no driver answers.
    pub register_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The driver answered `RegisterExecutorFailed`; the message is the driver's.
    #[error("{0}")]
    Refused(String),
    #[error("no driver answered within {0:?} (is ember-driver running on this cluster?)")]
    RegisterTimeout(Duration),
    #[error("could not subscribe to the inbox {subject}: {source}")]
    Subscribe {
        subject: String,
        source: async_nats::SubscribeError,
    },
    #[error("lost the NATS connection: {0}")]
    Connection(String),
}

/// Registers and serves until `shutdown` completes. The client should have been connected with
/// the inbox prefix [`Subjects::executor_reply_prefix`], or the driver will not answer.
pub async fn run(
    client: Client,
    config: ExecutorConfig,
    handlers: Handlers,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ExecutorError> {
    let inbox_subject = config.subjects.executor_inbox(&config.executor_id);
    let mut inbox = client
        .subscribe(inbox_subject.clone())
        .await
        .map_err(|source| ExecutorError::Subscribe {
            subject: inbox_subject,
            source,
        })?;
    // The subscription must reach the server before the driver can send the first offer.
    client
        .flush()
        .await
        .map_err(|e| ExecutorError::Connection(e.to_string()))?;
    tokio::pin!(shutdown);
    let registration = register(&client, &config);
    tokio::select! {
        result = registration => result?,
        _ = &mut shutdown => return Ok(()),
    }
    info!(executor = %config.executor_id, cores = config.cores, "registered");
    let (mut runner, mut ends) = Runner::new(handlers, config.cores);
    let mut statuses = StatusSender::new(&client, &config);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            message = inbox.next() => match message {
                Some(message) => on_inbox(&mut runner, &mut statuses, message),
                None => return Err(ExecutorError::Connection("the inbox subscription closed".into())),
            },
            Some(done) = ends.recv() => {
                if let Some(update) = runner.finish(done) {
                    statuses.push(update);
                }
            }
            result = statuses.in_flight() => statuses.settle(result),
        }
        statuses.send_if_idle();
    }
    info!(executor = %config.executor_id, "executor stopping");
    let _ = client.flush().await;
    Ok(())
}

/// Sends `RegisterExecutor` until the driver answers or `register_timeout` passes.
async fn register(client: &Client, config: &ExecutorConfig) -> Result<(), ExecutorError> {
    let request = RegisterRequest::RegisterExecutor(RegisterExecutor {
        executor_id: config.executor_id.clone(),
        instance_id: InstanceId::new_v4(),
        host_port: config.host_port.clone(),
        cores: config.cores,
        log_urls: config.log_urls.clone(),
        attributes: config.attributes.clone(),
    });
    let payload = encode(&request);
    let subject = config.subjects.register(&config.executor_id);
    let deadline = Instant::now() + config.register_timeout;
    let mut pause = Duration::from_millis(50);
    loop {
        let attempt = client.request(subject.clone(), payload.clone());
        match tokio::time::timeout(REQUEST_TIMEOUT, attempt).await {
            Ok(Ok(reply)) => match decode::<RegisterReply>(&reply.payload, usize::MAX) {
                Ok(RegisterReply::RegisteredExecutor { .. }) => return Ok(()),
                Ok(RegisterReply::RegisterExecutorFailed { message }) => {
                    return Err(ExecutorError::Refused(message))
                }
                Err(error) => warn!(%error, "undecodable answer to RegisterExecutor; retrying"),
            },
            Ok(Err(error)) => debug!(%error, "no driver yet; retrying"),
            Err(_) => debug!("registration timed out; retrying"),
        }
        if Instant::now() + pause > deadline {
            return Err(ExecutorError::RegisterTimeout(config.register_timeout));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

fn on_inbox(runner: &mut Runner, statuses: &mut StatusSender, message: Message) {
    match decode::<ExecutorMessage>(&message.payload, statuses.limit + PAYLOAD_HEADROOM) {
        Ok(ExecutorMessage::LaunchTasks { tasks }) => {
            for task in tasks {
                statuses.push(runner.launch(task));
            }
        }
        Ok(ExecutorMessage::KillTask {
            task_id,
            attempt,
            reason,
        }) => {
            info!(task = task_id, attempt, %reason, "kill");
            if let Some(update) = runner.kill(task_id, attempt) {
                statuses.push(update);
            }
        }
        Err(error) => warn!(%error, subject = %message.subject, "undecodable inbox message dropped"),
    }
}

type StatusResult = Result<StatusReply, String>;

/// Statuses waiting to go, and the one batch in flight. A batch is resent until the driver
/// acknowledges it; the driver treats a repeat as a no-op.
struct StatusSender {
    client: Client,
    subject: String,
    executor_id: ExecutorId,
    limit: usize,
    pending: Vec<StatusUpdate>,
    sending: Vec<StatusUpdate>,
    request: Option<BoxFuture<'static, StatusResult>>,
}

impl StatusSender {
    fn new(client: &Client, config: &ExecutorConfig) -> Self {
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
    fn push(&mut self, mut update: StatusUpdate) {
        let size = encode(&update).len();
        if size > self.limit {
            update.state = crate::protocol::TaskState::Failed;
            update.result = None;
            update.error = Some(format!(
                "the task's result is {size} bytes, over the limit of {} bytes \
                 (the server's max_payload less headroom); raise max_payload in nats.conf",
                self.limit
            ));
        }
        self.pending.push(update);
    }

    /// Sends the pending statuses if no batch is in flight: as many as fit in one message.
    fn send_if_idle(&mut self) {
        if self.request.is_some() || self.pending.is_empty() {
            return;
        }
        let mut size = 256;
        let take = self
            .pending
            .iter()
            .position(|u| {
                size += encode(u).len() + 1;
                size > self.limit
            })
            .unwrap_or(self.pending.len())
            .max(1);
        self.sending = self.pending.drain(..take).collect();
        let payload = encode(&StatusRequest::StatusUpdates {
            executor_id: self.executor_id.clone(),
            updates: self.sending.clone(),
        });
        let (client, subject) = (self.client.clone(), self.subject.clone());
        self.request = Some(Box::pin(async move {
            let reply = tokio::time::timeout(REQUEST_TIMEOUT, client.request(subject, payload)).await;
            let result = match reply {
                Ok(Ok(message)) => decode::<StatusReply>(&message.payload, usize::MAX).map_err(|e| e.to_string()),
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
    async fn in_flight(&mut self) -> StatusResult {
        match self.request.as_mut() {
            Some(request) => request.await,
            None => std::future::pending().await,
        }
    }

    fn settle(&mut self, result: StatusResult) {
        self.request = None;
        match result {
            Ok(StatusReply::StatusAck { refused, .. }) => {
                for r in refused {
                    warn!(task = r.task_id, attempt = r.attempt, reason = %r.reason, "driver refused a status");
                }
                self.sending.clear();
            }
            Ok(StatusReply::Error { message }) => {
                warn!(%message, "driver rejected a status batch");
                self.sending.clear();
            }
            Err(error) => {
                debug!(%error, "status batch not acknowledged; resending");
                let mut batch = std::mem::take(&mut self.sending);
                batch.append(&mut self.pending);
                self.pending = batch;
            }
        }
    }
}
