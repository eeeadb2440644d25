//! The driver processes: each runs the real driver core when it leads, fed what arrives from
//! the network with the virtual time, its effects sent back through the network and its
//! events delivered to the ledger, which listens as `ember events` does.
//!
//! With the journal (the product's default), any number of driver processes run, and they do
//! what `driver::lease` and `driver::journal` do, with the same decisions (`driver::
//! lease_clock`, on virtual time): a standby reads the lease key every poll interval and takes
//! it by compare-and-set once its revision has stood for the lease and a grace; the leader
//! marks the journal, replays it into a new core, renews the lease every third of it (counted
//! from when the renewal was sent), stops the moment its lease runs out in its own eyes, and
//! writes its records with the expected-last-sequence check, a write expecting the sequence
//! its predecessor takes. What it sends goes through the driver's own outbox ([`writes`](
//! super::writes)): group commit, the urgent groups beside a write in flight, the wait for
//! company, and the hold limit, as the shell has them. Everything a leader sends carries its
//! epoch.
//!
//! Without the journal there is one driver and no lease: a killed one starts empty, and the
//! client submits again what had not ended. The lease's side is in [`lease`](super::lease).

use super::broker::WrongLast;
use super::network::{Message, Pid, Reply, Request, Sender};
use super::writes::{at, Output, Writes};
use super::{Event, World};
use crate::driver::core::{Core, CoreConfig, Effect, Retention};
use crate::driver::lease_clock::{self as lease, Hold, Watch};
use crate::ids::{ExecutorId, InstanceId, JobId, TaskId};
use crate::protocol::{
    ApiReply, ApiRequest, JobState, JournalRecord, StatusRequest, SubmitJob, TaskOutcome, TaskState,
};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The concurrency key some of the workload's jobs name.
const SIM_KEY: &str = "sim";

const TICK_MS: u64 = crate::DEFAULT_REVIVE_INTERVAL.as_millis() as u64;

/// One driver process.
pub struct DriverNode {
    pub alive: bool,
    /// Until when it is stopped (SIGSTOP): what is due to it, and what it had sent that still
    /// sat in its connection, waits until then.
    pub paused_until: u64,
    /// Counts its lives and leaderships: whatever was due to an earlier one is dropped.
    pub turn: u64,
    pub role: Role,
}

pub enum Role {
    Down,
    /// Standing by, watching the lease key.
    Standby {
        watch: Watch<Duration>,
    },
    Leading(Box<Leader>),
}

/// One leadership of a driver process.
pub struct Leader {
    core: Core,
    pub epoch: u64,
    /// Which leadership of the run this is, counting from 0.
    pub leadership: u32,
    /// Its hold on the lease, with the journal.
    pub(super) hold: Option<Hold<Duration>>,
    /// Whether its lease has lapsed (told once in the trace).
    pub(super) lapsed: bool,
    pub(super) writes: Writes,
    /// When a commit of the group gathering is due to it, if one is.
    pub(super) commit_at: Option<u64>,
}

/// What is due to a driver process.
#[derive(Debug)]
pub enum AtDriver {
    /// A standby reads the lease.
    Poll,
    /// The leader's renewal timer.
    Renew,
    /// The answer to a renewal sent at `sent`: the new revision, or none if another wrote.
    Renewed {
        sent: u64,
        revision: Option<u64>,
    },
    /// The leader's lease may have run out.
    Expire,
    /// The answer to journal write number `write`.
    Stored {
        write: u64,
        result: Result<u64, WrongLast>,
    },
    /// Write number `write` goes again: the one before it was not stored yet.
    Again {
        write: u64,
    },
    /// The group gathering may be due to be written.
    Commit,
    Request {
        from: Pid,
        id: u64,
        body: Request,
    },
    Tick,
}

/// What reaches the broker from a driver process.
#[derive(Debug)]
pub enum ToBroker {
    /// A renewal sent at `sent`, a compare-and-set on `expected`.
    Renew { expected: u64, sent: u64 },
    Write {
        epoch: u64,
        expected: u64,
        write: u64,
        records: Vec<JournalRecord>,
    },
}

impl DriverNode {
    /// How long after an executor goes away the driver is sure to have removed it: its last
    /// messages may still arrive up to `delay_ms` later, and each refreshes it.
    pub fn removal_delay(delay_ms: u64) -> u64 {
        crate::DEFAULT_EXECUTOR_TIMEOUT.as_millis() as u64 + delay_ms + 2 * TICK_MS
    }

    pub(super) fn leader(&mut self) -> Option<&mut Leader> {
        match &mut self.role {
            Role::Leading(leader) => Some(leader),
            _ => None,
        }
    }

    pub fn leads(&self) -> bool {
        matches!(self.role, Role::Leading(_))
    }
}

fn new_core(driver_instance: InstanceId, epoch: u64, term: u64, journal: bool) -> Core {
    Core::new(CoreConfig {
        driver_instance,
        epoch,
        term,
        expect_executors: 0,
        max_reply_bytes: crate::DEFAULT_MAX_PAYLOAD,
        journal,
        results_bucket: false,
        retention: if journal {
            Retention::default()
        } else {
            // One finished job kept: every job is forgotten as the next one ends, while late
            // statuses of its attempts may still arrive.
            Retention {
                jobs: 1,
                ..Default::default()
            }
        },
    })
}

/// The outcomes of job `job_id`'s tasks in `core`, read a page at a time as a client does.
fn outcomes(core: &mut Core, job_id: JobId, now: u64) -> Vec<TaskOutcome> {
    let mut outcomes = Vec::new();
    let mut offset = 0;
    loop {
        let page = core.api(
            ApiRequest::GetResults {
                job_id,
                offset,
                limit: u32::MAX,
            },
            now,
        );
        let ApiReply::Results(page) = page else {
            return outcomes;
        };
        outcomes.extend(page.results);
        match page.next_offset {
            Some(next) => offset = next,
            None => return outcomes,
        }
    }
}

/// The tasks of `outcomes` that finished.
fn finished_of(outcomes: &[TaskOutcome]) -> BTreeSet<TaskId> {
    outcomes
        .iter()
        .filter(|t| t.state == TaskState::Finished)
        .map(|t| t.task_id)
        .collect()
}

impl World {
    pub(super) fn ms(duration: Duration) -> u64 {
        duration.as_millis() as u64
    }

    /// The driver processes at the start: with the journal, all stand by and the first poll
    /// finds the lease free; without, the one driver leads at once.
    pub(super) fn start_drivers(&mut self) -> Result<(), String> {
        for node in 0..self.config.drivers {
            self.drivers.push(DriverNode {
                alive: true,
                paused_until: 0,
                turn: 0,
                role: Role::Standby {
                    watch: Watch::default(),
                },
            });
            if self.config.journal {
                self.due(node, 0, AtDriver::Poll);
            }
        }
        if !self.config.journal {
            self.lead(0, 0)?;
        }
        Ok(())
    }

    /// Schedules `what` for driver `node`'s current turn, `after` ms from now.
    pub(super) fn due(&mut self, node: u32, after: u64, what: AtDriver) {
        let turn = self.drivers[node as usize].turn;
        self.queue.after(after, Event::Driver { node, turn, what });
    }

    /// When what driver `node` sent may leave its connection: now, or when it wakes.
    pub(super) fn held_until(&self, node: u32) -> Option<u64> {
        let driver = &self.drivers[node as usize];
        (driver.alive && driver.paused_until > self.queue.now()).then_some(driver.paused_until)
    }

    /// Something due to driver `node` in `turn`: dropped if that turn is over, put off while
    /// the process is stopped.
    pub(super) fn at_driver(&mut self, node: u32, turn: u64, what: AtDriver) -> Result<(), String> {
        let driver = &self.drivers[node as usize];
        if !driver.alive || driver.turn != turn {
            return Ok(());
        }
        if let Some(wake) = self.held_until(node) {
            self.queue.at(wake, Event::Driver { node, turn, what });
            return Ok(());
        }
        // A leader whose lease has lapsed sends nothing (`Guard::current`): what it would
        // handle waits, as the driver's actor waits in its first send, while its renewal goes
        // on. Renewed, it handles what waited; found taken, it stands by.
        if !self.current(node) && !matches!(what, AtDriver::Renew | AtDriver::Renewed { .. }) {
            let wake = self.queue.now() + Self::ms(lease::poll_interval(self.lease()));
            self.queue.at(wake, Event::Driver { node, turn, what });
            return Ok(());
        }
        match what {
            AtDriver::Poll => self.poll(node),
            AtDriver::Renew => self.renew(node),
            AtDriver::Renewed { sent, revision } => self.renewed(node, sent, revision),
            AtDriver::Expire => Ok(()),
            AtDriver::Stored { write, result } => self.stored(node, write, result),
            AtDriver::Again { write } => self.again(node, write),
            AtDriver::Commit => self.commit(node),
            AtDriver::Request { from, id, body } => self.driver_receives(node, from, id, body),
            AtDriver::Tick => self.driver_tick(node),
        }
    }

    /// Driver `node` leads from now, in `epoch` (0 without the journal): it marks the journal,
    /// restores what it holds, and the client submits what the new leader does not know.
    pub(super) fn lead(&mut self, node: u32, epoch: u64) -> Result<(), String> {
        let now = self.queue.now();
        let instance = self.rng.uuid();
        let journal = self.config.journal;
        let term = match journal {
            true => {
                let mark = JournalRecord::Leader {
                    epoch,
                    driver_instance: instance,
                    time_ms: now,
                };
                self.broker.mark(epoch, mark)?
            }
            false => 0,
        };
        let mut core = new_core(instance, epoch, term, journal);
        if journal {
            for record in self.broker.replayed() {
                core.replay(record.clone())
                    .map_err(|e| format!("d{node} could not restore the journal: {e}"))?;
            }
            core.resume(now);
        }
        let leadership = self.leaderships;
        self.leaderships += 1;
        self.trace.line(
            now,
            format_args!("d{node} leads, epoch {epoch}, leadership {leadership}"),
        );
        let lease = self.lease();
        let driver = &mut self.drivers[node as usize];
        driver.turn += 1;
        driver.role = Role::Leading(Box::new(Leader {
            core,
            epoch,
            leadership,
            hold: journal.then(|| Hold::taken(lease, epoch, at(now))),
            lapsed: false,
            writes: Writes::new(term, self.config.max_held),
            commit_at: None,
        }));
        self.ledger.new_leadership(leadership);
        if journal {
            self.check_restored(node)?;
            let renew = Self::ms(lease::renew_interval(self.lease()));
            self.due(node, renew, AtDriver::Renew);
            self.due(node, self.config.lease_ms, AtDriver::Expire);
        }
        // Every executor hears that this driver leads, as the driver's shell tells them.
        let mut pids: Vec<Pid> = self.pids.values().copied().collect();
        pids.sort_unstable();
        for to in pids {
            let body = crate::protocol::ExecutorMessage::Leading {
                driver_instance: instance,
            };
            self.output(node, Output::Inbox { to, body })?;
        }
        self.due(node, 0, AtDriver::Tick);
        self.submit_all(node)
    }

    /// What a new leader restored holds everything acknowledged before: every job the client
    /// was told was accepted, every success a listener saw. And a job the client waits on
    /// that ended unseen (its end stored, its event lost with the old leader) is learned by
    /// asking, as `ember submit` does through a failover.
    fn check_restored(&mut self, node: u32) -> Result<(), String> {
        let now = self.queue.now();
        let Some(leader) = self.drivers[node as usize].leader() else {
            return Ok(());
        };
        let core = &mut leader.core;
        for (job_id, acknowledged) in self.ledger.acknowledged() {
            let summary = match core.api(ApiRequest::GetJob { job_id }, now) {
                ApiReply::Job { job } => job,
                // Submitted, but never stored and so never acknowledged: lost, and submitted
                // again below.
                _ if !acknowledged.any() => continue,
                other => {
                    return Err(format!(
                        "job {job_id} was acknowledged, but the new leader answers {other:?}"
                    ))
                }
            };
            if acknowledged.succeeded && summary.state != JobState::Succeeded {
                return Err(format!(
                    "job {job_id} was seen to succeed, but the new leader has it {}",
                    summary.state
                ));
            }
            let outcomes = outcomes(core, job_id, now);
            let pids = &self.pids;
            let leadership = leader.leadership;
            self.ledger
                .check_results(leadership, &outcomes, |id| pids.get(id).copied())?;
            let finished = finished_of(&outcomes);
            if let Some(lost) = acknowledged.finished.iter().find(|t| !finished.contains(t)) {
                return Err(format!(
                    "task {lost} of job {job_id} was seen to finish, but the new leader has it \
                     unfinished"
                ));
            }
            self.ledger.restored(job_id, &finished);
            if summary.state.is_ended() {
                let reason = summary.reason.as_deref();
                self.ledger.ended_unseen(job_id, summary.state, reason)?;
            }
        }
        Ok(())
    }

    /// Submits the workload's jobs that have not ended, each with its name as its submission
    /// id: all of them at the start, and after a failover those whose submission was lost. One
    /// the leader `node` knows already is sent again too, as a client whose answer was lost
    /// does, and must be answered with the job it made.
    fn submit_all(&mut self, node: u32) -> Result<(), String> {
        let now = self.queue.now();
        let jobs = self.config.jobs.max(1) as u64;
        let origins: Vec<usize> = self.ledger.unfinished().collect();
        let Some(leader) = self.drivers[node as usize].leader() else {
            return Ok(());
        };
        let known: BTreeMap<String, JobId> = match leader.core.api(ApiRequest::list_jobs(), now) {
            ApiReply::Jobs { jobs, .. } => jobs.into_iter().map(|j| (j.name, j.job_id)).collect(),
            _ => BTreeMap::new(),
        };
        // One job in four counts under a concurrency key of a quarter of the cores at once, set
        // (journaled) by the first leader and kept by the next ones: the limits hold through
        // failovers, and no key's count of what runs may leak, or its jobs would never end.
        let limited = match leader.core.api(ApiRequest::ListKeys, now) {
            ApiReply::Keys { keys } => keys.iter().any(|k| k.key == SIM_KEY),
            _ => false,
        };
        if !limited {
            let limits = crate::protocol::KeyLimits {
                max_concurrent: Some((self.config.executors * self.config.cores / 4).max(2)),
                rate: None,
            };
            let request = ApiRequest::SetKeyLimits {
                key: SIM_KEY.into(),
                limits,
            };
            if let ApiReply::Error { message } = leader.core.api(request, now) {
                return Err(format!("the sim's key limits were refused: {message}"));
            }
        }
        let mut accepted = Vec::new();
        // The ids this leader knows the workload's jobs by, for the jobs that run after them.
        let mut ids: BTreeMap<usize, JobId> = known
            .iter()
            .filter_map(|(name, id)| Some((name.strip_prefix("sim-")?.parse().ok()?, *id)))
            .collect();
        for origin in origins {
            let name = format!("sim-{origin}");
            let (after, after_any) = self.config.upstreams(origin);
            let named = |upstreams: Vec<usize>| -> Vec<JobId> {
                upstreams
                    .iter()
                    .filter_map(|u| ids.get(u).copied())
                    .collect()
            };
            let (after, after_any) = (named(after), named(after_any));
            let tasks = (self.config.tasks / jobs
                + u64::from((origin as u64) < self.config.tasks % jobs))
                as u32;
            // Every other job copies its slow tasks: the invariants hold with speculation too.
            let speculation = (origin % 2 == 1).then(crate::protocol::Speculation::default);
            // And one in four waits before each retry, through failovers: the waits replay.
            let retry_backoff =
                (origin % 4 == 2).then(|| crate::protocol::RetryBackoff::starting_at(50));
            // And one in four stops an attempt that runs four times the longest a task runs
            // (only a stuck one does): the timers run through failovers too.
            let timeouts = crate::protocol::JobTimeouts {
                attempt_timeout_ms: (origin % 4 == 0).then_some(4 * self.config.task_ms),
                ..Default::default()
            };
            let job = SubmitJob {
                speculation,
                retry_backoff,
                submission_id: Some(name.clone()),
                name: name.clone(),
                repeat: tasks.max(1),
                max_failures: crate::DEFAULT_MAX_FAILURES,
                after,
                after_any,
                timeouts,
                concurrency_key: (origin % 4 == 1).then(|| SIM_KEY.to_string()),
                ..SubmitJob::new(vec![super::objects::spec_of(&self.objects, origin)])
            };
            let reply = leader.core.api(ApiRequest::SubmitJob(job), now);
            match (known.get(&name), reply) {
                (Some(made), ApiReply::JobAccepted { job_id }) if job_id == *made => {}
                (Some(made), other) => {
                    return Err(format!(
                        "{name}, sent again with its submission id, was answered {other:?}, \
                         not with job {made}, which it made"
                    ))
                }
                (None, ApiReply::JobAccepted { job_id }) => {
                    self.ledger.submitted(job_id, origin, tasks.max(1));
                    accepted.push(Output::Accepted { origin, job_id });
                    ids.insert(origin, job_id);
                }
                (None, ApiReply::Error { message }) if message.contains("run after") => {
                    return Err(format!("{name} was refused: {message}"));
                }
                (None, _) => {}
            }
        }
        self.driver_effects(node, None, None)?;
        for answer in accepted {
            self.output(node, answer)?;
        }
        Ok(())
    }

    fn driver_receives(
        &mut self,
        node: u32,
        from: Pid,
        id: u64,
        request: Request,
    ) -> Result<(), String> {
        let now = self.queue.now();
        let executor_id = match &request {
            Request::Register(registration) => registration.executor_id.clone(),
            Request::Lifecycle(_) => self.procs[from as usize]
                .machine
                .config()
                .executor_id
                .clone(),
            Request::Status(StatusRequest::StatusUpdates { executor_id, .. }) => {
                executor_id.clone()
            }
        };
        let Some(leader) = self.drivers[node as usize].leader() else {
            return Ok(());
        };
        let core = &mut leader.core;
        let reply = match request {
            Request::Register(registration) => {
                Reply::Register(core.register(executor_id.as_str(), *registration, now))
            }
            Request::Lifecycle(request) => {
                Reply::Lifecycle(core.heartbeat(executor_id.as_str(), request, now))
            }
            Request::Status(request) => {
                Reply::Status(core.status_request(executor_id.as_str(), request, now))
            }
        };
        let reply = Output::Reply {
            to: from,
            id,
            body: reply,
        };
        self.driver_effects(node, Some(&executor_id), Some(reply))
    }

    /// Who a message from leader `node` is from; a broken invariant if `node` sends while it
    /// does not hold the lease.
    fn sender(&self, node: u32) -> Result<Sender, String> {
        let sender = self.leading_sender(node)?;
        if self.config.journal && self.broker.lease.holder != Some(node) {
            let holder = match self.broker.lease.holder {
                Some(other) => format!("d{other} holds the lease"),
                None => "no driver holds the lease".into(),
            };
            return Err(format!(
                "d{node} sent in epoch {} while {holder}",
                sender.epoch
            ));
        }
        Ok(sender)
    }

    /// Who a message from leader `node` is from; a broken invariant if `node` does not lead.
    fn leading_sender(&self, node: u32) -> Result<Sender, String> {
        let Role::Leading(leader) = &self.drivers[node as usize].role else {
            return Err(format!("d{node} sent while it does not lead"));
        };
        Ok(Sender {
            node,
            leadership: leader.leadership,
            epoch: leader.epoch,
        })
    }

    /// Sends the step's `reply` and the core's effects, checks its events, and the cores of
    /// `touched` (or of every executor).
    fn driver_effects(
        &mut self,
        node: u32,
        touched: Option<&ExecutorId>,
        reply: Option<Output>,
    ) -> Result<(), String> {
        let (journal, now) = (self.config.journal, self.queue.now());
        let Some(leader) = self.drivers[node as usize].leader() else {
            return Ok(());
        };
        // As the shell does: a step's records join the group gathering first, and then its
        // outputs leave or wait behind the writes.
        let (records, effects): (Vec<_>, Vec<_>) = leader
            .core
            .take_effects()
            .into_iter()
            .partition(Effect::is_write);
        let mut full = Vec::new();
        for effect in records {
            match effect {
                Effect::Journal(record) if journal => {
                    full.extend(leader.writes.record(record, now));
                }
                Effect::Journal(record) => {
                    return Err(format!("a core without a journal wrote {record:?}"));
                }
                Effect::StoreResult { job_id, index, .. } => {
                    return Err(format!(
                        "a core without a results bucket stored job {job_id}'s result {index}"
                    ));
                }
                Effect::PinResults { job_id, .. } | Effect::UnpinResults { job_id } => {
                    return Err(format!(
                        "a core without a results bucket pinned job {job_id}'s results"
                    ));
                }
                _ => unreachable!("partitioned by is_write"),
            }
        }
        for write in full {
            self.send_write(node, write)?;
        }
        if let Some(reply) = reply {
            self.output(node, reply)?;
        }
        for effect in effects {
            match effect {
                Effect::Publish(event) => {
                    if let crate::protocol::Event::JobEnd { job_id, .. } = event {
                        self.check_results(node, job_id)?;
                    }
                    self.trace.fold(&super::trace::event_words(&event));
                    self.output(node, Output::Publish(event))?;
                }
                Effect::Release {
                    job_id,
                    state,
                    reason,
                } => self.output(
                    node,
                    Output::Release {
                        job_id,
                        state,
                        reason,
                    },
                )?,
                Effect::Send { to, message } => {
                    if let crate::protocol::ExecutorMessage::LaunchTasks { tasks, .. } = &message {
                        self.check_upstreams_stored(tasks)?;
                    }
                    let Some(&pid) = self.pids.get(&to) else {
                        continue;
                    };
                    self.output(
                        node,
                        Output::Inbox {
                            to: pid,
                            body: message,
                        },
                    )?;
                }
                _ => unreachable!("partitioned by is_write"),
            }
        }
        self.commit(node)?;
        let Some(leader) = self.drivers[node as usize].leader() else {
            return Ok(());
        };
        let core = &leader.core;
        match touched {
            Some(id) => super::ledger::Ledger::check_cores(core, id),
            None => core
                .executors()
                .keys()
                .try_for_each(|id| super::ledger::Ledger::check_cores(core, id)),
        }
    }

    /// With the journal, no task of a job that runs after others is launched before the end
    /// of each of them is stored.
    fn check_upstreams_stored(
        &self,
        tasks: &[crate::protocol::TaskDescription],
    ) -> Result<(), String> {
        if !self.config.journal || !self.config.dependencies {
            return Ok(());
        }
        let mut jobs: Vec<JobId> = tasks.iter().map(|t| t.job_id).collect();
        jobs.dedup();
        for job_id in jobs {
            let Some(origin) = self.ledger.origin_of(job_id) else {
                continue;
            };
            let (after, after_any) = self.config.upstreams(origin);
            for upstream in after.into_iter().chain(after_any) {
                let Some(up) = self.ledger.job_of(upstream) else {
                    continue;
                };
                if !self.broker.job_end_stored(up) {
                    return Err(format!(
                        "a task of job {job_id} was launched before the end of job {up}, \
                         which it runs after, was stored"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The outcomes leader `node` gives for job `job_id`, as a client reads them when it ends.
    fn check_results(&mut self, node: u32, job_id: JobId) -> Result<(), String> {
        let now = self.queue.now();
        let Some(leader) = self.drivers[node as usize].leader() else {
            return Ok(());
        };
        let outcomes = outcomes(&mut leader.core, job_id, now);
        let pids = &self.pids;
        self.ledger
            .check_results(leader.leadership, &outcomes, |id| pids.get(id).copied())
    }

    /// An output of leader `node`: it goes now, or waits behind the journal writes before it.
    fn output(&mut self, node: u32, output: Output) -> Result<(), String> {
        let Some(leader) = self.drivers[node as usize].leader() else {
            return Ok(());
        };
        match leader.writes.send_or_hold(output) {
            Some(output) => self.release(node, output),
            None => Ok(()),
        }
    }

    /// Sends an output: an event to the listener, an answer to the client, a message to an
    /// executor.
    pub(super) fn release(&mut self, node: u32, output: Output) -> Result<(), String> {
        match output {
            Output::Publish(event) => {
                let Ok(sender) = self.sender(node) else {
                    return Ok(());
                };
                self.queue.after(1, Event::Listen { sender, event });
            }
            Output::Accepted { origin, job_id } => self.ledger.accepted(origin, job_id),
            Output::Reply { to, id, body } => {
                let sender = self.sender(node)?;
                self.send(Message::Reply {
                    to,
                    id,
                    sender,
                    body,
                });
            }
            Output::Inbox { to, body } => {
                let sender = self.sender(node)?;
                self.send(Message::Inbox { to, sender, body });
            }
            Output::Release {
                job_id,
                state,
                reason,
            } => {
                let now = self.queue.now();
                if let Some(leader) = self.drivers[node as usize].leader() {
                    leader.core.release(job_id, state, reason, now);
                    self.driver_effects(node, None, None)?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn send_to_broker(&mut self, node: u32, what: ToBroker) -> Result<(), String> {
        // A renewal is a compare-and-set the broker refuses unless the driver still holds the
        // lease's revision: a leader whose lease lapsed sends it to learn which it is.
        let sender = match what {
            ToBroker::Renew { .. } => self.leading_sender(node)?,
            ToBroker::Write { .. } => self.sender(node)?,
        };
        let now = self.queue.now();
        let at = self.network.arrival_at_broker(&mut self.rng, now);
        let turn = self.drivers[node as usize].turn;
        self.queue.at(at, Event::AtBroker { sender, turn, what });
        Ok(())
    }

    /// A driver's request reaches the broker, which answers at once.
    pub(super) fn at_broker(
        &mut self,
        sender: Sender,
        turn: u64,
        what: ToBroker,
    ) -> Result<(), String> {
        let node = sender.node;
        let answer = match what {
            ToBroker::Renew { expected, sent } => AtDriver::Renewed {
                sent,
                revision: self.broker.write_lease(node, expected),
            },
            ToBroker::Write {
                epoch,
                expected,
                write,
                records,
            } => AtDriver::Stored {
                write,
                result: self
                    .broker
                    .write(epoch, expected, records, !self.config.fencing)?,
            },
        };
        let now = self.queue.now();
        let at = self.network.arrival_at_broker(&mut self.rng, now);
        self.queue.at(
            at,
            Event::Driver {
                node,
                turn,
                what: answer,
            },
        );
        Ok(())
    }

    fn driver_tick(&mut self, node: u32) -> Result<(), String> {
        let now = self.queue.now();
        let Some(leader) = self.drivers[node as usize].leader() else {
            return Ok(());
        };
        leader.core.tick(now);
        self.due(node, TICK_MS, AtDriver::Tick);
        self.driver_effects(node, None, None)
    }

    /// The leading driver process dies (`graceful`: as on SIGTERM, letting the lease go first),
    /// if one runs; everything it held is gone. Whether one did.
    pub(super) fn driver_down(&mut self, graceful: bool) -> bool {
        let Some(node) = self.leading() else {
            return false;
        };
        if graceful && self.config.journal {
            let revision = self.drivers[node as usize]
                .leader()
                .and_then(|l| l.hold)
                .map_or(0, |hold| hold.revision());
            self.broker.release_lease(node, revision);
        }
        let driver = &mut self.drivers[node as usize];
        driver.alive = false;
        driver.turn += 1;
        driver.role = Role::Down;
        let restart = self.config.faults.restart_ms;
        self.queue.after(restart, Event::DriverUp { node });
        true
    }

    /// Stops the leading driver process for `for_ms` (SIGSTOP, then SIGCONT). Whether one ran.
    pub(super) fn driver_pause(&mut self, for_ms: u64) -> bool {
        let Some(node) = self.leading() else {
            return false;
        };
        let now = self.queue.now();
        let driver = &mut self.drivers[node as usize];
        driver.paused_until = driver.paused_until.max(now + for_ms);
        if let Some(leader) = driver.leader() {
            self.ledger.runs.pause(leader.leadership);
        }
        self.trace
            .line(now, format_args!("d{node} is stopped for {for_ms} ms"));
        true
    }

    /// A live driver process that leads in its own eyes, not stopped.
    fn leading(&self) -> Option<u32> {
        let now = self.queue.now();
        (0..self.drivers.len() as u32).find(|n| {
            let d = &self.drivers[*n as usize];
            d.alive && d.leads() && d.paused_until <= now
        })
    }

    /// The processes an executor's request reaches: every live one that leads in its own eyes
    /// (a standby does not listen on the executors' subjects).
    pub(super) fn listening(&self) -> Vec<(u32, u64)> {
        (0..self.drivers.len() as u32)
            .filter(|n| self.drivers[*n as usize].alive && self.drivers[*n as usize].leads())
            .map(|n| (n, self.drivers[n as usize].turn))
            .collect()
    }

    /// A killed driver process starts again: with the journal it stands by; without, it leads
    /// at once, empty, and the client submits again what had not ended.
    pub(super) fn driver_up(&mut self, node: u32) -> Result<(), String> {
        let driver = &mut self.drivers[node as usize];
        driver.alive = true;
        driver.paused_until = 0;
        driver.turn += 1;
        driver.role = Role::Standby {
            watch: Watch::default(),
        };
        self.trace
            .line(self.queue.now(), format_args!("d{node} starts again"));
        if self.config.journal {
            self.due(node, 0, AtDriver::Poll);
            Ok(())
        } else {
            self.lead(node, 0)
        }
    }
}
