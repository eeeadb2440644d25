//! `ember up`: a whole local cluster in one command: a nats-server, one driver or more (one
//! leads, the others stand by) and N executors as child processes, with the events printed
//! until Ctrl-C stops them all.

use super::view::follow_events;
use crate::connect::NatsArgs;
use crate::server::NatsServer;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::{Child, Command};

/// The local cluster to start.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// How many executors to start.
    #[arg(long, default_value_t = 2)]
    pub executors: u32,
    /// How many drivers to start: one leads, the others stand by to take over (needs the
    /// server's JetStream, as the default nats.conf has).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub drivers: u32,
    /// Cores each executor offers [default: this machine's].
    #[arg(long)]
    pub cores: Option<u32>,
    /// Port for the nats-server [default: 4222].
    #[arg(long, default_value_t = 4222)]
    pub port: u16,
    /// nats-server config file [default: nats.conf in the project, if there].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print events as wire JSON.
    #[arg(long)]
    pub json: bool,
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
    let config = args.config.clone().or_else(|| {
        let default = Path::new(env!("CARGO_MANIFEST_DIR")).join("nats.conf");
        default.is_file().then_some(default)
    });
    let mut extra: Vec<String> = Vec::new();
    if let Some(config) = &config {
        extra.extend(["-c".into(), config.display().to_string()]);
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let server = NatsServer::start_on(args.port, &extra)
        .map_err(|e| anyhow::anyhow!("{e} (is port {} already in use? try --port)", args.port))?;
    eprintln!("nats-server listening on {}", server.url());
    let nats = NatsArgs {
        nats_url: server.url(),
        ..nats.clone()
    };
    let client = nats.connect("ember-up", None).await?;
    let subjects = nats.subjects()?;
    let bin = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let web = args.http.address()?;
    let drivers = (0..args.drivers)
        .map(|i| {
            let http = match web {
                Some(addr) if i == 0 => vec!["--http".to_string(), addr.to_string()],
                _ => Vec::new(),
            };
            spawn(&bin, "ember-driver", &nats, &http)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut executors = Vec::new();
    for i in 1..=args.executors {
        let mut extra = vec!["--executor-id".to_string(), format!("exec-{i}")];
        if let Some(cores) = args.cores {
            extra.extend(["--cores".into(), cores.to_string()]);
        }
        executors.push(spawn(&bin, "ember-executor", &nats, &extra)?);
    }
    let drivers_started = match args.drivers {
        1 => "driver".to_string(),
        n => format!("{n} drivers (one leads, the others stand by)"),
    };
    eprintln!(
        "{drivers_started} and {} executors started on cluster {:?}; Ctrl-C stops them all",
        args.executors, nats.cluster
    );
    if let Some(addr) = web {
        eprintln!("web page: http://{addr}/ (served by the first driver)");
    }
    let result = follow_events(&client, &subjects, args.json, shutdown).await;
    stop_all(drivers, executors).await;
    drop(server);
    eprintln!("stopped");
    result
}

fn spawn(bin: &Path, name: &str, nats: &NatsArgs, extra: &[String]) -> anyhow::Result<Child> {
    let path = bin.join(name);
    Command::new(&path)
        .args(["--nats-url", &nats.nats_url, "--cluster", &nats.cluster])
        .args(extra)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            anyhow::anyhow!(
                "could not start {}: {e} (build it with `cargo build --release`)",
                path.display()
            )
        })
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
