//! One job's task records, kept only for the tasks that have been launched: a task that has
//! never run is implied by its index, so a job's memory grows with what it launches, not with
//! how many tasks it was submitted with.

use crate::ids::ExecutorId;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Where one task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    Pending,
    Running,
    Finished,
    Failed,
    Killed,
}

/// One task's record; kept small because a job may hold millions.
#[derive(Debug, Clone)]
pub struct TaskRecord {
    pub status: TaskStatus,
    /// Attempts launched so far; the current attempt is `attempts - 1`.
    pub attempts: u32,
    pub failures: u32,
    /// Whether the last attempt ended FAILED (its retry should prefer another executor).
    pub last_failed: bool,
    /// Whether a kill without retry was asked for the running attempt: its end, unless
    /// FINISHED, ends the task KILLED.
    pub kill_requested: bool,
    /// Whether the running attempt was stopped for its job's attempt timeout: its end, unless
    /// FINISHED, is a failure that says so.
    pub timed_out: bool,
    /// Where the current (or last) attempt ran.
    pub executor: Option<ExecutorId>,
    pub started_ms: u64,
    /// How long the last attempt ran, in ms, once it ended ([`NO_DURATION`] before); a `u32`
    /// that fits in the record's padding.
    pub duration_ms: u32,
}

/// How far past the frontier an adopted task may be (see [`Tasks::take_waiting`]).
pub const ADOPT_AHEAD: u32 = 1 << 16;

/// The `duration_ms` of a task whose attempt has not ended (or was not launched here).
pub const NO_DURATION: u32 = u32::MAX;

impl TaskRecord {
    const fn never_run(status: TaskStatus) -> Self {
        TaskRecord {
            status,
            attempts: 0,
            failures: 0,
            last_failed: false,
            kill_requested: false,
            timed_out: false,
            executor: None,
            started_ms: 0,
            duration_ms: NO_DURATION,
        }
    }
}

/// A task that has never run, while its job waits for it or after the job ended without it.
static NEVER_RUN: TaskRecord = TaskRecord::never_run(TaskStatus::Pending);
static NEVER_RUN_KILLED: TaskRecord = TaskRecord::never_run(TaskStatus::Killed);

/// Which waiting task an offer takes: see [`Tasks::find_waiting`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// The one at this position of the tasks waiting to run again.
    Again(usize),
    /// The next task that has never run.
    Fresh,
}

/// The records of a job's tasks. Tasks `0..frontier` have records; the rest have never run and
/// are all alike, but for those killed by request before they ran. Tasks wait in two lines:
/// those below the frontier that must run again (retries, and those a restarted driver found
/// unfinished) first, then the never-run ones in index order. Retries of a job with a backoff
/// rest, in neither line, until the core wakes them.
#[derive(Debug)]
pub struct Tasks {
    launched: Vec<TaskRecord>,
    count: u32,
    /// Tasks below the frontier waiting to run again, the next one first.
    again: VecDeque<u32>,
    /// Whether the never-run tasks still wait (until the job ends without them).
    open: bool,
    /// Tasks past the frontier killed by request before they ran (empty unless a task was):
    /// they get a KILLED record when the frontier reaches them.
    skipped: BTreeSet<u32>,
    /// Tasks below the frontier waiting out a retry backoff (`Pending`, in no line), each with
    /// the time its wait ends.
    resting: BTreeMap<u32, u64>,
}

impl Tasks {
    /// `count` tasks, none of them run yet.
    pub fn new(count: u32) -> Self {
        Tasks {
            launched: Vec::new(),
            count,
            again: VecDeque::new(),
            open: true,
            skipped: BTreeSet::new(),
            resting: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> u32 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// How many tasks wait out a retry backoff.
    pub fn resting(&self) -> u32 {
        self.resting.len() as u32
    }

    /// The resting tasks, each with the time its wait ends.
    pub fn resting_until(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.resting.iter().map(|(index, until)| (*index, *until))
    }

    /// How many tasks wait for cores.
    pub fn waiting(&self) -> u32 {
        self.again.len() as u32 + self.never_run()
    }

    pub fn has_waiting(&self) -> bool {
        self.waiting() > 0
    }

    /// The records of the tasks that have run (or that a replay named), in index order.
    pub fn launched(&self) -> &[TaskRecord] {
        &self.launched
    }

    /// Every task's record, in index order.
    pub fn iter(&self) -> impl Iterator<Item = &TaskRecord> {
        let frontier = self.launched.len() as u32;
        self.launched
            .iter()
            .chain((frontier..self.count).map(|index| self.unlaunched_at(index)))
    }

    /// The waiting tasks in the order offers take them, the first `lookahead` at most.
    pub fn waiting_order(&self, lookahead: usize) -> impl Iterator<Item = u32> + '_ {
        let frontier = self.launched.len() as u32;
        let fresh = (frontier..self.count)
            .filter(|index| !self.skipped.contains(index))
            .take(self.never_run() as usize);
        self.again.iter().copied().chain(fresh).take(lookahead)
    }

    /// The tasks waiting to run again, the next one first.
    pub fn again(&self) -> impl Iterator<Item = u32> + '_ {
        self.again.iter().copied()
    }

    /// The next task that has never run, if one waits.
    pub fn next_fresh(&self) -> Option<u32> {
        let frontier = self.launched.len() as u32;
        (self.never_run() > 0)
            .then(|| (frontier..self.count).find(|index| !self.skipped.contains(index)))
            .flatten()
    }

    /// The tasks killed by request before they ran, past the frontier.
    pub fn skipped(&self) -> impl Iterator<Item = u32> + '_ {
        self.skipped.iter().copied()
    }

    /// Takes waiting task `index` out of the waiting lines and marks it KILLED; false if it
    /// does not wait (it runs, or has ended). Past the frontier no record is made: a job of
    /// millions of tasks may have its last one killed.
    pub fn kill_waiting(&mut self, index: u32) -> bool {
        let frontier = self.launched.len() as u32;
        if index >= self.count {
            return false;
        }
        if index >= frontier {
            return self.open && self.skipped.insert(index);
        }
        let record = &mut self.launched[index as usize];
        if record.status != TaskStatus::Pending {
            return false;
        }
        record.status = TaskStatus::Killed;
        if let Some(position) = self.again.iter().position(|i| *i == index) {
            self.again.remove(position);
        }
        self.resting.remove(&index);
        true
    }

    /// Takes the waiting tasks of `wanted` out of the waiting lines to run now, whichever line
    /// each is in (attempts adopted rather than offered), in one pass over the line of tasks
    /// to run again; returns those taken, in index order. A task that does not wait is not
    /// taken, nor one more than [`ADOPT_AHEAD`] past the frontier: the records up to it would
    /// come into being, and no earlier leader ran that far ahead of what it stored.
    pub fn take_waiting(&mut self, wanted: BTreeSet<u32>) -> Vec<u32> {
        let frontier = self.launched.len() as u32;
        let waits = |tasks: &Self, index: u32| {
            index < tasks.count
                && index < frontier.saturating_add(ADOPT_AHEAD)
                && tasks[index].status == TaskStatus::Pending
        };
        let wanted: BTreeSet<u32> = wanted.into_iter().filter(|i| waits(self, *i)).collect();
        let mut taken = Vec::with_capacity(wanted.len());
        let before = self.again.len();
        self.again.retain(|index| match wanted.contains(index) {
            true => {
                taken.push(*index);
                false
            }
            false => true,
        });
        debug_assert_eq!(before - self.again.len(), taken.len());
        for index in wanted.range(..frontier) {
            if self.resting.remove(index).is_some() {
                taken.push(*index);
            }
        }
        // In index order, so each one past the frontier comes into being as itself, not as
        // one that waits on before a later one.
        for index in wanted.range(frontier..) {
            let _ = &mut self[*index];
            taken.push(*index);
        }
        taken.sort_unstable();
        taken
    }

    /// The first of the next `lookahead` waiting tasks that `usable` accepts. A never-run task
    /// is always accepted, so only tasks that must run again are asked about.
    pub fn find_waiting(
        &self,
        lookahead: usize,
        mut usable: impl FnMut(u32, &TaskRecord) -> bool,
    ) -> Option<Pick> {
        let again = self.again.iter().take(lookahead);
        if let Some(position) = again
            .clone()
            .position(|index| usable(*index, &self.launched[*index as usize]))
        {
            return Some(Pick::Again(position));
        }
        (again.len() < lookahead && self.never_run() > 0).then_some(Pick::Fresh)
    }

    /// Takes the task `pick` names out of the waiting lines; its record exists from now on.
    pub fn take(&mut self, pick: Pick) -> Option<u32> {
        match pick {
            Pick::Again(position) => self.again.remove(position),
            Pick::Fresh if self.never_run() > 0 => {
                // Tasks killed before they ran are passed over, each given its record.
                while self.skipped.first() == Some(&(self.launched.len() as u32)) {
                    self.skipped.pop_first();
                    self.launched.push(NEVER_RUN_KILLED.clone());
                }
                self.launched.push(NEVER_RUN.clone());
                Some(self.launched.len() as u32 - 1)
            }
            Pick::Fresh => None,
        }
    }

    /// Puts task `index` (below the frontier) first in line to run again.
    pub fn wait_again(&mut self, index: u32) {
        self.again.push_front(index);
    }

    /// Sets task `index` (below the frontier, `Pending`) aside until `until`, when
    /// [`Tasks::wake`] lines it up.
    pub fn rest(&mut self, index: u32, until: u64) {
        debug_assert_eq!(self.launched[index as usize].status, TaskStatus::Pending);
        self.resting.insert(index, until);
    }

    /// Puts task `index`, resting until `until`, first in line to run again; false if it does
    /// not rest until then (it was killed, adopted, rests for a later failure, or its job
    /// ended).
    pub fn wake(&mut self, index: u32, until: u64) -> bool {
        if self.resting.get(&index) != Some(&until) {
            return false;
        }
        self.resting.remove(&index);
        self.wait_again(index);
        true
    }

    /// Ends the waiting: every waiting task is KILLED, resting ones too. Returns how many
    /// there were.
    pub fn close(&mut self) -> u32 {
        let waiting = self.waiting() + self.resting();
        for index in std::mem::take(&mut self.again)
            .into_iter()
            .chain(std::mem::take(&mut self.resting).into_keys())
        {
            self.launched[index as usize].status = TaskStatus::Killed;
        }
        self.open = false;
        waiting
    }

    /// Lines up again, in index order, the tasks below the frontier that are `Pending` (as a
    /// replay leaves those it found unfinished), but those that rest (a replayed retry
    /// backoff). Returns how many tasks wait in all.
    pub fn requeue_pending(&mut self) -> u32 {
        let pending =
            |tasks: &Self, index: u32| tasks.launched[index as usize].status == TaskStatus::Pending;
        let resting = std::mem::take(&mut self.resting);
        self.resting = resting
            .into_iter()
            .filter(|(i, _)| pending(self, *i))
            .collect();
        self.again = (0..self.launched.len() as u32)
            .filter(|index| pending(self, *index) && !self.resting.contains_key(index))
            .collect();
        self.waiting()
    }

    fn never_run(&self) -> u32 {
        if self.open {
            self.count - self.launched.len() as u32 - self.skipped.len() as u32
        } else {
            0
        }
    }

    /// The record of task `index`, past the frontier.
    fn unlaunched_at(&self, index: u32) -> &'static TaskRecord {
        if !self.skipped.is_empty() && self.skipped.contains(&index) {
            &NEVER_RUN_KILLED
        } else {
            self.unlaunched()
        }
    }

    fn unlaunched(&self) -> &'static TaskRecord {
        if self.open {
            &NEVER_RUN
        } else {
            &NEVER_RUN_KILLED
        }
    }
}

impl std::ops::Index<u32> for Tasks {
    type Output = TaskRecord;

    fn index(&self, index: u32) -> &TaskRecord {
        assert!(index < self.count, "task {index} of {}", self.count);
        self.launched
            .get(index as usize)
            .unwrap_or_else(|| self.unlaunched_at(index))
    }
}

/// A record past the frontier comes into being with the ones before it, as never-run records
/// still waiting (a replay names tasks in any order); the caller then changes it.
impl std::ops::IndexMut<u32> for Tasks {
    fn index_mut(&mut self, index: u32) -> &mut TaskRecord {
        assert!(index < self.count, "task {index} of {}", self.count);
        while self.launched.len() <= index as usize {
            let added = self.launched.len() as u32;
            let skipped = !self.skipped.is_empty() && self.skipped.remove(&added);
            self.launched.push(self.unlaunched_at(added).clone());
            if skipped {
                self.launched[added as usize].status = TaskStatus::Killed;
            } else if self.open && added < index {
                self.again.push_back(added);
            }
        }
        &mut self.launched[index as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take_all(tasks: &mut Tasks) -> Vec<u32> {
        std::iter::from_fn(|| {
            let pick = tasks.find_waiting(8, |_, _| true)?;
            tasks.take(pick)
        })
        .collect()
    }

    #[test]
    fn a_large_job_holds_no_record_until_a_task_runs() {
        let mut tasks = Tasks::new(10_000_000);
        assert_eq!(tasks.launched().len(), 0);
        assert_eq!(tasks.waiting(), 10_000_000);
        assert_eq!(tasks[9_999_999].status, TaskStatus::Pending);
        let pick = tasks.find_waiting(8, |_, _| false).unwrap();
        assert_eq!(tasks.take(pick), Some(0));
        assert_eq!(tasks.launched().len(), 1);
        assert_eq!(tasks.waiting(), 9_999_999);
    }

    #[test]
    fn retries_go_first_then_never_run_tasks_in_order() {
        let mut tasks = Tasks::new(5);
        for _ in 0..3 {
            let pick = tasks.find_waiting(8, |_, _| true).unwrap();
            let index = tasks.take(pick).unwrap();
            tasks[index].status = TaskStatus::Running;
        }
        tasks[1].status = TaskStatus::Pending;
        tasks.wait_again(1);
        assert_eq!(tasks.waiting_order(8).collect::<Vec<_>>(), vec![1, 3, 4]);
        assert_eq!(take_all(&mut tasks), vec![1, 3, 4]);
        assert!(!tasks.has_waiting());
    }

    #[test]
    fn a_retry_the_offer_will_not_take_is_passed_over_within_the_lookahead() {
        let mut tasks = Tasks::new(3);
        let pick = tasks.find_waiting(8, |_, _| true).unwrap();
        tasks.take(pick);
        tasks.wait_again(0);
        assert_eq!(tasks.find_waiting(8, |_, _| false), Some(Pick::Fresh));
        assert_eq!(tasks.find_waiting(1, |_, _| false), None);
        assert_eq!(tasks.find_waiting(1, |_, _| true), Some(Pick::Again(0)));
    }

    #[test]
    fn closing_kills_every_waiting_task_without_a_record_for_each() {
        let mut tasks = Tasks::new(1_000_000);
        let pick = tasks.find_waiting(8, |_, _| true).unwrap();
        tasks.take(pick);
        tasks.wait_again(0);
        assert_eq!(tasks.close(), 1_000_000);
        assert_eq!(tasks.launched().len(), 1);
        assert_eq!(tasks[0].status, TaskStatus::Killed);
        assert_eq!(tasks[999_999].status, TaskStatus::Killed);
        assert_eq!(tasks.waiting(), 0);
        assert_eq!(tasks.find_waiting(8, |_, _| true), None);
    }

    #[test]
    fn a_task_killed_before_it_ran_is_passed_over_without_a_record_for_each() {
        let mut tasks = Tasks::new(10_000_000);
        assert!(tasks.kill_waiting(9_999_999));
        assert!(!tasks.kill_waiting(9_999_999), "killed once");
        assert!(!tasks.kill_waiting(10_000_000), "past the end");
        assert_eq!(tasks.launched().len(), 0);
        assert_eq!(tasks.waiting(), 9_999_999);
        assert_eq!(tasks[9_999_999].status, TaskStatus::Killed);
        let mut small = Tasks::new(4);
        assert!(small.kill_waiting(1));
        assert_eq!(small.waiting_order(8).collect::<Vec<_>>(), vec![0, 2, 3]);
        assert_eq!(take_all(&mut small), vec![0, 2, 3]);
        for index in [0, 2, 3] {
            small[index].status = TaskStatus::Running;
        }
        let statuses: Vec<_> = small.iter().map(|r| r.status).collect();
        assert_eq!(statuses[1], TaskStatus::Killed);
        // A task waiting to run again leaves its line.
        small[2].status = TaskStatus::Pending;
        small.wait_again(2);
        assert!(small.kill_waiting(2));
        assert!(!small.has_waiting());
        assert!(!small.kill_waiting(0), "a task that runs does not wait");
    }

    #[test]
    fn adopted_tasks_leave_either_line_and_nothing_far_past_the_frontier_comes_into_being() {
        let mut tasks = Tasks::new(10_000_000);
        let taken = take_all_of(&mut tasks, 3);
        assert_eq!(taken, [0, 1, 2]);
        tasks[1].status = TaskStatus::Pending;
        tasks.wait_again(1);
        let wanted = BTreeSet::from([1, 2, 5, 7, 9_999_999]);
        // 2 runs already; 9,999,999 is far past the frontier.
        assert_eq!(tasks.take_waiting(wanted), [1, 5, 7]);
        assert!(
            tasks.launched().len() <= 8,
            "records up to the last one taken only"
        );
        // 3, 4 and 6 came into being on the way, and wait on, first in line.
        assert_eq!(
            tasks.waiting_order(4).collect::<Vec<_>>(),
            [3, 4, 6, 8],
            "the rest wait in order"
        );
        assert_eq!(tasks.waiting(), 10_000_000 - 5, "0, 1, 2, 5 and 7 run");
    }

    fn take_all_of(tasks: &mut Tasks, n: usize) -> Vec<u32> {
        (0..n)
            .filter_map(|_| {
                let pick = tasks.find_waiting(8, |_, _| true)?;
                let index = tasks.take(pick)?;
                tasks[index].status = TaskStatus::Running;
                Some(index)
            })
            .collect()
    }

    #[test]
    fn a_replay_may_name_tasks_out_of_order_and_the_rest_wait() {
        let mut tasks = Tasks::new(6);
        tasks[3].status = TaskStatus::Finished;
        assert_eq!(tasks.launched().len(), 4);
        tasks[1].status = TaskStatus::Failed;
        assert_eq!(tasks.requeue_pending(), 4);
        assert_eq!(take_all(&mut tasks), vec![0, 2, 4, 5]);
        let statuses: Vec<_> = tasks.iter().map(|r| r.status).collect();
        assert_eq!(statuses[1], TaskStatus::Failed);
        assert_eq!(statuses[3], TaskStatus::Finished);
    }
}
