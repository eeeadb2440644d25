//! The driver's journal in JetStream: opening the stream, replaying it into a fresh core at
//! startup, and storing records as the core emits them. A record is stored before anything the
//! same step answers or publishes leaves the driver (see [`super::outbox`]), so what executors
//! and clients were told survives the driver.

use super::core::{Core, Restored};
use super::snapshots::Stored;
use crate::protocol::{decode, JournalRecord};
use crate::subjects::Subjects;
use async_nats::jetstream::context::{AccountError, AccountErrorKind};
use async_nats::jetstream::{self, consumer::pull::OrderedConfig, stream, ErrorCode};
use async_nats::Client;
use futures::future::BoxFuture;
use futures::StreamExt;
use std::time::Duration;
use tracing::{info, warn};

/// The longest a replay may take before the driver gives up starting.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest a failed store waits before it tries again.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

/// Whether the driver keeps a journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum JournalMode {
    /// In JetStream if the server has it, in memory only if it says it has none; the driver
    /// does not start while the server does not say.
    #[default]
    Auto,
    /// In JetStream; the driver refuses to start without it.
    On,
    /// In memory only: a driver restart loses every job.
    Off,
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error(
        "--journal on needs JetStream, which the NATS server does not offer to this user \
         ({0}); enable `jetstream {{}}` in the server config or use --journal off"
    )]
    Unavailable(AccountError),
    #[error(
        "could not learn whether the NATS server offers JetStream ({0}); the driver will not \
         start without a journal the server may hold (--journal off runs without one)"
    )]
    Unanswered(AccountError),
    #[error("could not create or update the journal stream {stream}: {message}")]
    Stream { stream: String, message: String },
    #[error("could not read the journal stream {stream}: {message}")]
    Read { stream: String, message: String },
    #[error("replaying the journal took longer than {0:?}")]
    ReplayTimeout(Duration),
}

/// The journal stream of one cluster.
#[derive(Clone)]
pub struct Journal {
    context: jetstream::Context,
    subject: String,
    stream: String,
}

/// Whether `error` is the server saying that it, or this user's account, has no JetStream at
/// all, rather than a failure to answer (a timeout, or JetStream not ready yet).
fn says_no_jetstream(error: &AccountError) -> bool {
    match error.kind() {
        AccountErrorKind::JetStreamUnavailable => true,
        AccountErrorKind::JetStream(error) => [
            ErrorCode::JETSTREAM_NOT_ENABLED,
            ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT,
        ]
        .contains(&error.error_code()),
        AccountErrorKind::TimedOut | AccountErrorKind::Other => false,
    }
}

impl Journal {
    /// Opens (creating it if needed) the journal stream, or `None` if the journal is off, or
    /// `auto` and the server has no JetStream. Records older than `max_age` are dropped.
    pub async fn open(
        client: &Client,
        subjects: &Subjects,
        mode: JournalMode,
        max_age: Duration,
    ) -> Result<Option<Journal>, JournalError> {
        if mode == JournalMode::Off {
            info!("journal off: jobs live in memory only");
            return Ok(None);
        }
        let context = jetstream::new(client.clone());
        match context.query_account().await {
            Ok(_) => {}
            // A server that did not answer may well have JetStream, and a journal in it.
            Err(error) if !says_no_jetstream(&error) => {
                return Err(JournalError::Unanswered(error))
            }
            Err(error) if mode == JournalMode::On => return Err(JournalError::Unavailable(error)),
            Err(error) => {
                info!(%error, "no JetStream: jobs live in memory only (--journal auto)");
                return Ok(None);
            }
        }
        let journal = Journal {
            context,
            subject: subjects.journal(),
            stream: subjects.journal_stream(),
        };
        journal.create_stream(max_age).await?;
        info!(stream = %journal.stream, max_age = ?max_age, "journal in JetStream");
        Ok(Some(journal))
    }

    async fn create_stream(&self, max_age: Duration) -> Result<(), JournalError> {
        let config = stream::Config {
            name: self.stream.clone(),
            subjects: vec![self.subject.clone()],
            storage: stream::StorageType::File,
            max_age,
            ..Default::default()
        };
        self.context
            .create_or_update_stream(config)
            .await
            .map(drop)
            .map_err(|e| JournalError::Stream {
                stream: self.stream.clone(),
                message: e.to_string(),
            })
    }

    /// Replays every stored record into `core` and resumes it. A record that cannot be decoded
    /// or does not fit is skipped with a warning. Returns the bytes read beside what was
    /// restored.
    pub async fn replay(
        &self,
        core: &mut Core,
        limit: usize,
    ) -> Result<(Restored, u64), JournalError> {
        let bytes = tokio::time::timeout(REPLAY_TIMEOUT, self.replay_all(core, limit))
            .await
            .map_err(|_| JournalError::ReplayTimeout(REPLAY_TIMEOUT))??;
        Ok((core.resume(), bytes))
    }

    async fn replay_all(&self, core: &mut Core, limit: usize) -> Result<u64, JournalError> {
        let read_error = |e: &dyn std::fmt::Display| JournalError::Read {
            stream: self.stream.clone(),
            message: e.to_string(),
        };
        let mut stream = self
            .context
            .get_stream(&self.stream)
            .await
            .map_err(|e| read_error(&e))?;
        let state = stream
            .info()
            .await
            .map_err(|e| read_error(&e))?
            .state
            .clone();
        // Every record may have aged out, leaving a last sequence but nothing to read up to it.
        if state.messages == 0 {
            return Ok(0);
        }
        let last = state.last_sequence;
        let consumer = stream
            .create_consumer(OrderedConfig::default())
            .await
            .map_err(|e| read_error(&e))?;
        let mut messages = consumer.messages().await.map_err(|e| read_error(&e))?;
        let (mut sequence, mut bytes) = (0, 0);
        while sequence < last {
            let Some(message) = messages.next().await else {
                break;
            };
            let message = message.map_err(|e| read_error(&e))?;
            sequence = message.info().map_err(|e| read_error(&e))?.stream_sequence;
            bytes += message.payload.len() as u64;
            // A message holds a group of records, one per line.
            for line in message.payload.split(|&b| b == b'\n') {
                let outcome = decode::<JournalRecord>(line, limit)
                    .map_err(|e| e.to_string())
                    .and_then(|record| core.replay(record).map_err(|e| e.to_string()));
                if let Err(error) = outcome {
                    warn!(sequence, %error, "journal record skipped");
                }
            }
        }
        Ok(bytes)
    }

    /// Starts storing a snapshot's `parts`: each is queued on the connection before this
    /// returns, ahead of any record stored after it. The future stores them (without retrying:
    /// a snapshot that fails is taken again later) and then purges the journal before the
    /// first part.
    pub async fn start_snapshot(
        &self,
        parts: Vec<bytes::Bytes>,
    ) -> BoxFuture<'static, Result<Stored, String>> {
        let count = parts.len();
        let bytes = parts.iter().map(|p| p.len() as u64).sum();
        let mut acks = Vec::with_capacity(count);
        for part in parts {
            match self.context.publish(self.subject.clone(), part).await {
                Ok(ack) => acks.push(ack),
                Err(error) => {
                    let error = format!("could not send a snapshot part: {error}");
                    return Box::pin(std::future::ready(Err(error)));
                }
            }
        }
        let (context, stream) = (self.context.clone(), self.stream.clone());
        Box::pin(async move {
            let mut first = None;
            for ack in acks {
                let ack = ack
                    .await
                    .map_err(|e| format!("a snapshot part was not stored: {e}"))?;
                first.get_or_insert(ack.sequence);
            }
            let first_sequence = first.ok_or("a snapshot of no parts")?;
            let stream = context
                .get_stream(&stream)
                .await
                .map_err(|e| format!("could not find the journal to purge it: {e}"))?;
            let purged = stream
                .purge()
                .sequence(first_sequence)
                .await
                .map_err(|e| format!("could not purge the journal before the snapshot: {e}"))?
                .purged;
            Ok(Stored {
                parts: count,
                bytes,
                first_sequence,
                purged,
            })
        })
    }

    /// Stores `payload` (one encoded record), trying again until the server acknowledges it:
    /// what waits behind it must not leave before it is stored.
    pub fn store(&self, payload: bytes::Bytes) -> BoxFuture<'static, ()> {
        store(self.context.clone(), self.subject.clone(), payload)
    }

    /// The JetStream context the journal uses, for the results bucket beside it.
    pub fn context(&self) -> &jetstream::Context {
        &self.context
    }
}

/// Publishes `payload` on `subject` into JetStream, trying again until the server
/// acknowledges it: what waits behind it must not leave before it is stored. The write runs
/// as a task of its own, started at once (writes started in turn are sent in turn), rather
/// than when the returned future is first polled.
pub fn store(
    context: jetstream::Context,
    subject: String,
    payload: bytes::Bytes,
) -> BoxFuture<'static, ()> {
    let write = tokio::spawn(store_until_stored(context, subject, payload));
    Box::pin(async move {
        if let Err(error) = write.await {
            // Only a panic gets here (the task is never cancelled): a defect, logged as one;
            // what waits on the write goes on rather than waiting for ever.
            tracing::error!(%error, "a JetStream write's task ended without storing it");
        }
    })
}

async fn store_until_stored(context: jetstream::Context, subject: String, payload: bytes::Bytes) {
    let mut delay = Duration::from_millis(50);
    let (first, mut attempts) = (std::time::Instant::now(), 0u32);
    loop {
        let stored = match context.publish(subject.clone(), payload.clone()).await {
            Ok(ack) => ack.await.map(drop).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        attempts += 1;
        match stored {
            Ok(()) => {
                if attempts > 1 {
                    info!(attempts, after = ?first.elapsed(), "JetStream write stored");
                }
                return;
            }
            Err(error) => warn!(
                %error,
                attempts,
                failing_for = ?first.elapsed(),
                retry_in = ?delay,
                "JetStream write failed; the answers and events that follow it wait until \
                 it is stored (is JetStream up?)"
            ),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_RETRY_DELAY);
    }
}
