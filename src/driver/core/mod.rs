//! The driver's logic as a state machine that does no I/O and never reads the clock.
//!
//! Each request is a method that returns its one answer; what else it causes (listener events,
//! messages to executors' inboxes) is queued as [`Effect`]s that the actor drains with
//! [`Core::take_effects`] and sends. Time comes in as `now` (milliseconds since the epoch), so
//! tests and simulations drive it with any clock they like.

mod abandoned;
mod adoption;
mod allocation;
mod backoff;
mod dependencies;
mod exclusion;
mod gang;
mod gate;
mod jobs;
mod keys;
mod liveness;
mod objects;
mod offers;
mod placement;
mod pools;
mod registry;
mod resources;
mod restore;
mod retention;
mod snapshot;
mod speculation;
mod status;
mod tasks;
mod tenants;
mod timeouts;

use crate::ids::{ExecutorId, InstanceId, JobId, TaskId};
use crate::protocol::{
    ApiReply, ApiRequest, Event, ExecutorMessage, JobState, JournalRecord, ResultsPage,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

pub use adoption::DEFAULT_ADOPT_WAIT;
pub use allocation::{
    AllocationConfig, DEFAULT_BACKLOG_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MIN_EXECUTORS,
};
pub use backoff::validate as validate_retry_backoff;
pub use exclusion::{
    ExclusionConfig, DEFAULT_EXCLUDE_CLUSTER_FAILURES, DEFAULT_EXCLUDE_JOB_FAILURES,
    DEFAULT_EXCLUDE_TASK_FAILURES, DEFAULT_EXCLUDE_TIMEOUT, DEFAULT_UNSCHEDULABLE_TIMEOUT,
};
pub use gate::{StartGate, DEFAULT_MAX_REGISTERED_WAIT};
pub use jobs::{Job, Pin};
pub use keys::MAX_LIMITED_KEYS;
pub use liveness::Liveness;
pub use placement::JobPlacement;
pub use pools::{PoolConfig, Scheduling, SchedulingMode, DEFAULT_POOL};
pub use registry::{ExecutorData, MAX_CORES};
pub use resources::ExecutorResources;
pub use restore::{ReplayError, Restored};
pub use retention::{
    Retention, DEFAULT_MAX_JOB_RESULT_BYTES, DEFAULT_MAX_RESULT_BYTES, DEFAULT_RETAIN_JOBS,
};
pub use snapshot::{SnapshotError, SnapshotIds, SNAPSHOT_TASKS_PER_RECORD};
pub use speculation::{validate as validate_speculation, SPECULATION_INTERVAL};
pub use status::MAX_UPDATES_PER_BATCH;
pub use tenants::Requester;
pub use timeouts::{validate as validate_timeouts, MAX_TIMEOUT_MS};

/// Something the core wants sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Publish on the listener bus.
    Publish(Event),
    /// Tell tenant `tenant` (its account) an event of one of its jobs, beside the
    /// [`Effect::Publish`] of the same event before it (see [`tenants`]).
    PublishToTenant { tenant: String, event: Event },
    /// Send to an executor's inbox.
    Send {
        to: ExecutorId,
        message: ExecutorMessage,
    },
    /// Store in the journal. Nothing the same step answers or publishes may leave before it
    /// is stored: an acknowledged status or an accepted job must survive the driver.
    Journal(JournalRecord),
    /// Store task `index`'s result in the results bucket, before anything the same step
    /// answers or publishes leaves, as a journal record.
    StoreResult {
        job_id: JobId,
        index: u32,
        result: serde_json::Value,
        /// Whether it goes to the pinned stream: a task reads the job's results.
        pinned: bool,
    },
    /// A task now reads job `job_id`'s results: copy those of tasks `indices` from the results
    /// bucket to the pinned results, where the bucket's limits do not reach them. Started
    /// once the writes before it are stored (the results it copies among them); reads of the
    /// job's results wait for it, and nothing else does.
    PinResults { job_id: JobId, indices: Vec<u32> },
    /// Job `job_id`, whose results may be pinned, was forgotten: delete its pinned results,
    /// once the writes before this are stored.
    UnpinResults { job_id: JobId },
    /// Job `job_id` ended `state` for `reason`, and jobs wait on it: once every journal write
    /// before this is stored, hand it back with [`Core::release`], which starts them (or fails
    /// them). A job never starts before the end of the job it runs after is stored.
    Release {
        job_id: JobId,
        state: JobState,
        reason: Option<String>,
    },
}

impl Effect {
    /// Whether this effect is a write to JetStream, which the shell starts at once (what
    /// follows waits for a journal record or a result; a pin's copy or deletion only orders
    /// itself after the writes before it).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Effect::Journal(_)
                | Effect::StoreResult { .. }
                | Effect::PinResults { .. }
                | Effect::UnpinResults { .. }
        )
    }
}

/// Settings of the core.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// The driver's instance id, returned in every `RegisteredExecutor`.
    pub driver_instance: InstanceId,
    /// The epoch of its leadership: 0 without a lease.
    pub epoch: u64,
    /// The term of its leadership: the journal's sequence of its leadership mark, which no
    /// other leader of the cluster shares; 0 without a journal. Every attempt it launches is
    /// named `(task_id, attempt, term)`.
    pub term: u64,
    /// Executors the operator expects (Spark's `numPendingExecutors` starts here).
    pub expect_executors: u64,
    /// The largest reply the core should build, in bytes (pages of results stop short of it).
    pub max_reply_bytes: usize,
    /// Whether to emit [`Effect::Journal`] records (only when something stores them).
    pub journal: bool,
    /// How many finished jobs are kept, and how many bytes of results.
    pub retention: Retention,
    /// Whether results go to the results bucket ([`Effect::StoreResult`]) rather than stay
    /// in memory.
    pub results_bucket: bool,
}

/// The driver's whole state: the executor registry, the jobs and the offer queue.
#[derive(Debug)]
pub struct Core {
    config: CoreConfig,
    executors: BTreeMap<ExecutorId, ExecutorData>,
    total_cores: u64,
    pending_executors: u64,
    jobs: BTreeMap<JobId, Job>,
    /// Jobs that may have tasks waiting, first submitted first.
    queue: VecDeque<JobId>,
    /// Retries waiting out their job's backoff: when each may run again, its job and index.
    retry_waits: BTreeSet<(u64, JobId, u32)>,
    /// Timeouts and deadlines, by when each is due (see [`timeouts`]).
    timers: BTreeSet<(u64, timeouts::Timer)>,
    /// Concurrency keys with limits or with attempts running.
    keys: keys::Keys,
    /// Gangs an attempt of which will run again: their other attempts are stopped at the next
    /// offer round, when the status batch that ended it is in.
    gangs_to_stop: Vec<JobId>,
    /// The pools FAIR scheduling orders jobs by; none under FIFO.
    pools: Option<Box<pools::Pools>>,
    /// First task id of each job, to find a task's job by range.
    first_tasks: BTreeMap<TaskId, JobId>,
    /// The job each kept job's submission id made.
    submissions: HashMap<String, JobId>,
    /// Finished jobs still kept, oldest end first; the oldest are forgotten past
    /// [`Retention::jobs`].
    ended: VecDeque<JobId>,
    /// Finished jobs past the limit that wait for their killed attempts to report.
    forgetting: Vec<JobId>,
    /// How many open jobs run after each job: while any does, the job and its results are
    /// kept (a dependent's tasks read them when they run, and again when they run again).
    readers: HashMap<JobId, u32>,
    /// Finished jobs past the limit kept only for the open jobs that run after them.
    held: Vec<JobId>,
    /// The jobs waiting on each job: looked at when it ends.
    dependents: HashMap<JobId, Vec<JobId>>,
    /// Jobs ended whose dependents are still to be looked at, and whether that is under way.
    to_release: Vec<(JobId, JobState, Option<String>)>,
    releasing: bool,
    /// Ended jobs handed to the shell in an [`Effect::Release`] and not yet back: what waits
    /// on them still waits.
    unreleased: HashSet<JobId>,
    /// Whether a job started since the last offer round that offered every executor.
    offer_all: bool,
    /// Bytes of results held, all jobs together.
    result_bytes: u64,
    next_job: JobId,
    next_task: TaskId,
    liveness: Liveness,
    /// A snapshot being replayed, until its last part.
    staging: Option<Box<snapshot::Staging>>,
    /// Since when no executor has been registered while jobs wait.
    no_executors_since: Option<u64>,
    /// Offer rounds made while tasks waited, for the metrics.
    offer_rounds: u64,
    /// The dynamic allocation signal, when on.
    allocation: Option<allocation::Allocation>,
    /// The start gate, when set.
    gate: Option<crate::protocol::StartGateStatus>,
    /// Exclusion on failure, when on.
    exclusion: Option<Box<exclusion::Exclusion>>,
    /// Running jobs with speculative execution on.
    speculating: Vec<JobId>,
    /// Offers are held until then, for adoption (see `Liveness::adopt_wait_ms`).
    adopting_until: Option<u64>,
    effects: Vec<Effect>,
}

impl Core {
    pub fn new(config: CoreConfig) -> Self {
        Self {
            pending_executors: config.expect_executors,
            config,
            executors: BTreeMap::new(),
            total_cores: 0,
            jobs: BTreeMap::new(),
            queue: VecDeque::new(),
            retry_waits: BTreeSet::new(),
            timers: BTreeSet::new(),
            keys: keys::Keys::default(),
            gangs_to_stop: Vec::new(),
            pools: None,
            first_tasks: BTreeMap::new(),
            submissions: HashMap::new(),
            ended: VecDeque::new(),
            forgetting: Vec::new(),
            readers: HashMap::new(),
            held: Vec::new(),
            dependents: HashMap::new(),
            to_release: Vec::new(),
            releasing: false,
            unreleased: HashSet::new(),
            offer_all: false,
            result_bytes: 0,
            next_job: 1,
            next_task: 1,
            liveness: Liveness::default(),
            staging: None,
            no_executors_since: None,
            offer_rounds: 0,
            allocation: None,
            gate: None,
            exclusion: None,
            speculating: Vec::new(),
            adopting_until: None,
            effects: Vec::new(),
        }
    }

    /// How many offer rounds the core has made while tasks waited.
    pub fn offer_rounds(&self) -> u64 {
        self.offer_rounds
    }

    /// The instance id this driver gives executors.
    pub fn driver_instance(&self) -> InstanceId {
        self.config.driver_instance
    }

    /// Everything the core has asked to send since the last call, in order.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// Answers one request on the driver api, and says where the answer's data comes from:
    /// a page of results held in the results bucket is read there first.
    pub fn answer(&mut self, request: ApiRequest, now: u64) -> Answer {
        let reply = self.api(request, now);
        if !self.config.results_bucket {
            return Answer::Reply(reply);
        }
        match reply {
            ApiReply::Results(page) => {
                let indices = self.results_in_bucket(&page);
                if indices.is_empty() {
                    Answer::Reply(ApiReply::Results(page))
                } else {
                    let pinned = self
                        .jobs
                        .get(&page.job_id)
                        .is_some_and(|job| job.pin == Pin::Pinned);
                    Answer::Results(BucketRead {
                        page,
                        indices,
                        pinned,
                    })
                }
            }
            reply => Answer::Reply(reply),
        }
    }

    /// Answers one request on the driver api, as it stands in the core (see [`Core::answer`]
    /// for where its data comes from).
    pub fn api(&mut self, request: ApiRequest, now: u64) -> ApiReply {
        match request {
            ApiRequest::ListExecutors { offset, limit } => {
                ApiReply::Executors(self.executors_page(offset, limit))
            }
            ApiRequest::SubmitJob(job) => self.on_submit_job(job, now),
            ApiRequest::KillJob { job_id } => self.on_kill_job(job_id, now),
            ApiRequest::KillJobTask {
                job_id,
                index,
                retry,
            } => self.on_kill_task(job_id, index, retry, now),
            ApiRequest::ListJobs {
                offset,
                limit,
                from_job,
            } => self.jobs_page(from_job, offset, limit, None, now),
            ApiRequest::ListPools => self.pools_reply(),
            ApiRequest::GetJob { job_id } => match self.jobs.get(&job_id) {
                Some(job) => ApiReply::Job {
                    job: self.job_summary(job, now),
                },
                None => self.no_such_job(job_id),
            },
            ApiRequest::GetResults {
                job_id,
                offset,
                limit,
            } => match self.jobs.get(&job_id) {
                Some(job) if job.results_dropped => self.results_dropped(job_id),
                Some(job) => {
                    ApiReply::Results(job.results_page(offset, limit, self.config.max_reply_bytes))
                }
                None => self.no_such_job(job_id),
            },
            ApiRequest::StopExecutor { executor_id } => self.on_stop_executors(Some(executor_id)),
            ApiRequest::StopAllExecutors => self.on_stop_executors(None),
            ApiRequest::ReleaseExecutor { executor_id } => self.on_release_executor(executor_id),
            ApiRequest::ObjectUses { objects } => self.object_uses_of(&objects),
            ApiRequest::DeleteObject { object } => self.refuse_delete(&object),
            ApiRequest::SetKeyLimits { key, limits } => self.on_set_key_limits(key, limits, now),
            ApiRequest::ListKeys => self.keys_reply(now),
        }
    }

    /// What the metrics' gauges show of the core now: one pass over the executors and the jobs
    /// held.
    pub fn gauges(&self) -> Gauges {
        let mut g = Gauges {
            executors: self.executors.len() as u64,
            total_cores: self.total_cores,
            executors_target: self.allocation().map_or(0, |a| a.target_executors),
            ..Default::default()
        };
        for data in self.executors.values() {
            g.free_cores += u64::from(data.free_cores);
            g.tasks_running += data.running.len() as u64;
        }
        for job in self.jobs.values() {
            let count = match job.state {
                JobState::Waiting => &mut g.jobs_waiting,
                JobState::Running => &mut g.jobs_running,
                JobState::Succeeded => &mut g.jobs_succeeded,
                JobState::Failed => &mut g.jobs_failed,
                JobState::Killed => &mut g.jobs_killed,
            };
            *count += 1;
            if job.is_active() {
                g.tasks_waiting += u64::from(job.tasks.waiting());
            }
        }
        g
    }

    /// The periodic tick: removes silent executors, fails jobs that have had no executor for
    /// too long, and offers free cores even if nothing else prompted it (Spark's revive).
    pub fn tick(&mut self, now: u64) {
        self.expire(now);
        self.exclusion_tick(now);
        self.wake_retries(now);
        self.fire_timers(now);
        self.make_offers(None, now);
        self.speculate(now);
    }

    /// Publishes `event`, and tells it to the tenant whose job it is about, if a tenant's.
    fn publish(&mut self, event: Event) {
        let tenant = event
            .job_id()
            .and_then(|id| self.jobs.get(&id))
            .and_then(|job| job.tenant.clone());
        if let Some(tenant) = tenant {
            self.effects.push(Effect::Publish(event.clone()));
            self.effects.push(Effect::PublishToTenant { tenant, event });
        } else {
            self.effects.push(Effect::Publish(event));
        }
    }

    fn journal(&mut self, record: impl FnOnce() -> JournalRecord) {
        if self.config.journal {
            self.effects.push(Effect::Journal(record()));
        }
    }
}

/// Up to `limit` items (all, if none) that encode to about `max_bytes` in all, always at least
/// one if `limit` allows; with the offset where the next page would start.
fn page<T: serde::Serialize>(
    items: impl Iterator<Item = T>,
    offset: u32,
    limit: Option<u32>,
    max_bytes: usize,
) -> (Vec<T>, Option<u32>) {
    let limit = limit.unwrap_or(u32::MAX) as usize;
    let mut taken = Vec::new();
    let mut bytes = 512;
    let mut more = false;
    for item in items {
        if taken.len() >= limit {
            more = true;
            break;
        }
        bytes += serde_json::to_vec(&item).map_or(0, |v| v.len()) + 1;
        if bytes > max_bytes && !taken.is_empty() {
            more = true;
            break;
        }
        taken.push(item);
    }
    let next = more.then(|| offset + taken.len() as u32);
    (taken, next)
}

/// An api answer, and where its data comes from. Moved once per request, straight to the
/// shell: a box for the reply would cost an allocation per request to save a copy.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Answer {
    /// Sent as it is.
    Reply(ApiReply),
    /// A page of results to fill from the results bucket before it is sent.
    Results(BucketRead),
}

/// A page of results, and the results of tasks `indices` to read from the results bucket into
/// it, from the pinned stream first if `pinned`.
#[derive(Debug)]
pub struct BucketRead {
    pub page: ResultsPage,
    pub indices: Vec<u32>,
    pub pinned: bool,
}

/// What the core counts of itself: the metrics' gauges (`ember_*` in `--metrics-addr`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    pub executors: u64,
    pub total_cores: u64,
    pub free_cores: u64,
    pub tasks_waiting: u64,
    pub tasks_running: u64,
    pub jobs_waiting: u64,
    pub jobs_running: u64,
    pub jobs_succeeded: u64,
    pub jobs_failed: u64,
    pub jobs_killed: u64,
    pub executors_target: u64,
}

#[cfg(test)]
mod tests;
