//! The wire form of a list of launched tasks (`LaunchTasks.tasks`, `StatusAck.launch`): each run
//! of consecutive tasks with the same job, cores and spec travels as one group that carries the
//! spec once and each task as `[task_id, index, attempt]`. Its writer, its fast reader and
//! serde's reader of it are here, the first two following one list of keys:
//! `{"job_id":n,"cpus":n,"spec":{..},"resources":{..},"gang_peers":[..],"tasks":[[task_id,index,attempt],..]}`,
//! `resources` only for a task that holds some, `gang_peers` only for a gang's task.
//!
//! Written out in full, a no-op task cost about 110 bytes, most of them field names and a spec
//! that every task of a job repeats, and escaping those field names led the driver's profile. In
//! memory the list stays a `Vec<TaskDescription>`: encoding reads it where it lies, and the tasks
//! decoded from one group share one `Arc<TaskSpec>`, decoded once. A task that holds custom
//! resources has a group of its own.

use super::compact::attempt_array;
use super::cursor::Cursor;
use super::{TaskDescription, TaskSpec, TaskStarted};
use crate::ids::JobId;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::{SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

const JOB_ID: &str = "job_id";
const CPUS: &str = "cpus";
const SPEC: &str = "spec";
const RESOURCES: &str = "resources";
const GANG_PEERS: &str = "gang_peers";
const TASKS: &str = "tasks";

/// A list of tasks to write as groups, in order, without copying a task or a spec.
pub(super) struct Groups<'a>(pub(super) &'a [TaskDescription]);

impl Serialize for Groups<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(runs(self.0))
    }
}

/// Whether `b` may ride in the group that `a` heads. Tasks of one job share one `Arc`, so the
/// pointer comparison settles almost every case before the specs are compared.
fn same_group(a: &TaskDescription, b: &TaskDescription) -> bool {
    a.job_id == b.job_id
        && a.cpus == b.cpus
        && (Arc::ptr_eq(&a.spec, &b.spec) || a.spec == b.spec)
        && a.resources == b.resources
        && a.gang_peers == b.gang_peers
}

/// The runs of consecutive tasks that make one group each.
fn runs(tasks: &[TaskDescription]) -> impl Iterator<Item = Group<'_>> {
    let mut rest = tasks;
    std::iter::from_fn(move || {
        let (head, _) = rest.split_first()?;
        let len = rest.iter().take_while(|t| same_group(head, t)).count();
        let (run, tail) = rest.split_at(len);
        rest = tail;
        Some(Group { head, run })
    })
}

/// One group to write: `head` gives the fields its tasks share.
struct Group<'a> {
    head: &'a TaskDescription,
    run: &'a [TaskDescription],
}

impl Serialize for Group<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let resources = !self.head.resources.is_empty();
        let peers = !self.head.gang_peers.is_empty();
        let len = 4 + usize::from(resources) + usize::from(peers);
        let mut group = serializer.serialize_struct("TaskGroup", len)?;
        group.serialize_field(JOB_ID, &self.head.job_id)?;
        group.serialize_field(CPUS, &self.head.cpus)?;
        group.serialize_field(SPEC, &*self.head.spec)?;
        // Only a task that holds custom resources has them: its own group, since no two
        // attempts hold the same addresses at once.
        if resources {
            group.serialize_field(RESOURCES, &self.head.resources)?;
        }
        if peers {
            group.serialize_field(GANG_PEERS, &self.head.gang_peers)?;
        }
        group.serialize_field(TASKS, &Attempts(self.run))?;
        group.end()
    }
}

/// The fast reader of a list of groups as [`Groups`] writes it: every task of every group, in
/// order, each group's tasks sharing its spec. `None` leaves the message to serde.
pub(super) fn read(c: &mut Cursor<'_>) -> Option<Vec<TaskDescription>> {
    let mut tasks = Vec::new();
    c.list(|c| {
        c.first(JOB_ID)?;
        let job_id = c.u64()?;
        c.key(CPUS)?;
        let cpus = c.u32()?;
        c.key(SPEC)?;
        let spec = Arc::new(c.embedded::<TaskSpec>()?);
        let resources: crate::resources::Addresses =
            c.optional(RESOURCES, Cursor::embedded)?.unwrap_or_default();
        // A gang's tasks are few and rare: a group with peers is left to serde.
        c.optional(GANG_PEERS, |_| None::<()>)?;
        c.key(TASKS)?;
        // At least one task: serde refuses an empty group.
        c.eat(b"[")?;
        c.items(|c| {
            let [task_id, index, attempt] = c.numbers()?;
            tasks.push(TaskDescription {
                task_id,
                job_id,
                index: u32::try_from(index).ok()?,
                attempt: u32::try_from(attempt).ok()?,
                cpus,
                spec: Arc::clone(&spec),
                resources: resources.clone(),
                gang_peers: Vec::new(),
            });
            Some(())
        })?;
        c.end_object()
    })?;
    Some(tasks)
}

/// A group's tasks as `[task_id, index, attempt]` arrays.
struct Attempts<'a>(&'a [TaskDescription]);

impl Serialize for Attempts<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|t| (t.task_id, t.index, t.attempt)))
    }
}

/// serde's reader of a list of groups: all their tasks, in order.
pub(super) fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<TaskDescription>, D::Error> {
    deserializer.deserialize_seq(GroupsVisitor)
}

struct GroupsVisitor;

impl<'de> Visitor<'de> for GroupsVisitor {
    type Value = Vec<TaskDescription>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of task groups")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut tasks = Vec::new();
        while let Some(group) = seq.next_element::<GroupWire>()? {
            group.append_to(&mut tasks).map_err(de::Error::custom)?;
        }
        Ok(tasks)
    }
}

/// One group as read, every field optional so that a missing one gets a message that says where.
#[derive(Deserialize)]
#[serde(expecting = "a task group: an object with job_id, cpus, spec and tasks")]
struct GroupWire {
    job_id: Option<JobId>,
    cpus: Option<u32>,
    spec: Option<TaskSpec>,
    #[serde(default)]
    resources: crate::resources::Addresses,
    #[serde(default)]
    gang_peers: Vec<String>,
    tasks: Option<Vec<Attempt>>,
}

fn missing(field: &str) -> String {
    format!("missing field `{field}` in a task group")
}

impl GroupWire {
    /// Appends the group's tasks to `tasks`, all sharing one spec.
    fn append_to(self, tasks: &mut Vec<TaskDescription>) -> Result<(), String> {
        let job_id = self.job_id.ok_or_else(|| missing("job_id"))?;
        let cpus = self.cpus.ok_or_else(|| missing("cpus"))?;
        let spec = Arc::new(self.spec.ok_or_else(|| missing("spec"))?);
        let attempts = self.tasks.ok_or_else(|| missing("tasks"))?;
        if attempts.is_empty() {
            return Err(format!("a task group of job {job_id} has no tasks"));
        }
        tasks.extend(attempts.into_iter().map(|Attempt(a)| TaskDescription {
            task_id: a.task_id,
            job_id,
            index: a.index,
            attempt: a.attempt,
            cpus,
            spec: Arc::clone(&spec),
            resources: self.resources.clone(),
            gang_peers: self.gang_peers.clone(),
        }));
        Ok(())
    }
}

/// One task of a group: `[task_id, index, attempt]`, exactly three numbers (a started
/// attempt's array form).
struct Attempt(TaskStarted);

impl<'de> Deserialize<'de> for Attempt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_tuple(3, AttemptVisitor)
    }
}

struct AttemptVisitor;

impl<'de> Visitor<'de> for AttemptVisitor {
    type Value = Attempt;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a task as [task_id, index, attempt]")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Attempt, A::Error> {
        attempt_array(seq, &self).map(Attempt)
    }
}
