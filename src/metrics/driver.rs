//! The driver's metrics: counters as things happen, and gauges set from the core when a scrape
//! asks. While the driver leads, its actor answers a scrape between two of its steps: it sets
//! the gauges and encodes everything then, so the gauges and the counters the actor keeps
//! (tasks launched and ended, offer rounds, requests) are of one moment.

use super::{label, seconds_histogram, sizes_histogram, HistogramFamily, Labels, Scrape};
pub use crate::driver::core::Gauges as CoreGauges;
use crate::protocol::TaskState;
use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How long a scrape waits for a busy actor before it serves the metrics as they are.
const SCRAPE_WAIT: Duration = Duration::from_secs(1);

/// A scrape's request to the actor: the metrics' text, encoded once the gauges are set.
pub type ScrapeRequest = oneshot::Sender<String>;

/// What a driver counts, shared by the actor and the metrics server.
#[derive(Debug)]
pub struct DriverMetrics {
    registry: Registry,
    pub leader: Gauge,
    pub epoch: Gauge,
    pub executors: Gauge,
    pub executors_target: Gauge,
    cores: Family<Labels, Gauge>,
    jobs: Family<Labels, Gauge>,
    pub tasks_waiting: Gauge,
    pub tasks_running: Gauge,
    pub tasks_launched: Counter,
    tasks_ended: Family<Labels, Counter>,
    /// The series of `tasks_ended` of each end state, in [`END_STATES`]' order.
    ended: [Counter; 4],
    requests: HistogramFamily,
    /// The request histogram of each kind, looked up once rather than on every request.
    by_kind: [Histogram; 5],
    status_batch: Histogram,
    refused: Family<Labels, Counter>,
    /// Offer rounds made while tasks waited.
    pub offer_rounds: Counter,
    /// The journal's writes: how long each took to be stored, and how often one was retried.
    pub journal: JournalWrites,
    /// Slow-consumer events of the driver's NATS connection.
    pub slow_consumers: Counter,
    /// The object store as the leader's last sweep found it, and what its sweeps deleted.
    pub objects: ObjectGauges,
    /// Where a scrape asks the leading actor for the metrics, if a driver leads.
    actor: Mutex<Option<mpsc::Sender<ScrapeRequest>>>,
}

/// The object store, as the leader's sweeps see it.
#[derive(Debug, Default, Clone)]
pub struct ObjectGauges {
    pub objects: Gauge,
    pub bytes: Gauge,
    pub deleted: Counter,
}

/// The terminal states of an attempt, as their labels; [`end_index`] finds a state's place.
pub(super) const END_STATES: [&str; 4] = ["finished", "failed", "killed", "lost"];

/// Where `state` is in [`END_STATES`]; none for a state that is not an end.
pub(super) fn end_index(state: TaskState) -> Option<usize> {
    match state {
        TaskState::Finished => Some(0),
        TaskState::Failed => Some(1),
        TaskState::Killed => Some(2),
        TaskState::Lost => Some(3),
        TaskState::Launching | TaskState::Running => None,
    }
}

/// The journal's writes, counted by the tasks that store them: cheap to clone (it shares
/// what it counts).
#[derive(Debug, Clone)]
pub struct JournalWrites {
    duration: Histogram,
    retries: Counter,
}

impl Default for JournalWrites {
    fn default() -> Self {
        Self {
            duration: seconds_histogram(),
            retries: Counter::default(),
        }
    }
}

impl JournalWrites {
    /// A write stored `took` after it started.
    pub fn stored(&self, took: Duration) {
        self.duration.observe(took.as_secs_f64());
    }

    /// A write failed and is tried again.
    pub fn retried(&self) {
        self.retries.inc();
    }
}

/// A kind of request the driver handles.
#[derive(Debug, Clone, Copy)]
pub enum RequestKind {
    Register,
    Status,
    Heartbeat,
    Api,
    /// An executor's read of the results its task reads.
    Results,
}

impl RequestKind {
    const ALL: [RequestKind; 5] = [
        RequestKind::Register,
        RequestKind::Status,
        RequestKind::Heartbeat,
        RequestKind::Api,
        RequestKind::Results,
    ];

    fn label(self) -> &'static str {
        match self {
            RequestKind::Register => "register",
            RequestKind::Status => "status",
            RequestKind::Heartbeat => "heartbeat",
            RequestKind::Api => "api",
            RequestKind::Results => "results",
        }
    }
}

impl Default for DriverMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl DriverMetrics {
    pub fn new() -> Self {
        let tasks_ended = Family::<Labels, Counter>::default();
        let requests = HistogramFamily::new_with_constructor(seconds_histogram);
        let mut metrics = Self {
            leader: Gauge::default(),
            epoch: Gauge::default(),
            executors: Gauge::default(),
            executors_target: Gauge::default(),
            cores: Family::default(),
            jobs: Family::default(),
            tasks_waiting: Gauge::default(),
            tasks_running: Gauge::default(),
            tasks_launched: Counter::default(),
            ended: END_STATES.map(|state| tasks_ended.get_or_create_owned(&label("state", state))),
            tasks_ended,
            by_kind: RequestKind::ALL
                .map(|kind| requests.get_or_create_owned(&label("kind", kind.label()))),
            requests,
            status_batch: sizes_histogram(),
            refused: Family::default(),
            offer_rounds: Counter::default(),
            journal: JournalWrites::default(),
            slow_consumers: Counter::default(),
            objects: ObjectGauges::default(),
            actor: Mutex::new(None),
            registry: Registry::with_prefix("ember_driver"),
        };
        metrics.register_gauges();
        metrics.register_counters();
        metrics
    }

    fn register_gauges(&mut self) {
        let r = &mut self.registry;
        r.register(
            "leader",
            "1 while this driver leads its cluster",
            self.leader.clone(),
        );
        r.register(
            "epoch",
            "The epoch of this driver's leadership (0 without a lease)",
            self.epoch.clone(),
        );
        r.register("executors", "Executors registered", self.executors.clone());
        r.register(
            "executors_target",
            "Executors the dynamic allocation signal asks for (0 when it is off)",
            self.executors_target.clone(),
        );
        r.register(
            "cores",
            "Cores of the registered executors, by state (total, free)",
            self.cores.clone(),
        );
        r.register(
            "jobs",
            "Jobs the driver holds (running, and finished ones retained), by state",
            self.jobs.clone(),
        );
        r.register(
            "tasks_waiting",
            "Tasks waiting for a core",
            self.tasks_waiting.clone(),
        );
        r.register(
            "tasks_running",
            "Attempts running on executors",
            self.tasks_running.clone(),
        );
    }

    fn register_counters(&mut self) {
        let r = &mut self.registry;
        r.register(
            "tasks_launched",
            "Attempts launched",
            self.tasks_launched.clone(),
        );
        r.register(
            "tasks_ended",
            "Attempts ended, by state (finished, failed, killed, lost)",
            self.tasks_ended.clone(),
        );
        r.register_with_unit(
            "request_duration",
            "Time the driver spent handling a request (decode, core, encode), by kind (register, status, heartbeat, api)",
            Unit::Seconds,
            self.requests.clone(),
        );
        r.register(
            "status_batch_updates",
            "Status updates per status batch",
            self.status_batch.clone(),
        );
        r.register(
            "refused_requests",
            "Requests dropped or refused before the core saw them, by reason (no_reply, foreign_reply, undecodable)",
            self.refused.clone(),
        );
        r.register(
            "offer_rounds",
            "Offer rounds made while tasks waited: free cores offered to waiting tasks",
            self.offer_rounds.clone(),
        );
        r.register_with_unit(
            "journal_write_duration",
            "Time from a journal write's start to its acknowledgement by JetStream, its retries and its wait for the writes before it included",
            Unit::Seconds,
            self.journal.duration.clone(),
        );
        r.register(
            "journal_write_retries",
            "Journal writes that failed and were tried again",
            self.journal.retries.clone(),
        );
        r.register(
            "objects",
            "Objects in the cluster's object store, as the leader's last sweep found them",
            self.objects.objects.clone(),
        );
        r.register_with_unit(
            "objects",
            "Bytes of the objects in the cluster's object store, as the leader's last sweep found them",
            Unit::Bytes,
            self.objects.bytes.clone(),
        );
        r.register(
            "objects_deleted",
            "Objects the leader's sweeps deleted (no kept job used them for --objects-max-age), and orphan chunks of puts that died",
            self.objects.deleted.clone(),
        );
        r.register(
            "slow_consumers",
            "Slow-consumer events of the driver's NATS connection: each is a message the client dropped because a subscription's queue was full",
            self.slow_consumers.clone(),
        );
    }

    /// Sets the gauges from what the core holds now.
    pub fn set_core(&self, g: CoreGauges) {
        let set = |gauge: &Gauge, value: u64| {
            gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
        };
        set(&self.executors, g.executors);
        set(&self.executors_target, g.executors_target);
        set(
            &self.cores.get_or_create(&label("state", "total")),
            g.total_cores,
        );
        set(
            &self.cores.get_or_create(&label("state", "free")),
            g.free_cores,
        );
        set(&self.tasks_waiting, g.tasks_waiting);
        set(&self.tasks_running, g.tasks_running);
        for (state, value) in [
            ("waiting", g.jobs_waiting),
            ("running", g.jobs_running),
            ("succeeded", g.jobs_succeeded),
            ("failed", g.jobs_failed),
            ("killed", g.jobs_killed),
        ] {
            set(&self.jobs.get_or_create(&label("state", state)), value);
        }
    }

    /// The scrapes of a driver that starts to lead: its actor answers each with
    /// [`DriverMetrics::answer`] until it drops them.
    pub fn scrapes(&self) -> mpsc::Receiver<ScrapeRequest> {
        let (requests, scrapes) = mpsc::channel(4);
        if let Ok(mut actor) = self.actor.lock() {
            *actor = Some(requests);
        }
        scrapes
    }

    /// Answers a scrape with the metrics as they are now, gauges set from `gauges`.
    pub fn answer(&self, scrape: ScrapeRequest, gauges: CoreGauges) {
        self.set_core(gauges);
        let _ = scrape.send(self.encode());
    }

    /// The driver no longer leads: it holds nothing, so its gauges say so (the counters keep
    /// what it counted).
    pub fn stood_down(&self) {
        if let Ok(mut actor) = self.actor.lock() {
            *actor = None;
        }
        self.leader.set(0);
        self.epoch.set(0);
        self.set_core(CoreGauges::default());
    }

    /// Counts an attempt ended in `state`; a state that is not an end is not counted.
    pub fn ended(&self, state: TaskState) {
        if let Some(i) = end_index(state) {
            self.ended[i].inc();
        }
    }

    /// One request of `kind` handled in `took`.
    pub fn request(&self, kind: RequestKind, took: Duration) {
        self.by_kind[kind as usize].observe(took.as_secs_f64());
    }

    pub fn status_batch(&self, updates: usize) {
        self.status_batch.observe(updates as f64);
    }

    /// One request dropped or refused for `reason`.
    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&label("reason", reason)).inc();
    }
}

impl Scrape for DriverMetrics {
    fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Asks the leading actor, if any, for the metrics of one moment; as they are if none
    /// answers within `SCRAPE_WAIT` (a standby's gauges are 0 and stay so).
    fn scrape(&self) -> BoxFuture<'_, String> {
        let actor = self.actor.lock().ok().and_then(|actor| actor.clone());
        Box::pin(async move {
            if let Some(actor) = actor {
                let asked = async {
                    let (request, answer) = oneshot::channel();
                    actor.send(request).await.ok()?;
                    answer.await.ok()
                };
                // Both the queue of scrapes and the answer wait for the actor.
                if let Ok(Some(text)) = tokio::time::timeout(SCRAPE_WAIT, asked).await {
                    return text;
                }
            }
            self.encode()
        })
    }
}
