//! The huge workload (`--huge-tasks`, left out of the default run): one job of 1,000,000 no-op
//! tasks and one of 10,000,000, each on a driver of its own at 2 executors x 64 cores, journal
//! as the run's. What it asks: does the driver's memory per task stay the same, and its rate,
//! when a job is ten times larger? The driver keeps a record per launched task, so its RSS grows
//! with the job; a cost that grows faster (a copy of every record per snapshot, a map rehashed
//! all at once, results kept that should not be) shows as a larger marginal cost at ten million.

use super::procs::{rss_mb, Cluster};
use super::workloads::{time_noops, with_executors};
use super::BenchArgs;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The longest one job may take: ten million tasks at a tenth of the usual rate.
const LIMIT: Duration = Duration::from_secs(1200);
/// Cores per executor, as the throughput workload's larger run.
const CORES: u32 = 64;
/// The two jobs' sizes; `--quick` divides both by `QUICK_DIVISOR`.
pub const SMALL: u32 = 1_000_000;
pub const LARGE: u32 = 10_000_000;
pub const QUICK_DIVISOR: u32 = 50;
/// The targets: the marginal bytes per task at ten million at most this many times those at
/// one million, and the rate at ten million at least this fraction of the rate at one.
pub const MARGINAL_TARGET: f64 = 1.05;
pub const RATE_TARGET: f64 = 0.90;

#[derive(Debug, Serialize, Deserialize)]
pub struct Huge {
    /// The two jobs' sizes (1,000,000 and 10,000,000 but under `--quick`).
    pub tasks_1m: u32,
    pub tasks_10m: u32,
    pub executors: u32,
    pub cores: u32,
    pub journal: bool,
    /// The driver's RSS with its executors registered and no job yet (the small job's driver).
    pub rss_idle_mb: f64,
    /// The highest RSS of each job's driver (its `VmHWM` once the job has ended).
    pub peak_rss_mb_1m: f64,
    pub peak_rss_mb_10m: f64,
    /// Each driver's RSS once its job has ended.
    pub rss_after_mb_1m: f64,
    pub rss_after_mb_10m: f64,
    pub tasks_per_s_1m: f64,
    pub tasks_per_s_10m: f64,
    /// The large job's peak over the small one's, per task, against the small job's over idle
    /// per task: `((peak_10m - peak_1m) / (tasks_10m - tasks_1m)) / ((peak_1m - idle) /
    /// tasks_1m)`. At most [`MARGINAL_TARGET`]. None if the smaller job's peak was not above
    /// idle (too small a job to see), where the ratio would divide by zero.
    pub marginal_ratio: Option<f64>,
    /// `tasks_per_s_10m / tasks_per_s_1m`: at least [`RATE_TARGET`].
    pub rate_ratio: f64,
}

/// One job's figures, on a driver of its own.
struct OneJob {
    idle_mb: f64,
    peak_mb: f64,
    after_mb: f64,
    tasks_per_s: f64,
}

pub async fn run(args: &BenchArgs, journal: bool) -> anyhow::Result<Huge> {
    let divisor = if args.quick { QUICK_DIVISOR } else { 1 };
    let (small, large) = (SMALL / divisor, LARGE / divisor);
    let one = one_job(args.executors, small, journal).await?;
    let ten = one_job(args.executors, large, journal).await?;
    let per_task = |mb: f64, tasks: u32| mb / f64::from(tasks);
    let below = per_task(one.peak_mb - one.idle_mb, small);
    let marginal =
        (below > 0.0).then(|| per_task(ten.peak_mb - one.peak_mb, large - small) / below);
    Ok(Huge {
        tasks_1m: small,
        tasks_10m: large,
        executors: args.executors,
        cores: CORES,
        journal,
        rss_idle_mb: one.idle_mb,
        peak_rss_mb_1m: one.peak_mb,
        peak_rss_mb_10m: ten.peak_mb,
        rss_after_mb_1m: one.after_mb,
        rss_after_mb_10m: ten.after_mb,
        tasks_per_s_1m: one.tasks_per_s,
        tasks_per_s_10m: ten.tasks_per_s,
        marginal_ratio: marginal,
        rate_ratio: ten.tasks_per_s / one.tasks_per_s,
    })
}

async fn one_job(executors: u32, tasks: u32, journal: bool) -> anyhow::Result<OneJob> {
    eprintln!("bench: huge, one job of {tasks} no-op tasks on {executors} x {CORES} cores");
    let mut cluster = Cluster::start("huge", journal)?;
    let api = with_executors(&mut cluster, executors, CORES).await?;
    let driver = cluster.driver.id();
    let idle_mb = rss_mb(driver).0;
    let seconds = time_noops(&api, tasks, LIMIT).await?;
    let (after_mb, peak_mb) = rss_mb(driver);
    Ok(OneJob {
        idle_mb,
        peak_mb,
        after_mb,
        tasks_per_s: f64::from(tasks) / seconds,
    })
}

impl Huge {
    /// The workload's row of the table.
    pub fn row(&self) -> [String; 3] {
        let met = |ok: bool| if ok { "met" } else { "not met" };
        [
            format!(
                "huge: one job of {} and one of {} no-op tasks, {} x {} cores{}",
                self.tasks_1m,
                self.tasks_10m,
                self.executors,
                self.cores,
                if self.journal { ", journal on" } else { "" }
            ),
            format!(
                "{:.0} and {:.0} tasks/s; driver RSS {:.1} MB idle, peak {:.1} and {:.1} MB, \
                 after {:.1} and {:.1} MB",
                self.tasks_per_s_1m,
                self.tasks_per_s_10m,
                self.rss_idle_mb,
                self.peak_rss_mb_1m,
                self.peak_rss_mb_10m,
                self.rss_after_mb_1m,
                self.rss_after_mb_10m
            ),
            format!(
                "bytes a task at the larger {} the smaller (<= {MARGINAL_TARGET}: {}); rate \
                 {:.2}x (>= {RATE_TARGET}: {})",
                self.marginal_ratio
                    .map_or("not measured against".into(), |r| format!("{r:.2}x")),
                met(self.marginal_ratio.is_some_and(|r| r <= MARGINAL_TARGET)),
                self.rate_ratio,
                met(self.rate_ratio >= RATE_TARGET)
            ),
        ]
    }
}
