//! The wide workload: many small executors and many queued jobs at once, for what the
//! scheduler costs per offer round when it has a lot to choose from.
//!
//! N executors of 1 core each run in this process (each its own NATS connection, on a runtime
//! of their own), J jobs are submitted at once, and the run lasts until every job has ended.
//! The driver's CPU time and its offer rounds (from its metrics endpoint) over that span give
//! the cost per task and per round.

use super::procs::{cpu_seconds, metric, Cluster};
use super::workloads::{connect, wait_for_executors};
use crate::driver::core::SchedulingMode;
use crate::executor::{run, ExecutorConfig, Handlers};
use crate::ids::ExecutorId;
use crate::protocol::{decode, Event, JobState};
use crate::server::free_port;
use crate::subjects::Subjects;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// The driver's count of offer rounds, read from its metrics endpoint.
const ROUNDS: &str = "ember_driver_offer_rounds_total";

/// How long the jobs may take before the workload gives up.
const LIMIT: Duration = Duration::from_secs(600);

/// Under `--scheduling fair`, the jobs go round this many pools (undeclared: weight 1, no
/// minimum share), so that an offer round orders pools as well as jobs.
pub const FAIR_POOLS: u32 = 10;

#[derive(Debug, Serialize, Deserialize)]
pub struct Wide {
    pub executors: usize,
    pub jobs: u32,
    pub tasks: u32,
    /// The driver's `--scheduling`: `fifo` or `fair`.
    #[serde(default = "fifo")]
    pub scheduling: String,
    /// The pools the jobs went round (under fair), or 0.
    #[serde(default)]
    pub pools: u32,
    pub seconds: f64,
    pub tasks_per_s: f64,
    /// Offer rounds the driver made while the jobs ran.
    pub offer_rounds: u64,
    /// The driver's CPU time over the run, per task and per offer round.
    pub driver_cpu_us_per_task: f64,
    pub driver_cpu_us_per_round: f64,
}

fn fifo() -> String {
    SchedulingMode::Fifo.as_str().into()
}

/// Runs `tasks` no-op tasks in `jobs` jobs submitted at once on `executors` executors of one
/// core, all in this process, against a driver that journals or not and schedules as
/// `scheduling` says (under fair, the jobs go round [`FAIR_POOLS`] pools).
pub async fn run_wide(
    executors: usize,
    jobs: u32,
    tasks: u32,
    scheduling: SchedulingMode,
    journal: bool,
) -> anyhow::Result<Wide> {
    let metrics = free_port()?;
    let metrics_arg = format!("127.0.0.1:{metrics}");
    let driver_args = [
        "--metrics-addr",
        &metrics_arg,
        "--scheduling",
        scheduling.as_str(),
    ];
    let cluster = Cluster::start_with("wide", journal, &driver_args)?;
    let pools = match scheduling {
        SchedulingMode::Fair => FAIR_POOLS.min(jobs),
        SchedulingMode::Fifo => 0,
    };
    let api = connect(&cluster).await?;
    let host = Executors::start(&cluster, executors)?;
    wait_for_executors(&api, executors as u64).await?;
    let subjects = Subjects::new(&cluster.cluster).map_err(anyhow::Error::msg)?;
    let mut ends = api.nats().subscribe(subjects.event("job.end")).await?;
    api.nats().flush().await?;

    let per_job = (tasks / jobs).max(1);
    let rounds_before = metric(metrics, ROUNDS).await?;
    let cpu_before = cpu_seconds(cluster.driver.id());
    let started = Instant::now();
    let mut waiting = HashSet::new();
    for i in 0..jobs {
        let job = crate::protocol::SubmitJob {
            pool: (pools > 0).then(|| format!("wide-{}", i % pools)),
            ..super::noops(per_job)
        };
        waiting.insert(api.submit(job).await?);
    }
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !waiting.is_empty() {
        let message = tokio::time::timeout_at(deadline, ends.next())
            .await
            .map_err(|_| anyhow::anyhow!("{} jobs had not ended in {LIMIT:?}", waiting.len()))?
            .ok_or_else(|| anyhow::anyhow!("events closed"))?;
        if let Ok(Event::JobEnd {
            job_id,
            state,
            succeeded,
            ..
        }) = decode(&message.payload, usize::MAX)
        {
            if waiting.remove(&job_id) {
                anyhow::ensure!(
                    state == JobState::Succeeded && succeeded == per_job,
                    "job {job_id} ended {state:?} with {succeeded} of {per_job} tasks"
                );
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(cluster.driver.id()) - cpu_before;
    let offer_rounds = metric(metrics, ROUNDS).await? - rounds_before;
    drop(host);
    let tasks = per_job * jobs;
    Ok(Wide {
        executors,
        jobs,
        tasks,
        scheduling: scheduling.as_str().into(),
        pools,
        seconds,
        tasks_per_s: f64::from(tasks) / seconds,
        offer_rounds,
        driver_cpu_us_per_task: cpu * 1e6 / f64::from(tasks),
        driver_cpu_us_per_round: cpu * 1e6 / offer_rounds.max(1) as f64,
    })
}

/// Executors of one core each, served by a runtime of their own until dropped.
struct Executors {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Executors {
    fn start(cluster: &Cluster, n: usize) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let subjects = Subjects::new(&cluster.cluster).map_err(anyhow::Error::msg)?;
        for i in 0..n {
            let id = ExecutorId::parse(format!("wide-{i}")).map_err(anyhow::Error::msg)?;
            let url = cluster.server.url();
            let config = ExecutorConfig::new(subjects.clone(), id.clone(), "bench:0".into(), 1);
            runtime.spawn(async move {
                let client = async_nats::ConnectOptions::new()
                    .custom_inbox_prefix(Subjects::executor_reply_prefix(&id))
                    .connect(url)
                    .await;
                match client {
                    Ok(client) => {
                        let stop = futures::future::pending::<()>();
                        if let Err(error) = run(client, config, Handlers::builtin(), stop).await {
                            eprintln!("bench: executor {id}: {error}");
                        }
                    }
                    Err(error) => eprintln!("bench: executor {id} could not connect: {error}"),
                }
            });
        }
        Ok(Self {
            runtime: Some(runtime),
        })
    }
}

impl Drop for Executors {
    fn drop(&mut self) {
        // Called from async code, where a runtime may not block to shut down.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
