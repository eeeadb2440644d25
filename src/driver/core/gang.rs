//! Gangs (Spark's barrier execution mode): a job whose tasks start together or not at all,
//! for work whose tasks talk to each other while they run (distributed training, MPI-style
//! programs).
//!
//! - **All at once.** An offer that reaches a gang in the order jobs are offered places all its
//!   waiting tasks on the free cores there are, or none. A gang that does not fit holds the
//!   jobs behind it back: the cores that free up gather for it, so a stream of small jobs
//!   cannot starve it (the cores it gathers stay idle meanwhile). Jobs ahead of it run as
//!   always. A gang the executors registered now could not hold even idle (some left since
//!   it was submitted) holds nothing back: it waits, saying why, and the jobs behind it run.
//! - **Fail fast.** A gang the registered executors could not hold all at once, even idle, is
//!   refused at submission (by cores and custom resources; constraints are not counted).
//! - **Together again.** When an attempt of a gang fails or is lost, its other running attempts
//!   are stopped (not counted as failures), and the gang starts again together once all its
//!   unfinished tasks are waiting. Tasks that finished keep their results.
//! - No speculative copies: a copy would be a member the others do not know.
//! - **Peers.** Each task holds one of its executor's gang ports (the resource
//!   [`GANG_PORT`], which executors register and every gang job asks for one of), and is told
//!   the `host:port` of every task started with it, in task order.

use super::Core;
use crate::ids::{ExecutorId, JobId};
use crate::protocol::{SubmitJob, TaskDescription, WaitReason};
use crate::resources::{Request, GANG_PORT};

/// A job's request of custom resources per task: a gang's tasks hold a gang port each besides.
pub(super) fn with_port(mut request: Request, gang: bool) -> Request {
    if gang {
        request.insert(GANG_PORT.to_string(), 1);
    }
    request
}

/// Why a gang is refused: it asks for speculation, or no executor set registered now could
/// hold it all at once.
pub(super) fn validate(submit: &SubmitJob) -> Result<(), String> {
    if submit.gang && submit.speculation.is_some() {
        return Err("a gang job has no speculative copies: leave out speculation".into());
    }
    Ok(())
}

/// How many tasks needing `cpus` cores and `request` an executor with `cores` cores and
/// `resources` could hold at once.
fn slots(
    cores: u32,
    cpus: u32,
    request: &crate::resources::Request,
    fit: impl Fn(&str) -> u32,
) -> u32 {
    let by_cores = cores / cpus.max(1);
    request
        .iter()
        .map(|(name, count)| fit(name) / (*count).max(1))
        .fold(by_cores, u32::min)
}

impl Core {
    /// Why a gang submission is refused though it is well formed: the executors registered
    /// could not hold all its tasks at once even if idle. None while no executor is registered
    /// (the job waits for them as any job does).
    pub(super) fn gang_refusal(&self, submit: &SubmitJob) -> Option<String> {
        if !submit.gang {
            return None;
        }
        let tasks = u64::from(submit.repeat) * submit.tasks.len() as u64;
        if let Some(key) = &submit.concurrency_key {
            let limits = self.keys.limits(key);
            let most = match (limits.max_concurrent, limits.rate) {
                (Some(n), Some(rate)) => Some(n.min(rate.count)),
                (n, rate) => n.or(rate.map(|r| r.count)),
            };
            if let Some(most) = most.filter(|most| u64::from(*most) < tasks) {
                return Some(format!(
                    "a gang of {} needs them all at once, and its concurrency key {key} lets \
                     at most {most} start together",
                    crate::text::count(tasks, "task", "tasks")
                ));
            }
        }
        if self.executors.is_empty() {
            return None;
        }
        let request = with_port(submit.resources.clone(), true);
        let capacity: u64 = self
            .executors
            .values()
            .filter(|data| !data.decommissioning)
            .map(|data| {
                let total = |name: &str| data.resources.total(name);
                u64::from(slots(
                    data.info.total_cores,
                    submit.cpus_per_task,
                    &request,
                    total,
                ))
            })
            .sum();
        let size = match submit.cpus_per_task {
            1 => String::new(),
            n => format!(" of {n} cores"),
        };
        let ports = self
            .executors
            .values()
            .any(|data| data.resources.total(GANG_PORT) > 0);
        (capacity < tasks).then(|| {
            let tasks = crate::text::count(tasks, "task", "tasks");
            match ports {
                false => format!(
                    "a gang of {tasks} needs a gang port for each task, and no executor \
                     registered reserves any (ember-executor --gang-ports)"
                ),
                true => format!(
                    "a gang of {tasks}{size} needs them all at once, and the executors \
                     registered hold at most {capacity} such tasks at once (each holds one of \
                     its executor's gang ports)"
                ),
            }
        })
    }

    /// The executors that may run tasks of gang `job`: live, not decommissioning, not excluded
    /// from it, meeting its constraints.
    fn gang_executors<'a>(
        &'a self,
        job: &'a super::Job,
    ) -> impl Iterator<Item = (&'a ExecutorId, &'a super::ExecutorData)> + 'a {
        self.executors.iter().filter(move |(id, data)| {
            !data.decommissioning
                && !self.excluded(job.id, None, id)
                && job.placement.as_ref().map_or(true, |p| p.admits(id))
        })
    }

    /// Whether the executors registered now could hold the waiting tasks of gang `job_id` at
    /// once were they idle: only such a gang holds back the jobs behind it.
    pub(super) fn gang_could_fit(&self, job_id: JobId) -> bool {
        let Some(job) = self.jobs.get(&job_id) else {
            return false;
        };
        let capacity: u64 = self
            .gang_executors(job)
            .map(|(_, data)| {
                let total = |name: &str| data.resources.total(name);
                u64::from(slots(
                    data.info.total_cores,
                    job.cpus_per_task,
                    &job.resources,
                    total,
                ))
            })
            .sum();
        capacity >= u64::from(job.tasks.waiting())
    }

    /// The executors a gang's waiting tasks would start on now, one entry per task, fullest
    /// executors first (fewer hosts for tasks that talk); none if they do not all fit.
    fn gang_plan(&self, job_id: JobId, now: u64) -> Option<Vec<ExecutorId>> {
        let job = self.jobs.get(&job_id)?;
        let wanted = job.tasks.waiting();
        if wanted == 0 {
            return None;
        }
        if let Some(key) = &job.concurrency_key {
            if self.keys.room(key, now) < wanted {
                return None;
            }
        }
        let mut room: Vec<(u32, &ExecutorId)> = self
            .gang_executors(job)
            .map(|(id, data)| {
                let free = |name: &str| data.resources.free(name);
                (
                    slots(data.free_cores, job.cpus_per_task, &job.resources, free),
                    id,
                )
            })
            .filter(|(slots, _)| *slots > 0)
            .collect();
        room.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
        let mut plan = Vec::with_capacity(wanted as usize);
        for (slots, id) in room {
            let take = slots.min(wanted - plan.len() as u32);
            plan.extend(std::iter::repeat(id.clone()).take(take as usize));
            if plan.len() as u32 == wanted {
                return Some(plan);
            }
        }
        None
    }

    /// Starts every waiting task of gang `job_id` if they all fit now: their launches, by
    /// executor. None if they do not (the gang then holds back the jobs behind it), or if
    /// attempts of it still run (they are stopped first: the gang starts whole).
    pub(super) fn launch_gang(
        &mut self,
        job_id: JobId,
        now: u64,
    ) -> Option<Vec<(ExecutorId, TaskDescription)>> {
        let job = self.jobs.get(&job_id)?;
        if job.running > 0 || job.tasks.resting() > 0 {
            self.stop_gang(job_id);
            return None;
        }
        let plan = self.gang_plan(job_id, now)?;
        // Every waiting task, in index order: the first on the fullest executor.
        let job = self.jobs.get_mut(&job_id)?;
        let mut indices = Vec::with_capacity(plan.len());
        while let Some(pick) = job.tasks.find_waiting(1, |_, _| true) {
            indices.extend(job.tasks.take(pick));
        }
        indices.sort_unstable();
        let mut launches = Vec::with_capacity(plan.len());
        for (executor, index) in plan.into_iter().zip(indices) {
            let job = self.jobs.get_mut(&job_id)?;
            if let Some(placement) = &mut job.placement {
                placement.launched(&executor, now);
            }
            let attempt = self.start_attempt(job_id, index, &executor, now);
            let description = self.hand_out(job_id, index, attempt, &executor, now)?;
            launches.push((executor, description));
        }
        if let Some(job) = self.jobs.get_mut(&job_id) {
            job.gang_stopping = false;
        }
        let peers = self.peers(&launches);
        for (_, description) in &mut launches {
            description.gang_peers = peers.clone();
        }
        Some(launches)
    }

    /// Where the tasks of a gang started together listen: `host:port` of each, in task order
    /// (the order they were launched in), from its executor's host and its gang port.
    fn peers(&self, launches: &[(ExecutorId, TaskDescription)]) -> Vec<String> {
        launches
            .iter()
            .map(|(executor, description)| {
                let host = self
                    .executors
                    .get(executor)
                    .map_or("", |data| data.info.host.as_str());
                let port = description
                    .resources
                    .get(GANG_PORT)
                    .and_then(|ports| ports.first())
                    .map_or("", String::as_str);
                crate::ids::join_host_port(host, port)
            })
            .collect()
    }

    /// Stops the running attempts of gang `job_id`, which run again with the rest of it: an
    /// attempt of it failed or was lost. Once per stop.
    pub(super) fn stop_gang(&mut self, job_id: JobId) {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        if job.gang_stopping || job.running == 0 {
            return;
        }
        job.gang_stopping = true;
        let running: Vec<(ExecutorId, u64, u32)> = job
            .tasks
            .launched()
            .iter()
            .enumerate()
            .filter(|(_, record)| {
                record.status == super::jobs::TaskStatus::Running && !record.kill_requested
            })
            .filter_map(|(index, record)| {
                let executor = record.executor.clone()?;
                Some((executor, job.first_task + index as u64, record.attempts - 1))
            })
            .collect();
        for (executor, task_id, attempt) in running {
            let reason = "another task of its gang failed or was lost; the gang runs again \
                          together";
            self.send_kill(executor, task_id, attempt, reason.into());
        }
    }

    /// Why the waiting tasks of gang `job` do not start, if it is one and they wait for cores.
    pub(super) fn gang_wait(&self, job: &super::Job, now: u64) -> Option<WaitReason> {
        if !job.gang || !job.is_active() || !job.tasks.has_waiting() {
            return None;
        }
        if job.running > 0 {
            return Some(WaitReason::GangStopping {
                running: job.running,
            });
        }
        let waiting = job.tasks.waiting();
        if self.gang_plan(job.id, now).is_some() {
            return None;
        }
        if let Some(key) = &job.concurrency_key {
            let room = self.keys.room(key, now);
            if room < waiting {
                return Some(WaitReason::NoFit {
                    message: format!(
                        "the gang of {} needs them all at once, and its concurrency key {key} \
                         lets {room} start now",
                        crate::text::count(waiting, "task", "tasks")
                    ),
                });
            }
        }
        let free: u32 = self
            .executors
            .iter()
            .filter(|(id, data)| {
                !data.decommissioning && job.placement.as_ref().map_or(true, |p| p.admits(id))
            })
            .map(|(_, data)| data.free_cores / job.cpus_per_task.max(1) * job.cpus_per_task)
            .sum();
        Some(WaitReason::GangNeeds {
            tasks: waiting,
            cores: waiting.saturating_mul(job.cpus_per_task),
            free,
        })
    }
}
