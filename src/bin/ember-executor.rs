//! `ember-executor`: registers with the driver and runs the tasks it is offered. Run many.

use clap::Parser;
use ember::cli::{
    init_tracing, parse_duration, parse_key_value, parse_wait, runtime, shutdown_signal, to_map,
};
use ember::connect::NatsArgs;
use ember::executor::{
    run, ExecutorConfig, ExecutorError, Handlers, PythonConfig, DEFAULT_INTERPRETER,
    EXIT_REGISTRATION_REFUSED,
};
use ember::ids::{validate_host_port, ExecutorId};
use ember::metrics::ExecutorMetrics;
use ember::protocol::MAX_CORES;
use ember::subjects::Subjects;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// An Ember executor: subscribes its inbox (ember.<cluster>.executor.<id>), registers with the
/// driver, runs the tasks it is sent on its cores and reports their status. On SIGINT/SIGTERM
/// it decommissions (finishes or hands back its tasks) and exits 0. Exits 1 if the driver
/// refuses it (a duplicate id, say) or none answers within --register-timeout; 56 if the driver
/// is lost and --exit-on-driver-loss is set.
#[derive(Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    nats: NatsArgs,
    /// This executor's id: letters, digits, '_' and '-', at most 64 [default: a new UUID].
    #[arg(long, env = "EMBER_EXECUTOR_ID", value_parser = |s: &str| ExecutorId::parse(s))]
    executor_id: Option<ExecutorId>,
    /// Cores to offer [default: this machine's].
    #[arg(long, env = "EMBER_CORES", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CORES)))]
    cores: Option<u32>,
    /// host:port others can reach this executor at, shown in the registry [default: <hostname>:0].
    #[arg(long, env = "EMBER_HOST_PORT")]
    host_port: Option<String>,
    /// A log URL, as NAME=URL (repeatable), e.g. --log-url stderr=http://host/logs/stderr.
    #[arg(long = "log-url", value_parser = parse_key_value)]
    log_urls: Vec<(String, String)>,
    /// A free-form attribute, as KEY=VALUE (repeatable).
    #[arg(long = "attribute", value_parser = parse_key_value)]
    attributes: Vec<(String, String)>,
    /// A custom resource beside cores (repeatable): NAME=COUNT offers addresses 0 to COUNT-1
    /// (--resource gpu=2), NAME=A,B,.. those addresses (--resource gpu=0,3; one as gpu=3,).
    /// A task that asks for some sees their addresses in EMBER_RESOURCE_<NAME>.
    #[arg(long = "resource", value_name = "NAME=COUNT", value_parser = ember::resources::parse_executor_flag)]
    resources: Vec<(String, Vec<String>)>,
    /// How long to keep trying to register while no driver answers.
    #[arg(long, env = "EMBER_REGISTER_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    register_timeout: Duration,
    /// How often to send the driver a heartbeat.
    #[arg(long, env = "EMBER_HEARTBEAT_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    heartbeat_interval: Duration,
    /// With no answer from the driver for this long, count it lost and register again with
    /// whichever driver comes up next (or exit, with --exit-on-driver-loss).
    #[arg(long, env = "EMBER_DRIVER_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    driver_timeout: Duration,
    /// On SIGTERM or a stop from the driver: how long running tasks may finish before they are
    /// handed back to run elsewhere (0s: hand them back at once).
    #[arg(long, env = "EMBER_DECOMMISSION_TIMEOUT", default_value = "30s", value_parser = parse_wait)]
    decommission_timeout: Duration,
    /// Exit with code 56 when the driver is lost, instead of waiting for the next one.
    #[arg(long, env = "EMBER_EXIT_ON_DRIVER_LOSS")]
    exit_on_driver_loss: bool,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (OpenMetrics text): tasks
    /// running, cores total and free, tasks launched and ended, task run times, statuses and
    /// status batches, registrations, and slow-consumer events. Off unless given (port 0 picks
    /// a free port and logs it).
    #[arg(long, env = "EMBER_METRICS_ADDR", value_name = "HOST:PORT")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// The Python interpreter that runs python tasks, a name on PATH or a path. It needs
    /// cloudpickle to run functions that were pickled by value (lambdas, functions of
    /// __main__).
    #[arg(long, env = "EMBER_PYTHON", default_value = DEFAULT_INTERPRETER, value_parser = parse_interpreter)]
    python: String,
    /// How many warm Python workers to keep, at most [default: one per core]. They start on
    /// the first python task and stay for the next.
    #[arg(long, env = "EMBER_PYTHON_WORKERS", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CORES)))]
    python_workers: Option<u32>,
    /// Refuse python tasks: each fails with a message that says so. Unpickling runs code, so a
    /// cluster whose clients must not run arbitrary Python on it sets this.
    #[arg(long, env = "EMBER_NO_PYTHON", conflicts_with_all = ["python_workers"])]
    no_python: bool,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "EMBER_LOG_JSON")]
    log_json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_tracing(args.log_json, ember::cli::SERVICE_LOG);
    let executor_id = args
        .executor_id
        .clone()
        .unwrap_or_else(ExecutorId::generate);
    let host_port = args.host_port.clone().unwrap_or_else(default_host_port);
    if let Err(message) = validate_host_port(&host_port) {
        eprintln!("ember-executor: --host-port: {message}");
        return ExitCode::from(2);
    }
    let resources = match ember::resources::gather(args.resources.clone()) {
        Ok(resources) => resources,
        Err(message) => {
            eprintln!("ember-executor: {message}");
            return ExitCode::from(2);
        }
    };
    if resources.len() > ember::resources::MAX_RESOURCES {
        let max = ember::resources::MAX_RESOURCES;
        eprintln!("ember-executor: --resource: at most {max} resources");
        return ExitCode::from(2);
    }
    let cores = args
        .cores
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
    let result = runtime().map_err(anyhow::Error::from).and_then(|rt| {
        rt.block_on(async {
            let subjects = args.nats.subjects()?;
            let metrics = Arc::new(ExecutorMetrics::new());
            if let Some(addr) = args.metrics_addr {
                ember::metrics::serve(addr, metrics.clone())
                    .await
                    .map_err(|e| anyhow::anyhow!("could not serve metrics on {addr}: {e}"))?;
            }
            let prefix = Subjects::executor_reply_prefix(&executor_id);
            let slow_consumers = metrics.slow_consumers.clone();
            let client = args
                .nats
                .connect_counting("ember-executor", Some(prefix), slow_consumers)
                .await?;
            let config = ExecutorConfig {
                log_urls: to_map(&args.log_urls),
                attributes: to_map(&args.attributes),
                resources,
                register_timeout: args.register_timeout,
                heartbeat_interval: args.heartbeat_interval,
                driver_timeout: args.driver_timeout,
                decommission_timeout: args.decommission_timeout,
                exit_on_driver_loss: args.exit_on_driver_loss,
                metrics,
                python: (!args.no_python).then(|| PythonConfig {
                    interpreter: args.python.clone(),
                    workers: args.python_workers.unwrap_or(0),
                }),
                ..ExecutorConfig::new(subjects, executor_id, host_port, cores)
            };
            run(client, config, Handlers::builtin(), shutdown_signal()).await?;
            Ok(())
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ember-executor: {error:#}");
            match error.downcast_ref::<ExecutorError>() {
                Some(ExecutorError::Refused(_)) => ExitCode::from(EXIT_REGISTRATION_REFUSED as u8),
                Some(ExecutorError::DriverLost(_)) => ExitCode::from(ember::EXIT_DRIVER_LOST as u8),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// `--python`: not empty.
fn parse_interpreter(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("name an interpreter, such as python3".into());
    }
    Ok(s.to_string())
}

fn default_host_port() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}:0")
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
