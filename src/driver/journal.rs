//! The driver's journal in JetStream: opening the stream, replaying it into a fresh core at
//! startup, and storing records as the core emits them. A record is stored before anything the
//! same step answers or publishes leaves the driver (see [`super::outbox`]), so what executors
//! and clients were told survives the driver.

use super::chain::{Writer, Writers};
use super::core::{Core, Restored};
use super::jetstream::{retry_while, until_answered};
use super::lease::Guard;
use super::snapshots::Stored;
use crate::metrics::JournalWrites;
use crate::protocol::{decode, encode, JournalRecord};
use crate::subjects::Subjects;
use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::context::{AccountError, AccountErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, consumer::pull::OrderedConfig, stream, ErrorCode};
use async_nats::Client;
use futures::future::BoxFuture;
use futures::StreamExt;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};
use writes::{started, store_after, Retry, ACK_PATIENCE};

mod writes;

pub use writes::store;

/// The longest a replay (or the leadership mark before it) may take before the driver gives
/// up starting, unless `--replay-timeout` says otherwise.
pub const DEFAULT_REPLAY_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest pause between replays of a journal that could not be read. A driver that has
/// just taken the lease answers nothing until its replay ends, and a JetStream cluster just
/// healed answers at once that it is unavailable, for a second or two: asked every 250 ms at
/// most, the replay starts soon after it can.
const REPLAY_RETRY_DELAY: Duration = Duration::from_millis(250);

/// How long the server remembers a write's message id, so that a write tried again after a
/// lost answer is known as one it stored already.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(30);

/// What an existing journal stream must have: the window its message ids are de-duplicated
/// over, no limit that drops records, and purges (by the snapshots).
const JOURNAL_NEEDS: &[crate::streams::Need] = &[
    crate::streams::Need::DuplicateWindow,
    crate::streams::Need::Unbounded,
    crate::streams::Need::Purge,
];
/// How long a write waits before it tries again when the write before it is not stored yet.
pub(crate) const TURN_DELAY: Duration = Duration::from_millis(20);

/// How many copies a clustered server keeps of the journal, the results bucket and the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Replicas {
    /// 3 when the server is part of a cluster (1 if the cluster cannot place 3), else 1.
    #[default]
    Auto,
    Exactly(usize),
}

impl Replicas {
    /// Parses `--replicas`: `auto`, or 1 to 5.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(Replicas::Auto),
            n => match n.parse::<usize>() {
                Ok(n @ 1..=5) => Ok(Replicas::Exactly(n)),
                _ => Err(format!("{text:?} is neither auto nor 1 to 5")),
            },
        }
    }

    /// How many to ask for first of a server that says whether it is clustered.
    pub fn wanted(self, clustered: bool) -> usize {
        match self {
            Replicas::Exactly(n) => n,
            Replicas::Auto if clustered => 3,
            Replicas::Auto => 1,
        }
    }

    /// Makes something with `wanted` replicas by `make`, and with `auto`, falls back to one
    /// replica (with a warning) if the cluster cannot place that many. A request that timed
    /// out (a cluster still electing its leaders, or busy) is sent again, for up to
    /// `JETSTREAM_WAIT`, rather than taken for a cluster that cannot place them.
    pub async fn make<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
        self,
        wanted: usize,
        what: &str,
        mut make: impl FnMut(usize) -> F,
    ) -> Result<T, E> {
        match until_answered(what, || make(wanted)).await {
            Err(error) if self == Replicas::Auto && wanted > 1 => {
                warn!(%error, what, wanted, "could not keep that many replicas; keeping one");
                until_answered(what, || make(1)).await
            }
            made => made,
        }
    }
}

/// `auto` or the number, as [`Replicas::parse`] reads it.
impl std::fmt::Display for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Replicas::Auto => f.write_str("auto"),
            Replicas::Exactly(n) => write!(f, "{n}"),
        }
    }
}

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
    #[error("replaying the journal took longer than {0:?} (--replay-timeout)")]
    ReplayTimeout(Duration),
    #[error("could not mark the journal with this driver's leadership within {0:?} (--replay-timeout): {1}")]
    Lead(Duration, String),
}

/// The journal stream of one cluster.
#[derive(Clone)]
pub struct Journal {
    context: jetstream::Context,
    subject: String,
    stream: String,
    /// The turns of the leader's writes, once it leads.
    turns: Option<Arc<Turns>>,
    /// How many copies the server keeps of it: the lease and the results bucket keep as many.
    pub replicas: usize,
    /// What its writes are counted in.
    writes: JournalWrites,
}

/// The order of one leader's writes. Each write expects the stream's last sequence to be the
/// one its predecessor took (JetStream's `Nats-Expected-Last-Sequence`), so a write is never
/// stored out of turn, and a write of a deposed leader, overtaken by its successor's mark
/// ([`JournalRecord::Leader`]), is refused. Each carries a message id of its epoch and
/// sequence, so a write tried again after a lost answer is known as stored.
struct Turns {
    /// The last sequence the next write expects.
    next: AtomicU64,
    /// The sequence of this leader's mark.
    mark: u64,
    /// The highest sequence the server acknowledged storing for this leader.
    stored: AtomicU64,
    guard: Guard,
    /// Told when the stream answered a write while one before it was missing: the writes
    /// still waiting for their acknowledgement were likely lost (see [`HURRY_AFTER`]).
    behind: tokio::sync::Notify,
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

/// What a replay gives: the core restored and resumed, what it restored, the bytes read, and
/// the records kept for the event history.
pub struct Replayed {
    pub core: Core,
    pub restored: Restored,
    pub bytes: u64,
    pub tail: Tail,
}

/// The records a replay keeps, in order: those written after a given sequence (the last the
/// event history has every event of), whose events a new leader tells again. Snapshot parts
/// repeat what came before them and are not kept.
pub struct Tail {
    after: Option<u64>,
    /// The records kept.
    pub records: Vec<JournalRecord>,
    /// Whether records after `after` were purged before the replay read them (a snapshot
    /// came after them): their events cannot be told again.
    pub purged: bool,
    /// Whether more than `MAX_TAIL_BYTES` were to be kept: none are.
    pub too_long: bool,
    bytes: usize,
}

/// The most bytes of records a replay keeps for the event history.
const MAX_TAIL_BYTES: usize = 64 << 20;

impl Tail {
    fn new(after: Option<u64>) -> Self {
        Self {
            after,
            records: Vec::new(),
            purged: false,
            too_long: false,
            bytes: 0,
        }
    }

    /// Whether the records of the message at `sequence`, of `bytes`, are kept.
    fn keeps(&mut self, sequence: u64, bytes: usize) -> bool {
        let Some(after) = self.after.filter(|&after| sequence > after) else {
            return false;
        };
        // The first message past `after` should be the next one.
        if self.bytes == 0 && sequence > after + 1 {
            self.purged = true;
        }
        self.bytes += bytes.max(1);
        if self.bytes > MAX_TAIL_BYTES {
            self.too_long = true;
            self.records = Vec::new();
        }
        !self.too_long
    }

    /// Keeps a copy of `record` if `kept`, and gives it back.
    fn keep(&mut self, kept: bool, record: JournalRecord) -> JournalRecord {
        if kept && !matches!(record, JournalRecord::SnapshotPart { .. }) {
            self.records.push(record.clone());
        }
        record
    }
}

/// The account's JetStream information, asked again while the server does not answer (for up
/// to `JETSTREAM_WAIT`); an answer that JetStream is off comes back at once.
async fn query_account(
    context: &jetstream::Context,
) -> Result<jetstream::account::Account, AccountError> {
    // A server whose JetStream has no leader yet lets the request wait out its timeout: asked
    // again sooner, it answers once it has one.
    retry_while(
        "JetStream",
        |error| !says_no_jetstream(error),
        || context.query_account(),
    )
    .await
}

impl Journal {
    /// Opens (creating it if needed) the journal stream, or `None` if the journal is off, or
    /// `auto` and the server has no JetStream. Records older than `max_age` are dropped; the
    /// time each write takes and its retries are counted in `writes`.
    pub async fn open(
        client: &Client,
        subjects: &Subjects,
        mode: JournalMode,
        max_age: Duration,
        replicas: Replicas,
        writes: JournalWrites,
    ) -> Result<Option<Journal>, JournalError> {
        if mode == JournalMode::Off {
            info!("journal off: jobs live in memory only");
            return Ok(None);
        }
        let context = jetstream::new(client.clone());
        match query_account(&context).await {
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
        let mut journal = Journal {
            context,
            subject: subjects.journal(),
            stream: subjects.journal_stream(),
            turns: None,
            replicas: 1,
            writes,
        };
        let wanted = replicas.wanted(client.server_info().cluster.is_some());
        let config = journal.config(max_age, wanted);
        let found = crate::streams::existing(&journal.context, &config, JOURNAL_NEEDS).await;
        let found = found.map_err(|message| JournalError::Stream {
            stream: journal.stream.clone(),
            message,
        })?;
        journal.replicas = match found {
            Some(has) => has.num_replicas.max(1),
            None => {
                let made = replicas.make(wanted, "journal", |n| journal.create_stream(max_age, n));
                made.await?
            }
        };
        let replicas = journal.replicas;
        info!(stream = %journal.stream, max_age = ?max_age, replicas, "journal in JetStream");
        Ok(Some(journal))
    }

    /// The journal stream as Ember makes it.
    fn config(&self, max_age: Duration, replicas: usize) -> stream::Config {
        stream::Config {
            name: self.stream.clone(),
            subjects: vec![self.subject.clone()],
            storage: stream::StorageType::File,
            max_age,
            duplicate_window: DUPLICATE_WINDOW,
            num_replicas: replicas,
            ..Default::default()
        }
    }

    /// Creates the stream with `replicas`, and returns how many it keeps.
    async fn create_stream(
        &self,
        max_age: Duration,
        replicas: usize,
    ) -> Result<usize, JournalError> {
        self.context
            .create_or_update_stream(self.config(max_age, replicas))
            .await
            .map(|info| info.config.num_replicas)
            .map_err(|e| JournalError::Stream {
                stream: self.stream.clone(),
                message: e.to_string(),
            })
    }

    /// Marks the journal with this driver's leadership ([`JournalRecord::Leader`]), written
    /// whatever came before it, and from then on stores every write in turn after it: an
    /// earlier leader's writes after the mark are refused, and what the journal holds up to
    /// the mark is all that any leader wrote before this one. Fails if the mark is not stored
    /// within `timeout`.
    pub async fn lead(
        &mut self,
        guard: Guard,
        mark: JournalRecord,
        timeout: Duration,
    ) -> Result<(), JournalError> {
        let epoch = guard.epoch();
        let payload = encode(&mark);
        let publish = || {
            PublishMessage::build()
                .payload(payload.clone())
                .message_id(format!("{epoch}.lead"))
        };
        let marked = async {
            let mut retry = Retry::new(Some(self.writes.clone()));
            loop {
                let sent = self.context.send_publish(self.subject.clone(), publish());
                let stored = match sent.await {
                    Ok(ack) => tokio::time::timeout(ACK_PATIENCE, ack.into_future())
                        .await
                        .map_err(|_| format!("no answer within {ACK_PATIENCE:?}"))
                        .and_then(|stored| stored.map_err(|e| e.to_string())),
                    Err(e) => Err(e.to_string()),
                };
                match stored {
                    Ok(ack) => {
                        retry.stored();
                        return ack.sequence;
                    }
                    Err(error) => retry.failed(&error).await,
                }
            }
        };
        let sequence = by(tokio::time::Instant::now() + timeout, marked)
            .await
            .ok_or_else(|| JournalError::Lead(timeout, "no answer in time".into()))?;
        self.turns = Some(Arc::new(Turns {
            next: AtomicU64::new(sequence),
            mark: sequence,
            stored: AtomicU64::new(sequence),
            guard,
            behind: tokio::sync::Notify::new(),
        }));
        Ok(())
    }

    /// The stream's last sequence, as the server says now.
    async fn last_sequence(&self) -> Result<u64, String> {
        let mut stream = self
            .context
            .get_stream(&self.stream)
            .await
            .map_err(|e| e.to_string())?;
        let info = stream.info().await.map_err(|e| e.to_string())?;
        Ok(info.state.last_sequence)
    }

    /// Replays every stored record into a core made by `new_core` and resumes it. A record
    /// that cannot be decoded or does not fit is skipped with a warning; a `TasksEnded` record
    /// with some entries that do not fit is applied in part, with a warning naming them. A
    /// read that fails (a server electing the stream's leader after losing a node times out)
    /// starts again on a new core until `timeout` has passed since the first. Returns the core
    /// and the bytes read beside what was restored.
    pub async fn replay(
        &self,
        new_core: impl Fn() -> Core,
        limit: usize,
        timeout: Duration,
        keep_after: Option<u64>,
    ) -> Result<Replayed, JournalError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let (mut attempts, mut delay) = (0, Duration::from_millis(50));
        loop {
            let mut core = new_core();
            let mut tail = Tail::new(keep_after);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let replayed = self.replay_all(&mut core, limit, &mut tail);
            match by(deadline, replayed).await {
                None => return Err(JournalError::ReplayTimeout(timeout)),
                Some(Ok(bytes)) => {
                    let restored = core.resume(crate::now_ms());
                    return Ok(Replayed {
                        core,
                        restored,
                        bytes,
                        tail,
                    });
                }
                Some(Err(error @ JournalError::Read { .. })) if delay < left => {
                    attempts += 1;
                    warn!(%error, attempts, retry_in = ?delay,
                          "the journal could not be read; replaying it again from the start");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(REPLAY_RETRY_DELAY);
                }
                Some(Err(error)) => return Err(error),
            }
        }
    }

    async fn replay_all(
        &self,
        core: &mut Core,
        limit: usize,
        tail: &mut Tail,
    ) -> Result<u64, JournalError> {
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
        // Read through this leadership's own mark at least: the state may come from a server
        // that has not heard of the writes acknowledged since (one that led the stream before
        // a partition healed answers as its leader until it learns of its successor), and the
        // mark was stored after everything any earlier leader was told was stored.
        let mark = self.mark().unwrap_or(0);
        // Every record may have aged out, leaving a last sequence but nothing to read up to it.
        if state.messages == 0 && mark == 0 {
            return Ok(0);
        }
        let last = state.last_sequence.max(mark);
        let consumer = stream
            .create_consumer(OrderedConfig::default())
            .await
            .map_err(|e| read_error(&e))?;
        let mut messages = consumer.messages().await.map_err(|e| read_error(&e))?;
        let (mut sequence, mut bytes, mut writers) = (0, 0, Writers::default());
        while sequence < last {
            let Some(message) = messages.next().await else {
                break;
            };
            let message = message.map_err(|e| read_error(&e))?;
            sequence = message.info().map_err(|e| read_error(&e))?.stream_sequence;
            bytes += message.payload.len() as u64;
            let kept = tail.keeps(sequence, message.payload.len());
            let id = message
                .headers
                .as_ref()
                .and_then(|h| h.get(NATS_MESSAGE_ID));
            let writer = Writer::of(id.map(|id| id.as_str()));
            if !writers.admit(writer) {
                warn!(
                    sequence,
                    ?writer,
                    "journal message skipped: it was stored off its \
                       leader's turn (after a successor's mark, or after a write of its own \
                       that was refused), and nothing behind it was told"
                );
                continue;
            }
            // A message holds a group of records, one per line.
            for line in message.payload.split(|&b| b == b'\n') {
                match decode::<JournalRecord>(line, limit) {
                    Err(error) => warn!(sequence, %error, "journal record skipped"),
                    Ok(record) => match core.replay(tail.keep(kept, record)) {
                        Ok(()) => {}
                        Err(error) if error.applied_in_part() => {
                            warn!(sequence, %error, "journal record applied in part")
                        }
                        Err(error) => warn!(sequence, %error, "journal record skipped"),
                    },
                }
            }
        }
        Ok(bytes)
    }

    /// Starts storing a snapshot's `parts`, each in its turn after what was stored before it
    /// and ahead of any record stored after it. The future stores them, trying again until
    /// each is stored, and then purges the journal before the first part.
    pub fn start_snapshot(
        &self,
        parts: Vec<bytes::Bytes>,
    ) -> BoxFuture<'static, Result<Stored, String>> {
        let count = parts.len();
        let bytes = parts.iter().map(|p| p.len() as u64).sum();
        let mut first = None;
        let writes: Vec<_> = parts
            .into_iter()
            .map(|part| {
                let (sequence, write) = self.store_in_turn(part);
                first = first.or(sequence);
                write
            })
            .collect();
        let (journal, stream) = (self.clone(), self.stream.clone());
        Box::pin(async move {
            futures::future::join_all(writes).await;
            // Without turns (no leadership), the first part's sequence is not known: nothing
            // is purged, which loses nothing.
            let first_sequence = first.ok_or("the snapshot's place in the journal is not known")?;
            let stream = journal
                .context
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
    /// what waits behind it must not leave before it is stored. The future gives the
    /// sequence the write took, once this driver leads.
    pub fn store(&self, payload: bytes::Bytes) -> BoxFuture<'static, Option<u64>> {
        let (sequence, write) = self.store_in_turn(payload);
        Box::pin(async move {
            write.await;
            sequence
        })
    }

    /// The sequence of this driver's leadership mark, once it leads.
    pub fn mark(&self) -> Option<u64> {
        self.turns.as_ref().map(|turns| turns.mark)
    }

    /// Stores `payload` in its turn, once this driver leads: the sequence it will take, and
    /// the write, started at once as a task of its own.
    fn store_in_turn(&self, payload: bytes::Bytes) -> (Option<u64>, BoxFuture<'static, ()>) {
        let Some(turns) = self.turns.clone() else {
            let writes = Some(self.writes.clone());
            let write = store(self.context.clone(), self.subject.clone(), payload, writes);
            return (None, write);
        };
        let expected = turns.next.fetch_add(1, SeqCst);
        let write = started(store_after(self.clone(), turns, expected, payload));
        (Some(expected + 1), write)
    }

    /// The JetStream context the journal uses, for the lease and the results bucket beside it.
    pub fn context(&self) -> &jetstream::Context {
        &self.context
    }
}

/// What `future` gives if it is done by `deadline`. Checked again once it is done: the timer's
/// resolution (1 ms) lets a future that ends within it through a deadline nearer than that.
async fn by<T>(
    deadline: tokio::time::Instant,
    future: impl std::future::Future<Output = T>,
) -> Option<T> {
    let done = tokio::time::timeout_at(deadline, future).await.ok()?;
    (tokio::time::Instant::now() <= deadline).then_some(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// What `Replicas::make` asked for, answering each ask with the next of `answers`.
    async fn asks(
        replicas: Replicas,
        answers: &[Result<usize, &str>],
    ) -> (Vec<usize>, Result<usize, String>) {
        let (asked, next) = (RefCell::new(Vec::new()), RefCell::new(answers.iter()));
        let made = replicas
            .make(3, "test", |n| {
                asked.borrow_mut().push(n);
                let answer = next
                    .borrow_mut()
                    .next()
                    .expect("an answer")
                    .map_err(String::from);
                async move { answer }
            })
            .await;
        (asked.into_inner(), made)
    }

    #[tokio::test(start_paused = true)]
    async fn replicas_are_asked_for_again_when_unanswered_and_given_up_only_when_refused() {
        let timed_out = Err("jetstream request timed out");
        let refused = Err("insufficient resources");
        // Unanswered: asked again for three; then placed.
        assert_eq!(
            asks(Replicas::Auto, &[timed_out, timed_out, Ok(3)]).await,
            (vec![3, 3, 3], Ok(3))
        );
        // Refused: one replica, with auto.
        assert_eq!(
            asks(Replicas::Auto, &[refused, Ok(1)]).await,
            (vec![3, 1], Ok(1))
        );
        // Refused with an exact count: the error.
        let (asked, made) = asks(Replicas::Exactly(3), &[refused]).await;
        assert_eq!((asked, made.is_err()), (vec![3], true));
    }
}
