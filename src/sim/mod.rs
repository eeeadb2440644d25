//! A deterministic simulation of a whole cluster: the real driver core, executors running the
//! real executor machine, and an in-memory network that drops, duplicates, delays and reorders
//! messages and partitions nodes, with executors (and, optionally, the driver) killed and
//! restarted, and driver processes that lead by a lease, keep a journal, fence their messages
//! with epochs, and are killed, stopped and restarted, all on a virtual clock. Everything random comes from one seed, so a seed replays a
//! run step for step; the invariants in [`ledger`] are checked after every step.
//!
//! Split by concern: [`rng`] (the seed's numbers), [`queue`] (the clock and its events),
//! [`network`], [`broker`] (the lease key and the journal stream), [`executors`] (the executor
//! processes), [`driver`] (the driver processes and the client), [`writes`] (a leader's journal
//! writes, through the driver's own outbox), [`faults`] (injecting them), [`objects`] (the
//! objects tasks name, fetched on executors before their work starts), [`ledger`] (the
//! invariants), [`runs`] (the runs of attempts and their invariants), [`fetches`] (the
//! fetches and their invariants), [`trace`].

mod broker;
pub mod config;
mod driver;
mod executors;
mod faults;
pub mod fetches;
mod lease;
pub mod ledger;
mod network;
mod objects;
mod queue;
pub mod rng;
mod runs;
mod trace;
mod writes;

pub use config::{Faults, SimConfig};

use crate::executor::machine::Machine;
use crate::ids::ExecutorId;
use crate::ids::TaskId;
use executors::{Process, Work};
use network::{Message, Network, Pid, Sender};
use queue::Queue;
use rng::Rng;
use std::collections::HashMap;
use trace::Trace;

/// How long after the faults stop every job must have ended, in virtual ms.
pub const HANG_MS: u64 = 10 * 60 * 1000;

/// Something due at a moment of virtual time.
#[derive(Debug)]
enum Event {
    Arrive(Message),
    /// Request `id` of `pid` has had no answer for the request timeout.
    Timeout {
        pid: Pid,
        id: u64,
    },
    RegisterRetry {
        pid: Pid,
    },
    Beat {
        pid: Pid,
    },
    TaskDone {
        pid: Pid,
        /// The machine's number for the run that ends.
        run: crate::executor::machine::Run,
        task_id: TaskId,
        attempt: u32,
        ok: bool,
    },
    HandBack {
        pid: Pid,
    },
    /// A fetch of `object` on `pid` ends.
    Fetched {
        pid: Pid,
        object: crate::objects::ObjectRef,
        ok: bool,
    },
    StartExecutor,
    /// Something due to driver process `node` in its `turn`.
    Driver {
        node: u32,
        turn: u64,
        what: driver::AtDriver,
    },
    /// A driver's request reaches JetStream; its answer goes to the sender's `turn`.
    AtBroker {
        sender: Sender,
        turn: u64,
        what: driver::ToBroker,
    },
    /// An event reaches the listener.
    Listen {
        sender: Sender,
        event: crate::protocol::Event,
    },
    DriverUp {
        node: u32,
    },
    Fault(faults::Kind),
}

/// A broken invariant: when, and what.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub step: u64,
    pub time_ms: u64,
    pub what: String,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub seed: u64,
    pub steps: u64,
    pub virtual_ms: u64,
    /// The trace's hash: the same for every run of the same configuration.
    pub trace: u64,
    pub tasks_finished: u64,
    /// Speculative copies launched (every other job of the workload has speculation on).
    pub copies: u64,
    pub jobs_ended: usize,
    pub faults: faults::Counts,
    /// How many leaderships the run saw (1 without a failover).
    pub leaderships: u32,
    /// Runs a new leader adopted rather than start their tasks again.
    pub adopted: u64,
    /// Journal writes stored off their leaders' turns (a deposed leader's after its
    /// successor's mark), which a restoring leader skips.
    pub skipped_writes: u64,
    /// The object fetches on executors.
    pub fetches: fetches::Counts,
    pub violation: Option<Violation>,
}

/// The simulated cluster.
struct World {
    config: SimConfig,
    queue: Queue<Event>,
    rng: Rng,
    network: Network,
    procs: Vec<Process>,
    /// Which process each executor id belongs to.
    pids: HashMap<ExecutorId, Pid, crate::FixedHasher>,
    drivers: Vec<driver::DriverNode>,
    broker: broker::Broker,
    leaderships: u32,
    ledger: ledger::Ledger,
    trace: Trace,
    counts: faults::Counts,
    next_request: u64,
    steps: u64,
    /// When the last executor went away (removals are due a timeout later).
    last_loss: u64,
    /// The objects the workload's tasks name.
    objects: Vec<crate::objects::ObjectRef>,
}

/// Runs one simulation; `print_trace` prints every step.
pub fn run(config: SimConfig, print_trace: bool) -> Report {
    let mut world = World::new(config, print_trace);
    let violation = world.run_to_end().err();
    Report {
        seed: world.config.seed,
        steps: world.steps,
        virtual_ms: world.queue.now(),
        trace: world.trace.hash(),
        tasks_finished: world.ledger.tasks_finished,
        copies: world.ledger.copies,
        jobs_ended: world.ledger.origins_ended.iter().filter(|e| **e).count(),
        faults: world.counts_with_network(),
        leaderships: world.leaderships,
        adopted: world.ledger.runs.adopted,
        skipped_writes: world.broker.skipped(),
        fetches: world.ledger.fetches.counts.clone(),
        violation,
    }
}

impl World {
    fn new(config: SimConfig, print_trace: bool) -> Self {
        Self {
            network: Network::new(config.faults.clone()),
            ledger: ledger::Ledger::new(config.jobs as usize, config.journal),
            queue: Queue::default(),
            procs: Vec::with_capacity(config.executors as usize),
            pids: HashMap::default(),
            trace: Trace::new(print_trace),
            counts: faults::Counts::default(),
            next_request: 0,
            steps: 0,
            last_loss: 0,
            drivers: Vec::new(),
            broker: broker::Broker::default(),
            leaderships: 0,
            objects: objects::workload_objects(config.seed, config.objects),
            rng: Rng::new(config.seed),
            config,
        }
    }

    fn run_to_end(&mut self) -> Result<(), Violation> {
        if let Err(what) = self.config.check() {
            return Err(self.violation(format!("the configuration cannot run: {what}")));
        }
        self.start_drivers().map_err(|what| self.violation(what))?;
        for _ in 0..self.config.executors {
            let at = self.rng.below(1_000);
            self.queue.at(at, Event::StartExecutor);
        }
        self.schedule_faults();
        while let Some(event) = self.queue.pop() {
            self.steps += 1;
            self.step(event).map_err(|what| self.violation(what))?;
            if self.is_over() {
                let gone = self.gone_ids();
                return self
                    .ledger
                    .check_gone(gone)
                    .and_then(|()| self.ledger.check_runs())
                    .and_then(|()| self.ledger.fetches.check())
                    .and_then(|()| self.ledger.check_dependencies(&self.config))
                    .map_err(|what| self.violation(what));
            }
            if self.queue.now() > self.config.faults.for_ms + HANG_MS {
                let left = self.ledger.unfinished().count();
                return Err(self.violation(format!(
                    "{left} jobs had not ended {HANG_MS} ms after the faults stopped"
                )));
            }
        }
        Err(self.violation("the event queue ran dry".into()))
    }

    /// Whether the run is done: the faults have stopped, every job has ended, and the driver
    /// has had time to notice every executor that went away.
    fn is_over(&self) -> bool {
        let now = self.queue.now();
        let settled =
            self.last_loss + driver::DriverNode::removal_delay(self.config.faults.delay_ms) < now;
        now >= self.config.faults.for_ms && settled && self.ledger.all_ended()
    }

    fn violation(&self, what: String) -> Violation {
        Violation {
            step: self.steps,
            time_ms: self.queue.now(),
            what,
        }
    }

    fn step(&mut self, event: Event) -> Result<(), String> {
        let now = self.queue.now();
        match event {
            Event::Arrive(message) => self.arrive(message),
            Event::Timeout { pid, id } => self.timed_out(pid, id),
            Event::RegisterRetry { pid } => self.send_register(pid),
            Event::Beat { pid } => self.beat(pid),
            Event::TaskDone {
                pid,
                run,
                task_id,
                attempt,
                ok,
            } => self.task_done(pid, run, task_id, attempt, ok),
            Event::HandBack { pid } => self.hand_back(pid),
            Event::Fetched { pid, object, ok } => self.fetched(pid, object, ok),
            Event::StartExecutor => self.start_executor(),
            Event::Driver { node, turn, what } => self.at_driver(node, turn, what),
            Event::AtBroker { sender, turn, what } => match self.held_until(sender.node) {
                Some(wake) => {
                    self.queue.at(wake, Event::AtBroker { sender, turn, what });
                    Ok(())
                }
                None => self.at_broker(sender, turn, what),
            },
            Event::Listen { sender, event } => match self.held_until(sender.node) {
                Some(wake) => {
                    self.queue.at(wake, Event::Listen { sender, event });
                    Ok(())
                }
                None => self.listen(sender, &event),
            },
            Event::DriverUp { node } => self.driver_up(node),
            Event::Fault(kind) => self.fault(kind),
        }?;
        self.trace.fold(&[now, self.steps]);
        Ok(())
    }

    /// Sends a message over the network: zero, one or two copies arrive. A copy lost, repeated
    /// or held up disturbs the executor's link until the last copy arrives.
    fn send(&mut self, message: Message) {
        let now = self.queue.now();
        let pid = message.executor();
        let faults = self.network.dropped + self.network.duplicated + self.network.delayed;
        let [first, second] = self.network.arrivals(&mut self.rng, pid, now);
        if self.network.dropped + self.network.duplicated + self.network.delayed != faults {
            let until = first.max(second).unwrap_or(now);
            self.ledger.runs.disturb(pid, now, until);
        }
        if let Some(at) = second {
            self.queue.at(at, Event::Arrive(message.clone()));
        }
        if let Some(at) = first {
            self.queue.at(at, Event::Arrive(message));
        }
    }

    /// A message arrives; one from a stopped driver still sits in its connection until it
    /// wakes.
    fn arrive(&mut self, message: Message) -> Result<(), String> {
        if let Some(wake) = message.sender().and_then(|s| self.held_until(s.node)) {
            self.queue.at(wake, Event::Arrive(message));
            return Ok(());
        }
        match message {
            Message::Request { from, id, body } => {
                // Every driver that leads in its own eyes hears it; the first answer counts.
                for (node, turn) in self.listening() {
                    let body = body.clone();
                    let what = driver::AtDriver::Request { from, id, body };
                    self.at_driver(node, turn, what)?;
                }
                Ok(())
            }
            Message::Reply {
                to,
                id,
                sender,
                body,
            } => self.executor_answered(to, id, sender, body),
            Message::Inbox { to, sender, body } => self.executor_inbox(to, sender, body),
        }
    }

    /// An event reaches the listener, which checks it.
    fn listen(&mut self, sender: Sender, event: &crate::protocol::Event) -> Result<(), String> {
        let now = self.queue.now();
        if self.trace.printing() {
            let (node, leadership) = (sender.node, sender.leadership);
            let line = format_args!("event from d{node} (leadership {leadership}): {event:?}");
            self.trace.line(now, line);
        }
        let pids = &self.pids;
        self.ledger
            .on_event(sender, now, event, |id| pids.get(id).copied())
    }

    fn gone_ids(&self) -> impl Iterator<Item = ExecutorId> + '_ {
        self.procs
            .iter()
            .filter(|p| !p.alive)
            .map(|p| p.machine.config().executor_id.clone())
    }
}

/// The machine a simulated executor runs: the real one, with simulated task work.
type SimMachine = Machine<Work>;
