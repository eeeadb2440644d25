//! Test harness: a real nats-server on a free port (killed on drop), a driver and executors
//! in-process or as real processes, each test on its own cluster name.
#![allow(dead_code)]

pub mod netns;

use async_nats::Client;
use ember::driver::{self, DriverConfig};
use ember::executor::{self, ExecutorConfig, ExecutorError, Handlers};
use ember::ids::ExecutorId;
use ember::server::NatsServer;
use ember::subjects::Subjects;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A nats-server and the subjects of a cluster name unique to this test.
/// The executor flags of the fault tests: 2 cores, quick heartbeats, a quick verdict on the
/// driver, a short drain.
pub const FAST_EXECUTOR: [&str; 8] = [
    "--cores",
    "2",
    "--heartbeat-interval",
    "200ms",
    "--driver-timeout",
    "3s",
    "--decommission-timeout",
    "5s",
];

pub struct TestCluster {
    pub server: NatsServer,
    pub subjects: Subjects,
    pub cluster: String,
}

/// The objects a test's processes shared on this host go with it.
impl Drop for TestCluster {
    fn drop(&mut self) {
        let dir = ember::objects::host::default_dir(self.subjects.prefix());
        let _ = std::fs::remove_dir_all(dir);
    }
}

impl TestCluster {
    /// Who holds the cluster's leader lease, as the key says now.
    pub async fn lease_holder(&self) -> Option<ember::driver::lease::Holder> {
        holder_of(&self.client().await, &self.subjects).await
    }

    /// Waits up to a minute until a driver of `drivers` holds the lease (and is not `not`),
    /// and returns its index.
    pub async fn leader_among(
        &self,
        drivers: &[&tokio::process::Child],
        not: Option<u32>,
    ) -> usize {
        eventually(Duration::from_secs(60), "a driver leads", || async {
            let holder = self.lease_holder().await?;
            if holder.released || Some(holder.pid) == not {
                return None;
            }
            drivers.iter().position(|d| d.id() == Some(holder.pid))
        })
        .await
    }

    pub fn start(name: &str) -> Self {
        Self::start_with(name, &[])
    }

    /// With extra nats-server arguments (such as `-c small.conf`).
    pub fn start_with(name: &str, extra: &[&str]) -> Self {
        let server =
            NatsServer::start(extra).expect("start nats-server (run scripts/install-nats-server)");
        Self::on(server, name)
    }

    /// With JetStream on, in a temporary store of this server's own.
    pub fn start_with_jetstream(name: &str) -> Self {
        Self::start_with_jetstream_and(name, &[])
    }

    /// With JetStream on, and extra nats-server arguments.
    pub fn start_with_jetstream_and(name: &str, extra: &[&str]) -> Self {
        let server = NatsServer::start_with_jetstream(extra)
            .expect("start nats-server (run scripts/install-nats-server)");
        Self::on(server, name)
    }

    fn on(server: NatsServer, name: &str) -> Self {
        let cluster = format!("{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let subjects = Subjects::new(&cluster).expect("valid cluster name");
        Self {
            server,
            subjects,
            cluster,
        }
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    pub async fn client(&self) -> Client {
        async_nats::ConnectOptions::new()
            .subscription_capacity(ember::SUBSCRIPTION_CAPACITY)
            .connect(self.url())
            .await
            .expect("connect")
    }

    /// A subscription to `subject` on a connection of its own, in place at the server before
    /// this returns (a message of its own came back through it).
    pub async fn listen(&self, subject: String) -> async_nats::Subscriber {
        use futures::StreamExt;
        let client = self.client().await;
        let subscription = client.subscribe(subject).await.expect("subscribe");
        let probe = format!("_PROBE.{}", uuid::Uuid::new_v4().simple());
        let mut probes = client.subscribe(probe.clone()).await.expect("subscribe");
        client.publish(probe, "".into()).await.expect("publish");
        within(Duration::from_secs(10), probes.next()).await;
        subscription
    }

    /// A client whose replies come back under `_INBOX.<id>`, as an executor's do.
    pub async fn executor_client(&self, id: &str) -> Client {
        async_nats::ConnectOptions::new()
            .custom_inbox_prefix(format!("_INBOX.{id}"))
            .connect(self.url())
            .await
            .expect("connect")
    }

    pub fn api(&self, client: Client) -> ember::client::EmberClient {
        ember::client::EmberClient::new(client, self.subjects.clone())
    }

    /// Starts a driver in this process.
    pub async fn driver(&self) -> Running<Result<(), driver::DriverError>> {
        self.driver_with(Default::default()).await
    }

    /// Starts a driver in this process that judges executors by `liveness`.
    pub async fn driver_with(
        &self,
        liveness: ember::driver::core::Liveness,
    ) -> Running<Result<(), driver::DriverError>> {
        self.driver_of(self.subjects.clone(), liveness).await
    }

    /// [`Self::driver_with`] for the cluster of `subjects` instead: another cluster sharing
    /// this one's server.
    pub async fn driver_of(
        &self,
        subjects: Subjects,
        liveness: ember::driver::core::Liveness,
    ) -> Running<Result<(), driver::DriverError>> {
        self.driver_configured(|config| {
            config.subjects = subjects;
            config.liveness = liveness;
        })
        .await
    }

    /// Starts a driver in this process with the test defaults as `configure` changes them.
    pub async fn driver_configured(
        &self,
        configure: impl FnOnce(&mut DriverConfig),
    ) -> Running<Result<(), driver::DriverError>> {
        let client = self.client().await;
        let mut config = DriverConfig {
            revive_interval: Duration::from_millis(200),
            ..DriverConfig::new(self.subjects.clone())
        };
        configure(&mut config);
        let api = config.subjects.api();
        let probe = self.client().await;
        let running = Running::spawn(|stop| driver::run(client, config, stop));
        // A driver answers once it has subscribed, and a journaled one once it has read its
        // journal, which on a loaded machine takes a while: wait until something answers on
        // the api (bounded, and not for a driver that stopped: a test may start one that
        // never answers).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let ask = br#"{"type":"ListExecutors","limit":0}"#;
        while !running.handle.is_finished() && tokio::time::Instant::now() < deadline {
            let answer = probe.request(api.clone(), ask.to_vec().into());
            match tokio::time::timeout(Duration::from_millis(500), answer).await {
                Ok(Ok(_)) => break,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        running
    }

    /// Starts an executor in this process.
    pub async fn executor(
        &self,
        id: &str,
        cores: u32,
        handlers: Handlers,
    ) -> Running<Result<(), ExecutorError>> {
        self.executor_of(self.subjects.clone(), id, cores, handlers)
            .await
    }

    /// [`Self::executor`] for the cluster of `subjects` instead: another cluster sharing this
    /// one's server.
    pub async fn executor_of(
        &self,
        subjects: Subjects,
        id: &str,
        cores: u32,
        handlers: Handlers,
    ) -> Running<Result<(), ExecutorError>> {
        let client = self.executor_client(id).await;
        let config = ExecutorConfig {
            subjects,
            ..self.executor_config(id, cores)
        };
        Running::spawn(|stop| executor::run(client, config, handlers, stop))
    }

    /// Starts an executor in this process with the test defaults as `configure` changes them.
    pub async fn executor_configured(
        &self,
        id: &str,
        cores: u32,
        handlers: Handlers,
        configure: impl FnOnce(&mut ExecutorConfig),
    ) -> Running<Result<(), ExecutorError>> {
        let client = self.executor_client(id).await;
        let mut config = self.executor_config(id, cores);
        configure(&mut config);
        Running::spawn(|stop| executor::run(client, config, handlers, stop))
    }

    pub fn executor_config(&self, id: &str, cores: u32) -> ExecutorConfig {
        let id = ExecutorId::parse(id).expect("valid id");
        ExecutorConfig {
            log_urls: BTreeMap::from([("stdout".to_string(), format!("http://host-{id}/stdout"))]),
            register_timeout: Duration::from_secs(30),
            heartbeat_interval: Duration::from_millis(200),
            driver_timeout: Duration::from_secs(2),
            decommission_timeout: Duration::from_secs(5),
            ..ExecutorConfig::new(
                self.subjects.clone(),
                id.clone(),
                format!("host-{id}:7078"),
                cores,
            )
        }
    }

    /// A process of one of Ember's binaries on this cluster, logging warnings only, killed
    /// when dropped.
    fn process(&self, binary: &str, args: &[&str]) -> tokio::process::Command {
        self.process_at(&self.url(), binary, args)
    }

    /// [`Self::process`], reaching the server through `url` (a relay in front of it, say).
    pub fn process_at(&self, url: &str, binary: &str, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(binary);
        command
            .args(["--nats-url", url, "--cluster", &self.cluster])
            .args(args)
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .stdin(std::process::Stdio::null());
        command
    }

    /// An `ember-executor` process.
    pub fn executor_process(&self, id: &str, extra: &[&str]) -> tokio::process::Command {
        let mut command =
            self.process(env!("CARGO_BIN_EXE_ember-executor"), &["--executor-id", id]);
        command.args(extra);
        command
    }

    /// An `ember-driver` process.
    pub fn driver_process(&self, extra: &[&str]) -> tokio::process::Command {
        let mut command = self.process(
            env!("CARGO_BIN_EXE_ember-driver"),
            &["--revive-interval", "200ms"],
        );
        command.args(extra);
        command
    }

    /// Every message of the cluster's journal stream, in order.
    pub async fn journal_messages(&self) -> Vec<async_nats::jetstream::message::StreamMessage> {
        let jetstream = async_nats::jetstream::new(self.client().await);
        let mut stream = jetstream
            .get_stream(self.subjects.journal_stream())
            .await
            .unwrap();
        let state = stream.info().await.unwrap().state.clone();
        let mut messages = Vec::new();
        for sequence in state.first_sequence..=state.last_sequence {
            if let Ok(message) = stream.get_raw_message(sequence).await {
                messages.push(message);
            }
        }
        messages
    }

    /// An `ember` CLI process against this cluster.
    pub fn cli(&self, args: &[&str]) -> tokio::process::Command {
        self.process(env!("CARGO_BIN_EXE_ember"), args)
    }

    /// What `ember <args>` prints on stdout; it must exit 0 within 30 s.
    pub async fn cli_stdout(&self, args: &[&str]) -> String {
        let out = tokio::time::timeout(Duration::from_secs(30), self.cli(args).output())
            .await
            .unwrap_or_else(|_| panic!("ember {args:?} did not exit within 30 s"))
            .expect("ember runs");
        assert!(out.status.success(), "ember {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The registry as requests can change it: all but when each executor was last heard from,
/// which its heartbeats move on.
pub fn heard_from_aside(
    mut registry: ember::protocol::ExecutorsSnapshot,
) -> ember::protocol::ExecutorsSnapshot {
    for executor in &mut registry.executors {
        executor.last_seen_ms = 0;
    }
    registry
}

/// A task running in this process that stops when told (or when dropped).
pub struct Running<T> {
    stop: Option<oneshot::Sender<()>>,
    handle: JoinHandle<T>,
}

impl<T: Send + 'static> Running<T> {
    fn spawn<F, Fut>(start: F) -> Self
    where
        F: FnOnce(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(start(Box::pin(async move {
            let _ = stopped.await;
        })));
        Self {
            stop: Some(stop),
            handle,
        }
    }

    /// Asks it to stop and returns what it returned.
    pub async fn stop(mut self) -> T {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        within(Duration::from_secs(10), &mut self.handle)
            .await
            .expect("task panicked")
    }

    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits for it to end by itself.
    pub async fn join(mut self) -> T {
        within(Duration::from_secs(30), &mut self.handle)
            .await
            .expect("task panicked")
    }
}

impl<T> Drop for Running<T> {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// `tasks` tasks of the built-in `noop` handler, failing the job at their first failure.
pub fn noops(tasks: u32) -> ember::protocol::SubmitJob {
    ember::protocol::SubmitJob {
        name: "noops".into(),
        repeat: tasks,
        max_failures: 1,
        ..ember::protocol::SubmitJob::new(vec![ember::protocol::TaskSpec::Handler {
            name: "noop".into(),
            arg: serde_json::Value::Null,
        }])
    }
}

/// `tasks` tasks of the built-in `sleep` handler, `ms` each.
pub fn sleepers(tasks: u32, ms: u64) -> ember::protocol::SubmitJob {
    ember::protocol::SubmitJob {
        name: "sleepers".into(),
        repeat: tasks,
        max_failures: 4,
        ..ember::protocol::SubmitJob::new(vec![ember::protocol::TaskSpec::Handler {
            name: "sleep".into(),
            arg: serde_json::json!({ "ms": ms }),
        }])
    }
}

/// A task that runs `script` with `sh -c`.
pub fn sh(script: &str) -> ember::protocol::TaskSpec {
    ember::protocol::TaskSpec::Command {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        env: Default::default(),
        cwd: None,
        timeout_ms: None,
        inputs: Default::default(),
        outputs: Vec::new(),
    }
}

/// Awaits `future`, failing the test if it takes longer than `limit`.
pub async fn within<F: Future>(limit: Duration, future: F) -> F::Output {
    tokio::time::timeout(limit, future)
        .await
        .expect("timed out")
}

/// Polls `check` every 20 ms until it returns `Some`, failing the test after `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Decoded events from a subscription, collected until `count` have arrived.
pub async fn collect_events(
    sub: &mut async_nats::Subscriber,
    count: usize,
    limit: Duration,
) -> Vec<ember::protocol::Event> {
    use futures::StreamExt;
    let mut events = Vec::new();
    within(limit, async {
        while events.len() < count {
            let message = sub.next().await.expect("subscription open");
            events.push(
                ember::protocol::decode(&message.payload, usize::MAX).expect("event decodes"),
            );
        }
    })
    .await;
    events
}

/// Who holds the leader lease of the cluster of `subjects`, as the key says now.
pub async fn holder_of(
    client: &Client,
    subjects: &Subjects,
) -> Option<ember::driver::lease::Holder> {
    let jetstream = async_nats::jetstream::new(client.clone());
    let bucket = jetstream
        .get_key_value(subjects.leader_bucket())
        .await
        .ok()?;
    let entry = bucket.entry("leader").await.ok()??;
    serde_json::from_slice(&entry.value).ok()
}

/// Makes, with openssl in `dir`, a test CA (`ca.pem`) and for each `(name, ip)` a certificate
/// `name.pem` (key `name.key`) it signed for that IP address, good for a server and a client.
pub fn make_certs(dir: &std::path::Path, certs: &[(&str, &str)]) {
    let mut script = String::from(
        "set -e\n\
         ec='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes'\n\
         openssl req -x509 $ec -keyout ca.key -out ca.pem -days 2 -subj /CN=ember-test-ca\n",
    );
    for (name, ip) in certs {
        script.push_str(&format!(
            "openssl req $ec -keyout {name}.key -out {name}.csr -subj /CN={name}\n\
             printf 'subjectAltName=IP:{ip}\\nextendedKeyUsage=serverAuth,clientAuth\\n\
             basicConstraints=CA:FALSE\\n' > {name}.ext\n\
             openssl x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
             -out {name}.pem -days 2 -extfile {name}.ext\n"
        ));
    }
    let made = std::process::Command::new("sh")
        .args(["-c", &script])
        .current_dir(dir)
        .output()
        .expect("making test certificates needs sh and openssl");
    assert!(
        made.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&made.stderr)
    );
}
