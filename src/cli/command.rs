//! `ember`'s command line: its subcommands, and running the one given.

use super::creds::{creds, CredsArgs};
use super::events::{events, EventsArgs};
use super::limits::{limits, LimitsArgs};
use super::objects::{objects, put, ObjectsCommand, PutArgs};
use super::results::{results, ResultsArgs};
use super::sim::{sim, SimArgs};
use super::status::{status, StatusArgs};
use super::submit::{submit, SubmitArgs};
use super::up::{up, UpArgs};
use super::view::{show_executors, show_jobs, show_pools};
use super::{shutdown_signal, stop_or_hangup_signal, CLI_LOG};
use crate::bench::{bench, BenchArgs};
use crate::client::EmberClient;
use crate::connect::NatsArgs;
use crate::ids::ExecutorId;
use clap::{Parser, Subcommand};

/// Ember: Spark's driver/executor loop on NATS. Start a cluster with `ember up`, or run
/// ember-driver and ember-executor yourself; then follow `ember events` and `ember submit` jobs.
#[derive(Parser)]
#[command(version)]
pub struct Cli {
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size of its largest variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Command {
    /// Start a local nats-server, a driver and N executors; print events until Ctrl-C.
    Up(UpArgs),
    /// Follow the cluster's events (ember.<cluster>.events.>) and read their history: with
    /// a journal, the driver keeps them in the stream EMBER_<cluster>_EVENTS, which
    /// --since and --from-start read from, and which live following resumes on without a gap
    /// after a nats-server restart or a driver failover.
    Events(EventsArgs),
    /// Show the executor registry and its totals.
    Executors {
        /// Print the registry as one JSON object (the driver's `Executors` answer) instead of
        /// a table.
        #[arg(long)]
        json: bool,
    },
    /// Submit a job, show its progress and wait for it; exits 0 only if it succeeded.
    Submit(SubmitArgs),
    /// Put files into the cluster's object store (EMBER_<cluster>_OBJECTS, made by a driver
    /// with a journal) and print each one's reference, which tasks name to read it.
    Put(PutArgs),
    /// The cluster's object store: list, describe or read its objects.
    #[command(subcommand)]
    Objects(ObjectsCommand),
    /// The cluster at a glance: driver, executors and cores, running jobs with their
    /// progress, tasks per second; once, or refreshed in place with --watch.
    Status(StatusArgs),
    /// A job's task outcomes, one JSON line each; with --output-dir, its results and its
    /// tasks' outputs written to files instead.
    Results(ResultsArgs),
    /// List jobs with their state and counts.
    Jobs {
        /// Print the jobs as one JSON object, `{"jobs": [...]}` with a summary per job, instead
        /// of a table.
        #[arg(long)]
        json: bool,
    },
    /// The driver's scheduling mode and, under --scheduling fair, its pools with their weight,
    /// minimum share, mode, cores in use and running jobs, in the order offers serve them.
    Pools {
        /// Print `{"scheduling": ..., "pools": [...]}` instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Concurrency keys: list them with their limits and what runs under each, or set or
    /// clear one's limits. A job names its key with `ember submit --concurrency-key`.
    Limits(LimitsArgs),
    /// Kill a running job: its waiting tasks are dropped and running ones killed. With
    /// --task, kill one task only: it ends KILLED and is not run again (the job ends once its
    /// other tasks have, KILLED), or with --retry its running attempt is stopped and it runs
    /// again.
    Kill {
        /// The job's id.
        job_id: u64,
        /// Kill only this task (its index in the job, from 0).
        #[arg(long, value_name = "INDEX")]
        task: Option<u32>,
        /// Run the killed task again (with --task; for a running task).
        #[arg(long, requires = "task")]
        retry: bool,
    },
    /// Decommission one executor: it finishes (or hands back) its tasks and exits.
    StopExecutor {
        /// The executor's id.
        #[arg(value_parser = |s: &str| ExecutorId::parse(s))]
        executor_id: ExecutorId,
    },
    /// Release an idle executor, as dynamic allocation does: it is decommissioned only if it
    /// runs no task (else this fails, and it stays).
    ReleaseExecutor {
        /// The executor's id.
        #[arg(value_parser = |s: &str| ExecutorId::parse(s))]
        executor_id: ExecutorId,
    },
    /// Decommission every executor of the cluster.
    Shutdown,
    /// Print the NATS account of a locked-down cluster (see nats-secure.conf and
    /// docs/security.md): a driver, a client, a listener and one user per executor, each named
    /// `<cluster>.<role or id>`; several clusters' accounts share one server.
    Creds(CredsArgs),
    /// Run the standard workloads against a cluster of its own, beside the broker alone.
    Bench(BenchArgs),
    /// Simulate a whole cluster with faults, deterministically from a seed (no NATS needed).
    Sim(SimArgs),
}

/// The command line; `ember up` joins the server of a `--nats-url` or `--context` given on it.
/// One from `EMBER_NATS_URL` or `EMBER_CONTEXT` does not count: an environment set for the other
/// commands (as the demo's) may still start a server with `ember up --port`.
pub fn parse() -> Cli {
    use clap::{parser::ValueSource, CommandFactory, FromArgMatches};
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Command::Up(args) = &mut cli.command {
        let given = |m: &clap::ArgMatches| {
            ["nats_url", "context"]
                .iter()
                .any(|id| m.value_source(id) == Some(ValueSource::CommandLine))
        };
        args.join = given(&matches) || matches.subcommand_matches("up").is_some_and(given);
    }
    cli
}

impl Cli {
    /// The log filter when `RUST_LOG` is not set. A simulation's executors warn as real ones
    /// would, thousands of times a run: errors only.
    pub fn log_filter(&self) -> &'static str {
        match self.command {
            Command::Sim(_) => "error",
            _ => CLI_LOG,
        }
    }
}

/// Runs the command `cli` names: `Ok(false)` when it ran and says it failed (a job that did not
/// succeed, a simulation that broke an invariant).
pub async fn dispatch(cli: Cli) -> anyhow::Result<bool> {
    if let Command::Up(args) = &cli.command {
        if args.exit_with_stdin {
            let stdin_ended = super::stdin_ended();
            let stop = async {
                tokio::select! {
                    () = shutdown_signal() => {}
                    () = stdin_ended => eprintln!("standard input ended: stopping"),
                }
            };
            up(args, &cli.nats, stop).await?;
        } else {
            up(args, &cli.nats, shutdown_signal()).await?;
        }
        return Ok(true);
    }
    if let Command::Bench(args) = &cli.command {
        bench(args).await?;
        return Ok(true);
    }
    if let Command::Sim(args) = &cli.command {
        return Ok(sim(args));
    }
    if let Command::Creds(args) = &cli.command {
        print!("{}", creds(args, &cli.nats.cluster)?);
        return Ok(true);
    }
    let subjects = cli.nats.subjects()?;
    // Events are read with a listener's rights, whose answers come to an inbox of its own.
    let inbox = matches!(cli.command, Command::Events(_))
        .then(|| crate::subjects::Subjects::LISTENER_INBOX.to_string());
    let nats = cli.nats.connect("ember", inbox).await?;
    let client = EmberClient::new(nats.clone(), subjects.clone());
    match cli.command {
        Command::Up(_) | Command::Bench(_) => unreachable!("handled above"),
        Command::Creds(_) | Command::Sim(_) => unreachable!("handled above"),
        Command::Events(args) => events(&nats, &subjects, &args, stop_or_hangup_signal()).await?,
        Command::Executors { json } => show_executors(&client, json).await?,
        Command::Jobs { json } => show_jobs(&client, json).await?,
        Command::Results(args) => results(&client, &args).await?,
        Command::Pools { json } => show_pools(&client, json).await?,
        Command::Limits(args) => limits(&client, &args).await?,
        Command::Status(args) => {
            status(&client, &cli.nats.cluster, &args, shutdown_signal()).await?
        }
        Command::Submit(args) => return submit(&client, &args).await,
        Command::Put(args) => put(&client, &args).await?,
        Command::Objects(command) => return objects(&client, &command).await,
        Command::Kill {
            job_id, task: None, ..
        } => {
            client.kill(job_id).await?;
            println!("job {job_id} killed");
        }
        Command::Kill {
            job_id,
            task: Some(index),
            retry,
        } => {
            match (client.kill_task(job_id, index, retry).await?, retry) {
                (None, _) => println!("task {index} of job {job_id} killed before it ran"),
                (Some(attempt), false) => {
                    println!("task {index} of job {job_id}: attempt {attempt} told to stop; it will not run again")
                }
                (Some(attempt), true) => {
                    println!("task {index} of job {job_id}: attempt {attempt} told to stop; it runs again")
                }
            }
        }
        Command::StopExecutor { executor_id } => {
            client.stop_executors(Some(executor_id.clone())).await?;
            println!("executor {executor_id} is decommissioning");
        }
        Command::ReleaseExecutor { executor_id } => {
            client.release_executor(executor_id.clone()).await?;
            println!("executor {executor_id} is idle and decommissioning");
        }
        Command::Shutdown => {
            let n = client.stop_executors(None).await?;
            println!("{n} executors are decommissioning");
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    /// Clap's own checks of the command line, and a help text for every flag.
    #[test]
    fn the_command_line_passes_clap_s_checks_and_explains_every_flag() {
        use clap::CommandFactory;
        crate::cli::check_command_line(super::Cli::command());
    }
}
