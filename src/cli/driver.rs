//! `ember-driver`'s command line: its flags, each default the constant [`DriverConfig::new`]
//! takes it from (so `--help` shows what a driver does unless told); [`DriverArgs::config`],
//! the config they make; and serving a driver as they say.

mod config;

pub use config::DriverFlagsError;

use super::durations::{parse_grace, Grace};
use super::{
    parse_age, parse_bytes, parse_duration, parse_lease, parse_wait, show_bytes, show_duration,
};
use crate::connect::NatsArgs;
use crate::driver::config::DEFAULT_EXPECT_EXECUTORS;
use crate::driver::core::{
    PoolConfig, SchedulingMode, DEFAULT_ADOPT_WAIT, DEFAULT_BACKLOG_TIMEOUT,
    DEFAULT_EXCLUDE_CLUSTER_FAILURES, DEFAULT_EXCLUDE_JOB_FAILURES, DEFAULT_EXCLUDE_TASK_FAILURES,
    DEFAULT_EXCLUDE_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_JOB_RESULT_BYTES,
    DEFAULT_MAX_REGISTERED_WAIT, DEFAULT_MAX_RESULT_BYTES, DEFAULT_MIN_EXECUTORS,
    DEFAULT_RETAIN_JOBS, DEFAULT_UNSCHEDULABLE_TIMEOUT,
};
use crate::driver::history::{DEFAULT_EVENTS_MAX_AGE, DEFAULT_EVENTS_MAX_BYTES};
use crate::driver::journal::DEFAULT_REPLAY_TIMEOUT;
use crate::driver::lease::DEFAULT_LEASE;
use crate::driver::results::{DEFAULT_RESULTS_MAX_AGE, DEFAULT_RESULTS_MAX_BYTES};
use crate::driver::{DriverConfig, JournalMode, Replicas};
use crate::objects::{DEFAULT_OBJECTS_MAX_AGE, DEFAULT_OBJECTS_MAX_BYTES};
use crate::{
    DEFAULT_EXECUTOR_TIMEOUT, DEFAULT_JOURNAL_MAX_AGE, DEFAULT_NO_EXECUTORS_TIMEOUT,
    DEFAULT_REVIVE_INTERVAL, DEFAULT_SNAPSHOT_AFTER,
};
use clap::Parser;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

/// The Ember driver: executors register with it over NATS; it publishes listener events
/// (ember.<cluster>.events.>) and offers free cores to waiting tasks. With a journal, any
/// number may run per cluster: one leads (a lease in JetStream) and the others stand by, ready
/// to take over when it stops renewing. On SIGINT/SIGTERM it sends what it still holds, gives
/// the lease up and exits 0, or 1 if the NATS server has not taken its last messages within 5s.
#[derive(Debug, Parser)]
#[command(version)]
pub struct DriverArgs {
    #[command(flatten)]
    pub nats: NatsArgs,
    /// Executors expected to register; counts down as they do (shown as pending_executors).
    #[arg(long, env = "EMBER_EXPECT_EXECUTORS", default_value_t = DEFAULT_EXPECT_EXECUTORS)]
    pub expect_executors: u64,
    /// Hold offers until this many executors have registered, or --max-registered-wait has
    /// passed since the driver started (Spark's start gate); the log says when and why the
    /// gate opens. Off unless given.
    #[arg(long, env = "EMBER_MIN_REGISTERED", group = "gate",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub min_registered: Option<u64>,
    /// As --min-registered, as a ratio (above 0, at most 1) of --expect-executors, rounded up
    /// (Spark's minRegisteredResourcesRatio).
    #[arg(long, env = "EMBER_MIN_REGISTERED_RATIO", group = "gate", value_parser = parse_ratio)]
    pub min_registered_ratio: Option<f64>,
    /// The longest the start gate holds offers (Spark's maxRegisteredResourcesWaitingTime).
    #[arg(long, env = "EMBER_MAX_REGISTERED_WAIT",
          default_value = show_duration(DEFAULT_MAX_REGISTERED_WAIT),
          value_parser = parse_duration, requires = "gate")]
    pub max_registered_wait: Duration,
    /// Exclude executors on which tasks fail (Spark's spark.excludeOnFailure.enabled): from a
    /// task that failed there, from a job of which several tasks failed there, and from every
    /// job after failures across jobs, each for --exclude-timeout. A job with a task no live
    /// executor may run fails after --exclude-unschedulable-timeout. Off unless given.
    #[arg(long, env = "EMBER_EXCLUDE_ON_FAILURE")]
    pub exclude_on_failure: bool,
    /// Exclude an executor from a task once the task has failed this many times on it (Spark's
    /// excludeOnFailure.task.maxTaskAttemptsPerExecutor).
    #[arg(long, env = "EMBER_EXCLUDE_TASK_FAILURES",
          default_value_t = DEFAULT_EXCLUDE_TASK_FAILURES,
          value_parser = clap::value_parser!(u32).range(1..), requires = "exclude_on_failure")]
    pub exclude_task_failures: u32,
    /// Exclude an executor from a job once this many of the job's tasks have failed on it
    /// (Spark's excludeOnFailure.stage.maxFailedTasksPerExecutor).
    #[arg(long, env = "EMBER_EXCLUDE_JOB_FAILURES", default_value_t = DEFAULT_EXCLUDE_JOB_FAILURES,
          value_parser = clap::value_parser!(u32).range(1..), requires = "exclude_on_failure")]
    pub exclude_job_failures: u32,
    /// Exclude an executor from every job once this many tasks have failed on it, within
    /// --exclude-timeout, in jobs that went on to succeed (Spark's
    /// excludeOnFailure.application.maxFailedTasksPerExecutor).
    #[arg(long, env = "EMBER_EXCLUDE_CLUSTER_FAILURES",
          default_value_t = DEFAULT_EXCLUDE_CLUSTER_FAILURES,
          value_parser = clap::value_parser!(u32).range(1..), requires = "exclude_on_failure")]
    pub exclude_cluster_failures: u32,
    /// How long an exclusion lasts, and a failure counts across jobs (Spark's
    /// excludeOnFailure.timeout).
    #[arg(long, env = "EMBER_EXCLUDE_TIMEOUT",
          default_value = show_duration(DEFAULT_EXCLUDE_TIMEOUT),
          value_parser = parse_duration, requires = "exclude_on_failure")]
    pub exclude_timeout: Duration,
    /// Fail a job once one of its tasks has had no live executor it may run on for this long
    /// (Spark's excludeOnFailure.unschedulableTaskSetTimeout).
    #[arg(long, env = "EMBER_EXCLUDE_UNSCHEDULABLE_TIMEOUT",
          default_value = show_duration(DEFAULT_UNSCHEDULABLE_TIMEOUT),
          value_parser = parse_duration, requires = "exclude_on_failure")]
    pub exclude_unschedulable_timeout: Duration,
    /// How jobs share the cores (Spark's spark.scheduler.mode): fifo runs the job of highest
    /// priority first, then the oldest; fair shares the cores between pools (--pool) by their
    /// minimum shares and weights, by cores in use, as Spark's fair scheduler.
    #[arg(long, env = "EMBER_SCHEDULING", default_value = SchedulingMode::default().as_str(),
          value_name = "fifo|fair",
          value_parser = SchedulingMode::parse)]
    pub scheduling: SchedulingMode,
    /// Declare a pool for --scheduling fair, as NAME:weight=W,min-share=M,mode=fifo|fair
    /// (repeatable; settings optional, Spark's fairscheduler.xml). weight (default 1) is the
    /// pool's share against other pools' weights; min-share (default 0) the cores it gets
    /// before pools past theirs get more; mode (default fifo) orders its own jobs. A job names
    /// its pool with `ember submit --pool`; one naming no pool runs in `default`, one naming
    /// an undeclared pool in a pool of that name with the defaults.
    #[arg(long = "pool", value_name = "NAME:weight=W,min-share=M,mode=M",
          value_parser = PoolConfig::parse)]
    pub pools: Vec<PoolConfig>,
    /// How often free cores are offered even when nothing else prompts it.
    #[arg(long, env = "EMBER_REVIVE_INTERVAL",
          default_value = show_duration(DEFAULT_REVIVE_INTERVAL),
          value_parser = parse_duration)]
    pub revive_interval: Duration,
    /// Remove an executor that has sent no heartbeat (or status) for this long.
    #[arg(long, env = "EMBER_EXECUTOR_TIMEOUT",
          default_value = show_duration(DEFAULT_EXECUTOR_TIMEOUT),
          value_parser = parse_duration)]
    pub executor_timeout: Duration,
    /// When a NATS server's disconnect advisory says an executor's connection was closed by
    /// its side (the process exited or was killed), remove the executor this long after,
    /// unless it has named a new connection meanwhile; `off` ignores the advisories. They
    /// arrive only where the account imports them (nats-advisories.conf); elsewhere
    /// --executor-timeout alone judges.
    #[arg(long, env = "EMBER_DISCONNECT_GRACE",
          default_value = show_duration(crate::driver::advisories::DEFAULT_DISCONNECT_GRACE),
          value_parser = parse_grace)]
    pub disconnect_grace: Grace,
    /// After taking over running jobs from the journal, hold offers this long, so that
    /// executors still running their tasks register and have those runs adopted rather than
    /// started a second time elsewhere (0: do not wait). Longer than the executors'
    /// --heartbeat-interval.
    #[arg(long, env = "EMBER_ADOPT_WAIT", default_value = show_duration(DEFAULT_ADOPT_WAIT),
          value_parser = parse_wait)]
    pub adopt_wait: Duration,
    /// Fail waiting jobs when no executor has been registered for this long.
    #[arg(long, env = "EMBER_NO_EXECUTORS_TIMEOUT",
          default_value = show_duration(DEFAULT_NO_EXECUTORS_TIMEOUT),
          value_parser = parse_duration)]
    pub no_executors_timeout: Duration,
    /// Keep jobs in a JetStream journal, so that a driver started after this one resumes them:
    /// auto uses JetStream if the server offers it (the log says which) and does not start if
    /// the server does not say, on refuses to start without it, off keeps jobs in memory only.
    #[arg(long, env = "EMBER_JOURNAL", value_enum, default_value_t = JournalMode::default())]
    pub journal: JournalMode,
    /// Drop journal records older than this (the stream's max age). A job still running when
    /// its submission ages out is not restored.
    #[arg(long, env = "EMBER_JOURNAL_MAX_AGE",
          default_value = show_duration(DEFAULT_JOURNAL_MAX_AGE),
          value_parser = parse_age)]
    pub journal_max_age: Duration,
    /// Keep this many finished jobs, with their results, in memory and in what a restarted
    /// driver restores; older ones are forgotten (asking for one says so). Running and queued
    /// jobs are never forgotten.
    #[arg(long, env = "EMBER_RETAIN_JOBS", default_value_t = DEFAULT_RETAIN_JOBS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub retain_jobs: u32,
    /// Hold at most this many bytes of task results in all; past it, the results of the
    /// oldest finished jobs are dropped (reading them says so).
    #[arg(long, env = "EMBER_MAX_RESULT_BYTES",
          default_value = show_bytes(DEFAULT_MAX_RESULT_BYTES),
          value_parser = parse_bytes)]
    pub max_result_bytes: u64,
    /// Hold at most this many bytes of one job's task results (Spark's
    /// spark.driver.maxResultSize): a task whose result would pass it fails, for good, with
    /// an error that names this limit.
    #[arg(long, env = "EMBER_MAX_JOB_RESULT_BYTES",
          default_value = show_bytes(DEFAULT_MAX_JOB_RESULT_BYTES),
          value_parser = parse_bytes)]
    pub max_job_result_bytes: u64,
    /// With a journal, task results go to the cluster's results bucket in JetStream
    /// (EMBER_<cluster>_RESULTS), not the driver's memory; it keeps each this long.
    #[arg(long, env = "EMBER_RESULTS_MAX_AGE",
          default_value = show_duration(DEFAULT_RESULTS_MAX_AGE),
          value_parser = parse_age)]
    pub results_max_age: Duration,
    /// The most bytes the results bucket keeps; past it, the oldest results go first.
    #[arg(long, env = "EMBER_RESULTS_MAX_BYTES",
          default_value = show_bytes(DEFAULT_RESULTS_MAX_BYTES),
          value_parser = parse_bytes)]
    pub results_max_bytes: u64,
    /// With a journal, the driver makes the cluster's object store in JetStream
    /// (EMBER_<cluster>_OBJECTS), where clients put the data tasks read: it holds at most this
    /// many bytes, and a put past it is refused, evicting nothing. none: no limit but the
    /// server's own (JetStream sets aside a stream's limit on its disk, so set one only as
    /// large as you mean).
    #[arg(long, env = "EMBER_OBJECTS_MAX_BYTES",
          default_value = super::show_limit(DEFAULT_OBJECTS_MAX_BYTES),
          value_parser = super::parse_limit)]
    pub objects_max_bytes: u64,
    /// The leader deletes an object once no kept job has used it for this long and it was
    /// put at least this long ago (the chunks of a put that died, once they are this old).
    #[arg(long, env = "EMBER_OBJECTS_MAX_AGE",
          default_value = show_duration(DEFAULT_OBJECTS_MAX_AGE),
          value_parser = parse_age)]
    pub objects_max_age: Duration,
    /// With a journal, every event also goes to the cluster's events stream in JetStream
    /// (EMBER_<cluster>_EVENTS), which `ember events --since` reads; it keeps each this long.
    #[arg(long, env = "EMBER_EVENTS_MAX_AGE", default_value = show_duration(DEFAULT_EVENTS_MAX_AGE),
          value_parser = parse_age)]
    pub events_max_age: Duration,
    /// The most bytes the events stream keeps; past it, the oldest events go first.
    #[arg(long, env = "EMBER_EVENTS_MAX_BYTES",
          default_value = show_bytes(DEFAULT_EVENTS_MAX_BYTES),
          value_parser = parse_bytes)]
    pub events_max_bytes: u64,
    /// Snapshot the journal's live state each time the journal has grown by this much (or by
    /// twice the last snapshot, if that is more), and purge what the snapshot replaces: a
    /// restart reads one snapshot and a short tail, whatever the history.
    #[arg(long, env = "EMBER_SNAPSHOT_AFTER", default_value = show_bytes(DEFAULT_SNAPSHOT_AFTER),
          value_parser = parse_bytes)]
    pub snapshot_after: u64,
    /// With a journal, how long a leader's lease lasts unrenewed: it renews every third of it,
    /// and stops sending the moment it cannot renew in time; a standby takes over once a
    /// lease has lapsed (the lease and a fifth of it after the last renewal it saw).
    #[arg(long, env = "EMBER_LEASE", default_value = show_duration(DEFAULT_LEASE),
          value_parser = parse_lease)]
    pub lease: Duration,
    /// With a journal, how long a driver taking the lead may spend marking the journal with
    /// its leadership and then replaying it (a failed read starts the replay again); past it,
    /// the driver gives up starting and exits with an error naming this flag. Raise it for a
    /// journal that takes longer to read.
    #[arg(long, env = "EMBER_REPLAY_TIMEOUT", default_value = show_duration(DEFAULT_REPLAY_TIMEOUT),
          value_parser = parse_duration)]
    pub replay_timeout: Duration,
    /// How many copies of the journal, the results bucket and the lease a cluster of NATS
    /// servers keeps (1 to 5): auto keeps 3 when the server is part of a cluster (1 if the
    /// cluster cannot place 3) and 1 on a lone server.
    #[arg(long, env = "EMBER_REPLICAS", default_value_t = Replicas::default(),
          value_parser = Replicas::parse)]
    pub replicas: Replicas,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (OpenMetrics text): executors,
    /// cores, jobs by state, tasks waiting, running, launched and ended, offer rounds, request
    /// handling times, status batch sizes, refused requests, journal write times and retries,
    /// slow-consumer events, and whether this driver leads. Off unless given (port 0 picks a
    /// free port and logs it).
    #[arg(long, env = "EMBER_METRICS_ADDR", value_name = "HOST:PORT")]
    pub metrics_addr: Option<SocketAddr>,
    /// Compute the dynamic allocation signal: how many executors the driver wants, at most
    /// this many (shown by `ember executors`, published as ExecutorTarget events and the
    /// executors_target metric, for whatever starts executors to follow). Off unless given.
    #[arg(long, env = "EMBER_MAX_EXECUTORS", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_executors: Option<u32>,
    /// The fewest executors the signal asks for.
    #[arg(long, env = "EMBER_MIN_EXECUTORS", default_value_t = DEFAULT_MIN_EXECUTORS,
          requires = "max_executors")]
    pub min_executors: u32,
    /// Ask for more executors once tasks have waited this long, and again (twice as many)
    /// each time they wait this long more (Spark's schedulerBacklogTimeout).
    #[arg(long, env = "EMBER_BACKLOG_TIMEOUT",
          default_value = show_duration(DEFAULT_BACKLOG_TIMEOUT),
          value_parser = parse_duration, requires = "max_executors")]
    pub backlog_timeout: Duration,
    /// An executor that has run nothing for this long may be released (Spark's
    /// executorIdleTimeout).
    #[arg(long, env = "EMBER_IDLE_TIMEOUT", default_value = show_duration(DEFAULT_IDLE_TIMEOUT),
          value_parser = parse_duration, requires = "max_executors")]
    pub idle_timeout: Duration,
    /// Serve a live, read-only web page of the cluster at http://HOST:PORT/ (4040 is the
    /// suggested port, as Spark's UI): executors, jobs and their progress, a job's tasks, and a
    /// timeline, updated as the driver's events happen. It has no login: bind it to
    /// 127.0.0.1 or put it behind a proxy that checks who asks. A standby driver's page says
    /// it stands by. Off unless given (port 0 picks a free port and logs it).
    #[arg(long, env = "EMBER_HTTP", value_name = "HOST:PORT")]
    pub http: Option<SocketAddr>,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "EMBER_LOG_JSON")]
    pub log_json: bool,
}

/// A ratio for `--min-registered-ratio`: above 0, at most 1.
fn parse_ratio(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(r) if r > 0.0 && r <= 1.0 => Ok(r),
        Ok(r) => Err(format!("{r} is not a ratio above 0 and at most 1")),
        Err(_) => Err(format!("{text:?} is not a number (write e.g. 0.8)")),
    }
}

/// Serves a driver with `config` (from [`DriverArgs::config`]) until `shutdown`: its metrics
/// and its web page where the flags ask for them, then the driver on a connection of its own.
pub async fn serve(
    args: &DriverArgs,
    mut config: DriverConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    if let Some(addr) = args.metrics_addr {
        crate::metrics::serve(addr, config.metrics.clone())
            .await
            .map_err(|e| anyhow::anyhow!("could not serve metrics on {addr}: {e}"))?;
    }
    if let Some(addr) = args.http {
        let (link, handle) = crate::web::link(&args.nats.cluster);
        crate::web::serve(addr, handle)
            .map_err(|e| anyhow::anyhow!("could not serve the web page on {addr}: {e}"))?;
        config.web = Some(link);
    }
    let (lost, connection_lost) = tokio::sync::watch::channel(0);
    config.connection_lost = Some(connection_lost);
    let watch = crate::connect::Watch {
        slow_consumers: config.metrics.slow_consumers.clone(),
        connected: None,
        lost: Some(std::sync::Arc::new(lost)),
    };
    let client = args
        .nats
        .connect_watched("ember-driver", None, watch)
        .await?;
    crate::driver::run(client, config, shutdown).await?;
    Ok(())
}
