//! How a driver runs: every setting of [`run`](super::run), with the defaults `ember-driver`
//! has.

use super::core::{AllocationConfig, ExclusionConfig, Liveness, Retention, Scheduling, StartGate};
use super::journal::{JournalMode, Replicas};
use crate::metrics::DriverMetrics;
use crate::subjects::Subjects;
use std::sync::Arc;
use std::time::Duration;

/// Executors a driver expects to register unless told: none (Spark's `numPendingExecutors`
/// starts at 0).
pub const DEFAULT_EXPECT_EXECUTORS: u64 = 0;

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
    pub scheduling: Scheduling,
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
    /// The most bytes the object store holds (with a journal); 0: no limit of its own.
    pub objects_max_bytes: u64,
    /// How long an object outlives its put and the last kept job that used it.
    pub objects_max_age: Duration,
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
    /// How long after a server's advisory that an executor's connection closed the leader
    /// removes it (unless it named a new connection meanwhile); none ignores the advisories
    /// (`--disconnect-grace off`). See [`super::advisories`].
    pub disconnect_grace: Option<Duration>,
    /// Counts the losses of the driver's NATS connection, if it is watched: a leader whose
    /// connection is lost stands down at once, since a standby that hears of the close from
    /// the server may lead after `disconnect_grace` (see [`super::lease`]).
    pub connection_lost: Option<tokio::sync::watch::Receiver<u64>>,
}

impl DriverConfig {
    /// The defaults `ember-driver` has, for `subjects`.
    pub fn new(subjects: Subjects) -> Self {
        Self {
            subjects,
            expect_executors: DEFAULT_EXPECT_EXECUTORS,
            revive_interval: crate::DEFAULT_REVIVE_INTERVAL,
            scheduling: Default::default(),
            liveness: Liveness::default(),
            journal: JournalMode::default(),
            journal_max_age: crate::DEFAULT_JOURNAL_MAX_AGE,
            retention: Retention::default(),
            snapshot_after: crate::DEFAULT_SNAPSHOT_AFTER,
            results_max_age: super::results::DEFAULT_RESULTS_MAX_AGE,
            results_max_bytes: super::results::DEFAULT_RESULTS_MAX_BYTES,
            objects_max_bytes: crate::objects::DEFAULT_OBJECTS_MAX_BYTES,
            objects_max_age: crate::objects::DEFAULT_OBJECTS_MAX_AGE,
            events_max_age: super::history::DEFAULT_EVENTS_MAX_AGE,
            events_max_bytes: super::history::DEFAULT_EVENTS_MAX_BYTES,
            lease: super::lease::DEFAULT_LEASE,
            replay_timeout: super::journal::DEFAULT_REPLAY_TIMEOUT,
            replicas: Replicas::default(),
            metrics: Arc::new(DriverMetrics::new()),
            allocation: None,
            web: None,
            start_gate: None,
            exclusion: None,
            disconnect_grace: Some(super::advisories::DEFAULT_DISCONNECT_GRACE),
            connection_lost: None,
        }
    }
}
