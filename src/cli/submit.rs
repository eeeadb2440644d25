//! `ember submit`: builds a job from flags, submits it, shows progress, waits for the end and
//! prints a summary (with `--json`, one JSON object as the last line).

use crate::client::EmberClient;
use crate::protocol::{JobState, JobSummary, SubmitJob, TaskSpec};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::time::Instant;

/// What to run, from the command line.
#[derive(Debug, Clone, clap::Args)]
pub struct SubmitArgs {
    /// How many tasks.
    #[arg(long, default_value_t = 1)]
    pub tasks: u32,
    /// Built-in handler to run when no command is given: noop, sleep, echo, fail, or any name
    /// the executors registered.
    #[arg(long, default_value = "noop")]
    pub kind: String,
    /// The handler's argument as JSON, e.g. '{"ms": 100}' for sleep, '{"value": 1}' for echo.
    #[arg(long, default_value = "null")]
    pub arg: String,
    /// Attempts a task gets before the job fails.
    #[arg(long, default_value_t = crate::DEFAULT_MAX_FAILURES)]
    pub max_failures: u32,
    /// Cores each task takes.
    #[arg(long, default_value_t = 1)]
    pub cpus_per_task: u32,
    /// Kill a command task after this long (e.g. 30s).
    #[arg(long, value_parser = super::parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// The job's name.
    #[arg(long, default_value = "")]
    pub name: String,
    /// Print every task's outcome when the job ends.
    #[arg(long)]
    pub results: bool,
    /// Print the summary as one JSON object (job_id, state, tasks, succeeded, failed, elapsed_ms).
    #[arg(long)]
    pub json: bool,
    /// A command to run as each task (after `--`); $EMBER_TASK_INDEX tells tasks apart.
    #[arg(last = true)]
    pub command: Vec<String>,
}

impl SubmitArgs {
    /// The job these flags describe.
    pub fn job(&self) -> anyhow::Result<SubmitJob> {
        let spec = if self.command.is_empty() {
            let arg: Value = serde_json::from_str(&self.arg)
                .map_err(|e| anyhow::anyhow!("--arg is not JSON: {e}"))?;
            TaskSpec::Handler {
                name: self.kind.clone(),
                arg,
            }
        } else {
            TaskSpec::Command {
                argv: self.command.clone(),
                env: Default::default(),
                cwd: None,
                timeout_ms: self.timeout.map(|t| t.as_millis() as u64),
            }
        };
        let name = if self.name.is_empty() {
            self.command
                .first()
                .cloned()
                .unwrap_or_else(|| self.kind.clone())
        } else {
            self.name.clone()
        };
        Ok(SubmitJob {
            name,
            tasks: vec![spec],
            repeat: self.tasks,
            max_failures: self.max_failures,
            cpus_per_task: self.cpus_per_task,
        })
    }
}

/// Submits, waits and reports; `Ok(true)` if the job succeeded.
pub async fn submit(client: &EmberClient, args: &SubmitArgs) -> anyhow::Result<bool> {
    let job = args.job()?;
    let started = Instant::now();
    let mut progress = Progress::new(job.repeat, args.json);
    let summary = client.run_job(job, |s| progress.update(s)).await?;
    progress.finish();
    let elapsed_ms = started.elapsed().as_millis() as u64;
    if args.results {
        for outcome in client.results(summary.job_id).await? {
            println!("{}", serde_json::to_string(&outcome)?);
        }
    }
    let state = summary.state.to_string();
    if args.json {
        let line = json!({
            "job_id": summary.job_id, "state": state, "tasks": summary.tasks,
            "succeeded": summary.succeeded, "failed": summary.failed, "elapsed_ms": elapsed_ms,
        });
        println!("{line}");
    } else {
        let rate = f64::from(summary.succeeded) / (elapsed_ms.max(1) as f64 / 1000.0);
        println!(
            "job {} {state}: {} tasks, {} succeeded, {} failed, {} killed in {elapsed_ms} ms ({rate:.0} tasks/s)",
            summary.job_id, summary.tasks, summary.succeeded, summary.failed, summary.killed
        );
        if let Some(reason) = &summary.reason {
            println!("reason: {reason}");
        }
    }
    Ok(summary.state == JobState::Succeeded)
}

/// A progress bar on a terminal; a plain line per 10% otherwise; nothing with `--json`.
enum Progress {
    Bar(ProgressBar),
    Lines { total: u32, last_decile: u32 },
    Quiet,
}

impl Progress {
    fn new(total: u32, json: bool) -> Self {
        if json {
            Progress::Quiet
        } else if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(u64::from(total));
            bar.set_style(
                ProgressStyle::with_template("{bar:40} {pos}/{len} tasks {per_sec} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            Progress::Bar(bar)
        } else {
            Progress::Lines {
                total,
                last_decile: 0,
            }
        }
    }

    fn update(&mut self, summary: &JobSummary) {
        let done = summary.succeeded + summary.failed + summary.killed;
        match self {
            Progress::Bar(bar) => bar.set_position(u64::from(done)),
            Progress::Lines { total, last_decile } => {
                let decile = (u64::from(done) * 10 / u64::from((*total).max(1))) as u32;
                if decile > *last_decile {
                    *last_decile = decile;
                    eprintln!("{}% ({done}/{total} tasks)", decile * 10);
                }
            }
            Progress::Quiet => {}
        }
    }

    fn finish(&self) {
        if let Progress::Bar(bar) = self {
            bar.finish();
        }
    }
}
