//! The executor's logic as a state machine that does no I/O and never reads the clock, in the
//! style of the driver's core: inputs are method calls with `now` (milliseconds on any clock),
//! outputs are [`Request`]s to the driver, taken with [`Machine::next_request`].
//!
//! It owns what an executor decides: whether it is registered and with which driver, the task
//! slots and the attempts in them, the status queue with at most one batch in flight, when to
//! send a heartbeat and what it lists, when the driver counts as lost, and the drain. The NATS
//! shell (`backend.rs`) and the simulator (`crate::sim`) both drive it, so the simulated
//! executors follow the real executor's logic step for step.

use super::abandoned::{abandoned_status, Abandoned};
use super::launched::Launched;
use super::status::{Settled, StatusQueue};
use crate::ids::{ExecutorId, InstanceId, TaskId};
use crate::protocol::{
    Adopted, HeartbeatReply, HeartbeatRequest, RunningAttempt, StatusReply, StatusUpdate,
    TaskDescription, TaskState,
};
use crate::FixedHasher as Fixed;
use std::collections::HashMap;
use std::time::Duration;
use tracing::{info, warn};

/// How long a drained executor keeps trying to deliver its last statuses before it leaves.
pub const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// Work that may be stopped when its attempt is killed or given up.
pub trait Cancel {
    /// Stops the work, or asks it to stop; whether it stopped already (its end will not
    /// come).
    fn cancel(&mut self) -> bool;

    /// Whether the work, asked to stop, may go on regardless, with nothing to force it (a
    /// blocking handler's thread): past the grace it is abandoned. Commands and python calls
    /// are killed once the grace is over, so they end.
    fn may_ignore_stop(&self) -> bool {
        false
    }
}

/// This executor's own number for one run of an attempt, never reused while it lives: an end
/// counts only for the run in the slot, so the end of a run given up or replaced (whose task
/// and attempt a new driver may name again) is never taken for another's.
pub type Run = u64;

/// How a launched attempt started.
pub enum Started<H> {
    /// It was done at once (or could not start): its terminal status.
    Ended(StatusUpdate),
    /// It runs in the background; its end comes later through [`Machine::finish`].
    Running(H),
}

/// Something the machine wants sent to the driver. Each request is answered (or times out) and
/// the answer goes back in through the matching `on_` method.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// `RegisterExecutor` again, with the same id and instance, until a driver answers; the
    /// answer goes to [`Machine::on_registered`].
    Register,
    /// A heartbeat; its answer goes to [`Machine::on_heartbeat`].
    Heartbeat(HeartbeatRequest),
    /// The batch in [`StatusQueue::sending`]; its answer goes to [`Machine::on_status`].
    Status,
    /// `DecommissionExecutor`, sent once; its answer only matters for logs.
    Decommission(HeartbeatRequest),
    /// `ExecutorExiting`, sent once as the executor leaves.
    Exiting(HeartbeatRequest),
}

/// Who the executor is and its timings, in milliseconds.
#[derive(Debug, Clone)]
pub struct MachineConfig {
    pub executor_id: ExecutorId,
    pub instance: InstanceId,
    pub cores: u32,
    /// With no answer from the driver for this long, the driver counts as lost.
    pub driver_timeout_ms: u64,
    pub decommission_timeout_ms: u64,
    /// The largest status batch, in bytes.
    pub status_limit: usize,
}

/// What a registration's answer meant.
#[derive(Debug, PartialEq, Eq)]
pub enum Registered {
    /// The first registration, or again with the same driver: attempts and statuses are kept.
    Same,
    /// A new driver: it adopted `adopted` of the attempts held, which run on under its term;
    /// the others, and their statuses, were dropped (how many of each).
    NewDriver {
        adopted: usize,
        dropped: usize,
        unsent: usize,
    },
}

/// A driver's answer to a registration, as the machine needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub driver: InstanceId,
    /// Its term: the attempts it launches are of it.
    pub term: u64,
    /// What it adopted of the attempts the registration said were held.
    pub adopted: Vec<Adopted>,
}

/// One attempt in a slot.
struct Slot<H> {
    attempt: u32,
    /// The term of the driver that launched (or adopted) it.
    term: u64,
    run: Run,
    cpus: u32,
    work: H,
    /// A kill arrived while uncancellable work ran: its end will report KILLED.
    killed: bool,
}

/// The executor's state; `H` is the handle of an attempt's running work.
pub struct Machine<H> {
    config: MachineConfig,
    running: HashMap<TaskId, Slot<H>, Fixed>,
    /// The cores the running attempts and the abandoned handlers hold.
    busy: u32,
    /// Handlers asked to stop that may not, and those given up on that still hold cores.
    abandoned: Abandoned,
    /// The number the next run gets.
    next_run: Run,
    /// The attempts launched lately by this driver, oldest first: a launch of one of them
    /// again is a repeat, and starts no second run under its name.
    launched: Launched,
    statuses: StatusQueue,
    requests: std::collections::VecDeque<Request>,
    /// The driver this executor is registered with; none before the first registration.
    driver: Option<InstanceId>,
    /// That driver's term.
    term: u64,
    registering: bool,
    heartbeat_in_flight: bool,
    /// When the driver last answered anything.
    last_answer: u64,
    /// Draining until then: no new tasks; what still runs then is handed back.
    draining: Option<u64>,
    handed_back: bool,
    exited: bool,
}

impl<H: Cancel> Machine<H> {
    /// An executor about to register for the first time (its caller sends that registration
    /// and reports the answer to [`Machine::on_registered`]).
    pub fn new(config: MachineConfig, now: u64) -> Self {
        Self {
            statuses: StatusQueue::new(config.executor_id.clone(), config.status_limit),
            config,
            running: HashMap::default(),
            busy: 0,
            abandoned: Abandoned::default(),
            next_run: 0,
            launched: Launched::default(),
            requests: Default::default(),
            driver: None,
            term: 0,
            registering: true,
            heartbeat_in_flight: false,
            last_answer: now,
            draining: None,
            handed_back: false,
            exited: false,
        }
    }

    pub fn config(&self) -> &MachineConfig {
        &self.config
    }

    /// The next request to send, first queued first.
    pub fn next_request(&mut self) -> Option<Request> {
        self.requests.pop_front()
    }

    pub fn statuses(&self) -> &StatusQueue {
        &self.statuses
    }

    /// Whether a registration is under way (statuses wait for it).
    pub fn is_registering(&self) -> bool {
        self.registering
    }

    pub fn is_draining(&self) -> bool {
        self.draining.is_some()
    }

    /// The term of the driver this executor is registered with: the attempts it launches
    /// are of it.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// How many attempts run now.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// The run in task `task_id`'s slot, if one holds it: its attempt, term and number.
    pub fn run_of(&self, task_id: TaskId) -> Option<(u32, u64, Run)> {
        self.running
            .get(&task_id)
            .map(|slot| (slot.attempt, slot.term, slot.run))
    }

    /// How many cores the running attempts and the abandoned handlers hold.
    pub fn busy_cores(&self) -> u32 {
        self.busy
    }

    /// A driver accepted a registration. A new driver adopted some of the attempts held (the
    /// registration listed them, [`Machine::held`]): they run on under its term, renamed
    /// as it says, and their statuses with them. The others, and their statuses, are
    /// dropped unreported: the new driver runs their tasks again if they are to run.
    pub fn on_registered(&mut self, answer: Registration, now: u64) -> Registered {
        self.registering = false;
        self.last_answer = now;
        self.statuses.driver = Some(answer.driver);
        let previous = self.driver.replace(answer.driver);
        let old_term = std::mem::replace(&mut self.term, answer.term);
        self.statuses.term = answer.term;
        if !previous.is_some_and(|p| p != answer.driver) {
            return Registered::Same;
        }
        // Another driver's attempts are named anew (without the journal, by the same numbers).
        self.launched = Launched::default();
        let renamed = |task_id: TaskId, attempt: u32| {
            answer
                .adopted
                .iter()
                .find(|a| a.task_id == task_id && a.attempt == attempt && a.term == old_term)
                .map(|a| a.new_attempt)
        };
        let mut adopted = 0;
        let mut given_up = Vec::new();
        for (task_id, slot) in self.running.iter_mut() {
            match renamed(*task_id, slot.attempt).filter(|_| slot.term == old_term) {
                Some(new_attempt) => {
                    slot.attempt = new_attempt;
                    slot.term = answer.term;
                    adopted += 1;
                }
                None => given_up.push(*task_id),
            }
        }
        for task_id in &given_up {
            self.give_up(*task_id);
        }
        self.abandoned.forget_ends();
        let unsent = self.statuses.adopt(renamed);
        Registered::NewDriver {
            adopted,
            dropped: given_up.len(),
            unsent,
        }
    }

    /// Whether a `LaunchTasks` or `KillTask` from `driver_instance` is from this executor's
    /// driver: one from another instance is about that driver's tasks, not this one's, and is
    /// ignored.
    pub fn sent_by_my_driver(&self, driver_instance: Option<InstanceId>) -> bool {
        driver_instance.is_none() || driver_instance == self.driver
    }

    /// Starts one launched attempt with `start`, which gets the run's number to report its end
    /// with ([`Machine::finish`]). A draining executor still runs a launch that
    /// comes before its drain's time is up (the driver sent it before it heard of the drain,
    /// and the drain waits for it); only once what runs has been handed back does it hand a
    /// launch straight back.
    pub fn launch(
        &mut self,
        task: &TaskDescription,
        start: impl FnOnce(&TaskDescription, Run) -> Started<H>,
    ) {
        if !self.launched.first_time(task.task_id, task.attempt) {
            warn!(
                task = task.task_id,
                attempt = task.attempt,
                "ignored a repeated launch"
            );
            return;
        }
        if self.handed_back {
            self.statuses.push(handed_back(task.task_id, task.attempt));
            return;
        }
        let Some(busy) = self.busy.checked_add(task.cpus) else {
            let error = format!("{} cpus on top of {} busy overflows", task.cpus, self.busy);
            return self
                .statuses
                .push(failed_status(task.task_id, task.attempt, error));
        };
        if busy > self.config.cores {
            warn!(
                task = task.task_id,
                busy = self.busy,
                cores = self.config.cores,
                "launch beyond this executor's cores"
            );
        }
        let run = self.next_run;
        self.next_run += 1;
        let work = match start(task, run) {
            Started::Ended(update) => return self.statuses.push(update),
            Started::Running(work) => work,
        };
        let slot = Slot {
            attempt: task.attempt,
            term: self.term,
            run,
            cpus: task.cpus,
            work,
            killed: false,
        };
        if let Some(old) = self.running.insert(task.task_id, slot) {
            self.busy -= old.cpus;
        }
        self.busy += task.cpus;
        self.statuses.push(StatusUpdate {
            task_id: task.task_id,
            attempt: task.attempt,
            state: TaskState::Running,
            result: None,
            error: None,
            result_object: None,
            no_retry: false,
        });
    }

    /// Run `run`, which ran in the background, has ended with `end`; ignored unless that run
    /// holds the slot (one given up or replaced ends unreported, even when a later run of the
    /// same task and attempt number holds it now). The status names the attempt the slot
    /// holds now: an adopted run was renamed after it started.
    pub fn finish(&mut self, run: Run, mut end: StatusUpdate) {
        if !self.running.get(&end.task_id).is_some_and(|s| s.run == run) {
            return self.abandoned_returned(run);
        }
        let slot = self.free(end.task_id);
        end.attempt = slot.attempt;
        let update = match slot.killed {
            true => killed_status(end.task_id, slot.attempt),
            false => end,
        };
        self.statuses.push(update);
    }

    /// Kills an attempt at `now`. Work that can be aborted stops now and reports KILLED at
    /// once; work that is asked to stop (a command, a python call, a blocking handler)
    /// reports KILLED, and frees its cores, once it has ended. A handler that has not returned
    /// within the grace is abandoned ([`Machine::abandon_overdue`]).
    pub fn kill(&mut self, task_id: TaskId, attempt: u32, now: u64) {
        let Some(slot) = self.running.get_mut(&task_id) else {
            return;
        };
        if slot.attempt != attempt || slot.killed {
            return;
        }
        match slot.work.cancel() {
            true => {
                self.free(task_id);
                self.statuses.push(killed_status(task_id, attempt));
            }
            false => {
                slot.killed = true;
                if slot.work.may_ignore_stop() {
                    self.abandoned.asked(task_id, slot.run, now);
                }
            }
        }
    }

    /// When a handler asked to stop is next due to be abandoned, if it has not returned.
    pub fn abandon_at(&self) -> Option<u64> {
        self.abandoned.due()
    }

    /// Abandons the handlers asked to stop by `now` less the grace that still run: they leave
    /// their slots but keep their cores busy, and their KILLED ends go once a heartbeat that
    /// lists them has been answered. Returns whether any was abandoned (a heartbeat should go
    /// now, to tell the driver).
    pub fn abandon_overdue(&mut self, now: u64) -> bool {
        let mut any = false;
        for (task_id, run) in self.abandoned.overdue(now) {
            if !self.running.get(&task_id).is_some_and(|s| s.run == run) {
                continue;
            }
            let slot = self.running.remove(&task_id).expect("checked above");
            warn!(
                task = task_id,
                attempt = slot.attempt,
                cpus = slot.cpus,
                "a handler asked to stop has not returned: abandoned, its cores stay busy"
            );
            let end = abandoned_status(task_id, slot.attempt, slot.cpus);
            self.abandoned
                .add((task_id, slot.attempt, run), slot.cpus, Some(end));
            any = true;
        }
        any
    }

    /// Run `run`, no longer in a slot, has returned: if it was abandoned, its cores are free,
    /// and its end goes if the driver has not had it.
    fn abandoned_returned(&mut self, run: Run) {
        if self.abandoned.is_empty() {
            return;
        }
        if let Some((cpus, end)) = self.abandoned.returned(run) {
            info!(
                run,
                cpus, "an abandoned handler returned; its cores are free"
            );
            self.busy -= cpus;
            if let Some(end) = end {
                self.statuses.push(end);
            }
        }
    }

    /// Gives up the attempt in `task_id`'s slot: work that stops does, and a handler that may
    /// not is abandoned at once, its cores busy until it returns (no end of it is owed).
    fn give_up(&mut self, task_id: TaskId) -> u32 {
        let mut slot = self.free(task_id);
        slot.work.cancel();
        if slot.work.may_ignore_stop() {
            self.busy += slot.cpus;
            self.abandoned
                .add((task_id, slot.attempt, slot.run), slot.cpus, None);
        }
        slot.attempt
    }

    fn free(&mut self, task_id: TaskId) -> Slot<H> {
        let slot = self
            .running
            .remove(&task_id)
            .expect("a slot checked by the caller");
        self.busy -= slot.cpus;
        slot
    }

    /// Gives up every running attempt: cancellable work stops, other work runs on but its end
    /// is ignored. Returns the attempts given up.
    fn abandon_all(&mut self) -> Vec<(TaskId, u32)> {
        let running: Vec<TaskId> = self.running.keys().copied().collect();
        running
            .into_iter()
            .map(|task_id| (task_id, self.give_up(task_id)))
            .collect()
    }

    /// The heartbeat timer: notices a driver that stopped answering (registering again, or,
    /// with `exit_on_loss`, returning how long it has been silent), and sends a heartbeat if
    /// none is in flight, with what the executor has done with the cluster's objects.
    pub fn beat(
        &mut self,
        exit_on_loss: bool,
        objects: crate::protocol::ObjectCounts,
        now: u64,
    ) -> Result<(), u64> {
        let silent = now.saturating_sub(self.last_answer);
        if silent > self.config.driver_timeout_ms && !self.registering {
            if exit_on_loss {
                return Err(silent);
            }
            warn!(
                silent_ms = silent,
                "the driver is not answering; registering again"
            );
            self.start_reregister();
        }
        if !self.heartbeat_in_flight && !self.registering {
            self.heartbeat_in_flight = true;
            let running = self.held();
            self.requests
                .push_back(Request::Heartbeat(HeartbeatRequest::Heartbeat {
                    executor_id: self.config.executor_id.clone(),
                    instance_id: self.config.instance,
                    running,
                    driver_instance: self.driver,
                    objects,
                    // The backend names the connection it sends the heartbeat on.
                    connection: None,
                    abandoned: self.abandoned.list(),
                }));
        }
        Ok(())
    }

    /// What this executor holds, for a heartbeat or a registration: attempts running, and
    /// ends not yet acknowledged, each with the term of the driver that launched it.
    pub fn held(&self) -> Vec<RunningAttempt> {
        // Each attempt once, ended if an end of it waits for its acknowledgement.
        let mut held: HashMap<(TaskId, u32, u64), bool, Fixed> = self
            .running
            .iter()
            .map(|(task_id, slot)| ((*task_id, slot.attempt, slot.term), false))
            .collect();
        for attempt in self.statuses.unacknowledged() {
            let key = (attempt.task_id, attempt.attempt, attempt.term);
            *held.entry(key).or_default() |= attempt.ended;
        }
        held.into_iter()
            .map(|((task_id, attempt, term), ended)| RunningAttempt {
                task_id,
                attempt,
                term,
                ended,
            })
            .collect()
    }

    /// A heartbeat's answer, or why none came.
    pub fn on_heartbeat(&mut self, result: Result<HeartbeatReply, String>, now: u64) {
        self.heartbeat_in_flight = false;
        match result {
            Ok(HeartbeatReply::HeartbeatResponse { reregister }) => {
                self.last_answer = now;
                if reregister {
                    info!("the driver does not know this executor; registering again");
                    return self.start_reregister();
                }
                // It heard which handlers hold cores: their ends may go.
                for end in self.abandoned.heard() {
                    self.statuses.push(end);
                }
            }
            Ok(HeartbeatReply::Error { message }) => warn!(%message, "heartbeat refused"),
            Err(error) => tracing::debug!(%error, "heartbeat not answered"),
        }
    }

    /// A status batch's answer, or why none came. Returns the tasks the answer launched on the
    /// cores the batch freed: the caller hands each to [`Machine::launch`], as for a
    /// `LaunchTasks`.
    #[must_use]
    pub fn on_status(
        &mut self,
        result: Result<StatusReply, String>,
        now: u64,
    ) -> Vec<TaskDescription> {
        match self.statuses.settle(result) {
            Settled::Answered(launch) => {
                self.last_answer = now;
                return launch;
            }
            Settled::Unknown => self.start_reregister(),
            Settled::NoAnswer => {}
        }
        Vec::new()
    }

    /// Driver `driver_instance` said it leads: an executor registered with another driver
    /// registers again now, and one registering already starts its registration over (its
    /// request may wait on a driver that is gone). Returns whether it (re)registers; one
    /// registered with that driver, or not registered yet, goes on as it is.
    pub fn leader_announced(&mut self, driver_instance: InstanceId) -> bool {
        if self.registering {
            return true;
        }
        if !self.driver.is_some_and(|driver| driver != driver_instance) {
            return false;
        }
        self.start_reregister();
        true
    }

    /// Registers again with the same id and instance, with no deadline: the next driver that
    /// comes up accepts it.
    fn start_reregister(&mut self) {
        if !self.registering {
            self.registering = true;
            self.requests.push_back(Request::Register);
        }
    }

    /// Starts draining (on a signal or `StopExecutor`): the driver hears of it, new launches
    /// are handed back, and what still runs after the decommission timeout is handed back too.
    pub fn stop(&mut self, why: &str, now: u64) {
        if self.draining.is_some() {
            return;
        }
        info!(executor = %self.config.executor_id, why, running = self.running.len(), "decommissioning");
        self.draining = Some(now + self.config.decommission_timeout_ms);
        self.requests.push_back(Request::Decommission(
            HeartbeatRequest::DecommissionExecutor {
                executor_id: self.config.executor_id.clone(),
                instance_id: self.config.instance,
            },
        ));
    }

    /// When what still runs is to be handed back, if the executor drains and has not yet.
    pub fn hand_back_at(&self) -> Option<u64> {
        self.draining.filter(|_| !self.handed_back)
    }

    /// The drain's time is up: what still runs goes back to the driver to run elsewhere.
    pub fn hand_back(&mut self) {
        self.handed_back = true;
        for (task_id, attempt) in self.abandon_all() {
            self.statuses.push(handed_back(task_id, attempt));
        }
    }

    /// Ends a step: sends the pending statuses if no batch is in flight (and no registration is
    /// under way), and, once a drain is done or overdue, queues `ExecutorExiting` and returns
    /// true: the executor leaves.
    pub fn poll(&mut self, now: u64) -> bool {
        if !self.registering && self.statuses.take_batch() {
            self.requests.push_back(Request::Status);
        }
        let Some(deadline) = self.draining else {
            return false;
        };
        let drained = self.running.is_empty() && self.statuses.is_idle();
        // Without a driver to acknowledge them, statuses cannot hold the exit forever.
        let overdue = now > deadline + DRAIN_GRACE.as_millis() as u64;
        if self.exited || !(drained || overdue) {
            return self.exited;
        }
        if !drained {
            warn!("leaving with statuses the driver has not acknowledged");
        }
        self.exited = true;
        self.requests
            .push_back(Request::Exiting(HeartbeatRequest::ExecutorExiting {
                executor_id: self.config.executor_id.clone(),
                instance_id: self.config.instance,
            }));
        true
    }
}

/// The pause between registration attempts while no driver answers: from 50 ms, doubling up to
/// 2 s, until an optional deadline.
#[derive(Debug, Clone)]
pub struct Backoff {
    pause: u64,
    deadline: Option<u64>,
}

impl Backoff {
    pub fn new(deadline: Option<u64>) -> Self {
        Self {
            pause: 50,
            deadline,
        }
    }

    /// After a failed attempt at `now`: how long to wait before the next, or none if the
    /// deadline would pass first.
    pub fn next_pause(&mut self, now: u64) -> Option<u64> {
        let pause = self.pause;
        if self.deadline.is_some_and(|d| now + pause > d) {
            return None;
        }
        self.pause = (pause * 2).min(2_000);
        Some(pause)
    }
}

/// A task given back to the driver, to run elsewhere: KILLED, which does not count as a failure.
fn handed_back(task_id: TaskId, attempt: u32) -> StatusUpdate {
    StatusUpdate {
        task_id,
        attempt,
        state: TaskState::Killed,
        result: None,
        error: Some("handed back: the executor is decommissioning".into()),
        result_object: None,
        no_retry: false,
    }
}

fn failed_status(task_id: TaskId, attempt: u32, error: String) -> StatusUpdate {
    StatusUpdate {
        task_id,
        attempt,
        state: TaskState::Failed,
        result: None,
        error: Some(error),
        result_object: None,
        no_retry: false,
    }
}

fn killed_status(task_id: TaskId, attempt: u32) -> StatusUpdate {
    StatusUpdate {
        task_id,
        attempt,
        state: TaskState::Killed,
        result: None,
        error: Some("killed by the driver".into()),
        result_object: None,
        no_retry: false,
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
