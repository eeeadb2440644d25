//! Placement on the driver's side: constraints on executor attributes, and locality
//! preferences with delay scheduling (Spark's `TaskSetManager.getAllowedLocalityLevel`).
//!
//! A job with a placement holds, for each registered executor, whether it meets the job's
//! constraints and whether it is one the job prefers; both are worked out once, when the job is
//! submitted (for the executors registered then) and when an executor registers (for the jobs
//! running then), so an offer looks them up rather than reads attributes. A job without a
//! placement holds none, and an offer pays one branch for it.
//!
//! Delay scheduling, with one level of locality (a preferred executor, host or site, then any): an
//! executor the job does not prefer gets none of its tasks until `locality_wait_ms` has passed
//! since the job last launched a task on a preferred one (or since it was submitted, or
//! restored by a new driver). Then it takes any executor, until a task launches on a preferred
//! one again and the wait starts over. A job whose preferred executors are none of them live
//! (registered, meeting its constraints, not draining) does not wait. Nothing but offers ends a
//! wait: the driver's revive tick (`--revive-interval`, 1s) makes a round of offers, so tasks
//! that waited take other executors within one revive interval of the wait's end, as in Spark.

use super::{Core, ExecutorData, Job};
use crate::ids::{ExecutorId, JobId};
use crate::placement::{Constraint, Placement, SITE};
use std::collections::{BTreeSet, HashSet};

/// A job's placement, parsed, and its verdicts on the registered executors.
#[derive(Debug, Clone)]
pub struct JobPlacement {
    /// As submitted, for the journal and the job's summary.
    pub wire: Placement,
    constraints: Vec<Constraint>,
    prefer_executors: BTreeSet<ExecutorId>,
    prefer_hosts: BTreeSet<String>,
    prefer_sites: BTreeSet<String>,
    wait_ms: u64,
    /// When the job last launched a task on a preferred executor, was submitted or restored.
    last_preferred_ms: u64,
    /// Executors that meet the constraints (kept only when there are constraints). Those that
    /// left may linger: offers and reasons only ask about registered ones.
    meets: HashSet<ExecutorId>,
    /// Executors that meet the constraints and that the job prefers.
    preferred: HashSet<ExecutorId>,
    /// Set by the driver, not submitted: the executor that produced the job's largest input
    /// (see `prefer_inputs`). Left out of the job's submission and summary.
    pub from_inputs: bool,
}

impl JobPlacement {
    /// The placement of a job submitted (or restored) at `now`; none if `wire` sets nothing.
    /// `wire` has been validated: a constraint that does not parse is left out.
    pub fn new(wire: Placement, now: u64) -> Option<Box<Self>> {
        if wire.is_empty() {
            return None;
        }
        let constraints = wire.validate().unwrap_or_default();
        Some(Box::new(Self {
            constraints,
            prefer_executors: wire.prefer_executors.iter().cloned().collect(),
            prefer_hosts: wire.prefer_hosts.iter().cloned().collect(),
            prefer_sites: wire.prefer_sites.iter().cloned().collect(),
            wait_ms: wire.locality_wait_ms(),
            last_preferred_ms: now,
            meets: HashSet::new(),
            preferred: HashSet::new(),
            from_inputs: false,
            wire,
        }))
    }

    /// Works out whether executor `id` meets the constraints and is preferred.
    fn consider(&mut self, id: &ExecutorId, data: &ExecutorData) {
        let meets = self
            .constraints
            .iter()
            .all(|c| c.holds(&data.info.attributes));
        if !self.constraints.is_empty() {
            set(&mut self.meets, id, meets);
        }
        let site = || data.info.attributes.get(SITE);
        let preferred = meets
            && (self.prefer_executors.contains(id)
                || self.prefer_hosts.contains(&data.info.host)
                || site().is_some_and(|site| self.prefer_sites.contains(site)));
        set(&mut self.preferred, id, preferred);
    }

    /// Whether registered executor `id` meets the job's constraints.
    pub fn admits(&self, id: &ExecutorId) -> bool {
        self.constraints.is_empty() || self.meets.contains(id)
    }

    /// Whether the job has constraints (a preference alone admits every executor).
    pub fn constrains(&self) -> bool {
        !self.constraints.is_empty()
    }

    /// Notes a launch on `id` at `now`: on a preferred executor, the locality wait starts over.
    pub fn launched(&mut self, id: &ExecutorId, now: u64) {
        if self.preferred.contains(id) {
            self.last_preferred_ms = now;
        }
    }
}

fn set(set: &mut HashSet<ExecutorId>, id: &ExecutorId, member: bool) {
    if member {
        set.insert(id.clone());
    } else {
        set.remove(id);
    }
}

impl Core {
    /// Works out job `job_id`'s verdicts on every registered executor: after it is submitted.
    pub(super) fn placement_job_added(&mut self, job_id: JobId) {
        let Some(placement) = self
            .jobs
            .get_mut(&job_id)
            .and_then(|j| j.placement.as_mut())
        else {
            return;
        };
        for (id, data) in &self.executors {
            placement.consider(id, data);
        }
    }

    /// Works out every running job's verdict on executor `id`: after it registers.
    pub(super) fn placement_executor_added(&mut self, id: &ExecutorId) {
        let Some(data) = self.executors.get(id) else {
            return;
        };
        for job in self.jobs.values_mut().filter(|j| j.is_active()) {
            if let Some(placement) = job.placement.as_mut() {
                placement.consider(id, data);
            }
        }
    }

    /// Starts every running job's locality wait over at `now`: a restored driver's jobs wait
    /// for their preferred executors to register again, as they did when they were submitted.
    pub(super) fn placement_resumed(&mut self, now: u64) {
        for job in self.jobs.values_mut().filter(|j| j.is_active()) {
            if let Some(placement) = job.placement.as_mut() {
                placement.last_preferred_ms = now;
            }
        }
    }

    /// Whether `placement` lets executor `id` take a task at `now`: it meets the constraints,
    /// and it is preferred, or the locality wait is over or not needed.
    pub(super) fn placement_allows(
        &self,
        placement: &JobPlacement,
        id: &ExecutorId,
        now: u64,
    ) -> bool {
        if !placement.admits(id) {
            return false;
        }
        if placement.wait_ms == 0
            || placement.preferred.contains(id)
            || now
                >= placement
                    .last_preferred_ms
                    .saturating_add(placement.wait_ms)
        {
            return true;
        }
        // Waits only for a preferred executor that may yet take a task.
        !placement
            .preferred
            .iter()
            .any(|p| self.executors.get(p).is_some_and(|e| !e.decommissioning))
    }

    /// Why `job`'s tasks wait because of its constraints: no live executor meets them, or
    /// none that does has the cores and resources a task needs. None if one does, if the job
    /// has no constraints, or if no executor is registered at all.
    pub(super) fn placement_waiting(&self, job: &Job) -> Option<String> {
        let placement = job.placement.as_ref()?;
        if placement.constraints.is_empty() {
            return None;
        }
        let live = self.executors.iter().filter(|(_, e)| !e.decommissioning);
        live.clone().next()?;
        let all = || {
            placement
                .constraints
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut meeting = live
            .filter(|(id, _)| placement.meets.contains(id))
            .peekable();
        if meeting.peek().is_some() {
            let room = |e: &ExecutorData| {
                e.info.total_cores >= job.cpus_per_task
                    && job
                        .resources
                        .iter()
                        .all(|(name, count)| e.resources.total(name) >= *count)
            };
            if meeting.any(|(_, e)| room(e)) {
                return None;
            }
            let mut need = crate::text::count(job.cpus_per_task, "core", "cores");
            if !job.resources.is_empty() {
                need = format!("{need}, {}", crate::resources::show_request(&job.resources));
            }
            return Some(format!(
                "no live executor that meets {} has {need} for a task",
                all()
            ));
        }
        let unmet = placement.constraints.iter().find(|c| {
            !self
                .executors
                .values()
                .any(|e| !e.decommissioning && c.holds(&e.info.attributes))
        });
        Some(match unmet {
            Some(c) => format!("no live executor meets {c}"),
            None => format!("no live executor meets {} together", all()),
        })
    }
}
