//! The listener bus: the events the driver publishes on `<p>.events.<kind>` for anyone who
//! subscribes, and how a task event too large for one message is cut in two.

use super::{halve, Batch, JobState, TaskState};
use crate::ids::{ExecutorId, JobId, TaskId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What `ExecutorAdded` says about the executor: the fields of Spark's `ExecutorInfo`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutorInfo {
    pub host: String,
    pub host_port: String,
    pub total_cores: u32,
    pub log_urls: BTreeMap<String, String>,
    pub attributes: BTreeMap<String, String>,
}

/// The listener bus, on `<p>.events.<kind>` ([`Event::kind`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    ExecutorAdded {
        time_ms: u64,
        executor_id: ExecutorId,
        info: ExecutorInfo,
    },
    ExecutorRemoved {
        time_ms: u64,
        executor_id: ExecutorId,
        reason: String,
    },
    JobStart {
        time_ms: u64,
        job_id: JobId,
        name: String,
        tasks: u32,
    },
    /// One offer round's launches for one job, batched.
    TaskStart {
        time_ms: u64,
        job_id: JobId,
        tasks: Vec<TaskStarted>,
    },
    /// One status batch's task endings for one job, batched.
    TaskEnd {
        time_ms: u64,
        job_id: JobId,
        tasks: Vec<TaskEnded>,
    },
    JobEnd {
        time_ms: u64,
        job_id: JobId,
        state: JobState,
        succeeded: u32,
        failed: u32,
        killed: u32,
        reason: Option<String>,
    },
}

impl Event {
    /// The subject suffix this event is published under.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::ExecutorAdded { .. } => "executor.added",
            Event::ExecutorRemoved { .. } => "executor.removed",
            Event::JobStart { .. } => "job.start",
            Event::TaskStart { .. } => "task.start",
            Event::TaskEnd { .. } => "task.end",
            Event::JobEnd { .. } => "job.end",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskStarted {
    pub task_id: TaskId,
    pub index: u32,
    pub attempt: u32,
    pub executor_id: ExecutorId,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskEnded {
    pub task_id: TaskId,
    pub index: u32,
    pub attempt: u32,
    pub executor_id: ExecutorId,
    pub state: TaskState,
    pub duration_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Batch for Event {
    fn split(self) -> Result<(Self, Self), Self> {
        match self {
            Event::TaskStart {
                time_ms,
                job_id,
                tasks,
            } => halve(tasks)
                .map(|(a, b)| {
                    let part = |tasks| Event::TaskStart {
                        time_ms,
                        job_id,
                        tasks,
                    };
                    (part(a), part(b))
                })
                .map_err(|tasks| Event::TaskStart {
                    time_ms,
                    job_id,
                    tasks,
                }),
            Event::TaskEnd {
                time_ms,
                job_id,
                tasks,
            } => halve(tasks)
                .map(|(a, b)| {
                    let part = |tasks| Event::TaskEnd {
                        time_ms,
                        job_id,
                        tasks,
                    };
                    (part(a), part(b))
                })
                .map_err(|tasks| Event::TaskEnd {
                    time_ms,
                    job_id,
                    tasks,
                }),
            other => Err(other),
        }
    }
}
