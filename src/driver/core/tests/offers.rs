//! Offers: how free cores are dealt to waiting tasks.

use super::*;
use crate::protocol::TaskDescription;

#[test]
fn a_job_submitted_with_no_executors_launches_when_one_registers() {
    let mut core = new_core(1);
    let (job_id, launched) = start(&mut core, job(3, 1, 4), 10);
    assert!(launched.is_empty());
    unchanged(&mut core, |core| core.tick(15)); // nothing to offer

    let effects = add(&mut core, "exec-1", 2, 20);
    let description = |task_id, index| TaskDescription {
        task_id,
        job_id,
        index,
        attempt: 0,
        cpus: 1,
        spec: std::sync::Arc::new(noop()),
        resources: Default::default(),
        gang_peers: Vec::new(),
    };
    let started = |task_id, index| crate::protocol::TaskStarted {
        task_id,
        index,
        attempt: 0,
    };
    match &effects[..] {
        [Effect::Publish(Event::ExecutorAdded { .. }), launch, start] => {
            assert_eq!(
                *launch,
                Effect::Send {
                    to: eid("exec-1"),
                    message: ExecutorMessage::LaunchTasks {
                        tasks: vec![description(1, 0), description(2, 1)],
                        driver_instance: Some(core.config.driver_instance),
                    },
                }
            );
            assert_eq!(
                *start,
                Effect::Publish(Event::TaskStart {
                    time_ms: 20,
                    job_id,
                    executors: vec![crate::protocol::ExecutorTasks {
                        executor_id: eid("exec-1"),
                        tasks: vec![started(1, 0), started(2, 1)],
                    }],
                    term: 0,
                })
            );
        }
        other => panic!("expected ExecutorAdded, LaunchTasks, TaskStart; got {other:?}"),
    }
    assert_eq!(free(&core, "exec-1"), 0);
    assert_eq!(summary(&mut core, job_id).running, 2);
    check_invariants(&core);
}

#[test]
fn cores_a_status_batch_frees_are_refilled_in_its_acknowledgement() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    add(&mut core, "b", 1, 1);
    let (_, launched) = start(&mut core, job(4, 1, 4), 2);
    assert_eq!(launched.len(), 2);
    let reply = core.status_updates("a", &eid("a"), vec![finished(1, 0)], 3);
    let StatusReply::StatusAck {
        accepted, launch, ..
    } = reply
    else {
        panic!("not acknowledged: {reply:?}");
    };
    assert_eq!(accepted, 1);
    let ids: Vec<_> = launch.iter().map(|t| (t.task_id, t.attempt)).collect();
    assert_eq!(ids, [(3, 0)]);
    // The launch went with the answer, so no LaunchTasks is sent as well; the event still is.
    let effects = core.take_effects();
    assert!(launches(&effects).is_empty(), "{effects:?}");
    let started: Vec<_> = events(&effects)
        .iter()
        .flat_map(|e| e.started().map(|(_, t)| t.task_id))
        .collect();
    assert_eq!(started, [3]);
    assert_eq!(free(&core, "a"), 0);
    check_invariants(&core);
}

#[test]
fn offers_deal_tasks_round_robin_with_one_launch_per_executor() {
    let mut core = new_core(0);
    for id in ["a", "b", "c"] {
        add(&mut core, id, 4, 1);
    }
    submit(&mut core, job(6, 1, 4), 2);
    let effects = core.take_effects();
    check_effects(&core, &effects);
    assert_eq!(
        launches(&effects),
        [
            ("a".into(), vec![(1, 0, 0), (4, 3, 0)]),
            ("b".into(), vec![(2, 1, 0), (5, 4, 0)]),
            ("c".into(), vec![(3, 2, 0), (6, 5, 0)]),
        ]
    );
    // JobStart, three launches, one TaskStart for the whole round.
    assert_eq!(effects.len(), 5);
    assert_eq!(event_kinds(&effects), ["job.start", "task.start"]);
    // It names each executor once, with its tasks in the order they were dealt.
    let Event::TaskStart { executors, .. } = &events(&effects)[1] else {
        panic!("expected a TaskStart: {effects:?}");
    };
    let started: Vec<(String, Vec<u64>)> = executors
        .iter()
        .map(|g| {
            let ids = g.tasks.iter().map(|t| t.task_id).collect();
            (g.executor_id.to_string(), ids)
        })
        .collect();
    assert_eq!(
        started,
        [
            ("a".into(), vec![1, 4]),
            ("b".into(), vec![2, 5]),
            ("c".into(), vec![3, 6]),
        ]
    );
    for id in ["a", "b", "c"] {
        assert_eq!(free(&core, id), 2);
    }
    check_invariants(&core);
}

#[test]
fn offers_stop_at_free_cores_and_skip_full_executors() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    add(&mut core, "b", 3, 1);
    let (job_id, launched) = start(&mut core, job(10, 1, 4), 2);
    assert_eq!(
        launched,
        [
            ("a".into(), vec![(1, 0, 0)]),
            ("b".into(), vec![(2, 1, 0), (3, 2, 0), (4, 3, 0)]),
        ]
    );
    assert_eq!((free(&core, "a"), free(&core, "b")), (0, 0));
    assert_eq!(summary(&mut core, job_id).running, 4);
    assert_eq!(core.jobs[&job_id].tasks.waiting(), 6);
    unchanged(&mut core, |core| core.tick(3)); // no free cores, nothing to launch
    check_invariants(&core);
}

#[test]
fn cpus_per_task_is_respected() {
    let mut core = new_core(0);
    add(&mut core, "a", 5, 1);
    submit(&mut core, job(4, 2, 4), 2);
    let effects = core.take_effects();
    assert_eq!(
        launches(&effects),
        [("a".into(), vec![(1, 0, 0), (2, 1, 0)])]
    );
    assert!(matches!(
        &effects[1],
        Effect::Send { message: ExecutorMessage::LaunchTasks { tasks, .. }, .. }
            if tasks.iter().all(|t| t.cpus == 2)
    ));
    assert_eq!(free(&core, "a"), 1, "one core left, too few for a task");
    unchanged(&mut core, |core| core.tick(3));
    let effects = report(&mut core, "a", vec![finished(1, 0)], 4);
    assert_eq!(launches(&effects), [("a".into(), vec![(3, 2, 0)])]);
    assert_eq!(free(&core, "a"), 1);
    check_invariants(&core);
}

#[test]
fn a_task_needing_more_cpus_than_an_executor_has_waits() {
    let mut core = new_core(0);
    add(&mut core, "small", 4, 1);
    let (job_id, launched) = start(&mut core, job(1, 8, 4), 2);
    assert!(launched.is_empty());
    unchanged(&mut core, |core| core.tick(3));
    assert_eq!(free(&core, "small"), 4);
    assert_eq!(summary(&mut core, job_id).state, JobState::Running);

    let effects = add(&mut core, "big", 8, 4);
    assert_eq!(launches(&effects), [("big".into(), vec![(1, 0, 0)])]);
    assert_eq!((free(&core, "small"), free(&core, "big")), (4, 0));
    check_invariants(&core);
}

#[test]
fn jobs_are_served_first_in_first_out() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    let (first, launched) = start(&mut core, job(2, 1, 4), 2);
    assert_eq!(launched, [("a".into(), vec![(1, 0, 0)])]);
    let (second, launched) = start(&mut core, job(2, 1, 4), 3);
    assert!(launched.is_empty());

    let effects = report(&mut core, "a", vec![finished(1, 0)], 4);
    assert_eq!(
        launches(&effects),
        [("a".into(), vec![(2, 1, 0)])],
        "job {first} first"
    );
    let effects = report(&mut core, "a", vec![finished(2, 0)], 5);
    assert_eq!(job_ends(&effects), [job_succeeded(5, first, 2)]);
    assert_eq!(
        launches(&effects),
        [("a".into(), vec![(3, 0, 0)])],
        "then job {second}"
    );
    let effects = report(&mut core, "a", vec![finished(3, 0)], 6);
    assert_eq!(launches(&effects), [("a".into(), vec![(4, 1, 0)])]);
    let effects = report(&mut core, "a", vec![finished(4, 0)], 7);
    assert_eq!(job_ends(&effects), [job_succeeded(7, second, 2)]);
    check_invariants(&core);
}

#[test]
fn a_retry_keeps_its_job_ahead_of_younger_jobs() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    start(&mut core, job(1, 1, 4), 2); // task 1
    start(&mut core, job(1, 1, 4), 3); // task 2, waits

    // With one executor the retry goes straight back to it, before the younger job.
    let effects = report(&mut core, "a", vec![failed(1, 0, "boom")], 4);
    assert_eq!(launches(&effects), [("a".into(), vec![(1, 0, 1)])]);
    let effects = report(&mut core, "a", vec![finished(1, 1)], 5);
    assert_eq!(launches(&effects), [("a".into(), vec![(2, 0, 0)])]);
    check_invariants(&core);
}
