//! The objects the workload's tasks name, and the step that fetches them on an executor before
//! an attempt's work starts, as `executor::staging` and `objects::cache` do: each object once
//! per executor process into its cache; an attempt that needs an object already being fetched
//! waits for that one fetch; a fetch that fails fails every attempt waiting on it, with an error
//! naming the object, and is not remembered, so the next attempt that needs the object fetches
//! it again. A fetch takes virtual time (now and then a long one) and fails with
//! `fetch_failure`, both drawn from the seed. The cache has no bound: nothing is evicted.

use super::network::Pid;
use super::{Event, World};
use crate::executor::machine::Run;
use crate::ids::TaskId;
use crate::objects::ObjectRef;
use crate::protocol::{StatusUpdate, TaskDescription, TaskSpec, TaskState};
use std::collections::{BTreeMap, BTreeSet};

/// The chance that a fetch is slow: it takes up to `SLOW_FACTOR` times `fetch_ms`.
const SLOW_FETCHES: f64 = 0.1;
const SLOW_FACTOR: u64 = 10;
/// Why a simulated fetch fails, after the executor's own "could not fetch object X: ".
const WHY: &str = "the simulated fetch failed";

/// The workload's `count` objects, named by the seed.
pub fn workload_objects(seed: u64, count: u32) -> Vec<ObjectRef> {
    (0..count)
        .map(|i| ObjectRef::of(format!("ember sim {seed} object {i}").as_bytes()))
        .collect()
}

/// The error of an attempt whose fetch of `object` failed, as the executor words it.
pub fn fetch_error(object: &ObjectRef) -> String {
    format!("could not fetch object {object}: {WHY}")
}

/// One executor process's object cache.
#[derive(Debug, Default)]
pub struct Cache {
    /// Fetched, on its disk.
    held: BTreeSet<ObjectRef>,
    /// Being fetched.
    fetching: BTreeSet<ObjectRef>,
    /// The runs waiting for fetches.
    waiting: BTreeMap<Run, Waiting>,
}

/// A run that waits for its objects, and what it does once they are here.
#[derive(Debug)]
struct Waiting {
    task_id: TaskId,
    attempt: u32,
    /// Every object it names.
    objects: BTreeSet<ObjectRef>,
    /// Those still being fetched.
    needs: BTreeSet<ObjectRef>,
    ok: bool,
    run_for: u64,
}

/// A run that needs objects: which, and what its work does once it starts.
pub(super) struct Needs {
    pub objects: BTreeSet<ObjectRef>,
    pub ok: bool,
    pub run_for: u64,
}

impl Cache {
    /// Which of `objects` are not on disk (being fetched or not).
    pub fn missing(&self, objects: &BTreeSet<ObjectRef>) -> BTreeSet<ObjectRef> {
        objects.difference(&self.held).cloned().collect()
    }
}

/// The spec of workload job `origin`'s tasks: jobs 2 and 3 of every 4 (one without
/// speculation, one with) run commands that name two of the run's `objects` as inputs,
/// overlapping from job to job; the others name none.
pub fn spec_of(objects: &[ObjectRef], origin: usize) -> TaskSpec {
    let count = objects.len();
    if count == 0 || origin % 4 < 2 {
        return TaskSpec::Handler {
            name: "sim".into(),
            arg: serde_json::Value::Null,
        };
    }
    let inputs = (0..2.min(count))
        .map(|i| (format!("in-{i}"), objects[(origin + i) % count].clone()))
        .collect();
    TaskSpec::Command {
        argv: vec!["sim".into()],
        env: BTreeMap::new(),
        cwd: None,
        timeout_ms: None,
        inputs,
        outputs: Vec::new(),
    }
}

impl World {
    /// Run `run` of `task` on `pid` waits for the objects it needs that are not on disk,
    /// starting a fetch of each that is not being fetched already.
    pub(super) fn wait_for_objects(
        &mut self,
        pid: Pid,
        run: Run,
        task: &TaskDescription,
        needs: Needs,
    ) {
        let missing = self.procs[pid as usize].cache.missing(&needs.objects);
        for object in &missing {
            if self.procs[pid as usize]
                .cache
                .fetching
                .insert(object.clone())
            {
                self.start_fetch(pid, object);
            } else {
                self.ledger.fetches.counts.shared += 1;
            }
        }
        let waiting = Waiting {
            task_id: task.task_id,
            attempt: task.attempt,
            objects: needs.objects,
            needs: missing,
            ok: needs.ok,
            run_for: needs.run_for,
        };
        self.procs[pid as usize].cache.waiting.insert(run, waiting);
    }

    fn start_fetch(&mut self, pid: Pid, object: &ObjectRef) {
        let now = self.queue.now();
        let ok = !self.rng.chance(self.config.fetch_failure);
        let longest = match self.rng.chance(SLOW_FETCHES) {
            true => self.config.fetch_ms * SLOW_FACTOR,
            false => self.config.fetch_ms,
        };
        let takes = self.rng.between(1, longest);
        self.ledger.fetches.counts.fetches += 1;
        self.trace.line(
            now,
            format_args!("e{pid} fetches object {}", object.short()),
        );
        let object = object.clone();
        self.queue.after(takes, Event::Fetched { pid, object, ok });
    }

    /// A fetch on `pid` ended: the object is on disk, or it is not and every run waiting on it
    /// fails. A run whose objects are all here starts its work.
    pub(super) fn fetched(&mut self, pid: Pid, object: ObjectRef, ok: bool) -> Result<(), String> {
        let now = self.queue.now();
        let process = &mut self.procs[pid as usize];
        if !process.alive {
            return Ok(());
        }
        process.cache.fetching.remove(&object);
        if ok {
            process.cache.held.insert(object.clone());
        }
        let how = if ok { "fetched" } else { "failed to fetch" };
        self.trace
            .line(now, format_args!("e{pid} {how} object {}", object.short()));
        self.ledger.fetches.fetched(pid, &object, ok);
        let runs: Vec<Run> = self.procs[pid as usize]
            .cache
            .waiting
            .iter()
            .filter(|(_, w)| w.needs.contains(&object))
            .map(|(run, _)| *run)
            .collect();
        for run in runs {
            self.fetched_for(pid, run, &object, ok)?;
        }
        self.executor_stepped(pid)
    }

    /// Run `run` on `pid`, which waited on `object`, hears how its fetch went.
    fn fetched_for(
        &mut self,
        pid: Pid,
        run: Run,
        object: &ObjectRef,
        ok: bool,
    ) -> Result<(), String> {
        let now = self.queue.now();
        let process = &mut self.procs[pid as usize];
        let Some(waiting) = process.cache.waiting.get_mut(&run) else {
            return Ok(());
        };
        waiting.needs.remove(object);
        if ok && !waiting.needs.is_empty() {
            return Ok(());
        }
        let Some(waiting) = process.cache.waiting.remove(&run) else {
            return Ok(());
        };
        // A run killed, handed back or replaced while it waited has nothing left to start.
        let current = process
            .machine
            .run_of(waiting.task_id)
            .is_some_and(|(_, _, r)| r == run);
        if !current {
            return Ok(());
        }
        if !ok {
            self.ledger.fetches.counts.attempts_failed += 1;
            let end = StatusUpdate {
                task_id: waiting.task_id,
                attempt: waiting.attempt,
                state: TaskState::Failed,
                result: None,
                error: Some(fetch_error(object)),
                result_object: None,
                no_retry: false,
            };
            process.machine.finish(run, end);
            return Ok(());
        }
        let task_id = waiting.task_id;
        self.ledger
            .fetches
            .work_started(pid, task_id, &waiting.objects, now)?;
        let done = Event::TaskDone {
            pid,
            run,
            task_id,
            attempt: waiting.attempt,
            ok: waiting.ok,
        };
        self.queue.after(waiting.run_for, done);
        Ok(())
    }
}
