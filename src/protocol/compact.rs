//! Compact wire forms of the entries that come once per task: a status update, an attempt in
//! a `TaskStart` or `TaskEnd` event, and a task's outcome in the journal. The common case
//! travels as an array: a plain finish (no result, no error) as `[task_id, attempt]` in a
//! status batch, as `[task_id, index, attempt, duration_ms]` in a `TaskEnd` and as
//! `[task_id, attempt, executor_id]` in the journal, and every started attempt as
//! `[task_id, index, attempt]`, as in a launch. Anything else is an object. Runs of such
//! entries for consecutive tasks are one entry in the journal and in task events.
//!
//! Written as objects, these entries cost 45 to 75 bytes a task, mostly field names; writing and
//! reading those names led the driver's profile at high task rates. Both forms are read
//! wherever an entry is, so a sender may always write objects.

use super::event::{ExecutorTasks, TaskEnded, TaskStarted};
use super::journal::JournaledTask;
use super::{ResultObject, StatusUpdate, TaskState};
use crate::ids::{ExecutorId, TaskId};
use crate::objects::ObjectRef;
use serde::de::{
    self, value::MapAccessDeserializer, DeserializeOwned, Deserializer, Expected, IgnoredAny,
    MapAccess, SeqAccess, Visitor,
};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;
use std::marker::PhantomData;

/// An entry with a compact array form beside its object form.
trait Compact: Sized {
    /// What a reader expects, for its errors.
    const EXPECTING: &'static str;
    /// The object form, as read.
    type Object: DeserializeOwned + Into<Self>;
    /// Reads the array form.
    fn from_array<'de, A: SeqAccess<'de>>(
        seq: A,
        expected: &dyn Expected,
    ) -> Result<Self, A::Error>;
}

/// Reads either form of `T`.
fn deserialize<'de, D: Deserializer<'de>, T: Compact>(deserializer: D) -> Result<T, D::Error> {
    deserializer.deserialize_any(CompactVisitor(PhantomData))
}

struct CompactVisitor<T>(PhantomData<T>);

impl<'de, T: Compact> Visitor<'de> for CompactVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        T::from_array(seq, &self)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::Object::deserialize(MapAccessDeserializer::new(map)).map(Into::into)
    }
}

/// The next element of an array form that must have at least `at + 1`.
fn element<'de, A: SeqAccess<'de>, T: Deserialize<'de>>(
    seq: &mut A,
    at: usize,
    expected: &dyn Expected,
) -> Result<T, A::Error> {
    seq.next_element()?
        .ok_or_else(|| de::Error::invalid_length(at, expected))
}

/// The `task_id, attempt` that the plain finishes of a status batch and the journal start with.
fn finish_head<'de, A: SeqAccess<'de>>(
    seq: &mut A,
    expected: &dyn Expected,
) -> Result<(TaskId, u32), A::Error> {
    Ok((element(seq, 0, expected)?, element(seq, 1, expected)?))
}

/// Checks that a tuple of `len` elements, read that far, has no more.
fn end_of_tuple<'de, A: SeqAccess<'de>>(
    mut seq: A,
    len: usize,
    expected: &dyn Expected,
) -> Result<(), A::Error> {
    let mut seen = len;
    while seq.next_element::<IgnoredAny>()?.is_some() {
        seen += 1;
    }
    match seen > len {
        true => Err(de::Error::invalid_length(seen, expected)),
        false => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// Status updates

impl StatusUpdate {
    /// A plain finish: `FINISHED`, with no result and no error.
    pub(crate) fn finished(task_id: TaskId, attempt: u32) -> Self {
        Self {
            task_id,
            attempt,
            state: TaskState::Finished,
            result: None,
            error: None,
            result_object: None,
            no_retry: false,
        }
    }

    /// Whether it goes on the wire as `[task_id, attempt]`.
    pub(crate) fn is_plain_finish(&self) -> bool {
        self.state == TaskState::Finished
            && self.result.is_none()
            && self.error.is_none()
            && self.result_object.is_none()
            && !self.no_retry
    }
}

/// A status update's object form.
#[derive(Serialize, Deserialize)]
struct UpdateObject<R, E> {
    task_id: TaskId,
    attempt: u32,
    state: TaskState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<R>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<E>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result_object: Option<ResultObject>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    no_retry: bool,
}

impl Serialize for StatusUpdate {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.is_plain_finish() {
            return (self.task_id, self.attempt).serialize(serializer);
        }
        UpdateObject {
            task_id: self.task_id,
            attempt: self.attempt,
            state: self.state,
            result: self.result.as_ref(),
            error: self.error.as_ref(),
            result_object: self.result_object.clone(),
            no_retry: self.no_retry,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for StatusUpdate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize(deserializer)
    }
}

impl From<UpdateObject<Value, String>> for StatusUpdate {
    fn from(o: UpdateObject<Value, String>) -> Self {
        Self {
            task_id: o.task_id,
            attempt: o.attempt,
            state: o.state,
            result: o.result,
            error: o.error,
            result_object: o.result_object,
            no_retry: o.no_retry,
        }
    }
}

impl Compact for StatusUpdate {
    const EXPECTING: &'static str =
        "a status update: an object, or [task_id, attempt] for a plain finish";
    type Object = UpdateObject<Value, String>;

    fn from_array<'de, A: SeqAccess<'de>>(
        mut seq: A,
        expected: &dyn Expected,
    ) -> Result<Self, A::Error> {
        let (task_id, attempt) = finish_head(&mut seq, expected)?;
        end_of_tuple(seq, 2, expected)?;
        Ok(Self::finished(task_id, attempt))
    }
}

// ---------------------------------------------------------------------------------------------
// Attempts in task events

/// A started attempt's object form, as read.
#[derive(Deserialize)]
struct StartedObject {
    task_id: TaskId,
    index: u32,
    attempt: u32,
}

impl Serialize for TaskStarted {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (self.task_id, self.index, self.attempt).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for TaskStarted {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize(deserializer)
    }
}

impl From<StartedObject> for TaskStarted {
    fn from(o: StartedObject) -> Self {
        Self {
            task_id: o.task_id,
            index: o.index,
            attempt: o.attempt,
        }
    }
}

impl Compact for TaskStarted {
    const EXPECTING: &'static str = "a started attempt: [task_id, index, attempt]";
    type Object = StartedObject;

    fn from_array<'de, A: SeqAccess<'de>>(
        seq: A,
        expected: &dyn Expected,
    ) -> Result<Self, A::Error> {
        attempt_array(seq, expected)
    }
}

/// `[task_id, index, attempt]`, exactly: a started attempt, or a task of a launch group.
pub(super) fn attempt_array<'de, A: SeqAccess<'de>>(
    mut seq: A,
    expected: &dyn Expected,
) -> Result<TaskStarted, A::Error> {
    let started = attempt_head(&mut seq, expected)?;
    end_of_tuple(seq, 3, expected)?;
    Ok(started)
}

/// The `task_id, index, attempt` that both attempts' array forms start with.
fn attempt_head<'de, A: SeqAccess<'de>>(
    seq: &mut A,
    expected: &dyn Expected,
) -> Result<TaskStarted, A::Error> {
    Ok(TaskStarted {
        task_id: element(seq, 0, expected)?,
        index: element(seq, 1, expected)?,
        attempt: element(seq, 2, expected)?,
    })
}

impl TaskEnded {
    /// Whether it goes on the wire as `[task_id, index, attempt, duration_ms]`.
    fn is_plain_finish(&self) -> bool {
        self.state == TaskState::Finished && self.error.is_none()
    }
}

/// An ended attempt's object form.
#[derive(Serialize, Deserialize)]
struct EndedObject<E> {
    task_id: TaskId,
    index: u32,
    attempt: u32,
    state: TaskState,
    duration_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<E>,
}

impl Serialize for TaskEnded {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.is_plain_finish() {
            return (self.task_id, self.index, self.attempt, self.duration_ms)
                .serialize(serializer);
        }
        EndedObject {
            task_id: self.task_id,
            index: self.index,
            attempt: self.attempt,
            state: self.state,
            duration_ms: self.duration_ms,
            error: self.error.as_ref(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for TaskEnded {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize(deserializer)
    }
}

impl From<EndedObject<String>> for TaskEnded {
    fn from(o: EndedObject<String>) -> Self {
        Self {
            task_id: o.task_id,
            index: o.index,
            attempt: o.attempt,
            state: o.state,
            duration_ms: o.duration_ms,
            error: o.error,
        }
    }
}

impl Compact for TaskEnded {
    const EXPECTING: &'static str =
        "an ended attempt: an object, or [task_id, index, attempt, duration_ms] for a plain finish";
    type Object = EndedObject<String>;

    fn from_array<'de, A: SeqAccess<'de>>(
        mut seq: A,
        expected: &dyn Expected,
    ) -> Result<Self, A::Error> {
        let TaskStarted {
            task_id,
            index,
            attempt,
        } = attempt_head(&mut seq, expected)?;
        let duration_ms = element(&mut seq, 3, expected)?;
        end_of_tuple(seq, 4, expected)?;
        Ok(Self {
            task_id,
            index,
            attempt,
            state: TaskState::Finished,
            duration_ms,
            error: None,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Outcomes in the journal

impl JournaledTask {
    /// Whether it goes in the journal as `[task_id, attempt, executor_id]`.
    fn is_plain_finish(&self) -> bool {
        self.state == TaskState::Finished
            && self.result.is_none()
            && self.error.is_none()
            && !self.in_bucket
            && self.result_object.is_none()
            && self.objects.is_empty()
    }
}

/// A journaled outcome's object form.
#[derive(Serialize, Deserialize)]
struct JournaledObject<I, R, E> {
    task_id: TaskId,
    attempt: u32,
    executor_id: I,
    state: TaskState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<R>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<E>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    in_bucket: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result_object: Option<ResultObject>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    objects: Vec<ObjectRef>,
}

impl Serialize for JournaledTask {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.is_plain_finish() {
            return (self.task_id, self.attempt, &self.executor_id).serialize(serializer);
        }
        JournaledObject {
            task_id: self.task_id,
            attempt: self.attempt,
            executor_id: &self.executor_id,
            state: self.state,
            result: self.result.as_ref(),
            error: self.error.as_ref(),
            in_bucket: self.in_bucket,
            result_object: self.result_object.clone(),
            objects: self.objects.clone(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for JournaledTask {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize(deserializer)
    }
}

impl From<JournaledObject<ExecutorId, Value, String>> for JournaledTask {
    fn from(o: JournaledObject<ExecutorId, Value, String>) -> Self {
        Self {
            task_id: o.task_id,
            attempt: o.attempt,
            executor_id: o.executor_id,
            state: o.state,
            result: o.result,
            error: o.error,
            in_bucket: o.in_bucket,
            result_object: o.result_object,
            objects: o.objects,
        }
    }
}

impl Compact for JournaledTask {
    const EXPECTING: &'static str = "a journaled outcome: an object, or \
                                     [task_id, attempt, executor_id] for a plain finish";
    type Object = JournaledObject<ExecutorId, Value, String>;

    fn from_array<'de, A: SeqAccess<'de>>(
        mut seq: A,
        expected: &dyn Expected,
    ) -> Result<Self, A::Error> {
        let (task_id, attempt) = finish_head(&mut seq, expected)?;
        let executor_id = element(&mut seq, 2, expected)?;
        end_of_tuple(seq, 3, expected)?;
        Ok(Self::plain_finish(task_id, attempt, executor_id))
    }
}

impl JournaledTask {
    /// `FINISHED` on `executor_id`, with nothing else to say.
    fn plain_finish(task_id: TaskId, attempt: u32, executor_id: ExecutorId) -> Self {
        Self {
            task_id,
            attempt,
            executor_id,
            state: TaskState::Finished,
            result: None,
            error: None,
            in_bucket: false,
            result_object: None,
            objects: Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Runs of plain finishes in the journal

/// `TasksEnded.tasks`: a run of two or more plain finishes of consecutive task ids, with one
/// attempt and one executor, is written `[first_task_id, attempt, executor_id, count]`; any
/// other outcome as one entry.
pub(super) mod runs {
    use super::*;
    use serde::ser::SerializeSeq;

    /// The most outcomes one record may expand to: a status batch's, or a snapshot record's.
    const MAX_TASKS: u64 = 1 << 20;

    pub fn serialize<S: Serializer>(
        tasks: &[JournaledTask],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(None)?;
        let mut at = 0;
        while at < tasks.len() {
            let first = &tasks[at];
            let run = match first.is_plain_finish() {
                true => tasks[at..]
                    .iter()
                    .zip(0..)
                    .take_while(|(t, n)| {
                        t.is_plain_finish()
                            && t.task_id == first.task_id.wrapping_add(*n)
                            && t.attempt == first.attempt
                            && t.executor_id == first.executor_id
                    })
                    .count(),
                false => 1,
            };
            match run {
                1 => seq.serialize_element(first)?,
                n => {
                    seq.serialize_element(&(first.task_id, first.attempt, &first.executor_id, n))?
                }
            }
            at += run;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<JournaledTask>, D::Error> {
        deserializer.deserialize_seq(RunsVisitor)
    }

    struct RunsVisitor;

    impl<'de> Visitor<'de> for RunsVisitor {
        type Value = Vec<JournaledTask>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of journaled outcomes")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut tasks = Vec::new();
            while let Some(Run(run)) = seq.next_element::<Run>()? {
                match run {
                    Entry::One(task) => tasks.push(task),
                    Entry::Many(first, count) => {
                        if tasks.len() as u64 + count > MAX_TASKS {
                            return Err(de::Error::custom(format!(
                                "a record of more than {MAX_TASKS} outcomes"
                            )));
                        }
                        let last = first.task_id.checked_add(count - 1).ok_or_else(|| {
                            de::Error::custom("a run of task ids past the largest id")
                        })?;
                        tasks.extend((first.task_id..=last).map(|task_id| JournaledTask {
                            task_id,
                            executor_id: first.executor_id.clone(),
                            ..first.clone()
                        }));
                    }
                }
            }
            Ok(tasks)
        }
    }

    enum Entry {
        One(JournaledTask),
        /// The first of a run, and how many.
        Many(JournaledTask, u64),
    }

    /// One entry of the list: an outcome, or a run of plain finishes.
    struct Run(Entry);

    impl<'de> Deserialize<'de> for Run {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            super::deserialize(deserializer)
        }
    }

    impl From<JournaledObject<ExecutorId, Value, String>> for Run {
        fn from(o: JournaledObject<ExecutorId, Value, String>) -> Self {
            Run(Entry::One(o.into()))
        }
    }

    impl Compact for Run {
        const EXPECTING: &'static str = "a journaled outcome: an object, [task_id, attempt, \
                                         executor_id] for a plain finish, or [first_task_id, \
                                         attempt, executor_id, count] for a run of them";
        type Object = JournaledObject<ExecutorId, Value, String>;

        fn from_array<'de, A: SeqAccess<'de>>(
            mut seq: A,
            expected: &dyn Expected,
        ) -> Result<Self, A::Error> {
            let (task_id, attempt) = finish_head(&mut seq, expected)?;
            let executor_id = element(&mut seq, 2, expected)?;
            let count: Option<u64> = seq.next_element()?;
            end_of_tuple(seq, if count.is_some() { 4 } else { 3 }, expected)?;
            let first = JournaledTask::plain_finish(task_id, attempt, executor_id);
            match count {
                None => Ok(Run(Entry::One(first))),
                Some(0) => Err(de::Error::custom("a run of no tasks")),
                Some(n) => Ok(Run(Entry::Many(first, n))),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Runs of attempts in task events

/// `ExecutorTasks.tasks` of a `TaskStart` or `TaskEnd`: a run of two or more attempts of
/// consecutive task ids and indices with one attempt number (and, in a `TaskEnd`, all plain
/// finishes) is one entry: `[first_task_id, first_index, attempt, count]` in a `TaskStart`,
/// `[first_task_id, first_index, attempt, [duration_ms, ...]]` in a `TaskEnd`. A task's
/// attempts launched in one offer round, and their ends, mostly come in such runs, so a
/// task event costs a few bytes a task rather than twenty.
mod event_runs {
    use super::*;
    use serde::ser::SerializeSeq;

    /// The most attempts one event's list for one executor may expand to: more than any
    /// offer round or status batch holds.
    const MAX_TASKS: u64 = 1 << 20;

    /// An attempt that may be written in a run.
    pub trait Run: Sized + Compact + Serialize + From<(TaskStarted, Option<u64>)> {
        /// Whether `self` may begin a run.
        fn opens(&self) -> bool;
        /// Whether `self` is the `n`th after `first` in `first`'s run.
        fn follows(&self, first: &Self, n: u64) -> bool {
            let n32 = u32::try_from(n).ok();
            let (task, start) = (self.head(), first.head());
            self.opens()
                && task.attempt == start.attempt
                && Some(task.task_id) == start.task_id.checked_add(n)
                && Some(task.index) == n32.and_then(|n| start.index.checked_add(n))
        }
        /// Its task id, index and attempt.
        fn head(&self) -> TaskStarted;
        /// Writes the run `tasks` (two or more).
        fn write_run<S: SerializeSeq>(tasks: &[Self], seq: &mut S) -> Result<(), S::Error>;
        /// Reads the elements of an array form after its head: one attempt, or a run.
        fn read_rest<'de, A: SeqAccess<'de>>(
            head: TaskStarted,
            seq: A,
            expected: &dyn Expected,
        ) -> Result<Entry<Self>, A::Error>;
    }

    /// One entry of the list.
    pub enum Entry<T> {
        One(T),
        /// The first of a run, and what each of its attempts adds (a duration), or how many.
        Many(TaskStarted, Vec<u64>),
        Count(TaskStarted, u64),
    }

    pub fn serialize<T: Run, S: Serializer>(tasks: &[T], serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(None)?;
        let mut at = 0;
        while at < tasks.len() {
            let first = &tasks[at];
            let run = match first.opens() {
                true => {
                    1 + tasks[at + 1..]
                        .iter()
                        .zip(1..)
                        .take_while(|(t, n)| t.follows(first, *n))
                        .count()
                }
                false => 1,
            };
            match run {
                1 => seq.serialize_element(first)?,
                _ => T::write_run(&tasks[at..at + run], &mut seq)?,
            }
            at += run;
        }
        seq.end()
    }

    pub fn deserialize<'de, T: Run, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<T>, D::Error> {
        deserializer.deserialize_seq(RunsVisitor(PhantomData))
    }

    struct RunsVisitor<T>(PhantomData<T>);

    impl<'de, T: Run> Visitor<'de> for RunsVisitor<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of attempts")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut tasks = Vec::new();
            while let Some(Listed(entry)) = seq.next_element::<Listed<T>>()? {
                let (first, count) = match &entry {
                    Entry::One(_) => (None, 1),
                    Entry::Many(first, each) => (Some(first), each.len() as u64),
                    Entry::Count(first, count) => (Some(first), *count),
                };
                if tasks.len() as u64 + count > MAX_TASKS {
                    return Err(de::Error::custom(format!(
                        "a list of more than {MAX_TASKS} attempts"
                    )));
                }
                if let Some(first) = first {
                    let ends = |n: u64| {
                        let index = u32::try_from(n).ok()?.checked_add(first.index)?;
                        Some((first.task_id.checked_add(n)?, index))
                    };
                    if count < 2 {
                        return Err(de::Error::custom("a run of fewer than two attempts"));
                    }
                    if ends(count - 1).is_none() {
                        return Err(de::Error::custom("a run past the largest task id or index"));
                    }
                }
                match entry {
                    Entry::One(task) => tasks.push(task),
                    Entry::Many(first, each) => tasks.extend(
                        each.into_iter()
                            .zip(0..)
                            .map(|(each, n)| T::from((shifted(&first, n), Some(each)))),
                    ),
                    Entry::Count(first, count) => {
                        tasks.extend((0..count).map(|n| T::from((shifted(&first, n), None))))
                    }
                }
            }
            Ok(tasks)
        }
    }

    /// The `n`th attempt of the run that `first` begins (checked to exist by the caller).
    fn shifted(first: &TaskStarted, n: u64) -> TaskStarted {
        TaskStarted {
            task_id: first.task_id + n,
            index: first.index + n as u32,
            attempt: first.attempt,
        }
    }

    /// One entry of the list, as read.
    struct Listed<T>(Entry<T>);

    impl<'de, T: Run> Deserialize<'de> for Listed<T> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_any(ListedVisitor(PhantomData))
        }
    }

    struct ListedVisitor<T>(PhantomData<T>);

    impl<'de, T: Run> Visitor<'de> for ListedVisitor<T> {
        type Value = Listed<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(T::EXPECTING)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let head = attempt_head(&mut seq, &self)?;
            T::read_rest(head, seq, &self).map(Listed)
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            T::Object::deserialize(MapAccessDeserializer::new(map))
                .map(|object| Listed(Entry::One(object.into())))
        }
    }

    impl Run for TaskStarted {
        fn opens(&self) -> bool {
            true
        }

        fn head(&self) -> TaskStarted {
            self.clone()
        }

        fn write_run<S: SerializeSeq>(tasks: &[Self], seq: &mut S) -> Result<(), S::Error> {
            let first = &tasks[0];
            seq.serialize_element(&(first.task_id, first.index, first.attempt, tasks.len()))
        }

        fn read_rest<'de, A: SeqAccess<'de>>(
            head: TaskStarted,
            mut seq: A,
            expected: &dyn Expected,
        ) -> Result<Entry<Self>, A::Error> {
            let count: Option<u64> = seq.next_element()?;
            end_of_tuple(seq, if count.is_some() { 4 } else { 3 }, expected)?;
            Ok(match count {
                None => Entry::One(head),
                Some(count) => Entry::Count(head, count),
            })
        }
    }

    impl From<(TaskStarted, Option<u64>)> for TaskStarted {
        fn from((started, _): (TaskStarted, Option<u64>)) -> Self {
            started
        }
    }

    impl Run for TaskEnded {
        fn opens(&self) -> bool {
            self.is_plain_finish()
        }

        fn head(&self) -> TaskStarted {
            TaskStarted {
                task_id: self.task_id,
                index: self.index,
                attempt: self.attempt,
            }
        }

        fn write_run<S: SerializeSeq>(tasks: &[Self], seq: &mut S) -> Result<(), S::Error> {
            let first = &tasks[0];
            let durations = Durations(tasks);
            seq.serialize_element(&(first.task_id, first.index, first.attempt, durations))
        }

        fn read_rest<'de, A: SeqAccess<'de>>(
            head: TaskStarted,
            mut seq: A,
            expected: &dyn Expected,
        ) -> Result<Entry<Self>, A::Error> {
            let last: DurationOrRun = element(&mut seq, 3, expected)?;
            end_of_tuple(seq, 4, expected)?;
            Ok(match last {
                DurationOrRun::One(duration_ms) => {
                    Entry::One(TaskEnded::from((head, Some(duration_ms))))
                }
                DurationOrRun::Run(durations) => Entry::Many(head, durations),
            })
        }
    }

    impl From<(TaskStarted, Option<u64>)> for TaskEnded {
        fn from((started, duration_ms): (TaskStarted, Option<u64>)) -> Self {
            Self {
                task_id: started.task_id,
                index: started.index,
                attempt: started.attempt,
                state: TaskState::Finished,
                duration_ms: duration_ms.unwrap_or(0),
                error: None,
            }
        }
    }

    /// A run's durations, written as a list without copying them out.
    struct Durations<'a>(&'a [TaskEnded]);

    impl Serialize for Durations<'_> {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_seq(self.0.iter().map(|t| t.duration_ms))
        }
    }

    /// The last element of a `TaskEnd` entry's array form: one plain finish's duration, or a
    /// run's.
    enum DurationOrRun {
        One(u64),
        Run(Vec<u64>),
    }

    impl<'de> Deserialize<'de> for DurationOrRun {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = DurationOrRun;

                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a duration in ms, or a list of them")
                }

                fn visit_u64<E: de::Error>(self, v: u64) -> Result<DurationOrRun, E> {
                    Ok(DurationOrRun::One(v))
                }

                fn visit_seq<A: SeqAccess<'de>>(
                    self,
                    mut seq: A,
                ) -> Result<DurationOrRun, A::Error> {
                    let mut durations = Vec::new();
                    while let Some(d) = seq.next_element()? {
                        if durations.len() as u64 >= MAX_TASKS {
                            return Err(de::Error::custom(format!(
                                "a run of more than {MAX_TASKS} attempts"
                            )));
                        }
                        durations.push(d);
                    }
                    Ok(DurationOrRun::Run(durations))
                }
            }
            deserializer.deserialize_any(V)
        }
    }
}

/// A task event's list for one executor, written with [`event_runs`].
macro_rules! listed_in_runs {
    ($attempt:ty) => {
        impl Serialize for ExecutorTasks<$attempt> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                #[derive(Serialize)]
                struct Listed<'a> {
                    executor_id: &'a ExecutorId,
                    #[serde(serialize_with = "event_runs::serialize")]
                    tasks: &'a [$attempt],
                }
                Listed {
                    executor_id: &self.executor_id,
                    tasks: &self.tasks,
                }
                .serialize(serializer)
            }
        }

        impl<'de> Deserialize<'de> for ExecutorTasks<$attempt> {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                #[derive(Deserialize)]
                struct Listed {
                    executor_id: ExecutorId,
                    #[serde(deserialize_with = "event_runs::deserialize")]
                    tasks: Vec<$attempt>,
                }
                let Listed { executor_id, tasks } = Listed::deserialize(deserializer)?;
                Ok(Self { executor_id, tasks })
            }
        }
    };
}

listed_in_runs!(TaskStarted);
listed_in_runs!(TaskEnded);
