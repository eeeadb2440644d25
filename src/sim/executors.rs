//! The simulated executor processes. Each runs the real executor machine; this module only does
//! what the NATS shell does for it: sends its requests through the network, matches answers to
//! requests (a late answer to a request already given up is dropped, as NATS drops a reply
//! nobody waits for), times requests out, runs its timers, and stands in for task work.

use super::network::{Message, Pid, Reply, Request, Sender};
use super::objects::Needs;
use super::{Event, SimMachine, World};
use crate::epoch::Fence;
use crate::executor::machine::{
    Backoff, Cancel, MachineConfig, Registered, Registration, Request as Ask, Run, Started,
};
use crate::ids::{ExecutorId, TaskId};
use crate::objects::ObjectRef;
use crate::protocol::{
    ExecutorMessage, RegisterExecutor, RegisterReply, StatusRequest, StatusUpdate, TaskDescription,
    TaskState,
};
use std::collections::{BTreeMap, BTreeSet};

/// A simulated attempt's work: a timer, which can always be stopped.
#[derive(Debug)]
pub struct Work;

impl Cancel for Work {
    fn cancel(&mut self) -> bool {
        true
    }
}

/// The request timeout, as over NATS.
const REQUEST_TIMEOUT: u64 = crate::REQUEST_TIMEOUT.as_millis() as u64;
/// The shell's pause before a status batch that had no answer goes again.
const STATUS_RETRY_PAUSE: u64 = 200;
const HEARTBEAT_MS: u64 = crate::DEFAULT_HEARTBEAT_INTERVAL.as_millis() as u64;
/// What the shell makes of an answer from a driver that no longer leads.
const DEPOSED: &str = "answered by a driver that no longer leads";
/// The chance that a task is done at once (as the inline built-ins are) rather than later.
const INSTANT_TASKS: f64 = 0.1;
/// The longest a request waits for its answer.
const WAITED: u64 = REQUEST_TIMEOUT + STATUS_RETRY_PAUSE;

/// One executor process.
pub struct Process {
    pub machine: SimMachine,
    pub alive: bool,
    registration: Box<RegisterExecutor>,
    backoff: Backoff,
    /// The shell's epoch filter, on the virtual clock.
    fence: Fence,
    /// The newest epoch whose message this process acted on.
    acted: u64,
    /// The requests waiting for an answer, by kind.
    register: Option<u64>,
    heartbeat: Option<u64>,
    status: Option<u64>,
    /// The objects it has fetched and is fetching, and the runs waiting on them.
    pub cache: super::objects::Cache,
}

impl World {
    /// Starts a new executor process (the first ones, and each replacement of one that left).
    pub(super) fn start_executor(&mut self) -> Result<(), String> {
        let now = self.queue.now();
        let pid = self.procs.len() as Pid;
        let executor_id = ExecutorId::parse(format!("e{pid}")).expect("a valid id");
        let instance = self.rng.uuid();
        let config = MachineConfig {
            executor_id: executor_id.clone(),
            instance,
            cores: self.config.cores,
            driver_timeout_ms: crate::DEFAULT_EXECUTOR_TIMEOUT.as_millis() as u64,
            decommission_timeout_ms: crate::DEFAULT_DECOMMISSION_TIMEOUT.as_millis() as u64,
            status_limit: crate::DEFAULT_MAX_PAYLOAD - crate::PAYLOAD_HEADROOM,
        };
        let registration = Box::new(RegisterExecutor {
            executor_id: executor_id.clone(),
            instance_id: instance,
            host_port: format!("sim-{pid}:7077"),
            cores: self.config.cores,
            log_urls: BTreeMap::new(),
            attributes: BTreeMap::new(),
            resources: Default::default(),
            held: Vec::new(),
            connection: None,
        });
        let deadline = now + crate::DEFAULT_REGISTER_TIMEOUT.as_millis() as u64;
        self.procs.push(Process {
            machine: SimMachine::new(config, now),
            alive: true,
            registration,
            backoff: Backoff::new(Some(deadline)),
            fence: Fence::new(crate::DEFAULT_EXECUTOR_TIMEOUT.as_millis() as u64),
            acted: 0,
            register: None,
            heartbeat: None,
            status: None,
            cache: Default::default(),
        });
        self.pids.insert(executor_id, pid);
        self.trace.line(now, format_args!("e{pid} starts"));
        // The heartbeat timer runs from the start; the machine sends none while it registers.
        let phase = self.rng.below(HEARTBEAT_MS);
        self.queue.after(phase, Event::Beat { pid });
        self.send_register(pid)
    }

    pub(super) fn send_register(&mut self, pid: Pid) -> Result<(), String> {
        let process = &mut self.procs[pid as usize];
        if !process.alive {
            return Ok(());
        }
        let mut registration = process.registration.clone();
        registration.held = process.machine.held();
        let body = Request::Register(registration);
        let id = self.request(pid, body, REQUEST_TIMEOUT);
        self.procs[pid as usize].register = Some(id);
        Ok(())
    }

    /// Sends request `body` of `pid`, to time out after `timeout` ms; returns its number.
    fn request(&mut self, pid: Pid, body: Request, timeout: u64) -> u64 {
        self.next_request += 1;
        let id = self.next_request;
        self.send(Message::Request {
            from: pid,
            id,
            body,
        });
        self.queue.after(timeout, Event::Timeout { pid, id });
        id
    }

    pub(super) fn executor_answered(
        &mut self,
        pid: Pid,
        id: u64,
        sender: Sender,
        reply: Reply,
    ) -> Result<(), String> {
        let now = self.queue.now();
        let process = &mut self.procs[pid as usize];
        let waited = match reply {
            Reply::Register(_) => process.register,
            Reply::Lifecycle(_) => process.heartbeat,
            Reply::Status(_) => process.status,
        };
        // An answer nobody waits for any more goes nowhere, as over NATS.
        if !process.alive || waited != Some(id) {
            return Ok(());
        }
        // An answer from a driver that no longer leads is no answer.
        let heard = self.hears(pid, sender)?;
        if !heard {
            self.ledger
                .runs
                .disturb(pid, now.saturating_sub(WAITED), now);
        }
        let process = &mut self.procs[pid as usize];
        match reply {
            Reply::Register(_) if !heard => {
                process.register = None;
                return self.register_again(pid);
            }
            Reply::Register(answer) => {
                process.register = None;
                match answer {
                    RegisterReply::RegisteredExecutor {
                        driver_instance,
                        term,
                        adopted,
                        ..
                    } => {
                        // An adopted attempt is the new leader's from now on, as if it had
                        // launched it here, and its run has a second name.
                        for a in &adopted {
                            self.ledger
                                .launched(sender.leadership, a.task_id, a.new_attempt, pid);
                            self.ledger.run_adopted(sender.leadership, pid, a, term)?;
                        }
                        let answer = Registration {
                            driver: driver_instance,
                            term,
                            adopted,
                        };
                        let registered = process.machine.on_registered(answer, now);
                        if registered != Registered::Same {
                            // The batch in flight was the old driver's; its answer means nothing.
                            process.status = None;
                            let machine = &process.machine;
                            let run_of = |task| machine.run_of(task).map(|(_, _, run)| run);
                            self.ledger.runs.sync(pid, now, true, run_of);
                        }
                    }
                    RegisterReply::RegisterExecutorFailed { message } => {
                        return Err(format!("e{pid} was refused registration: {message}"));
                    }
                }
            }
            Reply::Lifecycle(answer) => {
                process.heartbeat = None;
                let answer = if heard {
                    Ok(answer)
                } else {
                    Err(DEPOSED.into())
                };
                process.machine.on_heartbeat(answer, now);
            }
            Reply::Status(answer) => {
                process.status = None;
                let answer = if heard {
                    Ok(answer)
                } else {
                    Err(DEPOSED.into())
                };
                let launch = process.machine.on_status(answer, now);
                self.launch_all(pid, sender, &launch)?;
            }
        }
        self.executor_stepped(pid)
    }

    /// Whether `pid` acts on a message from `sender`, by its epoch filter; a broken invariant
    /// if it acts on an older epoch than one it acted on before.
    fn hears(&mut self, pid: Pid, sender: Sender) -> Result<bool, String> {
        let now = self.queue.now();
        let process = &mut self.procs[pid as usize];
        if !process.fence.admit(sender.epoch, now) && self.config.fencing {
            return Ok(false);
        }
        if sender.epoch < process.acted {
            return Err(format!(
                "e{pid} acted on a message of epoch {} after one of epoch {}",
                sender.epoch, process.acted
            ));
        }
        process.acted = sender.epoch;
        Ok(true)
    }

    /// A registration that had no answer (or one from a deposed driver) goes again after the
    /// backoff's pause, or the process gives up.
    fn register_again(&mut self, pid: Pid) -> Result<(), String> {
        let now = self.queue.now();
        match self.procs[pid as usize].backoff.next_pause(now) {
            Some(pause) => self.queue.after(pause, Event::RegisterRetry { pid }),
            None => {
                self.trace
                    .line(now, format_args!("e{pid} gives up registering"));
                self.leave(pid);
            }
        }
        Ok(())
    }

    pub(super) fn timed_out(&mut self, pid: Pid, id: u64) -> Result<(), String> {
        let now = self.queue.now();
        let process = &mut self.procs[pid as usize];
        if !process.alive {
            return Ok(());
        }
        let waited = [process.register, process.heartbeat, process.status];
        if waited.contains(&Some(id)) {
            // No driver answered while it waited: the link was down, or no driver led.
            self.ledger
                .runs
                .disturb(pid, now.saturating_sub(WAITED), now);
        }
        let process = &mut self.procs[pid as usize];
        if process.register == Some(id) {
            process.register = None;
            return self.register_again(pid);
        }
        if process.heartbeat == Some(id) {
            process.heartbeat = None;
            process.machine.on_heartbeat(Err("timed out".into()), now);
        } else if process.status == Some(id) {
            process.status = None;
            // No answer launches nothing.
            let _ = process.machine.on_status(Err("timed out".into()), now);
        } else {
            return Ok(());
        }
        self.executor_stepped(pid)
    }

    pub(super) fn beat(&mut self, pid: Pid) -> Result<(), String> {
        let now = self.queue.now();
        let process = &mut self.procs[pid as usize];
        if !process.alive {
            return Ok(());
        }
        // Exiting on driver loss is the operator's choice; the simulated executors wait.
        let _ = process.machine.beat(false, Default::default(), now);
        self.queue.after(HEARTBEAT_MS, Event::Beat { pid });
        self.executor_stepped(pid)
    }

    pub(super) fn executor_inbox(
        &mut self,
        pid: Pid,
        sender: Sender,
        message: ExecutorMessage,
    ) -> Result<(), String> {
        let now = self.queue.now();
        if !self.procs[pid as usize].alive || !self.hears(pid, sender)? {
            return Ok(());
        }
        match message {
            ExecutorMessage::LaunchTasks {
                tasks,
                driver_instance,
            } => {
                if self.procs[pid as usize]
                    .machine
                    .sent_by_my_driver(driver_instance)
                {
                    self.launch_all(pid, sender, &tasks)?;
                }
            }
            ExecutorMessage::KillTask {
                task_id,
                attempt,
                driver_instance,
                ..
            } => {
                let machine = &mut self.procs[pid as usize].machine;
                if machine.sent_by_my_driver(driver_instance) {
                    machine.kill(task_id, attempt, now);
                }
            }
            ExecutorMessage::StopExecutor { reason } => self.stop(pid, &reason, now),
            ExecutorMessage::Leading { driver_instance } => {
                self.procs[pid as usize]
                    .machine
                    .leader_announced(driver_instance);
            }
        }
        self.executor_stepped(pid)
    }

    /// Starts tasks that `sender` launched on `pid`.
    fn launch_all(
        &mut self,
        pid: Pid,
        sender: Sender,
        tasks: &[TaskDescription],
    ) -> Result<(), String> {
        for task in tasks {
            let leadership = sender.leadership;
            self.ledger
                .launched(leadership, task.task_id, task.attempt, pid);
            self.launch(pid, leadership, task)?;
        }
        Ok(())
    }

    /// Starts one attempt on `pid`: done at once, a timer that ends it later, or, if it needs
    /// objects not on disk, a wait for their fetches before the timer starts (a task that
    /// names objects is a command, never done at once). The ledger hears of the run, if one
    /// started, under the term of the driver that launched it.
    fn launch(&mut self, pid: Pid, leadership: u32, task: &TaskDescription) -> Result<(), String> {
        let now = self.queue.now();
        let ok = !self.rng.chance(self.config.task_failure);
        let objects: BTreeSet<ObjectRef> = task.spec.objects().cloned().collect();
        let instant = self.rng.chance(INSTANT_TASKS) && objects.is_empty();
        let run_for = self.rng.between(1, self.config.task_ms);
        let (queue, process) = (&mut self.queue, &mut self.procs[pid as usize]);
        let waits = !process.cache.missing(&objects).is_empty();
        let term = process.machine.term();
        let mut started = None;
        process.machine.launch(task, |task, run| {
            started = Some(run);
            if instant {
                return Started::Ended(end_of(pid, run, task.task_id, task.attempt, ok));
            }
            if waits {
                return Started::Running(Work);
            }
            let (task_id, attempt) = (task.task_id, task.attempt);
            queue.after(
                run_for,
                Event::TaskDone {
                    pid,
                    run,
                    task_id,
                    attempt,
                    ok,
                },
            );
            Started::Running(Work)
        });
        let Some(run) = started else {
            return Ok(());
        };
        self.ledger
            .run_started(leadership, pid, run, task, term, now, instant)?;
        if waits {
            let needs = Needs {
                objects,
                ok,
                run_for,
            };
            self.wait_for_objects(pid, run, task, needs);
        } else if !objects.is_empty() {
            // Every object is on disk: the work starts at once.
            self.ledger
                .fetches
                .work_started(pid, task.task_id, &objects, now)?;
        }
        Ok(())
    }

    pub(super) fn task_done(
        &mut self,
        pid: Pid,
        run: Run,
        task_id: TaskId,
        attempt: u32,
        ok: bool,
    ) -> Result<(), String> {
        let process = &mut self.procs[pid as usize];
        if !process.alive {
            return Ok(());
        }
        process
            .machine
            .finish(run, end_of(pid, run, task_id, attempt, ok));
        self.executor_stepped(pid)
    }

    /// Decommissions `pid`: the machine drains, and hands back what runs at its deadline.
    pub(super) fn stop(&mut self, pid: Pid, why: &str, now: u64) {
        // It hands back what runs and leaves: its runs are not the new leader's to keep.
        self.ledger.runs.disturb(pid, now, u64::MAX);
        let machine = &mut self.procs[pid as usize].machine;
        machine.stop(why, now);
        if let Some(at) = machine.hand_back_at() {
            self.queue.at(at, Event::HandBack { pid });
        }
    }

    pub(super) fn hand_back(&mut self, pid: Pid) -> Result<(), String> {
        let process = &mut self.procs[pid as usize];
        if !process.alive || process.machine.hand_back_at().is_none() {
            return Ok(());
        }
        process.machine.hand_back();
        self.executor_stepped(pid)
    }

    /// Ends an executor's step as the shell does: the machine polls, and its requests go out.
    pub(super) fn executor_stepped(&mut self, pid: Pid) -> Result<(), String> {
        let now = self.queue.now();
        let machine = &self.procs[pid as usize].machine;
        let run_of = |task| machine.run_of(task).map(|(_, _, run)| run);
        self.ledger.runs.sync(pid, now, false, run_of);
        let leave = self.procs[pid as usize].machine.poll(now);
        while let Some(ask) = self.procs[pid as usize].machine.next_request() {
            self.ask(pid, ask);
        }
        if leave {
            self.trace.line(now, format_args!("e{pid} leaves, drained"));
            self.leave(pid);
        }
        Ok(())
    }

    fn ask(&mut self, pid: Pid, ask: Ask) {
        let process = &mut self.procs[pid as usize];
        match ask {
            Ask::Register => {
                process.backoff = Backoff::new(None);
                let _ = self.send_register(pid);
            }
            Ask::Heartbeat(beat) => {
                let id = self.request(pid, Request::Lifecycle(beat), REQUEST_TIMEOUT);
                self.procs[pid as usize].heartbeat = Some(id);
            }
            Ask::Status => {
                let executor_id = process.machine.config().executor_id.clone();
                let batch: Vec<StatusUpdate> =
                    process.machine.statuses().sending().cloned().collect();
                let driver_instance = process.machine.statuses().driver;
                let body = Request::Status(StatusRequest::StatusUpdates {
                    executor_id,
                    updates: batch,
                    driver_instance,
                });
                let id = self.request(pid, body, REQUEST_TIMEOUT + STATUS_RETRY_PAUSE);
                self.procs[pid as usize].status = Some(id);
            }
            Ask::Decommission(notice) | Ask::Exiting(notice) => {
                self.request(pid, Request::Lifecycle(notice), REQUEST_TIMEOUT);
            }
        }
    }

    /// The process is gone; a replacement starts a little later.
    pub(super) fn leave(&mut self, pid: Pid) {
        self.procs[pid as usize].alive = false;
        self.last_loss = self.queue.now();
        self.ledger.runs.process_gone(pid, self.last_loss);
        let restart = self.config.faults.restart_ms;
        self.queue.after(restart, Event::StartExecutor);
    }
}

/// The terminal status of simulated run `run` of `pid`, its result naming the run.
fn end_of(pid: Pid, run: Run, task_id: TaskId, attempt: u32, ok: bool) -> StatusUpdate {
    StatusUpdate {
        task_id,
        attempt,
        state: if ok {
            TaskState::Finished
        } else {
            TaskState::Failed
        },
        result: Some(super::runs::result_of(pid, run)),
        error: (!ok).then(|| "simulated failure".to_string()),
        result_object: None,
        no_retry: false,
    }
}
