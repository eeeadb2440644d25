//! The allocation signal with scripted time: the target rises 1, 2, 4 while tasks wait, stops at
//! what they need and at the maximum, drops when the work does; idle executors become
//! candidates only after the idle timeout and never below the target; a release refuses a busy
//! executor and keeps tasks off the one it releases.

use super::*;
use crate::driver::core::AllocationConfig;

fn allocating(min: u32, max: u32) -> Core {
    let mut core = new_core(0);
    core.set_allocation(AllocationConfig {
        min_executors: min,
        max_executors: max,
        backlog_timeout_ms: 1_000,
        idle_timeout_ms: 60_000,
    });
    core
}

/// Steps the signal at `now`; returns the target and the `ExecutorTarget` events it published.
fn step(core: &mut Core, now: u64) -> (u64, Vec<(u64, u64)>) {
    core.allocate(now);
    let changes = events(&core.take_effects())
        .into_iter()
        .filter_map(|e| match e {
            Event::ExecutorTarget {
                target_executors,
                previous,
                ..
            } => Some((previous, target_executors)),
            _ => None,
        })
        .collect();
    let target = core
        .allocation()
        .expect("the signal is on")
        .target_executors;
    (target, changes)
}

/// Ends every attempt running on `id` as finished.
fn finish_all(core: &mut Core, id: &str, now: u64) {
    let running: Vec<_> = running_attempts(core)
        .into_iter()
        .filter(|(e, _, _)| e.as_str() == id)
        .map(|(_, t, a)| finished(t, a))
        .collect();
    report(core, id, running, now);
}

#[test]
fn waiting_tasks_raise_the_target_exponentially_after_each_backlog_timeout() {
    let mut core = allocating(1, 100);
    add(&mut core, "exec-1", 2, 0);
    // 100 tasks of 1 core on executors of 2 cores: 50 executors' worth; 2 start at once.
    start(&mut core, job(100, 1, 4), 0);
    assert_eq!(step(&mut core, 0).0, 1, "the minimum");
    assert_eq!(step(&mut core, 500).0, 1, "not before the backlog timeout");
    let mut targets = Vec::new();
    for now in [1_000, 1_500, 2_000, 3_000, 4_000, 5_000, 6_000, 7_000] {
        targets.push(step(&mut core, now).0);
    }
    // +1 at 1 s, +2 at 2 s, +4 at 3 s, +8, +16, then capped at what the tasks need (50).
    assert_eq!(targets, [2, 2, 4, 8, 16, 32, 50, 50]);
    let status = core.allocation().unwrap();
    assert_eq!(status.executors_needed, 50);
    assert_eq!((status.tasks_waiting, status.tasks_running), (98, 2));
    assert_eq!(status.cores_per_executor, 2);
    assert_eq!(status.backlog_since_ms, Some(0));
    check_invariants(&core);
}

#[test]
fn the_target_stays_within_its_bounds_and_each_change_is_an_event() {
    let mut core = allocating(2, 5);
    add(&mut core, "exec-1", 1, 0);
    assert_eq!(
        step(&mut core, 0),
        (2, vec![]),
        "the minimum from the start"
    );
    start(&mut core, job(1_000, 1, 4), 0);
    let mut changes = Vec::new();
    for now in (1..=10).map(|s| s * 1_000) {
        changes.extend(step(&mut core, now).1);
    }
    assert_eq!(
        changes,
        [(2, 3), (3, 5)],
        "one event a change, capped at the maximum"
    );
}

#[test]
fn when_the_work_shrinks_the_target_drops_at_once_to_what_it_needs() {
    let mut core = allocating(1, 10);
    add(&mut core, "exec-1", 1, 0);
    let (job_id, _) = start(&mut core, job(20, 1, 4), 0);
    for now in [0, 1_000, 2_000, 3_000] {
        step(&mut core, now);
    }
    assert_eq!(core.allocation().unwrap().target_executors, 8);
    // The job is killed: nothing waits or runs, so nothing is needed.
    assert!(matches!(
        core.api(ApiRequest::KillJob { job_id }, 3_100),
        ApiReply::JobKilled { .. }
    ));
    core.take_effects();
    finish_all(&mut core, "exec-1", 3_100);
    let (target, changes) = step(&mut core, 3_200);
    assert_eq!((target, changes), (1, vec![(8, 1)]), "down to the minimum");
    assert!(core
        .allocation()
        .unwrap()
        .reason
        .contains("need 0 executors"));
}

#[test]
fn a_backlog_that_clears_before_the_timeout_raises_nothing() {
    let mut core = allocating(1, 10);
    add(&mut core, "exec-1", 4, 0);
    let (_, launched) = start(&mut core, job(4, 1, 4), 0);
    assert_eq!(
        launched[0].1.len(),
        4,
        "all four run at once: nothing waits"
    );
    for now in [1_000, 2_000, 5_000] {
        assert_eq!(step(&mut core, now), (1, vec![]));
    }
}

#[test]
fn idle_executors_become_candidates_after_the_idle_timeout_never_below_the_target() {
    let mut core = allocating(1, 10);
    for id in ["exec-1", "exec-2", "exec-3"] {
        add(&mut core, id, 1, 0);
    }
    start(&mut core, job(1, 1, 4), 0);
    step(&mut core, 0);
    let idle = |core: &Core| core.allocation().unwrap().idle.clone();
    step(&mut core, 59_999);
    assert!(idle(&core).is_empty(), "not before the idle timeout");
    step(&mut core, 60_000);
    // exec-1 runs the task; of the two idle, both may go: the target is 1 (the one running).
    assert_eq!(idle(&core), [eid("exec-2"), eid("exec-3")]);
    finish_all(&mut core, "exec-1", 70_000);
    step(&mut core, 100_000);
    assert_eq!(
        idle(&core),
        [eid("exec-2"), eid("exec-3")],
        "exec-1 has been idle only 30 s"
    );
    step(&mut core, 130_000);
    assert_eq!(idle(&core).len(), 2, "three idle, but the target (1) stays");
}

#[test]
fn a_release_refuses_a_busy_executor_and_keeps_tasks_off_the_one_it_releases() {
    let mut core = allocating(0, 10);
    add(&mut core, "exec-1", 1, 0);
    add(&mut core, "exec-2", 1, 0);
    let (_, launched) = start(&mut core, job(1, 1, 4), 0);
    let busy = launched[0].0.clone();
    let idle = if busy == "exec-1" { "exec-2" } else { "exec-1" };
    let release = |id: &str| ApiRequest::ReleaseExecutor {
        executor_id: eid(id),
    };
    let refused = api_error(unchanged(&mut core, |c| c.api(release(&busy), 1)));
    assert!(refused.contains("runs 1 tasks"), "{refused}");
    assert_eq!(
        core.api(release(idle), 2),
        ApiReply::Stopping { executors: 1 }
    );
    let effects = core.take_effects();
    assert!(
        effects.iter().any(|e| matches!(e,
        Effect::Send { to, message: ExecutorMessage::StopExecutor { .. } } if to.as_str() == idle))
    );
    // New work goes only to the executor not being released.
    start(&mut core, job(3, 1, 4), 3);
    finish_all(&mut core, &busy, 4);
    let running = running_attempts(&core);
    assert!(!running.is_empty());
    assert!(
        running.iter().all(|(to, _, _)| to.as_str() == busy),
        "{running:?}"
    );
    check_invariants(&core);
    // Asking again sends the decommission again (the first may have been lost).
    assert_eq!(
        core.api(release(idle), 5),
        ApiReply::Stopping { executors: 1 }
    );
    assert_eq!(core.take_effects().len(), 1);
    let missing = api_error(core.api(release("exec-9"), 6));
    assert!(missing.contains("no executor with id exec-9"), "{missing}");
}

#[test]
fn without_the_signal_nothing_is_published() {
    let mut core = new_core(0);
    add(&mut core, "exec-1", 1, 0);
    start(&mut core, job(10, 1, 4), 0);
    for now in [1_000, 2_000, 3_000] {
        core.allocate(now);
        assert!(core.take_effects().is_empty());
    }
    assert!(core.allocation().is_none());
    assert!(core.executors_snapshot().allocation.is_none());
}
