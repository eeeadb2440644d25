//! Every message on the wire: one serde enum per subject family, tagged by `"type"` with Spark's
//! names, and the size-checked codec that every receiver decodes with.
//!
//! docs/protocol.md describes the same messages for implementers in other languages; the golden
//! tests in tests/protocol_golden.rs hold the two together.

mod batch;
mod compact;
mod cursor;
mod event;
#[cfg(test)]
mod fast_tests;
mod groups;
mod journal;
mod launch_tasks;
mod policy;
mod status_ack;
mod status_updates;

pub use batch::{fit, Batch};
pub use event::{Event, ExclusionScope, ExecutorInfo, ExecutorTasks, TaskEnded, TaskStarted};
pub use journal::{JournalRecord, JournaledTask};
pub use policy::{
    JobTimeouts, KeyLimits, Rate, RetryBackoff, WaitReason, MAX_KEY_LEN, MAX_KEY_LIMIT,
    MAX_RATE_WINDOW_MS,
};
pub use status_updates::StatusBatch;

use crate::ids::{ExecutorId, InstanceId, JobId, TaskId};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The most cores one executor may declare.
pub const MAX_CORES: u32 = 1 << 16;
/// The most updates one status batch may carry (and the most attempts a registration may say
/// it holds).
pub const MAX_UPDATES_PER_BATCH: usize = 100_000;

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

/// Spark's `TaskState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskState {
    Launching,
    Running,
    Finished,
    Failed,
    Killed,
    Lost,
}

impl std::fmt::Display for TaskState {
    /// The wire name: `LAUNCHING`, `RUNNING`, `FINISHED`, `FAILED`, `KILLED`, `LOST`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TaskState::Launching => "LAUNCHING",
            TaskState::Running => "RUNNING",
            TaskState::Finished => "FINISHED",
            TaskState::Failed => "FAILED",
            TaskState::Killed => "KILLED",
            TaskState::Lost => "LOST",
        })
    }
}

impl TaskState {
    /// Whether the attempt is over and its cores are free again.
    pub fn is_terminal(self) -> bool {
        !matches!(self, TaskState::Launching | TaskState::Running)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    /// Submitted after other jobs (`SubmitJob.after`, `after_any`) that have not all ended:
    /// none of its tasks is offered yet.
    Waiting,
    Running,
    Succeeded,
    Failed,
    Killed,
}

impl JobState {
    /// Whether the job has ended: it runs nothing more and its state stays.
    pub fn is_ended(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Killed
        )
    }
}

impl std::fmt::Display for JobState {
    /// The wire name: `WAITING`, `RUNNING`, `SUCCEEDED`, `FAILED`, `KILLED`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JobState::Waiting => "WAITING",
            JobState::Running => "RUNNING",
            JobState::Succeeded => "SUCCEEDED",
            JobState::Failed => "FAILED",
            JobState::Killed => "KILLED",
        })
    }
}

/// What a task does. Handlers are named functions on the executor (`noop`, `sleep`, `echo`,
/// `fail`, and any an embedding program registers); commands are processes; python tasks are
/// pickled calls that the executor's warm Python workers run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TaskSpec {
    Handler {
        name: String,
        #[serde(default)]
        arg: Value,
    },
    Command {
        argv: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        /// Objects placed in the command's directory before it starts, read-only: a path
        /// inside the directory (relative, no `..`) → the object's reference. A command with
        /// inputs or outputs and no `cwd` runs in a fresh directory of its own.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        inputs: BTreeMap<String, crate::objects::ObjectRef>,
        /// Patterns of paths inside its directory (`*` and `?` within a part): the files they
        /// match when the command ends go into the object store, their references in its
        /// result under `outputs`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        outputs: Vec<String>,
    },
    /// A Python call: `function` is a pickled callable and `args` a pickled `(args, kwargs)`
    /// pair, both in base64 (standard alphabet, padded), or either in an object instead. With
    /// `map`, `args` is instead a pickled list of items, and the task's result is the list of
    /// the function of each.
    Python {
        #[serde(
            default,
            deserialize_with = "pickled_function",
            skip_serializing_if = "String::is_empty"
        )]
        function: String,
        #[serde(
            default,
            deserialize_with = "pickled_args",
            skip_serializing_if = "String::is_empty"
        )]
        args: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        map: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        /// Instead of `function`: the object that holds its pickle (what a client sends for a
        /// large one).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        function_object: Option<crate::objects::ObjectRef>,
        /// Instead of `args`: the object that holds their pickle.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        args_object: Option<crate::objects::ObjectRef>,
        /// The objects the pickles refer to (as pickle persistent ids), each holding a pickled
        /// value: the executor fetches them before the call, and the worker loads each once.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        objects: Vec<crate::objects::ObjectRef>,
        /// Jobs whose results the pickles refer to (as persistent ids, `("ember-result",
        /// <job id>, <shape>)`): the executor reads their results before the call, and the
        /// worker gives the task their values. Each must be a job this one runs `after`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        upstream: Vec<JobId>,
        /// Exceptions, by qualified class name (`module.Class`, `builtins.ValueError`), whose
        /// failures run again; a failure by any other does not. Empty: every failure may.
        /// A subclass matches its base.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        retry_on: Vec<String>,
        /// Exceptions, named the same way, whose failures do not run again, whatever
        /// `retry_on` says.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        no_retry_on: Vec<String>,
    },
}

impl TaskSpec {
    /// The objects the task names: what its executor fetches before it starts, and what a
    /// job that holds it keeps in the store.
    pub fn objects(&self) -> impl Iterator<Item = &crate::objects::ObjectRef> {
        let (inputs, python) = match self {
            TaskSpec::Command { inputs, .. } => (Some(inputs.values()), None),
            TaskSpec::Python {
                function_object,
                args_object,
                objects,
                ..
            } => {
                let pickles = function_object.iter().chain(args_object.iter());
                (None, Some(pickles.chain(objects.iter())))
            }
            TaskSpec::Handler { .. } => (None, None),
        };
        inputs
            .into_iter()
            .flatten()
            .chain(python.into_iter().flatten())
    }
}

fn pickled_function<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    base64_field("function", String::deserialize(deserializer)?)
}

fn pickled_args<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    base64_field("args", String::deserialize(deserializer)?)
}

/// A python task's pickled field: not empty, and base64 in the standard alphabet with padding
/// (checked by its shape, not decoded, so a launch costs no copy of it).
fn base64_field<E: serde::de::Error>(field: &str, value: String) -> Result<String, E> {
    let bytes = value.as_bytes();
    let body = bytes
        .strip_suffix(b"==")
        .or_else(|| bytes.strip_suffix(b"="))
        .unwrap_or(bytes);
    let alphabet = |b: &u8| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/';
    if bytes.is_empty() || bytes.len() % 4 != 0 || !body.iter().all(alphabet) {
        return Err(E::custom(format!(
            "a python task's `{field}` must be a pickle in base64 (standard alphabet, padded)"
        )));
    }
    Ok(value)
}

/// A job: its tasks are `tasks` repeated `repeat` times, so a million identical tasks cost one
/// spec on the wire; each task sees its own index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitJob {
    #[serde(default)]
    pub name: String,
    pub tasks: Vec<TaskSpec>,
    #[serde(default = "one")]
    pub repeat: u32,
    #[serde(default = "default_max_failures")]
    pub max_failures: u32,
    #[serde(default = "one")]
    pub cpus_per_task: u32,
    /// Custom resources each task needs beside its cores (`{"gpu": 1}`); none if empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: crate::resources::Request,
    /// Where tasks may run and would rather run: `constraints`, `prefer_executors`,
    /// `prefer_hosts` and `locality_wait_ms`, each optional.
    #[serde(flatten)]
    pub placement: crate::placement::Placement,
    /// The pool the job runs in under `--scheduling fair` (1 to 64 letters, digits, `_`, `-`
    /// or `.`); none: the pool named `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Higher runs first among the jobs `fifo` orders (-1000 to 1000); ties go to the older job.
    #[serde(default, skip_serializing_if = "is_zero_priority")]
    pub priority: i32,
    /// Speculative execution (Spark's `spark.speculation`): off unless present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<Speculation>,
    /// How failed tasks wait before they run again; absent, they run again at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_backoff: Option<RetryBackoff>,
    /// How long a task may wait to start, an attempt run, and the job last; none by default.
    #[serde(flatten)]
    pub timeouts: JobTimeouts,
    /// The concurrency key the job's tasks count under (1 to 64 letters, digits, `_`, `-` or
    /// `.`): the running attempts of all jobs that name a key stay within the limits set for
    /// it (`SetKeyLimits`); a key with none runs unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// A gang (Spark's barrier mode): all the job's tasks start together or not at all, and
    /// run again together when one fails.
    #[serde(default, skip_serializing_if = "is_false")]
    pub gang: bool,
    /// A key the client picks (1 to 64 letters, digits, `_`, `-` or `.`) that makes the
    /// submission safe to send again: a second `SubmitJob` with the same key, while the job it
    /// made is kept, is answered with that job's id and submits nothing. `EmberClient` sets
    /// one and sends again through a failover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission_id: Option<String>,
    /// Jobs this one runs after: it waits (`WAITING`) until all have succeeded, and ends
    /// FAILED without running anything if one of them fails or is killed. Each must be a job
    /// the driver keeps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<JobId>,
    /// Jobs this one runs after however they end (clean-up, notification): it waits until all
    /// have ended. Each must be a job the driver keeps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_any: Vec<JobId>,
}

impl SubmitJob {
    /// A job of `tasks`, each run once, with every other field as a submission that leaves it
    /// out gets it: no name, [`crate::DEFAULT_MAX_FAILURES`] attempts, one core per task, no
    /// custom resources, placement, pool, priority, speculation, retry backoff, timeouts,
    /// concurrency key, gang, submission id or jobs to run after. Set the rest with struct
    /// update syntax: `SubmitJob { repeat: 8, ..SubmitJob::new(tasks) }`.
    pub fn new(tasks: Vec<TaskSpec>) -> Self {
        SubmitJob {
            name: String::new(),
            tasks,
            repeat: one(),
            max_failures: default_max_failures(),
            cpus_per_task: one(),
            resources: Default::default(),
            placement: Default::default(),
            pool: None,
            priority: 0,
            speculation: None,
            retry_backoff: None,
            timeouts: Default::default(),
            concurrency_key: None,
            gang: false,
            submission_id: None,
            after: Vec::new(),
            after_any: Vec::new(),
        }
    }
}

fn is_zero_priority(n: &i32) -> bool {
    *n == 0
}

/// When a task of a job gets a speculative copy: once `quantile` of the job's tasks have
/// finished, an attempt that has run longer than `multiplier` times the median finished
/// duration, and at least `min_runtime_ms`, gets one more attempt on another executor. The
/// defaults are Spark's `spark.speculation.{quantile,multiplier,minTaskRuntime}`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Speculation {
    #[serde(default = "default_quantile")]
    pub quantile: f64,
    #[serde(default = "default_multiplier")]
    pub multiplier: f64,
    #[serde(default = "default_min_runtime_ms")]
    pub min_runtime_ms: u64,
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation {
            quantile: default_quantile(),
            multiplier: default_multiplier(),
            min_runtime_ms: default_min_runtime_ms(),
        }
    }
}

fn default_quantile() -> f64 {
    0.75
}

fn default_multiplier() -> f64 {
    1.5
}

fn default_min_runtime_ms() -> u64 {
    100
}

/// What speculative execution did for a job: copies launched, and those that finished first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpeculativeCounts {
    pub launched: u32,
    pub won: u32,
}

fn one() -> u32 {
    1
}

fn default_max_failures() -> u32 {
    crate::DEFAULT_MAX_FAILURES
}

/// Requests on `<p>.driver.api`.
// A request is decoded once and moved into the core once: a `SubmitJob` held inline costs
// nothing a box would save.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ApiRequest {
    /// The registry and its totals, a page at a time (`limit` 0: the totals alone).
    ListExecutors {
        #[serde(default, skip_serializing_if = "is_zero")]
        offset: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    SubmitJob(SubmitJob),
    KillJob {
        job_id: JobId,
    },
    /// Kill task `index` (from 0) of a running job: a waiting task ends KILLED at once, a
    /// running one is told to stop and ends KILLED when it does. Either is not run again,
    /// unless `retry`: then the running attempt is stopped and the task runs again.
    KillJobTask {
        job_id: JobId,
        index: u32,
        #[serde(default, skip_serializing_if = "is_false")]
        retry: bool,
    },
    /// Jobs in submission order, a page at a time: from job id `from_job` on (all, if 0),
    /// skipping `offset` of them.
    ListJobs {
        #[serde(default, skip_serializing_if = "is_zero")]
        offset: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
        #[serde(default, skip_serializing_if = "is_zero_id")]
        from_job: JobId,
    },
    GetJob {
        job_id: JobId,
    },
    /// The driver's scheduling mode and, under FAIR, its pools, in the order offers serve them.
    ListPools,
    /// A page of a job's task outcomes, in index order.
    GetResults {
        job_id: JobId,
        #[serde(default)]
        offset: u32,
        #[serde(default = "default_page")]
        limit: u32,
    },
    /// Decommission one executor.
    StopExecutor {
        executor_id: ExecutorId,
    },
    /// Decommission every executor.
    StopAllExecutors,
    /// Decommission one executor only if it runs no task (dynamic allocation's release of an
    /// idle executor): no task is launched on it once this is answered.
    ReleaseExecutor {
        executor_id: ExecutorId,
    },
    /// Which kept jobs refer to each of `objects` (at most [`MAX_OBJECTS_ASKED`]).
    ObjectUses {
        objects: Vec<crate::objects::ObjectRef>,
    },
    /// Delete `object` from the store now, if no kept job refers to it.
    DeleteObject {
        object: crate::objects::ObjectRef,
    },
    /// Sets the limits of concurrency key `key`, journaled; neither limit given clears them
    /// (the key runs unlimited). Answered with the key as `ListKeys` shows it.
    SetKeyLimits {
        key: String,
        #[serde(flatten)]
        limits: KeyLimits,
    },
    /// Every concurrency key with limits or with an open job that names it.
    ListKeys,
}

/// A concurrency key as `ListKeys` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySummary {
    pub key: String,
    #[serde(flatten)]
    pub limits: KeyLimits,
    /// Attempts of its jobs running now.
    pub running: u32,
    /// Open jobs that name it.
    pub jobs: u32,
    /// Tasks of its jobs started in the rate's current window, if it has a rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_in_window: Option<u32>,
}

/// The most objects one `ObjectUses` may ask about.
pub const MAX_OBJECTS_ASKED: usize = 256;
/// The most job ids an `ObjectUse` lists (`jobs_count` counts them all).
pub const MAX_OBJECT_JOBS_LISTED: usize = 32;

/// Which kept jobs refer to one object: the first [`MAX_OBJECT_JOBS_LISTED`] of them, and how
/// many in all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectUse {
    pub object: crate::objects::ObjectRef,
    pub jobs: Vec<JobId>,
    pub jobs_count: u32,
}

fn default_page() -> u32 {
    1000
}

pub(crate) fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero_id(n: &JobId) -> bool {
    *n == 0
}

impl ApiRequest {
    /// `ListExecutors` for everything that fits in one reply.
    pub fn list_executors() -> Self {
        ApiRequest::ListExecutors {
            offset: 0,
            limit: None,
        }
    }

    /// `ListJobs` for everything that fits in one reply.
    pub fn list_jobs() -> Self {
        ApiRequest::ListJobs {
            offset: 0,
            limit: None,
            from_job: 0,
        }
    }
}

/// Answers on `<p>.driver.api`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ApiReply {
    Executors(ExecutorsSnapshot),
    JobAccepted {
        job_id: JobId,
    },
    JobKilled {
        job_id: JobId,
    },
    /// The answer to `KillJobTask`: `attempt` is the running attempt told to stop; none if
    /// the task was waiting, and has ended KILLED already.
    TaskKilled {
        job_id: JobId,
        index: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempt: Option<u32>,
        #[serde(default, skip_serializing_if = "is_false")]
        retry: bool,
    },
    Jobs {
        jobs: Vec<JobSummary>,
        /// The offset of the next page, if there is one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next_offset: Option<u32>,
        /// The id of the first job of the next page, if there is one: ask for it as
        /// `from_job` (an offset shifts when older jobs are forgotten; an id does not).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next_job: Option<JobId>,
    },
    Job {
        job: JobSummary,
    },
    /// The answer to `ListPools`: `scheduling` is `fifo` or `fair`; `pools` is empty under
    /// `fifo`.
    Pools {
        scheduling: String,
        pools: Vec<PoolSummary>,
    },
    Results(ResultsPage),
    /// How many executors were told to stop.
    Stopping {
        executors: u32,
    },
    /// The answer to `ObjectUses`, one entry per object asked about, in its order.
    ObjectUses {
        uses: Vec<ObjectUse>,
    },
    /// The answer to `ListKeys`, in key order, and to `SetKeyLimits` (the key set).
    Keys {
        keys: Vec<KeySummary>,
    },
    /// The answer to `DeleteObject`: whether the store held it.
    ObjectDeleted {
        object: crate::objects::ObjectRef,
        deleted: bool,
    },
    Error {
        message: String,
    },
    /// No driver could take the request, and nothing was done: send it again later. A
    /// standing-by driver answers this while no driver can lead (the journal's store refuses
    /// the lease's writes).
    Unavailable {
        message: String,
    },
}

/// The registry and its totals, as `ListExecutors` returns them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutorsSnapshot {
    pub executors: Vec<ExecutorSummary>,
    pub total_cores: u64,
    pub registered_executors: u64,
    pub pending_executors: u64,
    /// The offset of the next page of executors, if there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u32>,
    /// The driver that answered: the one that leads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<DriverInfo>,
    /// The dynamic allocation signal, if the driver computes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationStatus>,
    /// The start gate, if the driver has one (`--min-registered`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_gate: Option<StartGateStatus>,
    /// What the registered executors have done with the cluster's objects, summed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub objects: ObjectCounts,
}

/// The start gate: offers wait until `min_registered` executors have registered, or until
/// `opens_by_ms` (see docs/protocol.md, the start gate).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartGateStatus {
    pub min_registered: u64,
    /// When the gate opens however many have registered.
    pub opens_by_ms: u64,
    /// When it opened; none while it holds offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened_at_ms: Option<u64>,
    /// Why it opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How many executors the driver wants, and why (see docs/protocol.md, dynamic allocation).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationStatus {
    /// The executors the driver wants now.
    pub target_executors: u64,
    pub min_executors: u32,
    pub max_executors: u32,
    /// What the tasks waiting and running need, at `cores_per_executor`.
    pub executors_needed: u64,
    pub tasks_waiting: u64,
    pub tasks_running: u64,
    /// The cores of the largest executor seen (1 before any).
    pub cores_per_executor: u32,
    /// Since when tasks have been waiting, if they are.
    pub backlog_since_ms: Option<u64>,
    /// Executors idle for the idle timeout that may be released, longest idle first.
    pub idle: Vec<ExecutorId>,
    /// Why the target last changed.
    pub reason: String,
}

/// Which driver answers, and in which leadership.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriverInfo {
    /// The `driver_instance` executors register with.
    pub driver_instance: InstanceId,
    /// The epoch of its leadership (0 for a driver without a journal, which has no lease).
    pub epoch: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutorSummary {
    pub executor_id: ExecutorId,
    pub host: String,
    pub host_port: String,
    pub free_cores: u32,
    pub total_cores: u32,
    pub log_urls: BTreeMap<String, String>,
    pub attributes: BTreeMap<String, String>,
    pub registered_at_ms: u64,
    /// When the driver last heard from it: a heartbeat, a status batch or a registration.
    #[serde(default)]
    pub last_seen_ms: u64,
    /// Its custom resources: how many addresses of each it has, and how many are free.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, ResourceCount>,
    /// What it is excluded from after failures (`--exclude-on-failure`), the widest first and
    /// at most [`MAX_EXCLUSIONS_SHOWN`]; absent when nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclusions: Vec<ExclusionStatus>,
    /// What it has done with the cluster's objects, as its last heartbeat said.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub objects: ObjectCounts,
    /// Handlers it gave up on that still hold cores (not counted in `free_cores`); absent
    /// when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub abandoned: Vec<AbandonedStatus>,
}

/// What an executor has done with the cluster's objects since it started: counted by the
/// executor, sent in its heartbeats, summed over the registry in `ListExecutors`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ObjectCounts {
    /// Objects fetched from the store into its cache, and their bytes.
    pub fetches: u64,
    pub fetched_bytes: u64,
    /// Tasks' objects found in the cache (or being fetched already), and not found.
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Objects it put (commands' outputs, large results), and the bytes it sent for them
    /// (none for bytes the store held already).
    pub puts: u64,
    pub put_bytes: u64,
}

/// Summing saturates: the counts come from executors, and a wrong or hostile one may send
/// anything up to `u64::MAX`.
impl std::ops::AddAssign for ObjectCounts {
    fn add_assign(&mut self, other: Self) {
        let sums = [
            (&mut self.fetches, other.fetches),
            (&mut self.fetched_bytes, other.fetched_bytes),
            (&mut self.cache_hits, other.cache_hits),
            (&mut self.cache_misses, other.cache_misses),
            (&mut self.puts, other.puts),
            (&mut self.put_bytes, other.put_bytes),
        ];
        for (sum, more) in sums {
            *sum = sum.saturating_add(more);
        }
    }
}

/// How many addresses of one resource an executor has, and how many no task holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceCount {
    pub total: u32,
    pub free: u32,
}

/// The most exclusions one executor's summary lists.
pub const MAX_EXCLUSIONS_SHOWN: usize = 32;

/// One exclusion of an executor, as `ListExecutors` shows it (see docs/protocol.md, exclusion on
/// failure).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExclusionStatus {
    pub scope: ExclusionScope,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<JobId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    pub reason: String,
    pub until_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSummary {
    pub job_id: JobId,
    pub name: String,
    pub state: JobState,
    pub tasks: u32,
    pub succeeded: u32,
    pub failed: u32,
    pub killed: u32,
    pub running: u32,
    pub submitted_at_ms: u64,
    pub ended_at_ms: Option<u64>,
    pub reason: Option<String>,
    /// Why tasks of this job wait, in words: the text of `waits`, joined by `; `; none if
    /// nothing holds it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// Why tasks of this job wait, and until when, each reason apart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<WaitReason>,
    /// The job's placement as submitted, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<crate::placement::Placement>,
    /// The pool the job was submitted to, if it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The job's priority, if not 0.
    #[serde(default, skip_serializing_if = "is_zero_priority")]
    pub priority: i32,
    /// For a job with speculative execution on, what it did so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeCounts>,
    /// For a `WAITING` job, the jobs it still waits for (of its `after` and `after_any`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits_for: Vec<JobId>,
    /// The concurrency key the job names, if it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// The limits of its key now (`{}`: none, the key runs unlimited); absent without a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_limits: Option<KeyLimits>,
}

/// One pool of FAIR scheduling: its settings, and what its jobs run now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolSummary {
    pub name: String,
    pub weight: u32,
    pub min_share: u32,
    /// How it orders its own jobs: `fifo` or `fair`.
    pub mode: String,
    /// Whether `--pool` declared it (else a job named it, and it has the defaults).
    pub declared: bool,
    /// Cores its jobs' running attempts use.
    pub running_cores: u64,
    /// Its running jobs.
    pub jobs: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultsPage {
    pub job_id: JobId,
    pub results: Vec<TaskOutcome>,
    /// The offset of the next page, if there is one.
    pub next_offset: Option<u32>,
}

/// How one task of a job ended (or that it has not yet).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskOutcome {
    pub index: u32,
    pub task_id: TaskId,
    pub state: TaskState,
    pub attempts: u32,
    pub executor_id: Option<ExecutorId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Instead of `result`: a result too large for one message, in the object store (the
    /// object holds its JSON text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_object: Option<ResultObject>,
    /// When the current (or last) attempt started, if this driver launched it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// How long the last attempt ran, once it has ended, if this driver launched it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
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

/// Why a payload could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("message of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    #[error("message is empty")]
    Empty,
    #[error("message is not valid JSON for this subject: {0}")]
    Json(#[from] serde_json::Error),
}

/// A message [`decode`] reads. Serde reads every message; the few that come once per round
/// trip at high task rates also have a reader of their own for the exact form [`encode`]
/// writes, tried first, beside their writer (`status_updates.rs`, `status_ack.rs`,
/// `launch_tasks.rs`).
pub trait Message: DeserializeOwned {
    /// `payload` as this message if it is in the form `encode` writes and a fast reader exists
    /// for it; `None` leaves it to serde, which also gives every refusal its error text.
    fn decode_fast(_payload: &[u8]) -> Option<Self> {
        None
    }
}

/// Messages read by serde alone.
macro_rules! serde_only {
    ($($message:ty),* $(,)?) => { $(impl Message for $message {})* };
}

serde_only!(
    ApiRequest,
    ApiReply,
    Event,
    RegisterRequest,
    RegisterReply,
    HeartbeatRequest,
    HeartbeatReply,
    JournalRecord,
    TaskSpec,
    serde_json::Value,
);

// The parts of messages, which can be read alone too (the protocol's golden tests do).
serde_only!(
    StatusUpdate,
    SubmitJob,
    JobState,
    TaskState,
    TaskStarted,
    TaskEnded,
    TaskOutcome,
    RefusedStatus,
    ExecutorInfo,
    ExecutorSummary,
    JobSummary,
    JournaledTask,
);

/// Decodes a payload no larger than `limit` bytes. Status batches, their answers and launches
/// in the form `encode` writes take a fast path ([`Message::decode_fast`]) that reads what
/// serde would.
pub fn decode<T: Message>(payload: &[u8], limit: usize) -> Result<T, DecodeError> {
    if payload.len() > limit {
        return Err(DecodeError::TooLarge {
            size: payload.len(),
            limit,
        });
    }
    if payload.iter().all(u8::is_ascii_whitespace) {
        return Err(DecodeError::Empty);
    }
    if let Some(message) = T::decode_fast(payload) {
        return Ok(message);
    }
    Ok(serde_json::from_slice(payload)?)
}

/// Encodes a message. Ember's messages have string keys and no fallible `Serialize` impls, so
/// this cannot fail for them.
///
/// The JSON is written into a buffer each thread keeps, then copied out at its final size: a
/// message of many tasks costs one copy, not a string of reallocations as a fresh buffer grows.
pub fn encode<T: Serialize>(message: &T) -> bytes::Bytes {
    /// A buffer that grew past this is let go after use rather than kept.
    const KEEP: usize = 256 * 1024;
    thread_local! {
        static BUFFER: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
    }
    // Taken out while in use: an encoding inside another would find an empty one.
    let mut buffer = BUFFER.take();
    buffer.clear();
    serde_json::to_writer(&mut buffer, message).expect("Ember's messages always serialize to JSON");
    let payload = bytes::Bytes::copy_from_slice(&buffer);
    if buffer.capacity() <= KEEP {
        BUFFER.set(buffer);
    }
    payload
}
