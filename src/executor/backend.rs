//! Registration and the executor's main loop: one task on the messaging thread that reads the
//! inbox, collects attempt ends, keeps at most one status batch and one heartbeat in flight,
//! registers again when the driver has forgotten it, and drains on SIGTERM or `StopExecutor`.

use super::runner::Runner;
use super::status::{Settled, StatusSender};
use super::tasks::Handlers;
use crate::ids::{ExecutorId, InstanceId};
use crate::protocol::{
    decode, encode, ExecutorMessage, HeartbeatReply, HeartbeatRequest, RegisterExecutor,
    RegisterReply, RegisterRequest, RunningAttempt, StatusUpdate, TaskDescription, TaskState,
};
use crate::subjects::Subjects;
use crate::{PAYLOAD_HEADROOM, REQUEST_TIMEOUT};
use async_nats::{Client, Message, Subscriber};
use futures::future::BoxFuture;
use futures::StreamExt;
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
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
}

impl ExecutorConfig {
    /// A configuration with Ember's defaults for everything but who the executor is.
    pub fn new(subjects: Subjects, executor_id: ExecutorId, host_port: String, cores: u32) -> Self {
        Self {
            subjects,
            executor_id,
            host_port,
            cores,
            log_urls: BTreeMap::new(),
            attributes: BTreeMap::new(),
            register_timeout: crate::DEFAULT_REGISTER_TIMEOUT,
            heartbeat_interval: crate::DEFAULT_HEARTBEAT_INTERVAL,
            driver_timeout: crate::DEFAULT_EXECUTOR_TIMEOUT,
            decommission_timeout: crate::DEFAULT_DECOMMISSION_TIMEOUT,
            exit_on_driver_loss: false,
        }
    }
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
}

/// Registers and serves until `shutdown` completes (then drains and exits) or the driver stops
/// it. The client should have been connected with the inbox prefix
/// [`Subjects::executor_reply_prefix`], or the driver will not answer.
pub async fn run(
    client: Client,
    config: ExecutorConfig,
    handlers: Handlers,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ExecutorError> {
    let inbox_subject = config.subjects.executor_inbox(&config.executor_id);
    let inbox = client
        .subscribe(inbox_subject.clone())
        .await
        .map_err(|source| ExecutorError::Subscribe {
            subject: inbox_subject,
            source,
        })?;
    // The subscription must reach the server before the driver can send the first offer.
    client
        .flush()
        .await
        .map_err(|e| ExecutorError::Connection(e.to_string()))?;
    tokio::pin!(shutdown);
    let instance = InstanceId::new_v4();
    let deadline = Some(Instant::now() + config.register_timeout);
    let driver = tokio::select! {
        result = register(client.clone(), config.clone(), instance, deadline) => result?,
        _ = &mut shutdown => return Ok(()),
    };
    info!(executor = %config.executor_id, cores = config.cores, "registered");
    Backend::new(client, config, instance, driver, handlers)
        .serve(inbox, shutdown)
        .await
}

/// Sends `RegisterExecutor` until the driver answers, or `deadline` passes; returns the
/// driver's instance.
async fn register(
    client: Client,
    config: ExecutorConfig,
    instance: InstanceId,
    deadline: Option<Instant>,
) -> Result<InstanceId, ExecutorError> {
    let request = RegisterRequest::RegisterExecutor(RegisterExecutor {
        executor_id: config.executor_id.clone(),
        instance_id: instance,
        host_port: config.host_port.clone(),
        cores: config.cores,
        log_urls: config.log_urls.clone(),
        attributes: config.attributes.clone(),
    });
    let payload = encode(&request);
    let subject = config.subjects.register(&config.executor_id);
    let mut pause = Duration::from_millis(50);
    loop {
        let attempt = client.request(subject.clone(), payload.clone());
        match tokio::time::timeout(REQUEST_TIMEOUT, attempt).await {
            Ok(Ok(reply)) => match decode::<RegisterReply>(&reply.payload, usize::MAX) {
                Ok(RegisterReply::RegisteredExecutor {
                    driver_instance, ..
                }) => return Ok(driver_instance),
                Ok(RegisterReply::RegisterExecutorFailed { message }) => {
                    return Err(ExecutorError::Refused(message))
                }
                Err(error) => warn!(%error, "undecodable answer to RegisterExecutor; retrying"),
            },
            Ok(Err(error)) => debug!(%error, "no driver yet; retrying"),
            Err(_) => debug!("registration timed out; retrying"),
        }
        if deadline.is_some_and(|d| Instant::now() + pause > d) {
            return Err(ExecutorError::RegisterTimeout(config.register_timeout));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

type HeartbeatResult = Result<HeartbeatReply, String>;

/// How long a drained executor keeps trying to deliver its last statuses before it leaves.
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// A request on the heartbeat subject, answered or not within [`REQUEST_TIMEOUT`].
fn lifecycle_request(
    client: &Client,
    subject: String,
    request: &HeartbeatRequest,
) -> BoxFuture<'static, HeartbeatResult> {
    let (client, payload) = (client.clone(), encode(request));
    Box::pin(async move {
        match tokio::time::timeout(REQUEST_TIMEOUT, client.request(subject, payload)).await {
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

/// The executor once registered.
struct Backend {
    client: Client,
    config: ExecutorConfig,
    instance: InstanceId,
    runner: Runner,
    ends: tokio::sync::mpsc::UnboundedReceiver<super::runner::Done>,
    statuses: StatusSender,
    heartbeat: Option<BoxFuture<'static, HeartbeatResult>>,
    reregister: Option<BoxFuture<'static, Result<InstanceId, ExecutorError>>>,
    /// The driver this executor is registered with.
    driver: InstanceId,
    /// When the driver last answered anything.
    last_answer: Instant,
    /// Draining until then: no new tasks; what still runs then is handed back.
    draining: Option<Instant>,
    handed_back: bool,
}

impl Backend {
    fn new(
        client: Client,
        config: ExecutorConfig,
        instance: InstanceId,
        driver: InstanceId,
        handlers: Handlers,
    ) -> Self {
        let (runner, ends) = Runner::new(handlers, config.cores);
        let statuses = StatusSender::new(&client, &config);
        Self {
            client,
            config,
            instance,
            runner,
            ends,
            statuses,
            heartbeat: None,
            reregister: None,
            driver,
            last_answer: Instant::now(),
            draining: None,
            handed_back: false,
        }
    }

    async fn serve(
        mut self,
        mut inbox: Subscriber,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ExecutorError> {
        tokio::pin!(shutdown);
        let mut beat = tokio::time::interval(self.config.heartbeat_interval);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        loop {
            let drain_deadline = self.draining.unwrap_or(far);
            // Biased, in this order: a registration's answer is handled before any launch
            // the driver sent after it, and answers before new work.
            tokio::select! {
                biased;
                result = maybe(&mut self.reregister) => {
                    self.reregister = None;
                    self.registered_again(result?);
                }
                result = self.statuses.in_flight() => match self.statuses.settle(result) {
                    Settled::Answered(launch) => {
                        self.last_answer = Instant::now();
                        self.launch(launch);
                    }
                    Settled::Unknown => self.start_reregister(),
                    Settled::NoAnswer => {}
                },
                result = maybe(&mut self.heartbeat) => self.on_heartbeat(result),
                _ = beat.tick() => self.beat()?,
                Some(done) = self.ends.recv() => {
                    if let Some(update) = self.runner.finish(done) {
                        self.statuses.push(update);
                    }
                }
                message = inbox.next() => match message {
                    Some(message) => self.on_inbox(message),
                    None => return Err(ExecutorError::Connection("the inbox subscription closed".into())),
                },
                _ = tokio::time::sleep_until(drain_deadline), if self.draining.is_some() && !self.handed_back => {
                    self.hand_back();
                }
                _ = &mut shutdown, if self.draining.is_none() => self.start_drain("signal"),
            }
            if self.reregister.is_none() {
                self.statuses.send_if_idle();
            }
            if let Some(deadline) = self.draining {
                let drained = self.runner.is_empty() && self.statuses.is_idle();
                // Without a driver to acknowledge them, statuses cannot hold the exit forever.
                let overdue = Instant::now() > deadline + DRAIN_GRACE;
                if drained || overdue {
                    if !drained {
                        warn!("leaving with statuses the driver has not acknowledged");
                    }
                    return self.exit().await;
                }
            }
        }
    }

    fn on_inbox(&mut self, message: Message) {
        match decode::<ExecutorMessage>(&message.payload, self.statuses.limit + PAYLOAD_HEADROOM) {
            Ok(ExecutorMessage::LaunchTasks { tasks }) => self.launch(tasks),
            Ok(ExecutorMessage::KillTask {
                task_id,
                attempt,
                reason,
            }) => {
                info!(task = task_id, attempt, %reason, "kill");
                if let Some(update) = self.runner.kill(task_id, attempt) {
                    self.statuses.push(update);
                }
            }
            Ok(ExecutorMessage::StopExecutor { reason }) => {
                info!(%reason, "the driver asked this executor to stop");
                if self.draining.is_none() {
                    self.start_drain(&reason);
                }
            }
            Err(error) => {
                warn!(%error, subject = %message.subject, "undecodable inbox message dropped")
            }
        }
    }

    /// Starts tasks the driver sent, in a `LaunchTasks` or with a status acknowledgement; a
    /// draining executor hands them straight back.
    fn launch(&mut self, tasks: Vec<TaskDescription>) {
        for task in tasks {
            let update = match self.draining {
                Some(_) => handed_back(task.task_id, task.attempt),
                None => self.runner.launch(task),
            };
            self.statuses.push(update);
        }
    }

    /// Sends a heartbeat if none is in flight, and notices a driver that stopped answering.
    fn beat(&mut self) -> Result<(), ExecutorError> {
        let silent = self.last_answer.elapsed();
        if silent > self.config.driver_timeout && self.reregister.is_none() {
            if self.config.exit_on_driver_loss {
                return Err(ExecutorError::DriverLost(silent));
            }
            warn!(
                silent_ms = silent.as_millis() as u64,
                "the driver is not answering; registering again"
            );
            self.start_reregister();
        }
        if self.heartbeat.is_none() && self.reregister.is_none() {
            let request = HeartbeatRequest::Heartbeat {
                executor_id: self.config.executor_id.clone(),
                instance_id: self.instance,
                running: self.held_attempts(),
            };
            let subject = self.config.subjects.heartbeat(&self.config.executor_id);
            self.heartbeat = Some(lifecycle_request(&self.client, subject, &request));
        }
        Ok(())
    }

    /// What this executor holds: attempts running, and ends not yet acknowledged.
    fn held_attempts(&self) -> Vec<RunningAttempt> {
        let mut held: HashSet<RunningAttempt> = self.runner.running().collect();
        held.extend(self.statuses.unacknowledged());
        held.into_iter().collect()
    }

    fn on_heartbeat(&mut self, result: Result<HeartbeatReply, String>) {
        self.heartbeat = None;
        match result {
            Ok(HeartbeatReply::HeartbeatResponse { reregister }) => {
                self.last_answer = Instant::now();
                if reregister {
                    info!("the driver does not know this executor; registering again");
                    self.start_reregister();
                }
            }
            Ok(HeartbeatReply::Error { message }) => warn!(%message, "heartbeat refused"),
            Err(error) => debug!(%error, "heartbeat not answered"),
        }
    }

    /// Registers again with the same id and instance, with no deadline: the next driver that
    /// comes up accepts it.
    fn start_reregister(&mut self) {
        if self.reregister.is_none() {
            let (client, config) = (self.client.clone(), self.config.clone());
            self.reregister = Some(Box::pin(register(client, config, self.instance, None)));
        }
    }

    /// Registered again: with a new driver, the old one's attempts mean nothing (its task ids
    /// will be reused), so they are dropped unreported.
    fn registered_again(&mut self, driver: InstanceId) {
        self.last_answer = Instant::now();
        if driver != self.driver {
            let dropped = self.runner.abandon_all().len();
            let unsent = self.statuses.clear();
            info!(executor = %self.config.executor_id, dropped, unsent, "registered with a new driver; dropped the old driver's tasks");
            self.driver = driver;
        } else {
            info!(executor = %self.config.executor_id, "registered again");
        }
    }

    fn start_drain(&mut self, why: &str) {
        info!(executor = %self.config.executor_id, why, running = self.runner.len(), "decommissioning");
        self.draining = Some(Instant::now() + self.config.decommission_timeout);
        let request = HeartbeatRequest::DecommissionExecutor {
            executor_id: self.config.executor_id.clone(),
            instance_id: self.instance,
        };
        let notice = lifecycle_request(
            &self.client,
            self.config.subjects.heartbeat(&self.config.executor_id),
            &request,
        );
        tokio::spawn(async move {
            if let Err(error) = notice.await {
                warn!(%error, "the driver did not hear of the decommission; it will hand tasks back");
            }
        });
    }

    /// The drain's time is up: what still runs goes back to the driver to run elsewhere.
    fn hand_back(&mut self) {
        self.handed_back = true;
        for (task_id, attempt) in self.runner.abandon_all() {
            self.statuses.push(handed_back(task_id, attempt));
        }
    }

    /// Tells the driver this executor leaves, and returns.
    async fn exit(self) -> Result<(), ExecutorError> {
        let request = HeartbeatRequest::ExecutorExiting {
            executor_id: self.config.executor_id.clone(),
            instance_id: self.instance,
        };
        let subject = self.config.subjects.heartbeat(&self.config.executor_id);
        if let Err(error) = lifecycle_request(&self.client, subject, &request).await {
            warn!(%error, "the driver did not hear this executor leave; it will time it out");
        }
        info!(executor = %self.config.executor_id, "executor stopped");
        let _ = self.client.flush().await;
        Ok(())
    }
}

/// A task given back to the driver, to run elsewhere: KILLED, which does not count as a failure.
fn handed_back(task_id: crate::ids::TaskId, attempt: u32) -> StatusUpdate {
    StatusUpdate {
        task_id,
        attempt,
        state: TaskState::Killed,
        result: None,
        error: Some("handed back: the executor is decommissioning".into()),
    }
}
