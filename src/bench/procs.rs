//! The processes a benchmark runs: a nats-server, a driver and executors, with their memory
//! read from /proc.

use crate::server::NatsServer;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// A benchmark cluster: its processes are killed when it is dropped.
pub struct Cluster {
    pub server: NatsServer,
    pub cluster: String,
    pub driver: Child,
    driver_args: Vec<String>,
    journal: bool,
    pub executors: Vec<Child>,
}

/// Slow-consumer events in this run, of every process and connection of the benchmark's: a
/// driver's or executor's log line, or the event on one of the benchmark's own connections.
static SLOW_CONSUMERS: AtomicU64 = AtomicU64::new(0);

/// Whether the journaled servers sync every JetStream write to disk (`ember bench
/// --sync-always`).
static SYNC_ALWAYS: AtomicBool = AtomicBool::new(false);

/// Makes every journaled server of this run sync each JetStream write to disk, or not.
pub fn set_sync_always(on: bool) {
    SYNC_ALWAYS.store(on, Relaxed);
}

/// Counts one slow-consumer event: NATS dropped messages for a subscriber that fell behind.
pub fn count_slow_consumer() {
    SLOW_CONSUMERS.fetch_add(1, Relaxed);
}

/// The slow-consumer events counted so far.
pub fn slow_consumers() -> u64 {
    SLOW_CONSUMERS.load(Relaxed)
}

fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::current_exe()?
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default();
    Ok(dir.join(name))
}

/// A nats-server for the bench: with JetStream for a journal (syncing every write with
/// `--sync-always`), or without.
pub fn server(journal: bool) -> anyhow::Result<NatsServer> {
    Ok(match journal {
        true if SYNC_ALWAYS.load(Relaxed) => NatsServer::start_with_synced_jetstream(&[])?,
        true => NatsServer::start_with_jetstream(&[])?,
        false => NatsServer::start(&[])?,
    })
}

impl Cluster {
    /// A nats-server on a free port and a driver; executors come with [`Cluster::add_executors`].
    /// With `journal`, the server has JetStream (in a temporary store) and the driver journals
    /// its jobs there; otherwise the driver keeps them in memory.
    pub fn start(name: &str, journal: bool) -> anyhow::Result<Self> {
        Self::start_with(name, journal, &[])
    }

    /// As [`Cluster::start`], the driver started with `driver_args` too.
    pub fn start_with(name: &str, journal: bool, driver_args: &[&str]) -> anyhow::Result<Self> {
        let server = server(journal)?;
        let cluster = format!(
            "bench-{name}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..6]
        );
        let mut driver = Command::new(sibling("ember-driver")?);
        driver
            .args(["--nats-url", &server.url(), "--cluster", &cluster])
            .args(["--journal", if journal { "on" } else { "off" }])
            .args(driver_args);
        let driver = watched(driver)?;
        Ok(Self {
            server,
            cluster,
            driver,
            driver_args: driver_args.iter().map(|a| a.to_string()).collect(),
            journal,
            executors: Vec::new(),
        })
    }

    /// SIGKILLs the driver and starts another with the same arguments; returns when it has
    /// been started (not when it answers).
    pub fn replace_driver(&mut self) -> anyhow::Result<()> {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let mut driver = Command::new(sibling("ember-driver")?);
        driver
            .args(["--nats-url", &self.server.url(), "--cluster", &self.cluster])
            .args(["--journal", if self.journal { "on" } else { "off" }])
            .args(&self.driver_args);
        self.driver = watched(driver)?;
        Ok(())
    }

    pub fn add_executors(&mut self, n: u32, cores: u32) -> anyhow::Result<()> {
        for i in 0..n {
            self.add_executor(&format!("bench-{i}"), cores, &[])?;
        }
        Ok(())
    }

    /// Starts executor `id` of `cores`, with `args` besides.
    pub fn add_executor(&mut self, id: &str, cores: u32, args: &[String]) -> anyhow::Result<()> {
        let mut executor = Command::new(sibling("ember-executor")?);
        executor
            .args(["--nats-url", &self.server.url(), "--cluster", &self.cluster])
            .args(["--executor-id", id, "--cores", &cores.to_string()])
            .args(args);
        self.executors.push(watched(executor)?);
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self
            .executors
            .iter_mut()
            .chain(std::iter::once(&mut self.driver))
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `command` logging warnings, its log passed on to ours with its slow-consumer lines
/// counted.
fn watched(mut command: Command) -> anyhow::Result<Child> {
    let mut child = command
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let log = child.stderr.take().expect("stderr is piped");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(log).lines().map_while(Result::ok) {
            if line.contains(crate::connect::SLOW_CONSUMER) {
                count_slow_consumer();
            }
            eprintln!("{line}");
        }
    });
    Ok(child)
}

/// (current, peak) resident memory of a process in MB, from /proc/<pid>/status.
pub fn rss_mb(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU time (user and system) a process has used, in seconds, from /proc/<pid>/stat (whose
/// clock ticks are Linux's USER_HZ, 100 a second); 0 if it cannot be read.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name, in parentheses, may hold spaces: the fields after it are fixed.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    // utime and stime are the 14th and 15th fields; the state, the 3rd, is fields[0].
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(user), Some(system)) => (user + system) / 100.0,
        _ => 0.0,
    }
}

/// A description of this machine for the report.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let server = crate::server::find_binary()
        .ok()
        .and_then(|b| Command::new(b).arg("--version").output().ok())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!(
        "{cores} cores, {cpu}; {server} (GOMAXPROCS={}); ember {}",
        crate::server::server_gomaxprocs(),
        env!("CARGO_PKG_VERSION")
    )
}

/// The value of `name`, a metric without labels, at the metrics endpoint on `port` of the
/// loopback interface: retried for up to 30 s while the process that serves it starts.
pub async fn metric(port: u16, name: &str) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match scrape(port).await {
            Ok(body) => {
                return body
                    .lines()
                    .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                    .and_then(|value| value.trim().parse::<f64>().ok())
                    .map(|value| value as u64)
                    .ok_or_else(|| anyhow::anyhow!("no {name} in the metrics on port {port}"))
            }
            Err(error) if Instant::now() > deadline => {
                anyhow::bail!("the metrics on port {port}: {error}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// The text of `/metrics` on `port` of the loopback interface.
async fn scrape(port: u16) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: ember\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_consumer_line_in_a_child_log_is_counted() {
        let before = slow_consumers();
        let mut command = Command::new("sh");
        command.args([
            "-c",
            &format!(
                "echo 'WARN ember::connect: {} sid=3' >&2; echo 'WARN something else' >&2",
                crate::connect::SLOW_CONSUMER
            ),
        ]);
        let mut child = watched(command).unwrap();
        child.wait().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while slow_consumers() == before && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(slow_consumers(), before + 1);
    }
}
