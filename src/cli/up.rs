//! `ember up`: a whole local cluster in one command: a nats-server (or one it is pointed at),
//! one driver or more (one leads, the others stand by) and executors as child processes, with
//! the events printed until Ctrl-C stops them all. With `--autoscale MIN..MAX` it starts and
//! releases executors to follow the driver's dynamic allocation target.

mod autoscale;
mod local;

pub use autoscale::{parse_range, Scaling};
pub use local::{child_env, config_with_store, DEFAULT_CONFIG};

use super::view::follow_events;
use crate::connect::NatsArgs;
use crate::server::NatsServer;
use local::{Launcher, RunDir};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::PathBuf;
use std::time::Duration;
use tokio::process::Child;

/// The local cluster to start.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// How many executors to start.
    #[arg(long, env = "EMBER_UP_EXECUTORS", default_value_t = 2)]
    pub executors: u32,
    /// How many drivers to start: one leads, the others stand by to take over (needs the
    /// server's JetStream, as the built-in config has).
    #[arg(long, env = "EMBER_UP_DRIVERS", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub drivers: u32,
    /// Cores each executor offers [default: this machine's].
    #[arg(long, env = "EMBER_UP_CORES")]
    pub cores: Option<u32>,
    /// The Python interpreter of the executors' Python workers [default: the `python` beside
    /// the executors' binary if there is one (a virtualenv Ember was installed into with pip),
    /// else python3 on the PATH]. It needs the clients' version of cloudpickle: give the one
    /// you installed the `ember` package into (e.g. .venv/bin/python) if that is neither.
    #[arg(long, env = "EMBER_UP_PYTHON")]
    pub python: Option<PathBuf>,
    /// Port for the nats-server it starts.
    #[arg(long, env = "EMBER_UP_PORT", default_value_t = 4222)]
    pub port: u16,
    /// nats-server config file [default: the one built in: loopback, 8 MB payloads,
    /// JetStream].
    #[arg(long, env = "EMBER_UP_CONFIG")]
    pub config: Option<PathBuf>,
    /// Keep the server's JetStream store (the jobs' journal, results, the leader lease) in
    /// this directory, so that the next `ember up` given it resumes the jobs and their ids.
    /// Without it each run starts empty, in a directory of its own removed when it stops.
    #[arg(long, env = "EMBER_UP_STORE_DIR", conflicts_with = "config")]
    pub store_dir: Option<PathBuf>,
    /// A file of `user password` lines, as `ember creds --password-file` writes: the driver
    /// logs in as `<cluster>.driver`, each executor as `<cluster>.<id>`, `ember up` itself as
    /// `<cluster>.client`. Without
    /// it every child gets the NATS flags `ember up` was given (--user, --creds, --tls-ca...).
    #[arg(long, env = "EMBER_UP_PASSWORD_FILE")]
    pub password_file: Option<PathBuf>,
    #[command(flatten)]
    pub scaling: Scaling,
    /// Print events as wire JSON.
    #[arg(long, env = "EMBER_UP_JSON")]
    pub json: bool,
    /// Stop everything when standard input ends, as on Ctrl-C: for a program that starts
    /// `ember up` as its child with a pipe to its stdin (as Python's `ember.LocalCluster`
    /// does), so that the cluster ends with that program even when it is killed.
    #[arg(long)]
    pub exit_with_stdin: bool,
    /// Join the server at --nats-url rather than start one: set when --nats-url is on the
    /// command line.
    #[arg(skip)]
    pub join: bool,
    /// Where the first driver serves its live web page: HOST:PORT, or off. By default
    /// 127.0.0.1:4040 if that port is free (no page if not).
    #[arg(long, env = "EMBER_UP_HTTP", default_value = "auto", value_parser = WebPage::parse)]
    pub http: WebPage,
}

/// Where `ember up` has its first driver serve the web page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebPage {
    /// On [`DEFAULT_UP_HTTP`] if it is free.
    Auto,
    Off,
    At(std::net::SocketAddr),
}

/// Where `ember up` serves the web page unless told otherwise.
pub const DEFAULT_UP_HTTP: &str = "127.0.0.1:4040";

impl WebPage {
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(WebPage::Auto),
            "off" => Ok(WebPage::Off),
            addr => addr.parse().map(WebPage::At).map_err(|_| {
                format!("{addr:?} is not HOST:PORT (e.g. 127.0.0.1:4040), auto or off")
            }),
        }
    }

    /// The address to pass to the first driver, if any: a given one must be free, the
    /// default one is skipped (with a note) when taken.
    fn address(self) -> anyhow::Result<Option<std::net::SocketAddr>> {
        let (addr, given) = match self {
            WebPage::Off => return Ok(None),
            WebPage::Auto => (DEFAULT_UP_HTTP.parse().expect("a valid address"), false),
            WebPage::At(addr) => (addr, true),
        };
        match std::net::TcpListener::bind(addr) {
            // Free now; the driver binds it a moment later.
            Ok(_free) => Ok(Some(addr)),
            Err(e) if given => Err(anyhow::anyhow!("cannot serve the web page on {addr}: {e}")),
            Err(e) => {
                eprintln!("no web page: {addr} is taken ({e}); --http HOST:PORT picks another");
                Ok(None)
            }
        }
    }
}

/// Starts the cluster, prints its events, and stops everything when `shutdown` completes.
pub async fn up(
    args: &UpArgs,
    nats: &NatsArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let (server, _run_dir, nats) = server(args, nats)?;
    let launcher =
        Launcher::new(nats, args.password_file.as_deref())?.with_python(args.python.clone());
    let own = launcher.own_nats()?;
    let client = own.connect("ember-up", None).await?;
    let subjects = own.subjects()?;
    let driver_flags = args.scaling.driver_flags();
    let web = args.http.address()?;
    let drivers = (0..args.drivers)
        .map(|i| {
            let mut flags = driver_flags.clone();
            if let (Some(addr), 0) = (web, i) {
                flags.extend(["--http".to_string(), addr.to_string()]);
            }
            launcher.driver(&flags)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let drivers_started = match args.drivers {
        1 => "driver".to_string(),
        n => format!("{n} drivers (one leads, the others stand by)"),
    };
    if let Some(addr) = web {
        eprintln!("web page: http://{addr}/ (served by the first driver)");
    }
    let events = follow_events(&client, &subjects, args.json, shutdown);
    let (result, executors) = match args.scaling.range() {
        Some((min, max)) => {
            eprintln!(
                "{drivers_started} started on cluster {:?}; executors follow the driver's target \
                 between {min} and {max}; Ctrl-C stops them all",
                own.cluster
            );
            let api = crate::client::EmberClient::new(client.clone(), subjects.clone());
            let mut pool = autoscale::Pool::new(&launcher, api, args.cores, max);
            let result = pool.follow(min, events).await;
            (result, pool.into_children())
        }
        None => {
            let executors = (1..=args.executors)
                .map(|i| launcher.executor(&format!("exec-{i}"), args.cores))
                .collect::<anyhow::Result<Vec<_>>>()?;
            eprintln!(
                "{drivers_started} and {} executors started on cluster {:?}; Ctrl-C stops them all",
                args.executors, own.cluster
            );
            (events.await, executors)
        }
    };
    stop_all(drivers, executors).await;
    drop(server);
    eprintln!("stopped");
    result
}

/// The server to use: the one at --nats-url when joining, else one started here from the
/// given config or the built-in one (in a run directory of its own). Returns the flags that
/// reach it.
fn server(
    args: &UpArgs,
    nats: &NatsArgs,
) -> anyhow::Result<(Option<NatsServer>, Option<RunDir>, NatsArgs)> {
    if args.join {
        if args.config.is_some() || args.store_dir.is_some() {
            anyhow::bail!(
                "--config and --store-dir set up the server ember up starts; with --nats-url it \
                 joins the server there instead"
            );
        }
        // The children are given the context itself, to read as this process did.
        eprintln!("joining the NATS server at {}", nats.resolved()?.url());
        return Ok((None, None, nats.clone()));
    }
    let (run_dir, config) = match &args.config {
        Some(config) => (None, config.clone()),
        None => {
            let run_dir = RunDir::create()?;
            let config = run_dir.write_config(args.store_dir.as_deref())?;
            (Some(run_dir), config)
        }
    };
    let config = config.display().to_string();
    let server = NatsServer::start_on(args.port, &["-c", &config])
        .map_err(|e| anyhow::anyhow!("{e} (is port {} already in use? try --port)", args.port))?;
    eprintln!("nats-server listening on {}", server.url());
    let nats = NatsArgs {
        nats_url: Some(server.url()),
        context: None,
        ..nats.clone()
    };
    Ok((Some(server), run_dir, nats))
}

/// Stops the executors first, so they can drain while the driver still acknowledges their
/// statuses, then the drivers. Each group gets SIGTERM and, if still running when its time is
/// up or at a second Ctrl-C, SIGKILL.
async fn stop_all(mut drivers: Vec<Child>, mut executors: Vec<Child>) {
    // An executor drains for its decommission timeout, then tries to deliver its last statuses
    // for a grace; a little more than that before it is killed.
    let drain = crate::DEFAULT_DECOMMISSION_TIMEOUT + Duration::from_secs(15);
    if !executors.is_empty() {
        eprintln!(
            "stopping: executors finish their running tasks (at most {}s); Ctrl-C again to kill them now",
            drain.as_secs()
        );
    }
    stop(&mut executors, drain).await;
    stop(&mut drivers, Duration::from_secs(5)).await;
}

/// SIGTERM to each child, then SIGKILL to those still running after `patience` or at Ctrl-C.
async fn stop(children: &mut [Child], patience: Duration) {
    for child in children.iter() {
        if let Some(pid) = child.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
    }
    let all_exited = async {
        for child in children.iter_mut() {
            let _ = child.wait().await;
        }
    };
    tokio::select! {
        _ = tokio::time::timeout(patience, all_exited) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    for child in children.iter_mut() {
        if matches!(child.try_wait(), Ok(None)) {
            eprintln!("killing process {}", child.id().unwrap_or_default());
            let _ = child.kill().await;
        }
    }
}
