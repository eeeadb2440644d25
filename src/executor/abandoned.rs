//! Handlers the executor has given up on: asked to stop, one that has not returned within
//! [`KILL_GRACE`] is abandoned. Its end goes to the driver as KILLED, so its task or job moves
//! on, but its thread cannot be forced to stop, so its cores stay busy until it returns.
//!
//! Why the heartbeat carries them, rather than the attempt running on in the driver's eyes:
//! an attempt that never ends would hold its job open forever, which is what abandoning is
//! for. The driver frees an attempt's cores when its end arrives, so each heartbeat lists the
//! abandoned attempts and their cores, which the driver keeps out of its offers until a
//! heartbeat no longer lists them. The KILLED end waits until a heartbeat that lists the
//! attempt has been answered: the driver then knows the cores stay busy before it hears that
//! the attempt ended, and never offers them in between.

use super::command::KILL_GRACE;
use super::machine::Run;
use crate::ids::TaskId;
use crate::protocol::{AbandonedAttempt, StatusUpdate, TaskState};
use std::collections::VecDeque;

/// The grace, in the machine's milliseconds.
const GRACE_MS: u64 = KILL_GRACE.as_millis() as u64;

/// One abandoned attempt.
struct Entry {
    task_id: TaskId,
    attempt: u32,
    run: Run,
    cpus: u32,
    /// Listed in the heartbeat last sent.
    listed: bool,
    /// Its KILLED end, until a heartbeat that listed it has been answered; `None` once it
    /// has gone to the status queue (or is owed to no driver).
    end: Option<StatusUpdate>,
}

/// Handlers asked to stop, and those abandoned.
#[derive(Default)]
pub(super) struct Abandoned {
    /// Kills of work that may ignore them, oldest first: when each is abandoned, if still
    /// running then. The grace is the same for all, so they come due in this order.
    stopping: VecDeque<(u64, TaskId, Run)>,
    entries: Vec<Entry>,
}

impl Abandoned {
    /// Run `run` of `task_id` was asked to stop at `now`.
    pub fn asked(&mut self, task_id: TaskId, run: Run, now: u64) {
        self.stopping.push_back((now + GRACE_MS, task_id, run));
    }

    /// When the oldest stop asked is due.
    pub fn due(&self) -> Option<u64> {
        self.stopping.front().map(|(at, ..)| *at)
    }

    /// The stops due by `now`: each run, if it still holds its task's slot, is to be
    /// abandoned.
    pub fn overdue(&mut self, now: u64) -> Vec<(TaskId, Run)> {
        let mut due = Vec::new();
        while let Some(&(at, task_id, run)) = self.stopping.front() {
            if at > now {
                break;
            }
            self.stopping.pop_front();
            due.push((task_id, run));
        }
        due
    }

    /// Abandons run `run` of `attempt` of `task_id`, which holds `cpus` cores: `end` goes
    /// once the driver has heard its cores stay busy; none is owed when `end` is `None`.
    pub fn add(
        &mut self,
        (task_id, attempt, run): (TaskId, u32, Run),
        cpus: u32,
        end: Option<StatusUpdate>,
    ) {
        self.entries.push(Entry {
            task_id,
            attempt,
            run,
            cpus,
            listed: false,
            end,
        });
    }

    /// What a heartbeat lists: every abandoned attempt, each marked as listed.
    pub fn list(&mut self) -> Vec<AbandonedAttempt> {
        self.entries
            .iter_mut()
            .map(|entry| {
                entry.listed = true;
                AbandonedAttempt {
                    task_id: entry.task_id,
                    attempt: entry.attempt,
                    cpus: entry.cpus,
                }
            })
            .collect()
    }

    /// The driver answered the heartbeat last sent: the ends of the attempts it listed may go.
    pub fn heard(&mut self) -> Vec<StatusUpdate> {
        self.entries
            .iter_mut()
            .filter(|entry| entry.listed)
            .filter_map(|entry| entry.end.take())
            .collect()
    }

    /// Another driver leads: no end is owed to it (it did not adopt these attempts), but it
    /// learns of their cores from the heartbeats.
    pub fn forget_ends(&mut self) {
        for entry in &mut self.entries {
            entry.end = None;
        }
    }

    /// Run `run` has returned: if it was abandoned, the cores it held, and its end if the
    /// driver has not had it yet.
    pub fn returned(&mut self, run: Run) -> Option<(u32, Option<StatusUpdate>)> {
        let at = self.entries.iter().position(|entry| entry.run == run)?;
        let entry = self.entries.swap_remove(at);
        Some((entry.cpus, entry.end))
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The end of an abandoned attempt: KILLED, saying why its cores stay busy.
pub(super) fn abandoned_status(task_id: TaskId, attempt: u32, cpus: u32) -> StatusUpdate {
    let cores = match cpus {
        1 => "its core stays".to_string(),
        n => format!("its {n} cores stay"),
    };
    StatusUpdate {
        task_id,
        attempt,
        state: TaskState::Killed,
        result: None,
        error: Some(format!(
            "stopped by request: the handler did not return within {}s of being asked to stop; \
             it is abandoned, and {cores} busy until it returns",
            KILL_GRACE.as_secs()
        )),
        result_object: None,
        no_retry: false,
    }
}
