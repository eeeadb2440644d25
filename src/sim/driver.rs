//! The driver node: the real driver core, fed what arrives from the network with the virtual
//! time, its effects sent back through the network and its events checked by the ledger; the
//! revive timer; and the client, which submits the workload's jobs (in process: the client's
//! own link to the driver is not what is under test).

use super::network::{Message, Pid, Reply, Request};
use super::{Event, World};
use crate::driver::core::{Core, CoreConfig, Effect};
use crate::ids::{ExecutorId, InstanceId};
use crate::protocol::{ApiReply, ApiRequest, StatusRequest, SubmitJob, TaskSpec};

const TICK_MS: u64 = crate::DEFAULT_REVIVE_INTERVAL.as_millis() as u64;

/// The driver process: its core, or none while it is down.
pub struct DriverNode {
    core: Option<Core>,
    /// Which driver instance this is: 0 for the first, one more for each restart.
    pub number: u32,
}

impl DriverNode {
    pub fn new(instance: InstanceId) -> Self {
        Self {
            core: Some(new_core(instance)),
            number: 0,
        }
    }

    /// How long after an executor goes away the driver is sure to have removed it: its last
    /// messages may still arrive up to `delay_ms` later, and each refreshes it.
    pub fn removal_delay(delay_ms: u64) -> u64 {
        crate::DEFAULT_EXECUTOR_TIMEOUT.as_millis() as u64 + delay_ms + 2 * TICK_MS
    }
}

fn new_core(driver_instance: InstanceId) -> Core {
    Core::new(CoreConfig {
        driver_instance,
        epoch: 0,
        expect_executors: 0,
        max_reply_bytes: crate::DEFAULT_MAX_PAYLOAD,
        // The simulated driver keeps no journal: a restarted one starts empty and the
        // simulated client submits the unfinished jobs again.
        journal: false,
        results_bucket: false,
        // One finished job kept: every job is forgotten as the next one ends, while late
        // statuses of its attempts may still arrive.
        retention: crate::driver::core::Retention {
            jobs: 1,
            ..Default::default()
        },
    })
}

impl World {
    /// Submits the workload's jobs that have not ended: all of them at the start, and again to
    /// a new driver, which knows nothing of the old one's.
    pub(super) fn submit_all(&mut self) {
        let now = self.queue.now();
        let jobs = self.config.jobs.max(1) as u64;
        let origins: Vec<usize> = self.ledger.unfinished().collect();
        let Some(core) = self.driver.core.as_mut() else {
            return;
        };
        for origin in origins {
            let tasks = (self.config.tasks / jobs
                + u64::from((origin as u64) < self.config.tasks % jobs))
                as u32;
            let job = SubmitJob {
                name: format!("sim-{origin}"),
                tasks: vec![TaskSpec::Handler {
                    name: "sim".into(),
                    arg: serde_json::Value::Null,
                }],
                repeat: tasks.max(1),
                max_failures: crate::DEFAULT_MAX_FAILURES,
                cpus_per_task: 1,
            };
            if let ApiReply::JobAccepted { job_id } = core.api(ApiRequest::SubmitJob(job), now) {
                self.ledger.submitted(job_id, origin, tasks.max(1));
            }
        }
        self.driver_effects(None)
            .expect("submitting jobs breaks no invariant");
    }

    pub(super) fn driver_receives(
        &mut self,
        from: Pid,
        id: u64,
        request: Request,
    ) -> Result<(), String> {
        let now = self.queue.now();
        let Some(core) = self.driver.core.as_mut() else {
            return Ok(());
        };
        let (executor_id, reply) = match request {
            Request::Register(registration) => {
                let executor_id = registration.executor_id.clone();
                let reply = core.register(executor_id.as_str(), *registration, now);
                (executor_id, Reply::Register(reply))
            }
            Request::Lifecycle(request) => {
                let executor_id = self.procs[from as usize]
                    .machine
                    .config()
                    .executor_id
                    .clone();
                let reply = core.heartbeat(executor_id.as_str(), request, now);
                (executor_id, Reply::Lifecycle(reply))
            }
            Request::Status(request) => {
                let StatusRequest::StatusUpdates { executor_id, .. } = &request;
                let executor_id = executor_id.clone();
                let reply = core.status_request(executor_id.as_str(), request, now);
                (executor_id, Reply::Status(reply))
            }
        };
        let driver = self.driver.number;
        self.send(Message::Reply {
            to: from,
            id,
            driver,
            body: reply,
        });
        self.driver_effects(Some(&executor_id))
    }

    /// Sends the core's effects and checks its events, and the cores of `touched` (or of every
    /// executor).
    fn driver_effects(&mut self, touched: Option<&ExecutorId>) -> Result<(), String> {
        let Some(core) = self.driver.core.as_mut() else {
            return Ok(());
        };
        let effects = core.take_effects();
        for effect in effects {
            match effect {
                Effect::Publish(event) => {
                    let pids = &self.pids;
                    self.trace.fold(&super::trace::event_words(&event));
                    if self.trace.printing() {
                        self.trace
                            .line(self.queue.now(), format_args!("event {event:?}"));
                    }
                    self.ledger.on_event(&event, |id| pids.get(id).copied())?;
                }
                Effect::Send { to, message } => {
                    let Some(&pid) = self.pids.get(&to) else {
                        continue;
                    };
                    let driver = self.driver.number;
                    self.send(Message::Inbox {
                        to: pid,
                        driver,
                        body: message,
                    });
                }
                Effect::Journal(record) => {
                    return Err(format!("a core without a journal wrote {record:?}"));
                }
                Effect::StoreResult { job_id, index, .. } => {
                    return Err(format!(
                        "a core without a results bucket stored job {job_id}'s result {index}"
                    ));
                }
            }
        }
        let core = self.driver.core.as_ref().expect("checked above");
        match touched {
            Some(id) => super::ledger::Ledger::check_cores(core, id),
            None => core
                .executors()
                .keys()
                .try_for_each(|id| super::ledger::Ledger::check_cores(core, id)),
        }
    }

    pub(super) fn driver_tick(&mut self) -> Result<(), String> {
        let now = self.queue.now();
        self.queue.after(TICK_MS, Event::DriverTick);
        let Some(core) = self.driver.core.as_mut() else {
            return Ok(());
        };
        core.tick(now);
        self.driver_effects(None)
    }

    /// The driver process dies, if it runs: everything it held is gone. Whether it ran.
    pub(super) fn driver_down(&mut self) -> bool {
        if self.driver.core.take().is_none() {
            return false;
        }
        let restart = self.config.faults.restart_ms;
        self.queue.after(restart, Event::DriverUp);
        true
    }

    /// A new driver process starts, and the client submits again what had not ended.
    pub(super) fn driver_up(&mut self) -> Result<(), String> {
        let instance = self.rng.uuid();
        self.driver.core = Some(new_core(instance));
        self.driver.number += 1;
        self.ledger.new_driver();
        self.submit_all();
        Ok(())
    }
}
