//! One random operation at a time, each checked against what it must do.

use super::*;
use serde_json::json;

impl Sim {
    pub(super) fn apply(&mut self, op: &Op) {
        self.now += 7;
        let running = !running_attempts(&self.core).is_empty();
        match op {
            Op::Register { cores, gpus } => {
                let name = format!("e{}", self.executors.len());
                self.register_with(name, *cores, *gpus);
            }
            Op::Retry { pick } | Op::Impostor { pick } if !self.executors.is_empty() => {
                self.register_again(*pick, matches!(op, Op::Retry { .. }));
            }
            Op::Submit {
                tasks,
                cpus,
                max_failures,
                gpus,
            } => self.submit(*tasks, *cpus, *max_failures, *gpus),
            Op::Status {
                pick,
                state,
                sender,
            } if running => self.status(*pick, *state, sender),
            Op::Batch { executor, picks } if running => self.batch(*executor, picks),
            Op::Repeat { pick } if !self.accepted.is_empty() => {
                let (from, update) = self.accepted[pick % self.accepted.len()].clone();
                let now = self.now;
                let reply = self.unchanged(|core| status(core, &from, vec![update], now));
                assert_eq!(reply, (1, vec![]));
            }
            Op::Kill { pick } if !self.core.jobs.is_empty() => self.kill(*pick),
            Op::KillTask { pick, index, retry } if !self.core.jobs.is_empty() => {
                self.kill_task(*pick, *index, *retry)
            }
            _ => self.tick(),
        }
        check_invariants(&self.core);
        // A snapshot now and then, as the shell takes them between steps.
        let since = self.snapshots.last().map_or(0, |(at, _)| *at);
        if self.journal.len() >= since + 4 {
            let n = self.snapshots.len() as u128;
            let snapshot = snapshot_record(&self.core, n, self.now);
            self.snapshots.push((self.journal.len(), snapshot));
        }
    }

    /// A registered executor's process registers again (`retry`), or another process claims
    /// its id: either way nothing changes.
    fn register_again(&mut self, pick: usize, retry: bool) {
        let now = self.now;
        let (name, cores) = self.executors[pick % self.executors.len()].clone();
        let mut request = with_gang_ports(registration(&name, cores));
        if !retry {
            request.instance_id = InstanceId::from_u128(u128::from(now));
        }
        let reply = self.unchanged(|core| core.register(&name, request, now));
        let expected = if retry {
            registered(&name)
        } else {
            RegisterReply::RegisterExecutorFailed {
                message: format!("Duplicate executor ID: {name}"),
            }
        };
        assert_eq!(reply, expected);
    }

    fn submit(&mut self, tasks: u32, cpus: u32, max_failures: u32, gpus: u32) {
        let mut submission = job(tasks, cpus, max_failures);
        if gpus > 0 {
            submission.resources = [("gpu".to_string(), gpus)].into();
        }
        // A third of the jobs run only on the even executors (`rack=r0`); another third prefer
        // `e1`, waiting a few steps for it.
        submission.placement = match tasks % 3 {
            0 => crate::placement::Placement {
                constraints: vec!["rack=r0".into()],
                ..Default::default()
            },
            1 => crate::placement::Placement {
                prefer_executors: vec![eid("e1")],
                locality_wait_ms: Some(20),
                ..Default::default()
            },
            _ => Default::default(),
        };
        // Priorities and pools from the other draws: some high, some low, in two declared
        // pools, an undeclared one and the default.
        submission.priority = (tasks % 3) as i32 - 1;
        submission.concurrency_key = match (tasks + cpus) % 4 {
            0 => Some("k1".into()),
            1 => Some("k2".into()),
            _ => None,
        };
        submission.pool = match (tasks + max_failures) % 4 {
            0 => None,
            n => Some(["p0", "p1", "adhoc"][n as usize - 1].into()),
        };
        // Some are gangs (with no GPUs or constraints), refused when the executors registered
        // could not hold them.
        submission.gang = (tasks + max_failures) % 5 == 0
            && gpus == 0
            && submission.placement.constraints.is_empty();
        if let Some(refusal) = self.core.gang_refusal(&submission) {
            let request = ApiRequest::SubmitJob(submission);
            let now = self.now;
            let reply = self.unchanged(|core| core.api(request, now));
            assert_eq!(reply, ApiReply::Error { message: refusal });
            return;
        }
        let job_id = submit(&mut self.core, submission, self.now);
        let effects = self.effects();
        assert_eq!(
            effects[0],
            Effect::Publish(Event::JobStart {
                time_ms: self.now,
                job_id,
                name: "test-job".into(),
                tasks,
            })
        );
    }

    /// A status for a running attempt, from the right executor or a wrong one.
    fn status(&mut self, pick: usize, state: TaskState, sender: &Sender) {
        let running = running_attempts(&self.core);
        let (executor, task_id, attempt) = running[pick % running.len()].clone();
        let executor = executor.to_string();
        let mut update = update(task_id, attempt, state);
        match state {
            TaskState::Finished => update.result = Some(json!(task_id * 100 + u64::from(attempt))),
            TaskState::Failed => update.error = Some(format!("boom {task_id}/{attempt}")),
            _ => {}
        }
        let others: Vec<String> = self
            .executors
            .iter()
            .map(|(name, _)| name.clone())
            .filter(|name| *name != executor)
            .collect();
        let refused_one = |reply: StatusReply| {
            let StatusReply::StatusAck {
                accepted, refused, ..
            } = reply
            else {
                panic!("{reply:?}");
            };
            assert_eq!((accepted, refused.len()), (0, 1));
        };
        let now = self.now;
        match sender {
            Sender::Other(k) if !others.is_empty() => {
                let other = others[k % others.len()].clone();
                refused_one(self.unchanged(|core| {
                    core.status_updates(&other, &eid(&other), vec![update], now)
                }));
            }
            Sender::Other(_) | Sender::Unregistered => {
                let reply = self.unchanged(|core| {
                    core.status_updates("ghost", &eid("ghost"), vec![update], now)
                });
                assert!(
                    matches!(reply, StatusReply::UnknownExecutor { .. }),
                    "{reply:?}"
                );
            }
            Sender::WrongSubject => {
                let reply = self.unchanged(|core| {
                    core.status_updates("elsewhere", &eid(&executor), vec![update], now)
                });
                assert!(matches!(reply, StatusReply::Error { .. }), "{reply:?}");
            }
            Sender::WrongAttempt | Sender::UnknownTask => {
                if matches!(sender, Sender::WrongAttempt) {
                    update.attempt += 1;
                } else {
                    update.task_id = self.core.next_task + 1_000;
                }
                refused_one(self.unchanged(|core| {
                    core.status_updates(&executor, &eid(&executor), vec![update], now)
                }));
            }
            Sender::Right if !state.is_terminal() => {
                let reply = self.unchanged(|core| {
                    core.status_updates(&executor, &eid(&executor), vec![update], now)
                });
                assert_eq!(reply, ack(1));
            }
            Sender::Right => self.end_attempt(executor, update),
        }
    }

    /// The executor an attempt runs on reports its end.
    fn end_attempt(&mut self, executor: String, update: StatusUpdate) {
        let (task_id, attempt, state) = (update.task_id, update.attempt, update.state);
        let (job_id, index) = self.core.locate(task_id).unwrap();
        let was_active = self.core.jobs[&job_id].is_active();
        let reply = self.send(&executor, &executor, vec![update.clone()]);
        assert_eq!(reply, ack(1));
        let effects = self.effects();
        let ends = task_ends(&effects);
        assert_eq!(ends.len(), 1);
        assert_eq!(
            (
                ends[0].task_id,
                ends[0].index,
                ends[0].attempt,
                ends[0].state
            ),
            (task_id, index, attempt, state)
        );
        self.accepted.push((executor, update));
        let Some(job) = self.core.jobs.get(&job_id) else {
            // The last attempt of an ended job past the limit: it is forgotten now.
            assert!(!was_active, "a running job {job_id} was forgotten");
            return;
        };
        let record = &job.tasks[index];
        assert!(
            record.status != TaskStatus::Running || record.attempts > attempt + 1,
            "the attempt still runs"
        );
        if !was_active {
            assert!(job_ends(&effects).is_empty());
            let expected = if state == TaskState::Finished {
                TaskStatus::Finished
            } else {
                TaskStatus::Killed
            };
            assert_eq!(record.status, expected);
        }
    }

    /// One batch of terminal statuses from one busy executor, some for the same attempt.
    fn batch(&mut self, executor: usize, picks: &[(usize, TaskState)]) {
        let running = running_attempts(&self.core);
        let busy: BTreeSet<&ExecutorId> = running.iter().map(|(e, _, _)| e).collect();
        let from = busy.iter().nth(executor % busy.len()).unwrap().to_string();
        let there: Vec<(TaskId, u32)> = running
            .iter()
            .filter(|(e, _, _)| e.as_str() == from)
            .map(|(_, t, a)| (*t, *a))
            .collect();
        // The first status named for each attempt is the one that counts.
        let mut first = BTreeMap::new();
        let updates: Vec<StatusUpdate> = picks
            .iter()
            .map(|(k, state)| {
                let (task_id, attempt) = there[k % there.len()];
                let mut update = update(task_id, attempt, *state);
                if *state == TaskState::Failed {
                    update.error = Some(format!("batch {task_id}/{attempt}"));
                }
                first
                    .entry((task_id, attempt))
                    .or_insert_with(|| update.clone());
                update
            })
            .collect();
        let n = updates.len() as u32;
        assert_eq!(self.send(&from, &from, updates), ack(n));
        let effects = self.effects();
        let ends: Vec<(TaskId, u32)> = task_ends(&effects)
            .iter()
            .map(|t| (t.task_id, t.attempt))
            .collect();
        assert_eq!(
            ends.iter().copied().collect::<BTreeSet<_>>(),
            first.keys().copied().collect::<BTreeSet<_>>()
        );
        assert_eq!(ends.len(), first.len(), "one TaskEnd per attempt");
        let mut ends_per_job = BTreeMap::new();
        for end in job_ends(&effects) {
            if let Event::JobEnd { job_id, .. } = end {
                *ends_per_job.entry(job_id).or_insert(0) += 1;
            }
        }
        assert!(ends_per_job.values().all(|n| *n == 1), "{ends_per_job:?}");
        self.accepted
            .extend(first.into_values().map(|u| (from.clone(), u)));
    }

    /// Kills one task: a running attempt gets one `KillTask`, a waiting task ends at once;
    /// anything else is refused and changes nothing.
    fn kill_task(&mut self, pick: usize, index: usize, retry: bool) {
        let now = self.now;
        let ids: Vec<JobId> = self.core.jobs.keys().copied().collect();
        let job_id = ids[pick % ids.len()];
        let job = &self.core.jobs[&job_id];
        let index = (index % (job.len() as usize + 1)) as u32;
        let request = ApiRequest::KillJobTask {
            job_id,
            index,
            retry,
        };
        let record = (index < job.len()).then(|| job.tasks[index].clone());
        let (active, killed) = (job.is_active(), job.killed);
        match record {
            Some(r)
                if active && r.status == TaskStatus::Running && !(retry && r.kill_requested) =>
            {
                let attempt = r.attempts - 1;
                let reply = self.core.api(request, now);
                let expected = ApiReply::TaskKilled {
                    job_id,
                    index,
                    attempt: Some(attempt),
                    retry,
                };
                assert_eq!(reply, expected);
                let effects = self.effects();
                let kills: Vec<_> = kill_tasks(&effects)
                    .into_iter()
                    .map(|(to, t, a, _)| (to, t, a))
                    .collect();
                let executor = r.executor.unwrap().to_string();
                let task_id = self.core.jobs[&job_id].first_task + u64::from(index);
                assert_eq!(kills, [(executor, task_id, attempt)]);
                assert_eq!(self.core.jobs[&job_id].tasks[index].kill_requested, !retry);
            }
            Some(r) if active && r.status == TaskStatus::Pending && !retry => {
                let reply = self.core.api(request, now);
                let expected = ApiReply::TaskKilled {
                    job_id,
                    index,
                    attempt: None,
                    retry,
                };
                assert_eq!(reply, expected);
                self.effects();
                let job = &self.core.jobs[&job_id];
                assert_eq!(job.tasks[index].status, TaskStatus::Killed);
                assert_eq!(job.killed, killed + 1);
            }
            _ => {
                let reply = self.unchanged(|core| core.api(request, now));
                assert!(matches!(reply, ApiReply::Error { .. }), "{reply:?}");
            }
        }
    }

    /// Kills a job: each running attempt gets one `KillTask`; a job that ended KILLED answers
    /// as the kill did, another ended job cannot be killed, and neither changes.
    fn kill(&mut self, pick: usize) {
        let now = self.now;
        let ids: Vec<JobId> = self.core.jobs.keys().copied().collect();
        let job_id = ids[pick % ids.len()];
        let job = &self.core.jobs[&job_id];
        if !job.is_active() {
            let killed = job.state == JobState::Killed;
            let reply = self.unchanged(|core| core.api(ApiRequest::KillJob { job_id }, now));
            match killed {
                true => assert_eq!(reply, ApiReply::JobKilled { job_id }),
                false => assert!(matches!(reply, ApiReply::Error { .. }), "{reply:?}"),
            }
            return;
        }
        let running: BTreeSet<_> = job
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, r)| r.status == TaskStatus::Running)
            .map(|(i, r)| {
                let task_id = job.first_task + i as u64;
                (
                    r.executor.clone().unwrap().to_string(),
                    task_id,
                    r.attempts - 1,
                )
            })
            .collect();
        let reply = self.core.api(ApiRequest::KillJob { job_id }, now);
        assert_eq!(reply, ApiReply::JobKilled { job_id });
        let effects = self.effects();
        let kills: BTreeSet<_> = kill_tasks(&effects)
            .into_iter()
            .map(|(to, t, a, _)| (to, t, a))
            .collect();
        assert_eq!(kills, running, "one KillTask per running attempt");
        assert_eq!(job_ends(&effects).len(), 1);
    }
}
