//! The actor that owns the driver [`Core`]: one task reads the driver's subscriptions and the
//! timers, calls the core, and has the shell send the core's effects. Owning the core here,
//! without a lock or a second task, keeps Spark's one-message-at-a-time semantics and costs no
//! channel hop per message.
//!
//! This file is the loop alone: a leadership starts in [`start`](super::start), requests are
//! handled in [`requests`](super::requests), and what the core decides is sent by the
//! [`shell`](super::shell). Each arm of the loop calls one method.

use super::advisories::{closed_by_client, next_advisory, Closing};
use super::config::DriverConfig;
use super::core::Core;
use super::discovery;
use super::lease::{once_decided, Guard};
use super::outgoing::Outgoing;
use super::shell::{Shell, DRAIN_TIMEOUT};
use super::start::{start, DriverError, Inputs, Run};
use crate::connect::flush;
use crate::metrics::{DriverMetrics, RequestKind};
use crate::now_ms;
use async_nats::Client;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tracing::{info, warn};

/// How often the dynamic allocation target is brought up to date, when it is on (as Spark's
/// allocation manager's schedule).
const ALLOCATE_INTERVAL: Duration = Duration::from_millis(100);

/// The first and the longest pause before a deposed driver tries again to stand by.
const RESTART_DELAY_MIN: Duration = Duration::from_millis(500);
const RESTART_DELAY_MAX: Duration = Duration::from_secs(10);

/// Runs the driver on `client` until `shutdown` completes. With a journal, it first waits to
/// lead the cluster's drivers, and stands by again whenever it stops leading.
pub async fn run(
    client: Client,
    config: DriverConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DriverError> {
    // The stop is heard beside whatever the driver does, so that a leader waiting in its sends
    // for a lapsed lease (see `lease::Guard::current`) hears it too.
    let stop = Stop::default();
    let driving = drive(client, config, &stop);
    tokio::pin!(shutdown, driving);
    tokio::select! {
        done = &mut driving => return done,
        () = &mut shutdown => stop.tell(),
    }
    driving.await
}

/// A driver's stop, once told: whatever waits on it hears it, and so does the leadership it
/// holds.
#[derive(Default)]
struct Stop {
    told: AtomicBool,
    heard: Notify,
    leading: Mutex<Option<Guard>>,
}

impl Stop {
    fn tell(&self) {
        self.told.store(true, SeqCst);
        self.heard.notify_waiters();
        if let Some(guard) = self
            .leading
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            guard.stopping();
        }
    }

    /// Completes once the stop is told.
    async fn told(&self) {
        once_decided(&self.heard, || self.told.load(SeqCst).then_some(())).await
    }

    /// The leadership the stop is also to tell, from now on.
    fn leads(&self, guard: Option<Guard>) {
        if let Some(guard) = guard.as_ref().filter(|_| self.told.load(SeqCst)) {
            guard.stopping();
        }
        *self.leading.lock().unwrap_or_else(PoisonError::into_inner) = guard;
    }
}

/// The driver's life: standing by, leading, standing by again, until `stop` is told.
async fn drive(client: Client, config: DriverConfig, stop: &Stop) -> Result<(), DriverError> {
    // Once this driver has opened its streams (`run.opened`), its settings are known to
    // work, and a start that fails later (a server electing its JetStream leaders after
    // losing a node, a journal slow to answer the standby that has just taken the lease) is
    // tried again rather than ending the driver. A failure before that is its settings' and
    // ends it with the reason, as does `--replay-timeout` running out before it ever led: the
    // flag is too short for the journal, and every try would end the same way.
    let mut run = Run::default();
    let mut retry_in = Duration::ZERO;
    loop {
        // A signal is heeded from the start: a journal slow to answer or to replay, a lease
        // held by another driver, or a server gone, must not keep the driver from stopping.
        let started = tokio::select! {
            started = async {
                tokio::time::sleep(retry_in).await;
                start(&client, &config, &mut run).await
            } => started,
            () = stop.told() => {
                info!("driver stopped before it led");
                return Ok(());
            }
        };
        let (core, inputs, shell) = match started {
            Ok(started) => started,
            Err(error) if run.opened && (run.led || !error.out_of_replay_time()) => {
                retry_in = (retry_in * 2).clamp(RESTART_DELAY_MIN, RESTART_DELAY_MAX);
                warn!(%error, ?retry_in, "could not lead or stand by; trying again");
                continue;
            }
            Err(error) => return Err(error),
        };
        run.led = true;
        retry_in = Duration::ZERO;
        stop.leads(shell.guard().cloned());
        match lead(&client, &config, core, inputs, shell, stop).await? {
            Ended::Stopped => return Ok(()),
            Ended::Deposed => info!("standing by again"),
        }
    }
}

/// How a leadership ended.
enum Ended {
    /// Told to stop.
    Stopped,
    /// Lost to another driver, or to a lease that could not be renewed.
    Deposed,
}

/// Runs the core until `stop` is told or the leadership is lost.
async fn lead(
    client: &Client,
    config: &DriverConfig,
    mut core: Core,
    mut inputs: Inputs,
    mut shell: Shell,
    stop: &Stop,
) -> Result<Ended, DriverError> {
    let told = stop.told();
    tokio::pin!(told);
    let mut queries = shell.leading(&core);
    shell.announce(core.driver_instance()).await;
    let mut scrapes = shell.metrics.scrapes();
    // Beside the shell rather than in it: the writes in flight are `Send` but not `Sync`.
    let mut outbox = Outgoing::default();
    // The snapshot being stored, if one is: at most one at a time.
    let mut snapshots = FuturesUnordered::new();
    let mut revive = interval(config.revive_interval);
    let mut allocate = interval(ALLOCATE_INTERVAL);
    let mut speculate = interval(crate::driver::core::SPECULATION_INTERVAL);
    let mut sweep = interval(super::objects::sweep_interval(config.objects_max_age));
    let mut closing = Closing::new(config.disconnect_grace.unwrap_or_default());
    // One timer for the task events, moved only when what waits changes, rather than a new
    // one each time round the loop.
    let events_due = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(events_due);
    // The same for the group of task ends that waits to be written.
    let commit_due = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(commit_due);
    // The same for the core's first timer (a timeout, a retry's wait), which the revive
    // interval would otherwise find up to an interval late.
    let timers_due = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(timers_due);
    let mut timers_set = None;
    let guard = shell.guard().cloned();
    let lost = async {
        match &guard {
            Some(guard) => guard.lost().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    loop {
        let due = shell.task_events.due();
        if let Some(due) = due.filter(|&due| due != events_due.deadline()) {
            events_due.as_mut().reset(due);
        }
        let group_due = outbox.commit_due();
        if let Some(due) = group_due.filter(|&due| due != commit_due.deadline()) {
            commit_due.as_mut().reset(due);
        }
        let timer = core.next_due_ms();
        if timer != timers_set {
            if let Some(due) = timer {
                let wait = Duration::from_millis(due.saturating_sub(now_ms()));
                timers_due
                    .as_mut()
                    .reset(tokio::time::Instant::now() + wait);
            }
            timers_set = timer;
        }
        let reply = tokio::select! {
            biased;
            _ = &mut lost => {
                // What waits behind the journal is dropped, unsent: a successor may lead.
                warn!("leadership lost: the driver stops acting and stands by");
                discovery::stop(inputs.service).await;
                shell.stood_down();
                return Ok(Ended::Deposed);
            }
            () = &mut told => break,
            Some(message) = inputs.register.next() => {
                timed(&shell.metrics, RequestKind::Register, || shell.on_register(&mut core, message))
            }
            Some(message) = inputs.status.next() => {
                timed(&shell.metrics, RequestKind::Status, || shell.on_status(&mut core, message))
            }
            Some(message) = inputs.heartbeat.next() => {
                timed(&shell.metrics, RequestKind::Heartbeat, || shell.on_heartbeat(&mut core, message))
            }
            Some(message) = inputs.results.next() => {
                timed(&shell.metrics, RequestKind::Results, || shell.on_results(&mut core, message))
            }
            Some(request) = inputs.api.next() => {
                timed(&shell.metrics, RequestKind::Api, || shell.on_api(&mut core, request))
            }
            Some(checked) = inputs.checked.recv() => shell.on_checked(&mut core, checked),
            // Neither arm is polled where it has nothing to give: the loop's other messages
            // pay a flag test for them, not a poll.
            Some(advisory) = next_advisory(&mut inputs.disconnects), if inputs.disconnects.is_some() => {
                if let Some(closed) = closed_by_client(&advisory.payload) {
                    closing.push(closed);
                }
                None
            }
            closed = closing.next(), if closing.waits() => {
                core.connection_closed(&closed.connection, &closed.reason, now_ms());
                None
            }
            query = crate::web::next_query(&mut queries) => shell.on_query(&mut core, query),
            Some(scrape) = scrapes.recv() => shell.on_scrape(&core, scrape),
            _ = revive.tick() => shell.on_revive(&mut core),
            _ = allocate.tick(), if config.allocation.is_some() => {
                core.allocate(now_ms());
                None
            }
            _ = speculate.tick(), if core.speculating() => {
                core.speculate(now_ms());
                None
            }
            _ = sweep.tick(), if shell.sweeper.is_some() => {
                shell.on_sweep(&core);
                None
            }
            _ = &mut events_due, if due.is_some() => {
                shell.flush_task_events().await;
                None
            }
            _ = &mut commit_due, if group_due.is_some() => None,
            _ = &mut timers_due, if timer.is_some() => {
                // The timer's own time at least: the monotonic clock it slept on may run a
                // little ahead of the wall clock the core counts in.
                core.on_timers(now_ms().max(timer.unwrap_or_default()));
                // Due again if what fired set a timer at the same time.
                timers_set = None;
                None
            }
            released = outbox.released() => {
                shell.send_released(released, outbox.released_through()).await;
                None
            }
            Some(stored) = snapshots.next() => {
                shell.snapshot_stored(stored);
                None
            }
            else => break,
        };
        if let Some(write) = shell.after_step(&mut core, &mut outbox, reply).await {
            snapshots.push(write);
        }
    }
    shell.drain(&mut outbox).await;
    if let Some(history) = shell.history.take() {
        history.close(DRAIN_TIMEOUT).await;
    }
    shell.admission.report();
    info!("driver stopping");
    shell.stood_down();
    discovery::stop(inputs.service).await;
    drop((
        inputs.register,
        inputs.status,
        inputs.heartbeat,
        inputs.results,
        inputs.api,
        inputs.disconnects,
    ));
    let flushed = flush(client).await.map_err(DriverError::LastMessages);
    if let Some(tenure) = shell.tenure.take() {
        tenure.release().await;
    }
    flushed.map(|()| Ended::Stopped)
}

/// A timer of `period` whose missed ticks are delayed, not bunched.
fn interval(period: Duration) -> tokio::time::Interval {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval
}

/// Handles one request of `kind`, timed for the metrics.
fn timed<T>(metrics: &DriverMetrics, kind: RequestKind, handle: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let handled = handle();
    metrics.request(kind, started.elapsed());
    handled
}
