//! The launches an executor remembers, to know a repeated `LaunchTasks` (a message delivered
//! twice, or held up until after its run ended) from a new attempt: a repeat starts no second
//! run under the attempt's name.

use crate::ids::TaskId;
use crate::IdHasher;
use std::collections::{HashSet, VecDeque};

/// How many launches a machine remembers, to know a repeated one (a message delivered twice, or
/// held up until after its run ended) from a new attempt.
pub const REMEMBERED_LAUNCHES: usize = 1024;

/// The last [`REMEMBERED_LAUNCHES`] attempts launched, by task and attempt number: ids the
/// driver handed out, hashed cheaply; even keys chosen to collide would cost a look through
/// at most this many.
#[derive(Default)]
pub(super) struct Launched {
    order: VecDeque<(TaskId, u32)>,
    set: HashSet<(TaskId, u32), IdHasher>,
}

impl Launched {
    /// Remembers a launch of `attempt` of `task_id`; whether it is the first.
    pub(super) fn first_time(&mut self, task_id: TaskId, attempt: u32) -> bool {
        if !self.set.insert((task_id, attempt)) {
            return false;
        }
        self.order.push_back((task_id, attempt));
        if self.order.len() > REMEMBERED_LAUNCHES {
            if let Some(oldest) = self.order.pop_front() {
                self.set.remove(&oldest);
            }
        }
        true
    }
}
