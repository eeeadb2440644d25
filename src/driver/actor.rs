//! The actor that owns the driver [`Core`]: one task reads the driver's subscriptions and the
//! revive timer, decodes, calls the core, answers, and sends the core's effects. Owning the core
//! here, without a lock or a second task, keeps Spark's one-message-at-a-time semantics and
//! costs no channel hop per message.

use super::coalesce::TaskEvents;
use super::core::{
    AllocationConfig, Core, CoreConfig, Effect, ExclusionConfig, Liveness, Retention, StartGate,
};
use super::discovery::{self, ApiCounts, Identity};
use super::history::{self, Fill, History, Stamp, Stamps};
use super::journal::{Journal, JournalError, JournalMode, Replayed, Replicas, Tail};
use super::lease::{Guard, Lease, LeaseError, Tenure};
use super::outbox::{Outbox, Output, ReplyTo};
use super::results::ResultsBucket;
use super::snapshots::{Encoded, Schedule, Stored};
use crate::connect::{flush, Unsent};
use crate::metrics::{DriverMetrics, RequestKind};
use crate::protocol::{
    decode, encode, ApiReply, ApiRequest, Batch, Event, HeartbeatReply, HeartbeatRequest,
    JournalRecord, RegisterReply, RegisterRequest, ResultsPage, StatusReply, StatusRequest,
};
use crate::subjects::Subjects;
use crate::{now_ms, PAYLOAD_HEADROOM};
use async_nats::{Client, Message, Subject, Subscriber};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use serde::Serialize;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How the driver runs.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    pub subjects: Subjects,
    /// Executors expected to register (Spark's `numPendingExecutors` starts here).
    pub expect_executors: u64,
    /// How often free cores are offered even when nothing else prompts it (and silent
    /// executors are looked for).
    pub revive_interval: Duration,
    /// How jobs share the cores: FIFO, or FAIR between pools (`--scheduling`, `--pool`).
    pub scheduling: super::core::Scheduling,
    /// How executors are judged alive.
    pub liveness: Liveness,
    /// Whether jobs are kept in a JetStream journal, to survive a driver restart.
    pub journal: JournalMode,
    /// How long journal records are kept (the stream's max age).
    pub journal_max_age: Duration,
    /// How many finished jobs are kept.
    pub retention: Retention,
    /// Snapshot the journal each time it has grown by this many bytes, or twice the last
    /// snapshot's size if that is more.
    pub snapshot_after: u64,
    /// How long, and up to how many bytes, the results bucket keeps results (with a journal).
    pub results_max_age: Duration,
    pub results_max_bytes: u64,
    /// How long, and up to how many bytes, the events stream keeps events (with a journal).
    pub events_max_age: Duration,
    pub events_max_bytes: u64,
    /// How long a leadership lasts unrenewed (with a journal, drivers elect one leader).
    pub lease: Duration,
    /// How long a starting driver may take to mark the journal with its leadership and to
    /// replay it, before it gives up starting.
    pub replay_timeout: Duration,
    /// How many copies a clustered server keeps of the journal, results and lease.
    pub replicas: Replicas,
    /// What the driver counts, for `--metrics-addr`.
    pub metrics: Arc<DriverMetrics>,
    /// The dynamic allocation signal's settings, if it is on.
    pub allocation: Option<AllocationConfig>,
    /// The live web page's link into the driver, for `--http`.
    pub web: Option<crate::web::Link>,
    /// Hold offers until enough executors have registered, if set (`--min-registered`).
    pub start_gate: Option<StartGate>,
    /// Exclude executors on which tasks fail, if set (`--exclude-on-failure`).
    pub exclusion: Option<ExclusionConfig>,
}

impl DriverConfig {
    /// The defaults `ember-driver` has, for `subjects`.
    pub fn new(subjects: Subjects) -> Self {
        Self {
            subjects,
            expect_executors: 0,
            revive_interval: Duration::from_secs(1),
            scheduling: Default::default(),
            liveness: Liveness::default(),
            journal: JournalMode::default(),
            journal_max_age: crate::DEFAULT_JOURNAL_MAX_AGE,
            retention: Retention::default(),
            snapshot_after: crate::DEFAULT_SNAPSHOT_AFTER,
            results_max_age: super::results::DEFAULT_RESULTS_MAX_AGE,
            results_max_bytes: super::results::DEFAULT_RESULTS_MAX_BYTES,
            events_max_age: history::DEFAULT_EVENTS_MAX_AGE,
            events_max_bytes: history::DEFAULT_EVENTS_MAX_BYTES,
            lease: super::lease::DEFAULT_LEASE,
            replay_timeout: super::journal::DEFAULT_REPLAY_TIMEOUT,
            replicas: Replicas::Auto,
            metrics: Arc::new(DriverMetrics::new()),
            allocation: None,
            web: None,
            start_gate: None,
            exclusion: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("could not subscribe to {subject}: {source}")]
    Subscribe {
        subject: String,
        source: async_nats::SubscribeError,
    },
    #[error("could not send the driver's subscriptions to the NATS server ({0})")]
    NotSubscribed(Unsent),
    #[error("could not send the driver's last messages to the NATS server ({0}); they are lost")]
    LastMessages(Unsent),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("could not start the driver's NATS service (ember-driver): {0}")]
    Service(async_nats::Error),
}

/// How often the dynamic allocation target is brought up to date, when it is on (as Spark's
/// allocation manager's schedule).
const ALLOCATE_INTERVAL: Duration = Duration::from_millis(100);

/// How long a stopping driver waits for its last journal writes.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The first and the longest pause before a deposed driver tries again to stand by.
const RESTART_DELAY_MIN: Duration = Duration::from_millis(500);
const RESTART_DELAY_MAX: Duration = Duration::from_secs(10);

/// Runs the driver on `client` until `shutdown` completes. With a journal, it first waits to
/// lead the cluster's drivers, and stands by again whenever it stops leading.
pub async fn run(
    client: Client,
    config: DriverConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DriverError> {
    tokio::pin!(shutdown);
    // Whether this driver has led: once it has, its settings are known to work, and a start
    // that fails again (a server electing its JetStream leaders after losing a node) is
    // tried again rather than ending the driver.
    let mut has_led = false;
    let mut retry_in = Duration::ZERO;
    loop {
        // A signal is heeded from the start: a journal slow to answer or to replay, a lease
        // held by another driver, or a server gone, must not keep the driver from stopping.
        let started = tokio::select! {
            started = async {
                tokio::time::sleep(retry_in).await;
                start(&client, &config).await
            } => started,
            _ = &mut shutdown => {
                info!("driver stopped before it led");
                return Ok(());
            }
        };
        let (core, inputs, shell) = match started {
            Ok(started) => started,
            Err(error) if has_led => {
                retry_in = (retry_in * 2).clamp(RESTART_DELAY_MIN, RESTART_DELAY_MAX);
                warn!(%error, ?retry_in, "could not stand by again; trying again");
                continue;
            }
            Err(error) => return Err(error),
        };
        has_led = true;
        retry_in = Duration::ZERO;
        match lead(&client, &config, core, inputs, shell, &mut shutdown).await? {
            Ended::Stopped => return Ok(()),
            Ended::Deposed => info!("standing by again"),
        }
    }
}

/// How a leadership ended.
enum Ended {
    /// Told to stop.
    Stopped,
    /// Lost to another driver, or to a lease that could not be renewed.
    Deposed,
}

/// Runs the core until `shutdown` completes or the leadership is lost.
async fn lead(
    client: &Client,
    config: &DriverConfig,
    mut core: Core,
    mut inputs: Inputs,
    mut shell: Shell,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Result<Ended, DriverError> {
    info!(cluster = shell.subjects.prefix(), "driver ready");
    shell.metrics.leader.set(1);
    shell
        .metrics
        .epoch
        .set(shell.tenure.as_ref().map_or(0, |t| t.epoch() as i64));
    shell.metrics.set_core(core.gauges());
    let mut scrapes = shell.metrics.scrapes();
    let mut queries = shell.web.as_ref().and_then(|web| {
        web.leading(
            shell.tenure.as_ref().map_or(0, Tenure::epoch),
            core.driver_instance(),
        );
        web.queries()
    });
    // Beside the shell rather than in it: the writes in flight are `Send` but not `Sync`.
    let mut outbox = Outbox::default();
    // The snapshot being stored, if one is: at most one at a time.
    let mut snapshots = FuturesUnordered::new();
    let mut revive = tokio::time::interval(config.revive_interval);
    revive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut allocate = tokio::time::interval(ALLOCATE_INTERVAL);
    allocate.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut speculate = tokio::time::interval(crate::driver::core::SPECULATION_INTERVAL);
    speculate.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // One timer for the task events, moved only when what waits changes, rather than a new
    // one each time round the loop.
    let events_due = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(events_due);
    // The same for the group of task ends that waits to be written.
    let commit_due = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(commit_due);
    let guard = shell.guard().cloned();
    let lost = async {
        match &guard {
            Some(guard) => guard.lost().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    loop {
        let due = shell.task_events.due();
        if let Some(due) = due.filter(|&due| due != events_due.deadline()) {
            events_due.as_mut().reset(due);
        }
        let group_due = outbox.commit_due();
        if let Some(due) = group_due.filter(|&due| due != commit_due.deadline()) {
            commit_due.as_mut().reset(due);
        }
        let reply = tokio::select! {
            biased;
            _ = &mut lost => {
                // What waits behind the journal is dropped, unsent: a successor may lead.
                warn!("leadership lost: the driver stops acting and stands by");
                discovery::stop(inputs.service).await;
                shell.stood_down();
                return Ok(Ended::Deposed);
            }
            _ = &mut *shutdown => break,
            Some(message) = inputs.register.next() => {
                timed(&shell.metrics, RequestKind::Register, || shell.on_register(&mut core, message))
            }
            Some(message) = inputs.status.next() => {
                timed(&shell.metrics, RequestKind::Status, || shell.on_status(&mut core, message))
            }
            Some(message) = inputs.heartbeat.next() => {
                timed(&shell.metrics, RequestKind::Heartbeat, || shell.on_heartbeat(&mut core, message))
            }
            Some(request) = inputs.api.next() => {
                timed(&shell.metrics, RequestKind::Api, || shell.on_api(&mut core, request))
            }
            query = crate::web::next_query(&mut queries) => {
                crate::web::answer(&mut core, shell.results.as_ref(), query, now_ms());
                None
            }
            Some(scrape) = scrapes.recv() => {
                shell.metrics.answer(scrape, core.gauges());
                None
            }
            _ = revive.tick() => {
                core.tick(now_ms());
                shell.refusals.report();
                shell.ticked = true;
                None
            }
            _ = allocate.tick(), if config.allocation.is_some() => {
                core.allocate(now_ms());
                None
            }
            _ = speculate.tick(), if core.speculating() => {
                core.speculate(now_ms());
                None
            }
            _ = &mut events_due, if due.is_some() => {
                shell.flush_task_events().await;
                None
            }
            _ = &mut commit_due, if group_due.is_some() => None,
            released = outbox.released() => {
                shell.send_all(released).await;
                shell.stamps.released(outbox.released_through());
                None
            }
            Some(stored) = snapshots.next() => {
                shell.snapshot_stored(stored);
                None
            }
            else => break,
        };
        shell.emit(&mut outbox, reply, core.take_effects()).await;
        shell.count_offer_rounds(&core);
        shell.commit(&mut outbox, false);
        if let Some(write) = shell.snapshot_if_due(&core) {
            snapshots.push(write);
        }
    }
    shell.drain(&mut outbox).await;
    if let Some(history) = shell.history.take() {
        history.close(DRAIN_TIMEOUT).await;
    }
    shell.refusals.report();
    info!("driver stopping");
    shell.stood_down();
    discovery::stop(inputs.service).await;
    drop((inputs.register, inputs.status, inputs.heartbeat, inputs.api));
    let flushed = flush(client).await.map_err(DriverError::LastMessages);
    if let Some(tenure) = shell.tenure.take() {
        tenure.release().await;
    }
    flushed.map(|()| Ended::Stopped)
}

/// Handles one request of `kind`, timed for the metrics.
fn timed<T>(metrics: &DriverMetrics, kind: RequestKind, handle: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let handled = handle();
    metrics.request(kind, started.elapsed());
    handled
}

/// The driver's subscriptions.
struct Inputs {
    register: Subscriber,
    status: Subscriber,
    heartbeat: Subscriber,
    /// The api's requests, from the service's endpoint.
    api: async_nats::service::endpoint::Endpoint,
    /// The NATS service the api endpoint belongs to (`$SRV`).
    service: async_nats::service::Service,
}

/// Opens the journal and replays it into a new core, then subscribes, and returns once the
/// subscriptions are on their way to the server.
async fn start(
    client: &Client,
    config: &DriverConfig,
) -> Result<(Core, Inputs, Shell), DriverError> {
    let limit = client.server_info().max_payload.max(PAYLOAD_HEADROOM * 2);
    let subjects = config.subjects.clone();
    let journal = Journal::open(
        client,
        &subjects,
        config.journal,
        config.journal_max_age,
        config.replicas,
        config.metrics.journal.clone(),
    )
    .await?;
    let results = match &journal {
        Some(journal) => Some(
            ResultsBucket::open(
                journal.context(),
                &subjects,
                config.results_max_age,
                config.results_max_bytes,
                journal.replicas,
            )
            .await?,
        ),
        None => None,
    };
    if let Some(journal) = &journal {
        history::open(
            journal.context(),
            &subjects,
            config.events_max_age,
            config.events_max_bytes,
            journal.replicas,
        )
        .await?;
    }
    let driver_instance = uuid::Uuid::new_v4();
    let mut tenure = None;
    let mut history_after = None;
    let mut journal = journal;
    if let Some(journal) = journal.as_mut() {
        let lease =
            Lease::open(journal.context(), &subjects, config.lease, journal.replicas).await?;
        let who = Identity {
            subjects: &subjects,
            driver_instance,
            leading: None,
        };
        let standby = discovery::standby(client, who)
            .await
            .map_err(DriverError::Service)?;
        let (unled, unled_seen) = tokio::sync::watch::channel(None);
        let taken = discovery::unavailable_while(
            client,
            &subjects,
            unled_seen,
            lease.acquire(driver_instance, &unled),
        )
        .await;
        discovery::stop(standby).await;
        let mark = JournalRecord::Leader {
            epoch: taken.epoch(),
            driver_instance,
            time_ms: now_ms(),
        };
        journal
            .lead(taken.guard().clone(), mark, config.replay_timeout)
            .await?;
        tenure = Some(taken);
        // Read before the journal: what the history holds up to there is all it will ever
        // hold of the predecessors' events, but for what this leader tells again.
        history_after = match history::last_stamp(journal.context(), &subjects).await {
            Ok(stamp) => stamp.map(|stamp| stamp.done),
            Err(error) => {
                warn!(%error, "the event history's end could not be read; events the last \
                      leader had not stored will not be told again");
                None
            }
        };
    }
    let epoch = tenure.as_ref().map_or(0, Tenure::epoch);
    let term = journal.as_ref().and_then(Journal::mark).unwrap_or(0);
    let new_core = || {
        let mut core = Core::new(CoreConfig {
            driver_instance,
            epoch,
            term,
            expect_executors: config.expect_executors,
            max_reply_bytes: limit - PAYLOAD_HEADROOM,
            journal: journal.is_some(),
            retention: config.retention,
            results_bucket: results.is_some(),
        });
        core.set_liveness(config.liveness.clone());
        core.set_scheduling(config.scheduling.clone());
        if let Some(allocation) = &config.allocation {
            core.set_allocation(allocation.clone());
        }
        if let Some(gate) = &config.start_gate {
            core.set_start_gate(gate.clone(), now_ms());
        }
        if let Some(exclusion) = &config.exclusion {
            core.set_exclusion(exclusion.clone());
        }
        core
    };
    let mut schedule = None;
    let mut fill = None;
    let core = match &journal {
        None => new_core(),
        Some(journal) => {
            let Replayed {
                core,
                restored,
                bytes,
                tail,
            } = journal
                .replay(new_core, limit, config.replay_timeout, history_after)
                .await?;
            info!(
                jobs = restored.jobs,
                running_jobs = restored.running_jobs,
                pending_tasks = restored.pending_tasks,
                bytes,
                "journal replayed"
            );
            if restored.incomplete_snapshot {
                warn!("the journal ends in a snapshot that was not finished; the records before it were used");
            }
            schedule = Some(Schedule::new(
                bytes,
                config.snapshot_after,
                config.journal_max_age,
            ));
            fill = history_after.and_then(|after| retell(&core, after, tail, &subjects, limit));
            core
        }
    };
    let api_counts = Arc::new(ApiCounts::default());
    let who = Identity {
        subjects: &subjects,
        driver_instance,
        leading: Some(tenure.as_ref().map_or(0, Tenure::epoch)),
    };
    let (service, api) = discovery::leading(client, who, api_counts.clone())
        .await
        .map_err(DriverError::Service)?;
    let inputs = Inputs {
        register: subscribe(client, subjects.register_all()).await?,
        status: subscribe(client, subjects.status_all()).await?,
        heartbeat: subscribe(client, subjects.heartbeat_all()).await?,
        api,
        service,
    };
    flush(client).await.map_err(DriverError::NotSubscribed)?;
    let history = tenure.as_ref().map(|tenure| {
        let guard = tenure.guard().clone();
        History::start(
            client,
            history::Writer {
                guard,
                driver_instance,
            },
            fill,
        )
    });
    let stamps = Stamps::new(journal.as_ref().and_then(Journal::mark).unwrap_or(0));
    let shell = Shell {
        history,
        stamps,
        headers: tenure
            .as_ref()
            .and_then(|t| crate::epoch::headers(t.epoch())),
        tenure,
        client: client.clone(),
        subjects,
        limit,
        task_events: TaskEvents::default(),
        refusals: Refusals::default(),
        api_counts,
        metrics: config.metrics.clone(),
        web: config.web.clone(),
        journal,
        schedule,
        results,
        ticked: false,
        offer_rounds: 0,
    };
    Ok((core, inputs, shell))
}

/// What a new leader tells again for the event history, if anything: the events of the
/// journal's `tail`, the records after the history's last complete write `after`.
fn retell(core: &Core, after: u64, tail: Tail, subjects: &Subjects, limit: usize) -> Option<Fill> {
    if tail.too_long {
        warn!("the event history is too far behind the journal to tell its events again");
        return None;
    }
    if tail.purged {
        warn!(
            "the journal was purged past the event history's end (a snapshot was taken); \
               events the last leader had not stored before it will not be told again"
        );
    }
    let events = core.retell(&tail.records);
    (!events.is_empty()).then(|| Fill {
        after,
        events,
        subjects: subjects.clone(),
        max_bytes: limit - PAYLOAD_HEADROOM,
    })
}

/// Why an api request's reply subject was refused.
enum ForeignApiReply {
    /// The reply subject is one of Ember's own.
    Ember,
    /// The reply subject lies under this registered executor's inbox.
    ExecutorInbox(crate::ids::ExecutorId),
}

impl ForeignApiReply {
    fn why(&self) -> &'static str {
        match self {
            ForeignApiReply::Ember => "the reply subject is one of Ember's",
            ForeignApiReply::ExecutorInbox(_) => {
                "the reply subject is under a registered executor's inbox"
            }
        }
    }
}

/// An api answer may go to any inbox but an executor's, and never into Ember's own subjects:
/// NATS lets a requester point the reply anywhere the driver may publish, such as an
/// executor's inbox.
fn api_reply_allowed(reply: &str, core: &Core) -> Result<(), ForeignApiReply> {
    if reply.starts_with("ember.") {
        return Err(ForeignApiReply::Ember);
    }
    let owner = reply
        .strip_prefix("_INBOX.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|token| crate::ids::ExecutorId::parse(token).ok())
        .filter(|id| core.executors().contains_key(id));
    match owner {
        Some(id) => Err(ForeignApiReply::ExecutorInbox(id)),
        None => Ok(()),
    }
}

async fn subscribe(client: &Client, subject: String) -> Result<Subscriber, DriverError> {
    client
        .subscribe(subject.clone())
        .await
        .map_err(|source| DriverError::Subscribe { subject, source })
}

/// What storing a snapshot came to.
type Snapshotted = Result<Stored, String>;

/// `message` encoded, cut in halves until each part is at most `max_bytes`, in order; a part
/// that cannot be cut and does not fit is dropped with a warning naming `subject`.
pub(super) fn fit<T: Batch + Serialize>(
    message: T,
    max_bytes: usize,
    subject: &str,
) -> Vec<bytes::Bytes> {
    let mut parts = vec![message];
    let mut fitted = Vec::new();
    while let Some(part) = parts.pop() {
        let payload = encode(&part);
        if payload.len() <= max_bytes {
            fitted.push(payload);
            continue;
        }
        match part.split() {
            // Second half pushed first: parts go out in order.
            Ok((first, second)) => parts.extend([second, first]),
            Err(_) => warn!(%subject, size = payload.len(), "message over max_payload dropped"),
        }
    }
    fitted
}

/// The thin NATS layer around the core: decoding, reply checks, sending.
struct Shell {
    /// This driver's leadership, with a journal: nothing is sent once it is lost.
    tenure: Option<Tenure>,
    /// What everything sent carries: the leadership's epoch.
    headers: Option<async_nats::HeaderMap>,
    client: Client,
    subjects: Subjects,
    /// The server's max_payload: the largest message anyone can send us.
    limit: usize,
    task_events: TaskEvents,
    refusals: Refusals,
    /// What the api endpoint counts for `$SRV.STATS`.
    api_counts: Arc<ApiCounts>,
    metrics: Arc<DriverMetrics>,
    /// The live web page's link, with `--http`.
    web: Option<crate::web::Link>,
    /// Where the core's journal records are stored, if anywhere.
    journal: Option<Journal>,
    /// When the journal is next snapshotted, with a journal.
    schedule: Option<Schedule>,
    /// Where results are stored, with a journal.
    results: Option<ResultsBucket>,
    /// What stores the events in the cluster's events stream, with a journal.
    history: Option<History>,
    /// Where the events handed to `history` stand against the journal.
    stamps: Stamps,
    /// Whether a revive tick came since the last look at the snapshot's age.
    ticked: bool,
    /// The core's offer rounds already counted in the metrics.
    offer_rounds: u64,
}

/// Requests the driver refused or dropped before the core saw them, counted; the counts go to
/// the log (one line when they change, at most once per revive tick) rather than a line per
/// message, which a flood could turn into a flood of log lines.
#[derive(Default)]
struct Refusals {
    no_reply: AtomicU64,
    foreign_reply: AtomicU64,
    undecodable: AtomicU64,
    reported: AtomicU64,
    /// Whether an api request from an executor's inbox has been logged at warn (the first is).
    executor_inbox_said: AtomicBool,
}

impl Refusals {
    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    /// Logs the counts if they changed since the last report.
    fn report(&self) {
        let (no_reply, foreign, undecodable) = (
            self.no_reply.load(Relaxed),
            self.foreign_reply.load(Relaxed),
            self.undecodable.load(Relaxed),
        );
        let total = no_reply + foreign + undecodable;
        if total != self.reported.swap(total, Relaxed) {
            warn!(
                no_reply,
                foreign_reply = foreign,
                undecodable,
                "requests refused so far"
            );
        }
    }
}

/// Why a request was refused before the core saw it.
#[derive(Clone, Copy)]
enum Refusal {
    NoReply,
    ForeignReply,
    Undecodable,
}

impl Shell {
    /// This driver no longer leads: the metrics and the web page say so.
    fn stood_down(&self) {
        self.metrics.stood_down();
        if let Some(web) = &self.web {
            web.standing_by();
        }
    }

    /// Counts a request refused for `why`, for the log and the metrics.
    fn refuse(&self, why: Refusal) {
        let (counter, reason) = match why {
            Refusal::NoReply => (&self.refusals.no_reply, "no_reply"),
            Refusal::ForeignReply => (&self.refusals.foreign_reply, "foreign_reply"),
            Refusal::Undecodable => (&self.refusals.undecodable, "undecodable"),
        };
        Refusals::count(counter);
        self.metrics.refused(reason);
    }

    /// Counts the offer rounds the core made since the last count.
    fn count_offer_rounds(&mut self, core: &Core) {
        let rounds = core.offer_rounds();
        if rounds > self.offer_rounds {
            self.metrics.offer_rounds.inc_by(rounds - self.offer_rounds);
            self.offer_rounds = rounds;
        }
    }

    /// Counts what an event says was launched or ended.
    fn count(&self, event: &Event) {
        match event {
            Event::TaskStart { executors, .. } => {
                let launched: usize = executors.iter().map(|e| e.tasks.len()).sum();
                self.metrics.tasks_launched.inc_by(launched as u64);
            }
            Event::TaskEnd { .. } => {
                for (_, end) in event.ended() {
                    self.metrics.ended(end.state);
                }
            }
            _ => {}
        }
    }

    fn on_register(&self, core: &mut Core, message: Message) -> Option<Output> {
        let claimed = Subjects::executor_id_of(&message.subject).to_string();
        let reply = self.executor_reply(&message, &claimed)?;
        let answer = match decode::<RegisterRequest>(&message.payload, self.limit) {
            Ok(RegisterRequest::RegisterExecutor(request)) => {
                core.register(&claimed, request, now_ms())
            }
            Err(error) => {
                self.refuse(Refusal::Undecodable);
                RegisterReply::RegisterExecutorFailed {
                    message: format!("could not decode RegisterExecutor: {error}"),
                }
            }
        };
        match &answer {
            RegisterReply::RegisteredExecutor { .. } => debug!(executor = %claimed, "registered"),
            RegisterReply::RegisterExecutorFailed { message } => {
                warn!(executor = %claimed, %message, "registration refused")
            }
        }
        Some(Output::ExecutorReply(reply, encode(&answer)))
    }

    fn on_status(&self, core: &mut Core, message: Message) -> Option<Output> {
        let claimed = Subjects::executor_id_of(&message.subject).to_string();
        let reply = self.executor_reply(&message, &claimed)?;
        let (executor_id, mut answer) = match decode::<StatusRequest>(&message.payload, self.limit)
        {
            Ok(request) => {
                let StatusRequest::StatusUpdates {
                    executor_id,
                    updates,
                    ..
                } = &request;
                self.metrics.status_batch(updates.len());
                let executor_id = executor_id.clone();
                let answer = core.status_request(&claimed, request, now_ms());
                (Some(executor_id), answer)
            }
            Err(error) => {
                self.refuse(Refusal::Undecodable);
                let message = format!("could not decode StatusUpdates: {error}");
                (None, StatusReply::Error { message })
            }
        };
        if let StatusReply::StatusAck { refused, .. } = &answer {
            for r in refused {
                warn!(executor = %claimed, task = r.task_id, attempt = r.attempt, reason = %r.reason, "status refused");
            }
        }
        let mut payload = encode(&answer);
        if payload.len() > self.limit - PAYLOAD_HEADROOM {
            if let (StatusReply::StatusAck { launch, .. }, Some(executor_id)) =
                (&mut answer, executor_id)
            {
                // Too many tasks to ride on the acknowledgement: they go to the inbox instead.
                core.launch_separately(executor_id, std::mem::take(launch));
                payload = encode(&answer);
            }
        }
        Some(Output::ExecutorReply(reply, payload))
    }

    fn on_heartbeat(&self, core: &mut Core, message: Message) -> Option<Output> {
        let claimed = Subjects::executor_id_of(&message.subject).to_string();
        let reply = self.executor_reply(&message, &claimed)?;
        let answer = match decode::<HeartbeatRequest>(&message.payload, self.limit) {
            Ok(request) => core.heartbeat(&claimed, request, now_ms()),
            Err(error) => {
                self.refuse(Refusal::Undecodable);
                HeartbeatReply::Error {
                    message: format!("could not decode the heartbeat: {error}"),
                }
            }
        };
        Some(Output::ExecutorReply(reply, encode(&answer)))
    }

    fn on_api(&self, core: &mut Core, request: async_nats::service::Request) -> Option<Output> {
        let message = &request.message;
        let Some(reply) = message.reply.clone() else {
            debug!("api message without a reply subject dropped");
            self.refuse(Refusal::NoReply);
            Refusals::count(&self.api_counts.no_reply);
            return None;
        };
        if let Err(why) = api_reply_allowed(&reply, core) {
            match &why {
                // Most likely a program that uses its executor's connection for the api too:
                // said once, plainly, since that program waits for an answer that never comes.
                ForeignApiReply::ExecutorInbox(executor)
                    if !self.refusals.executor_inbox_said.swap(true, Relaxed) =>
                {
                    warn!(
                        %executor,
                        reply = %reply,
                        "api request dropped without an answer: its reply lies under executor \
                         {executor}'s inbox, where the driver answers no api request (a program \
                         running an executor opens a second connection, with client credentials, \
                         for the api); later ones are counted as foreign_reply"
                    )
                }
                _ => debug!(reply = %reply, why = why.why(), "api request refused"),
            }
            self.refuse(Refusal::ForeignReply);
            Refusals::count(&self.api_counts.foreign_reply);
            return None;
        }
        let answer = match decode::<ApiRequest>(&message.payload, self.limit) {
            Ok(request) => core.api(request, now_ms()),
            Err(error) => {
                self.refuse(Refusal::Undecodable);
                ApiReply::Error {
                    message: format!("could not decode the api request: {error}"),
                }
            }
        };
        if matches!(answer, ApiReply::Error { .. }) {
            Refusals::count(&self.api_counts.errors);
        }
        let reply: ReplyTo = Box::new(request);
        if let (
            ApiReply::ResultChunk {
                job_id,
                index,
                chunk,
                ..
            },
            Some(_),
        ) = (&answer, &self.results)
        {
            if let Some(key) = core.result_chunk_key(*job_id, *index, *chunk) {
                return Some(Output::Chunk { reply, answer, key });
            }
        }
        if let (ApiReply::Results(page), Some(_)) = (&answer, &self.results) {
            let indices = core.results_in_bucket(page);
            if !indices.is_empty() {
                let ApiReply::Results(page) = answer else {
                    unreachable!("matched above")
                };
                return Some(Output::Results {
                    reply,
                    page,
                    indices,
                });
            }
        }
        Some(Output::Reply(reply, encode(&answer)))
    }

    /// The reply subject of a request on an executor's subject, if it is that executor's own.
    /// NATS does not check where a requester points its reply, so a request that would have the
    /// driver answer into someone else's inbox gets no answer at all.
    fn executor_reply(&self, message: &Message, claimed: &str) -> Option<Subject> {
        let Some(reply) = &message.reply else {
            debug!(subject = %message.subject, "request without a reply subject dropped");
            self.refuse(Refusal::NoReply);
            return None;
        };
        if !Subjects::reply_is_owned_by(reply, claimed) {
            debug!(subject = %message.subject, reply = %reply, "reply subject outside the sender's inbox; refused");
            self.refuse(Refusal::ForeignReply);
            return None;
        }
        Some(reply.clone())
    }

    /// Reads `indices` of `page` from the results bucket and answers with the page, off the
    /// actor's loop: the reads take round trips, and need nothing of the core.
    fn answer_with_results(&self, reply: ReplyTo, page: ResultsPage, indices: Vec<u32>) {
        if let Some(results) = self.results.clone() {
            let max_bytes = self.limit - PAYLOAD_HEADROOM;
            self.answer_off_loop(reply, async move {
                results.fill(page, indices, max_bytes).await
            });
        }
    }

    /// Reads a result's chunk from the results bucket and answers with it, off the actor's
    /// loop as [`Shell::answer_with_results`] does.
    fn answer_with_chunk(&self, reply: ReplyTo, answer: ApiReply, key: String) {
        if let Some(results) = self.results.clone() {
            self.answer_off_loop(reply, async move { results.fill_chunk(answer, key).await });
        }
    }

    /// Sends what `reply` comes to, from a task of its own.
    fn answer_off_loop(&self, to: ReplyTo, reply: impl Future<Output = ApiReply> + Send + 'static) {
        let (guard, headers) = (self.guard().cloned(), self.headers.clone());
        tokio::spawn(async move {
            let payload = encode(&reply.await);
            answer(guard.as_ref(), headers.as_ref(), to, payload).await;
        });
    }

    /// Whether this driver still leads, when it has a lease.
    fn guard(&self) -> Option<&Guard> {
        self.tenure.as_ref().map(Tenure::guard)
    }

    /// Sends what one step produced: its journal records join the group gathering for the
    /// journal, its results go to the bucket, and its answer and effects leave in order, or
    /// wait behind the writes before them (see the outbox for what need not wait).
    async fn emit(&mut self, outbox: &mut Outbox, reply: Option<Output>, effects: Vec<Effect>) {
        let (writes, effects): (Vec<_>, Vec<_>) = effects.into_iter().partition(Effect::is_write);
        for effect in writes {
            match effect {
                Effect::Journal(record) => self.write(outbox, record),
                Effect::StoreResult {
                    job_id,
                    index,
                    result,
                } => {
                    if let (Some(results), Some(journal)) = (&self.results, &self.journal) {
                        let put = results.put(job_id, index, encode(&result));
                        outbox.write(put, |group| journal.store(group));
                    }
                }
                _ => {}
            }
        }
        for output in reply
            .into_iter()
            .chain(effects.into_iter().map(Output::Effect))
        {
            // Counted as the core decides, so a scrape's counters and gauges agree even while
            // the events wait for the journal.
            if let Output::Effect(Effect::Publish(event)) = &output {
                self.count(event);
            }
            if outbox.may_send(&output) {
                self.send(output).await;
            } else {
                outbox.hold(output);
            }
        }
    }

    /// Adds `record` to the group gathering for the journal, in parts that each fit in one
    /// message.
    fn write(&mut self, outbox: &mut Outbox, record: JournalRecord) {
        let Some(journal) = &self.journal else {
            return;
        };
        let max_bytes = self.limit - PAYLOAD_HEADROOM;
        // Task ends may wait a little for company; what a client waits for goes at once.
        let urgent = !matches!(record, JournalRecord::TasksEnded { .. });
        for part in fit(record, max_bytes, "journal") {
            if let Some(schedule) = self.schedule.as_mut() {
                schedule.wrote(part.len());
            }
            outbox.record(&part, urgent, max_bytes, |group| journal.store(group));
        }
    }

    /// Writes the group gathering for the journal if no write is in flight before it, or
    /// at once if `now`.
    fn commit(&self, outbox: &mut Outbox, now: bool) {
        let Some(journal) = &self.journal else {
            return;
        };
        let store = |group| journal.store(group);
        if now {
            outbox.seal(store);
        } else {
            outbox.commit(store);
        }
    }

    async fn send_all(&mut self, outputs: Vec<Output>) {
        for output in outputs {
            self.send(output).await;
        }
    }

    async fn send(&mut self, output: Output) {
        match output {
            Output::Reply(to, payload) => {
                let (guard, headers) = (self.guard(), self.headers.as_ref());
                answer(guard, headers, to, payload).await
            }
            Output::ExecutorReply(reply, payload) => self.publish(reply, payload).await,
            Output::Effect(Effect::Publish(event)) => {
                if let Some(event) = self.task_events.absorb(event) {
                    // Any other event follows the task events before it.
                    self.flush_task_events().await;
                    self.publish_event(event, self.stamps.now()).await;
                } else {
                    self.stamps.waits();
                    if self.task_events.is_full() {
                        self.flush_task_events().await;
                    }
                }
            }
            Output::Effect(Effect::Send { to, message }) => {
                let subject = self.subjects.executor_inbox(&to).into();
                self.publish_batch(subject, message).await;
            }
            Output::Results {
                reply,
                page,
                indices,
            } => self.answer_with_results(reply, page, indices),
            Output::Chunk { reply, answer, key } => self.answer_with_chunk(reply, answer, key),
            // `emit` hands writes to the journal and the bucket; none reaches here.
            Output::Effect(Effect::Journal(_) | Effect::StoreResult { .. }) => {}
        }
    }

    /// Sends what waits for the last journal writes (for up to `DRAIN_TIMEOUT`), and the
    /// task events that wait for company.
    async fn drain(&mut self, outbox: &mut Outbox) {
        self.commit(outbox, true);
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while !outbox.is_clear() {
                let released = outbox.released().await;
                self.send_all(released).await;
                self.stamps.released(outbox.released_through());
            }
        })
        .await;
        if drained.is_err() {
            warn!("journal writes still unacknowledged at shutdown; what waits on them is dropped");
        }
        self.flush_task_events().await;
    }

    async fn flush_task_events(&mut self) {
        let stamp = self.stamps.of_waiting();
        for event in self.task_events.take() {
            self.publish_event(event, stamp).await;
        }
    }

    /// Publishes an event on its plain subject and, with a journal while this driver leads,
    /// hands it to the events stream's writer to store under its history subject.
    async fn publish_event(&self, event: Event, stamp: Stamp) {
        let current = self.guard().map_or(true, Guard::is_current);
        if let (Some(web), true) = (&self.web, current) {
            web.published(&event);
        }
        let subject: Subject = self.subjects.event(event.kind()).into();
        let Some(history) = self.history.as_ref().filter(|_| current) else {
            return self.publish_batch(subject, event).await;
        };
        let stored: Subject = self.subjects.history(event.kind()).into();
        for payload in self.fit(event, &subject) {
            self.publish(subject.clone(), payload.clone()).await;
            history.publish(stored.clone(), payload, stamp).await;
        }
    }

    /// Publishes a batch, cut in halves until each part fits in one message.
    async fn publish_batch<T: Batch + Serialize>(&self, subject: Subject, message: T) {
        for payload in self.fit(message, &subject) {
            self.publish(subject.clone(), payload).await;
        }
    }

    fn fit<T: Batch + Serialize>(&self, message: T, subject: &str) -> Vec<bytes::Bytes> {
        fit(message, self.limit - PAYLOAD_HEADROOM, subject)
    }

    /// Takes a snapshot if one is due, and returns the write that stores it.
    fn snapshot_if_due(&mut self, core: &Core) -> Option<BoxFuture<'static, Snapshotted>> {
        let (journal, schedule) = (self.journal.as_ref()?, self.schedule.as_mut()?);
        // The clock only when the journal has grown enough, or once a revive tick (for the
        // snapshot's age): not on every step of the hot loop.
        if !schedule.grown_enough() && !std::mem::take(&mut self.ticked) {
            return None;
        }
        let now = tokio::time::Instant::now();
        if !schedule.due(now) {
            return None;
        }
        schedule.started(now);
        // Encoded as the core hands the records over, so they are never all held at once.
        let mut encoded = Encoded::new(self.limit - PAYLOAD_HEADROOM);
        let ids = core.snapshot_each(|record| encoded.add(record));
        let id = uuid::Uuid::new_v4();
        let parts = encoded.pack(id, now_ms(), ids);
        debug!(snapshot = %id, parts = parts.len(), "snapshot taken");
        Some(journal.start_snapshot(parts))
    }

    fn snapshot_stored(&mut self, stored: Snapshotted) {
        let now = tokio::time::Instant::now();
        match &stored {
            Ok(s) => info!(
                parts = s.parts,
                bytes = s.bytes,
                purged = s.purged,
                "snapshot stored; the journal before it purged"
            ),
            Err(error) => warn!(%error, "snapshot not stored; the journal keeps what it had"),
        }
        if let Some(schedule) = self.schedule.as_mut() {
            schedule.finished(stored.as_ref().ok(), now);
        }
    }

    async fn publish(&self, subject: Subject, payload: bytes::Bytes) {
        send(
            &self.client,
            self.guard(),
            self.headers.as_ref(),
            subject,
            payload,
        )
        .await
    }
}

/// Sends a client's answer as [`send`] does, through the service endpoint it came from.
async fn answer(
    guard: Option<&Guard>,
    headers: Option<&async_nats::HeaderMap>,
    to: ReplyTo,
    payload: bytes::Bytes,
) {
    if !guard.map_or(true, Guard::is_current) {
        return;
    }
    let headers = headers.cloned().unwrap_or_default();
    if let Err(error) = to.respond_with_headers(Ok(payload), headers).await {
        warn!(%error, "could not answer an api request");
    }
}

/// Sends one message with the leadership's epoch, if this driver may still send: it leads, or
/// runs alone without a journal (and so without a lease).
async fn send(
    client: &Client,
    guard: Option<&Guard>,
    headers: Option<&async_nats::HeaderMap>,
    subject: Subject,
    payload: bytes::Bytes,
) {
    if !guard.map_or(true, Guard::is_current) {
        return;
    }
    let sent = match headers {
        Some(headers) => {
            client
                .publish_with_headers(subject, headers.clone(), payload)
                .await
        }
        None => client.publish(subject, payload).await,
    };
    if let Err(error) = sent {
        warn!(%error, "could not publish");
    }
}
