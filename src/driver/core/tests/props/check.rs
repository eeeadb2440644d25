//! The end of a random run: every attempt is finished off, then the whole history is checked.

use super::*;
use serde_json::json;

/// What the events of a run say happened, by task and by job.
#[derive(Default)]
struct History {
    /// Each task's started attempts, in order: (attempt, executor).
    starts: BTreeMap<TaskId, Vec<(u32, ExecutorId)>>,
    /// Each task's ended attempts: (attempt, executor, state).
    ends: BTreeMap<TaskId, Vec<(u32, ExecutorId, TaskState)>>,
    job_starts: BTreeMap<JobId, u32>,
    job_ends: BTreeMap<JobId, Vec<Event>>,
}

impl History {
    fn of(log: &[Effect]) -> Self {
        let mut h = History::default();
        for event in events(log) {
            match &event {
                Event::JobStart { job_id, .. } => *h.job_starts.entry(*job_id).or_default() += 1,
                Event::TaskStart { executors, .. } => {
                    names_each_executor_once(executors);
                    for (executor, t) in event.started() {
                        let started = (t.attempt, executor.clone());
                        h.starts.entry(t.task_id).or_default().push(started);
                    }
                }
                Event::TaskEnd { executors, .. } => {
                    names_each_executor_once(executors);
                    for (executor, t) in event.ended() {
                        let ended = (t.attempt, executor.clone(), t.state);
                        h.ends.entry(t.task_id).or_default().push(ended);
                    }
                }
                Event::JobEnd { job_id, .. } => {
                    h.job_ends.entry(*job_id).or_default().push(event.clone())
                }
                _ => {}
            }
        }
        h
    }
}

/// A task event names each executor once: its attempts there are in one group.
fn names_each_executor_once<T>(groups: &[ExecutorTasks<T>]) {
    let mut seen = BTreeSet::new();
    for group in groups {
        assert!(
            seen.insert(&group.executor_id),
            "executor {} named twice in one task event",
            group.executor_id
        );
        assert!(
            !group.tasks.is_empty(),
            "an empty group for {}",
            group.executor_id
        );
    }
}

impl Sim {
    /// Finishes every running attempt, round after round, until nothing runs. A job that waits
    /// with nothing running and every executor free must need more cpus per task, or GPUs with
    /// them, than any executor has (a retry never waits for cores elsewhere); it gets a fresh
    /// large executor, once.
    pub(super) fn drain(&mut self) {
        let mut extra = false;
        for _ in 0..10_000 {
            let running = running_attempts(&self.core);
            if running.is_empty() {
                self.now += 1;
                self.tick();
                check_invariants(&self.core);
                // A job that prefers a busy executor takes others after its locality wait.
                if running_attempts(&self.core).is_empty() {
                    self.now += 20;
                    self.tick();
                    check_invariants(&self.core);
                }
                if !running_attempts(&self.core).is_empty() {
                    continue;
                }
                // A gang waits while the executors together cannot hold its waiting tasks.
                let gangs_held = self
                    .core
                    .jobs
                    .values()
                    .filter(|j| j.is_active() && j.gang)
                    .all(|j| {
                        let slots: u32 = self
                            .executors
                            .iter()
                            .map(|(_, cores)| cores / j.cpus_per_task)
                            .sum();
                        slots < j.tasks.waiting()
                    });
                let waiting: Vec<(JobId, u32, u32, bool)> = self
                    .core
                    .jobs
                    .values()
                    .filter(|j| j.is_active() && !j.gang)
                    .map(|j| {
                        (
                            j.id,
                            j.cpus_per_task,
                            j.resources.get("gpu").copied().unwrap_or(0),
                            j.placement
                                .as_ref()
                                .is_some_and(|p| !p.wire.constraints.is_empty()),
                        )
                    })
                    .collect();
                let gangs_wait = self.core.jobs.values().any(|j| j.is_active() && j.gang);
                if waiting.is_empty() && !gangs_wait {
                    return;
                }
                assert!(
                    gangs_held,
                    "a gang waits though the executors could hold it"
                );
                // `on_r0`: the job runs only on rack r0.
                let fits = |cpus: u32, gpus: u32, on_r0: bool| {
                    self.executors.iter().enumerate().any(|(i, (name, cores))| {
                        *cores >= cpus
                            && self.gpus.get(name).copied().unwrap_or(0) >= gpus
                            && (!on_r0 || super::rack(i, name) == 0)
                    })
                };
                assert!(
                    waiting
                        .iter()
                        .all(|(_, cpus, gpus, on_r0)| !fits(*cpus, *gpus, *on_r0)),
                    "jobs (id, cpus, gpus per task, on r0) {waiting:?} wait though an executor \
                     that has them is free"
                );
                for (job_id, ..) in waiting
                    .iter()
                    .filter(|_| !self.executors.is_empty() && !gangs_wait)
                {
                    let why = self.core.waiting_reason(&self.core.jobs[job_id]);
                    assert!(why.is_some(), "job {job_id} waits and does not say why");
                }
                assert!(
                    !extra,
                    "jobs {waiting:?} (or a gang) wait though a large executor is free"
                );
                extra = true;
                self.register_with("drain".into(), 64, 2);
                check_invariants(&self.core);
                continue;
            }
            for (executor, task_id, attempt) in running {
                self.now += 1;
                let executor = executor.to_string();
                let update = finished_with(task_id, attempt, json!(task_id));
                assert_eq!(self.send(&executor, &executor, vec![update]), ack(1));
                self.effects();
                check_invariants(&self.core);
            }
        }
        panic!("the core did not quiesce");
    }

    /// After `drain`: every task ended exactly once, and the events say so.
    pub(super) fn check_final(&mut self) {
        for (id, e) in &self.core.executors {
            assert_eq!(e.free_cores, e.info.total_cores, "executor {id}");
            assert!(e.running.is_empty());
        }
        let history = History::of(&self.log);
        let mut sent = BTreeSet::new();
        for effect in &self.log {
            if let Effect::Send {
                to,
                message: ExecutorMessage::LaunchTasks { tasks, .. },
            } = effect
            {
                for t in tasks {
                    assert!(
                        sent.insert((t.task_id, t.attempt)),
                        "attempt launched twice"
                    );
                    assert_eq!(history.starts[&t.task_id][t.attempt as usize].1, *to);
                }
            }
        }
        let jobs: Vec<JobId> = self.core.jobs.keys().copied().collect();
        for job_id in jobs {
            self.check_job_end(&history, job_id);
            self.check_tasks(&history, job_id);
            self.check_results(job_id);
        }
    }

    /// Replaying the journal (once, or each record twice) restores the same job table: every
    /// job's summary, the outcome of every task that ended for good, and the next ids.
    pub(super) fn check_replay(&mut self) {
        // The journal as written; with every snapshot where it was taken; and as the shell
        // leaves it, purged before the last snapshot.
        let mut journals = vec![(self.journal.clone(), 2)];
        let mut with_snapshots = self.journal.clone();
        for (at, snapshot) in self.snapshots.iter().rev() {
            with_snapshots.insert(*at, snapshot.clone());
        }
        journals.push((with_snapshots, 2));
        if let Some((at, snapshot)) = self.snapshots.last() {
            let mut purged = vec![snapshot.clone()];
            purged.extend_from_slice(&self.journal[*at..]);
            journals.push((purged, 1));
        }
        for (journal, max_times) in journals {
            self.check_replay_of(&journal, max_times);
        }
    }

    fn check_replay_of(&mut self, journal: &[JournalRecord], max_times: usize) {
        for times in 1..=max_times {
            let keep = self.core.config.retention.jobs;
            let mut restored = restored_keeping(journal, times, keep);
            assert_eq!(
                (restored.next_job, restored.next_task),
                (self.core.next_job, self.core.next_task)
            );
            let jobs: Vec<JobId> = self.core.jobs.keys().copied().collect();
            assert_eq!(restored.jobs.keys().copied().collect::<Vec<_>>(), jobs);
            for job_id in jobs {
                assert_eq!(
                    summary(&mut restored, job_id),
                    summary(&mut self.core, job_id)
                );
                let len = self.core.jobs[&job_id].len();
                for index in 0..len {
                    let original = outcome(&mut self.core, job_id, index);
                    if matches!(original.state, TaskState::Finished | TaskState::Failed) {
                        // The journal keeps outcomes, not the attempts' times.
                        let times = TaskOutcome {
                            started_ms: None,
                            duration_ms: None,
                            ..original
                        };
                        assert_eq!(outcome(&mut restored, job_id, index), times);
                    }
                }
            }
        }
    }

    /// The job has ended, once, and its one `JobEnd` agrees with its records.
    fn check_job_end(&self, history: &History, job_id: JobId) {
        let job = &self.core.jobs[&job_id];
        assert!(!job.is_active(), "job {job_id} still runs");
        assert_eq!(job.running, 0);
        assert_eq!(
            job.succeeded + job.failed + job.killed,
            job.len(),
            "job {job_id}"
        );
        assert_eq!(
            history.job_starts.get(&job_id),
            Some(&1),
            "job {job_id}: JobStart count"
        );
        let end = match history.job_ends.get(&job_id).map(Vec::as_slice) {
            Some([end]) => end.clone(),
            other => panic!("job {job_id}: expected one JobEnd, got {other:?}"),
        };
        let Event::JobEnd {
            state,
            succeeded,
            failed,
            killed,
            reason,
            ..
        } = end
        else {
            unreachable!()
        };
        assert_eq!(state, job.state, "job {job_id}");
        assert_eq!(reason, job.reason, "job {job_id}");
        assert_eq!(
            succeeded + failed + killed,
            job.len(),
            "job {job_id}: JobEnd counts"
        );
        assert_eq!(failed, job.failed, "job {job_id}");
        // Tasks that were running at the end count as killed in the JobEnd; one may yet have
        // finished instead.
        assert!(succeeded <= job.succeeded, "job {job_id}");
        assert_eq!(
            succeeded + killed,
            job.succeeded + job.killed,
            "job {job_id}"
        );
        if state == JobState::Succeeded {
            assert_eq!((succeeded, failed, killed), (job.len(), 0, 0));
        }
    }

    /// Attempts 0, 1, ... of each task each started once and ended once, on the same executor,
    /// and the last one's end is the task's.
    fn check_tasks(&self, history: &History, job_id: JobId) {
        let job = &self.core.jobs[&job_id];
        for (index, record) in job.tasks.iter().enumerate() {
            let task_id = job.first_task + index as u64;
            let started = history.starts.get(&task_id).cloned().unwrap_or_default();
            let ended = history.ends.get(&task_id).cloned().unwrap_or_default();
            assert_eq!(
                started.len() as u32,
                record.attempts,
                "task {task_id} starts"
            );
            assert_eq!(ended.len() as u32, record.attempts, "task {task_id} ends");
            for (attempt, (a, executor)) in started.iter().enumerate() {
                assert_eq!(*a, attempt as u32, "task {task_id}");
                let end = ended
                    .iter()
                    .find(|(e, _, _)| *e == *a)
                    .unwrap_or_else(|| panic!("task {task_id} attempt {a} never ended"));
                assert_eq!(end.1, *executor, "task {task_id} attempt {a}");
            }
            let finishes = ended.iter().filter(|e| e.2 == TaskState::Finished).count();
            let failures = ended.iter().filter(|e| e.2 == TaskState::Failed).count() as u32;
            assert!(failures >= record.failures, "task {task_id}");
            let last = ended.iter().max_by_key(|e| e.0).map(|e| e.2);
            match record.status {
                TaskStatus::Finished => {
                    assert_eq!(finishes, 1, "task {task_id} finished {finishes} times");
                    assert_eq!(last, Some(TaskState::Finished), "task {task_id}");
                }
                TaskStatus::Failed => {
                    assert_eq!(finishes, 0, "task {task_id}");
                    assert_eq!(record.failures, job.max_failures);
                    assert_eq!(last, Some(TaskState::Failed), "task {task_id}");
                }
                TaskStatus::Killed => assert_eq!(finishes, 0, "task {task_id}"),
                TaskStatus::Pending | TaskStatus::Running => {
                    panic!(
                        "task {task_id} of ended job {job_id} is {:?}",
                        record.status
                    )
                }
            }
        }
    }

    /// The results api agrees with the records, page by page.
    fn check_results(&mut self, job_id: JobId) {
        let job = &self.core.jobs[&job_id];
        let expected: Vec<(TaskState, u32)> = job
            .tasks
            .iter()
            .map(|r| {
                let state = match r.status {
                    TaskStatus::Finished => TaskState::Finished,
                    TaskStatus::Failed => TaskState::Failed,
                    _ => TaskState::Killed,
                };
                (state, r.attempts)
            })
            .collect();
        let mut seen = Vec::new();
        let mut offset = 0;
        loop {
            let page = results(&mut self.core, job_id, offset, 3);
            seen.extend(page.results.iter().map(|o| (o.state, o.attempts)));
            match page.next_offset {
                Some(next) => {
                    assert!(next > offset);
                    offset = next;
                }
                None => break,
            }
        }
        assert_eq!(seen, expected, "job {job_id}: results");
    }
}
