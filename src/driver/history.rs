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
//! message id (`Nats-Msg-Id`: the epoch, the driver instance, a count) and the stream sequence
//! it must follow (`Nats-Expected-Last-Sequence`), so none is stored but right after the one
//! before it. When an event is not acknowledged (a server that restarted lost it, or its
//! answer), the writer reads the stream's end and sends that event and every one after it
//! again, one by one, each expecting the stream's last sequence as it then stands: those
//! already stored are known by their ids and stored once.
//!
//! The sequence, not the last message id (`Nats-Expected-Last-Msg-Id`), is the fence: a
//! clustered JetStream checks an expected sequence before it replicates the message, but an
//! expected id only as each replica applies it, where a late event of a deposed leader,
//! arriving once its host is reachable again, stopped every replica of the stream with a
//! "critical write error" (nats-server 2.15.1).
//!
//! A refusal because the stream's last sequence is not the expected one means another writer
//! came between (a deposed leader's late event, or a server that lost the last one). A writer
//! that still leads sends again from the stream's end; one that no longer leads gives its
//! remaining events up at its first failure: they would land after its successor's, whose
//! epoch readers hold to, and the successor tells again what they told (below). So a deposed
//! leader's late events are stored only in their place, before any successor's, and a reader's
//! epoch fence (see [`crate::epoch`]) drops whatever else carries an old epoch.
//!
//! A leader killed before the stream acknowledged its last events leaves the history short of
//! them, though the journal holds what they told. So each stored event carries a [`Stamp`]
//! (header `Ember-Journal: <done> <at>`): every event of a journal write up to `done` was
//! handed to the writer before it or with it, and `at` is the last write whose events were
//! released when it was handed. The next leader reads the stamp of the stream's last event
//! before it replays the journal, keeps the records written after its `done`, and tells their
//! facts again ([`Core::retell`](super::core::Core::retell): job starts, task ends for good,
//! job ends), leaving out those the stream holds already: any stored event of such a record
//! was handed after the record's write was released, so its `at` is at least that `done`,
//! and reading the stream back from its end while `at` is that high finds them all. It
//! stores what is missing before any event of its own.

use super::journal::JournalError;
use crate::ids::{JobId, TaskId};
use crate::protocol::{decode, Event};
use crate::streams::Need;
use crate::subjects::Subjects;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{self, DiscardPolicy, RawMessageErrorKind, StorageType};
use async_nats::jetstream::{self, Context};
use async_nats::{Client, Subject};
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use std::collections::{HashSet, VecDeque};
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
/// The header that carries an event's [`Stamp`].
pub const JOURNAL_HEADER: &str = "Ember-Journal";
/// How many stored events a new leader reads back at most, looking for those of the
/// records it tells again; past it, it tells nothing rather than tell twice.
const MAX_SCAN: u64 = 20_000;

/// Where an event stands against the journal (see the module's doc): every event of the
/// journal writes up to sequence `done` was handed to the writer before it or with it, and
/// `at` is the last write whose events had been released when it was handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub done: u64,
    pub at: u64,
}

impl Stamp {
    fn header(self) -> String {
        format!("{} {}", self.done, self.at)
    }

    fn parse(header: &str) -> Option<Stamp> {
        let (done, at) = header.split_once(' ')?;
        Some(Stamp {
            done: done.parse().ok()?,
            at: at.parse().ok()?,
        })
    }
}

/// The shell's account of the events it hands over, for their stamps.
#[derive(Debug, Default)]
pub struct Stamps {
    /// The last journal write whose held outputs have all been sent.
    released: u64,
    /// `released` when the task events that wait for company began to wait.
    waiting_since: Option<u64>,
}

impl Stamps {
    /// Stamps of a leader whose journal mark is `mark`: every record before it is the
    /// predecessors', whose events the history has or is given before this leader's.
    pub fn new(mark: u64) -> Self {
        Self {
            released: mark,
            waiting_since: None,
        }
    }

    /// Every output held behind the journal write `sequence`, and the writes before it, sent.
    pub fn released(&mut self, sequence: u64) {
        self.released = self.released.max(sequence);
    }

    /// A task event was taken in to wait for company.
    pub fn waits(&mut self) {
        self.waiting_since.get_or_insert(self.released);
    }

    /// The stamp of the task events that waited, as they go: the events of writes released
    /// before they began to wait went before them.
    pub fn of_waiting(&mut self) -> Stamp {
        Stamp {
            done: self.waiting_since.take().unwrap_or(self.released),
            at: self.released,
        }
    }

    /// The stamp of an event handed over while no task event waits.
    pub fn now(&self) -> Stamp {
        Stamp {
            done: self.released,
            at: self.released,
        }
    }
}

/// What a new leader tells again: the events of the records after the history's last
/// stamp's `done`, before it stores any of its own.
pub struct Fill {
    /// The `done` of the stamp the history ended with when the journal was read.
    pub after: u64,
    pub events: Vec<Event>,
    pub subjects: Subjects,
    /// The largest payload the events are cut to.
    pub max_bytes: usize,
}

/// The stamp of the last event in `subjects`' events stream, if it has one that carries a
/// stamp.
pub async fn last_stamp(context: &Context, subjects: &Subjects) -> Result<Option<Stamp>, String> {
    let mut stream = context
        .get_stream(subjects.events_stream())
        .await
        .map_err(|e| e.to_string())?;
    let state = stream
        .info()
        .await
        .map_err(|e| e.to_string())?
        .state
        .clone();
    if state.messages == 0 {
        return Ok(None);
    }
    let last = stream
        .get_raw_message(state.last_sequence)
        .await
        .map_err(|e| e.to_string())?;
    Ok(stamp_of(&last.headers))
}

fn stamp_of(headers: &async_nats::HeaderMap) -> Option<Stamp> {
    Stamp::parse(headers.get(JOURNAL_HEADER)?.as_str())
}

/// The facts the history holds already among those a new leader tells again.
#[derive(Debug, Default)]
struct Told {
    job_starts: HashSet<JobId>,
    job_ends: HashSet<JobId>,
    task_ends: HashSet<(TaskId, u32)>,
}

impl Told {
    fn add(&mut self, event: &Event) {
        match event {
            Event::JobStart { job_id, .. } => {
                self.job_starts.insert(*job_id);
            }
            Event::JobEnd { job_id, .. } => {
                self.job_ends.insert(*job_id);
            }
            Event::TaskEnd { .. } => self
                .task_ends
                .extend(event.ended().map(|(_, t)| (t.task_id, t.attempt))),
            _ => {}
        }
    }

    /// `events` without what was told already.
    fn untold(&self, events: &[Event]) -> Vec<Event> {
        let mut untold = Vec::new();
        for event in events {
            match event {
                Event::JobStart { job_id, .. } if self.job_starts.contains(job_id) => {}
                Event::JobEnd { job_id, .. } if self.job_ends.contains(job_id) => {}
                Event::TaskEnd { .. } => untold.extend(
                    event
                        .clone()
                        .keep_ended(|t| !self.task_ends.contains(&(t.task_id, t.attempt))),
                ),
                other => untold.push(other.clone()),
            }
        }
        untold
    }
}

/// Creates the cluster's events stream with `replicas`, or uses the one that exists if it fits
/// (see [`crate::streams`]).
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
    let failed = |message: String| JournalError::Stream {
        stream: name.clone(),
        message,
    };
    let needs = [Need::SubjectTransform, Need::Discard, Need::DuplicateWindow];
    let found = crate::streams::existing(context, &config, &needs).await;
    if found.map_err(failed)?.is_some() {
        info!(stream = %name, "events stored in JetStream, in the stream as it exists");
        return Ok(());
    }
    super::jetstream::until_answered(&name, || context.create_or_update_stream(config.clone()))
        .await
        .map_err(|e| failed(e.to_string()))?;
    info!(stream = %name, ?max_age, max_bytes, replicas, "events stored in JetStream");
    Ok(())
}

/// The handle of one leadership's writer of events.
pub struct History {
    events: mpsc::Sender<(Subject, bytes::Bytes, Stamp)>,
    task: tokio::task::JoinHandle<()>,
}

/// Who writes: the leadership the events belong to.
pub struct Writer {
    pub guard: super::lease::Guard,
    pub driver_instance: uuid::Uuid,
    /// The events stream's name.
    pub stream: String,
}

impl History {
    /// Starts the writer of `writer`'s leadership on `client`; it first stores what `fill`
    /// tells again, if anything.
    pub fn start(client: &Client, writer: Writer, fill: Option<Fill>) -> Self {
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
            stream: writer.stream,
            pending: VecDeque::new(),
            acks: FuturesOrdered::new(),
            next: 0,
            last: None,
        };
        let task = tokio::spawn(async move {
            let mut chain = chain;
            if let Some(fill) = fill {
                chain.tell_again(fill).await;
            }
            chain.run(received).await
        });
        Self { events, task }
    }

    /// Hands one event to the writer; waits only while `QUEUE` events wait for it already.
    pub async fn publish(&self, subject: Subject, payload: bytes::Bytes, stamp: Stamp) {
        if self.events.send((subject, payload, stamp)).await.is_err() {
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
    stamp: Stamp,
}

/// The writer's state: the events not yet acknowledged, in order, and their acknowledgements.
struct Chain {
    context: Context,
    /// The events stream's name.
    stream: String,
    guard: super::lease::Guard,
    headers: async_nats::HeaderMap,
    id_prefix: String,
    pending: VecDeque<Pending>,
    acks: FuturesOrdered<BoxFuture<'static, Result<u64, PublishError>>>,
    next: u64,
    /// The stream's last sequence before the first pending event, while this writer knows
    /// it: the pending events are then in flight, each expecting the sequence of the one
    /// before it. `None` until the writer has read the stream's end, and after a failure.
    last: Option<u64>,
}

impl Chain {
    async fn run(mut self, mut received: mpsc::Receiver<(Subject, bytes::Bytes, Stamp)>) {
        let mut open = true;
        let mut retry = Retry::default();
        loop {
            if self.last.is_none() && !self.resync(&mut retry).await {
                return;
            }
            tokio::select! {
                biased;
                Some(acked) = self.acks.next() => match acked {
                    Ok(sequence) => {
                        self.pending.pop_front();
                        self.last = Some(sequence);
                        retry.stored();
                    }
                    Err(error) => {
                        self.acks = FuturesOrdered::new();
                        self.last = None;
                        if !self.may_go_on(&error, &retry).await {
                            return;
                        }
                        retry.failed(&error).await;
                    }
                },
                event = received.recv(), if open && self.pending.len() < IN_FLIGHT => match event {
                    Some((subject, payload, stamp)) => self.push(subject, payload, stamp).await,
                    None => open = false,
                },
                else => return,
            }
        }
    }

    /// Sends a new event after the others.
    async fn push(&mut self, subject: Subject, payload: bytes::Bytes, stamp: Stamp) {
        self.next += 1;
        self.pending.push_back(Pending {
            number: self.next,
            subject,
            payload,
            stamp,
        });
        if let Some(last) = self.last {
            let index = self.pending.len() - 1;
            let sent = self.send(index, last + index as u64).await;
            self.acks.push_back(match sent {
                Ok(ack) => Box::pin(async move { ack.await.map(|ack| ack.sequence) }),
                Err(error) => Box::pin(std::future::ready(Err(error))),
            });
        }
    }

    /// Whether the writer goes on after `error`: a writer that no longer leads gives its
    /// events up at once, since they could land after its successor's (whose epoch readers
    /// hold to); the successor tells again from the journal what they told. One whose lease
    /// has lapsed waits to learn which it is.
    fn may_go_on(
        &self,
        error: &PublishError,
        retry: &Retry,
    ) -> impl std::future::Future<Output = bool> + Send + 'static {
        // What it asks taken now: the writer is not `Sync`, and the wait may be long.
        let (guard, events, attempts) =
            (self.guard.clone(), self.pending.len(), retry.attempts + 1);
        let why = match error.kind() {
            PublishErrorKind::WrongLastSequence => "a newer leader wrote the event history first",
            _ => "the history did not store them before this driver stopped leading",
        };
        async move {
            if guard.current().await {
                return true;
            }
            warn!(
                events,
                attempts, why, "events of a leadership since lost are not stored"
            );
            false
        }
    }

    /// Reads the stream's end and sends the pending events again one by one, each expecting
    /// the stream's last sequence as it stands: one stored already (its acknowledgement was
    /// lost) is known by its id and stored once, and moves nothing. Returns false if the
    /// writer gives up.
    async fn resync(&mut self, retry: &mut Retry) -> bool {
        loop {
            match self.resend().await {
                Ok(last) => {
                    self.last = Some(last);
                    retry.stored();
                    return true;
                }
                Err(error) => {
                    if !self.may_go_on(&error, retry).await {
                        return false;
                    }
                    retry.failed(&error).await;
                }
            }
        }
    }

    async fn resend(&mut self) -> Result<u64, PublishError> {
        let unread = |e: &dyn std::fmt::Display| {
            PublishError::with_source(PublishErrorKind::Other, e.to_string())
        };
        let mut stream = self
            .context
            .get_stream(&self.stream)
            .await
            .map_err(|e| unread(&e))?;
        let mut last = stream
            .info()
            .await
            .map_err(|e| unread(&e))?
            .state
            .last_sequence;
        while !self.pending.is_empty() {
            let ack = self.send(0, last).await?.await?;
            if !ack.duplicate {
                last = ack.sequence;
            }
            self.pending.pop_front();
        }
        Ok(last)
    }

    /// Sends the event at `index` of the pending ones, expecting the stream's last sequence
    /// to be `expected`.
    async fn send(
        &mut self,
        index: usize,
        expected: u64,
    ) -> Result<async_nats::jetstream::context::PublishAckFuture, PublishError> {
        let event = &self.pending[index];
        let publish = PublishMessage::build()
            .payload(event.payload.clone())
            .headers(self.stamped(event.stamp))
            .message_id(format!("{}.{}", self.id_prefix, event.number))
            .expected_last_sequence(expected);
        self.context
            .send_publish(event.subject.clone(), publish)
            .await
    }
}

impl Chain {
    /// The headers of an event stamped `stamp`.
    fn stamped(&self, stamp: Stamp) -> async_nats::HeaderMap {
        let mut headers = self.headers.clone();
        headers.insert(JOURNAL_HEADER, stamp.header());
        headers
    }

    /// Stores the events of `fill` the stream lacks, trying again until they are stored or
    /// this driver no longer leads.
    async fn tell_again(&mut self, fill: Fill) {
        let mut delay = Duration::ZERO;
        loop {
            tokio::time::sleep(delay).await;
            if !self.guard.current().await {
                return;
            }
            match self.tell_untold(&fill).await {
                Ok(0) => return,
                Ok(told) => {
                    return info!(
                        events = told,
                        "events the last leader had not stored told again from the journal"
                    )
                }
                Err(Untold::TooFar) => {
                    return warn!(
                        scanned = MAX_SCAN,
                        "the event history is too far behind the journal to tell its events \
                         again; the history misses what the last leader could not store"
                    )
                }
                Err(Untold::Failed(error)) => {
                    delay = (delay * 2).clamp(Duration::from_millis(50), MAX_RETRY_DELAY);
                    warn!(%error, retry_in = ?delay, "the events the last leader had not \
                          stored are not told again yet");
                }
            }
        }
    }

    /// Reads the stream back from its end while its events' stamps are at or past
    /// `fill.after`, and stores, after its last event, those of `fill` not among them.
    /// Returns how many messages were stored.
    async fn tell_untold(&mut self, fill: &Fill) -> Result<usize, Untold> {
        let failed = |e: &dyn std::fmt::Display| Untold::Failed(e.to_string());
        let mut stream = self
            .context
            .get_stream(fill.subjects.events_stream())
            .await
            .map_err(|e| failed(&e))?;
        let state = stream.info().await.map_err(|e| failed(&e))?.state.clone();
        let mut told = Told::default();
        let mut sequence = state.last_sequence;
        while sequence >= state.first_sequence.max(1) {
            if state.last_sequence - sequence >= MAX_SCAN {
                return Err(Untold::TooFar);
            }
            let message = match stream.get_raw_message(sequence).await {
                Ok(message) => message,
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => break,
                Err(e) => return Err(failed(&e)),
            };
            if !stamp_of(&message.headers).is_some_and(|s| s.at >= fill.after) {
                break;
            }
            if let Ok(event) = decode::<Event>(&message.payload, usize::MAX) {
                told.add(&event);
            }
            sequence -= 1;
        }
        let stamp = Stamp {
            done: fill.after,
            at: fill.after,
        };
        let mut expected = state.last_sequence;
        let mut stored = 0;
        for event in told.untold(&fill.events) {
            let subject: Subject = fill.subjects.history(event.kind()).into();
            for payload in crate::protocol::fit(event, fill.max_bytes, &subject) {
                // Each after the one before: should another writer come between, the next
                // try reads what it wrote.
                let publish = PublishMessage::build()
                    .payload(payload)
                    .headers(self.stamped(stamp))
                    .expected_last_sequence(expected);
                let ack = self
                    .context
                    .send_publish(subject.clone(), publish)
                    .await
                    .map_err(|e| failed(&e))?
                    .await
                    .map_err(|e| failed(&e))?;
                expected = ack.sequence;
                stored += 1;
            }
        }
        Ok(stored)
    }
}

/// Why the events a new leader tells again were not stored.
enum Untold {
    /// The history is further behind than `MAX_SCAN` events.
    TooFar,
    Failed(String),
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

    async fn failed(&mut self, error: &(dyn std::fmt::Display + Sync)) {
        self.failing_since
            .get_or_insert_with(std::time::Instant::now);
        self.attempts += 1;
        self.delay = (self.delay * 2).clamp(Duration::from_millis(50), MAX_RETRY_DELAY);
        warn!(%error, attempts = self.attempts, retry_in = ?self.delay,
              "an event was not stored in the history; sending it and those after it again");
        tokio::time::sleep(self.delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ExecutorId;
    use crate::protocol::{ExecutorTasks, TaskEnded, TaskState};

    #[test]
    fn task_events_that_waited_are_stamped_with_where_they_began_to_wait() {
        let mut stamps = Stamps::new(5);
        assert_eq!(stamps.now(), Stamp { done: 5, at: 5 });
        stamps.waits();
        stamps.released(7);
        stamps.waits();
        // Events of writes 6 and 7 may be among those that waited, or go after them.
        assert_eq!(stamps.of_waiting(), Stamp { done: 5, at: 7 });
        assert_eq!(stamps.now(), Stamp { done: 7, at: 7 });
        assert_eq!(stamps.of_waiting(), Stamp { done: 7, at: 7 }, "none waited");
        stamps.released(6);
        assert_eq!(stamps.now().done, 7, "never back");
    }

    #[test]
    fn a_stamp_reads_back_and_garbage_is_no_stamp() {
        let stamp = Stamp { done: 12, at: 40 };
        assert_eq!(Stamp::parse(&stamp.header()), Some(stamp));
        for garbage in ["", "12", "12 x", "-1 3", "1 2 3"] {
            assert_eq!(Stamp::parse(garbage), None, "{garbage:?}");
        }
    }

    fn ends(job_id: JobId, tasks: &[(TaskId, u32)]) -> Event {
        Event::TaskEnd {
            time_ms: 1,
            job_id,
            executors: vec![ExecutorTasks {
                executor_id: ExecutorId::parse("e1").unwrap(),
                tasks: tasks
                    .iter()
                    .map(|&(task_id, attempt)| TaskEnded {
                        task_id,
                        index: task_id as u32,
                        attempt,
                        state: TaskState::Finished,
                        duration_ms: 0,
                        error: None,
                    })
                    .collect(),
            }],
            term: 0,
        }
    }

    fn start(job_id: JobId) -> Event {
        Event::JobStart {
            time_ms: 1,
            job_id,
            name: "j".into(),
            tasks: 3,
        }
    }

    #[test]
    fn what_the_stream_holds_is_not_told_again() {
        let mut told = Told::default();
        told.add(&start(1));
        told.add(&ends(1, &[(0, 0), (2, 1)]));
        let retold = [start(1), ends(1, &[(0, 0), (1, 0), (2, 0)]), start(2)];
        // Task 2's attempt 1 was told, not its attempt 0.
        assert_eq!(told.untold(&retold), [ends(1, &[(1, 0), (2, 0)]), start(2)]);
        told.add(&ends(1, &[(1, 0), (2, 0)]));
        told.add(&start(2));
        assert_eq!(told.untold(&retold), []);
    }
}
