//! The ledger's side of the run invariants: what it knows of leaderships and jobs, added to
//! what [`crate::sim::runs`] keeps of each run.

use super::super::network::Pid;
use super::super::runs::Start;
use super::Ledger;
use crate::executor::machine::Run;
use crate::ids::ExecutorId;
use crate::protocol::{Adopted, TaskDescription, TaskOutcome};

impl Ledger {
    /// Run `run` of `pid` started `task`, launched by `leadership` under `term`; a broken
    /// invariant if another run has its name.
    #[allow(clippy::too_many_arguments)]
    pub fn run_started(
        &mut self,
        leadership: u32,
        pid: Pid,
        run: Run,
        task: &TaskDescription,
        term: u64,
        now: u64,
        instant: bool,
    ) -> Result<(), String> {
        let era = self.era(leadership);
        let submission = self
            .jobs
            .get(&(era, task.job_id))
            .map_or(0, |j| j.submission);
        self.runs.start(Start {
            leadership,
            era,
            key: (pid, run),
            task_id: task.task_id,
            job: (task.job_id, submission),
            attempt: task.attempt,
            term,
            now,
            instant,
        })
    }

    /// Leadership `leadership`, of term `term`, adopted `adopted` on `pid`.
    pub fn run_adopted(
        &mut self,
        leadership: u32,
        pid: Pid,
        adopted: &Adopted,
        term: u64,
    ) -> Result<(), String> {
        let era = self.era(leadership);
        let old = (adopted.task_id, adopted.attempt, adopted.term);
        self.runs
            .adopt(leadership, era, pid, old, adopted.new_attempt, term)
    }

    /// Checks the outcomes a leader of `leadership` gives for a job's tasks.
    pub fn check_results<'a>(
        &self,
        leadership: u32,
        outcomes: impl IntoIterator<Item = &'a TaskOutcome>,
        pid_of: impl Fn(&ExecutorId) -> Option<Pid>,
    ) -> Result<(), String> {
        let era = self.era(leadership);
        outcomes
            .into_iter()
            .try_for_each(|o| self.runs.check_result(era, o, &pid_of))
    }

    /// At the end of a run: no failover alone started a second run of a task (see
    /// [`Runs::check_suspects`]); a job counts as stored if the client was told it was
    /// accepted.
    pub fn check_runs(&self) -> Result<(), String> {
        self.runs.check_suspects(|(job_id, submission)| {
            let job = self.jobs.get(&(self.era(self.leadership), job_id));
            job.is_some_and(|j| j.submission == submission && j.accepted)
        })
    }
}
