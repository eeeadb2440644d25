//! `ember submit`: builds a job from flags, submits it, shows progress, waits for the end and
//! prints a summary (with `--json`, one JSON object as the last line).

use crate::client::EmberClient;
use crate::objects::ObjectRef;
use crate::protocol::{JobState, JobSummary, SubmitJob, TaskSpec};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use std::collections::BTreeMap;
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
    #[command(flatten)]
    pub speculation: super::speculation::SpeculationArgs,
    #[command(flatten)]
    pub backoff: super::backoff::BackoffArgs,
    #[command(flatten)]
    pub timeouts: super::timeouts::TimeoutArgs,
    /// Count this job's running tasks under a concurrency key (1 to 64 letters, digits, '_',
    /// '-' or '.'): the tasks of all jobs that name it stay within the limits `ember limits
    /// set KEY` gives it (a key with none runs unlimited).
    #[arg(long, value_name = "KEY", value_parser = parse_concurrency_key)]
    pub concurrency_key: Option<String>,
    /// Start all the job's tasks together or not at all (Spark's barrier mode), for tasks
    /// that talk to each other: the cores that free up are held for the gang until it fits,
    /// and when one task fails or is lost the others stop and all run again together. A gang
    /// the registered executors could never hold at once is refused.
    #[arg(long, conflicts_with = "speculation")]
    pub gang: bool,
    /// Cores each task takes.
    #[arg(long, default_value_t = 1)]
    pub cpus_per_task: u32,
    /// A custom resource each task needs, as NAME=COUNT (repeatable), e.g. --resource gpu=1:
    /// tasks run only where that many are free, and see their addresses in
    /// EMBER_RESOURCE_<NAME>.
    #[arg(long = "resource", value_name = "NAME=COUNT", value_parser = crate::resources::parse_request_flag)]
    pub resources: Vec<(String, u32)>,
    /// Run only on executors whose attributes (ember-executor --attribute) meet this
    /// (repeatable; all must hold): KEY=VALUE, KEY!=VALUE, 'KEY in (A,B)' or 'KEY not in (A,B)'.
    /// An executor without the attribute fails = and in, and meets != and not in.
    #[arg(long = "constraint", value_name = "CONSTRAINT", value_parser = crate::placement::parse_constraint_flag)]
    pub constraints: Vec<String>,
    /// Prefer this executor (repeatable): tasks wait up to --locality-wait for a free slot on a
    /// preferred executor or host before they take any other.
    #[arg(long = "prefer-executor", value_name = "ID", value_parser = parse_executor_id)]
    pub prefer_executors: Vec<crate::ids::ExecutorId>,
    /// Prefer the executors on this host (repeatable), as --prefer-executor does.
    #[arg(long = "prefer-host", value_name = "HOST", value_parser = crate::placement::parse_host_flag)]
    pub prefer_hosts: Vec<String>,
    /// Prefer the executors at this site (ember-executor --site; repeatable), as
    /// --prefer-executor does; --constraint site=NAME requires it instead.
    #[arg(long = "prefer-site", value_name = "SITE", value_parser = crate::placement::parse_site_flag)]
    pub prefer_sites: Vec<String>,
    /// How long tasks wait for a slot on a preferred executor or host, since the job last
    /// launched on one, before they take any executor (Spark's spark.locality.wait); 0 takes any
    /// at once. [default: 3s]
    #[arg(long, value_parser = super::parse_wait)]
    pub locality_wait: Option<std::time::Duration>,
    /// The pool to run in under the driver's --scheduling fair (letters, digits, '_', '-',
    /// '.'); none: the pool named default.
    #[arg(long)]
    pub pool: Option<String>,
    /// Higher runs before lower among the jobs the driver orders FIFO (-1000 to 1000; ties go
    /// to the older job).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-1000..=1000))]
    pub priority: i32,
    /// Kill a command task after this long (e.g. 30s).
    #[arg(long, value_parser = super::parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// The job's name.
    #[arg(long, default_value = "")]
    pub name: String,
    /// A key that makes the submission safe to run again (1 to 64 letters, digits, '_', '-',
    /// '.'): while the driver keeps the job a submission with this key made, the same
    /// submission again waits for that job rather than making another. Without it, each run
    /// gets a new key, and is sent again with it through a driver failover.
    #[arg(long, value_name = "KEY")]
    pub submission_id: Option<String>,
    /// Run after job JOB has succeeded (repeatable): the job waits (WAITING, holding no cores)
    /// until every job named has succeeded, then runs; if one fails or is killed, it ends FAILED
    /// without running anything, naming that job. Only jobs the driver keeps may be named.
    #[arg(long = "after", value_name = "JOB")]
    pub after: Vec<crate::ids::JobId>,
    /// Run after job JOB has ended, however it ended (repeatable): for clean-up and
    /// notification jobs.
    #[arg(long = "after-any", value_name = "JOB")]
    pub after_any: Vec<crate::ids::JobId>,
    /// Print the job's id and exit once the driver has accepted it, without waiting for it to
    /// end (with --json, {"job_id": N}): for jobs that others run --after.
    #[arg(long, conflicts_with = "results")]
    pub detach: bool,
    /// Print every task's outcome when the job ends.
    #[arg(long)]
    pub results: bool,
    /// Print the summary as one JSON object (job_id, state, tasks, succeeded, failed, elapsed_ms).
    #[arg(long)]
    pub json: bool,
    /// A file the command finds in its directory when it starts, read-only (repeatable):
    /// NAME=PATH puts the local file PATH into the cluster's object store first (sending
    /// nothing the store holds already); NAME=REF names an object already there, by the
    /// reference `ember put` printed. NAME is a path inside the task's directory.
    #[arg(long = "input", value_name = "NAME=PATH|REF", value_parser = parse_input)]
    pub inputs: Vec<(String, String)>,
    /// Files to keep that the command leaves in its directory (repeatable): a pattern of
    /// paths there, `*` and `?` matching within one part (e.g. 'out/*.json'). When the
    /// command succeeds, each file matched goes into the object store, and the task's result
    /// names its reference under "outputs".
    #[arg(long = "output", value_name = "PATTERN")]
    pub outputs: Vec<String>,
    /// A command to run as each task (after `--`); $EMBER_TASK_INDEX tells tasks apart.
    #[arg(last = true)]
    pub command: Vec<String>,
}

impl SubmitArgs {
    /// The references of the --input flags: each NAME=PATH's file put into the store (what
    /// it holds already is not sent again), each NAME=REF as it is.
    pub async fn inputs(
        &self,
        client: &EmberClient,
    ) -> anyhow::Result<BTreeMap<String, ObjectRef>> {
        let mut inputs = BTreeMap::new();
        if self.inputs.is_empty() {
            return Ok(inputs);
        }
        let objects = client.objects().await?;
        for (name, source) in &self.inputs {
            let path = std::path::Path::new(source);
            let object = match ObjectRef::parse(source) {
                Ok(object) if !path.exists() => object,
                _ => {
                    let put = objects
                        .put_file(path)
                        .await
                        .map_err(|e| anyhow::anyhow!("--input {name}={source}: {e}"))?;
                    put.object
                }
            };
            inputs.insert(name.clone(), object);
        }
        Ok(inputs)
    }

    /// The job these flags describe, its command's inputs given as `inputs`.
    pub fn job(&self, inputs: BTreeMap<String, ObjectRef>) -> anyhow::Result<SubmitJob> {
        if self.command.is_empty() && !(self.inputs.is_empty() && self.outputs.is_empty()) {
            anyhow::bail!("--input and --output are for command tasks: give the command after --");
        }
        for pattern in &self.outputs {
            crate::objects::check_task_path("--output", pattern).map_err(anyhow::Error::msg)?;
        }
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
                inputs,
                outputs: self.outputs.clone(),
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
            pool: self.pool.clone(),
            priority: self.priority,
            speculation: self.speculation.config()?,
            retry_backoff: self.backoff.config()?,
            timeouts: self.timeouts.config()?,
            submission_id: self.submission_id.clone(),
            name,
            tasks: vec![spec],
            repeat: self.tasks,
            max_failures: self.max_failures,
            cpus_per_task: self.cpus_per_task,
            resources: crate::resources::gather(self.resources.clone())
                .map_err(anyhow::Error::msg)?,
            placement: crate::placement::Placement {
                constraints: self.constraints.clone(),
                prefer_executors: self.prefer_executors.clone(),
                prefer_hosts: self.prefer_hosts.clone(),
                prefer_sites: self.prefer_sites.clone(),
                locality_wait_ms: self.locality_wait.map(|w| w.as_millis() as u64),
            },
            after: self.after.clone(),
            after_any: self.after_any.clone(),
            concurrency_key: self.concurrency_key.clone(),
            gang: self.gang,
        })
    }
}

/// `--concurrency-key`: a key as the driver takes it.
fn parse_concurrency_key(text: &str) -> Result<String, String> {
    crate::text::validate_key("concurrency key", text, crate::protocol::MAX_KEY_LEN)?;
    Ok(text.to_string())
}

/// An --input flag: NAME=PATH or NAME=REF, NAME a path inside the task's directory.
fn parse_input(text: &str) -> Result<(String, String), String> {
    let Some((name, source)) = text.split_once('=') else {
        return Err(format!("{text:?} is not NAME=PATH or NAME=REF"));
    };
    crate::objects::check_task_path("input", name)?;
    if source.is_empty() {
        return Err(format!("{text:?} names no file or object after ="));
    }
    Ok((name.to_string(), source.to_string()))
}

fn parse_executor_id(text: &str) -> Result<crate::ids::ExecutorId, String> {
    crate::ids::ExecutorId::parse(text)
}

/// Submits, waits and reports; `Ok(true)` if the job succeeded.
pub async fn submit(client: &EmberClient, args: &SubmitArgs) -> anyhow::Result<bool> {
    let job = args.job(args.inputs(client).await?)?;
    if args.detach {
        let job_id = client.submit(job).await?;
        match args.json {
            true => println!("{}", json!({ "job_id": job_id })),
            false => println!("{job_id}"),
        }
        return Ok(true);
    }
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
        let mut line = json!({
            "job_id": summary.job_id, "state": state, "tasks": summary.tasks,
            "succeeded": summary.succeeded, "failed": summary.failed, "elapsed_ms": elapsed_ms,
        });
        if let Some(copies) = summary.speculative {
            line["speculative"] = json!(copies);
        }
        println!("{line}");
    } else {
        // What the job took, as its driver saw it: a submission sent again with the key of a
        // job that ended long ago has waited for nothing.
        let took_ms = summary.ended_at_ms.map_or(elapsed_ms, |end| {
            end.saturating_sub(summary.submitted_at_ms)
        });
        println!("{}", summary_line(&summary, took_ms));
        if let Some(reason) = &summary.reason {
            println!("reason: {reason}");
        }
        if let Some(copies) = &summary.speculative {
            println!(
                "speculative copies: {} launched, {} finished first",
                copies.launched, copies.won
            );
        }
    }
    Ok(summary.state == JobState::Succeeded)
}

/// A rate is shown only for a job at least this long: over a few milliseconds it means nothing.
pub const RATE_MIN_MS: u64 = 1000;
/// ... and with at least this many tasks succeeded.
pub const RATE_MIN_TASKS: u32 = 10;

/// The summary of an ended job, e.g. `job 7 SUCCEEDED: 1 task, 1 succeeded, 0 failed,
/// 0 killed in 3 ms`, with the rate of succeeded tasks when the job was long and large
/// enough for one to mean something.
pub fn summary_line(summary: &JobSummary, elapsed_ms: u64) -> String {
    let mut line = format!(
        "job {} {}: {}, {} succeeded, {} failed, {} killed in {elapsed_ms} ms",
        summary.job_id,
        summary.state,
        crate::text::count(summary.tasks, "task", "tasks"),
        summary.succeeded,
        summary.failed,
        summary.killed
    );
    if elapsed_ms >= RATE_MIN_MS && summary.succeeded >= RATE_MIN_TASKS {
        let rate = f64::from(summary.succeeded) / (elapsed_ms as f64 / 1000.0);
        line.push_str(&format!(" ({rate:.0} tasks/s)"));
    }
    line
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(tasks: u32, succeeded: u32, failed: u32) -> JobSummary {
        JobSummary {
            pool: None,
            priority: 0,
            speculative: None,
            job_id: 7,
            name: "t".into(),
            state: JobState::Failed,
            tasks,
            succeeded,
            failed,
            killed: 0,
            running: 0,
            submitted_at_ms: 0,
            ended_at_ms: Some(3),
            reason: None,
            waiting: None,
            placement: None,
            waits_for: Vec::new(),
            waits: Vec::new(),
            concurrency_key: None,
            key_limits: None,
        }
    }

    #[test]
    fn a_summary_counts_in_words_and_leaves_out_a_rate_that_means_nothing() {
        assert_eq!(
            summary_line(&ended(1, 0, 1), 3),
            "job 7 FAILED: 1 task, 0 succeeded, 1 failed, 0 killed in 3 ms"
        );
        // Long enough, but too few tasks for a rate.
        assert!(!summary_line(&ended(5, 5, 0), 5000).contains("tasks/s"));
        // Enough tasks, but too short.
        assert!(!summary_line(&ended(500, 500, 0), 20).contains("tasks/s"));
        assert_eq!(
            summary_line(&ended(2000, 2000, 0), 2000),
            "job 7 FAILED: 2000 tasks, 2000 succeeded, 0 failed, 0 killed in 2000 ms (1000 tasks/s)"
        );
    }
}
