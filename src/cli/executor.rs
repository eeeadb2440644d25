//! `ember-executor`'s command line: its flags, each default the constant
//! [`ExecutorConfig::new`] takes it from (so `--help` shows what an executor does unless told),
//! how they become an [`ExecutorConfig`], and serving an executor as they say.

use super::{parse_duration, parse_key_value, parse_wait, show_duration, to_map};
use crate::connect::{ConnectError, NatsArgs, Watch};
use crate::executor::{default_interpreter, run, ExecutorConfig, Handlers, PythonConfig};
use crate::ids::{validate_host_port, ExecutorId};
use crate::metrics::ExecutorMetrics;
use crate::objects::cache::DEFAULT_CACHE_BYTES;
use crate::placement::SITE;
use crate::protocol::MAX_CORES;
use crate::resources::MAX_RESOURCES;
use crate::subjects::Subjects;
use crate::{
    DEFAULT_DECOMMISSION_TIMEOUT, DEFAULT_EXECUTOR_TIMEOUT, DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_REGISTER_TIMEOUT,
};
use clap::Parser;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// An Ember executor: subscribes its inbox (ember.<cluster>.executor.<id>), registers with the
/// driver, runs the tasks it is sent on its cores and reports their status. On SIGINT/SIGTERM
/// it decommissions (finishes or hands back its tasks) and exits 0. Exits 1 if the driver
/// refuses it (a duplicate id, say) or none answers within --register-timeout; 56 if the driver
/// is lost and --exit-on-driver-loss is set.
#[derive(Debug, Parser)]
#[command(version)]
pub struct ExecutorArgs {
    #[command(flatten)]
    pub nats: NatsArgs,
    /// This executor's id: letters, digits, '_' and '-', at most 64 [default: a new UUID].
    #[arg(long, env = "EMBER_EXECUTOR_ID", value_parser = |s: &str| ExecutorId::parse(s))]
    pub executor_id: Option<ExecutorId>,
    /// Cores to offer [default: this machine's].
    #[arg(long, env = "EMBER_CORES",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CORES)))]
    pub cores: Option<u32>,
    /// host:port others can reach this executor at, shown in the registry [default: <hostname>:0].
    #[arg(long, env = "EMBER_HOST_PORT")]
    pub host_port: Option<String>,
    /// A log URL, as NAME=URL (repeatable), e.g. --log-url stderr=http://host/logs/stderr.
    #[arg(long = "log-url", value_parser = parse_key_value)]
    pub log_urls: Vec<(String, String)>,
    /// A free-form attribute, as KEY=VALUE (repeatable).
    #[arg(long = "attribute", value_parser = parse_key_value)]
    pub attributes: Vec<(String, String)>,
    /// The site this executor runs at (a data centre, an edge location): the attribute
    /// site=NAME, which jobs require with --constraint site=NAME or prefer with --prefer-site,
    /// and by which `ember status` and the web page group executors.
    #[arg(long, env = "EMBER_SITE", value_parser = crate::placement::parse_site_flag)]
    pub site: Option<String>,
    /// A custom resource beside cores (repeatable): NAME=COUNT offers addresses 0 to COUNT-1
    /// (--resource gpu=2), NAME=A,B,.. those addresses (--resource gpu=0,3; one as gpu=3,).
    /// A task that asks for some sees their addresses in EMBER_RESOURCE_<NAME>.
    #[arg(long = "resource", value_name = "NAME=COUNT",
          value_parser = crate::resources::parse_executor_flag)]
    pub resources: Vec<(String, Vec<String>)>,
    /// The TCP ports reserved for the tasks of gangs (jobs submitted with --gang): auto (one
    /// for each core, chosen by the kernel among the free ones), none (this executor runs no
    /// gang tasks), or a range FIRST-LAST (e.g. 41000-41063, for a firewall that opens those).
    /// The executor holds each bound, so nothing else takes it, and lends one to each gang
    /// task, which sees it in EMBER_GANG_PORT and its peers' host:port in EMBER_GANG_PEERS
    /// (the host from --host-port).
    #[arg(long, env = "EMBER_GANG_PORTS", value_name = "auto|none|FIRST-LAST",
          default_value = "auto",
          value_parser = crate::executor::GangPortsConfig::parse)]
    pub gang_ports: crate::executor::GangPortsConfig,
    /// How long to keep trying to register while no driver answers.
    #[arg(long, env = "EMBER_REGISTER_TIMEOUT",
          default_value = show_duration(DEFAULT_REGISTER_TIMEOUT),
          value_parser = parse_duration)]
    pub register_timeout: Duration,
    /// How often to send the driver a heartbeat.
    #[arg(long, env = "EMBER_HEARTBEAT_INTERVAL",
          default_value = show_duration(DEFAULT_HEARTBEAT_INTERVAL),
          value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
    /// With no answer from the driver for this long, count it lost and register again with
    /// whichever driver comes up next (or exit, with --exit-on-driver-loss).
    #[arg(long, env = "EMBER_DRIVER_TIMEOUT",
          default_value = show_duration(DEFAULT_EXECUTOR_TIMEOUT),
          value_parser = parse_duration)]
    pub driver_timeout: Duration,
    /// On SIGTERM or a stop from the driver: how long running tasks may finish before they are
    /// handed back to run elsewhere (0s: hand them back at once).
    #[arg(long, env = "EMBER_DECOMMISSION_TIMEOUT",
          default_value = show_duration(DEFAULT_DECOMMISSION_TIMEOUT),
          value_parser = parse_wait)]
    pub decommission_timeout: Duration,
    /// Exit with code 56 when the driver is lost, instead of waiting for the next one.
    #[arg(long, env = "EMBER_EXIT_ON_DRIVER_LOSS")]
    pub exit_on_driver_loss: bool,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (OpenMetrics text): tasks
    /// running, cores total and free, tasks launched and ended, task run times, statuses and
    /// status batches, registrations, and slow-consumer events. Off unless given (port 0 picks
    /// a free port and logs it).
    #[arg(long, env = "EMBER_METRICS_ADDR", value_name = "HOST:PORT")]
    pub metrics_addr: Option<SocketAddr>,
    /// The Python interpreter that runs python tasks, a name on PATH or a path. It needs the
    /// clients' cloudpickle to run functions that were pickled by value (lambdas, functions of
    /// __main__) [default: the `python` beside this executable if there is one, as in a
    /// virtualenv Ember was installed into with pip, else python3 on the PATH].
    #[arg(long, env = "EMBER_PYTHON", value_parser = parse_interpreter)]
    pub python: Option<String>,
    /// How many warm Python workers to keep, at most [default: one per core]. They start on
    /// the first python task and stay for the next.
    #[arg(long, env = "EMBER_PYTHON_WORKERS",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CORES)))]
    pub python_workers: Option<u32>,
    /// Retire a Python worker after it has answered N calls: it ends once it has answered, and
    /// a new one starts for the next task, so memory a library leaks or holds on to goes with
    /// it (Celery's max_tasks_per_child) [default: no limit].
    #[arg(long, env = "EMBER_PYTHON_MAX_TASKS", value_name = "N", value_parser = parse_max_tasks)]
    pub python_max_tasks: Option<u32>,
    /// The most memory a Python worker may have resident (its own VmRSS), as 512MiB or 2GiB (at
    /// least 32MiB). A worker past it after a call is retired (the call's result stands); one
    /// that passes it during a call is killed with what it started, and the task fails saying
    /// so, to be retried as any failure is (Celery's max_memory_per_child) [default: no limit].
    #[arg(long, env = "EMBER_PYTHON_MAX_RSS", value_name = "SIZE", value_parser = parse_max_rss)]
    pub python_max_rss: Option<u64>,
    /// Refuse python tasks: each fails with a message that says so. Unpickling runs code, so a
    /// cluster whose clients must not run arbitrary Python on it sets this.
    #[arg(long, env = "EMBER_NO_PYTHON",
          conflicts_with_all = ["python_workers", "python_max_tasks", "python_max_rss"])]
    pub no_python: bool,
    /// The executor's own directory: its cache of the cluster's objects (objects/) and the
    /// directories of commands with inputs or outputs (tasks/), each made when first needed
    /// [default: <temp dir>/ember-<cluster>-<executor id>].
    #[arg(long, env = "EMBER_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<std::path::PathBuf>,
    /// The most bytes of objects the executor keeps on disk: each object tasks read is
    /// fetched once and kept for later tasks, the least recently used going first past this
    /// (never one a running task reads).
    #[arg(long, env = "EMBER_OBJECT_CACHE_BYTES",
          default_value = super::show_bytes(DEFAULT_CACHE_BYTES),
          value_parser = super::parse_bytes)]
    pub object_cache_bytes: u64,
    /// Where the processes of this host share objects, or `off`: an object put on this host,
    /// or fetched by another executor here, is linked into this executor's cache from there
    /// rather than fetched through the server again. The directory must be this user's and
    /// writable by no one else (it is made with mode 0700); files in it are trusted as the
    /// cache's own are [default: <temp dir>/ember-<cluster>-objects].
    #[arg(long, env = "EMBER_HOST_OBJECTS", value_name = "DIR|off",
          value_parser = |text: &str| Ok::<_, String>(crate::objects::host::HostSetting::parse(text)))]
    pub host_objects: Option<crate::objects::host::HostSetting>,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "EMBER_LOG_JSON")]
    pub log_json: bool,
}

/// Flags that clap takes one by one but that do not make an executor's config.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorFlagsError {
    #[error("--host-port: {0}")]
    HostPort(String),
    /// A resource named twice.
    #[error("{0}")]
    Resources(String),
    #[error("--resource: at most {MAX_RESOURCES} resources")]
    TooManyResources,
    #[error("--site {site} and --attribute site={attribute} disagree: give one")]
    Site { site: String, attribute: String },
    #[error(transparent)]
    Cluster(#[from] ConnectError),
}

impl ExecutorFlagsError {
    /// The exit code of an executor refused for this: clap's usage code (2) for a flag wrong in
    /// itself, 1 for a cluster name, which the subjects refuse (as a failure to start).
    pub fn exit_code(&self) -> u8 {
        match self {
            ExecutorFlagsError::Cluster(_) => 1,
            _ => 2,
        }
    }
}

impl ExecutorArgs {
    /// The executor's config as the flags set it, with a new id, this machine's hostname and
    /// its cores where the flags name none. Its metrics are new.
    pub fn config(&self) -> Result<ExecutorConfig, ExecutorFlagsError> {
        let executor_id = self
            .executor_id
            .clone()
            .unwrap_or_else(ExecutorId::generate);
        let host_port = self.host_port.clone().unwrap_or_else(default_host_port);
        validate_host_port(&host_port).map_err(ExecutorFlagsError::HostPort)?;
        let resources = crate::resources::gather(self.resources.clone())
            .map_err(ExecutorFlagsError::Resources)?;
        if resources.len() > MAX_RESOURCES {
            return Err(ExecutorFlagsError::TooManyResources);
        }
        let cores = self.cores.unwrap_or_else(machine_cores);
        let subjects = self.nats.subjects()?;
        let mut attributes = to_map(&self.attributes);
        if let Some(site) = &self.site {
            let given = attributes.insert(SITE.to_string(), site.clone());
            if let Some(attribute) = given.filter(|given| given != site) {
                let site = site.clone();
                return Err(ExecutorFlagsError::Site { site, attribute });
            }
        }
        Ok(ExecutorConfig {
            log_urls: to_map(&self.log_urls),
            attributes,
            resources,
            gang_ports: self.gang_ports,
            register_timeout: self.register_timeout,
            heartbeat_interval: self.heartbeat_interval,
            driver_timeout: self.driver_timeout,
            decommission_timeout: self.decommission_timeout,
            exit_on_driver_loss: self.exit_on_driver_loss,
            metrics: Arc::new(ExecutorMetrics::new()),
            python: (!self.no_python).then(|| PythonConfig {
                interpreter: self.python.clone().unwrap_or_else(default_interpreter),
                workers: self.python_workers.unwrap_or(0),
                max_tasks: self.python_max_tasks,
                max_rss: self.python_max_rss,
            }),
            object_cache_bytes: self.object_cache_bytes,
            host_objects: self
                .host_objects
                .clone()
                .unwrap_or(crate::objects::host::HostSetting::Default),
            data_dir: match &self.data_dir {
                Some(dir) => dir.clone(),
                None => crate::executor::default_data_dir(&subjects, &executor_id),
            },
            ..ExecutorConfig::new(subjects, executor_id, host_port, cores)
        })
    }
}

/// Serves an executor with `config` (from [`ExecutorArgs::config`]) until `shutdown`: its
/// metrics where the flags ask for them, then the executor on a connection whose replies come
/// to its own inbox, running the built-in tasks. An [`crate::executor::ExecutorError`] comes
/// back as it is, for its exit code.
pub async fn serve(
    args: &ExecutorArgs,
    config: ExecutorConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    if let Some(addr) = args.metrics_addr {
        crate::metrics::serve(addr, config.metrics.clone())
            .await
            .map_err(|e| anyhow::anyhow!("could not serve metrics on {addr}: {e}"))?;
    }
    let prefix = Subjects::executor_reply_prefix(&config.executor_id);
    let watch = Watch {
        slow_consumers: config.metrics.slow_consumers.clone(),
        connected: Some(config.connected.clone()),
        lost: None,
    };
    let client = args
        .nats
        .connect_watched("ember-executor", Some(prefix), watch)
        .await?;
    run(client, config, Handlers::builtin(), shutdown).await?;
    Ok(())
}

/// `--python`: not empty.
fn parse_interpreter(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("name an interpreter, such as python3".into());
    }
    Ok(s.to_string())
}

/// `--python-max-tasks`: a count of calls, at least 1.
fn parse_max_tasks(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(0) => Err(
            "a worker must answer at least 1 call before it is retired; leave the \
                      flag out for no limit"
                .into(),
        ),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a count of calls (write e.g. 100)")),
    }
}

/// The smallest `--python-max-rss`: a worker that has just started (an interpreter with
/// cloudpickle) is some 15 to 20 MiB, so a limit below this would retire every worker after
/// every call; most often it is a size missing its unit (`512` for `512MiB`).
const MIN_PYTHON_MAX_RSS: u64 = 32 << 20;

/// `--python-max-rss`: a size, at least [`MIN_PYTHON_MAX_RSS`].
fn parse_max_rss(s: &str) -> Result<u64, String> {
    let bytes = super::parse_bytes(s)?;
    if bytes < MIN_PYTHON_MAX_RSS {
        let min = super::show_bytes(MIN_PYTHON_MAX_RSS);
        return Err(format!(
            "{s:?} is less than a python worker needs to start; give at least {min} (a size \
             with no unit is in bytes)"
        ));
    }
    Ok(bytes)
}

/// Where others reach an executor that does not say: this machine's hostname, port 0.
fn default_host_port() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}:0")
}

/// The cores an executor offers that does not say: this machine's.
fn machine_cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    /// Parses `flags` as the command line alone sets them, whatever EMBER_* variables the tests
    /// run with.
    fn parse(flags: &[&str]) -> ExecutorArgs {
        let line = std::iter::once("ember-executor").chain(flags.iter().copied());
        let matches = crate::cli::without_env(ExecutorArgs::command())
            .try_get_matches_from(line)
            .unwrap();
        ExecutorArgs::from_arg_matches(&matches).unwrap()
    }

    /// Clap's own checks of the command line, and a help text for every flag.
    #[test]
    fn the_command_line_passes_clap_s_checks_and_explains_every_flag() {
        crate::cli::check_command_line(ExecutorArgs::command());
    }

    #[test]
    fn no_flags_give_the_config_s_defaults() {
        let config = parse(&[]).config().unwrap();
        let defaults = ExecutorConfig {
            metrics: config.metrics.clone(),
            ..ExecutorConfig::new(
                config.subjects.clone(),
                config.executor_id.clone(),
                default_host_port(),
                machine_cores(),
            )
        };
        assert_eq!(format!("{config:#?}"), format!("{defaults:#?}"));
    }

    #[test]
    fn flags_set_the_config_and_those_wrong_together_are_refused() {
        let config = parse(&[
            "--executor-id=e-1",
            "--cores=3",
            "--resource=gpu=2",
            "--no-python",
        ])
        .config()
        .unwrap();
        assert_eq!((config.executor_id.as_str(), config.cores), ("e-1", 3));
        assert_eq!(config.resources["gpu"], ["0", "1"]);
        assert_eq!(config.python, None);
        let refused = |flags: &[&str]| parse(flags).config().unwrap_err();
        assert_eq!(refused(&["--host-port=nope"]).exit_code(), 2);
        assert_eq!(
            refused(&["--resource=a=1", "--resource=a=2"]).exit_code(),
            2
        );
        assert_eq!(refused(&["--cluster=a b"]).exit_code(), 1);
    }

    #[test]
    fn python_worker_limits_are_read_and_bad_ones_refused_saying_why() {
        let config = parse(&["--python-max-tasks=2", "--python-max-rss=512MiB"])
            .config()
            .unwrap();
        let python = config.python.unwrap();
        assert_eq!(
            (python.max_tasks, python.max_rss),
            (Some(2), Some(512 << 20))
        );
        let python = parse(&[]).config().unwrap().python.unwrap();
        assert_eq!((python.max_tasks, python.max_rss), (None, None));
        for (flag, needle) in [
            ("--python-max-tasks=0", "must answer at least 1 call"),
            ("--python-max-tasks=-1", "is not a count of calls"),
            ("--python-max-rss=512", "give at least 32MiB"),
            ("--python-max-rss=0", "is zero"),
            ("--python-max-rss=1TiB", "unknown unit"),
        ] {
            let error = crate::cli::without_env(ExecutorArgs::command())
                .try_get_matches_from(["ember-executor", flag])
                .unwrap_err()
                .to_string();
            assert!(error.contains(needle), "{flag}: {error}");
        }
    }
}
