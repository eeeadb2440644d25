//! An executor's metrics: what it runs now, what it has run and how long each took, and how
//! its statuses and registrations went. The executor's loop counts as things happen and sets
//! the gauges after each step, so a scrape sees them as they are.

use super::driver::{end_index, END_STATES};
use super::{label, Labels, Scrape};
use crate::protocol::StatusUpdate;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::time::Duration;

/// The end states an executor reports: an executor never reports an attempt lost.
const EXECUTOR_ENDS: usize = 3;

/// What an executor counts, shared by its loop and the metrics server.
#[derive(Debug)]
pub struct ExecutorMetrics {
    registry: Registry,
    tasks_running: Gauge,
    cores_total: Gauge,
    cores_free: Gauge,
    tasks_launched: Counter,
    /// The series of `tasks_ended` of each end state, in `END_STATES`' order.
    ended: [Counter; EXECUTOR_ENDS],
    task_duration: Histogram,
    statuses: Counter,
    status_batches: Counter,
    status_batch_retries: Counter,
    registrations: Counter,
    reregistrations: Counter,
    /// Slow-consumer events of the executor's NATS connection.
    pub slow_consumers: Counter,
    /// What its cache of the cluster's objects has done.
    pub objects: crate::objects::cache::CacheCounts,
}

impl Default for ExecutorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Buckets for a task's run time: 10 µs to about 6 hours.
fn run_time_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-5, 2.0, 32))
}

impl ExecutorMetrics {
    pub fn new() -> Self {
        let cores = Family::<Labels, Gauge>::default();
        let tasks_ended = Family::<Labels, Counter>::default();
        let ended =
            [0, 1, 2].map(|i| tasks_ended.get_or_create_owned(&label("state", END_STATES[i])));
        let mut metrics = Self {
            tasks_running: Gauge::default(),
            cores_total: cores.get_or_create_owned(&label("state", "total")),
            cores_free: cores.get_or_create_owned(&label("state", "free")),
            tasks_launched: Counter::default(),
            ended,
            task_duration: run_time_histogram(),
            statuses: Counter::default(),
            status_batches: Counter::default(),
            status_batch_retries: Counter::default(),
            registrations: Counter::default(),
            reregistrations: Counter::default(),
            slow_consumers: Counter::default(),
            objects: Default::default(),
            registry: Registry::with_prefix("ember_executor"),
        };
        metrics.register_tasks(cores, tasks_ended);
        metrics.register_messages();
        metrics.register_objects();
        metrics
    }

    fn register_tasks(&mut self, cores: Family<Labels, Gauge>, ended: Family<Labels, Counter>) {
        let r = &mut self.registry;
        r.register(
            "tasks_running",
            "Attempts running on this executor",
            self.tasks_running.clone(),
        );
        r.register(
            "cores",
            "This executor's cores, by state (total, free)",
            cores,
        );
        r.register(
            "tasks_launched",
            "Attempts started on this executor",
            self.tasks_launched.clone(),
        );
        r.register(
            "tasks_ended",
            "Attempts this executor ended, by state (finished, failed, killed), counted when the driver acknowledges their status",
            ended,
        );
        r.register_with_unit(
            "task_run_duration",
            "Time each attempt's work took, from its start to its end (work stopped by a kill is not counted)",
            Unit::Seconds,
            self.task_duration.clone(),
        );
    }

    fn register_messages(&mut self) {
        let r = &mut self.registry;
        r.register(
            "statuses",
            "Status updates (running and ends) the driver acknowledged",
            self.statuses.clone(),
        );
        r.register(
            "status_batches",
            "Status batches the driver acknowledged",
            self.status_batches.clone(),
        );
        r.register(
            "status_batch_retries",
            "Status batches sent again: unanswered, or answered by a driver that did not know this executor",
            self.status_batch_retries.clone(),
        );
        r.register(
            "registrations",
            "Registrations the driver accepted, the first included",
            self.registrations.clone(),
        );
        r.register(
            "reregistrations",
            "Registrations after the first: the driver had forgotten this executor, or a new driver leads",
            self.reregistrations.clone(),
        );
        r.register(
            "slow_consumers",
            "Slow-consumer events of the executor's NATS connection: each is a message the client dropped because a subscription's queue was full",
            self.slow_consumers.clone(),
        );
    }

    fn register_objects(&mut self) {
        let (r, objects) = (&mut self.registry, &self.objects);
        r.register(
            "object_fetches",
            "Objects this executor fetched from the cluster's object store into its cache",
            objects.fetches.clone(),
        );
        r.register_with_unit(
            "object_fetched",
            "Bytes of the objects this executor fetched",
            Unit::Bytes,
            objects.fetched_bytes.clone(),
        );
        r.register(
            "object_host_takes",
            "Objects this executor took from its host's shared directory (put or fetched on this host) instead of fetching them",
            objects.host_takes.clone(),
        );
        r.register_with_unit(
            "object_host_taken",
            "Bytes of the objects this executor took from its host's shared directory",
            Unit::Bytes,
            objects.host_taken_bytes.clone(),
        );
        r.register(
            "object_cache_hits",
            "Tasks' objects found in the cache, or already being fetched for another task",
            objects.hits.clone(),
        );
        r.register(
            "object_cache_misses",
            "Tasks' objects the cache did not have, each fetched once",
            objects.misses.clone(),
        );
        r.register(
            "object_puts",
            "Objects this executor put in the cluster's object store: outputs and large results",
            objects.puts.clone(),
        );
        r.register_with_unit(
            "object_put",
            "Bytes this executor sent for the objects it put (none for bytes the store held)",
            Unit::Bytes,
            objects.put_bytes.clone(),
        );
    }

    /// What runs now: `running` attempts holding `busy` of `cores` cores.
    pub fn set_load(&self, running: usize, busy: u32, cores: u32) {
        self.tasks_running
            .set(i64::try_from(running).unwrap_or(i64::MAX));
        self.cores_total.set(i64::from(cores));
        self.cores_free.set(i64::from(cores.saturating_sub(busy)));
    }

    /// An attempt started.
    pub fn launched(&self) {
        self.tasks_launched.inc();
    }

    /// An attempt's work ended, `took` after it started.
    pub fn ran(&self, took: Duration) {
        self.task_duration.observe(took.as_secs_f64());
    }

    /// The driver acknowledged a batch of these statuses.
    pub fn acknowledged<'a>(&self, batch: impl Iterator<Item = &'a StatusUpdate>) {
        let mut statuses = 0;
        for update in batch {
            statuses += 1;
            if let Some(ended) = end_index(update.state).and_then(|i| self.ended.get(i)) {
                ended.inc();
            }
        }
        self.statuses.inc_by(statuses);
        self.status_batches.inc();
    }

    /// A status batch goes again.
    pub fn batch_retried(&self) {
        self.status_batch_retries.inc();
    }

    /// The driver accepted a registration: the first, or `again`.
    pub fn registered(&self, again: bool) {
        self.registrations.inc();
        if again {
            self.reregistrations.inc();
        }
    }
}

impl Scrape for ExecutorMetrics {
    fn registry(&self) -> &Registry {
        &self.registry
    }
}
