//! `ember-driver`: keeps the executor registry and schedules tasks on executors' free cores.

use clap::Parser;
use ember::cli::{
    init_tracing, parse_age, parse_bytes, parse_duration, parse_lease, parse_wait, runtime,
    shutdown_signal,
};
use ember::connect::NatsArgs;
use ember::driver::core::{
    AllocationConfig, ExclusionConfig, Liveness, Retention, StartGate, DEFAULT_MIN_EXECUTORS,
    DEFAULT_RETAIN_JOBS,
};
use ember::driver::core::{PoolConfig, Scheduling, SchedulingMode};
use ember::driver::{run, DriverConfig, JournalMode, Replicas};
use std::process::ExitCode;
use std::time::Duration;

/// The Ember driver: executors register with it over NATS; it publishes listener events
/// (ember.<cluster>.events.>) and offers free cores to waiting tasks. With a journal, any
/// number may run per cluster: one leads (a lease in JetStream) and the others stand by, ready
/// to take over when it stops renewing. On SIGINT/SIGTERM it sends what it still holds, gives
/// the lease up and exits 0, or 1 if the NATS server has not taken its last messages within 5s.
#[derive(Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    nats: NatsArgs,
    /// Executors expected to register; counts down as they do (shown as pending_executors).
    #[arg(long, env = "EMBER_EXPECT_EXECUTORS", default_value_t = 0)]
    expect_executors: u64,
    /// Hold offers until this many executors have registered, or --max-registered-wait has
    /// passed since the driver started (Spark's start gate); the log says when and why the
    /// gate opens. Off unless given.
    #[arg(long, env = "EMBER_MIN_REGISTERED", group = "gate",
          value_parser = clap::value_parser!(u64).range(1..))]
    min_registered: Option<u64>,
    /// As --min-registered, as a ratio (above 0, at most 1) of --expect-executors, rounded up
    /// (Spark's minRegisteredResourcesRatio).
    #[arg(long, env = "EMBER_MIN_REGISTERED_RATIO", group = "gate", value_parser = parse_ratio)]
    min_registered_ratio: Option<f64>,
    /// The longest the start gate holds offers (Spark's maxRegisteredResourcesWaitingTime).
    #[arg(long, env = "EMBER_MAX_REGISTERED_WAIT", default_value = "30s",
          value_parser = parse_duration, requires = "gate")]
    max_registered_wait: Duration,
    /// Exclude executors on which tasks fail (Spark's spark.excludeOnFailure.enabled): from a
    /// task that failed there, from a job of which several tasks failed there, and from every
    /// job after failures across jobs, each for --exclude-timeout. A job with a task no live
    /// executor may run fails after --exclude-unschedulable-timeout. Off unless given.
    #[arg(long, env = "EMBER_EXCLUDE_ON_FAILURE")]
    exclude_on_failure: bool,
    /// Exclude an executor from a task once the task has failed this many times on it (Spark's
    /// excludeOnFailure.task.maxTaskAttemptsPerExecutor).
    #[arg(long, env = "EMBER_EXCLUDE_TASK_FAILURES", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..), requires = "exclude_on_failure")]
    exclude_task_failures: u32,
    /// Exclude an executor from a job once this many of the job's tasks have failed on it
    /// (Spark's excludeOnFailure.stage.maxFailedTasksPerExecutor).
    #[arg(long, env = "EMBER_EXCLUDE_JOB_FAILURES", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..), requires = "exclude_on_failure")]
    exclude_job_failures: u32,
    /// Exclude an executor from every job once this many tasks have failed on it, within
    /// --exclude-timeout, in jobs that went on to succeed (Spark's
    /// excludeOnFailure.application.maxFailedTasksPerExecutor).
    #[arg(long, env = "EMBER_EXCLUDE_CLUSTER_FAILURES", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..), requires = "exclude_on_failure")]
    exclude_cluster_failures: u32,
    /// How long an exclusion lasts, and a failure counts across jobs (Spark's
    /// excludeOnFailure.timeout).
    #[arg(long, env = "EMBER_EXCLUDE_TIMEOUT", default_value = "1h", value_parser = parse_duration,
          requires = "exclude_on_failure")]
    exclude_timeout: Duration,
    /// Fail a job once one of its tasks has had no live executor it may run on for this long
    /// (Spark's excludeOnFailure.unschedulableTaskSetTimeout).
    #[arg(long, env = "EMBER_EXCLUDE_UNSCHEDULABLE_TIMEOUT", default_value = "120s",
          value_parser = parse_duration, requires = "exclude_on_failure")]
    exclude_unschedulable_timeout: Duration,
    /// How jobs share the cores (Spark's spark.scheduler.mode): fifo runs the job of highest
    /// priority first, then the oldest; fair shares the cores between pools (--pool) by their
    /// minimum shares and weights, by cores in use, as Spark's fair scheduler.
    #[arg(long, env = "EMBER_SCHEDULING", default_value = "fifo", value_name = "fifo|fair",
          value_parser = SchedulingMode::parse)]
    scheduling: SchedulingMode,
    /// Declare a pool for --scheduling fair, as NAME:weight=W,min-share=M,mode=fifo|fair
    /// (repeatable; settings optional, Spark's fairscheduler.xml). weight (default 1) is the
    /// pool's share against other pools' weights; min-share (default 0) the cores it gets
    /// before pools past theirs get more; mode (default fifo) orders its own jobs. A job names
    /// its pool with `ember submit --pool`; one naming no pool runs in `default`, one naming
    /// an undeclared pool in a pool of that name with the defaults.
    #[arg(long = "pool", value_name = "NAME:weight=W,min-share=M,mode=M",
          value_parser = PoolConfig::parse)]
    pools: Vec<PoolConfig>,
    /// How often free cores are offered even when nothing else prompts it.
    #[arg(long, env = "EMBER_REVIVE_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    revive_interval: Duration,
    /// Remove an executor that has sent no heartbeat (or status) for this long.
    #[arg(long, env = "EMBER_EXECUTOR_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    executor_timeout: Duration,
    /// After taking over running jobs from the journal, hold offers this long, so that
    /// executors still running their tasks register and have those runs adopted rather than
    /// started a second time elsewhere (0: do not wait). Longer than the executors'
    /// --heartbeat-interval.
    #[arg(long, env = "EMBER_ADOPT_WAIT", default_value = "3s", value_parser = parse_wait)]
    adopt_wait: Duration,
    /// Fail waiting jobs when no executor has been registered for this long.
    #[arg(long, env = "EMBER_NO_EXECUTORS_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    no_executors_timeout: Duration,
    /// Keep jobs in a JetStream journal, so that a driver started after this one resumes them:
    /// auto uses JetStream if the server offers it (the log says which) and does not start if
    /// the server does not say, on refuses to start without it, off keeps jobs in memory only.
    #[arg(long, env = "EMBER_JOURNAL", value_enum, default_value_t = JournalMode::Auto)]
    journal: JournalMode,
    /// Drop journal records older than this (the stream's max age). A job still running when
    /// its submission ages out is not restored.
    #[arg(long, env = "EMBER_JOURNAL_MAX_AGE", default_value = "7days", value_parser = parse_age)]
    journal_max_age: Duration,
    /// Keep this many finished jobs, with their results, in memory and in what a restarted
    /// driver restores; older ones are forgotten (asking for one says so). Running and queued
    /// jobs are never forgotten.
    #[arg(long, env = "EMBER_RETAIN_JOBS", default_value_t = DEFAULT_RETAIN_JOBS,
          value_parser = clap::value_parser!(u32).range(1..))]
    retain_jobs: u32,
    /// Hold at most this many bytes of task results in all; past it, the results of the
    /// oldest finished jobs are dropped (reading them says so).
    #[arg(long, env = "EMBER_MAX_RESULT_BYTES", default_value = "256MiB", value_parser = parse_bytes)]
    max_result_bytes: u64,
    /// Hold at most this many bytes of one job's task results (Spark's
    /// spark.driver.maxResultSize): results past it are refused, with a note in the task's
    /// error, and the job runs on.
    #[arg(long, env = "EMBER_MAX_JOB_RESULT_BYTES", default_value = "64MiB", value_parser = parse_bytes)]
    max_job_result_bytes: u64,
    /// With a journal, task results go to the cluster's results bucket in JetStream
    /// (EMBER_<cluster>_RESULTS), not the driver's memory; it keeps each this long.
    #[arg(long, env = "EMBER_RESULTS_MAX_AGE", default_value = "24h", value_parser = parse_age)]
    results_max_age: Duration,
    /// The most bytes the results bucket keeps; past it, the oldest results go first.
    #[arg(long, env = "EMBER_RESULTS_MAX_BYTES", default_value = "256MiB", value_parser = parse_bytes)]
    results_max_bytes: u64,
    /// With a journal, every event also goes to the cluster's events stream in JetStream
    /// (EMBER_<cluster>_EVENTS), which `ember events --since` reads; it keeps each this long.
    #[arg(long, env = "EMBER_EVENTS_MAX_AGE", default_value = "24h", value_parser = parse_age)]
    events_max_age: Duration,
    /// The most bytes the events stream keeps; past it, the oldest events go first.
    #[arg(long, env = "EMBER_EVENTS_MAX_BYTES", default_value = "128MiB", value_parser = parse_bytes)]
    events_max_bytes: u64,
    /// Snapshot the journal's live state each time the journal has grown by this much (or by
    /// twice the last snapshot, if that is more), and purge what the snapshot replaces: a
    /// restart reads one snapshot and a short tail, whatever the history.
    #[arg(long, env = "EMBER_SNAPSHOT_AFTER", default_value = "8MiB", value_parser = parse_bytes)]
    snapshot_after: u64,
    /// With a journal, how long a leader's lease lasts unrenewed: it renews every third of it,
    /// and stops sending the moment it cannot renew in time; a standby takes over once a
    /// lease has lapsed (the lease and a fifth of it after the last renewal it saw).
    #[arg(long, env = "EMBER_LEASE", default_value = "3s", value_parser = parse_lease)]
    lease: Duration,
    /// With a journal, how long a driver taking the lead may spend marking the journal with
    /// its leadership and then replaying it (a failed read starts the replay again); past it,
    /// the driver gives up starting and exits with an error naming this flag. Raise it for a
    /// journal that takes longer to read.
    #[arg(long, env = "EMBER_REPLAY_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    replay_timeout: Duration,
    /// How many copies of the journal, the results bucket and the lease a cluster of NATS
    /// servers keeps (1 to 5): auto keeps 3 when the server is part of a cluster (1 if the
    /// cluster cannot place 3) and 1 on a lone server.
    #[arg(long, env = "EMBER_REPLICAS", default_value = "auto", value_parser = Replicas::parse)]
    replicas: Replicas,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (OpenMetrics text): executors,
    /// cores, jobs by state, tasks waiting, running, launched and ended, offer rounds, request
    /// handling times, status batch sizes, refused requests, journal write times and retries,
    /// slow-consumer events, and whether this driver leads. Off unless given (port 0 picks a
    /// free port and logs it).
    #[arg(long, env = "EMBER_METRICS_ADDR", value_name = "HOST:PORT")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Compute the dynamic allocation signal: how many executors the driver wants, at most
    /// this many (shown by `ember executors`, published as ExecutorTarget events and the
    /// executors_target metric, for whatever starts executors to follow). Off unless given.
    #[arg(long, env = "EMBER_MAX_EXECUTORS", value_parser = clap::value_parser!(u32).range(1..))]
    max_executors: Option<u32>,
    /// The fewest executors the signal asks for.
    #[arg(long, env = "EMBER_MIN_EXECUTORS", default_value_t = DEFAULT_MIN_EXECUTORS,
          requires = "max_executors")]
    min_executors: u32,
    /// Ask for more executors once tasks have waited this long, and again (twice as many)
    /// each time they wait this long more (Spark's schedulerBacklogTimeout).
    #[arg(long, env = "EMBER_BACKLOG_TIMEOUT", default_value = "1s", value_parser = parse_duration,
          requires = "max_executors")]
    backlog_timeout: Duration,
    /// An executor that has run nothing for this long may be released (Spark's
    /// executorIdleTimeout).
    #[arg(long, env = "EMBER_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_duration,
          requires = "max_executors")]
    idle_timeout: Duration,
    /// Serve a live, read-only web page of the cluster at http://HOST:PORT/ (4040 is the
    /// suggested port, as Spark's UI): executors, jobs and their progress, a job's tasks, and a
    /// timeline, updated as the driver's events happen. It has no login: bind it to
    /// 127.0.0.1 or put it behind a proxy that checks who asks. A standby driver's page says
    /// it stands by. Off unless given (port 0 picks a free port and logs it).
    #[arg(long, env = "EMBER_HTTP", value_name = "HOST:PORT")]
    http: Option<std::net::SocketAddr>,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "EMBER_LOG_JSON")]
    log_json: bool,
}

fn main() -> ExitCode {
    ember::cli::return_big_blocks_when_freed();
    let args = Args::parse();
    let scheduling = scheduling(&args);
    init_tracing(args.log_json, ember::cli::SERVICE_LOG);
    let result = runtime().map_err(anyhow::Error::from).and_then(|rt| {
        rt.block_on(async {
            let subjects = args.nats.subjects()?;
            let metrics = std::sync::Arc::new(ember::metrics::DriverMetrics::new());
            if let Some(addr) = args.metrics_addr {
                ember::metrics::serve(addr, metrics.clone())
                    .await
                    .map_err(|e| anyhow::anyhow!("could not serve metrics on {addr}: {e}"))?;
            }
            let web = match args.http {
                Some(addr) => {
                    let (link, handle) = ember::web::link(&args.nats.cluster);
                    ember::web::serve(addr, handle).map_err(|e| {
                        anyhow::anyhow!("could not serve the web page on {addr}: {e}")
                    })?;
                    Some(link)
                }
                None => None,
            };
            let slow_consumers = metrics.slow_consumers.clone();
            let client = args
                .nats
                .connect_counting("ember-driver", None, slow_consumers)
                .await?;
            let config = DriverConfig {
                subjects,
                expect_executors: args.expect_executors,
                revive_interval: args.revive_interval,
                scheduling,
                liveness: Liveness {
                    executor_timeout_ms: args.executor_timeout.as_millis() as u64,
                    no_executors_timeout_ms: args.no_executors_timeout.as_millis() as u64,
                    adopt_wait_ms: args.adopt_wait.as_millis() as u64,
                    ..Liveness::default()
                },
                journal: args.journal,
                journal_max_age: args.journal_max_age,
                retention: Retention {
                    jobs: args.retain_jobs as usize,
                    result_bytes: args.max_result_bytes,
                    job_result_bytes: args.max_job_result_bytes,
                },
                snapshot_after: args.snapshot_after,
                results_max_age: args.results_max_age,
                results_max_bytes: args.results_max_bytes,
                events_max_age: args.events_max_age,
                events_max_bytes: args.events_max_bytes,
                lease: args.lease,
                replay_timeout: args.replay_timeout,
                replicas: args.replicas,
                metrics,
                allocation: allocation(&args)?,
                web,
                start_gate: start_gate(&args),
                exclusion: exclusion(&args),
            };
            run(client, config, shutdown_signal()).await?;
            Ok(())
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ember-driver: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// A ratio for `--min-registered-ratio`: above 0, at most 1.
fn parse_ratio(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(r) if r > 0.0 && r <= 1.0 => Ok(r),
        Ok(r) => Err(format!("{r} is not a ratio above 0 and at most 1")),
        Err(_) => Err(format!("{text:?} is not a number (write e.g. 0.8)")),
    }
}

/// The start gate, if `--min-registered` or `--min-registered-ratio` sets one. A ratio of
/// `--expect-executors` 0 asks for nothing: clap's error says so, and the driver does not start.
fn start_gate(args: &Args) -> Option<StartGate> {
    let min_registered = match (args.min_registered, args.min_registered_ratio) {
        (Some(n), _) => n,
        (None, Some(ratio)) => {
            if args.expect_executors == 0 {
                use clap::CommandFactory;
                Args::command()
                    .error(
                        clap::error::ErrorKind::MissingRequiredArgument,
                        "--min-registered-ratio is a ratio of --expect-executors, which is 0; \
                         give --expect-executors, or --min-registered instead",
                    )
                    .exit();
            }
            ((args.expect_executors as f64 * ratio).ceil() as u64).max(1)
        }
        (None, None) => return None,
    };
    Some(StartGate {
        min_registered,
        max_wait_ms: args.max_registered_wait.as_millis() as u64,
    })
}

/// How jobs share the cores. Pools declared under fifo, which has none, or a pool declared
/// twice: clap's error says so, and the driver does not start.
fn scheduling(args: &Args) -> Scheduling {
    use clap::CommandFactory;
    let refuse = |message: String| -> ! {
        Args::command()
            .error(clap::error::ErrorKind::ArgumentConflict, message)
            .exit()
    };
    if args.scheduling == SchedulingMode::Fifo && !args.pools.is_empty() {
        refuse("--pool declares a pool for --scheduling fair, and the scheduling is fifo".into());
    }
    Scheduling::new(args.scheduling, args.pools.clone()).unwrap_or_else(|e| refuse(e))
}

/// Exclusion on failure's settings, if `--exclude-on-failure` turns it on.
fn exclusion(args: &Args) -> Option<ExclusionConfig> {
    args.exclude_on_failure.then_some(ExclusionConfig {
        max_task_attempts_per_executor: args.exclude_task_failures,
        max_failed_tasks_per_executor: args.exclude_job_failures,
        cluster_max_failed_tasks_per_executor: args.exclude_cluster_failures,
        timeout_ms: args.exclude_timeout.as_millis() as u64,
        unschedulable_timeout_ms: args.exclude_unschedulable_timeout.as_millis() as u64,
    })
}

/// The dynamic allocation settings, if `--max-executors` turns the signal on.
fn allocation(args: &Args) -> anyhow::Result<Option<AllocationConfig>> {
    let Some(max_executors) = args.max_executors else {
        return Ok(None);
    };
    if args.min_executors > max_executors {
        anyhow::bail!(
            "--min-executors {} is more than --max-executors {max_executors}",
            args.min_executors
        );
    }
    let positive = |d: Duration, flag: &str| match d.as_millis() {
        0 => Err(anyhow::anyhow!("{flag} must be more than 0")),
        ms => Ok(ms as u64),
    };
    Ok(Some(AllocationConfig {
        min_executors: args.min_executors,
        max_executors,
        backlog_timeout_ms: positive(args.backlog_timeout, "--backlog-timeout")?,
        idle_timeout_ms: positive(args.idle_timeout, "--idle-timeout")?,
    }))
}

#[cfg(test)]
mod tests {
    /// Clap's own checks of the command line, and a help text for every flag.
    #[test]
    fn the_command_line_passes_clap_s_checks_and_explains_every_flag() {
        use clap::CommandFactory;
        ember::cli::check_command_line(super::Args::command());
    }
}
