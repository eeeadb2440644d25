//! The client's requests on `<p>.driver.api` and the driver's answers: the registry, jobs and
//! their summaries, pools, results, concurrency keys and objects as the driver reports them.

use super::{
    is_false, is_zero, is_zero_id, is_zero_priority, AbandonedStatus, ExclusionScope, JobState,
    KeyLimits, ResultObject, SpeculativeCounts, SubmitJob, TaskState, WaitReason,
};
use crate::ids::{ExecutorId, InstanceId, JobId, TaskId};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

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
    /// Objects it took from its host's shared directory instead of fetching, and their bytes.
    #[serde(skip_serializing_if = "is_zero")]
    pub host_takes: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub host_taken_bytes: u64,
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
            (&mut self.host_takes, other.host_takes),
            (&mut self.host_taken_bytes, other.host_taken_bytes),
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
