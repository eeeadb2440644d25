//! What passes between the driver and its executors: registration, launches and kills, status
//! batches and their acknowledgements, heartbeats.

use super::{
    groups, is_zero, launch_tasks, status_ack, ObjectCounts, TaskSpec, TaskState, MAX_CORES,
};
use crate::ids::{ExecutorId, InstanceId, JobId, TaskId};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// What an executor sends on `<p>.driver.register.<id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum RegisterRequest {
    RegisterExecutor(RegisterExecutor),
}

/// Spark's `RegisterExecutor(executorId, hostPort, cores, logUrls)`, plus the instance that sends
/// it and free-form attributes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterExecutor {
    pub executor_id: ExecutorId,
    pub instance_id: InstanceId,
    pub host_port: String,
    pub cores: u32,
    #[serde(default)]
    pub log_urls: BTreeMap<String, String>,
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
    /// Custom resources beside cores, each with its addresses (`{"gpu": ["0", "1"]}`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: crate::resources::Addresses,
    /// The attempts it holds of the driver it was registered with before (running, or ended
    /// with a status that driver did not acknowledge), each with that driver's term: a new
    /// leader adopts what it can of them rather than run their tasks again. Empty at a first
    /// registration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<RunningAttempt>,
    /// The NATS connection it registers through, if it knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<ConnectionId>,
}

/// Which NATS connection a process speaks through: the id of the server it is connected to
/// (`server_id` in the server's INFO, new each time a server starts) and the client id that
/// server gave the connection. The driver matches it with the servers' disconnect advisories,
/// to learn at once that an executor's connection closed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConnectionId {
    pub server_id: String,
    pub client_id: u64,
}

/// The longest server id a [`ConnectionId`] may name (a server's id is 56 characters).
pub const MAX_SERVER_ID_LEN: usize = 128;

impl ConnectionId {
    /// Why `connection` cannot be one, if it cannot.
    pub fn check(connection: &Option<ConnectionId>) -> Result<(), String> {
        match connection {
            Some(c) if c.server_id.is_empty() || c.server_id.len() > MAX_SERVER_ID_LEN => {
                Err(format!(
                    "connection.server_id must be 1 to {MAX_SERVER_ID_LEN} bytes; it is {}",
                    c.server_id.len()
                ))
            }
            _ => Ok(()),
        }
    }
}

/// The driver's answer to a registration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum RegisterReply {
    RegisteredExecutor {
        executor_id: ExecutorId,
        /// Made once per driver process: an executor that sees it change knows a new driver
        /// took over.
        driver_instance: InstanceId,
        /// The term of this driver's leadership, part of the identity of every attempt it
        /// launches: the journal's sequence of its leadership mark, 0 without a journal.
        #[serde(default, skip_serializing_if = "is_zero")]
        term: u64,
        /// What this driver adopted of the attempts the registration said it held: each runs
        /// on under the attempt number it has in this driver's term. The executor stops and
        /// forgets the other held attempts, and their statuses.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        adopted: Vec<Adopted>,
    },
    RegisterExecutorFailed {
        message: String,
    },
}

/// What the driver sends to `<p>.executor.<id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ExecutorMessage {
    /// One offer round's tasks for this executor, from the driver instance that launched
    /// them: an executor registered with another instance ignores them (task ids start again
    /// in a new driver, so they would be another driver's tasks).
    #[serde(serialize_with = "launch_tasks::write")]
    LaunchTasks {
        #[serde(deserialize_with = "groups::deserialize")]
        tasks: Vec<TaskDescription>,
        #[serde(default)]
        driver_instance: Option<InstanceId>,
    },
    /// Stops one attempt. Like a launch, it names the driver instance that sent it: an
    /// executor registered with another instance ignores it (the task id would name another
    /// driver's task there).
    KillTask {
        task_id: TaskId,
        attempt: u32,
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        driver_instance: Option<InstanceId>,
    },
    /// Decommission: finish or hand back the running tasks, then exit.
    StopExecutor { reason: String },
    /// A driver started to lead, told to every executor at once on `<p>.executors`: one
    /// registered with another driver instance registers again now, rather than once a
    /// request to the old one has gone unanswered.
    Leading { driver_instance: InstanceId },
}

/// Spark's `TaskDescription`: one attempt of one task. On the wire a list of them travels as
/// groups of tasks that share job, cores and spec (docs/protocol.md, `LaunchTasks`); the tasks
/// decoded from one group share its `Arc<TaskSpec>`.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskDescription {
    pub task_id: TaskId,
    pub job_id: JobId,
    pub index: u32,
    pub attempt: u32,
    pub cpus: u32,
    pub spec: std::sync::Arc<TaskSpec>,
    /// The addresses of the custom resources this attempt holds; empty for most tasks.
    pub resources: crate::resources::Addresses,
    /// A gang task's peers: `host:port` of each task of its gang started with it, in task
    /// order, its own among them (its port is its `gang_port` resource). Empty for other tasks.
    pub gang_peers: Vec<String>,
}

/// What an executor sends on `<p>.driver.status.<id>`: every status it has pending. Written by
/// [`StatusBatch`] (`status_updates.rs`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type")]
pub enum StatusRequest {
    StatusUpdates {
        executor_id: ExecutorId,
        updates: Vec<StatusUpdate>,
        /// The driver instance the executor is registered with: a driver refuses a batch meant
        /// for another instance (a late or repeated one from before it started), whose task
        /// ids would name its own, different tasks.
        #[serde(default)]
        driver_instance: Option<InstanceId>,
    },
}

/// Spark's `StatusUpdate(executorId, taskId, state, data)`. On the wire a plain finish (no
/// result, no error) is `[task_id, attempt]`, anything else an object (`compact.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct StatusUpdate {
    pub task_id: TaskId,
    pub attempt: u32,
    pub state: TaskState,
    pub result: Option<Value>,
    pub error: Option<String>,
    /// Instead of `result`: the result was too large for one message, and the executor put
    /// its JSON text in the object store.
    pub result_object: Option<ResultObject>,
    /// A failure that running again cannot mend (a python exception the job's `retry_on` /
    /// `no_retry_on` say is final): the task fails for good, whatever attempts it has left.
    pub no_retry: bool,
}

/// A result stored in the object store, because it would not fit in one message: the object
/// holds the result's JSON text, `bytes` of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultObject {
    pub object: crate::objects::ObjectRef,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum StatusReply {
    /// The batch was handled; the executor may forget it. `refused` lists the updates that
    /// changed nothing, and why. `launch` carries the tasks the driver offered this executor's
    /// freed cores in answer, as a `LaunchTasks` would: one message per round trip instead of
    /// two.
    #[serde(serialize_with = "status_ack::write")]
    StatusAck {
        accepted: u32,
        refused: Vec<RefusedStatus>,
        #[serde(default, deserialize_with = "groups::deserialize")]
        launch: Vec<TaskDescription>,
    },
    /// The driver does not know this executor: register again, then resend the batch.
    UnknownExecutor {
        message: String,
    },
    Error {
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefusedStatus {
    pub task_id: TaskId,
    pub attempt: u32,
    pub reason: String,
}

/// What an executor sends on `<p>.driver.heartbeat.<id>`: that it lives, what it runs, and
/// when it leaves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum HeartbeatRequest {
    /// Every heartbeat interval. `running` lists the attempts the executor runs or has ended
    /// without an acknowledged status, so the driver can reconcile its view with it.
    Heartbeat {
        executor_id: ExecutorId,
        instance_id: InstanceId,
        running: Vec<RunningAttempt>,
        /// The driver instance this executor registered with: a driver that is not that one
        /// answers `reregister` (it registered the executor from a request whose answer never
        /// arrived, after the executor had registered with a driver before it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        driver_instance: Option<InstanceId>,
        /// What it has done with the cluster's objects since it started.
        #[serde(default, skip_serializing_if = "is_zero")]
        objects: ObjectCounts,
        /// The NATS connection it speaks through now, if it knows it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        connection: Option<ConnectionId>,
        /// Attempts it has given up on whose work still holds cores: a handler that did not
        /// return within the grace of being asked to stop. Their ends went as KILLED, but the
        /// driver may not offer these cores until a heartbeat no longer lists them. Absent
        /// when none; at most [`MAX_ABANDONED`].
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        abandoned: Vec<AbandonedAttempt>,
    },
    /// The executor is draining: it takes no new tasks (Spark's `DecommissionExecutor`).
    DecommissionExecutor {
        executor_id: ExecutorId,
        instance_id: InstanceId,
    },
    /// The executor has drained and is exiting; the driver removes it.
    ExecutorExiting {
        executor_id: ExecutorId,
        instance_id: InstanceId,
    },
}

/// The most abandoned attempts one heartbeat may list: each holds at least a core, so no
/// executor has more than [`MAX_CORES`].
pub const MAX_ABANDONED: usize = MAX_CORES as usize;

/// An attempt whose end an executor has reported (KILLED) while its work still runs and holds
/// `cpus` cores: a handler that ignored its stop token past the grace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbandonedAttempt {
    pub task_id: TaskId,
    pub attempt: u32,
    pub cpus: u32,
}

/// An abandoned attempt as `ListExecutors` shows it: what it holds, and since when the driver
/// has known it abandoned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbandonedStatus {
    pub task_id: TaskId,
    pub attempt: u32,
    pub cpus: u32,
    pub since_ms: u64,
}

/// One attempt an executor holds. `(task_id, attempt, term)` names one run and no other: the
/// term is that of the driver that launched it (or adopted it), 0 without a journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunningAttempt {
    pub task_id: TaskId,
    pub attempt: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub term: u64,
    /// Whether the attempt has ended (its end not yet acknowledged) rather than still runs:
    /// a new leader adopts running attempts first, as far as the executor's cores go.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ended: bool,
}

/// An attempt of an earlier term that a new leader adopted, in `RegisteredExecutor`: the run
/// `(task_id, attempt, term)` goes on as attempt `new_attempt` of the new leader's term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adopted {
    pub task_id: TaskId,
    pub attempt: u32,
    pub term: u64,
    pub new_attempt: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum HeartbeatReply {
    /// `reregister`: the driver does not know this executor (a new driver, or it was removed
    /// as lost): register again, with the same id.
    HeartbeatResponse {
        reregister: bool,
    },
    Error {
        message: String,
    },
}
