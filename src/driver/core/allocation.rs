//! Dynamic allocation: how many executors the driver wants, by the policy of Spark's
//! `ExecutorAllocationManager`. Tasks that have waited for `backlog_timeout` raise the target
//! by 1, then 2, 4, ... each further `backlog_timeout` they keep waiting, up to what the tasks
//! waiting and running need at the cores per executor seen; once fewer are needed, the target
//! drops to that at once. The target stays between `min_executors` and `max_executors`.
//! Executors idle for `idle_timeout` become candidates to release, never so many that fewer
//! than the target would stay. The core only computes and publishes this; whoever runs the
//! executors acts on it (`ember up --autoscale`, a script, Kubernetes), and releases one
//! through `ReleaseExecutor`, which decommissions it only if it is idle.

use super::Core;
use crate::ids::ExecutorId;
use crate::protocol::{AllocationStatus, ApiReply, Event, ExecutorMessage};
use std::time::Duration;

/// How long tasks wait before the target rises (Spark's schedulerBacklogTimeout).
pub const DEFAULT_BACKLOG_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an executor is idle before it may be released (Spark's executorIdleTimeout).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The fewest executors the target asks for.
pub const DEFAULT_MIN_EXECUTORS: u32 = 0;

/// The settings of the signal, in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocationConfig {
    pub min_executors: u32,
    pub max_executors: u32,
    pub backlog_timeout_ms: u64,
    pub idle_timeout_ms: u64,
}

/// The signal's state: the target, and when it may next rise.
#[derive(Debug, Clone)]
pub(super) struct Allocation {
    config: AllocationConfig,
    target: u64,
    /// How many the next raise adds (doubles while each raise is used in full).
    to_add: u64,
    /// Since when tasks have waited, and when the next raise is due.
    backlog_since: Option<u64>,
    add_at: Option<u64>,
    /// The cores of the largest executor registered so far (1 before any).
    cores_seen: u32,
    /// What the last look found, as the api shows it.
    status: AllocationStatus,
}

impl Allocation {
    fn new(config: AllocationConfig) -> Self {
        let target = u64::from(config.min_executors);
        Self {
            status: AllocationStatus {
                target_executors: target,
                min_executors: config.min_executors,
                max_executors: config.max_executors,
                reason: "the minimum, before any work".into(),
                ..AllocationStatus::default()
            },
            config,
            target,
            to_add: 1,
            backlog_since: None,
            add_at: None,
            cores_seen: 1,
        }
    }

    /// The target within the bounds.
    fn clamp(&self, target: u64) -> u64 {
        target.clamp(
            u64::from(self.config.min_executors),
            u64::from(self.config.max_executors),
        )
    }

    /// Spark's `addExecutors`: raises the target by `to_add`, up to `needed`, and doubles the
    /// step if it was used in full. Returns why, if the target moved.
    fn raise(&mut self, needed: u64, registered: u64) -> Option<String> {
        if self.target >= u64::from(self.config.max_executors) {
            self.to_add = 1;
            return None;
        }
        let old = self.target;
        let base = self.target.max(registered);
        self.target = self.clamp((base + self.to_add).min(needed));
        let added = self.target.saturating_sub(old);
        self.to_add = if added == self.to_add {
            self.to_add * 2
        } else {
            1
        };
        (self.target != old).then(|| format!("tasks have waited; {added} more asked for"))
    }
}

/// What the tasks ask of the executors now.
struct Demand {
    waiting: u64,
    running: u64,
    /// Cores the tasks waiting and running need.
    cores: u64,
}

impl Core {
    /// Turns the signal on with `config`.
    pub fn set_allocation(&mut self, config: AllocationConfig) {
        self.allocation = Some(Allocation::new(config));
    }

    /// Updates the target for `now`: call it often (the driver does every 100 ms). Publishes
    /// `ExecutorTarget` when the target changes.
    pub fn allocate(&mut self, now: u64) {
        let Some(mut allocation) = self.allocation.take() else {
            return;
        };
        let demand = self.demand();
        if let Some(cores) = self.executors.values().map(|e| e.info.total_cores).max() {
            allocation.cores_seen = allocation.cores_seen.max(cores);
        }
        let needed = demand.cores.div_ceil(u64::from(allocation.cores_seen));
        let registered = self.executors.len() as u64;
        let old = allocation.target;
        let reason = self.retarget(&mut allocation, &demand, needed, registered, now);
        allocation.status = AllocationStatus {
            target_executors: allocation.target,
            min_executors: allocation.config.min_executors,
            max_executors: allocation.config.max_executors,
            executors_needed: needed,
            tasks_waiting: demand.waiting,
            tasks_running: demand.running,
            cores_per_executor: allocation.cores_seen,
            backlog_since_ms: allocation.backlog_since,
            idle: self.release_candidates(&allocation, now),
            reason: reason.unwrap_or_else(|| allocation.status.reason.clone()),
        };
        if allocation.target != old {
            self.publish(Event::ExecutorTarget {
                time_ms: now,
                target_executors: allocation.target,
                previous: old,
                reason: allocation.status.reason.clone(),
            });
        }
        self.allocation = Some(allocation);
    }

    /// Spark's `updateAndSyncNumExecutorsTarget`: the new target, and why if it moved.
    fn retarget(
        &self,
        allocation: &mut Allocation,
        demand: &Demand,
        needed: u64,
        registered: u64,
        now: u64,
    ) -> Option<String> {
        let timeout = allocation.config.backlog_timeout_ms;
        if demand.waiting == 0 {
            allocation.backlog_since = None;
            allocation.add_at = None;
        } else if allocation.backlog_since.is_none() {
            allocation.backlog_since = Some(now);
            allocation.add_at = Some(now + timeout);
        }
        let floor = allocation.clamp(needed);
        if floor < allocation.target {
            allocation.target = floor;
            allocation.to_add = 1;
            return Some(format!(
                "{} tasks waiting and {} running need {needed} executors of {} cores",
                demand.waiting, demand.running, allocation.cores_seen
            ));
        }
        match allocation.add_at {
            Some(due) if now >= due => {
                allocation.add_at = Some(now + timeout);
                allocation
                    .raise(needed, registered)
                    .map(|why| format!("{} {why} (they need {needed})", demand.waiting))
            }
            _ => None,
        }
    }

    /// Executors idle for the idle timeout, longest idle first, as many as can go without
    /// leaving fewer than the target.
    fn release_candidates(&self, allocation: &Allocation, now: u64) -> Vec<ExecutorId> {
        let active = self
            .executors
            .values()
            .filter(|e| !e.decommissioning)
            .count() as u64;
        let spare = active.saturating_sub(allocation.target) as usize;
        let timeout = allocation.config.idle_timeout_ms;
        let mut idle: Vec<(u64, &ExecutorId)> = self
            .executors
            .iter()
            .filter(|(_, e)| !e.decommissioning && e.running.is_empty())
            .filter(|(_, e)| now.saturating_sub(e.idle_since_ms) >= timeout)
            .map(|(id, e)| (e.idle_since_ms, id))
            .collect();
        idle.sort();
        idle.into_iter()
            .take(spare)
            .map(|(_, id)| id.clone())
            .collect()
    }

    fn demand(&self) -> Demand {
        let mut demand = Demand {
            waiting: 0,
            running: 0,
            cores: 0,
        };
        for job in self.jobs.values().filter(|j| j.is_active()) {
            let (waiting, running) = (u64::from(job.tasks.waiting()), u64::from(job.running));
            demand.waiting += waiting;
            demand.running += running;
            demand.cores += (waiting + running) * u64::from(job.cpus_per_task);
        }
        demand
    }

    /// What the signal says now, if it is on.
    pub fn allocation(&self) -> Option<&AllocationStatus> {
        self.allocation.as_ref().map(|a| &a.status)
    }

    /// `ReleaseExecutor`: decommissions the executor if it runs nothing. It is marked as
    /// decommissioning at once, so that no task is launched on it from here on; asking again
    /// sends the decommission again (the first may have been lost).
    pub(super) fn on_release_executor(&mut self, id: ExecutorId) -> ApiReply {
        let Some(data) = self.executors.get_mut(&id) else {
            return ApiReply::Error {
                message: format!("no executor with id {id}"),
            };
        };
        if !data.running.is_empty() {
            return ApiReply::Error {
                message: format!(
                    "executor {id} runs {} tasks; only an idle executor is released",
                    data.running.len()
                ),
            };
        }
        data.decommissioning = true;
        let reason = "released: idle".to_string();
        self.send(id, ExecutorMessage::StopExecutor { reason });
        ApiReply::Stopping { executors: 1 }
    }
}
