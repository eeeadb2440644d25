//! Jobs that run after other jobs (`SubmitJob.after`, `after_any`). A job that names jobs not
//! yet ended waits (`WAITING`): none of its tasks is queued, so it holds no cores and blocks no
//! other job. When the last of them ends it starts; if one it runs `after` did not succeed, it
//! ends FAILED without running anything, naming that job, and the jobs after it do the same in
//! turn. With a journal, what waits on a job is settled only once that job's end is stored
//! ([`Effect::Release`]): no job starts on an end a restarted driver might not know.
//!
//! Only jobs the driver keeps may be named, and a job can only name jobs older than itself, so
//! there are no cycles. Nothing about waiting is journaled: a restored driver works it out again
//! from the jobs' `after` lists and the states of the jobs it kept (a job that was forgotten had
//! ended, and what waited on it was settled then).

use super::{Core, Effect};
use crate::ids::JobId;
use crate::protocol::{JobState, SubmitJob};

/// The most jobs one submission may run after, `after` and `after_any` together.
pub const MAX_AFTER: usize = 1000;

/// What a job that runs after others does now.
enum Resolution {
    /// Start: every job it runs after has ended as it needs.
    Start,
    /// Wait for these, which have not ended.
    Wait(Vec<JobId>),
    /// End FAILED for this reason: one it runs after did not succeed.
    Fail(String),
}

/// The reason a job fails when `upstream`, which it runs after, ended `state` for `reason`.
fn upstream_failed(upstream: JobId, state: JobState, reason: Option<&str>) -> String {
    let because = reason.map(|r| format!(": {r}")).unwrap_or_default();
    format!("job {upstream}, which this job runs after, {state}{because}")
}

impl Core {
    /// Why a submission's `after` and `after_any` are refused: too many, or a job this driver
    /// does not keep. None if they may be.
    pub(super) fn after_refusal(&self, submit: &SubmitJob) -> Option<String> {
        let named = submit.after.len() + submit.after_any.len();
        if named > MAX_AFTER {
            return Some(format!(
                "the job runs after {named} jobs; at most {MAX_AFTER} may be named"
            ));
        }
        let unknown = submit
            .after
            .iter()
            .chain(&submit.after_any)
            .find(|id| !self.jobs.contains_key(id))?;
        Some(match *unknown < self.next_job {
            true => format!(
                "job {unknown}, which this job would run after, is no longer kept \
                 (--retain-jobs): only kept jobs may be named"
            ),
            false => format!("job {unknown}, which this job would run after, does not exist"),
        })
    }

    /// What job `job_id` does now, given the jobs it runs after; `ended` is one that has just
    /// ended, with its state and reason, which may be forgotten already.
    fn resolution(
        &self,
        job_id: JobId,
        ended: Option<(JobId, JobState, Option<&str>)>,
    ) -> Resolution {
        let Some(job) = self.jobs.get(&job_id) else {
            return Resolution::Start;
        };
        let state_of = |id: JobId| match ended {
            Some((up, state, reason)) if up == id => Some((state, reason.map(str::to_string))),
            // Ended, but its end is not known to be stored yet: as good as running.
            _ if self.unreleased.contains(&id) => Some((JobState::Running, None)),
            // Not kept: it ended before, and what waited on it was settled then.
            _ => self.jobs.get(&id).map(|up| (up.state, up.reason.clone())),
        };
        let mut waits = Vec::new();
        for &up in &job.after {
            match state_of(up) {
                Some((JobState::Succeeded, _)) | None => {}
                Some((state, _)) if !state.is_ended() => waits.push(up),
                Some((state, reason)) => {
                    return Resolution::Fail(upstream_failed(up, state, reason.as_deref()))
                }
            }
        }
        for &up in &job.after_any {
            if state_of(up).is_some_and(|(state, _)| !state.is_ended()) {
                waits.push(up);
            }
        }
        match waits.is_empty() {
            true => Resolution::Start,
            false => Resolution::Wait(waits),
        }
    }

    /// Settles job `job_id`, open and not queued (a new job, or one a job's end released):
    /// starts it, makes it wait, or fails it.
    pub(super) fn settle_waiting(
        &mut self,
        job_id: JobId,
        ended: Option<(JobId, JobState, Option<&str>)>,
        now: u64,
    ) {
        match self.mark(job_id, ended) {
            Ok(JobState::Running) => {
                self.start_queue_clock(job_id, now);
                self.prefer_inputs(job_id, now);
                self.queue_new_job(job_id);
                // Released by a job's end: every executor's cores are offered to it.
                self.offer_all |= ended.is_some();
            }
            Ok(_) => {}
            Err(reason) => self.end_job(job_id, JobState::Failed, Some(reason), now),
        }
    }

    /// A job that starts after others, submitted with no placement of its own, prefers the
    /// executor that produced the largest result stored as an object among those it runs
    /// after (which keeps it in its cache), with delay scheduling as `prefer_executors` has.
    /// Results small enough for a message go through the driver: they make no preference.
    fn prefer_inputs(&mut self, job_id: JobId, now: u64) {
        let Some(job) = self.jobs.get(&job_id) else {
            return;
        };
        if job.placement.is_some() {
            return;
        }
        // Of equal sizes, the first job's first task's, whatever order the maps hold them in.
        let produced = job
            .after
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .flat_map(|upstream| {
                upstream
                    .result_objects
                    .iter()
                    .filter_map(move |(index, object)| {
                        let record = upstream.tasks.launched().get(*index as usize)?;
                        let order = std::cmp::Reverse((upstream.id, *index));
                        Some(((object.bytes, order), record.executor.as_ref()?))
                    })
            });
        let Some((_, executor)) = produced.max_by_key(|(key, _)| *key) else {
            return;
        };
        let wire = crate::placement::Placement {
            prefer_executors: vec![executor.clone()],
            ..Default::default()
        };
        let Some(mut placement) = super::placement::JobPlacement::new(wire, now) else {
            return;
        };
        placement.from_inputs = true;
        if let Some(job) = self.jobs.get_mut(&job_id) {
            job.placement = Some(placement);
        }
        self.placement_job_added(job_id);
    }

    /// Gives job `job_id` the state its upstreams say, RUNNING or WAITING (noting it among
    /// the dependents of each job it waits for), and returns it; or, if it must fail, leaves
    /// it WAITING and returns why, for the caller to end it.
    fn mark(
        &mut self,
        job_id: JobId,
        ended: Option<(JobId, JobState, Option<&str>)>,
    ) -> Result<JobState, String> {
        let (state, waits, failure) = match self.resolution(job_id, ended) {
            Resolution::Start => (JobState::Running, Vec::new(), None),
            Resolution::Wait(waits) => (JobState::Waiting, waits, None),
            Resolution::Fail(reason) => (JobState::Waiting, Vec::new(), Some(reason)),
        };
        if let Some(job) = self.jobs.get_mut(&job_id) {
            job.state = state;
        }
        for up in waits {
            let dependents = self.dependents.entry(up).or_default();
            if !dependents.contains(&job_id) {
                dependents.push(job_id);
            }
        }
        failure.map_or(Ok(state), Err)
    }

    /// Job `job_id` has ended: the jobs waiting on it are settled now, or, with a journal,
    /// once its end is stored ([`Effect::Release`]).
    pub(super) fn release_dependents(&mut self, job_id: JobId, now: u64) {
        let Some(job) = self.jobs.get(&job_id) else {
            return;
        };
        if !self.dependents.contains_key(&job_id) {
            return;
        }
        let (state, reason) = (job.state, job.reason.clone());
        if self.config.journal {
            self.unreleased.insert(job_id);
            self.effects.push(Effect::Release {
                job_id,
                state,
                reason,
            });
            return;
        }
        self.settle_dependents(job_id, state, reason, now);
    }

    /// The shell hands back an [`Effect::Release`]: job `job_id`'s end is stored, and the jobs
    /// waiting on it start (in an offer round of every executor), wait on for others, or fail.
    pub fn release(&mut self, job_id: JobId, state: JobState, reason: Option<String>, now: u64) {
        self.unreleased.remove(&job_id);
        self.settle_dependents(job_id, state, reason, now);
        if self.take_offer_all() {
            self.make_offers(None, now);
        }
    }

    /// Whether a job started since the last call: the next offer round should offer every
    /// executor, not only the one whose status freed cores.
    pub(super) fn take_offer_all(&mut self) -> bool {
        std::mem::take(&mut self.offer_all)
    }

    /// Settles the jobs waiting on `job_id`, which ended `state` for `reason`, and so on down
    /// (one at a time, however long the chain).
    fn settle_dependents(
        &mut self,
        job_id: JobId,
        state: JobState,
        reason: Option<String>,
        now: u64,
    ) {
        self.to_release.push((job_id, state, reason));
        if self.releasing {
            return;
        }
        self.releasing = true;
        while let Some((up, state, reason)) = self.to_release.pop() {
            for dependent in self.dependents.remove(&up).unwrap_or_default() {
                let waiting = self
                    .jobs
                    .get(&dependent)
                    .is_some_and(|job| job.state == JobState::Waiting);
                if waiting {
                    self.settle_waiting(dependent, Some((up, state, reason.as_deref())), now);
                }
            }
        }
        self.releasing = false;
    }

    /// After a replay, before the queue is made: every job that runs after others and has not
    /// ended is settled again from the states of the jobs kept. Those that start run; those
    /// that wait wait; those that must fail are returned, with why, to be ended once the
    /// queue is made.
    pub(super) fn resume_waiting(&mut self) -> Vec<(JobId, String)> {
        self.dependents.clear();
        let open: Vec<JobId> = self
            .jobs
            .values()
            .filter(|job| job.is_open() && !(job.after.is_empty() && job.after_any.is_empty()))
            .map(|job| job.id)
            .collect();
        let mut failing = Vec::new();
        for job_id in open {
            if let Err(reason) = self.mark(job_id, None) {
                failing.push((job_id, reason));
            }
        }
        failing
    }

    /// The jobs a waiting job still waits for.
    pub(super) fn waits_for(&self, job_id: JobId) -> Vec<JobId> {
        match self.resolution(job_id, None) {
            Resolution::Wait(waits) => waits,
            _ => Vec::new(),
        }
    }
}
