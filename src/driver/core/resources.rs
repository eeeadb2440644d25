//! Custom resources on the driver's side (Spark's `ExecutorResourceInfo` and the resource part
//! of `TaskSchedulerImpl.resourceOfferSingleTaskSet`): which addresses of each executor's
//! resources are free, which attempt holds which, and why a job that asks for resources waits.
//!
//! Nothing here runs for a job that asks for none: the offer loop tests `Job::resources` for
//! emptiness first, and an executor without resources holds an empty list.

use super::{Core, Job};
use crate::ids::TaskId;
use crate::protocol::{JobSummary, ResourceCount, WaitReason};
use crate::resources::{Addresses, Request};
use std::collections::{BTreeMap, HashMap};

/// One executor's custom resources and who holds them.
#[derive(Debug, Clone, Default)]
pub struct ExecutorResources {
    kinds: Vec<Kind>,
    /// What each attempt holds: (kind, address indexes) pairs.
    held: HashMap<TaskId, Vec<(usize, Vec<u32>)>, crate::IdHasher>,
}

/// One resource: its addresses, and which are free.
#[derive(Debug, Clone)]
struct Kind {
    name: String,
    addresses: Vec<String>,
    /// Indexes of the free addresses, highest first, so that `pop` hands out the lowest.
    free: Vec<u32>,
}

impl ExecutorResources {
    /// All of `addresses` free; they have been validated.
    pub fn new(addresses: &Addresses) -> Self {
        let kinds = addresses
            .iter()
            .map(|(name, list)| Kind {
                name: name.clone(),
                addresses: list.clone(),
                free: (0..list.len() as u32).rev().collect(),
            })
            .collect();
        Self {
            kinds,
            held: HashMap::default(),
        }
    }

    fn kind(&self, name: &str) -> Option<&Kind> {
        self.kinds.iter().find(|k| k.name == name)
    }

    /// Whether every resource `request` asks for is free here in that number.
    pub fn fits(&self, request: &Request) -> bool {
        request.iter().all(|(name, count)| {
            self.kind(name)
                .is_some_and(|k| k.free.len() >= *count as usize)
        })
    }

    /// How many addresses of `name` are free here.
    pub fn free(&self, name: &str) -> u32 {
        self.kind(name).map_or(0, |k| k.free.len() as u32)
    }

    /// How many addresses of `name` this executor has in all.
    pub fn total(&self, name: &str) -> u32 {
        self.kind(name).map_or(0, |k| k.addresses.len() as u32)
    }

    /// Gives attempt `task_id` what `request` asks for, lowest addresses first; the caller has
    /// checked that it [`fits`](Self::fits).
    pub fn take(&mut self, task_id: TaskId, request: &Request) -> Addresses {
        let mut handed = Addresses::new();
        let mut held = Vec::with_capacity(request.len());
        for (name, count) in request {
            let Some(k) = self.kinds.iter().position(|k| &k.name == name) else {
                continue;
            };
            let kind = &mut self.kinds[k];
            let keep = kind.free.len().saturating_sub(*count as usize);
            let taken: Vec<u32> = kind.free.drain(keep..).rev().collect();
            let names = taken
                .iter()
                .map(|&i| kind.addresses[i as usize].clone())
                .collect();
            handed.insert(name.clone(), names);
            held.push((k, taken));
        }
        self.held.insert(task_id, held);
        handed
    }

    /// Frees what attempt `task_id` holds, if anything.
    pub fn give_back(&mut self, task_id: TaskId) {
        let Some(held) = self.held.remove(&task_id) else {
            return;
        };
        for (k, taken) in held {
            let free = &mut self.kinds[k].free;
            for i in taken {
                // Highest first: the position of the first index below `i`.
                let at = free.partition_point(|&f| f > i);
                free.insert(at, i);
            }
        }
    }

    /// Checks that every address is either free or held by one attempt, and returns how many
    /// of each resource each attempt holds.
    #[cfg(test)]
    pub(super) fn audit(&self) -> BTreeMap<TaskId, Request> {
        let mut holders = BTreeMap::new();
        for (k, kind) in self.kinds.iter().enumerate() {
            let mut seen = kind.free.clone();
            assert!(
                kind.free.windows(2).all(|w| w[0] > w[1]),
                "{}: free list out of order",
                kind.name
            );
            for (task_id, held) in &self.held {
                for (_, taken) in held.iter().filter(|(i, _)| *i == k) {
                    seen.extend(taken);
                    let asked: &mut Request = holders.entry(*task_id).or_default();
                    asked.insert(kind.name.clone(), taken.len() as u32);
                }
            }
            seen.sort_unstable();
            let all: Vec<u32> = (0..kind.addresses.len() as u32).collect();
            assert_eq!(seen, all, "{}: addresses lost or held twice", kind.name);
        }
        for task_id in self.held.keys() {
            holders.entry(*task_id).or_default();
        }
        holders
    }

    /// Total and free of each resource, by name.
    pub fn counts(&self) -> BTreeMap<String, ResourceCount> {
        self.kinds
            .iter()
            .map(|k| {
                let count = ResourceCount {
                    total: k.addresses.len() as u32,
                    free: k.free.len() as u32,
                };
                (k.name.clone(), count)
            })
            .collect()
    }
}

impl Core {
    /// `job`'s summary, with why its tasks wait and until when, if they do.
    pub(super) fn job_summary(&self, job: &Job, now: u64) -> JobSummary {
        let mut summary = job.summary();
        if let Some(key) = &job.concurrency_key {
            summary.key_limits = Some(self.keys.limits(key));
        }
        let mut waits = Vec::new();
        if job.state == crate::protocol::JobState::Waiting {
            summary.waits_for = self.waits_for(job.id);
            waits.push(WaitReason::After {
                jobs: summary.waits_for.clone(),
            });
        }
        waits.extend(self.waiting_reason(job));
        waits.extend(self.key_wait(job, now));
        waits.extend(self.gang_wait(job, now));
        waits.extend(Self::timed_waits(job));
        if !waits.is_empty() {
            let text: Vec<String> = waits.iter().map(ToString::to_string).collect();
            summary.waiting = Some(text.join("; "));
        }
        summary.waits = waits;
        summary
    }

    /// Why the tasks of `job` wait though some are ready to run: offers are held by the start
    /// gate, every live executor is excluded from the job after failures, or no registered
    /// executor has as many cores, or as much of a resource, as each task asks for. None if
    /// nothing holds it back (or the job does not run).
    pub(super) fn waiting_reason(&self, job: &Job) -> Option<WaitReason> {
        if !job.is_active() || !job.tasks.has_waiting() {
            return None;
        }
        if let Some(gate) = self.gate.as_ref().filter(|g| g.opened_at_ms.is_none()) {
            return Some(WaitReason::StartGate {
                registered: self.executors.len() as u64,
                required: gate.min_registered,
            });
        }
        self.fit_refusal(job)
            .map(|message| WaitReason::NoFit { message })
    }

    /// Why no executor may run the tasks of `job`, which has some waiting, if none may.
    fn fit_refusal(&self, job: &Job) -> Option<String> {
        if self.every_live_executor_excludes(job) {
            let meeting = super::exclusion::meeting_constraints(job);
            return Some(format!(
                "every live executor{meeting} is excluded from this job after failures \
                 (exclusion on failure); it fails after --exclude-unschedulable-timeout unless \
                 one may run it"
            ));
        }
        if let Some(reason) = self.placement_waiting(job) {
            return Some(reason);
        }
        let cpus = job.cpus_per_task;
        if job.resources.is_empty() {
            // More cores per task than any executor has (none registered: nothing to say).
            let largest = self.executors.values().map(|e| e.info.total_cores).max()?;
            return (largest < cpus)
                .then(|| format!("no executor has {cpus} cores; largest: {largest}"));
        }
        // Executors with the cores a task needs; "no executor" reads plainly for one core.
        let with_cores = match cpus {
            1 => "no executor".to_string(),
            n => format!("no executor with {n} cores"),
        };
        let eligible = || {
            self.executors
                .values()
                .filter(move |e| e.info.total_cores >= cpus)
        };
        for (name, count) in &job.resources {
            let largest = eligible()
                .map(|e| e.resources.total(name))
                .max()
                .unwrap_or(0);
            if largest < *count {
                let largest = match largest {
                    0 => format!("none registered has {name}"),
                    n => format!("largest: {name}={n}"),
                };
                return Some(format!("{with_cores} has {name}={count}; {largest}"));
            }
        }
        // Each resource is somewhere in that number: is it all on one executor?
        let fits_one = eligible().any(|e| {
            job.resources
                .iter()
                .all(|(name, count)| e.resources.total(name) >= *count)
        });
        (!fits_one).then(|| {
            format!(
                "{with_cores} has {} together",
                crate::resources::show_request(&job.resources)
            )
        })
    }
}
