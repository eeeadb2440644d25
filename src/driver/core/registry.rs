//! The executor registry: Spark's `executorDataMap` and its totals, and the registration
//! handshake of `DriverEndpoint.receiveAndReply(RegisterExecutor)`.

use super::{Core, Effect};
use crate::ids::{host_of, validate_host_port, ExecutorId, InstanceId, TaskId};
use crate::protocol::{
    Event, ExecutorInfo, ExecutorSummary, ExecutorsSnapshot, RegisterExecutor, RegisterReply,
};
use std::collections::{BTreeMap, HashMap};

pub use crate::protocol::MAX_CORES;
/// The most entries in `log_urls` or `attributes`, and the longest key or value.
pub const MAX_MAP_ENTRIES: usize = 64;
pub const MAX_MAP_TEXT: usize = 1024;

/// What the driver knows of one registered executor (Spark's `ExecutorData`).
#[derive(Debug, Clone)]
pub struct ExecutorData {
    pub instance_id: InstanceId,
    pub info: ExecutorInfo,
    pub free_cores: u32,
    pub registered_at_ms: u64,
    pub last_seen_ms: u64,
    /// The attempts running there: task id -> attempt.
    pub running: HashMap<TaskId, u32, crate::IdHasher>,
    /// Draining: it gets no new tasks.
    pub decommissioning: bool,
    /// When it last became idle: its registration, or the end of its last running task.
    pub idle_since_ms: u64,
    /// Its custom resources, and which attempts hold which.
    pub resources: super::ExecutorResources,
    /// What this driver adopted of what it held when it registered, to answer a repeat of
    /// the registration as the first.
    pub adopted: Vec<crate::protocol::Adopted>,
    /// What it has done with the cluster's objects, as its last heartbeat said.
    pub objects: crate::protocol::ObjectCounts,
    /// The NATS connection it last said it speaks through (see [`Core::connection_closed`]).
    pub connection: Option<crate::protocol::ConnectionId>,
    /// Handlers it gave up on that still hold cores, as its heartbeats list them; the cores
    /// of those `counted` are out of `free_cores` (`abandoned.rs`).
    pub abandoned: Vec<super::abandoned::Abandoned>,
}

impl ExecutorData {
    /// Takes back what an ended attempt of `task_id` held: its `cpus` cores and, if its job
    /// asks for any (`resources`), its custom resources.
    /// An attempt the executor has abandoned keeps its cores busy.
    pub fn attempt_ended(&mut self, task_id: TaskId, cpus: u32, resources: bool, now: u64) {
        if self.abandoned.is_empty() || !self.abandoned_took(task_id, cpus) {
            self.free_cores += cpus;
        }
        self.running.remove(&task_id);
        if resources {
            self.resources.give_back(task_id);
        }
        if self.running.is_empty() {
            self.idle_since_ms = now;
        }
    }
}

impl Core {
    /// Handles `RegisterExecutor` that arrived on the subject of `subject_id`.
    pub fn register(&mut self, subject_id: &str, req: RegisterExecutor, now: u64) -> RegisterReply {
        if let Err(message) = validate_registration(subject_id, &req) {
            return RegisterReply::RegisterExecutorFailed { message };
        }
        if let Some(existing) = self.executors.get_mut(&req.executor_id) {
            if existing.instance_id != req.instance_id {
                return RegisterReply::RegisterExecutorFailed {
                    message: format!("Duplicate executor ID: {}", req.executor_id),
                };
            }
            // The same process asking again: its first answer was lost.
            existing.last_seen_ms = now;
            existing.connection = req.connection;
            return self.registered(req.executor_id);
        }
        self.add_executor(req, now)
    }

    fn add_executor(&mut self, req: RegisterExecutor, now: u64) -> RegisterReply {
        let id = req.executor_id;
        let held = req.held;
        let host = host_of(&req.host_port).to_string();
        let info = ExecutorInfo {
            host,
            host_port: req.host_port,
            total_cores: req.cores,
            log_urls: req.log_urls,
            attributes: req.attributes,
            resources: req.resources,
        };
        self.total_cores += u64::from(req.cores);
        self.no_executors_since = None;
        self.pending_executors = self.pending_executors.saturating_sub(1);
        self.executors.insert(
            id.clone(),
            ExecutorData {
                instance_id: req.instance_id,
                info: info.clone(),
                free_cores: req.cores,
                registered_at_ms: now,
                last_seen_ms: now,
                running: HashMap::default(),
                decommissioning: false,
                idle_since_ms: now,
                resources: super::ExecutorResources::new(&info.resources),
                adopted: Vec::new(),
                objects: Default::default(),
                connection: req.connection,
                abandoned: Vec::new(),
            },
        );
        self.publish(Event::ExecutorAdded {
            time_ms: now,
            executor_id: id.clone(),
            info,
        });
        self.placement_executor_added(&id);
        let adopted = self.adopt_held(&id, &held, now);
        if let Some(data) = self.executors.get_mut(&id) {
            data.adopted = adopted;
        }
        let reply = self.registered(id);
        self.make_offers(None, now);
        reply
    }

    fn registered(&self, executor_id: ExecutorId) -> RegisterReply {
        let adopted = self
            .executors
            .get(&executor_id)
            .map(|data| data.adopted.clone())
            .unwrap_or_default();
        RegisterReply::RegisteredExecutor {
            executor_id,
            driver_instance: self.config.driver_instance,
            term: self.config.term,
            adopted,
        }
    }

    /// The whole registry and its totals.
    pub fn executors_snapshot(&self) -> ExecutorsSnapshot {
        self.executors_page(0, None)
    }

    /// A page of the registry (at most `limit` executors from `offset`, sized to fit in one
    /// reply) and the totals.
    pub fn executors_page(&self, offset: u32, limit: Option<u32>) -> ExecutorsSnapshot {
        let summaries =
            self.executors
                .iter()
                .skip(offset as usize)
                .map(|(id, e)| ExecutorSummary {
                    executor_id: id.clone(),
                    host: e.info.host.clone(),
                    host_port: e.info.host_port.clone(),
                    free_cores: e.free_cores,
                    total_cores: e.info.total_cores,
                    log_urls: e.info.log_urls.clone(),
                    attributes: e.info.attributes.clone(),
                    registered_at_ms: e.registered_at_ms,
                    last_seen_ms: e.last_seen_ms,
                    resources: e.resources.counts(),
                    exclusions: self.exclusions_of(id),
                    objects: e.objects,
                    abandoned: Self::abandoned_of(e),
                });
        let (executors, next) = super::page(summaries, offset, limit, self.config.max_reply_bytes);
        ExecutorsSnapshot {
            executors,
            total_cores: self.total_cores,
            registered_executors: self.executors.len() as u64,
            pending_executors: self.pending_executors,
            next_offset: next.filter(|n| (*n as usize) < self.executors.len()),
            driver: Some(crate::protocol::DriverInfo {
                driver_instance: self.config.driver_instance,
                epoch: self.config.epoch,
            }),
            allocation: self.allocation().cloned(),
            start_gate: self.gate.clone(),
            objects: self
                .executors
                .values()
                .fold(Default::default(), |mut sum, e| {
                    sum += e.objects;
                    sum
                }),
        }
    }

    /// The registered executors, by id.
    pub fn executors(&self) -> &BTreeMap<ExecutorId, ExecutorData> {
        &self.executors
    }

    pub(super) fn send(&mut self, to: ExecutorId, message: crate::protocol::ExecutorMessage) {
        self.effects.push(Effect::Send { to, message });
    }

    /// A `KillTask` that says which driver instance sent it.
    pub(super) fn send_kill(
        &mut self,
        to: ExecutorId,
        task_id: TaskId,
        attempt: u32,
        reason: String,
    ) {
        let driver_instance = Some(self.config.driver_instance);
        let kill = crate::protocol::ExecutorMessage::KillTask {
            task_id,
            attempt,
            reason,
            driver_instance,
        };
        self.send(to, kill);
    }
}

fn validate_registration(subject_id: &str, req: &RegisterExecutor) -> Result<(), String> {
    if subject_id != req.executor_id.as_str() {
        return Err(format!(
            "executor id {:?} in the message does not match {subject_id:?} in the subject",
            req.executor_id.as_str()
        ));
    }
    if req.cores == 0 || req.cores > MAX_CORES {
        return Err(format!(
            "cores must be between 1 and {MAX_CORES}; got {}",
            req.cores
        ));
    }
    validate_host_port(&req.host_port)?;
    if req.held.len() > super::MAX_UPDATES_PER_BATCH {
        return Err(format!(
            "held lists {} attempts; the limit is {}",
            req.held.len(),
            super::MAX_UPDATES_PER_BATCH
        ));
    }
    validate_map("log_urls", &req.log_urls)?;
    validate_map("attributes", &req.attributes)?;
    crate::protocol::ConnectionId::check(&req.connection)?;
    crate::resources::validate_addresses(&req.resources)
}

fn validate_map(what: &str, map: &BTreeMap<String, String>) -> Result<(), String> {
    if map.len() > MAX_MAP_ENTRIES {
        return Err(format!(
            "{what} has {} entries; the limit is {MAX_MAP_ENTRIES}",
            map.len()
        ));
    }
    match map
        .iter()
        .find(|(k, v)| k.is_empty() || k.len() > MAX_MAP_TEXT || v.len() > MAX_MAP_TEXT)
    {
        Some((k, _)) => Err(format!(
            "{what} entry {:?} has an empty or over-long key or value (limit {MAX_MAP_TEXT} bytes)",
            k.chars().take(40).collect::<String>()
        )),
        None => Ok(()),
    }
}
