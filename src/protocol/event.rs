//! The listener bus: the events the driver publishes on `<p>.events.<kind>` for anyone who
//! subscribes, and how a task event too large for one message is cut in two.

use super::{Batch, JobState, TaskState};
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
    /// Custom resources beside cores, each with its addresses.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: crate::resources::Addresses,
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
    /// One offer round's launches for one job, by executor, all of the `term` of the
    /// leader that publishes it (an attempt is named by task id, attempt and term).
    TaskStart {
        time_ms: u64,
        job_id: JobId,
        executors: Vec<ExecutorTasks<TaskStarted>>,
        #[serde(default, skip_serializing_if = "super::is_zero")]
        term: u64,
    },
    /// One status batch's task endings for one job, by executor, all of the `term` of the
    /// leader that ended them.
    TaskEnd {
        time_ms: u64,
        job_id: JobId,
        executors: Vec<ExecutorTasks<TaskEnded>>,
        #[serde(default, skip_serializing_if = "super::is_zero")]
        term: u64,
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
    /// The dynamic allocation target changed.
    ExecutorTarget {
        time_ms: u64,
        target_executors: u64,
        previous: u64,
        reason: String,
    },
    /// An executor gets no more tasks of `scope` (exclusion on failure) until `until_ms`:
    /// task `index` of job `job_id`, any task of job `job_id`, or any task at all.
    ExecutorExcluded {
        time_ms: u64,
        executor_id: ExecutorId,
        scope: ExclusionScope,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        job_id: Option<JobId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        index: Option<u32>,
        reason: String,
        until_ms: u64,
    },
    /// A speculative copy of a running task was launched: attempt `attempt` of task `task_id`
    /// on `executor_id`, beside attempt `copy_of`, which had run `running_ms` (past the
    /// job's `threshold_ms`). The copy is also in a `TaskStart`, as every launch is; the first
    /// of the two to finish counts, and the other ends KILLED.
    SpeculativeTaskStart {
        time_ms: u64,
        job_id: JobId,
        executor_id: ExecutorId,
        task_id: TaskId,
        index: u32,
        attempt: u32,
        copy_of: u32,
        running_ms: u64,
        threshold_ms: u64,
    },
    /// An exclusion ended before its job did: its time passed.
    ExecutorUnexcluded {
        time_ms: u64,
        executor_id: ExecutorId,
        scope: ExclusionScope,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        job_id: Option<JobId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        index: Option<u32>,
        reason: String,
    },
}

/// What an executor is excluded from (Spark's task, stage and application exclusion).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExclusionScope {
    /// One task of one job.
    Task,
    /// Every task of one job.
    Job,
    /// Every task of every job.
    Cluster,
}

impl std::fmt::Display for ExclusionScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ExclusionScope::Task => "task",
            ExclusionScope::Job => "job",
            ExclusionScope::Cluster => "cluster",
        })
    }
}

impl Event {
    /// A `TaskEnd` of job `job_id`, of attempts of `term`, that all ran on one executor.
    pub fn task_end_on(
        executor_id: &ExecutorId,
        time_ms: u64,
        job_id: JobId,
        term: u64,
        tasks: Vec<TaskEnded>,
    ) -> Self {
        Event::TaskEnd {
            time_ms,
            job_id,
            executors: vec![ExecutorTasks {
                executor_id: executor_id.clone(),
                tasks,
            }],
            term,
        }
    }

    /// This `TaskEnd` with only the entries `keep` keeps (it may change them too), and only
    /// the executors left with any; `None` if it keeps none, or the event is no `TaskEnd`.
    pub fn keep_ended(self, mut keep: impl FnMut(&mut TaskEnded) -> bool) -> Option<Event> {
        let Event::TaskEnd {
            time_ms,
            job_id,
            mut executors,
            term,
        } = self
        else {
            return None;
        };
        for group in &mut executors {
            group.tasks.retain_mut(&mut keep);
        }
        executors.retain(|group| !group.tasks.is_empty());
        (!executors.is_empty()).then_some(Event::TaskEnd {
            time_ms,
            job_id,
            executors,
            term,
        })
    }

    /// The subject suffix this event is published under.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::ExecutorAdded { .. } => "executor.added",
            Event::ExecutorRemoved { .. } => "executor.removed",
            Event::JobStart { .. } => "job.start",
            Event::TaskStart { .. } => "task.start",
            Event::TaskEnd { .. } => "task.end",
            Event::JobEnd { .. } => "job.end",
            Event::ExecutorTarget { .. } => "executor.target",
            Event::ExecutorExcluded { .. } => "executor.excluded",
            Event::ExecutorUnexcluded { .. } => "executor.unexcluded",
            Event::SpeculativeTaskStart { .. } => "task.speculative",
        }
    }

    /// The job the event is about; none for an executor's event.
    pub fn job_id(&self) -> Option<u64> {
        match self {
            Event::JobStart { job_id, .. }
            | Event::TaskStart { job_id, .. }
            | Event::TaskEnd { job_id, .. }
            | Event::JobEnd { job_id, .. }
            | Event::SpeculativeTaskStart { job_id, .. } => Some(*job_id),
            Event::ExecutorExcluded { job_id, .. } | Event::ExecutorUnexcluded { job_id, .. } => {
                *job_id
            }
            Event::ExecutorAdded { .. }
            | Event::ExecutorRemoved { .. }
            | Event::ExecutorTarget { .. } => None,
        }
    }

    /// The attempts a `TaskStart` announces, each with the executor it was launched on, in the
    /// event's order; none for any other event.
    pub fn started(&self) -> impl Iterator<Item = (&ExecutorId, &TaskStarted)> {
        let groups = match self {
            Event::TaskStart { executors, .. } => executors.as_slice(),
            _ => &[],
        };
        entries(groups)
    }

    /// The attempts a `TaskEnd` ends, each with the executor it ran on, in the event's order;
    /// none for any other event.
    pub fn ended(&self) -> impl Iterator<Item = (&ExecutorId, &TaskEnded)> {
        let groups = match self {
            Event::TaskEnd { executors, .. } => executors.as_slice(),
            _ => &[],
        };
        entries(groups)
    }

    /// How many attempts a `TaskStart` or `TaskEnd` lists; 0 for any other event.
    pub fn task_count(&self) -> usize {
        match self {
            Event::TaskStart { executors, .. } => count(executors),
            Event::TaskEnd { executors, .. } => count(executors),
            _ => 0,
        }
    }
}

/// A task event's attempts on one executor, in the order they were launched or ended there.
/// The executor is named once for all of them: it is most of what an entry would repeat. On
/// the wire, runs of consecutive attempts are one entry each (`compact.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutorTasks<T> {
    pub executor_id: ExecutorId,
    pub tasks: Vec<T>,
}

fn entries<T>(groups: &[ExecutorTasks<T>]) -> impl Iterator<Item = (&ExecutorId, &T)> {
    groups.iter().flat_map(|group| {
        group
            .tasks
            .iter()
            .map(move |task| (&group.executor_id, task))
    })
}

fn count<T>(groups: &[ExecutorTasks<T>]) -> usize {
    groups.iter().map(|group| group.tasks.len()).sum()
}

/// One attempt launched, in a `TaskStart`; on the wire `[task_id, index, attempt]`
/// (`compact.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskStarted {
    pub task_id: TaskId,
    pub index: u32,
    pub attempt: u32,
}

/// One attempt ended, in a `TaskEnd`; on the wire a plain finish (no error) is
/// `[task_id, index, attempt, duration_ms]`, anything else an object (`compact.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskEnded {
    pub task_id: TaskId,
    pub index: u32,
    pub attempt: u32,
    pub state: TaskState,
    pub duration_ms: u64,
    pub error: Option<String>,
}

impl Batch for Event {
    fn split(self) -> Result<(Self, Self), Self> {
        match self {
            Event::TaskStart {
                time_ms,
                job_id,
                executors,
                term,
            } => split_groups(executors, |executors| Event::TaskStart {
                time_ms,
                job_id,
                executors,
                term,
            }),
            Event::TaskEnd {
                time_ms,
                job_id,
                executors,
                term,
            } => split_groups(executors, |executors| Event::TaskEnd {
                time_ms,
                job_id,
                executors,
                term,
            }),
            other => Err(other),
        }
    }
}

/// A task event's groups cut in two, each half made an event by `part`; the event itself, whole,
/// when it cannot be cut (the shape of [`Batch::split`]).
#[allow(clippy::result_large_err)]
fn split_groups<T>(
    groups: Vec<ExecutorTasks<T>>,
    part: impl Fn(Vec<ExecutorTasks<T>>) -> Event,
) -> Result<(Event, Event), Event> {
    halve_groups(groups)
        .map(|(a, b)| (part(a), part(b)))
        .map_err(part)
}

type Halves<T> = (Vec<ExecutorTasks<T>>, Vec<ExecutorTasks<T>>);

/// `groups` cut in two with half the attempts in each (the second has the odd one), in order;
/// the group the cut falls in is cut too, so its executor is named in both halves. `groups`
/// itself when it holds fewer than two attempts.
fn halve_groups<T>(mut groups: Vec<ExecutorTasks<T>>) -> Result<Halves<T>, Vec<ExecutorTasks<T>>> {
    if count(&groups) < 2 {
        return Err(groups);
    }
    // How many attempts the first half still takes, and the group its last one is in.
    let mut keep = count(&groups) / 2;
    let mut cut = 0;
    while groups[cut].tasks.len() < keep {
        keep -= groups[cut].tasks.len();
        cut += 1;
    }
    let mut second = groups.split_off(cut + 1);
    let straddled = &mut groups[cut];
    if straddled.tasks.len() > keep {
        let tasks = straddled.tasks.split_off(keep);
        let executor_id = straddled.executor_id.clone();
        second.insert(0, ExecutorTasks { executor_id, tasks });
    }
    Ok((groups, second))
}
