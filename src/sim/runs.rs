//! The runs of the simulated executors, and the invariants on them. A run is one start of an
//! attempt's work on one executor process, named by the process and the machine's number for
//! it (`(pid, run)`, which results carry); it has one name `(task_id, attempt, term)` from the
//! leader that launched it, and another from each leader that adopted it.
//!
//! - a FINISHED task's result was made by a run of that task, on the process of the executor
//!   it is recorded under, and one of the run's names is the attempt it is recorded under;
//! - no two runs share a name (without the journal, within one leadership: there every term
//!   is 0 and task ids start anew with each leadership);
//! - a failover alone never starts a second run of a task whose run is alive on a connected
//!   executor: see [`Runs::check_suspects`] for what counts as connected.

use super::network::Pid;
use crate::executor::machine::Run;
use crate::ids::{ExecutorId, JobId, TaskId};
use crate::protocol::{TaskOutcome, TaskState};
use crate::FixedHasher;
use std::collections::{BTreeSet, HashMap};

/// A run, as the results name it: the process and the machine's number.
pub type RunKey = (Pid, Run);

/// A job as the client submitted it: its id and which submission (an id a lost leader gave
/// out may name another job under the next).
pub type JobKey = (JobId, u64);

/// One name of a run, and the leadership that gave it.
#[derive(Debug, Clone, Copy)]
struct Name {
    leadership: u32,
    attempt: u32,
    term: u64,
}

/// What became of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Alive,
    /// It ended: done, killed, handed back, replaced, or its process died.
    Ended,
    /// Its executor dropped it at `at` on registering with a new driver that did not adopt it.
    GivenUp {
        at: u64,
    },
}

struct Entry {
    era: u32,
    task_id: TaskId,
    job: JobKey,
    started_ms: u64,
    /// The name it started under.
    first: Name,
    /// The names adopting leaders gave it, oldest first (most runs have none).
    adopted_as: Vec<Name>,
    fate: Fate,
}

impl Entry {
    fn names(&self) -> impl Iterator<Item = &Name> {
        std::iter::once(&self.first).chain(&self.adopted_as)
    }

    /// The leadership that named it last.
    fn named_by(&self) -> u32 {
        self.adopted_as.last().unwrap_or(&self.first).leadership
    }
}

/// A run that started while an earlier leadership's run of the same task was alive or had been
/// dropped unadopted: a broken invariant unless the older run's executor was disturbed
/// between that run's start and `to_ms`, or its job was never stored.
#[derive(Debug, Clone)]
pub struct Suspect {
    pub held: RunKey,
    pub job: JobKey,
    pub task_id: TaskId,
    pub from_ms: u64,
    pub to_ms: u64,
    pub at_ms: u64,
    pub on: Pid,
    pub leadership: u32,
}

/// A run starting: who launched it, where, and under which name.
#[derive(Debug, Clone, Copy)]
pub struct Start {
    pub leadership: u32,
    pub era: u32,
    pub key: RunKey,
    pub task_id: TaskId,
    pub job: JobKey,
    pub attempt: u32,
    pub term: u64,
    pub now: u64,
    /// Done at once: it never holds a slot.
    pub instant: bool,
}

/// Every run of the simulation, and what it needs to judge them.
#[derive(Default)]
pub struct Runs {
    journal: bool,
    runs: HashMap<RunKey, Entry, FixedHasher>,
    /// Each name `(era, task_id, attempt, term)` and the run that holds it.
    names: HashMap<(u32, TaskId, u32, u64), RunKey, FixedHasher>,
    /// The runs holding a slot on each process, by task.
    alive: HashMap<Pid, Vec<(TaskId, Run)>, FixedHasher>,
    /// Per `(era, task_id)`: runs alive, and runs dropped unadopted that no run followed yet.
    open: HashMap<(u32, TaskId), Vec<RunKey>, FixedHasher>,
    /// When each process's link to the driver was disturbed: `(from, to)` in ms.
    disturbed: HashMap<Pid, Vec<(u64, u64)>, FixedHasher>,
    /// Leaderships whose driver process was stopped (their adoption wait ran out unseen).
    paused: BTreeSet<u32>,
    suspects: Vec<Suspect>,
    /// Runs adopted by a new leader.
    pub adopted: u64,
}

impl Runs {
    pub fn new(journal: bool) -> Self {
        Self {
            journal,
            ..Self::default()
        }
    }

    /// A run started; a broken invariant if its name is another run's.
    pub fn start(&mut self, s: Start) -> Result<(), String> {
        self.name(s.era, s.task_id, s.attempt, s.term, s.key)?;
        if self.journal {
            self.suspect_earlier(&s);
        }
        let fate = if s.instant { Fate::Ended } else { Fate::Alive };
        let name = Name {
            leadership: s.leadership,
            attempt: s.attempt,
            term: s.term,
        };
        let entry = Entry {
            era: s.era,
            task_id: s.task_id,
            job: s.job,
            started_ms: s.now,
            first: name,
            adopted_as: Vec::new(),
            fate,
        };
        self.runs.insert(s.key, entry);
        if !s.instant {
            self.alive
                .entry(s.key.0)
                .or_default()
                .push((s.task_id, s.key.1));
            let open = self.open.entry((s.era, s.task_id)).or_default();
            open.push(s.key);
        }
        Ok(())
    }

    /// Gives `key` the name `(task_id, attempt, term)`: a broken invariant if another run
    /// holds it.
    fn name(
        &mut self,
        era: u32,
        task_id: TaskId,
        attempt: u32,
        term: u64,
        key: RunKey,
    ) -> Result<(), String> {
        match self.names.insert((era, task_id, attempt, term), key) {
            Some(other) if other != key => Err(format!(
                "task {task_id} attempt {attempt} of term {term} names two runs: run {} on \
                 e{} and run {} on e{}",
                other.1, other.0, key.1, key.0
            )),
            _ => Ok(()),
        }
    }

    /// Before run `s` starts: each earlier leadership's run of its task that is alive, or was
    /// dropped unadopted, is a suspect (judged once the run is over, when it is known whether
    /// its executor was disturbed meanwhile). A dropped run is followed by this one from now.
    fn suspect_earlier(&mut self, s: &Start) {
        let Some(open) = self.open.get_mut(&(s.era, s.task_id)) else {
            return;
        };
        let runs = &self.runs;
        let paused = self.paused.contains(&s.leadership);
        for key in open.iter().filter(|_| !paused) {
            let Some(entry) = runs.get(key) else {
                continue;
            };
            let named_by = entry.named_by();
            let to_ms = match entry.fate {
                Fate::Alive => s.now,
                Fate::GivenUp { at } => at,
                Fate::Ended => continue,
            };
            if named_by >= s.leadership {
                continue;
            }
            self.suspects.push(Suspect {
                held: *key,
                job: entry.job,
                task_id: s.task_id,
                from_ms: entry.started_ms,
                to_ms,
                at_ms: s.now,
                on: s.key.0,
                leadership: s.leadership,
            });
        }
        open.retain(|key| runs.get(key).is_some_and(|e| e.fate == Fate::Alive));
    }

    /// A new leader adopted `(task_id, attempt, term)` on `pid` as `new_attempt` of `new_term`:
    /// a second name for the run that holds the first (none if nothing ran under it, as for a
    /// launch handed straight back); a broken invariant if another run holds the new name.
    pub fn adopt(
        &mut self,
        leadership: u32,
        era: u32,
        pid: Pid,
        old: (TaskId, u32, u64),
        new_attempt: u32,
        new_term: u64,
    ) -> Result<(), String> {
        let (task_id, attempt, term) = old;
        let Some(&key) = self.names.get(&(era, task_id, attempt, term)) else {
            return Ok(());
        };
        if key.0 != pid {
            return Err(format!(
                "e{pid} held task {task_id} attempt {attempt} of term {term}, which ran on e{}",
                key.0
            ));
        }
        self.name(era, task_id, new_attempt, new_term, key)?;
        if let Some(entry) = self.runs.get_mut(&key) {
            entry.adopted_as.push(Name {
                leadership,
                attempt: new_attempt,
                term: new_term,
            });
        }
        self.adopted += 1;
        Ok(())
    }

    /// Notes which runs of `pid` no longer hold their slot (`run_of` names the run in a task's
    /// slot): dropped unadopted if `given_up` (a registration with a new driver), else ended.
    pub fn sync(
        &mut self,
        pid: Pid,
        now: u64,
        given_up: bool,
        run_of: impl Fn(TaskId) -> Option<Run>,
    ) {
        let Some(alive) = self.alive.get_mut(&pid) else {
            return;
        };
        let runs = &mut self.runs;
        alive.retain(|&(task_id, run)| {
            if run_of(task_id) == Some(run) {
                return true;
            }
            if let Some(entry) = runs.get_mut(&(pid, run)) {
                entry.fate = match given_up {
                    true => Fate::GivenUp { at: now },
                    false => Fate::Ended,
                };
            }
            false
        });
    }

    /// Process `pid` is gone, and every run on it with it.
    pub fn process_gone(&mut self, pid: Pid, now: u64) {
        self.disturb(pid, now, u64::MAX);
        self.sync(pid, now, false, |_| None);
    }

    /// The link between `pid` and the driver was disturbed from `from` to `to` (a message lost,
    /// repeated or held up; a partition; a request unanswered; a drain).
    pub fn disturb(&mut self, pid: Pid, from: u64, to: u64) {
        self.disturbed.entry(pid).or_default().push((from, to));
    }

    /// Leadership `leadership`'s driver process was stopped.
    pub fn pause(&mut self, leadership: u32) {
        self.paused.insert(leadership);
    }

    /// Whether `pid`'s link was disturbed at any time from `from` to `to`.
    fn was_disturbed(&self, pid: Pid, from: u64, to: u64) -> bool {
        self.disturbed
            .get(&pid)
            .is_some_and(|spans| spans.iter().any(|&(a, b)| a <= to && b >= from))
    }

    /// Judges the suspects, once what disturbed each executor is known (at the end of a run):
    /// a new run of a task started by leadership L on process P at time X is a broken
    /// invariant if an earlier leadership's run R of it (never named by L or later), on
    /// process Q, was alive at X or had been dropped by Q unadopted on registering with a new
    /// driver; and Q's link to the driver was undisturbed from R's start until then: no
    /// message to or from Q lost, repeated or held up, no partition, no drain, no kill, no
    /// request of Q that timed out or was answered by a driver no longer leading; and L's
    /// driver was never stopped (its adoption wait ran out unseen); and R's job was stored
    /// (`stored`: the client was told it was accepted).
    pub fn check_suspects(&self, stored: impl Fn(JobKey) -> bool) -> Result<(), String> {
        for s in &self.suspects {
            let (q, run) = s.held;
            if self.was_disturbed(q, s.from_ms, s.to_ms) || !stored(s.job) {
                continue;
            }
            return Err(format!(
                "at {} ms leadership {} started task {} again on e{}, while its run {run} on \
                 e{q}, connected since it started at {} ms, {}",
                s.at_ms,
                s.leadership,
                s.task_id,
                s.on,
                s.from_ms,
                match s.to_ms == s.at_ms {
                    true => "still ran".to_string(),
                    false => format!("had been dropped unadopted at {} ms", s.to_ms),
                }
            ));
        }
        Ok(())
    }

    /// Checks a FINISHED task's outcome, read from a leader of `era`: its result names a run of
    /// that task, on the process of the executor it is recorded under (`pid_of`), one of whose
    /// names is the attempt it is recorded under.
    pub fn check_result(
        &self,
        era: u32,
        outcome: &TaskOutcome,
        pid_of: impl Fn(&ExecutorId) -> Option<Pid>,
    ) -> Result<(), String> {
        if outcome.state != TaskState::Finished {
            return Ok(());
        }
        let task = outcome.task_id;
        let Some((pid, run)) = outcome.result.as_ref().and_then(run_named) else {
            return Err(format!(
                "task {task} finished with a result that names no run: {:?}",
                outcome.result
            ));
        };
        let Some(entry) = self.runs.get(&(pid, run)).filter(|e| e.era == era) else {
            return Err(format!(
                "task {task} finished with the result of run {run} on e{pid}, which never ran"
            ));
        };
        if entry.task_id != task {
            return Err(format!(
                "task {task} finished with the result of run {run} on e{pid}, a run of task {}",
                entry.task_id
            ));
        }
        let recorded = outcome.executor_id.as_ref().and_then(&pid_of);
        if recorded != Some(pid) {
            return Err(format!(
                "task {task} finished on {:?} with the result of run {run} on e{pid}",
                outcome.executor_id
            ));
        }
        let attempt = outcome.attempts.checked_sub(1);
        if !entry.names().any(|n| Some(n.attempt) == attempt) {
            let names: Vec<_> = entry.names().map(|n| (n.attempt, n.term)).collect();
            return Err(format!(
                "task {task} finished as attempt {attempt:?} with the result of run {run} on \
                 e{pid}, named {names:?} (attempt, term)"
            ));
        }
        Ok(())
    }
}

/// The run a simulated result names: `[pid, run]`.
fn run_named(result: &serde_json::Value) -> Option<RunKey> {
    match result.as_array()?.as_slice() {
        [pid, run] => Some((u32::try_from(pid.as_u64()?).ok()?, run.as_u64()?)),
        _ => None,
    }
}

/// The result a simulated run makes: the run that made it.
pub fn result_of(pid: Pid, run: Run) -> serde_json::Value {
    serde_json::json!([pid, run])
}

#[cfg(test)]
#[path = "runs_tests.rs"]
mod tests;
