//! Every message on the wire: one serde enum per subject family, tagged by `"type"` with Spark's
//! names, and the size-checked codec that every receiver decodes with. Each party's messages
//! have a file of their own (`api.rs` for clients, `executors.rs` for executors, `event.rs` for
//! listeners, `journal.rs` for the journal), all re-exported here; this file holds what they
//! share: task and job states, task specs and `SubmitJob`, the codec and the limits.
//!
//! docs/protocol.md describes the same messages for implementers in other languages; the golden
//! tests in tests/protocol_golden.rs hold the two together.

mod api;
mod batch;
mod compact;
mod cursor;
mod event;
mod executors;
#[cfg(test)]
mod fast_tests;
mod groups;
mod journal;
mod launch_tasks;
mod policy;
mod status_ack;
mod status_updates;

pub use api::*;
pub use batch::{fit, Batch};
pub use event::{Event, ExclusionScope, ExecutorInfo, ExecutorTasks, TaskEnded, TaskStarted};
pub use executors::*;
pub use journal::{JournalRecord, JournaledTask};
pub use policy::{
    JobTimeouts, KeyLimits, Rate, RetryBackoff, WaitReason, MAX_KEY_LEN, MAX_KEY_LIMIT,
    MAX_RATE_WINDOW_MS,
};
pub use status_updates::StatusBatch;

use crate::ids::JobId;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The most cores one executor may declare.
pub const MAX_CORES: u32 = 1 << 16;
/// The most updates one status batch may carry (and the most attempts a registration may say
/// it holds).
pub const MAX_UPDATES_PER_BATCH: usize = 100_000;

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

pub(crate) fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero_id(n: &JobId) -> bool {
    *n == 0
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
