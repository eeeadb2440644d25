//! The ground truth of object fetches: every fetch that ended on an executor process, and the
//! invariants on them:
//!
//! - no attempt's work starts before every object its task names was fetched on its process
//!   (checked when the work starts);
//! - an object is fetched successfully at most once on each process (a restarted executor is a
//!   new process; checked when the run ends);
//! - a job that ended FAILED over a fetch says so in its reason, naming an object whose fetch
//!   failed.

use super::network::Pid;
use crate::ids::{JobId, TaskId};
use crate::objects::ObjectRef;
use std::collections::{BTreeMap, BTreeSet};

/// What the prefix of a fetch's error is, as the executor words it.
const FETCH_ERROR: &str = "could not fetch object ";

/// How many fetches a run made, and what they cost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Fetches started.
    pub fetches: u64,
    /// Fetches that failed.
    pub failed: u64,
    /// Times an attempt waited for a fetch another attempt had started, rather than start one.
    pub shared: u64,
    /// Attempts failed by a fetch.
    pub attempts_failed: u64,
    /// Jobs that ended FAILED over a fetch.
    pub jobs_failed: u64,
}

/// Every fetch that ended, by process and object.
#[derive(Debug, Default)]
pub struct Fetches {
    pub counts: Counts,
    /// How many times each object was fetched on each process.
    stored: BTreeMap<(Pid, ObjectRef), u32>,
    /// Objects whose fetch failed somewhere.
    failed: BTreeSet<ObjectRef>,
}

impl Fetches {
    /// A fetch of `object` on `pid` ended.
    pub fn fetched(&mut self, pid: Pid, object: &ObjectRef, ok: bool) {
        if ok {
            *self.stored.entry((pid, object.clone())).or_default() += 1;
        } else {
            self.counts.failed += 1;
            self.failed.insert(object.clone());
        }
    }

    /// The work of task `task_id`'s run on `pid`, which names `objects`, starts at `now`:
    /// each must have been fetched there.
    pub fn work_started(
        &self,
        pid: Pid,
        task_id: TaskId,
        objects: &BTreeSet<ObjectRef>,
        now: u64,
    ) -> Result<(), String> {
        match objects
            .iter()
            .find(|o| !self.stored.contains_key(&(pid, (*o).clone())))
        {
            None => Ok(()),
            Some(object) => Err(format!(
                "task {task_id} started on e{pid} at {now} ms before object {object} was \
                 fetched there"
            )),
        }
    }

    /// Job `job_id` ended FAILED with `reason`: one over a fetch names an object whose fetch
    /// failed.
    pub fn job_failed(&mut self, job_id: JobId, reason: Option<&str>) -> Result<(), String> {
        let Some(reason) = reason else {
            return Err(format!("job {job_id} failed without a reason"));
        };
        let Some((_, named)) = reason.split_once(FETCH_ERROR) else {
            return Ok(());
        };
        let object = named.get(..64).and_then(|hex| ObjectRef::parse(hex).ok());
        match object {
            Some(object) if self.failed.contains(&object) => {
                self.counts.jobs_failed += 1;
                Ok(())
            }
            _ => Err(format!(
                "job {job_id} failed over a fetch no executor failed: {reason}"
            )),
        }
    }

    /// At the end of a run: no object was fetched twice on one process.
    pub fn check(&self) -> Result<(), String> {
        match self.stored.iter().find(|(_, times)| **times > 1) {
            None => Ok(()),
            Some(((pid, object), times)) => Err(format!(
                "object {object} was fetched {times} times on e{pid}, which kept it"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_before_its_fetch_and_a_second_fetch_are_caught() {
        let (a, b) = (ObjectRef::of(b"a"), ObjectRef::of(b"b"));
        let mut fetches = Fetches::default();
        let both = BTreeSet::from([a.clone(), b.clone()]);
        fetches.fetched(1, &a, true);
        fetches.fetched(1, &b, false);
        assert!(fetches.work_started(1, 7, &both, 10).is_err());
        fetches.fetched(1, &b, true);
        assert!(fetches.work_started(1, 7, &both, 20).is_ok());
        assert!(fetches.work_started(2, 8, &both, 20).is_err());
        assert!(fetches.check().is_ok());
        fetches.fetched(1, &a, true);
        assert!(fetches.check().unwrap_err().contains("2 times on e1"));
    }

    #[test]
    fn a_job_failed_over_a_fetch_names_a_failed_one() {
        let (a, b) = (ObjectRef::of(b"a"), ObjectRef::of(b"b"));
        let mut fetches = Fetches::default();
        fetches.fetched(1, &a, false);
        let reason =
            |o: &ObjectRef| format!("task 3 failed 4 times; last error: {FETCH_ERROR}{o}: x");
        assert!(fetches.job_failed(1, Some(&reason(&a))).is_ok());
        assert!(fetches.job_failed(2, Some(&reason(&b))).is_err());
        assert!(fetches.job_failed(3, Some("task 1 failed 4 times")).is_ok());
        assert!(fetches.job_failed(4, None).is_err());
        assert_eq!(fetches.counts.jobs_failed, 1);
    }
}
