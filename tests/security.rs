//! The locked-down server of docs/security.md on a real nats-server: each role can do what it
//! needs and nothing else. Every refused attempt is checked three ways: the server reports a
//! permissions violation (async-nats hands it to the event callback, not to the call), a
//! subscriber allowed to see the subject sees nothing within a bounded time, and the driver's
//! registry is unchanged.

mod common;

use async_nats::{Client, ConnectOptions, Event, ServerError, Subscriber};
use clap::Parser;
use common::{noops, within, TestCluster};
use ember::cli::creds::{self, User, PLACEHOLDER_PASSWORD};
use ember::connect::NatsArgs;
use ember::driver::{self, DriverConfig};
use ember::executor::{self, ExecutorConfig, Handlers};
use ember::ids::ExecutorId;
use ember::protocol::{
    decode, encode, ApiReply, ApiRequest, Event as EmberEvent, ExecutorMessage, HeartbeatRequest,
    JobState, RegisterExecutor, RegisterRequest, StatusRequest, StatusUpdate, SubmitJob, TaskSpec,
    TaskState,
};
use ember::server::NatsServer;
use ember::subjects::Subjects;
use futures::StreamExt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How long a subscriber must stay silent for a message to count as not delivered. Loopback
/// delivers in well under a millisecond; this is generous.
const SILENCE: Duration = Duration::from_millis(400);

/// A test-only nkey user (generated for these tests; it opens nothing but their servers).
const TEST_NKEY_SEED: &str = "SUAMOCP3IASV4SPFZ577D76HZ5AV6RFWFAAXAAVJY7XLHPHJ54VILMRQ2Y";
const TEST_NKEY_PUBLIC: &str = "UDULYDL2AU3JTFEIILDZNSMCJ5WZF5FYX4HJXLHP2GVPN4MVEA7657HK";

fn password(user: &str) -> String {
    format!("pw-{user}-s3cret")
}

/// A file in the temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!("ember-{}-{name}", uuid::Uuid::new_v4()));
        std::fs::write(&path, text).expect("write temp file");
        Self(path)
    }
    fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A nats-server running `ember creds`' config for executors exec-1 and exec-2 (plus extra
/// config text), on a cluster name of its own; or one of several clusters on one server.
struct Secure {
    cluster: Arc<TestCluster>,
    name: String,
    subjects: Subjects,
    _config: Option<TempFile>,
}

impl Secure {
    fn start(name: &str) -> Self {
        Self::start_with(name, |_| {}, "")
    }

    /// A locked-down cluster on a server with JetStream, in a store that goes with the
    /// returned directory (bound before the cluster, so dropped after it).
    fn start_with_jetstream(name: &str) -> (TempDir, Self) {
        let store =
            TempDir(std::env::temp_dir().join(format!("ember-js-{}", uuid::Uuid::new_v4())));
        let jetstream = format!(
            "\njetstream {{ store_dir: {:?} }}\n",
            store.0.display().to_string()
        );
        let secure = Self::start_with(name, |_| {}, &jetstream);
        (store, secure)
    }

    fn start_with(name: &str, edit: impl FnOnce(&mut Vec<User>), extra: &str) -> Self {
        let cluster = format!("{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let subjects = Subjects::new(&cluster).expect("valid cluster");
        let ids = [id("exec-1"), id("exec-2")];
        let mut users = creds::users(&cluster, &ids, password);
        edit(&mut users);
        let text = format!("{}{extra}", creds::server_config(&subjects, &users));
        let config = TempFile::new("nats.conf", &text);
        let server = NatsServer::start(&["-c", config.path()]).expect("start nats-server");
        Self::on(server, &cluster, Some(config))
    }

    /// Cluster `name` on `server`, whose config holds its users.
    fn on(server: NatsServer, name: &str, config: Option<TempFile>) -> Self {
        let subjects = Subjects::new(name).expect("valid cluster");
        Self {
            cluster: Arc::new(TestCluster {
                server,
                subjects: subjects.clone(),
                cluster: name.to_string(),
            }),
            name: name.to_string(),
            subjects,
            _config: config,
        }
    }

    /// Cluster `name` on the server of `other`, whose config holds it too.
    fn beside(other: &Secure, name: &str) -> Self {
        Self {
            cluster: Arc::clone(&other.cluster),
            name: name.to_string(),
            subjects: Subjects::new(name).expect("valid cluster"),
            _config: None,
        }
    }

    fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    /// The NATS user of `name` (a role or an executor id) in this cluster.
    fn user(&self, name: &str) -> String {
        creds::user_name(&self.name, name)
    }

    /// The shared flags, parsed as a binary would parse them.
    fn flags(&self, extra: &[&str]) -> Result<NatsArgs, clap::Error> {
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            nats: NatsArgs,
        }
        let url = self.cluster.url();
        let mut argv = vec!["test", "--nats-url", &url, "--cluster", &self.name];
        argv.extend(extra);
        Flags::try_parse_from(argv).map(|f| f.nats)
    }

    /// Connects through `NatsArgs` as the user of `name` (a role or an executor id),
    /// executors with their own inbox prefix.
    async fn login(&self, name: &str) -> Client {
        let user = self.user(name);
        let pw = password(&user);
        let prefix = name
            .starts_with("exec-")
            .then(|| Subjects::executor_reply_prefix(&id(name)));
        self.flags(&["--user", &user, "--password", &pw])
            .expect("flags parse")
            .connect(name, prefix)
            .await
            .expect("login")
    }

    /// A raw connection as the user of `name` whose server errors are collected.
    async fn watched(&self, name: &str) -> Watched {
        let user = self.user(name);
        let (tx, events) = mpsc::unbounded_channel();
        let mut options = ConnectOptions::new()
            .user_and_password(user.clone(), password(&user))
            .event_callback(move |event| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(event);
                }
            });
        if name.starts_with("exec-") {
            options = options.custom_inbox_prefix(Subjects::executor_reply_prefix(&id(name)));
        }
        if name == "listener" {
            options = options.custom_inbox_prefix(Subjects::LISTENER_INBOX);
        }
        let client = options.connect(self.cluster.url()).await.expect("connect");
        Watched { client, events }
    }

    async fn start_driver(&self) -> Stoppable {
        self.start_driver_with(Default::default()).await
    }

    async fn start_driver_with(&self, journal: ember::driver::JournalMode) -> Stoppable {
        let client = self.login("driver").await;
        let config = DriverConfig {
            revive_interval: Duration::from_millis(200),
            journal,
            ..DriverConfig::new(self.subjects().clone())
        };
        let driver = Stoppable::spawn(|stop| async move {
            driver::run(client, config, stop)
                .await
                .expect("driver runs")
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        driver
    }

    async fn start_executor(&self, name: &str) -> Stoppable {
        self.start_executor_with(name, Handlers::builtin()).await
    }

    async fn start_executor_with(&self, name: &str, handlers: Handlers) -> Stoppable {
        let client = self.login(name).await;
        let config = ExecutorConfig {
            subjects: self.subjects.clone(),
            ..self.cluster.executor_config(name, 2)
        };
        Stoppable::spawn(|stop| async move {
            let _ = executor::run(client, config, handlers, stop).await;
        })
    }

    /// The driver, exec-1 registered, and a client.
    async fn running(&self) -> (Stoppable, Stoppable, ember::client::EmberClient) {
        let driver = self.start_driver().await;
        let exec1 = self.start_executor("exec-1").await;
        let api =
            ember::client::EmberClient::new(self.login("client").await, self.subjects().clone());
        common::eventually(Duration::from_secs(10), "exec-1 registered", || async {
            let snapshot = api.executors().await.ok()?;
            (snapshot.registered_executors == 1).then_some(())
        })
        .await;
        (driver, exec1, api)
    }
}

fn id(text: &str) -> ExecutorId {
    ExecutorId::parse(text).expect("valid id")
}

/// A task that stops when told, or is aborted when dropped.
struct Stoppable {
    stop: Option<oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<()>,
}

impl Stoppable {
    fn spawn<F, Fut>(start: F) -> Self
    where
        F: FnOnce(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel();
        let handle = tokio::spawn(start(Box::pin(async move {
            let _ = stopped.await;
        })));
        Self {
            stop: Some(stop),
            handle,
        }
    }

    fn is_running(&self) -> bool {
        !self.handle.is_finished()
    }

    /// Tells it to stop and waits until it has: a driver so stopped has closed its NATS
    /// service, which would otherwise go on answering discovery requests.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        within(Duration::from_secs(10), &mut self.handle)
            .await
            .expect("it stops");
    }
}

impl Drop for Stoppable {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.handle.abort();
    }
}

/// A connection and the events its client reported.
struct Watched {
    client: Client,
    events: mpsc::UnboundedReceiver<Event>,
}

impl Watched {
    /// Publishes with a reply subject under this connection's own inbox, and flushes.
    async fn send(&self, subject: String, payload: bytes::Bytes) {
        let reply = self.client.new_inbox();
        self.client
            .publish_with_reply(subject, reply, payload)
            .await
            .expect("publish is buffered");
        self.client.flush().await.expect("flush");
    }

    async fn subscribe(&self, subject: &str) -> Subscriber {
        let sub = self
            .client
            .subscribe(subject.to_string())
            .await
            .expect("subscribe is buffered");
        self.client.flush().await.expect("flush");
        sub
    }

    /// Waits for the server's permissions violation naming `op` ("Publish" or "Subscription")
    /// and `subject`.
    async fn violation(&mut self, op: &str, subject: &str) {
        let wanted = format!("Permissions Violation for {op} to \"{subject}\"");
        let found = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(event) = self.events.recv().await {
                if let Event::ServerError(ServerError::Other(text)) = &event {
                    if text.contains(&wanted) {
                        return true;
                    }
                }
            }
            false
        })
        .await;
        assert_eq!(found, Ok(true), "no event {wanted:?} reported");
    }
}

/// Asserts that nothing arrives on `sub` within [`SILENCE`].
async fn silent(sub: &mut Subscriber, what: &str) {
    absent_where(sub, what, |_| true).await
}

/// Asserts that no message with `payload` arrives on `sub` within [`SILENCE`]; other traffic
/// (a running executor's own heartbeats, say) is let by.
async fn absent(sub: &mut Subscriber, what: &str, payload: &[u8]) {
    absent_where(sub, what, |m| m.payload.as_ref() == payload).await
}

async fn absent_where(
    sub: &mut Subscriber,
    what: &str,
    is_attack: impl Fn(&async_nats::Message) -> bool,
) {
    let deadline = tokio::time::Instant::now() + SILENCE;
    while let Ok(Some(message)) = tokio::time::timeout_at(deadline, sub.next()).await {
        assert!(
            !is_attack(&message),
            "{what}: {} arrived on {}",
            String::from_utf8_lossy(&message.payload),
            message.subject
        );
    }
}

/// The next message on `sub`, within 5 s: the positive controls that show a silent
/// subscriber would have seen the message.
async fn arrives(sub: &mut Subscriber) -> async_nats::Message {
    within(Duration::from_secs(5), sub.next())
        .await
        .expect("subscription open")
}

fn register_as(claimed: &str) -> bytes::Bytes {
    encode(&RegisterRequest::RegisterExecutor(RegisterExecutor {
        executor_id: id(claimed),
        instance_id: uuid::Uuid::new_v4(),
        host_port: "evil:1".into(),
        cores: 64,
        log_urls: Default::default(),
        attributes: Default::default(),
        resources: Default::default(),
        held: Vec::new(),
        connection: None,
    }))
}

fn heartbeat_as(claimed: &str) -> bytes::Bytes {
    encode(&HeartbeatRequest::ExecutorExiting {
        executor_id: id(claimed),
        instance_id: uuid::Uuid::new_v4(),
    })
}

fn status_as(claimed: &str) -> bytes::Bytes {
    encode(&StatusRequest::StatusUpdates {
        executor_id: id(claimed),
        updates: vec![StatusUpdate {
            task_id: 1,
            attempt: 0,
            state: TaskState::Finished,
            result: None,
            error: None,
            result_object: None,
            no_retry: false,
        }],
        driver_instance: None,
    })
}

#[tokio::test]
async fn anonymous_clients_and_wrong_passwords_are_refused() {
    let secure = Secure::start_with(
        "auth",
        |users| users[1].password = PLACEHOLDER_PASSWORD.into(),
        "",
    );
    let url = secure.cluster.url();
    assert!(
        ConnectOptions::new().connect(&url).await.is_err(),
        "anonymous"
    );
    let user = |name: &str| secure.user(name);
    for (user, pw) in [
        (user("exec-2"), "wrong".to_string()),
        (user("exec-2"), String::new()),
        (user("driver"), password(&user("exec-2"))),
        (user("nobody"), password(&user("exec-2"))),
        (user("exec-1"), PLACEHOLDER_PASSWORD.to_string()),
        (user("exec-1"), password(&user("exec-1"))),
        // The role's name alone is no user: every name carries the cluster.
        ("exec-2".to_string(), password(&user("exec-2"))),
        ("exec-2".to_string(), password("exec-2")),
    ] {
        let result = ConnectOptions::new()
            .user_and_password(user.clone(), pw.clone())
            .connect(&url)
            .await;
        assert!(result.is_err(), "{user} with {pw:?} got in");
    }
    // exec-1's password was replaced by the placeholder above, so that pair was refused;
    // the right password for a user that has one gets in.
    secure.login("exec-2").await;
    // A user without a password is a mistake, not anonymous access.
    let flags = secure
        .flags(&["--user", &secure.user("driver")])
        .expect("flags parse");
    assert!(flags.connect("test", None).await.is_err());
}

#[tokio::test]
async fn an_executor_cannot_register_heartbeat_or_report_as_another() {
    let secure = Secure::start("impersonate");
    let (driver, exec1, api) = secure.running().await;
    let before = api.executors().await.expect("registry");
    let observer = secure.watched("driver").await;
    let p = secure.subjects().prefix().to_string();
    let mut attacker = secure.watched("exec-2").await;
    let target = id("exec-1");
    let attempts = [
        (secure.subjects().register(&target), register_as("exec-1")),
        (secure.subjects().heartbeat(&target), heartbeat_as("exec-1")),
        (secure.subjects().status(&target), status_as("exec-1")),
        // Another executor's id on the attacker's own kind of subject, in another place.
        (format!("{p}.driver.register.exec-3"), register_as("exec-3")),
        (
            secure.subjects().api(),
            encode(&ApiRequest::StopAllExecutors),
        ),
    ];
    for (subject, payload) in attempts {
        let mut seen = observer.subscribe(&subject).await;
        attacker.send(subject.clone(), payload.clone()).await;
        attacker.violation("Publish", &subject).await;
        absent(&mut seen, &subject, &payload).await;
    }
    // What NATS lets through (its own subject), the driver checks: the payload's id must be
    // the subject's.
    let own = secure.subjects().register(&id("exec-2"));
    let reply = attacker
        .client
        .request(own, register_as("exec-1"))
        .await
        .expect("the driver answers");
    let text = String::from_utf8_lossy(&reply.payload).to_string();
    assert!(
        text.contains("RegisterExecutorFailed") && text.contains("does not match"),
        "{text}"
    );
    assert_eq!(
        common::heard_from_aside(api.executors().await.expect("registry")),
        common::heard_from_aside(before.clone())
    );
    assert!(driver.is_running() && exec1.is_running());
}

#[tokio::test]
async fn an_executor_cannot_read_another_inbox_or_a_wildcard_above_its_own() {
    let secure = Secure::start("eavesdrop");
    let (_driver, _exec1, api) = secure.running().await;
    let p = secure.subjects().prefix().to_string();
    let mut attacker = secure.watched("exec-2").await;
    let mut stolen = Vec::new();
    for subject in [
        format!("{p}.executor.exec-1"),
        format!("{p}.executor.*"),
        format!("{p}.executor.>"),
        format!("{p}.events.>"),
        format!("{p}.driver.>"),
        format!("{p}.>"),
        "ember.>".to_string(),
        ">".to_string(),
        "_INBOX.>".to_string(),
        "_INBOX.*.>".to_string(),
        "_INBOX.exec-1.>".to_string(),
    ] {
        stolen.push((subject.clone(), attacker.subscribe(&subject).await));
        attacker.violation("Subscription", &subject).await;
    }
    // Traffic the attacker would have seen: a message to exec-1's inbox, a reply to exec-1,
    // events. Each reaches the one it is for.
    let driver_conn = secure.watched("driver").await;
    let exec1 = secure.watched("exec-1").await;
    let mut inbox = exec1.subscribe(&format!("{p}.executor.exec-1")).await;
    let listener = secure.watched("listener").await;
    let mut events = listener.subscribe(&format!("{p}.events.>")).await;
    let job = api.run_job(noops(2), |_| {}).await.expect("a job runs");
    assert_eq!(job.state, JobState::Succeeded);
    arrives(&mut events).await;
    let kill = ExecutorMessage::KillTask {
        task_id: 999_999,
        attempt: 0,
        reason: "probe".into(),
        driver_instance: None,
    };
    driver_conn
        .client
        .publish(format!("{p}.executor.exec-1"), encode(&kill))
        .await
        .expect("publish");
    driver_conn.client.flush().await.expect("flush");
    // exec-1's inbox saw the job's launches, then the probe.
    let mut probe_seen = false;
    while !probe_seen {
        probe_seen = arrives(&mut inbox).await.payload.as_ref() == encode(&kill).as_ref();
    }
    let answer = exec1
        .client
        .request(format!("{p}.driver.register.exec-1"), "{}".into())
        .await
        .expect("exec-1 gets its own reply");
    assert!(String::from_utf8_lossy(&answer.payload).contains("RegisterExecutorFailed"));
    for (subject, mut sub) in stolen {
        silent(&mut sub, &subject).await;
    }
}

#[tokio::test]
async fn an_executor_cannot_publish_events_or_send_to_another_executor() {
    let secure = Secure::start("forge");
    let (_driver, _exec1, api) = secure.running().await;
    let before = api.executors().await.expect("registry");
    let p = secure.subjects().prefix().to_string();
    let listener = secure.watched("listener").await;
    let exec1 = secure.watched("exec-1").await;
    let mut attacker = secure.watched("exec-2").await;
    let forged_end = EmberEvent::JobEnd {
        time_ms: 1,
        job_id: 1,
        state: JobState::Succeeded,
        succeeded: 1,
        failed: 0,
        killed: 0,
        reason: None,
    };
    let launch = ExecutorMessage::StopExecutor {
        reason: "forged".into(),
    };
    for (subject, payload, observer) in [
        (
            secure.subjects().event("job.end"),
            encode(&forged_end),
            &listener,
        ),
        (format!("{p}.executor.exec-1"), encode(&launch), &exec1),
    ] {
        let mut seen = observer.subscribe(&subject).await;
        attacker.send(subject.clone(), payload.clone()).await;
        attacker.violation("Publish", &subject).await;
        absent(&mut seen, &subject, &payload).await;
    }
    assert_eq!(
        common::heard_from_aside(api.executors().await.expect("registry")),
        common::heard_from_aside(before.clone())
    );
}

#[tokio::test]
async fn a_listener_can_only_listen() {
    let secure = Secure::start("listener");
    let (_driver, _exec1, api) = secure.running().await;
    let p = secure.subjects().prefix().to_string();
    let mut listener = secure.watched("listener").await;
    let mut events = listener.subscribe(&format!("{p}.events.>")).await;
    let observer = secure.watched("driver").await;
    let exec1 = secure.watched("exec-1").await;
    for (subject, observer) in [
        (secure.subjects().api(), &observer),
        (secure.subjects().register(&id("exec-1")), &observer),
        (format!("{p}.executor.exec-1"), &exec1),
    ] {
        let mut seen = observer.subscribe(&subject).await;
        listener.send(subject.clone(), "{}".into()).await;
        listener.violation("Publish", &subject).await;
        absent(&mut seen, &subject, b"{}").await;
    }
    let subject = secure.subjects().event("job.end");
    listener.send(subject.clone(), "{}".into()).await;
    listener.violation("Publish", &subject).await;
    silent(&mut events, "the listener's own publish").await;
    let _snoop = listener.subscribe("_INBOX.>").await;
    listener.violation("Subscription", "_INBOX.>").await;
    // What it may do, it does: the events of a job arrive.
    api.submit(noops(1)).await.expect("submit");
    let first = arrives(&mut events).await;
    assert!(first.subject.starts_with(&format!("{p}.events.")));
}

#[tokio::test]
async fn a_client_cannot_act_as_an_executor_nor_read_its_replies() {
    let secure = Secure::start("client");
    let (_driver, _exec1, api) = secure.running().await;
    let before = api.executors().await.expect("registry");
    let p = secure.subjects().prefix().to_string();
    let observer = secure.watched("driver").await;
    let mut client = secure.watched("client").await;
    for (subject, payload) in [
        (
            secure.subjects().register(&id("exec-1")),
            register_as("exec-1"),
        ),
        (
            secure.subjects().register(&id("exec-9")),
            register_as("exec-9"),
        ),
        (
            secure.subjects().heartbeat(&id("exec-1")),
            heartbeat_as("exec-1"),
        ),
        (secure.subjects().status(&id("exec-1")), status_as("exec-1")),
    ] {
        let mut seen = observer.subscribe(&subject).await;
        client.send(subject.clone(), payload.clone()).await;
        client.violation("Publish", &subject).await;
        absent(&mut seen, &subject, &payload).await;
    }
    let subject = format!("{p}.executor.exec-1");
    let mut launches = client.subscribe(&subject).await;
    client.violation("Subscription", &subject).await;
    // A client may read replies under _INBOX, but not those sent to an executor.
    let mut replies = client.subscribe("_INBOX.>").await;
    let exec1 = secure.watched("exec-1").await;
    let answer = exec1
        .client
        .request(secure.subjects().register(&id("exec-1")), "{}".into())
        .await
        .expect("exec-1 gets its reply");
    assert!(String::from_utf8_lossy(&answer.payload).contains("RegisterExecutorFailed"));
    silent(&mut replies, "exec-1's reply, at a client").await;
    silent(&mut launches, "exec-1's inbox, at a client").await;
    assert_eq!(
        common::heard_from_aside(api.executors().await.expect("registry")),
        common::heard_from_aside(before.clone())
    );
}

#[tokio::test]
async fn the_driver_answers_only_into_the_requesters_own_inbox() {
    let secure = Secure::start("hijack");
    let (driver, _exec1, api) = secure.running().await;
    let before = api.executors().await.expect("registry");
    let p = secure.subjects().prefix().to_string();
    let victim = secure.watched("exec-1").await;
    let mut victim_replies = victim.subscribe("_INBOX.exec-1.>").await;
    let mut victim_inbox = victim.subscribe(&format!("{p}.executor.exec-1")).await;
    let listener = secure.watched("listener").await;
    let mut events = listener.subscribe(&format!("{p}.events.>")).await;
    let attacker = secure.watched("exec-2").await;
    let own = id("exec-2");
    for (subject, payload) in [
        (secure.subjects().register(&own), register_as("exec-2")),
        (secure.subjects().heartbeat(&own), heartbeat_as("exec-2")),
        (secure.subjects().status(&own), status_as("exec-2")),
        (secure.subjects().register(&own), "not json".into()),
    ] {
        for reply in [
            "_INBOX.exec-1.hijack".to_string(),
            format!("{p}.executor.exec-1"),
            format!("{p}.events.job.end"),
        ] {
            attacker
                .client
                .publish_with_reply(subject.clone(), reply, payload.clone())
                .await
                .expect("NATS lets a requester name any reply subject");
        }
    }
    attacker.client.flush().await.expect("flush");
    absent_where(
        &mut victim_replies,
        "a reply hijacked into exec-1's replies",
        |m| m.subject.as_str() == "_INBOX.exec-1.hijack",
    )
    .await;
    silent(&mut victim_inbox, "a reply hijacked into exec-1's inbox").await;
    silent(&mut events, "a reply hijacked into the events").await;
    // The refused registration changed nothing; the same request with its own reply works.
    assert_eq!(
        common::heard_from_aside(api.executors().await.expect("registry")),
        common::heard_from_aside(before.clone())
    );
    let answer = attacker
        .client
        .request(secure.subjects().register(&own), register_as("exec-2"))
        .await
        .expect("an answer into its own inbox");
    assert!(String::from_utf8_lossy(&answer.payload).contains("RegisteredExecutor"));
    assert!(driver.is_running());
}

/// The driver's api answers wherever the requester points its reply, and the driver's user
/// may publish to executors' inboxes: a client can have the driver publish an api answer into
/// an executor's inbox. The answer does not decode there (it is dropped), but the driver
/// should refuse such a reply subject as it does for executors' requests.
#[tokio::test]
async fn the_driver_does_not_answer_api_requests_into_an_executor_inbox() {
    let secure = Secure::start("api-hijack");
    let (_driver, _exec1, _api) = secure.running().await;
    let p = secure.subjects().prefix().to_string();
    let victim = secure.watched("exec-1").await;
    let mut victim_inbox = victim.subscribe(&format!("{p}.executor.exec-1")).await;
    let mut victim_replies = victim.subscribe("_INBOX.exec-1.>").await;
    let client = secure.watched("client").await;
    for reply in [format!("{p}.executor.exec-1"), "_INBOX.exec-1.x".into()] {
        client
            .client
            .publish_with_reply(
                secure.subjects().api(),
                reply,
                bytes::Bytes::from_static(br#"{"type":"GetJob","job_id":999}"#),
            )
            .await
            .expect("publish");
    }
    client.client.flush().await.expect("flush");
    // exec-1's own heartbeats are answered into its replies meanwhile; only the api answer
    // (no job 999) must not arrive.
    let api_answer = |m: &async_nats::Message| {
        String::from_utf8_lossy(&m.payload).contains("no job with id 999")
    };
    absent_where(
        &mut victim_inbox,
        "an api answer in exec-1's inbox",
        api_answer,
    )
    .await;
    absent_where(
        &mut victim_replies,
        "an api answer in exec-1's replies",
        api_answer,
    )
    .await;
}

#[tokio::test]
async fn the_whole_cluster_runs_a_job_with_least_privilege() {
    let secure = Secure::start("works");
    let (driver, exec1, api) = secure.running().await;
    let exec2 = secure.start_executor("exec-2").await;
    common::eventually(Duration::from_secs(10), "exec-2 registered", || async {
        let snapshot = api.executors().await.ok()?;
        (snapshot.registered_executors == 2).then_some(())
    })
    .await;
    let job = api.run_job(noops(20), |_| {}).await.expect("job runs");
    assert_eq!((job.state, job.succeeded), (JobState::Succeeded, 20));
    assert!(driver.is_running() && exec1.is_running() && exec2.is_running());
}

/// An executor reads the results its tasks read on its own results subject (what a python
/// task with futures in its arguments needs), and nothing else there; no one else may ask
/// there, and the answer goes only into the asker's own inbox.
#[tokio::test]
async fn an_executor_reads_results_on_its_own_subject_and_nothing_else() {
    let secure = Secure::start("reads");
    let (driver, _exec1, api) = secure.running().await;
    let job = api.run_job(noops(3), |_| {}).await.expect("job runs");
    let mut executor = secure.watched("exec-2").await;
    let own = secure.subjects().results(&id("exec-2"));
    let ask = |request: ApiRequest| {
        let (client, own) = (executor.client.clone(), own.clone());
        async move {
            let reply = client
                .request(own, encode(&request))
                .await
                .expect("the driver answers");
            decode::<ApiReply>(&reply.payload, usize::MAX).expect("an api reply")
        }
    };
    let read = ask(ApiRequest::GetResults {
        job_id: job.job_id,
        offset: 0,
        limit: 10,
    })
    .await;
    let ApiReply::Results(page) = read else {
        panic!("{read:?}");
    };
    assert_eq!(page.results.len(), 3);
    assert!(page.results.iter().all(|o| o.state == TaskState::Finished));
    for refused in [
        ApiRequest::StopAllExecutors,
        ApiRequest::GetJob { job_id: job.job_id },
    ] {
        let answer = ask(refused).await;
        assert!(
            matches!(&answer, ApiReply::Error { message } if message.contains("only results")),
            "{answer:?}"
        );
    }
    // Another's subject, or its own asking to be answered in another's inbox: refused.
    let observer = secure.watched("driver").await;
    let mut seen = observer.subscribe("_INBOX.exec-1.>").await;
    let theirs = secure.subjects().results(&id("exec-1"));
    let get = encode(&ApiRequest::GetResults {
        job_id: job.job_id,
        offset: 0,
        limit: 10,
    });
    executor.send(theirs.clone(), get.clone()).await;
    executor.violation("Publish", &theirs).await;
    executor
        .client
        .publish_with_reply(own.clone(), "_INBOX.exec-1.stolen".to_string(), get.clone())
        .await
        .expect("NATS lets a requester name any reply subject");
    executor.client.flush().await.expect("flush");
    absent_where(&mut seen, "results answered into exec-1's inbox", |m| {
        m.subject.as_str() == "_INBOX.exec-1.stolen"
    })
    .await;
    assert!(driver.is_running());
}

#[tokio::test]
async fn the_driver_journals_with_least_privilege_and_no_one_else_can_write_the_journal() {
    let (_store, secure) = Secure::start_with_jetstream("journal");
    let driver = secure
        .start_driver_with(ember::driver::JournalMode::On)
        .await;
    // A result too large for one message: the executor puts it in the object store itself.
    let big = "r".repeat(3 << 20);
    let mut handlers = Handlers::builtin();
    let made = big.clone();
    handlers.register("big", move |_, _| Ok(serde_json::json!(made)));
    let exec1 = secure.start_executor_with("exec-1", handlers).await;
    let api =
        ember::client::EmberClient::new(secure.login("client").await, secure.subjects().clone());
    let job = api.run_job(noops(20), |_| {}).await.expect("job runs");
    assert_eq!((job.state, job.succeeded), (JobState::Succeeded, 20));
    let large = SubmitJob {
        speculation: None,
        tasks: vec![TaskSpec::Handler {
            name: "big".into(),
            arg: serde_json::Value::Null,
        }],
        ..noops(1)
    };
    let job = api.run_job(large, |_| {}).await.expect("job runs");
    let results = api.results(job.job_id).await.expect("results");
    assert_eq!(
        results[0].result.as_ref().and_then(|r| r.as_str()),
        Some(big.as_str()),
        "{:?}",
        results[0].error
    );
    assert!(driver.is_running() && exec1.is_running());
    let subjects = secure.subjects();
    let journal = subjects.journal();
    let purge = format!("$JS.API.STREAM.PURGE.{}", subjects.journal_stream());
    let a_result = format!("$KV.{}.{}.0", subjects.results_bucket(), job.job_id);
    for user in ["exec-1", "client", "listener"] {
        let mut attacker = secure.watched(user).await;
        for subject in [&journal, &purge, &a_result] {
            attacker.send(subject.clone(), "{}".into()).await;
            attacker.violation("Publish", subject).await;
        }
    }
}

#[tokio::test]
async fn clients_and_executors_use_the_object_store_and_only_the_driver_may_purge_it() {
    use ember::objects::ObjectRef;
    let (_store, secure) = Secure::start_with_jetstream("objects");
    let _driver = secure
        .start_driver_with(ember::driver::JournalMode::On)
        .await;
    let _exec1 = secure.start_executor("exec-1").await;
    let api =
        ember::client::EmberClient::new(secure.login("client").await, secure.subjects().clone());
    let objects = api.objects().await.expect("a client opens the store");
    let input = objects
        .put_bytes(bytes::Bytes::from_static(b"three\nwords\nhere\n"))
        .await
        .expect("a client puts");
    let mut job = noops(2);
    job.tasks = vec![TaskSpec::Command {
        argv: vec!["sh".into(), "-c".into(), "wc -l < in.txt > out.txt".into()],
        env: Default::default(),
        cwd: None,
        timeout_ms: Some(30_000),
        inputs: [("in.txt".to_string(), input.object.clone())].into(),
        outputs: vec!["out.txt".into()],
    }];
    let job = api.run_job(job, |_| {}).await.expect("job runs");
    assert_eq!(
        (job.state, job.succeeded),
        (JobState::Succeeded, 2),
        "{job:?}"
    );
    let results = api.results(job.job_id).await.expect("results");
    let output = results[0].result.as_ref().expect("a result")["outputs"]["out.txt"]
        .as_str()
        .map(|r| ObjectRef::parse(r).expect("a reference"))
        .expect("the output's reference");
    let counted = objects.get_bytes(&output).await.expect("a client reads");
    assert_eq!(String::from_utf8_lossy(&counted).trim(), "3");

    let subjects = secure.subjects();
    let bucket = subjects.objects_bucket();
    let purge = format!("$JS.API.STREAM.PURGE.OBJ_{bucket}");
    let delete = format!("$JS.API.STREAM.DELETE.OBJ_{bucket}");
    for user in ["exec-1", "client", "listener"] {
        let mut attacker = secure.watched(user).await;
        for subject in [&purge, &delete] {
            attacker.send(subject.clone(), "{}".into()).await;
            attacker.violation("Publish", subject).await;
        }
    }
    let chunk = format!("$O.{bucket}.C.from-a-listener");
    let mut listener = secure.watched("listener").await;
    listener.send(chunk.clone(), "x".into()).await;
    listener.violation("Publish", &chunk).await;
}

#[tokio::test]
async fn nkey_users_log_in_with_a_seed_file() {
    let users = format!(
        "\nauthorization {{ users = [ {{ nkey: \"{TEST_NKEY_PUBLIC}\", permissions: {{ publish: \"ember.>\", subscribe: \"ember.>\" }} }} ] }}\n"
    );
    let config = TempFile::new("nkey.conf", &users);
    let server = NatsServer::start(&["-c", config.path()]).expect("start nats-server");
    let seed = TempFile::new("seed", &format!("# a test-only user\n{TEST_NKEY_SEED}\n"));
    let flags = |extra: &[&str]| {
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            nats: NatsArgs,
        }
        let mut argv = vec!["test", "--nats-url"];
        let url = server.url();
        argv.push(&url);
        argv.extend(extra);
        Flags::try_parse_from(argv).expect("flags parse").nats
    };
    let client = flags(&["--nkey", seed.path()])
        .connect("test", None)
        .await
        .expect("the seed logs in");
    client
        .publish("ember.x.y", "hi".into())
        .await
        .expect("publish");
    client.flush().await.expect("flush");
    assert!(flags(&[]).connect("test", None).await.is_err(), "anonymous");
    let other = TempFile::new(
        "other-seed",
        "SUAFTP3MTY4GRILYVEA2HNCJR62WAF5VO235WU4OUNCHO7BRIHX54TXQWE\n",
    );
    assert!(
        flags(&["--nkey", other.path()])
            .connect("test", None)
            .await
            .is_err(),
        "another seed"
    );
    let empty = TempFile::new("no-seed", "just a comment\n");
    let error = flags(&["--nkey", empty.path()]).connect("test", None).await;
    assert!(matches!(
        error,
        Err(ember::connect::ConnectError::Nkey { .. })
    ));
}

#[tokio::test]
async fn a_listener_reads_the_event_history_and_cannot_delete_or_write_it() {
    let (_store, secure) = Secure::start_with_jetstream("history");
    let _driver = secure
        .start_driver_with(ember::driver::JournalMode::On)
        .await;
    let _exec1 = secure.start_executor("exec-1").await;
    let api =
        ember::client::EmberClient::new(secure.login("client").await, secure.subjects().clone());
    let job = api.run_job(noops(5), |_| {}).await.expect("job runs");
    let mut listener = secure.watched("listener").await;
    // The history, from its start, read under the listener's rights: the job's end is there.
    let mut reader = ember::history::Reader::open(
        &listener.client,
        secure.subjects(),
        ember::history::Start::All,
    )
    .await
    .expect("a listener may read the history");
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(ember::protocol::Event::JobEnd { job_id, .. }) = reader.next().await.event {
                return job_id;
            }
        }
    })
    .await;
    assert_eq!(ended, Ok(job.job_id));
    let stream = secure.subjects().events_stream();
    for call in [
        "STREAM.DELETE",
        "STREAM.PURGE",
        "STREAM.UPDATE",
        "STREAM.MSG.DELETE",
    ] {
        let subject = format!("$JS.API.{call}.{stream}");
        listener.send(subject.clone(), "{}".into()).await;
        listener.violation("Publish", &subject).await;
    }
    let journal = format!(
        "$JS.API.CONSUMER.CREATE.{}",
        secure.subjects().journal_stream()
    );
    listener.send(journal.clone(), "{}".into()).await;
    listener.violation("Publish", &journal).await;
    let event = secure.subjects().event("job.end");
    listener.send(event.clone(), "{}".into()).await;
    listener.violation("Publish", &event).await;
    let jetstream = async_nats::jetstream::new(secure.login("driver").await);
    let info = jetstream
        .get_stream(&stream)
        .await
        .expect("the stream is still there");
    assert!(info.cached_info().state.messages > 0);
}

#[tokio::test]
async fn the_shipped_example_is_what_ember_creds_writes_and_lets_nobody_in() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/nats-secure.conf");
    let shipped = std::fs::read_to_string(path).expect("nats-secure.conf");
    let args = creds::CredsArgs {
        executors: 2,
        executor_ids: vec![],
        password_file: None,
        random: false,
        placeholder: true,
        full: true,
        tenants: Vec::new(),
        topology: Default::default(),
    };
    assert_eq!(
        creds::creds(&args, ember::DEFAULT_CLUSTER).expect("creds"),
        shipped,
        "regenerate with: ember creds --executors 2 --placeholder --full > nats-secure.conf"
    );
    let server = NatsServer::start(&["-c", path]).expect("nats-secure.conf starts");
    for name in ["driver", "exec-1", "client", "listener"] {
        let user = creds::user_name(ember::DEFAULT_CLUSTER, name);
        for pw in [PLACEHOLDER_PASSWORD, "", "password"] {
            let result = ConnectOptions::new()
                .user_and_password(user.clone(), pw.into())
                .connect(server.url())
                .await;
            assert!(result.is_err(), "{user} got in with {pw:?}");
        }
    }
    assert!(ConnectOptions::new().connect(server.url()).await.is_err());
}

/// The command that writes the shipped configs of `examples/many-hosts`.
const MANY_HOSTS: &str = "ember creds --executors 2 --placeholder --node n1=10.0.0.1 \
    --node n2=10.0.0.2 --node n3=10.0.0.3 --leaf edge=10.0.1.1 --tls-dir /etc/nats/certs \
    --out-dir examples/many-hosts";

#[test]
fn the_shipped_configs_of_many_hosts_are_what_ember_creds_writes() {
    #[derive(Parser)]
    struct Ember {
        #[command(flatten)]
        nats: NatsArgs,
        #[command(subcommand)]
        command: Creds,
    }
    #[derive(clap::Subcommand)]
    enum Creds {
        Creds(creds::CredsArgs),
    }
    let out = TempDir(std::env::temp_dir().join(format!("ember-hosts-{}", uuid::Uuid::new_v4())));
    let mut argv: Vec<String> = MANY_HOSTS.split_whitespace().map(String::from).collect();
    *argv.last_mut().unwrap() = out.0.display().to_string();
    let Ember {
        nats,
        command: Creds::Creds(args),
    } = Ember::try_parse_from(argv).expect("the command parses");
    let wrote = creds::creds(&args, &nats.cluster).expect("creds");
    assert_eq!(wrote.lines().count(), 4, "{wrote}");
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/many-hosts");
    for name in ["n1", "n2", "n3", "edge"] {
        let file = format!("{name}.conf");
        let written = std::fs::read_to_string(out.0.join(&file)).expect("written");
        assert!(written.starts_with("# EXAMPLE ONLY."), "{written}");
        assert_eq!(
            std::fs::read_to_string(format!("{shipped}/{file}")).expect("shipped"),
            written,
            "regenerate with: {MANY_HOSTS}"
        );
    }
}

/// A directory in the temp dir, removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn tls_flags_connect_to_a_server_that_verifies_clients() {
    let dir = TempDir(std::env::temp_dir().join(format!("ember-tls-{}", uuid::Uuid::new_v4())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    common::make_certs(&dir.0, &[("server", "127.0.0.1"), ("client", "127.0.0.1")]);
    let file = |name: &str| dir.0.join(name).to_str().expect("utf-8 path").to_string();
    let config = format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true }}\n",
        file("server.pem"),
        file("server.key"),
        file("ca.pem")
    );
    let config = TempFile::new("tls.conf", &config);
    let server = NatsServer::start(&["-c", config.path()]).expect("start nats-server");
    let url = server.url();
    let connect = |extra: Vec<String>| {
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            nats: NatsArgs,
        }
        let mut argv = vec!["test".to_string(), "--nats-url".into(), url.clone()];
        argv.extend(extra);
        async move {
            let flags = Flags::try_parse_from(argv).expect("flags parse").nats;
            flags.connect("test", None).await
        }
    };
    let full = vec![
        "--tls-ca".to_string(),
        file("ca.pem"),
        "--tls-cert".into(),
        file("client.pem"),
        "--tls-key".into(),
        file("client.key"),
    ];
    let client = connect(full)
        .await
        .expect("CA and client certificate connect");
    client.publish("t", "x".into()).await.expect("publish");
    client.flush().await.expect("a round trip over TLS");
    assert!(connect(vec![]).await.is_err(), "no TLS flags");
    let ca_only = vec!["--tls-ca".to_string(), file("ca.pem")];
    assert!(connect(ca_only).await.is_err(), "no client certificate");
    let wrong_ca = vec![
        "--tls-ca".to_string(),
        file("client.pem"),
        "--tls-cert".into(),
        file("client.pem"),
        "--tls-key".into(),
        file("client.key"),
    ];
    assert!(
        connect(wrong_ca).await.is_err(),
        "a CA that did not sign the server"
    );
    // A `nats` CLI context names the same files (and the server) just as well.
    let context = TempFile::new(
        "tls-context.json",
        &serde_json::json!({
            "url": url, "ca": file("ca.pem"), "cert": file("client.pem"),
            "key": file("client.key"), "user": "", "jetstream_domain": "",
        })
        .to_string(),
    );
    let flags = Flags::try_parse_from(["test", "--context", context.path()]).expect("flags");
    let client = flags
        .nats
        .connect("test", None)
        .await
        .expect("context connects");
    client.flush().await.expect("a round trip over TLS");
    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        nats: NatsArgs,
    }
    let half = Flags::try_parse_from(["test", "--tls-cert", "c.pem"]);
    assert!(half.is_err(), "--tls-cert needs --tls-key");
}

#[tokio::test]
async fn a_nats_context_gives_the_servers_credentials_and_inbox_and_flags_win() {
    let secure = Secure::start("context");
    let user = secure.user("client");
    let context = |password: &str| {
        let text = serde_json::json!({
            "description": "", "url": secure.cluster.url(), "user": user,
            "password": password, "token": "", "creds": "", "nkey": "", "cert": "", "key": "",
            "ca": "", "inbox_prefix": "_INBOX_ctx", "tls_first": false,
        });
        TempFile::new("context.json", &text.to_string())
    };
    let flags = |argv: &[&str]| {
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            nats: NatsArgs,
        }
        let mut all = vec!["test", "--cluster", &secure.name];
        all.extend(argv);
        Flags::try_parse_from(all).expect("flags parse").nats
    };
    let right = context(&password(&user));
    let client = flags(&["--context", right.path()])
        .connect("test", None)
        .await
        .expect("the context's server and user");
    assert!(client.new_inbox().starts_with("_INBOX_ctx."));
    client.flush().await.expect("a round trip");

    let wrong = context("wrong");
    let refused = flags(&["--context", wrong.path()])
        .connect("test", None)
        .await;
    assert!(refused.is_err(), "the context's wrong password got in");
    let pw = password(&user);
    let fixed = flags(&[
        "--context",
        wrong.path(),
        "--user",
        &user,
        "--password",
        &pw,
    ]);
    fixed
        .connect("test", None)
        .await
        .expect("flags win over the context");
    let elsewhere = flags(&[
        "--context",
        right.path(),
        "--nats-url",
        "nats://127.0.0.1:1",
    ]);
    assert!(
        elsewhere.connect("test", None).await.is_err(),
        "--nats-url wins over the context's url"
    );
    let missing = flags(&["--context", "/nonexistent/ember-context.json"]);
    let error = missing.connect("test", None).await.unwrap_err().to_string();
    assert!(error.contains("no nats context"), "{error}");
}

/// The binaries read their credentials from EMBER_USER and EMBER_PASSWORD; an executor started
/// with another executor's id is refused by NATS and says so.
#[tokio::test]
async fn the_binaries_log_in_from_the_environment() {
    let secure = Secure::start("binaries");
    let as_user = |mut command: tokio::process::Command, name: &str| {
        let user = secure.user(name);
        command
            .env("EMBER_USER", &user)
            .env("EMBER_PASSWORD", password(&user))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        command
    };
    let _driver = as_user(secure.cluster.driver_process(&[]), "driver")
        .spawn()
        .expect("ember-driver");
    let _exec1 = as_user(
        secure.cluster.executor_process("exec-1", &["--cores", "2"]),
        "exec-1",
    )
    .spawn()
    .expect("ember-executor");
    let api =
        ember::client::EmberClient::new(secure.login("client").await, secure.subjects().clone());
    common::eventually(Duration::from_secs(20), "exec-1 registered", || async {
        (api.executors().await.ok()?.registered_executors == 1).then_some(())
    })
    .await;
    let submitted = as_user(secure.cluster.cli(&["submit", "--tasks", "4"]), "client")
        .output()
        .await
        .expect("ember submit");
    assert!(
        submitted.status.success(),
        "{}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    let impostor = as_user(
        secure
            .cluster
            .executor_process("exec-1", &["--register-timeout", "1s"]),
        "exec-2",
    )
    .output();
    let impostor = within(Duration::from_secs(20), impostor)
        .await
        .expect("run");
    let stderr = String::from_utf8_lossy(&impostor.stderr);
    assert!(!impostor.status.success());
    assert!(stderr.contains("Permissions Violation"), "{stderr}");
    assert_eq!(
        api.executors()
            .await
            .expect("registry")
            .registered_executors,
        1
    );
}

/// Under `ember creds`' permissions the driver answers NATS service discovery, and a client
/// may ask for it; a listener, which may publish nothing, may not.
#[tokio::test]
async fn a_client_finds_the_driver_by_its_nats_service_and_a_listener_may_not_ask() {
    use futures::StreamExt;
    let secure = Secure::start("discovery");
    let (_driver, _exec1, _api) = secure.running().await;
    let client = secure.login("client").await;
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await.unwrap();
    client
        .publish_with_reply("$SRV.PING.ember-driver", inbox, bytes::Bytes::new())
        .await
        .unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(5), replies.next())
        .await
        .expect("the driver answers $SRV.PING.ember-driver")
        .unwrap();
    let ping: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(ping["name"], "ember-driver");
    assert_eq!(ping["metadata"]["leader"], "true");
    let mut listener = secure.watched("listener").await;
    let subject = "$SRV.PING.ember-driver".to_string();
    listener.send(subject.clone(), bytes::Bytes::new()).await;
    listener.violation("Publish", &subject).await;
}

/// Two clusters' `ember creds` output in one server config (an `accounts` block that includes
/// both files): both run jobs at the same time, each journaling in JetStream in its own
/// account, and no user of one can read or publish into the other's subjects or inboxes.
#[tokio::test]
async fn two_clusters_share_one_server_and_see_nothing_of_each_other() {
    let dir = TempDir(std::env::temp_dir().join(format!("ember-two-{}", uuid::Uuid::new_v4())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let names = [format!("a-{tag}"), format!("b-{tag}")];
    for name in &names {
        // `ember creds` keeps the passwords a password file already holds: these are the
        // ones the test logs in with.
        let file = dir.0.join(format!("{name}.passwords"));
        let lines: String = ["driver", "exec-1", "exec-2", "client", "listener"]
            .iter()
            .map(|role| creds::user_name(name, role))
            .map(|user| format!("{user} {}\n", password(&user)))
            .collect();
        std::fs::write(&file, lines).expect("password file");
        let args = creds::CredsArgs {
            executors: 2,
            executor_ids: vec![],
            password_file: Some(file),
            random: false,
            placeholder: false,
            full: false,
            tenants: Vec::new(),
            topology: Default::default(),
        };
        let text = creds::creds(&args, name).expect("creds");
        std::fs::write(dir.0.join(format!("{name}.conf")), text).expect("account file");
    }
    let config = dir.0.join("server.conf");
    std::fs::write(
        &config,
        format!(
            "jetstream {{ store_dir: {:?} }}\naccounts {{\n  include {}.conf\n  include {}.conf\n}}\n",
            dir.0.join("js").display().to_string(),
            names[0],
            names[1]
        ),
    )
    .expect("server config");
    let server = NatsServer::start(&["-c", config.to_str().expect("utf-8 path")])
        .expect("one server for both clusters");
    let a = Secure::on(server, &names[0], None);
    let b = Secure::beside(&a, &names[1]);

    // Both clusters at work at once, each with its journal in JetStream.
    let mut running = Vec::new();
    let mut apis = Vec::new();
    for secure in [&a, &b] {
        let driver = secure
            .start_driver_with(ember::driver::JournalMode::On)
            .await;
        let exec1 = secure.start_executor("exec-1").await;
        let api = ember::client::EmberClient::new(
            secure.login("client").await,
            secure.subjects().clone(),
        );
        common::eventually(Duration::from_secs(20), "exec-1 registered", || async {
            (api.executors().await.ok()?.registered_executors == 1).then_some(())
        })
        .await;
        running.push(Some((driver, exec1)));
        apis.push(api);
    }
    let (job_a, job_b) = tokio::join!(
        apis[0].run_job(noops(40), |_| {}),
        apis[1].run_job(noops(40), |_| {})
    );
    for job in [job_a, job_b] {
        let job = job.expect("a job runs");
        assert_eq!((job.state, job.succeeded), (JobState::Succeeded, 40));
    }

    // a stands still while b works: a's users hear nothing of it.
    stop(running[0].take()).await;
    hears_nothing_of(&a, &b, &apis[1]).await;
    // And the other way round (a's driver back, without a journal this time, so without
    // epochs: a new client, since the one above has seen epoch 1).
    let driver = a.start_driver_with(ember::driver::JournalMode::Off).await;
    let exec1 = a.start_executor("exec-1").await;
    apis[0] = ember::client::EmberClient::new(a.login("client").await, a.subjects().clone());
    common::eventually(
        Duration::from_secs(20),
        "exec-1 registered again",
        || async { (apis[0].executors().await.ok()?.registered_executors == 1).then_some(()) },
    )
    .await;
    running[0] = Some((driver, exec1));
    stop(running[1].take()).await;
    hears_nothing_of(&b, &a, &apis[0]).await;
}

/// Stops a cluster's driver and executor, the executor first.
async fn stop(running: Option<(Stoppable, Stoppable)>) {
    let (driver, executor) = running.expect("it runs");
    executor.stop().await;
    driver.stop().await;
}

/// While cluster `busy` runs a job and is pinged for its drivers, every user of `quiet` (whose
/// driver and executors are stopped) hears nothing on all it may subscribe to, is refused
/// every subject of `busy`, and what it may publish on a subject `busy` also uses (a NATS
/// service ping) does not reach `busy`.
async fn hears_nothing_of(quiet: &Secure, busy: &Secure, busy_api: &ember::client::EmberClient) {
    // What the stopped processes had in flight is delivered before anyone listens.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let q = quiet.subjects().prefix().to_string();
    let b = busy.subjects().prefix().to_string();
    // busy's own driver user, to show what an ear in its account hears.
    let busy_driver = busy.watched("driver").await;
    let mut busy_inboxes = busy_driver.subscribe("_INBOX.>").await;
    let mut busy_pings = busy_driver.subscribe("$SRV.>").await;
    // A ping quiet's client may send: `$SRV.PING.ember-driver` is busy's subject too.
    let quiet_client = quiet.watched("client").await;
    quiet_client
        .send("$SRV.PING.ember-driver".into(), bytes::Bytes::new())
        .await;
    silent(&mut busy_pings, "quiet's ping in busy's account").await;
    let mut ears = Vec::new();
    let mut connections = Vec::new();
    for (role, allowed) in [
        (
            "driver",
            vec![
                format!("{q}.driver.>"),
                "_INBOX.>".to_string(),
                "$SRV.>".into(),
            ],
        ),
        (
            "client",
            vec!["_INBOX.>".to_string(), format!("{q}.events.>")],
        ),
        (
            "listener",
            vec![
                format!("{q}.events.>"),
                format!("{}.>", Subjects::LISTENER_INBOX),
            ],
        ),
        (
            "exec-1",
            vec![
                format!("{q}.executor.exec-1"),
                "_INBOX.exec-1.>".to_string(),
            ],
        ),
    ] {
        let mut watched = quiet.watched(role).await;
        for subject in allowed {
            let sub = watched.subscribe(&subject).await;
            ears.push((format!("{} on {subject}", quiet.user(role)), sub));
        }
        for subject in [
            format!("{b}.>"),
            format!("{b}.executor.exec-1"),
            format!("{b}.events.>"),
        ] {
            let _refused = watched.subscribe(&subject).await;
            watched.violation("Subscription", &subject).await;
        }
        for subject in [
            format!("{b}.driver.api"),
            format!("{b}.executor.exec-1"),
            format!("{b}.driver.register.exec-1"),
        ] {
            watched.send(subject.clone(), "{}".into()).await;
            watched.violation("Publish", &subject).await;
        }
        connections.push(watched);
    }
    let busy_client = busy.watched("client").await;
    busy_client
        .send("$SRV.PING.ember-driver".into(), bytes::Bytes::new())
        .await;
    assert_eq!(
        arrives(&mut busy_pings).await.subject.as_str(),
        "$SRV.PING.ember-driver"
    );
    let job = busy_api
        .run_job(noops(20), |_| {})
        .await
        .expect("a job runs");
    assert_eq!((job.state, job.succeeded), (JobState::Succeeded, 20));
    // The replies busy's users got (the ping's, the api's) pass through its inboxes.
    arrives(&mut busy_inboxes).await;
    for (what, mut ear) in ears {
        silent(&mut ear, &what).await;
    }
}

/// Two tenants, each an account of its own importing the api, on the config `ember creds
/// --tenant` writes: each sees and touches only its own jobs, a header it forges names no
/// other account, it may not listen to the cluster's events; the cluster's own account sees
/// both.
#[tokio::test]
async fn tenants_see_and_touch_only_their_own_jobs() {
    let name = format!(
        "tenants-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let dir = TempDir(std::env::temp_dir().join(format!("ember-{name}")));
    std::fs::create_dir_all(&dir.0).unwrap();
    // Known passwords, which `ember creds` keeps: the ones `Secure::login` gives.
    let users = [
        "driver",
        "client",
        "listener",
        "exec-1",
        "tenant.acme",
        "tenant.globex",
    ];
    let known: String = users
        .iter()
        .map(|role| {
            let user = creds::user_name(&name, role);
            format!("{user} {}\n", password(&user))
        })
        .collect();
    let passwords = dir.0.join("passwords");
    std::fs::write(&passwords, known).unwrap();
    let written = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args([
            "creds",
            "--cluster",
            &name,
            "--executor-id",
            "exec-1",
            "--full",
        ])
        .args(["--tenant", "acme", "--tenant", "globex", "--password-file"])
        .arg(&passwords)
        .output()
        .unwrap();
    assert!(written.status.success(), "{written:?}");
    let config = format!(
        "{}\njetstream {{ store_dir: {:?} }}\n",
        String::from_utf8(written.stdout).unwrap(),
        dir.0.join("js").display().to_string()
    );
    let config = TempFile::new("nats.conf", &config);
    let server = NatsServer::start(&["-c", config.path()]).expect("start nats-server");
    let secure = Secure::on(server, &name, Some(config));
    let _driver = secure
        .start_driver_with(ember::driver::JournalMode::On)
        .await;
    let _exec1 = secure.start_executor("exec-1").await;
    let home =
        ember::client::EmberClient::new(secure.login("client").await, secure.subjects.clone());
    let acme =
        ember::client::EmberClient::new(secure.login("tenant.acme").await, secure.subjects.clone());
    let globex = ember::client::EmberClient::new(
        secure.login("tenant.globex").await,
        secure.subjects.clone(),
    );
    // A tenant hears the events of its own jobs on the cluster's event subjects, and may not
    // subscribe to another's subjects nor to the event history.
    let heard = |api: &ember::client::EmberClient| {
        let (nats, subjects) = (api.nats().clone(), secure.subjects.clone());
        async move {
            let subscriber = ember::events::subscribe(&nats, &subjects).await.unwrap();
            nats.flush().await.unwrap();
            ember::events::decoded(subscriber)
        }
    };
    let (acme_events, globex_events) = (heard(&acme).await, heard(&globex).await);
    let mut watched = secure.watched("tenant.acme").await;
    let globex_account = creds::tenant_account(&name, "globex");
    for refused in [
        secure.subjects.tenant_events(&globex_account),
        secure.subjects.history_all(),
    ] {
        let _refused = watched.subscribe(&refused).await;
        watched.violation("Subscription", &refused).await;
    }
    let submitted = |api: &ember::client::EmberClient| {
        let api = api.clone();
        async move {
            common::eventually(Duration::from_secs(10), "the driver takes a job", || {
                let api = api.clone();
                async move { api.submit(noops(3)).await.ok() }
            })
            .await
        }
    };
    let acme_job = submitted(&acme).await;
    let globex_job = submitted(&globex).await;
    let listed = |api: ember::client::EmberClient| async move {
        let jobs = api.jobs().await.expect("jobs listed");
        jobs.iter().map(|job| job.job_id).collect::<Vec<_>>()
    };
    assert_eq!(listed(acme.clone()).await, vec![acme_job]);
    assert_eq!(listed(globex.clone()).await, vec![globex_job]);
    assert_eq!(listed(home.clone()).await, vec![acme_job, globex_job]);
    let unknown = format!("no job with id {globex_job}");
    let refused = acme.job(globex_job).await.expect_err("another's job");
    assert!(refused.to_string().contains(&unknown), "{refused}");
    let refused = acme.kill(globex_job).await.expect_err("another's job");
    assert!(refused.to_string().contains(&unknown), "{refused}");
    let refused = acme.executors().await.expect_err("the cluster's own");
    assert!(
        refused.to_string().contains("a tenant may submit jobs"),
        "{refused}"
    );
    // A header of its own naming the other tenant changes nothing.
    let mut forged = async_nats::HeaderMap::new();
    forged.insert(
        "Nats-Request-Info",
        format!("{{\"acc\":\"{globex_account}\"}}").as_str(),
    );
    let request = ember::protocol::encode(&ApiRequest::ListJobs {
        offset: 0,
        limit: None,
        from_job: 0,
    });
    let answer = acme
        .nats()
        .request_with_headers(secure.subjects.api(), forged, request)
        .await
        .unwrap();
    match ember::protocol::decode::<ember::protocol::ApiReply>(&answer.payload, usize::MAX) {
        Ok(ember::protocol::ApiReply::Jobs { jobs, .. }) => {
            let ids: Vec<u64> = jobs.iter().map(|job| job.job_id).collect();
            assert_eq!(ids, vec![acme_job], "a forged header lists another's jobs");
        }
        Ok(ember::protocol::ApiReply::Error { .. }) => {}
        other => panic!("{other:?}"),
    }
    for (api, job) in [(&acme, acme_job), (&globex, globex_job)] {
        let ended = within(Duration::from_secs(30), api.wait(job, |_| {}))
            .await
            .unwrap();
        assert_eq!(ended.state, JobState::Succeeded, "{ended:?}");
        assert_eq!(api.results(job).await.unwrap().len(), 3);
    }
    for (events, job) in [(acme_events, acme_job), (globex_events, globex_job)] {
        let kinds = within(Duration::from_secs(10), until_job_end(events, job)).await;
        for kind in ["job.start", "task.start", "task.end", "job.end"] {
            assert!(
                kinds.contains(&kind),
                "no {kind} of its job heard: {kinds:?}"
            );
        }
    }
}

/// The kinds of the events `events` brings until job `job`'s end, each checked to be about that
/// job alone.
async fn until_job_end(
    events: impl futures::Stream<Item = (bytes::Bytes, Result<ember::protocol::Event, String>)>,
    job: u64,
) -> Vec<&'static str> {
    let mut events = Box::pin(events);
    let mut kinds = Vec::new();
    while let Some((_, event)) = events.next().await {
        let event = event.expect("an event that reads");
        assert_eq!(
            event.job_id(),
            Some(job),
            "another's event heard: {event:?}"
        );
        kinds.push(event.kind());
        if event.kind() == "job.end" {
            break;
        }
    }
    kinds
}
