//! The event history: a JetStream stream of the cluster (`EMBER_<cluster>_EVENTS`), bounded by
//! `--events-max-age` and `--events-max-bytes` (the oldest events go first). The driver
//! publishes each event twice: once on its plain subject (`<p>.events.<kind>`) for the
//! listeners, at once and at most once as core NATS does, and once on its history subject
//! (`<p>.history.<kind>`), which the stream captures and stores under the plain subject. Only
//! the second is acknowledged and sent again when it is not, so an event sent again is stored
//! once and never reaches a plain listener twice.
//!
//! A writer task of its own stores them, in the order the actor hands them over (which is the
//! order the outbox releases them, behind the journal records they depend on), and keeps up to
//! `IN_FLIGHT` unacknowledged: the actor never waits for an acknowledgement. Each carries a
//! message id (`Nats-Msg-Id`: the epoch, the driver instance, a count) and the id of the one
//! before it (`Nats-Expected-Last-Msg-Id`). When an event is not acknowledged (a server that
//! restarted lost it, or its answer), that event and every one after it are sent again, in
//! order: those already stored are known by their ids and stored once, and none is stored
//! before the one it follows, since each expects its predecessor to be the stream's last.
//!
//! A refusal because the stream's last event is not the expected one means another writer came
//! between (a deposed leader's late event, or a server that forgot the last id). A writer that
//! still leads starts its chain again from the stream's end; one that no longer leads gives its
//! remaining events up: they would land after its successor's, whose epoch readers hold to.
//! So a deposed leader's late events are stored only in their place, before any successor's,
//! and a reader's epoch fence (see [`crate::epoch`]) drops whatever else carries an old epoch.

use super::journal::JournalError;
use crate::subjects::Subjects;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{self, DiscardPolicy, StorageType};
use async_nats::jetstream::{self, Context};
use async_nats::{Client, Subject};
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use std::collections::VecDeque;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// How long the stream keeps an event unless told otherwise.
pub const DEFAULT_EVENTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// How many bytes of events the stream keeps unless told otherwise: a share of the 1GB file
/// store that nats.conf gives JetStream, beside the journal and the results bucket.
pub const DEFAULT_EVENTS_MAX_BYTES: u64 = 128 << 20;
/// How long the server remembers an event's id, so that an event sent again after a lost
/// acknowledgement is stored once.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How many events may wait for their acknowledgement before the writer sends no more.
const IN_FLIGHT: usize = 512;
/// How many events may wait for the writer before the actor waits to hand over more.
const QUEUE: usize = 4096;
/// How long an acknowledgement may take before the event is sent again.
const ACK_TIMEOUT: Duration = Duration::from_secs(3);
/// The longest pause between two tries.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);
/// How long a writer whose leadership is lost goes on trying to store the events it holds.
const LATE_PATIENCE: Duration = Duration::from_secs(30);

/// Creates or updates the cluster's events stream with `replicas`.
pub async fn open(
    context: &Context,
    subjects: &Subjects,
    max_age: Duration,
    max_bytes: u64,
    replicas: usize,
) -> Result<(), JournalError> {
    let name = subjects.events_stream();
    let config = stream::Config {
        name: name.clone(),
        subjects: vec![subjects.history_all()],
        // Stored under the subjects the listeners know.
        subject_transform: Some(stream::SubjectTransform {
            source: subjects.history_all(),
            destination: subjects.events_all(),
        }),
        storage: StorageType::File,
        max_age,
        max_bytes: i64::try_from(max_bytes).unwrap_or(i64::MAX),
        discard: DiscardPolicy::Old,
        duplicate_window: DUPLICATE_WINDOW,
        deny_delete: true,
        num_replicas: replicas,
        ..Default::default()
    };
    context
        .create_or_update_stream(config)
        .await
        .map_err(|e| JournalError::Stream {
            stream: name.clone(),
            message: e.to_string(),
        })?;
    info!(stream = %name, ?max_age, max_bytes, replicas, "events stored in JetStream");
    Ok(())
}

/// The handle of one leadership's writer of events.
pub struct History {
    events: mpsc::Sender<(Subject, bytes::Bytes)>,
    task: tokio::task::JoinHandle<()>,
}

/// Who writes: the leadership the events belong to.
pub struct Writer {
    pub guard: super::lease::Guard,
    pub driver_instance: uuid::Uuid,
}

impl History {
    /// Starts the writer of `writer`'s leadership on `client`.
    pub fn start(client: &Client, writer: Writer) -> Self {
        let context = jetstream::ContextBuilder::new()
            .timeout(ACK_TIMEOUT)
            .build(client.clone());
        let (events, received) = mpsc::channel(QUEUE);
        let epoch = writer.guard.epoch();
        let instance = writer.driver_instance.simple().to_string();
        let chain = Chain {
            context,
            guard: writer.guard,
            headers: crate::epoch::headers(epoch).unwrap_or_default(),
            id_prefix: format!("{epoch}-{}", &instance[..8]),
            pending: VecDeque::new(),
            acks: FuturesOrdered::new(),
            next: 0,
            stored: None,
        };
        let task = tokio::spawn(chain.run(received));
        Self { events, task }
    }

    /// Hands one event to the writer; waits only while `QUEUE` events wait for it already.
    pub async fn publish(&self, subject: Subject, payload: bytes::Bytes) {
        if self.events.send((subject, payload)).await.is_err() {
            warn!("the event writer has stopped; an event is not stored");
        }
    }

    /// Waits up to `timeout` for every event handed over to be stored.
    pub async fn close(self, timeout: Duration) {
        drop(self.events);
        if tokio::time::timeout(timeout, self.task).await.is_err() {
            warn!("events still unacknowledged at shutdown; the history may miss them");
        }
    }
}

/// An event not yet acknowledged.
struct Pending {
    number: u64,
    subject: Subject,
    payload: bytes::Bytes,
}

/// The writer's state: the events not yet acknowledged, in order, and their acknowledgements.
struct Chain {
    context: Context,
    guard: super::lease::Guard,
    headers: async_nats::HeaderMap,
    id_prefix: String,
    pending: VecDeque<Pending>,
    acks: FuturesOrdered<BoxFuture<'static, Result<(), PublishError>>>,
    next: u64,
    /// The number of this writer's last event known stored, while the stream's last event is
    /// expected to be it.
    stored: Option<u64>,
}

impl Chain {
    async fn run(mut self, mut received: mpsc::Receiver<(Subject, bytes::Bytes)>) {
        let mut open = true;
        let mut retry = Retry::default();
        loop {
            tokio::select! {
                biased;
                Some(acked) = self.acks.next() => match acked {
                    Ok(()) => {
                        self.stored = self.pending.pop_front().map(|p| p.number);
                        retry.stored();
                    }
                    Err(error) => {
                        if !self.recover(&error, &mut retry).await {
                            return;
                        }
                    }
                },
                event = received.recv(), if open && self.pending.len() < IN_FLIGHT => match event {
                    Some((subject, payload)) => self.push(subject, payload).await,
                    None => open = false,
                },
                else => return,
            }
        }
    }

    /// Sends a new event after the others.
    async fn push(&mut self, subject: Subject, payload: bytes::Bytes) {
        self.next += 1;
        self.pending.push_back(Pending {
            number: self.next,
            subject,
            payload,
        });
        self.send(self.pending.len() - 1).await;
    }

    /// After the oldest event failed with `error`: waits, then sends it and every event after
    /// it again, in order. Returns false if the writer gives up.
    async fn recover(&mut self, error: &PublishError, retry: &mut Retry) -> bool {
        self.acks = FuturesOrdered::new();
        let leads = self.guard.is_current();
        if error.kind() == PublishErrorKind::WrongLastMessageId {
            if !leads {
                warn!(
                    events = self.pending.len(),
                    "a newer leader wrote the event history first; the events this deposed \
                     driver still held are not stored"
                );
                return false;
            }
            // Another writer came between: the chain starts again from the stream's end.
            self.stored = None;
        }
        if !leads && retry.failing_for() > LATE_PATIENCE {
            warn!(
                events = self.pending.len(),
                "events of a leadership since lost could not be stored; given up"
            );
            return false;
        }
        retry.failed(error).await;
        for index in 0..self.pending.len() {
            self.send(index).await;
        }
        true
    }

    /// Sends the event at `index` of the pending ones, expecting the one before it (or the
    /// last one stored) to be the stream's last.
    async fn send(&mut self, index: usize) {
        let event = &self.pending[index];
        let before = match index {
            0 => self.stored,
            _ => Some(self.pending[index - 1].number),
        };
        let mut publish = PublishMessage::build()
            .payload(event.payload.clone())
            .headers(self.headers.clone())
            .message_id(format!("{}.{}", self.id_prefix, event.number));
        if let Some(before) = before {
            publish = publish.expected_last_message_id(format!("{}.{before}", self.id_prefix));
        }
        let sent = self
            .context
            .send_publish(event.subject.clone(), publish)
            .await;
        self.acks.push_back(match sent {
            Ok(ack) => Box::pin(async move { ack.await.map(drop) }),
            Err(error) => Box::pin(std::future::ready(Err(error))),
        });
    }
}

/// The tries to store the oldest event: how many so far, since when, and the next pause.
#[derive(Default)]
struct Retry {
    failing_since: Option<std::time::Instant>,
    attempts: u32,
    delay: Duration,
}

impl Retry {
    fn stored(&mut self) {
        if let Some(since) = self.failing_since.take() {
            info!(attempts = self.attempts + 1, after = ?since.elapsed(), "events stored again");
            *self = Retry::default();
        }
    }

    fn failing_for(&self) -> Duration {
        self.failing_since.map_or(Duration::ZERO, |s| s.elapsed())
    }

    async fn failed(&mut self, error: &PublishError) {
        self.failing_since
            .get_or_insert_with(std::time::Instant::now);
        self.attempts += 1;
        self.delay = (self.delay * 2).clamp(Duration::from_millis(50), MAX_RETRY_DELAY);
        warn!(%error, attempts = self.attempts, retry_in = ?self.delay,
              "an event was not stored in the history; sending it and those after it again");
        tokio::time::sleep(self.delay).await;
    }
}
