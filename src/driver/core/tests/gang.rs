//! Gangs: all of a job's tasks start in one offer round or none, the cores that free up gather
//! for a gang that waits (no job behind it takes them), a gang the cluster could never hold is
//! refused, and when one attempt fails the others stop and all run again together.

use super::*;
use crate::protocol::{TaskDescription, WaitReason};
use crate::resources::GANG_PORT;

fn gang(tasks: u32, cpus: u32, max_failures: u32) -> SubmitJob {
    SubmitJob {
        gang: true,
        ..job(tasks, cpus, max_failures)
    }
}

/// Registers `id` with `cores` cores and a gang port for each, as `ember-executor` does.
fn add_ported(core: &mut Core, id: &str, cores: u32, now: u64) {
    add_with_ports(core, id, cores, cores, now);
}

/// Registers `id` with `cores` cores and `ports` gang ports, 41000 on.
fn add_with_ports(core: &mut Core, id: &str, cores: u32, ports: u32, now: u64) {
    let mut request = registration(id, cores);
    if ports > 0 {
        let ports = (0..ports).map(|i| (41_000 + i).to_string()).collect();
        request.resources = [(GANG_PORT.to_string(), ports)].into();
    }
    assert_eq!(core.register(id, request, now), registered(id));
    core.take_effects();
}

/// How many tasks `launches` start in all.
fn launched(launches: &[Launch]) -> usize {
    launches.iter().map(|(_, tasks)| tasks.len()).sum()
}

#[test]
fn a_gang_starts_whole_or_not_at_all_and_holds_back_the_jobs_behind_it() {
    let mut core = new_core(0);
    add_ported(&mut core, "a", 2, 0);
    add_ported(&mut core, "b", 2, 0);
    // Two cores busy: the gang of three does not fit in the two left.
    let (first, started) = start(&mut core, job(2, 1, 1), 0);
    assert_eq!(launched(&started), 2);
    let (team, started) = start(&mut core, gang(3, 1, 1), 10);
    assert_eq!(started, []);
    // A job behind the gang does not take the free cores: they are the gang's.
    let (behind, started) = start(&mut core, job(1, 1, 1), 20);
    assert_eq!(started, []);
    assert_eq!(
        summary(&mut core, team).waits,
        [WaitReason::GangNeeds {
            tasks: 3,
            cores: 3,
            free: 2
        }]
    );
    check_invariants(&core);
    // One more core frees: all three start in one round, on both executors.
    let done = report(&mut core, "a", vec![finished(1, 0)], 30);
    let dealt = launches(&done);
    let gang_tasks: Vec<u32> = dealt
        .iter()
        .flat_map(|(_, tasks)| tasks.iter())
        .filter(|(task_id, _, _)| (3..=5).contains(task_id))
        .map(|(_, index, _)| *index)
        .collect();
    assert_eq!(gang_tasks.len(), 3, "{dealt:?}");
    let starts = events(&done)
        .into_iter()
        .filter(|e| matches!(e, Event::TaskStart { job_id, .. } if *job_id == team))
        .count();
    assert_eq!(starts, 1, "one TaskStart for the whole gang");
    assert_eq!(summary(&mut core, team).running, 3);
    // The job behind it runs once a core is free again.
    let effects = report(&mut core, "b", vec![finished(2, 0)], 40);
    assert_eq!(launched(&launches(&effects)), 1);
    assert_eq!(summary(&mut core, behind).running, 1);
    assert_eq!(summary(&mut core, first).state, JobState::Succeeded);
    check_invariants(&core);
}

#[test]
fn a_gang_the_cluster_could_never_hold_is_refused_and_speculation_with_one_too() {
    let mut core = new_core(0);
    add_ported(&mut core, "a", 4, 0);
    add_ported(&mut core, "b", 3, 0);
    // Two-core tasks: two fit on a, one on b.
    let error = api_error(unchanged(&mut core, |core| {
        core.api(ApiRequest::SubmitJob(gang(4, 2, 1)), 0)
    }));
    assert_eq!(
        error,
        "a gang of 4 tasks of 2 cores needs them all at once, and the executors registered \
         hold at most 3 such tasks at once (each holds one of its executor's gang ports)"
    );
    let speculative = SubmitJob {
        speculation: Some(Default::default()),
        ..gang(2, 1, 1)
    };
    let error = api_error(unchanged(&mut core, |core| {
        core.api(ApiRequest::SubmitJob(speculative), 0)
    }));
    assert!(error.contains("no speculative copies"), "{error}");
    // Three fit, idle.
    let (_, started) = start(&mut core, gang(3, 2, 1), 0);
    assert_eq!(launched(&started), 3);
    check_invariants(&core);
}

#[test]
fn when_one_attempt_fails_the_others_stop_and_all_run_again_together() {
    let mut core = new_core(0);
    add_ported(&mut core, "a", 4, 0);
    let (team, started) = start(&mut core, gang(3, 1, 2), 0);
    assert_eq!(launched(&started), 3);
    // Task 0 fails: 1 and 2 are told to stop; nothing starts while they run.
    let effects = report(&mut core, "a", vec![failed(1, 0, "boom")], 10);
    let kills = kill_tasks(&effects);
    let killed: Vec<TaskId> = kills.iter().map(|(_, task_id, _, _)| *task_id).collect();
    assert_eq!(killed, [2, 3]);
    assert!(kills[0].3.contains("another task of its gang"), "{kills:?}");
    assert_eq!(launches(&effects), []);
    assert_eq!(
        summary(&mut core, team).waits,
        [WaitReason::GangStopping { running: 2 }]
    );
    check_invariants(&core);
    let effects = report(&mut core, "a", vec![killed_update(2, 0)], 20);
    assert_eq!(launches(&effects), []);
    // The last one stops: all three start again, together.
    let effects = report(&mut core, "a", vec![killed_update(3, 0)], 30);
    let again = launches(&effects);
    assert_eq!(again, [("a".into(), vec![(1, 0, 1), (2, 1, 1), (3, 2, 1)])]);
    check_invariants(&core);
    // The stopped ones did not count as failures: with two attempts each, task 1 may fail
    // again and the gang runs a third time; task 0 has used its two.
    let effects = report(&mut core, "a", vec![failed(2, 1, "boom")], 40);
    assert_eq!(kill_tasks(&effects).len(), 2);
    let effects = report(
        &mut core,
        "a",
        vec![killed_update(1, 1), killed_update(3, 1)],
        50,
    );
    assert_eq!(
        launches(&effects),
        [("a".into(), vec![(1, 0, 2), (2, 1, 2), (3, 2, 2)])]
    );
    check_invariants(&core);
    report(
        &mut core,
        "a",
        vec![finished(1, 2), finished(2, 2), finished(3, 2)],
        60,
    );
    assert_eq!(summary(&mut core, team).state, JobState::Succeeded);
    check_invariants(&core);
}

fn killed_update(task_id: TaskId, attempt: u32) -> StatusUpdate {
    killed(task_id, attempt)
}

/// The `LaunchTasks` descriptions in `effects`, with the executor each goes to.
fn descriptions(effects: &[Effect]) -> Vec<(String, TaskDescription)> {
    let mut all = Vec::new();
    for effect in effects {
        if let Effect::Send {
            to,
            message: ExecutorMessage::LaunchTasks { tasks, .. },
        } = effect
        {
            all.extend(tasks.iter().map(|t| (to.to_string(), t.clone())));
        }
    }
    all.sort_by_key(|(_, t)| t.index);
    all
}

#[test]
fn each_task_of_a_gang_holds_a_port_of_its_executor_and_knows_its_peers_in_task_order() {
    let mut core = new_core(0);
    // b has four cores but two gang ports: it holds two gang tasks at most.
    add_ported(&mut core, "a", 2, 0);
    add_with_ports(&mut core, "b", 4, 2, 0);
    let error = api_error(unchanged(&mut core, |core| {
        core.api(ApiRequest::SubmitJob(gang(5, 1, 1)), 0)
    }));
    assert!(error.contains("at most 4 such tasks"), "{error}");
    let team = submit(&mut core, gang(4, 1, 1), 0);
    let effects = core.take_effects();
    let started = descriptions(&effects);
    assert_eq!(started.len(), 4, "{started:?}");
    let port = |t: &TaskDescription| t.resources[GANG_PORT].clone();
    let peers: Vec<String> = started
        .iter()
        .map(|(to, t)| format!("{to}.example:{}", port(t)[0]))
        .collect();
    for (to, task) in &started {
        assert_eq!(task.gang_peers, peers, "task {} on {to}", task.index);
        assert_eq!(port(task).len(), 1);
    }
    // No two tasks of one executor share a port.
    let mut held: Vec<(String, String)> = started
        .iter()
        .map(|(to, t)| (to.clone(), port(t)[0].clone()))
        .collect();
    held.sort();
    held.dedup();
    assert_eq!(held.len(), 4, "{held:?}");
    // The gang asks for a port per task; a plain job asks for none.
    assert_eq!(
        core.jobs[&team].resources,
        [(GANG_PORT.to_string(), 1)].into()
    );
    let plain = submit(&mut core, job(1, 1, 1), 0);
    assert!(core.jobs[&plain].resources.is_empty());
    core.take_effects();
    // A job may not ask for a gang port itself.
    let asked = SubmitJob {
        resources: [(GANG_PORT.to_string(), 1)].into(),
        ..job(1, 1, 1)
    };
    let error = api_error(unchanged(&mut core, |core| {
        core.api(ApiRequest::SubmitJob(asked), 0)
    }));
    assert!(error.contains("reserved"), "{error}");
    check_invariants(&core);
}

#[test]
fn a_gang_is_refused_when_no_executor_reserves_gang_ports() {
    let mut core = new_core(0);
    add(&mut core, "a", 8, 0);
    core.take_effects();
    let error = api_error(unchanged(&mut core, |core| {
        core.api(ApiRequest::SubmitJob(gang(2, 1, 1)), 0)
    }));
    assert_eq!(
        error,
        "a gang of 2 tasks needs a gang port for each task, and no executor registered \
         reserves any (ember-executor --gang-ports)"
    );
}
