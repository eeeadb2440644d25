//! The soak workload: many jobs back to back on one driver that keeps only a few, as a
//! long-lived service runs. Jobs of no-op tasks alternate with jobs of commands that print
//! 32 KiB each; the report says what the driver's memory and the journal's bytes do once
//! retention forgets jobs, and how long a SIGKILLed driver's replacement takes to answer.

use super::procs::{rss_mb, Cluster};
use super::workloads::with_executors;
use super::{noops, BenchArgs};
use crate::client::EmberClient;
use crate::protocol::{SubmitJob, TaskSpec};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(600);
/// The soak driver's `--snapshot-after`.
pub const SOAK_SNAPSHOT_AFTER: &str = "1MiB";
/// The soak driver's `--lease`: its replacement waits out the killed driver's lease (and a
/// fifth) before it leads, and that wait is part of the time to its first answer.
pub const SOAK_LEASE: &str = "500ms";

/// Bytes each command task prints.
const OUTPUT_BYTES: usize = 32 * 1024;

#[derive(Debug, Serialize, Deserialize)]
pub struct Soak {
    pub jobs: u32,
    pub retain_jobs: u32,
    pub noop_tasks: u32,
    pub command_tasks: u32,
    /// Driver RSS once the first `retain_jobs` jobs have ended (nothing forgotten yet).
    pub rss_after_retained_mb: f64,
    pub rss_after_last_mb: f64,
    /// `rss_after_last_mb / rss_after_retained_mb`.
    pub rss_ratio: f64,
    /// The journal stream's bytes at the same two points, and the most after the first.
    pub journal_bytes_after_retained: u64,
    pub journal_bytes_after_last: u64,
    pub journal_bytes_max: u64,
    /// From starting the replacement of a SIGKILLed driver to its first answer: the killed
    /// driver's lease lapsing ([`SOAK_LEASE`] and a fifth), then the replay.
    pub restart_ms: f64,
    pub seconds: f64,
}

/// A job of `tasks` commands that each print `OUTPUT_BYTES`.
fn printers(tasks: u32) -> SubmitJob {
    let script = format!("head -c {OUTPUT_BYTES} /dev/zero | tr '\\0' x");
    SubmitJob {
        name: "soak-print".into(),
        repeat: tasks,
        max_failures: 4,
        ..SubmitJob::new(vec![TaskSpec::Command {
            argv: vec!["sh".into(), "-c".into(), script],
            env: Default::default(),
            cwd: None,
            timeout_ms: None,
            inputs: Default::default(),
            outputs: Vec::new(),
        }])
    }
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<Soak> {
    let retain = args.soak_retain.to_string();
    let started = Instant::now();
    // Snapshots at 1 MiB rather than the default 8: the 40 jobs' records (about 100 KB a job)
    // then go through several snapshots, and the report shows the journal bounded by them.
    let flags = [
        "--retain-jobs",
        &retain,
        "--snapshot-after",
        SOAK_SNAPSHOT_AFTER,
        "--lease",
        SOAK_LEASE,
    ];
    let mut cluster = Cluster::start_with("soak", true, &flags)?;
    let cores = args.cores.iter().copied().max().unwrap_or(1);
    let api = with_executors(&mut cluster, args.executors, cores).await?;
    let jobs = 2 * args.soak_jobs;
    let (mut retained, mut journal_max) = ((0.0, 0), 0);
    for n in 1..=jobs {
        let (job, tasks) = match n % 2 {
            1 => (noops(args.soak_noop_tasks), args.soak_noop_tasks),
            _ => (printers(args.soak_command_tasks), args.soak_command_tasks),
        };
        let summary = tokio::time::timeout(LIMIT, api.run_job(job, |_| {})).await??;
        anyhow::ensure!(
            summary.succeeded == tasks,
            "soak job {n} did not succeed: {summary:?}"
        );
        let bytes = journal_bytes(&api, &cluster).await?;
        if n == args.soak_retain {
            retained = (rss_mb(cluster.driver.id()).0, bytes);
        }
        if n >= args.soak_retain {
            journal_max = journal_max.max(bytes);
        }
    }
    let last = (
        rss_mb(cluster.driver.id()).0,
        journal_bytes(&api, &cluster).await?,
    );
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("bench: soak: SIGKILL the driver and time its replacement");
    let restart = restart(&mut cluster, &api, jobs.into()).await?;
    Ok(Soak {
        jobs,
        retain_jobs: args.soak_retain,
        noop_tasks: args.soak_noop_tasks,
        command_tasks: args.soak_command_tasks,
        rss_after_retained_mb: retained.0,
        rss_after_last_mb: last.0,
        rss_ratio: last.0 / retained.0.max(f64::MIN_POSITIVE),
        journal_bytes_after_retained: retained.1,
        journal_bytes_after_last: last.1,
        journal_bytes_max: journal_max,
        restart_ms: restart.as_secs_f64() * 1000.0,
        seconds,
    })
}

/// The bytes the journal stream holds.
async fn journal_bytes(api: &EmberClient, cluster: &Cluster) -> anyhow::Result<u64> {
    let subjects = crate::subjects::Subjects::new(&cluster.cluster).map_err(anyhow::Error::msg)?;
    let jetstream = async_nats::jetstream::new(api.nats().clone());
    let mut stream = jetstream.get_stream(subjects.journal_stream()).await?;
    Ok(stream.info().await?.state.bytes)
}

/// SIGKILLs the driver, starts another, and times it to its first answer about `last_job`.
async fn restart(
    cluster: &mut Cluster,
    api: &EmberClient,
    last_job: u64,
) -> anyhow::Result<Duration> {
    cluster.replace_driver()?;
    let started = Instant::now();
    loop {
        if let Ok(job) = api.job(last_job).await {
            anyhow::ensure!(
                job.job_id == last_job,
                "the restored driver answered {job:?}"
            );
            return Ok(started.elapsed());
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "the replacement driver did not answer within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
