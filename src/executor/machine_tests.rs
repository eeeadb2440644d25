//! The executor machine driven by hand: no NATS, no clock.

use super::*;
use crate::protocol::TaskSpec;
use std::sync::Arc;

/// Work that stops when asked (a timer) or not (a blocking handler).
struct Work(bool);

impl Cancel for Work {
    fn cancel(&mut self) -> bool {
        self.0
    }

    fn may_ignore_stop(&self) -> bool {
        !self.0
    }
}

fn machine() -> Machine<Work> {
    let config = MachineConfig {
        executor_id: ExecutorId::parse("e1").unwrap(),
        instance: InstanceId::from_u64_pair(1, 1),
        cores: 2,
        driver_timeout_ms: 10_000,
        decommission_timeout_ms: 30_000,
        status_limit: 1 << 20,
    };
    let mut machine = Machine::new(config, 0);
    machine.on_registered(driver(9, 4), 0);
    machine
}

/// The answer of driver instance `n`, of term `term`, which adopts nothing.
fn driver(n: u64, term: u64) -> Registration {
    Registration {
        driver: InstanceId::from_u64_pair(n, n),
        term,
        adopted: Vec::new(),
    }
}

fn task(task_id: TaskId) -> TaskDescription {
    TaskDescription {
        task_id,
        job_id: 1,
        index: 0,
        attempt: 0,
        cpus: 1,
        spec: Arc::new(TaskSpec::Handler {
            name: "sim".into(),
            arg: serde_json::Value::Null,
        }),
        resources: Default::default(),
        gang_peers: Vec::new(),
    }
}

fn requests(machine: &mut Machine<Work>) -> Vec<Request> {
    std::iter::from_fn(|| machine.next_request()).collect()
}

fn states(machine: &Machine<Work>) -> Vec<(TaskId, TaskState)> {
    machine
        .statuses()
        .sending()
        .map(|u| (u.task_id, u.state))
        .collect()
}

fn ack() -> Result<StatusReply, String> {
    Ok(StatusReply::StatusAck {
        accepted: 1,
        refused: Vec::new(),
        launch: Vec::new(),
    })
}

#[test]
fn one_batch_in_flight_and_the_rest_waits_for_its_answer() {
    let mut m = machine();
    m.launch(&task(1), |_, _| Started::Running(Work(true)));
    m.poll(1);
    assert_eq!(requests(&mut m), [Request::Status]);
    m.finish(
        0,
        StatusUpdate {
            state: TaskState::Finished,
            ..killed_status(1, 0)
        },
    );
    m.poll(2);
    assert!(
        requests(&mut m).is_empty(),
        "a second batch while one is in flight"
    );
    assert!(m.on_status(ack(), 3).is_empty());
    m.poll(3);
    assert_eq!(requests(&mut m), [Request::Status]);
    assert_eq!(states(&m), [(1, TaskState::Finished)]);
}

#[test]
fn a_kill_of_work_that_cannot_stop_reports_killed_when_it_returns() {
    let mut m = machine();
    m.launch(&task(1), |_, _| Started::Running(Work(false)));
    m.kill(1, 0, 0);
    assert_eq!(m.running(), 1);
    m.finish(
        0,
        StatusUpdate {
            state: TaskState::Finished,
            ..killed_status(1, 0)
        },
    );
    assert_eq!(m.running(), 0);
    m.poll(1);
    assert_eq!(
        states(&m),
        [(1, TaskState::Running), (1, TaskState::Killed)]
    );
}

/// The abandoned attempts the heartbeat in `requests` lists.
fn abandoned_in(requests: &[Request]) -> Vec<crate::protocol::AbandonedAttempt> {
    let beat = requests.iter().find_map(|r| match r {
        Request::Heartbeat(HeartbeatRequest::Heartbeat { abandoned, .. }) => Some(abandoned),
        _ => None,
    });
    beat.expect("a heartbeat").clone()
}

#[test]
fn a_handler_that_ignores_its_stop_is_abandoned_and_its_core_stays_busy_until_it_returns() {
    let mut m = machine();
    m.launch(&task(1), |_, _| Started::Running(Work(false)));
    m.poll(1);
    requests(&mut m);
    assert!(m.on_status(ack(), 2).is_empty());
    m.kill(1, 0, 100);
    assert_eq!(m.abandon_at(), Some(5_100), "the grace is 5 s");
    assert!(!m.abandon_overdue(5_099));
    assert!(m.abandon_overdue(5_100));
    assert_eq!(m.abandon_at(), None);
    assert_eq!((m.running(), m.busy_cores()), (0, 1), "its core stays busy");
    // Its end waits until a heartbeat that lists it has been answered.
    m.poll(5_100);
    assert!(
        requests(&mut m).is_empty(),
        "no end before the driver hears"
    );
    m.beat(false, Default::default(), 5_100).unwrap();
    let sent = requests(&mut m);
    let listed = crate::protocol::AbandonedAttempt {
        task_id: 1,
        attempt: 0,
        cpus: 1,
    };
    assert_eq!(abandoned_in(&sent), [listed]);
    assert!(m.held().is_empty(), "no longer among the attempts it runs");
    m.on_heartbeat(
        Ok(HeartbeatReply::HeartbeatResponse { reregister: false }),
        5_200,
    );
    m.poll(5_200);
    assert_eq!(requests(&mut m), [Request::Status]);
    let end: Vec<_> = m.statuses().sending().cloned().collect();
    assert_eq!(end.len(), 1);
    assert_eq!(end[0].state, TaskState::Killed);
    let error = end[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("did not return within 5s"), "{error}");
    assert!(
        error.contains("its core stays busy until it returns"),
        "{error}"
    );
    assert!(m.on_status(ack(), 5_300).is_empty());
    // Still listed while it runs; its return frees the core and reports nothing more.
    m.beat(false, Default::default(), 6_000).unwrap();
    assert_eq!(abandoned_in(&requests(&mut m)), [listed]);
    m.on_heartbeat(
        Ok(HeartbeatReply::HeartbeatResponse { reregister: false }),
        6_000,
    );
    m.finish(0, StatusUpdate::finished(1, 0));
    assert_eq!(m.busy_cores(), 0);
    m.poll(7_000);
    m.beat(false, Default::default(), 7_000).unwrap();
    let sent = requests(&mut m);
    assert_eq!(sent.len(), 1, "a heartbeat and no status: {sent:?}");
    assert!(abandoned_in(&sent).is_empty());
}

#[test]
fn a_handler_that_returns_before_the_driver_heard_reports_its_end_then() {
    let mut m = machine();
    m.launch(&task(1), |_, _| Started::Running(Work(false)));
    m.kill(1, 0, 0);
    assert!(m.abandon_overdue(5_000));
    m.finish(0, StatusUpdate::finished(1, 0));
    assert_eq!(m.busy_cores(), 0);
    m.poll(5_001);
    assert_eq!(
        states(&m),
        [(1, TaskState::Running), (1, TaskState::Killed)]
    );
}

#[test]
fn a_handler_that_stops_within_the_grace_is_not_abandoned() {
    let mut m = machine();
    m.launch(&task(1), |_, _| Started::Running(Work(false)));
    m.kill(1, 0, 0);
    m.finish(0, StatusUpdate::finished(1, 0));
    assert!(!m.abandon_overdue(5_000));
    assert_eq!(m.busy_cores(), 0);
}

#[test]
fn a_new_driver_drops_the_old_drivers_attempts_and_statuses() {
    let mut m = machine();
    m.launch(&task(1), |_, _| Started::Running(Work(true)));
    let launch = m.on_status(
        Ok(StatusReply::UnknownExecutor {
            message: "?".into(),
        }),
        1,
    );
    assert!(launch.is_empty());
    m.poll(1);
    assert!(m.is_registering());
    let registered = m.on_registered(driver(7, 8), 2);
    assert_eq!(
        registered,
        Registered::NewDriver {
            adopted: 0,
            dropped: 1,
            unsent: 1
        }
    );
    assert_eq!(m.running(), 0);
    assert!(m.statuses().is_idle());
}

/// A run given up when a new driver came may still end (work that cannot be stopped, or an end
/// already on its way): its end must not be taken for a later run that the new driver, which
/// numbers tasks and attempts afresh, launched under the same task id and attempt.
#[test]
fn the_end_of_a_run_given_up_is_never_taken_for_a_later_run_of_the_same_task_and_attempt() {
    let mut m = machine();
    let mut runs = Vec::new();
    m.launch(&task(1), |_, run| {
        runs.push(run);
        Started::Running(Work(false))
    });
    m.on_registered(driver(7, 8), 1);
    assert_eq!(m.running(), 0, "the old driver's run is given up");
    m.launch(&task(1), |_, run| {
        runs.push(run);
        Started::Running(Work(true))
    });
    assert_ne!(runs[0], runs[1], "every run has a number of its own");
    let old_end = StatusUpdate {
        result: Some(serde_json::json!("the old run's output")),
        state: TaskState::Finished,
        ..killed_status(1, 0)
    };
    m.finish(runs[0], old_end);
    assert_eq!(m.running(), 1, "the later run still holds the slot");
    m.poll(2);
    assert_eq!(states(&m), [(1, TaskState::Running)]);
    m.finish(
        runs[1],
        StatusUpdate {
            state: TaskState::Finished,
            ..killed_status(1, 0)
        },
    );
    assert_eq!(m.running(), 0);
}

/// A launch delivered twice, at once or after its run ended, starts no second run under the
/// attempt's name; the next attempt, and the same numbers from a new driver, start.
#[test]
fn a_repeated_launch_starts_no_second_run() {
    let mut m = machine();
    let mut runs = Vec::new();
    let mut start = |m: &mut Machine<Work>, task: &TaskDescription| {
        m.launch(task, |_, run| {
            runs.push(run);
            Started::Running(Work(true))
        })
    };
    start(&mut m, &task(1));
    start(&mut m, &task(1));
    assert_eq!(m.running(), 1);
    m.kill(1, 0, 0);
    start(&mut m, &task(1));
    assert_eq!(
        m.running(),
        0,
        "a late repeat after the run ended starts nothing"
    );
    let next = TaskDescription {
        attempt: 1,
        ..task(1)
    };
    start(&mut m, &next);
    m.on_registered(driver(7, 8), 1);
    start(&mut m, &task(1));
    assert_eq!(m.running(), 1);
    assert_eq!(
        runs,
        [0, 1, 2],
        "one run each for attempt 0, 1, and the new driver's 0"
    );
}

/// A new driver that adopts an attempt: the run goes on under the new term and number, its
/// status (not yet acknowledged by the old driver) goes to the new one renamed, and what it did
/// not adopt is stopped and forgotten.
#[test]
fn a_new_driver_adopts_what_it_says_and_the_rest_is_dropped() {
    let mut m = machine();
    let mut runs = Vec::new();
    for id in [1, 2, 3] {
        m.launch(&task(id), |_, run| {
            runs.push(run);
            Started::Running(Work(true))
        });
    }
    // Task 3 ends before the old driver acknowledges it.
    m.finish(
        runs[2],
        StatusUpdate {
            state: TaskState::Finished,
            ..killed_status(3, 0)
        },
    );
    let held = m.held();
    assert_eq!(held.len(), 3, "{held:?}");
    assert!(
        held.iter().all(|a| a.term == 4 && a.attempt == 0),
        "{held:?}"
    );
    // Task 3's attempt is held as ended: its end waits for an acknowledgement.
    let ended: Vec<TaskId> = held.iter().filter(|a| a.ended).map(|a| a.task_id).collect();
    assert_eq!(ended, [3]);
    let adopt = |task_id, new_attempt| Adopted {
        task_id,
        attempt: 0,
        term: 4,
        new_attempt,
    };
    let answer = Registration {
        adopted: vec![adopt(1, 2), adopt(3, 0)],
        ..driver(7, 12)
    };
    assert_eq!(
        m.on_registered(answer, 5),
        Registered::NewDriver {
            adopted: 1,
            dropped: 1,
            unsent: 1,
        }
    );
    assert_eq!(m.running(), 1);
    assert_eq!(m.busy_cores(), 1);
    let held: Vec<RunningAttempt> = {
        let mut held = m.held();
        held.sort_by_key(|a| a.task_id);
        held
    };
    assert_eq!(
        held,
        [
            RunningAttempt {
                task_id: 1,
                attempt: 2,
                term: 12,
                ended: false,
            },
            RunningAttempt {
                task_id: 3,
                attempt: 0,
                term: 12,
                ended: true,
            }
        ]
    );
    // The adopted run's end counts, under its new number.
    m.finish(
        runs[0],
        StatusUpdate {
            state: TaskState::Finished,
            ..killed_status(1, 0)
        },
    );
    assert_eq!(m.running(), 0, "the end of the adopted run freed its slot");
    m.poll(6);
    let sent: Vec<(TaskId, u32, TaskState)> = m
        .statuses()
        .sending()
        .map(|u| (u.task_id, u.attempt, u.state))
        .collect();
    assert_eq!(
        sent,
        [
            (1, 2, TaskState::Running),
            (3, 0, TaskState::Running),
            (3, 0, TaskState::Finished),
            (1, 2, TaskState::Finished)
        ]
    );
}

#[test]
fn a_silent_driver_means_registering_again_and_no_statuses_meanwhile() {
    let mut m = machine();
    assert_eq!(m.beat(false, Default::default(), 20_000), Ok(()));
    assert_eq!(requests(&mut m), [Request::Register]);
    m.launch(&task(1), |_, _| Started::Running(Work(true)));
    m.poll(20_001);
    assert!(
        requests(&mut m).is_empty(),
        "statuses wait for the registration"
    );
    assert_eq!(
        machine().beat(true, Default::default(), 20_000),
        Err(20_000)
    );
}

#[test]
fn a_drain_keeps_a_late_launch_hands_back_what_still_runs_and_leaves_once_acknowledged() {
    let mut m = machine();
    m.launch(&task(1), |_, _| Started::Running(Work(true)));
    m.stop("test", 100);
    // Sent before the driver heard of the drain: run, not handed back.
    m.launch(&task(2), |_, _| Started::Running(Work(true)));
    assert_eq!(m.running(), 2);
    assert_eq!(m.hand_back_at(), Some(30_100));
    m.hand_back();
    m.launch(&task(3), |_, _| {
        unreachable!("once its tasks are handed back, an executor starts nothing")
    });
    assert!(!m.poll(30_100));
    assert!(matches!(
        requests(&mut m)[..],
        [Request::Decommission(_), Request::Status]
    ));
    let mut ends = states(&m);
    ends.sort_by_key(|(task, state)| (*state == TaskState::Killed, *task));
    assert_eq!(
        ends,
        [
            (1, TaskState::Running),
            (2, TaskState::Running),
            (1, TaskState::Killed),
            (2, TaskState::Killed),
            (3, TaskState::Killed)
        ]
    );
    assert!(m.on_status(ack(), 30_200).is_empty());
    assert!(m.poll(30_200));
    assert!(matches!(requests(&mut m)[..], [Request::Exiting(_)]));
}

#[test]
fn registration_backs_off_to_two_seconds_until_its_deadline() {
    let mut backoff = Backoff::new(Some(3_000));
    let pauses: Vec<u64> = std::iter::from_fn(|| backoff.next_pause(0))
        .take(8)
        .collect();
    assert_eq!(pauses, [50, 100, 200, 400, 800, 1_600, 2_000, 2_000]);
    assert_eq!(backoff.next_pause(1_500), None);
}

#[test]
fn tasks_in_an_acknowledgement_come_back_to_be_launched() {
    let mut m = machine();
    m.launch(&task(1), |t, _| {
        Started::Ended(StatusUpdate {
            state: TaskState::Finished,
            ..killed_status(t.task_id, 0)
        })
    });
    m.poll(1);
    assert_eq!(requests(&mut m), [Request::Status]);
    let answer = StatusReply::StatusAck {
        accepted: 1,
        refused: Vec::new(),
        launch: vec![task(2)],
    };
    let launch = m.on_status(Ok(answer), 2);
    assert_eq!(launch, [task(2)]);
    assert_eq!(states(&m), []);
}

#[test]
fn launches_and_kills_count_only_from_the_driver_registered_with() {
    let mut machine = machine();
    let (first, second) = (
        InstanceId::from_u64_pair(9, 9),
        InstanceId::from_u64_pair(8, 8),
    );
    assert!(machine.sent_by_my_driver(Some(first)));
    assert!(!machine.sent_by_my_driver(Some(second)));
    // A sender that names no instance is taken to be the current driver.
    assert!(machine.sent_by_my_driver(None));
    machine.on_registered(
        Registration {
            driver: second,
            ..driver(8, 8)
        },
        1,
    );
    assert!(machine.sent_by_my_driver(Some(second)));
    assert!(!machine.sent_by_my_driver(Some(first)));
}

#[test]
fn a_launch_whose_cpus_overflow_the_busy_count_fails_and_takes_no_slot() {
    let mut m = machine();
    let huge = TaskDescription {
        cpus: u32::MAX,
        ..task(1)
    };
    m.launch(&huge, |_, _| Started::Running(Work(true)));
    m.launch(&task(2), |_, _| Started::Running(Work(true)));
    m.poll(1);
    assert_eq!(requests(&mut m), [Request::Status]);
    assert_eq!(
        states(&m),
        [(1, TaskState::Running), (2, TaskState::Failed)],
        "the second launch overflows u32"
    );
    let error = m
        .statuses()
        .sending()
        .last()
        .unwrap()
        .error
        .clone()
        .unwrap();
    assert!(error.contains("overflows"), "{error}");
}

#[test]
fn an_executor_registers_again_when_another_driver_says_it_leads() {
    let mut m = machine();
    requests(&mut m);
    // Its own driver, said again: nothing to do.
    assert!(!m.leader_announced(driver(9, 4).driver));
    assert_eq!(requests(&mut m), []);
    // Another: it registers with that one now, once however often it is said.
    assert!(m.leader_announced(driver(7, 8).driver));
    assert!(m.is_registering());
    assert_eq!(requests(&mut m), [Request::Register]);
    // Said again while it registers: its registration starts over, and no second one.
    assert!(m.leader_announced(driver(7, 8).driver));
    assert_eq!(requests(&mut m), []);
    m.on_registered(driver(7, 8), 1);
    assert!(!m.is_registering());
    assert!(!m.leader_announced(driver(7, 8).driver));
}
