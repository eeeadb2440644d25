//! Custom resources: an offer takes a task only where every resource it asks for is free,
//! hands it the addresses it got, and gets them back however the attempt ends; a job that asks
//! for more than any executor has waits, and says why.

use super::*;
use crate::protocol::{ResourceCount, TaskDescription};

/// Registers `id` with `cores` and the resources `resources` (name, count: addresses 0..count).
fn add_with(core: &mut Core, id: &str, cores: u32, resources: &[(&str, u32)], now: u64) {
    let mut request = registration(id, cores);
    request.resources = resources
        .iter()
        .map(|(name, n)| (name.to_string(), (0..*n).map(|i| i.to_string()).collect()))
        .collect();
    assert_eq!(core.register(id, request, now), registered(id));
    let effects = core.take_effects();
    check_effects(core, &effects);
}

/// A job of `tasks` no-op tasks that each ask for `resources`.
fn asking(tasks: u32, resources: &[(&str, u32)]) -> SubmitJob {
    let mut submission = job(tasks, 1, 4);
    submission.resources = resources
        .iter()
        .map(|(name, n)| (name.to_string(), *n))
        .collect();
    submission
}

/// Every task launched in `effects`, with the executor it went to.
fn launched(effects: &[Effect]) -> Vec<(String, TaskDescription)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send {
                to,
                message: ExecutorMessage::LaunchTasks { tasks, .. },
            } => Some(tasks.iter().map(|t| (to.to_string(), t.clone()))),
            _ => None,
        })
        .flatten()
        .collect()
}

/// The addresses of `name` each launched task got, by task id.
fn addresses(tasks: &[(String, TaskDescription)], name: &str) -> Vec<(TaskId, Vec<String>)> {
    tasks
        .iter()
        .map(|(_, t)| {
            (
                t.task_id,
                t.resources.get(name).cloned().unwrap_or_default(),
            )
        })
        .collect()
}

fn gpus(core: &Core, id: &str) -> ResourceCount {
    core.executors_snapshot()
        .executors
        .into_iter()
        .find(|e| e.executor_id.as_str() == id)
        .and_then(|e| e.resources.get("gpu").copied())
        .unwrap_or_default()
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn an_offer_takes_only_free_resources_and_hands_out_their_addresses() {
    let mut core = new_core(0);
    add_with(&mut core, "a", 4, &[("gpu", 2)], 1);
    add_with(&mut core, "b", 4, &[], 1);
    let job_id = submit(&mut core, asking(3, &[("gpu", 1)]), 2);
    let effects = core.take_effects();
    check_effects(&core, &effects);
    let tasks = launched(&effects);
    // Only `a` has GPUs, and only two: the third task waits though cores are free everywhere.
    assert!(tasks.iter().all(|(to, _)| to == "a"), "{tasks:?}");
    assert_eq!(
        addresses(&tasks, "gpu"),
        [(1, strings(&["0"])), (2, strings(&["1"]))]
    );
    assert_eq!(gpus(&core, "a"), ResourceCount { total: 2, free: 0 });
    assert_eq!(free(&core, "a"), 2, "cores are taken as well");
    check_invariants(&core);
    assert_eq!(
        summary(&mut core, job_id).waiting,
        None,
        "it waits its turn"
    );
    // A job that asks for none runs beside it, on cores alone.
    let (_, plain) = start(&mut core, job(2, 1, 4), 3);
    assert_eq!(plain.len(), 2, "{plain:?}");
    // Task 1 finishes: its GPU 0 goes to the third task.
    let effects = report(&mut core, "a", vec![finished(1, 0)], 4);
    let tasks = launched(&effects);
    assert_eq!(addresses(&tasks, "gpu"), [(3, strings(&["0"]))]);
    check_invariants(&core);
}

#[test]
fn resources_come_back_however_the_attempt_ends() {
    let mut core = new_core(0);
    add_with(&mut core, "a", 8, &[("gpu", 2), ("fpga", 1)], 1);
    let asked = [("gpu", 2), ("fpga", 1)];
    let (job_id, first) = start(&mut core, asking(5, &asked), 2);
    assert_eq!(first, [("a".into(), vec![(1, 0, 0)])], "one at a time");
    let next = |effects: &[Effect]| -> Vec<TaskId> {
        launched(effects).iter().map(|(_, t)| t.task_id).collect()
    };
    // Finished: the next task gets both GPUs and the FPGA.
    let effects = report(&mut core, "a", vec![finished(1, 0)], 3);
    assert_eq!(next(&effects), [2]);
    assert_eq!(
        launched(&effects)[0].1.resources,
        [
            ("fpga".to_string(), strings(&["0"])),
            ("gpu".to_string(), strings(&["0", "1"]))
        ]
        .into()
    );
    // Failed (and retried): freed, and the retry or the next task takes them.
    let effects = report(&mut core, "a", vec![failed(2, 0, "boom")], 4);
    assert_eq!(next(&effects).len(), 1);
    check_invariants(&core);
    // Killed by request: freed.
    let running = running_attempts(&core);
    assert_eq!(running.len(), 1);
    let (_, task_id, attempt) = running[0].clone();
    let (_, index) = core.locate(task_id).unwrap();
    let kill = ApiRequest::KillJobTask {
        job_id,
        index,
        retry: false,
    };
    assert!(matches!(core.api(kill, 5), ApiReply::TaskKilled { .. }));
    core.take_effects();
    let effects = report(&mut core, "a", vec![killed(task_id, attempt)], 6);
    assert_eq!(next(&effects).len(), 1, "the kill freed them for the next");
    check_invariants(&core);
    // Lost with its executor: the registry forgets the executor's resources with it.
    core.remove_executor(&eid("a"), "gone".into(), 7);
    core.take_effects();
    check_invariants(&core);
    add_with(&mut core, "b", 8, &[("gpu", 2), ("fpga", 1)], 8);
    assert_eq!(gpus(&core, "b"), ResourceCount { total: 2, free: 0 });
    // Lost in reconciliation (the executor does not run it): freed too.
    let running = running_attempts(&core);
    let heartbeat = crate::protocol::HeartbeatRequest::Heartbeat {
        executor_id: eid("b"),
        instance_id: instance_of("b"),
        running: vec![],
        driver_instance: Some(core.config.driver_instance),
        objects: Default::default(),
        connection: None,
        abandoned: Vec::new(),
    };
    core.heartbeat("b", heartbeat, 8 + 60_000);
    let effects = core.take_effects();
    check_effects(&core, &effects);
    let relaunched = next(&effects);
    assert_eq!(relaunched.len(), 1, "lost, then launched again");
    assert_eq!(relaunched[0], running[0].1, "the same task runs again");
    check_invariants(&core);
}

#[test]
fn a_job_asking_more_than_any_executor_has_waits_and_says_why() {
    let mut core = new_core(0);
    add_with(&mut core, "a", 2, &[("gpu", 2)], 1);
    add_with(&mut core, "b", 2, &[("gpu", 1)], 1);
    let job_id = submit(&mut core, asking(2, &[("gpu", 4)]), 2);
    let effects = core.take_effects();
    assert_eq!(launches(&effects), []);
    let waiting = summary(&mut core, job_id).waiting;
    assert_eq!(
        waiting.as_deref(),
        Some("no executor has gpu=4; largest: gpu=2")
    );
    let listed = list_jobs(&mut core);
    assert_eq!(listed[0].waiting, waiting, "ListJobs says so too");
    // A resource no executor registered is not an error: one may register later.
    let other = submit(&mut core, asking(1, &[("tpu", 1)]), 3);
    core.take_effects();
    assert_eq!(
        summary(&mut core, other).waiting.as_deref(),
        Some("no executor has tpu=1; none registered has tpu")
    );
    // Each resource somewhere, but not together on one executor.
    add_with(&mut core, "c", 2, &[("fpga", 1)], 4);
    let apart = submit(&mut core, asking(1, &[("gpu", 1), ("fpga", 1)]), 4);
    core.take_effects();
    assert_eq!(
        summary(&mut core, apart).waiting.as_deref(),
        Some("no executor has fpga=1, gpu=1 together")
    );
    // Cores count as well.
    let mut wide = asking(1, &[("gpu", 1)]);
    wide.cpus_per_task = 4;
    add_with(&mut core, "d", 4, &[], 5);
    let wide = submit(&mut core, wide, 5);
    core.take_effects();
    assert_eq!(
        summary(&mut core, wide).waiting.as_deref(),
        Some("no executor with 4 cores has gpu=1; none registered has gpu")
    );
    // A job of more cores per task than any executor has says so too.
    let mut cores = job(1, 16, 4);
    cores.name = "wide".into();
    let cores = submit(&mut core, cores, 5);
    core.take_effects();
    assert_eq!(
        summary(&mut core, cores).waiting.as_deref(),
        Some("no executor has 16 cores; largest: 4")
    );
    // The executor that has them registers: the first job runs, and no longer waits.
    add_with(&mut core, "big", 8, &[("gpu", 8)], 6);
    assert_eq!(summary(&mut core, job_id).waiting, None);
    assert_eq!(gpus(&core, "big"), ResourceCount { total: 8, free: 0 });
    check_invariants(&core);
}

#[test]
fn bad_requests_and_registrations_are_refused_with_a_reason() {
    let mut core = new_core(0);
    for (asked, words) in [
        (asking(1, &[("gpu", 0)]), "between 1 and"),
        (asking(1, &[("GPU", 1)]), "not valid"),
        (asking(1, &[("gpu", 5000)]), "between 1 and"),
    ] {
        let message = api_error(core.api(ApiRequest::SubmitJob(asked), 1));
        assert!(message.contains(words), "{message}");
    }
    let mut request = registration("a", 1);
    request.resources = [("gpu".to_string(), strings(&["0", "0"]))].into();
    match core.register("a", request, 1) {
        RegisterReply::RegisterExecutorFailed { message } => {
            assert!(message.contains("twice"), "{message}")
        }
        other => panic!("a duplicate address was accepted: {other:?}"),
    }
    assert!(core.executors().is_empty());
}

#[test]
fn the_start_gate_says_why_offers_wait() {
    let mut core = new_core(0);
    core.set_start_gate(
        crate::driver::core::StartGate {
            min_registered: 2,
            max_wait_ms: 30_000,
        },
        0,
    );
    add(&mut core, "a", 1, 1);
    let job_id = submit(&mut core, job(1, 1, 4), 2);
    core.take_effects();
    let waiting = summary(&mut core, job_id).waiting.unwrap_or_default();
    assert!(
        waiting.contains("start gate: 1 executor registered of the 2 required"),
        "{waiting}"
    );
    add(&mut core, "b", 1, 3);
    assert_eq!(summary(&mut core, job_id).waiting, None);
}

#[test]
fn a_restarted_driver_rebuilds_the_request_from_the_journal() {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    add_with(&mut core, "a", 2, &[("gpu", 1)], 1);
    submit(&mut core, asking(2, &[("gpu", 1)]), 2);
    take_journal(&mut core, &mut journal);
    journal.push(snapshot_record(&core, 1, 3));
    for records in [&journal[..1], &journal[1..]] {
        let mut restored = restored(records, 2);
        assert_eq!(restored.jobs[&1].resources, [("gpu".to_string(), 1)].into());
        // Executors come back with all their resources free, as their cores.
        add_with(&mut restored, "a", 2, &[("gpu", 1)], 10);
        let running = running_attempts(&restored);
        assert_eq!(running.len(), 1, "one GPU, one task");
        check_invariants(&restored);
    }
}
