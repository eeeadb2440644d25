//! The executor's NATS shell: registration, and one loop on the messaging thread that reads the
//! inbox, collects attempt ends, runs the timers, and sends what the executor machine
//! (`machine.rs`, which decides everything) asks for: at most one status batch and one heartbeat
//! in flight, a registration again when the driver has forgotten it, the drain's notices.

use super::gang_ports::GangPorts;
use super::machine::{Backoff, Machine, MachineConfig, Registered, Registration, Request, Run};
use super::python::{PythonConfig, PythonPool};
use super::runner::Runner;
use super::staging::ObjectAccess;
use super::tasks::Handlers;
use crate::connect::{connection_of, flush};
use crate::epoch::Newest;
use crate::ids::{ExecutorId, InstanceId};
use crate::metrics::ExecutorMetrics;
use crate::protocol::{
    decode, encode, ExecutorMessage, HeartbeatReply, HeartbeatRequest, RegisterExecutor,
    RegisterReply, RegisterRequest, RunningAttempt, StatusReply, StatusUpdate, TaskDescription,
};
use crate::subjects::Subjects;
use crate::{PAYLOAD_HEADROOM, REQUEST_TIMEOUT};
use async_nats::{Client, Message, Subject, Subscriber};
use futures::future::BoxFuture;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// Who the executor is, how it registers, and how it judges the driver alive.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    pub subjects: Subjects,
    pub executor_id: ExecutorId,
    pub host_port: String,
    pub cores: u32,
    pub log_urls: BTreeMap<String, String>,
    pub attributes: BTreeMap<String, String>,
    /// Custom resources beside cores, each with its addresses (`--resource gpu=2`).
    pub resources: crate::resources::Addresses,
    /// The ports it reserves for the tasks of gangs, registered as the resource `gang_port`.
    pub gang_ports: super::GangPortsConfig,
    /// How long the first registration keeps trying while no driver answers.
    pub register_timeout: Duration,
    pub heartbeat_interval: Duration,
    /// With no answer from the driver for this long, the driver counts as lost.
    pub driver_timeout: Duration,
    /// How long a draining executor lets running tasks finish before it hands them back.
    pub decommission_timeout: Duration,
    /// Exit (with [`crate::EXIT_DRIVER_LOST`]) when the driver is lost, instead of waiting to
    /// register with the next one.
    pub exit_on_driver_loss: bool,
    /// What the executor counts, for `--metrics-addr`.
    pub metrics: Arc<ExecutorMetrics>,
    /// How python tasks run; `None` refuses them (`--no-python`).
    pub python: Option<PythonConfig>,
    /// The executor's own directory: its cache of objects (`objects/`) and the directories
    /// of commands that get one (`tasks/`), each made when first needed.
    pub data_dir: std::path::PathBuf,
    /// The most bytes of objects the cache keeps on disk.
    pub object_cache_bytes: u64,
    /// Where the processes of this host share objects (see [`crate::objects::host`]).
    pub host_objects: crate::objects::host::HostSetting,
    /// Notified when the executor's NATS connection is made again: it tells the driver its new
    /// connection at once (see [`ConnectionId`]).
    pub connected: Arc<tokio::sync::Notify>,
}

impl ExecutorConfig {
    /// A configuration with Ember's defaults for everything but who the executor is.
    pub fn new(subjects: Subjects, executor_id: ExecutorId, host_port: String, cores: u32) -> Self {
        let data_dir = default_data_dir(&subjects, &executor_id);
        Self {
            subjects,
            executor_id,
            host_port,
            cores,
            log_urls: BTreeMap::new(),
            attributes: BTreeMap::new(),
            resources: BTreeMap::new(),
            gang_ports: super::GangPortsConfig::Auto,
            register_timeout: crate::DEFAULT_REGISTER_TIMEOUT,
            heartbeat_interval: crate::DEFAULT_HEARTBEAT_INTERVAL,
            driver_timeout: crate::DEFAULT_EXECUTOR_TIMEOUT,
            decommission_timeout: crate::DEFAULT_DECOMMISSION_TIMEOUT,
            exit_on_driver_loss: false,
            metrics: Arc::new(ExecutorMetrics::new()),
            python: Some(PythonConfig::default()),
            data_dir,
            object_cache_bytes: crate::objects::cache::DEFAULT_CACHE_BYTES,
            host_objects: crate::objects::host::HostSetting::Default,
            connected: Arc::default(),
        }
    }
}

/// Where an executor keeps its files unless told: `<temp dir>/ember-<cluster>-<executor id>`.
pub fn default_data_dir(subjects: &Subjects, executor_id: &ExecutorId) -> std::path::PathBuf {
    let cluster = subjects.prefix().trim_start_matches("ember.");
    std::env::temp_dir().join(format!("ember-{cluster}-{executor_id}"))
}

#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The driver answered `RegisterExecutorFailed`; the message is the driver's.
    #[error("{0}")]
    Refused(String),
    #[error("no driver answered within {0:?} (is ember-driver running on this cluster?)")]
    RegisterTimeout(Duration),
    #[error("the driver has not answered for {0:?}; exiting (--exit-on-driver-loss)")]
    DriverLost(Duration),
    #[error("could not subscribe to the inbox {subject}: {source}")]
    Subscribe {
        subject: String,
        source: async_nats::SubscribeError,
    },
    #[error("lost the NATS connection: {0}")]
    Connection(String),
    #[error("{0}")]
    GangPorts(String),
}

/// Registers and serves until `shutdown` completes (then drains and exits) or the driver stops
/// it. The client should have been connected with the inbox prefix
/// [`Subjects::executor_reply_prefix`], or the driver will not answer.
pub async fn run(
    client: Client,
    mut config: ExecutorConfig,
    handlers: Handlers,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ExecutorError> {
    tokio::pin!(shutdown);
    let gang_ports = GangPorts::register(&mut config).map_err(ExecutorError::GangPorts)?;
    let instance = InstanceId::new_v4();
    let epochs = Arc::new(Newest::new(config.driver_timeout));
    let (inbox, answers, status_replies, driver) = tokio::select! {
        started = start(&client, &config, instance, &epochs) => started?,
        _ = &mut shutdown => return Ok(()),
    };
    info!(executor = %config.executor_id, cores = config.cores, "registered");
    config.metrics.registered(false);
    Backend::new(
        client,
        config,
        instance,
        driver,
        handlers,
        status_replies,
        epochs,
        gang_ports,
    )
    .serve(inbox, answers, shutdown)
    .await
}

/// What the driver sends this executor: its own inbox, and what a new leader tells every
/// executor (`<p>.executors`).
type Inbox = futures::stream::Select<Subscriber, Subscriber>;

/// Subscribes to the executor's inbox and to the answers to its status batches, then registers;
/// returns both subscriptions, the answers' inbox and the driver's answer.
async fn start(
    client: &Client,
    config: &ExecutorConfig,
    instance: InstanceId,
    epochs: &Arc<Newest>,
) -> Result<(Inbox, Subscriber, String, Registration), ExecutorError> {
    let own = subscribe(client, config.subjects.executor_inbox(&config.executor_id)).await?;
    let every = subscribe(client, config.subjects.executors()).await?;
    let inbox = futures::stream::select(own, every);
    // Status answers come to `<inbox>.<batch>`: an inbox of this connection's own, under the
    // executor's prefix, so no other process (another cluster's executor of the same id, say)
    // shares it.
    let status_replies = client.new_inbox();
    let answers = subscribe(client, format!("{status_replies}.*")).await?;
    // No flush needed before registering: the server takes one connection's messages in
    // order, so the subscriptions are in place before the driver hears of this executor.
    let deadline = Some(Instant::now() + config.register_timeout);
    let driver = register(
        client.clone(),
        config.clone(),
        instance,
        Vec::new(),
        deadline,
        epochs.clone(),
    )
    .await?;
    Ok((inbox, answers, status_replies, driver))
}

async fn subscribe(client: &Client, subject: String) -> Result<Subscriber, ExecutorError> {
    client
        .subscribe(subject.clone())
        .await
        .map_err(|source| ExecutorError::Subscribe { subject, source })
}

/// Sends `RegisterExecutor`, saying what attempts it holds, until the driver answers, or
/// `deadline` passes; returns the driver's answer. An answer from an older epoch than the
/// newest seen is no answer.
async fn register(
    client: Client,
    config: ExecutorConfig,
    instance: InstanceId,
    held: Vec<RunningAttempt>,
    deadline: Option<Instant>,
    epochs: Arc<Newest>,
) -> Result<Registration, ExecutorError> {
    let request = RegisterRequest::RegisterExecutor(RegisterExecutor {
        executor_id: config.executor_id.clone(),
        instance_id: instance,
        host_port: config.host_port.clone(),
        cores: config.cores,
        log_urls: config.log_urls.clone(),
        attributes: config.attributes.clone(),
        resources: config.resources.clone(),
        held,
        connection: None,
    });
    let subject = config.subjects.register(&config.executor_id);
    let start = Instant::now();
    let mut backoff = Backoff::new(deadline.map(|d| millis(d - start)));
    loop {
        // The connection may change between attempts: each names the one it goes on.
        let RegisterRequest::RegisterExecutor(mut sent) = request.clone();
        sent.connection = connection_of(&client);
        let payload = encode(&RegisterRequest::RegisterExecutor(sent));
        let attempt = client.request(subject.clone(), payload);
        match tokio::time::timeout(REQUEST_TIMEOUT, attempt).await {
            // An answer from a driver that no longer leads is no answer: it goes again.
            Ok(Ok(reply)) if !epochs.hears(&reply) => {}
            Ok(Ok(reply)) => match decode::<RegisterReply>(&reply.payload, usize::MAX) {
                Ok(RegisterReply::RegisteredExecutor {
                    driver_instance,
                    term,
                    adopted,
                    ..
                }) => {
                    return Ok(Registration {
                        driver: driver_instance,
                        term,
                        adopted,
                    })
                }
                Ok(RegisterReply::RegisterExecutorFailed { message }) => {
                    return Err(ExecutorError::Refused(message))
                }
                Err(error) => warn!(%error, "undecodable answer to RegisterExecutor; retrying"),
            },
            Ok(Err(error)) => debug!(%error, "no driver yet; retrying"),
            Err(_) => debug!("registration timed out; retrying"),
        }
        let Some(pause) = backoff.next_pause(millis(start.elapsed())) else {
            return Err(ExecutorError::RegisterTimeout(config.register_timeout));
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

/// A request answered or not within [`REQUEST_TIMEOUT`], whatever the client's own request
/// timeout, and counting the wait to hand the request to the client's connection (which the
/// client's timeout does not). An answer from an older epoch than the newest seen is no
/// answer.
fn request<T: crate::protocol::Message + 'static>(
    client: &Client,
    subject: Subject,
    payload: bytes::Bytes,
    epochs: &Arc<Newest>,
) -> BoxFuture<'static, Result<T, String>> {
    let (client, epochs) = (client.clone(), epochs.clone());
    Box::pin(async move {
        // No timeout of the client's own beside this one: one timer per request is enough.
        let request = async_nats::Request::new().payload(payload).timeout(None);
        match tokio::time::timeout(REQUEST_TIMEOUT, client.send_request(subject, request)).await {
            Ok(Ok(reply)) if !epochs.hears(&reply) => {
                Err("answered by a driver that no longer leads".into())
            }
            Ok(Ok(reply)) => decode(&reply.payload, usize::MAX).map_err(|e| e.to_string()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("timed out".into()),
        }
    })
}

/// Waits for an optional future; never completes when there is none.
async fn maybe<T>(future: &mut Option<BoxFuture<'static, T>>) -> T {
    match future.as_mut() {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// How long a failed status batch waits before it goes again.
const STATUS_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// A status batch sent and not yet settled.
struct InFlight {
    /// Its number: its answer comes to `<status_replies><seq>`.
    seq: u64,
    /// Until when it waits for its answer or, once it has failed, out the pause before it goes
    /// again.
    until: Instant,
    /// Why it failed, once it has: reported to the machine when the pause is over.
    failure: Option<String>,
}

impl InFlight {
    fn fail(&mut self, error: String) {
        debug!(%error, batch = self.seq, "status batch not acknowledged; it goes again after a pause");
        self.failure = Some(error);
        self.until = Instant::now() + STATUS_RETRY_PAUSE;
    }
}

/// The executor once registered: the machine, and the I/O it asks for.
struct Backend {
    client: Client,
    config: ExecutorConfig,
    instance: InstanceId,
    machine: Machine<super::runner::Work>,
    runner: Runner,
    ends: tokio::sync::mpsc::UnboundedReceiver<super::runner::Done>,
    /// Ends whose results were too large for a batch, once put in the object store (or
    /// failed).
    chunked: tokio::sync::mpsc::UnboundedReceiver<(Run, StatusUpdate)>,
    /// The object store and this executor's cache of it.
    objects: Arc<ObjectAccess>,
    stored_as_objects: tokio::sync::mpsc::UnboundedSender<(Run, StatusUpdate)>,
    status_limit: usize,
    /// The machine's clock: milliseconds since this instant.
    epoch: Instant,
    /// The status batch in flight.
    status: Option<InFlight>,
    /// Status batches sent so far: the next one's number.
    batches: u64,
    /// `<the status answers' inbox>.`: batch `n`'s answer comes to this followed by `n`.
    status_replies: String,
    heartbeat: Option<BoxFuture<'static, Result<HeartbeatReply, String>>>,
    reregister: Option<BoxFuture<'static, Result<Registration, ExecutorError>>>,
    /// `ExecutorExiting`, once the machine has decided to leave.
    leaving: Option<HeartbeatRequest>,
    /// Where status batches go.
    status_subject: Subject,
    /// Where heartbeats and the drain's notices go.
    lifecycle_subject: Subject,
    /// The newest leadership heard from: what an older one sends is ignored.
    epochs: Arc<Newest>,
}

impl Backend {
    /// Everything the executor's loop holds, from what registering gathered.
    #[allow(clippy::too_many_arguments)]
    fn new(
        client: Client,
        config: ExecutorConfig,
        instance: InstanceId,
        driver: Registration,
        handlers: Handlers,
        status_replies: String,
        epochs: Arc<Newest>,
        gang_ports: Arc<GangPorts>,
    ) -> Self {
        let status_limit =
            client.server_info().max_payload.max(2 * PAYLOAD_HEADROOM) - PAYLOAD_HEADROOM;
        let python = config
            .python
            .as_ref()
            .map(|python| Arc::new(PythonPool::new(python, config.cores)));
        let objects = Arc::new(ObjectAccess::new(
            client.clone(),
            config.subjects.clone(),
            &config.executor_id,
            config.data_dir.clone(),
            config.object_cache_bytes,
            config.host_objects.clone(),
            config.metrics.objects.clone(),
        ));
        let (runner, ends) = Runner::new(
            handlers,
            status_limit,
            config.metrics.clone(),
            python,
            Some(objects.clone()),
            Some(gang_ports),
        );
        let (stored_as_objects, chunked) = tokio::sync::mpsc::unbounded_channel();
        let mut machine = Machine::new(
            MachineConfig {
                executor_id: config.executor_id.clone(),
                instance,
                cores: config.cores,
                driver_timeout_ms: millis(config.driver_timeout),
                decommission_timeout_ms: millis(config.decommission_timeout),
                status_limit,
            },
            0,
        );
        machine.on_registered(driver, 0);
        let status_subject = config.subjects.status(&config.executor_id).into();
        let lifecycle_subject = config.subjects.heartbeat(&config.executor_id).into();
        Self {
            status_replies: status_replies + ".",
            batches: 0,
            status_subject,
            lifecycle_subject,
            client,
            config,
            instance,
            machine,
            runner,
            ends,
            chunked,
            stored_as_objects,
            objects,
            status_limit,
            epoch: Instant::now(),
            status: None,
            heartbeat: None,
            reregister: None,
            leaving: None,
            epochs,
        }
    }

    fn now(&self) -> u64 {
        millis(self.epoch.elapsed())
    }

    /// The heartbeat timer's work: the machine sends a heartbeat if it may, and says whether
    /// the driver is lost.
    fn beat(&mut self) -> Result<(), ExecutorError> {
        let now = self.now();
        self.machine
            .beat(
                self.config.exit_on_driver_loss,
                self.objects.counts.now(),
                now,
            )
            .map_err(|silent| ExecutorError::DriverLost(Duration::from_millis(silent)))
    }

    /// The machine's timers: hands back what still runs once the drain's time is up, and
    /// abandons handlers that have not stopped within the grace, telling the driver at once.
    fn timers_due(&mut self) -> Result<(), ExecutorError> {
        let now = self.now();
        if self.machine.hand_back_at().is_some_and(|at| at <= now) {
            self.machine.hand_back();
        }
        if self.machine.abandon_overdue(now) {
            // The driver hears now which cores stay busy; the KILLED ends wait for that.
            self.beat()?;
        }
        Ok(())
    }

    async fn serve(
        mut self,
        mut inbox: Inbox,
        mut answers: Subscriber,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ExecutorError> {
        tokio::pin!(shutdown);
        let mut beat = tokio::time::interval(self.config.heartbeat_interval);
        let connected = self.config.connected.clone();
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        // One timer for the batch in flight, moved only when its deadline changes, rather than a
        // new one each time round the loop.
        let status_timer = tokio::time::sleep_until(far);
        tokio::pin!(status_timer);
        loop {
            // The machine's own timers, both idle on most executors: the drain's hand-back,
            // and the handlers asked to stop that are due to be abandoned.
            let (hand_back_at, abandon_at) =
                (self.machine.hand_back_at(), self.machine.abandon_at());
            let wake_at = match (hand_back_at, abandon_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let deadline = wake_at.map_or(far, |ms| self.epoch + Duration::from_millis(ms));
            if let Some(until) = self.status.as_ref().map(|batch| batch.until) {
                if until != status_timer.deadline() {
                    status_timer.as_mut().reset(until);
                }
            }
            // Biased, in this order: a registration's answer is handled before any launch
            // the driver sent after it, and answers before new work.
            tokio::select! {
                biased;
                result = maybe(&mut self.reregister) => {
                    self.reregister = None;
                    self.registered_again(result?);
                }
                message = answers.next() => match message {
                    Some(message) => self.on_status_answer(message),
                    None => return Err(ExecutorError::Connection("the status answers' subscription closed".into())),
                },
                result = maybe(&mut self.heartbeat) => {
                    self.heartbeat = None;
                    let now = self.now();
                    self.machine.on_heartbeat(result, now);
                }
                _ = beat.tick() => self.beat()?,
                // Connected again, perhaps to another server: the driver hears of the new
                // connection now, before the old one's close could count against it. A
                // heartbeat still waiting went on the old one.
                _ = connected.notified() => {
                    if self.heartbeat.take().is_some() {
                        let now = self.now();
                        self.machine.on_heartbeat(Err("connected again".into()), now);
                    }
                    self.beat()?;
                }
                Some(done) = self.ends.recv() => {
                    let (run, end) = done.into_end();
                    self.on_end(run, end);
                }
                Some((run, end)) = self.chunked.recv() => self.machine.finish(run, end),
                message = inbox.next() => match message {
                    Some(message) => self.on_inbox(message),
                    None => return Err(ExecutorError::Connection("the inbox subscription closed".into())),
                },
                _ = tokio::time::sleep_until(deadline), if wake_at.is_some() => self.timers_due()?,
                _ = &mut status_timer, if self.status.is_some() => {
                    self.status_overdue();
                }
                _ = &mut shutdown, if !self.machine.is_draining() => {
                    let now = self.now();
                    self.machine.stop("signal", now);
                }
            }
            let leave = self.machine.poll(self.now());
            self.send_requests().await;
            let (running, busy) = (self.machine.running(), self.machine.busy_cores());
            self.config
                .metrics
                .set_load(running, busy, self.config.cores);
            if leave {
                return self.exit().await;
            }
        }
    }

    /// An answer on the status answers' subscription: it settles the batch in flight if it is
    /// that batch's. An answer to a batch given up on, or sent to a driver since replaced, is
    /// dropped (tasks it launched are found missing by the driver's reconciliation).
    fn on_status_answer(&mut self, message: Message) {
        let seq = message
            .subject
            .strip_prefix(self.status_replies.as_str())
            .and_then(|n| n.parse::<u64>().ok());
        let Some(batch) = self.status.as_mut().filter(|batch| Some(batch.seq) == seq) else {
            debug!(subject = %message.subject, "answer to a status batch no longer in flight dropped");
            return;
        };
        if !self.epochs.hears(&message) {
            // The batch goes again once its wait is over, to whoever leads now.
            return;
        }
        let answer = if message.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            Err("no driver is subscribed".to_string())
        } else {
            decode::<StatusReply>(&message.payload, usize::MAX).map_err(|e| e.to_string())
        };
        match answer {
            Ok(reply) => self.settle_status(Ok(reply)),
            Err(error) => batch.fail(error),
        }
    }

    /// The batch in flight has waited its time: unanswered, it fails; failed, the pause before
    /// it goes again is over.
    fn status_overdue(&mut self) {
        let Some(batch) = self.status.as_mut() else {
            return;
        };
        match batch.failure.take() {
            None => batch.fail("timed out".into()),
            Some(error) => self.settle_status(Err(error)),
        }
    }

    fn settle_status(&mut self, result: Result<StatusReply, String>) {
        self.status = None;
        let metrics = &self.config.metrics;
        match &result {
            Ok(StatusReply::UnknownExecutor { .. }) | Err(_) => metrics.batch_retried(),
            Ok(_) => metrics.acknowledged(self.machine.statuses().sending()),
        }
        let now = self.now();
        let launch = self.machine.on_status(result, now);
        self.launch(&launch);
    }

    /// Sends the batch the machine set aside, asking for the answer at its own number.
    async fn send_status(&mut self) {
        let seq = self.batches;
        self.batches += 1;
        let payload = self.machine.statuses().encode_batch();
        let mut reply = String::with_capacity(self.status_replies.len() + 20);
        reply.push_str(&self.status_replies);
        reply.push_str(itoa::Buffer::new().format(seq));
        let mut batch = InFlight {
            seq,
            until: Instant::now() + REQUEST_TIMEOUT,
            failure: None,
        };
        let subject = self.status_subject.clone();
        // Bounded: handing a message to a connection that is reconnecting can wait.
        let sent = self.client.publish_with_reply(subject, reply, payload);
        match tokio::time::timeout(REQUEST_TIMEOUT, sent).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => batch.fail(error.to_string()),
            Err(_) => batch.fail("the connection did not take the batch in time".into()),
        }
        self.status = Some(batch);
    }

    /// Starts tasks the driver sent, in a `LaunchTasks` or with a status acknowledgement.
    fn launch(&mut self, tasks: &[TaskDescription]) {
        for task in tasks {
            let term = self.machine.term();
            self.machine
                .launch(task, |task, run| self.runner.start(task, run, term));
        }
    }

    fn on_inbox(&mut self, message: Message) {
        if !self.epochs.hears(&message) {
            return;
        }
        let limit = self.machine.statuses().limit + PAYLOAD_HEADROOM;
        match decode::<ExecutorMessage>(&message.payload, limit) {
            Ok(ExecutorMessage::LaunchTasks {
                tasks,
                driver_instance,
            }) => {
                if self.machine.sent_by_my_driver(driver_instance) {
                    self.launch(&tasks);
                } else {
                    warn!(
                        tasks = tasks.len(),
                        "ignored a launch from another driver instance"
                    );
                }
            }
            Ok(ExecutorMessage::KillTask {
                task_id,
                attempt,
                reason,
                driver_instance,
            }) => {
                if self.machine.sent_by_my_driver(driver_instance) {
                    info!(task = task_id, attempt, %reason, "kill");
                    let now = self.now();
                    self.machine.kill(task_id, attempt, now);
                } else {
                    warn!(
                        task = task_id,
                        attempt, "ignored a kill from another driver instance"
                    );
                }
            }
            Ok(ExecutorMessage::Leading { driver_instance }) => {
                if self.machine.leader_announced(driver_instance) {
                    info!(driver = %driver_instance, "a new driver leads; registering with it");
                    // A registration under way starts over, its request sent now.
                    if self.reregister.is_some() {
                        self.reregister = Some(self.register_again());
                    }
                }
            }
            Ok(ExecutorMessage::StopExecutor { reason }) => {
                info!(%reason, "the driver asked this executor to stop");
                let now = self.now();
                self.machine.stop(&reason, now);
            }
            Err(error) => {
                warn!(%error, subject = %message.subject, "undecodable inbox message dropped")
            }
        }
    }

    /// An attempt's end: to the machine, or first into the object store if its result is too
    /// large for a status batch (the attempt holds its cores meanwhile).
    fn on_end(&mut self, run: Run, end: StatusUpdate) {
        if !super::result_objects::too_large(&end, self.status_limit) {
            return self.machine.finish(run, end);
        }
        let (objects, stored, limit) = (
            self.objects.clone(),
            self.stored_as_objects.clone(),
            self.status_limit,
        );
        tokio::spawn(async move {
            let end = super::result_objects::store(&objects, end, limit).await;
            let _ = stored.send((run, end));
        });
    }

    /// A registration with whichever driver leads, listing the attempts this executor holds,
    /// tried until one answers.
    fn register_again(&self) -> BoxFuture<'static, Result<Registration, ExecutorError>> {
        Box::pin(register(
            self.client.clone(),
            self.config.clone(),
            self.instance,
            self.machine.held(),
            None,
            self.epochs.clone(),
        ))
    }

    /// Sends what the machine asked for.
    async fn send_requests(&mut self) {
        while let Some(next) = self.machine.next_request() {
            match next {
                Request::Register => self.reregister = Some(self.register_again()),
                Request::Heartbeat(mut beat) => {
                    if let HeartbeatRequest::Heartbeat { connection, .. } = &mut beat {
                        *connection = connection_of(&self.client);
                    }
                    self.heartbeat = Some(request(
                        &self.client,
                        self.lifecycle_subject.clone(),
                        encode(&beat),
                        &self.epochs,
                    ));
                }
                Request::Status => self.send_status().await,
                Request::Decommission(notice) => {
                    let notice: BoxFuture<'static, Result<HeartbeatReply, String>> = request(
                        &self.client,
                        self.lifecycle_subject.clone(),
                        encode(&notice),
                        &self.epochs,
                    );
                    tokio::spawn(async move {
                        if let Err(error) = notice.await {
                            warn!(%error, "the driver did not hear of the decommission; it will hand tasks back");
                        }
                    });
                }
                Request::Exiting(exiting) => self.leaving = Some(exiting),
            }
        }
    }

    /// Registered again: with a new driver, what it adopted runs on and the old driver's
    /// other attempts and statuses were dropped; the batch in flight to the old driver is
    /// given up (what of it was adopted goes again, renamed).
    fn registered_again(&mut self, answer: Registration) {
        self.config.metrics.registered(true);
        let now = self.now();
        match self.machine.on_registered(answer, now) {
            Registered::Same => info!(executor = %self.config.executor_id, "registered again"),
            Registered::NewDriver {
                adopted,
                dropped,
                unsent,
            } => {
                self.status = None;
                info!(executor = %self.config.executor_id, adopted, dropped, unsent, "registered with a new driver: it adopted attempts of the old one, and the rest were dropped");
            }
        }
    }

    /// Tells the driver this executor leaves, and returns.
    async fn exit(self) -> Result<(), ExecutorError> {
        if let Some(exiting) = self.leaving {
            let subject = self.lifecycle_subject.clone();
            let told: Result<HeartbeatReply, String> =
                request(&self.client, subject, encode(&exiting), &self.epochs).await;
            if let Err(error) = told {
                warn!(%error, "the driver did not hear this executor leave; it will time it out");
            }
        }
        info!(executor = %self.config.executor_id, "executor stopped");
        if let Err(error) = flush(&self.client).await {
            warn!(%error, "could not send the last messages to the NATS server");
        }
        Ok(())
    }
}
