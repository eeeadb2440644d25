//! Handlers an executor abandoned: their cores stay out of the offers while its heartbeats list
//! them, come back once a heartbeat does not, and no heartbeat can make the counts go wrong.

use super::*;
use crate::protocol::{
    AbandonedAttempt, AbandonedStatus, HeartbeatReply, HeartbeatRequest, RunningAttempt,
};

fn abandoned(task_id: TaskId, attempt: u32, cpus: u32) -> AbandonedAttempt {
    AbandonedAttempt {
        task_id,
        attempt,
        cpus,
    }
}

fn running(task_id: TaskId, attempt: u32) -> RunningAttempt {
    RunningAttempt {
        task_id,
        attempt,
        term: 0,
        ended: false,
    }
}

/// A heartbeat of `id` saying what runs there and what it abandoned; its answer and effects,
/// the invariants checked.
fn beat_unchecked(
    core: &mut Core,
    id: &str,
    running: Vec<RunningAttempt>,
    abandoned: Vec<AbandonedAttempt>,
    now: u64,
) -> (HeartbeatReply, Vec<Effect>) {
    let request = HeartbeatRequest::Heartbeat {
        executor_id: eid(id),
        instance_id: instance_of(id),
        running,
        driver_instance: Some(InstanceId::from_u128(DRIVER)),
        objects: Default::default(),
        connection: None,
        abandoned,
    };
    let reply = core.heartbeat(id, request, now);
    let effects = core.take_effects();
    check_invariants(core);
    (reply, effects)
}

/// [`beat_unchecked`], its effects checked too.
fn beat(
    core: &mut Core,
    id: &str,
    running: Vec<RunningAttempt>,
    abandoned: Vec<AbandonedAttempt>,
    now: u64,
) -> (HeartbeatReply, Vec<Effect>) {
    let (reply, effects) = beat_unchecked(core, id, running, abandoned, now);
    check_effects(core, &effects);
    (reply, effects)
}

const OK: HeartbeatReply = HeartbeatReply::HeartbeatResponse { reregister: false };

fn shown(core: &Core, id: &str) -> Vec<AbandonedStatus> {
    let snapshot = core.executors_snapshot();
    let summary = snapshot.executors.iter().find(|e| e.executor_id == eid(id));
    summary.expect("a registered executor").abandoned.clone()
}

#[test]
fn an_abandoned_handler_keeps_its_core_from_offers_until_a_heartbeat_no_longer_lists_it() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    let (_, launched) = start(&mut core, job(2, 1, 4), 2);
    assert_eq!(launched, [("a".into(), vec![(1, 0, 0)])]);
    // The executor gave up on the handler: the heartbeat that says so comes first, while the
    // driver still counts the attempt running, and holds nothing more.
    let (reply, _) = beat(&mut core, "a", vec![], vec![abandoned(1, 0, 1)], 3);
    assert_eq!(reply, OK);
    assert_eq!(free(&core, "a"), 0);
    let since = vec![AbandonedStatus {
        task_id: 1,
        attempt: 0,
        cpus: 1,
        since_ms: 3,
    }];
    assert_eq!(shown(&core, "a"), since);
    // Its KILLED end: the task moves on, but the core stays busy and nothing is offered it.
    let effects = report(&mut core, "a", vec![killed(1, 0)], 4);
    assert!(launches(&effects).is_empty(), "{effects:?}");
    assert_eq!(free(&core, "a"), 0);
    let (_, effects) = beat(&mut core, "a", vec![], vec![abandoned(1, 0, 1)], 5);
    assert!(
        launches(&effects).is_empty(),
        "still abandoned: {effects:?}"
    );
    assert_eq!(shown(&core, "a"), since);
    // The handler returned: the next heartbeat does not list it, and the core runs work again.
    let (reply, effects) = beat(&mut core, "a", vec![], vec![], 6);
    assert_eq!(reply, OK);
    assert_eq!(launches(&effects).len(), 1, "{effects:?}");
    assert_eq!(launches(&effects)[0].0, "a");
    assert!(shown(&core, "a").is_empty());
    assert_eq!(free(&core, "a"), 0, "the freed core runs the next task");
}

#[test]
fn an_attempt_the_driver_does_not_run_takes_its_cores_at_once() {
    // What a new driver hears of an attempt abandoned under the one before it.
    let mut core = new_core(0);
    add(&mut core, "a", 2, 1);
    let (reply, _) = beat(&mut core, "a", vec![], vec![abandoned(77, 3, 1)], 2);
    assert_eq!(reply, OK);
    assert_eq!(free(&core, "a"), 1);
    let (_, launched) = start(&mut core, job(2, 1, 4), 3);
    assert_eq!(
        launched,
        [("a".into(), vec![(1, 0, 0)])],
        "one core is free"
    );
    let (_, effects) = beat(&mut core, "a", vec![running(1, 0)], vec![], 4);
    assert_eq!(launches(&effects), [("a".into(), vec![(2, 1, 0)])]);
}

#[test]
fn a_heartbeat_sent_before_the_abandonment_frees_nothing() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    start(&mut core, job(2, 1, 4), 2);
    beat(&mut core, "a", vec![], vec![abandoned(1, 0, 1)], 3);
    report(&mut core, "a", vec![killed(1, 0)], 4);
    // It names the attempt running, as every heartbeat before the abandonment did (and is
    // told to kill it, the attempt being over).
    let (_, effects) = beat_unchecked(&mut core, "a", vec![running(1, 0)], vec![], 5);
    assert!(launches(&effects).is_empty(), "{effects:?}");
    assert_eq!(kill_tasks(&effects).len(), 1);
    assert_eq!(shown(&core, "a").len(), 1);
}

#[test]
fn hostile_lists_are_refused_or_clipped() {
    let mut core = new_core(0);
    add(&mut core, "a", 2, 1);
    // More abandoned attempts than cores: refused, and nothing changes.
    let three = vec![abandoned(7, 0, 1), abandoned(8, 0, 1), abandoned(9, 0, 1)];
    let (reply, _) = beat(&mut core, "a", vec![], three, 2);
    assert!(
        matches!(&reply, HeartbeatReply::Error { message } if message.contains("at most 2")),
        "{reply:?}"
    );
    assert_eq!(free(&core, "a"), 2);
    assert!(shown(&core, "a").is_empty());
    // More cores than it has, named twice: clipped to what is free, counted once.
    let greedy = vec![abandoned(7, 0, u32::MAX), abandoned(7, 0, u32::MAX)];
    let (reply, _) = beat(&mut core, "a", vec![], greedy, 3);
    assert_eq!(reply, OK);
    assert_eq!(free(&core, "a"), 0);
    assert_eq!(shown(&core, "a")[0].cpus, 2);
    // Another attempt on top of that holds nothing, and the list gives all back once empty.
    let more = vec![abandoned(7, 0, 1), abandoned(8, 0, 5)];
    beat(&mut core, "a", vec![], more, 4);
    assert_eq!(free(&core, "a"), 0);
    beat(&mut core, "a", vec![], vec![], 5);
    assert_eq!(free(&core, "a"), 2);
    // An attempt the driver runs is held at no more than the executor's cores, and once it
    // ends it holds what the driver gave it, not what the heartbeat said.
    start(&mut core, job(1, 2, 4), 6);
    beat(&mut core, "a", vec![], vec![abandoned(1, 0, u32::MAX)], 7);
    assert_eq!(shown(&core, "a")[0].cpus, 2);
    report(&mut core, "a", vec![killed(1, 0)], 8);
    assert_eq!((free(&core, "a"), shown(&core, "a")[0].cpus), (0, 2));
}

#[test]
fn an_attempt_listed_as_abandoned_is_not_lost_though_no_longer_listed_running() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    start(&mut core, job(1, 1, 4), 2);
    // Long past the grace a launch has to show up in a heartbeat.
    let (_, effects) = beat(&mut core, "a", vec![], vec![abandoned(1, 0, 1)], 60_000);
    assert!(task_ends(&effects).is_empty(), "{effects:?}");
    let effects = report(&mut core, "a", vec![killed(1, 0)], 60_001);
    assert_eq!(task_ends(&effects)[0].state, TaskState::Killed);
}
