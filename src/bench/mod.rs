//! `ember bench`: the standard workloads against a cluster it starts itself, beside what the
//! broker alone does on the same machine in the same run.
//!
//! - **register**: N executors, each its own NATS connection, register at once.
//! - **throughput**: M no-op tasks on E executors of C cores, for each C given.
//! - **latency**: one no-op task at a time, submit to the job's end event.
//! - **limit**: request/reply and pub/sub with the same client library and no Ember in between;
//!   and Ember's own loop and round trip with nothing but NATS in them (`bare.rs`).
//! - **memory**: peak RSS of the driver and of an executor, idle and after load; the driver's
//!   with many registered executors.
//! - **python**: Python functions submitted from Python through the `ember` package, with
//!   `--python`: maps, round trips, and a tree of futures beside the same calls without
//!   dependencies.
//! - **broadcast**: one large object read by many command tasks on 2 executors of 2 cores,
//!   fetched once per executor, beside two bare concurrent gets of it (`broadcast.rs`).
//! - **huge** (with `--huge-tasks`): one job of 1,000,000 and one of 10,000,000 no-op tasks,
//!   each on a driver of its own: the driver's memory per task and its rate at each size
//!   (`huge.rs`).
//! - **wide**: many executors of one core (in this process) and many jobs queued at once: the
//!   scheduler's cost per task and per offer round when it has much to choose from.

mod bare;
mod broadcast;
mod broker;
mod huge;
mod procs;
mod python;
mod soak;
mod table;
mod wide;
mod workloads;

use crate::protocol::MAX_CORES;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What to run, and how big.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Executors that register at once in the register workload.
    #[arg(long, default_value_t = 1000, value_parser = at_least_one)]
    pub register: usize,
    /// No-op tasks per throughput run with many cores per executor.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub tasks: u32,
    /// No-op tasks per throughput run at 1 core per executor (bound by round trips, not CPU).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub tasks_one_core: u32,
    /// Executors in the throughput and latency workloads.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub executors: u32,
    /// Cores per executor for the throughput runs (comma-separated).
    #[arg(long, default_value = "1,64", value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CORES)))]
    pub cores: Vec<u32>,
    /// Single-task jobs in the latency workload (after 200 of warm-up).
    #[arg(long, default_value_t = 2000, value_parser = at_least_one)]
    pub latency_jobs: usize,
    /// Executors registered (through one connection) for the driver-memory figure.
    #[arg(long, default_value_t = 10_000, value_parser = at_least_one)]
    pub memory_executors: usize,
    /// Executors of one core each in the wide workload, all run by this process; 0 skips it.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub wide_executors: u32,
    /// Jobs submitted at once in the wide workload.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub wide_jobs: u32,
    /// No-op tasks in the wide workload, shared equally by its jobs.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub wide_tasks: u32,
    /// The wide workload's driver's --scheduling; under fair its jobs go round
    /// `wide::FAIR_POOLS` pools.
    #[arg(long, default_value = "fifo", value_name = "fifo|fair",
          value_parser = crate::driver::core::SchedulingMode::parse)]
    pub wide_scheduling: crate::driver::core::SchedulingMode,
    /// MiB of the object in the broadcast workload; 0 skips it.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub broadcast_mib: u32,
    /// Tasks that read the broadcast object.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub broadcast_tasks: u32,
    /// A Python interpreter with the `ember` package installed (`pip install ./python`): adds
    /// the Python workload, `client.map` of a no-op and `submit().result()` round trips on 2
    /// executors of 1 and of 8 Python workers, submitted from Python.
    #[arg(long, value_name = "INTERPRETER")]
    pub python: Option<std::path::PathBuf>,
    /// Calls of the no-op in each of the Python workload's maps.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub python_calls: u32,
    /// Timed `submit().result()` round trips in the Python workload.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub python_round_trips: u32,
    /// Leaf calls of the Python workload's tree of futures (a reduce per 100 of them, and a
    /// combine of the reduces); 0 skips it.
    #[arg(long, default_value_t = 10_000)]
    pub python_tree_leaves: u32,
    /// Jobs of each kind in the soak workload (no-op jobs alternate with command jobs, on
    /// one journaled driver that keeps --soak-retain of them); 0 skips it.
    #[arg(long, default_value_t = 20)]
    pub soak_jobs: u32,
    /// Finished jobs the soak's driver keeps (its --retain-jobs).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub soak_retain: u32,
    /// No-op tasks in each of the soak's no-op jobs.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub soak_noop_tasks: u32,
    /// Tasks in each of the soak's command jobs (each prints 32 KiB).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub soak_command_tasks: u32,
    /// How the throughput and latency workloads' driver keeps its jobs: `on` is the
    /// product's default (a JetStream journal, the server with a temporary store) and runs
    /// the workloads again with `--journal off` beside it; `off` runs them without only.
    #[arg(long, value_enum, default_value_t = Journal::On)]
    pub journal: Journal,
    /// Run the journaled workloads on servers that sync every JetStream write to disk before
    /// acknowledging it (`sync_interval: always`, the durable choice nats.conf offers), to
    /// measure what that costs; by default JetStream syncs every 2 minutes.
    #[arg(long)]
    pub sync_always: bool,
    /// Add the huge workload: one job of 1,000,000 no-op tasks and one of 10,000,000 (a
    /// minute or more), each on a driver of its own at --executors x 64 cores, for the
    /// driver's memory per task and its rate at each size.
    #[arg(long)]
    pub huge_tasks: bool,
    /// Small sizes everywhere: a smoke test of the benchmark itself, not a measurement.
    #[arg(long)]
    pub quick: bool,
    /// Run every workload this many times and report each figure's median (the machine is
    /// shared and one run is noisy); with --json, every run's report comes too, under "runs".
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Whether the bench's driver journals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Journal {
    On,
    Off,
}

/// A count for a workload: a workload of nothing measures nothing.
fn at_least_one(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(error) => Err(error.to_string()),
    }
}

impl BenchArgs {
    /// No-op tasks in the throughput run at `cores` cores per executor.
    fn tasks_at(&self, cores: u32) -> u32 {
        if cores == 1 {
            self.tasks_one_core
        } else {
            self.tasks
        }
    }

    /// Cycles of each executor in the bare loop at `cores` cores: as many tasks as Ember's run,
    /// and at least one.
    fn cycles_per_executor(&self, cores: u32) -> usize {
        (self.tasks_at(cores) / self.executors.saturating_mul(cores).max(1)).max(1) as usize
    }

    fn scaled(&self) -> Self {
        if !self.quick {
            return self.clone();
        }
        Self {
            register: 20,
            tasks: 2_000,
            tasks_one_core: 500,
            latency_jobs: 20,
            memory_executors: 100,
            wide_executors: self.wide_executors.min(50),
            wide_jobs: self.wide_jobs.min(10),
            wide_tasks: 2_000,
            python_calls: 200,
            python_round_trips: 20,
            python_tree_leaves: self.python_tree_leaves.min(1_000),
            soak_jobs: self.soak_jobs.min(3),
            soak_retain: 2,
            soak_noop_tasks: 2_000,
            soak_command_tasks: 20,
            broadcast_mib: self.broadcast_mib.min(16),
            broadcast_tasks: self.broadcast_tasks.min(8),
            ..self.clone()
        }
    }
}

/// Every figure of one run.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub machine: String,
    /// Whether `throughput` and `latency` ran with the driver's journal on.
    #[serde(default)]
    pub journal: bool,
    /// Whether the journaled servers synced every write to disk (`--sync-always`).
    #[serde(default)]
    pub sync_always: bool,
    pub register: Option<Register>,
    pub throughput: Vec<Throughput>,
    pub latency: Option<Percentiles>,
    pub limit: Option<broker::Limit>,
    pub bare: Option<bare::Bare>,
    pub memory: Option<Memory>,
    /// The same throughput and latency workloads with `--journal off`, beside a journaled
    /// run.
    #[serde(default)]
    pub journal_off: Option<Unjournaled>,
    #[serde(default)]
    pub soak: Option<soak::Soak>,
    /// Many executors of one core and many queued jobs, with the journal as `journal` says.
    #[serde(default)]
    pub wide: Option<wide::Wide>,
    /// One large object read by many tasks.
    #[serde(default)]
    pub broadcast: Option<broadcast::Broadcast>,
    /// One job of 1,000,000 and one of 10,000,000 tasks, with `--huge-tasks`.
    #[serde(default)]
    pub huge: Option<huge::Huge>,
    /// Python functions from Python, with `--python`.
    #[serde(default)]
    pub python: Option<Vec<python::PythonRow>>,
    /// Slow-consumer events, all processes and workloads together: messages NATS dropped
    /// because a subscriber fell behind. Anything but 0 is a fault.
    pub slow_consumers: u64,
}

/// The throughput and latency workloads of a driver without a journal.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Unjournaled {
    pub throughput: Vec<Throughput>,
    pub latency: Option<Percentiles>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Register {
    pub executors: usize,
    pub wall_ms: f64,
    pub one_p50_ms: f64,
    pub one_p99_ms: f64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Throughput {
    pub executors: u32,
    pub cores: u32,
    pub tasks: u32,
    pub seconds: f64,
    pub tasks_per_s: f64,
    /// CPU time per task over the run (user and system), of the driver, of the executors
    /// together, and of the nats-server: steadier than the rate on a shared machine, so a
    /// change's cost shows in a few runs.
    #[serde(default)]
    pub driver_cpu_us_per_task: f64,
    #[serde(default)]
    pub executors_cpu_us_per_task: f64,
    #[serde(default)]
    pub server_cpu_us_per_task: f64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Percentiles {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Memory {
    pub driver_idle_mb: f64,
    pub driver_peak_mb: f64,
    pub executor_idle_mb: f64,
    pub executor_peak_mb: f64,
    pub driver_with_many_executors_mb: f64,
    pub many_executors: usize,
}

/// Runs every workload `--runs` times and prints the report: each figure's median.
pub async fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let args = args.scaled();
    let mut runs = Vec::new();
    for run in 1..=args.runs {
        if args.runs > 1 {
            eprintln!("bench: run {run} of {}", args.runs);
        }
        let report = workloads::run_all(&args)
            .await
            .with_context(|| format!("run {run} of {}", args.runs))?;
        runs.push(report);
    }
    let each = runs
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()?;
    let mut median = medians(&each);
    if args.json {
        if runs.len() > 1 {
            median["runs"] = serde_json::Value::Array(each);
        }
        println!("{median}");
    } else {
        table::print_table(&serde_json::from_value(median)?);
        if runs.len() > 1 {
            println!(
                "Each figure is the median of {} runs, and each ratio the ratio of two medians. The runs:",
                runs.len()
            );
            for (i, run) in runs.iter().enumerate() {
                println!("  run {}: {}", i + 1, table::headline(run));
            }
        }
    }
    Ok(())
}

/// The reports of several runs as one: each figure the median of the runs' (the lower of the
/// two middle ones for an even count, so that every figure is one a run measured), except slow
/// consumers, which add up: a message dropped in any run is a fault.
fn medians(runs: &[serde_json::Value]) -> serde_json::Value {
    let mut median = median_of(&runs.iter().collect::<Vec<_>>());
    let dropped: u64 = runs
        .iter()
        .filter_map(|r| r["slow_consumers"].as_u64())
        .sum();
    median["slow_consumers"] = dropped.into();
    median
}

/// The median of the figures at one place in every run's report: numbers by value, objects
/// field by field, lists element by element; anything else as the first run has it.
fn median_of(values: &[&serde_json::Value]) -> serde_json::Value {
    use serde_json::Value;
    match values.first() {
        // Counts stay whole numbers; every other figure is a float.
        Some(Value::Number(_)) => match values.iter().map(|v| v.as_u64()).collect() {
            Some(counts) => lower_median(counts, u64::cmp).into(),
            None => lower_median(
                values.iter().filter_map(|v| v.as_f64()).collect(),
                f64::total_cmp,
            )
            .into(),
        },
        Some(Value::Object(first)) => Value::Object(
            first
                .keys()
                .map(|key| {
                    let at: Vec<_> = values.iter().map(|v| &v[key]).collect();
                    (key.clone(), median_of(&at))
                })
                .collect(),
        ),
        Some(Value::Array(first)) => Value::Array(
            (0..first.len())
                .map(|i| median_of(&values.iter().map(|v| &v[i]).collect::<Vec<_>>()))
                .collect(),
        ),
        Some(other) => (*other).clone(),
        None => Value::Null,
    }
}

/// The lower of the middle values (the middle one for an odd count); `values` is not empty.
fn lower_median<T: Copy>(mut values: Vec<T>, order: fn(&T, &T) -> std::cmp::Ordering) -> T {
    values.sort_by(order);
    values[(values.len() - 1) / 2]
}

/// A job of `tasks` no-op tasks.
fn noops(tasks: u32) -> crate::protocol::SubmitJob {
    crate::protocol::SubmitJob {
        name: "bench".into(),
        repeat: tasks,
        max_failures: 4,
        ..crate::protocol::SubmitJob::new(vec![noop()])
    }
}

fn noop() -> crate::protocol::TaskSpec {
    crate::protocol::TaskSpec::Handler {
        name: "noop".into(),
        arg: serde_json::Value::Null,
    }
}

/// p50 and p99 of `samples`, in milliseconds.
pub(crate) fn percentiles(mut samples: Vec<Duration>) -> Percentiles {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Percentiles {
        samples: samples.len(),
        p50_ms: at(0.50),
        p99_ms: at(0.99),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(tasks_per_s: f64, p50_ms: f64, slow_consumers: u64) -> serde_json::Value {
        json!({
            "machine": "2 cores",
            "throughput": [
                {"executors": 2, "cores": 1, "tasks": 100, "seconds": 100.0 / tasks_per_s,
                 "tasks_per_s": tasks_per_s},
                {"executors": 2, "cores": 64, "tasks": 1000, "seconds": 1.0,
                 "tasks_per_s": tasks_per_s * 40.0},
            ],
            "latency": {"samples": 20, "p50_ms": p50_ms, "p99_ms": p50_ms * 2.0},
            "register": null,
            "slow_consumers": slow_consumers,
        })
    }

    #[test]
    fn each_figure_is_the_median_of_the_runs_and_slow_consumers_add_up() {
        let runs = [
            run(7000.0, 0.6, 0),
            run(5000.0, 0.4, 2),
            run(9000.0, 0.5, 1),
        ];
        let median = medians(&runs);
        assert_eq!(median["throughput"][0]["tasks_per_s"], 7000.0);
        assert_eq!(median["throughput"][1]["tasks_per_s"], 280_000.0);
        assert_eq!(median["latency"]["p50_ms"], 0.5);
        assert_eq!(median["latency"]["p99_ms"], 1.0);
        // Counts stay whole numbers, words and absent workloads as the runs have them.
        assert_eq!(median["throughput"][1]["cores"], json!(64));
        assert_eq!(median["latency"]["samples"], json!(20));
        assert_eq!(median["machine"], "2 cores");
        assert_eq!(median["register"], serde_json::Value::Null);
        assert_eq!(median["slow_consumers"], json!(3));
        let report: Report = serde_json::from_value(median).expect("a report again");
        assert_eq!(report.throughput.len(), 2);
    }

    #[test]
    fn with_an_even_count_the_median_is_a_figure_a_run_measured() {
        let runs = [run(7000.0, 0.6, 0), run(5000.0, 0.4, 0)];
        let median = medians(&runs);
        assert_eq!(median["throughput"][0]["tasks_per_s"], 5000.0);
        assert_eq!(median["latency"]["p50_ms"], 0.4);
        assert_eq!(medians(&runs[..1]), runs[0]);
    }
}
