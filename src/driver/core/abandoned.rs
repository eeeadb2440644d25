//! Cores held by abandoned handlers: an executor gives up on a handler that has not returned
//! within the grace of being asked to stop, reports its attempt KILLED so that its task or job
//! moves on, and lists it in every heartbeat until its thread returns. Its cores stay out of
//! the executor's `free_cores` until a heartbeat no longer lists it.
//!
//! The executor sends an attempt's KILLED end only once a heartbeat that lists it has been
//! answered, so the driver may hear of an abandoned attempt while it still counts it running.
//! Such an entry holds nothing of its own (the attempt holds its cores) until the attempt's end
//! arrives, which hands the cores to the entry instead of freeing them
//! ([`ExecutorData::attempt_ended`]).

use super::registry::ExecutorData;
use super::Core;
use crate::ids::{ExecutorId, TaskId};
use crate::protocol::{AbandonedAttempt, AbandonedStatus, RunningAttempt, MAX_ABANDONED};
use crate::FixedHasher as Fixed;
use std::collections::HashSet;

/// An abandoned attempt on an executor, as the driver keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Abandoned {
    pub task_id: TaskId,
    pub attempt: u32,
    /// The cores it holds: out of `free_cores` once `counted`.
    pub cpus: u32,
    /// When the driver first heard of it.
    pub since_ms: u64,
    /// Whether its cores are taken out of `free_cores` by this entry, rather than by the
    /// attempt the driver still counts running.
    pub counted: bool,
}

impl Abandoned {
    pub fn status(&self) -> AbandonedStatus {
        AbandonedStatus {
            task_id: self.task_id,
            attempt: self.attempt,
            cpus: self.cpus,
            since_ms: self.since_ms,
        }
    }
}

impl ExecutorData {
    /// The cores abandoned attempts hold out of `free_cores`.
    pub fn abandoned_cores(&self) -> u32 {
        self.abandoned
            .iter()
            .filter(|a| a.counted)
            .map(|a| a.cpus)
            .sum()
    }

    /// The attempt of `task_id` that runs here has ended, holding `cpus`: whether an
    /// abandoned entry takes its cores, which then stay busy.
    pub(super) fn abandoned_took(&mut self, task_id: TaskId, cpus: u32) -> bool {
        let Some(&attempt) = self.running.get(&task_id) else {
            return false;
        };
        let entry = self
            .abandoned
            .iter_mut()
            .find(|a| a.task_id == task_id && a.attempt == attempt && !a.counted);
        let Some(entry) = entry else {
            return false;
        };
        // The driver's own count of what the attempt held, not the executor's.
        entry.cpus = cpus;
        entry.counted = true;
        true
    }
}

impl Core {
    /// A heartbeat of executor `id` listed `listed` abandoned attempts (and `running`): new
    /// ones take their cores out of the offers, and those no longer listed give theirs back.
    /// A list longer than the executor's cores is refused; cores beyond what is free are
    /// clipped.
    pub(super) fn abandoned_heard(
        &mut self,
        id: &ExecutorId,
        listed: &[AbandonedAttempt],
        running: &[RunningAttempt],
        now: u64,
    ) -> Result<(), String> {
        let Some(data) = self.executors.get_mut(id) else {
            return Ok(());
        };
        // Each abandoned attempt holds a core at least (a task asks for one or more).
        let most = MAX_ABANDONED.min(data.info.total_cores as usize);
        if listed.len() > most {
            return Err(format!(
                "the heartbeat lists {} abandoned attempts; an executor of {} cores has at most {most}",
                listed.len(),
                data.info.total_cores
            ));
        }
        let before = data.free_cores;
        let key = |task_id: TaskId, attempt: u32| (task_id, attempt);
        let abandoned: HashSet<_, Fixed> =
            listed.iter().map(|a| key(a.task_id, a.attempt)).collect();
        // A heartbeat that names an attempt running was sent before it was abandoned.
        let named: HashSet<_, Fixed> = running.iter().map(|r| key(r.task_id, r.attempt)).collect();
        let (kept, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut data.abandoned)
            .into_iter()
            .partition(|a| {
                let key = key(a.task_id, a.attempt);
                abandoned.contains(&key) || named.contains(&key)
            });
        data.abandoned = kept;
        data.free_cores += gone
            .iter()
            .filter(|a| a.counted)
            .map(|a| a.cpus)
            .sum::<u32>();
        let mut known: HashSet<_, Fixed> = data
            .abandoned
            .iter()
            .map(|a| key(a.task_id, a.attempt))
            .collect();
        for new in listed {
            if !known.insert(key(new.task_id, new.attempt)) {
                continue;
            }
            let still_running = data.running.get(&new.task_id) == Some(&new.attempt);
            // No more than the executor has, nor, for cores taken now, than is free: the free
            // count never goes below zero, whatever a heartbeat says.
            let cpus = match still_running {
                true => new.cpus.min(data.info.total_cores),
                false => new.cpus.min(data.free_cores),
            };
            if !still_running {
                data.free_cores -= cpus;
            }
            data.abandoned.push(Abandoned {
                task_id: new.task_id,
                attempt: new.attempt,
                cpus,
                since_ms: now,
                counted: !still_running,
            });
        }
        if data.free_cores > before {
            self.make_offers(Some(id), now);
        }
        Ok(())
    }

    /// The abandoned attempts of executor `data`, as `ListExecutors` shows them.
    pub(super) fn abandoned_of(data: &ExecutorData) -> Vec<AbandonedStatus> {
        data.abandoned.iter().map(Abandoned::status).collect()
    }
}
