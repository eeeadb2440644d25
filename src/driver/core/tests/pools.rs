//! Scheduling modes: FIFO with priorities, and FAIR sharing between pools.

use super::*;
use crate::driver::core::{PoolConfig, Scheduling, SchedulingMode};

fn in_pool(tasks: u32, pool: &str) -> SubmitJob {
    SubmitJob {
        pool: Some(pool.into()),
        ..job(tasks, 1, 4)
    }
}

fn with_priority(tasks: u32, priority: i32) -> SubmitJob {
    SubmitJob {
        priority,
        ..job(tasks, 1, 4)
    }
}

fn fair(core: &mut Core, pools: &[&str]) {
    let pools = pools
        .iter()
        .map(|p| PoolConfig::parse(p).unwrap())
        .collect();
    core.set_scheduling(Scheduling::new(SchedulingMode::Fair, pools).unwrap());
}

/// Registers `n` executors of one core each, `x1`..`xn`.
fn executors(core: &mut Core, n: u32, now: u64) {
    for i in 1..=n {
        add(core, &format!("x{i}"), 1, now);
    }
}

/// How many attempts of each job run now, by job id.
fn running_by_job(core: &mut Core) -> BTreeMap<JobId, u32> {
    list_jobs(core)
        .into_iter()
        .filter(|j| j.state == JobState::Running)
        .map(|j| (j.job_id, j.running))
        .collect()
}

/// Each running attempt: (executor, task id, attempt), oldest task first.
fn attempts(core: &Core) -> Vec<(ExecutorId, TaskId, u32)> {
    let mut running = running_attempts(core);
    running.sort_by_key(|(_, task, _)| *task);
    running
}

/// Finishes the running attempt of task `task_id`, wherever it runs.
fn finish(core: &mut Core, task_id: TaskId, now: u64) {
    let (executor, _, attempt) = attempts(core)
        .into_iter()
        .find(|(_, t, _)| *t == task_id)
        .expect("the task runs");
    report(
        core,
        executor.as_str(),
        vec![finished(task_id, attempt)],
        now,
    );
    check_invariants(core);
}

#[test]
fn fifo_runs_higher_priority_first_then_older() {
    let mut core = new_core(0);
    add(&mut core, "e1", 1, 0);
    let first = submit(&mut core, job(2, 1, 4), 1);
    let low = submit(&mut core, with_priority(1, -5), 2);
    let plain = submit(&mut core, job(1, 1, 4), 3);
    let high = submit(&mut core, with_priority(1, 7), 4);
    let high_too = submit(&mut core, with_priority(1, 7), 5);
    core.take_effects();
    check_invariants(&core);
    // The first job holds the core; its second task still waits, at priority 0.
    assert_eq!(
        core.queue.iter().copied().collect::<Vec<_>>(),
        [high, high_too, first, plain, low]
    );
    let mut order = Vec::new();
    for now in 10..16 {
        let (_, task, _) = attempts(&core)[0].clone();
        order.push(core.locate(task).unwrap().0);
        finish(&mut core, task, now);
    }
    assert_eq!(order, [first, high, high_too, first, plain, low]);
    assert_eq!(summary(&mut core, high).priority, 7);
    assert_eq!(summary(&mut core, low).priority, -5);
}

#[test]
fn a_retry_keeps_its_job_s_place_by_priority() {
    let mut core = new_core(0);
    add(&mut core, "e1", 1, 0);
    let low = submit(&mut core, with_priority(1, -1), 1);
    let high = submit(&mut core, with_priority(2, 3), 2);
    core.take_effects();
    // The low job's task runs (it came first); the high job's two wait.
    let (_, task, _) = attempts(&core)[0].clone();
    assert_eq!(core.locate(task).unwrap().0, low);
    report(&mut core, "e1", vec![failed(task, 0, "boom")], 3);
    check_invariants(&core);
    assert_eq!(core.queue.iter().copied().collect::<Vec<_>>(), [high, low]);
    let (_, task, _) = attempts(&core)[0].clone();
    assert_eq!(core.locate(task).unwrap().0, high);
}

#[test]
fn out_of_range_priorities_and_bad_pool_names_are_refused_with_the_rule() {
    let mut core = new_core(0);
    for (submission, says) in [
        (
            with_priority(1, 1001),
            "priority must be between -1000 and 1000",
        ),
        (with_priority(1, -1001), "priority must be between"),
        (in_pool(1, ""), "may not be empty"),
        (in_pool(1, "a/b"), "use letters, digits"),
        (in_pool(1, &"p".repeat(65)), "longer than 64 bytes"),
    ] {
        let reply = unchanged(&mut core, |core| {
            core.api(ApiRequest::SubmitJob(submission), 0)
        });
        let error = api_error(reply);
        assert!(error.contains(says), "{error}");
    }
}

#[test]
fn fair_pools_of_weights_1_and_3_share_the_cores_1_to_3() {
    let mut core = new_core(0);
    fair(&mut core, &["light:weight=1", "heavy:weight=3"]);
    executors(&mut core, 8, 0);
    let light = submit(&mut core, in_pool(100, "light"), 1);
    let heavy = submit(&mut core, in_pool(100, "heavy"), 2);
    // The light pool took all 8 cores before the heavy job came; as its tasks end, the cores
    // go to the heavy pool until it has its share.
    core.take_effects();
    check_invariants(&core);
    let mut now = 10;
    for _ in 0..6 {
        let (_, task, _) = attempts(&core)[0].clone();
        finish(&mut core, task, now);
        now += 1;
    }
    assert_eq!(
        running_by_job(&mut core),
        BTreeMap::from([(light, 2), (heavy, 6)])
    );
    // And it holds while both have tasks waiting: a freed core goes back to the pool it
    // came from.
    for _ in 0..40 {
        let (_, task, _) = attempts(&core)[now as usize % 8].clone();
        finish(&mut core, task, now);
        now += 1;
        assert_eq!(
            running_by_job(&mut core),
            BTreeMap::from([(light, 2), (heavy, 6)])
        );
    }
    assert_eq!(
        core.pool_counts(),
        [("light".to_string(), 2, 1), ("heavy".to_string(), 6, 1)]
    );
}

#[test]
fn fair_pools_split_free_cores_by_weight_in_one_round() {
    let mut core = new_core(0);
    fair(&mut core, &["light:weight=1", "heavy:weight=3"]);
    let light = submit(&mut core, in_pool(100, "light"), 1);
    let heavy = submit(&mut core, in_pool(100, "heavy"), 2);
    // One round deals 8 cores, one task at a time, each to the pool furthest below its share.
    executors(&mut core, 4, 3);
    assert_eq!(
        running_by_job(&mut core),
        BTreeMap::from([(light, 1), (heavy, 3)])
    );
    add(&mut core, "big", 4, 4);
    check_invariants(&core);
    assert_eq!(
        running_by_job(&mut core),
        BTreeMap::from([(light, 2), (heavy, 6)])
    );
}

#[test]
fn a_pool_below_its_minimum_share_is_served_first() {
    let mut core = new_core(0);
    fair(&mut core, &["small:weight=1,min-share=3", "big:weight=10"]);
    let big = submit(&mut core, in_pool(100, "big"), 1);
    let small = submit(&mut core, in_pool(100, "small"), 2);
    add(&mut core, "e1", 4, 3);
    check_invariants(&core);
    // By weight alone the big pool would take every core; the small one has 3 first.
    assert_eq!(
        running_by_job(&mut core),
        BTreeMap::from([(big, 1), (small, 3)])
    );
}

#[test]
fn a_job_naming_an_undeclared_pool_runs_in_one_of_the_defaults() {
    let mut core = new_core(0);
    fair(&mut core, &["prod:weight=1"]);
    let prod = submit(&mut core, in_pool(10, "prod"), 1);
    let adhoc = submit(&mut core, in_pool(2, "adhoc"), 2);
    let plain = submit(&mut core, job(2, 1, 4), 3);
    add(&mut core, "e1", 6, 4);
    check_invariants(&core);
    // Three pools of weight 1: two cores each.
    assert_eq!(
        running_by_job(&mut core),
        BTreeMap::from([(prod, 2), (adhoc, 2), (plain, 2)])
    );
    assert_eq!(summary(&mut core, adhoc).pool.as_deref(), Some("adhoc"));
    assert_eq!(summary(&mut core, plain).pool, None);
    let mut pools = core.pool_counts();
    pools.sort();
    assert_eq!(
        pools,
        [
            ("adhoc".to_string(), 2, 1),
            ("default".to_string(), 2, 1),
            ("prod".to_string(), 2, 1)
        ]
    );
    // Once its jobs are done, an undeclared pool goes; a declared one stays.
    for (_, task, _) in attempts(&core) {
        if core.locate(task).unwrap().0 != prod {
            finish(&mut core, task, 10);
        }
    }
    let names: Vec<String> = core.pool_counts().into_iter().map(|p| p.0).collect();
    assert_eq!(names, ["prod"]);
    assert_eq!(running_by_job(&mut core), BTreeMap::from([(prod, 6)]));
}

#[test]
fn a_fair_pool_shares_between_its_jobs_and_a_fifo_pool_does_not() {
    let mut core = new_core(0);
    fair(&mut core, &["shared:mode=fair", "queued:mode=fifo"]);
    let shared = [
        submit(&mut core, in_pool(10, "shared"), 1),
        submit(&mut core, in_pool(10, "shared"), 2),
    ];
    let queued = [
        submit(&mut core, in_pool(10, "queued"), 3),
        submit(&mut core, in_pool(10, "queued"), 4),
    ];
    add(&mut core, "e1", 8, 5);
    check_invariants(&core);
    assert_eq!(
        running_by_job(&mut core),
        BTreeMap::from([
            (shared[0], 2),
            (shared[1], 2),
            (queued[0], 4),
            (queued[1], 0)
        ])
    );
}

#[test]
fn a_killed_job_s_cores_count_for_its_pool_until_its_attempts_end() {
    let mut core = new_core(0);
    fair(&mut core, &["a", "b"]);
    let a = submit(&mut core, in_pool(10, "a"), 1);
    executors(&mut core, 2, 2);
    let b = submit(&mut core, in_pool(10, "b"), 3);
    core.take_effects();
    assert_eq!(
        core.pool_counts(),
        [("a".to_string(), 2, 1), ("b".to_string(), 0, 1)]
    );
    core.api(ApiRequest::KillJob { job_id: a }, 4);
    core.take_effects();
    check_invariants(&core);
    assert_eq!(
        core.pool_counts(),
        [("a".to_string(), 2, 0), ("b".to_string(), 0, 1)]
    );
    for (executor, task, attempt) in attempts(&core) {
        report(&mut core, executor.as_str(), vec![killed(task, attempt)], 5);
        check_invariants(&core);
    }
    assert_eq!(running_by_job(&mut core), BTreeMap::from([(b, 2)]));
    assert_eq!(
        core.pool_counts(),
        [("a".to_string(), 0, 0), ("b".to_string(), 2, 1)]
    );
}

#[test]
fn a_restored_driver_keeps_pools_and_priorities() {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    let low = submit(&mut core, in_pool(4, "light"), 1);
    let high = submit(
        &mut core,
        SubmitJob {
            priority: 9,
            ..in_pool(12, "heavy")
        },
        2,
    );
    take_journal(&mut core, &mut journal);
    // FIFO by priority: the later, higher job first.
    let mut fifo = restored(&journal, 1);
    assert_eq!(fifo.queue.iter().copied().collect::<Vec<_>>(), [high, low]);
    let job = summary(&mut fifo, high);
    assert_eq!((job.pool.as_deref(), job.priority), (Some("heavy"), 9));
    // FAIR by weight, whether it is set before the replay or after.
    let mut before = core_retaining(10);
    fair(&mut before, &["light:weight=1", "heavy:weight=3"]);
    for record in &journal {
        before.replay(record.clone()).unwrap();
    }
    before.resume(0);
    let mut after = restored(&journal, 2);
    fair(&mut after, &["light:weight=1", "heavy:weight=3"]);
    for core in [&mut before, &mut after] {
        check_invariants(core);
        add(core, "e1", 8, 10);
        check_invariants(core);
        assert_eq!(running_by_job(core), BTreeMap::from([(low, 2), (high, 6)]));
    }
    // A snapshot carries them too.
    let snapshot = snapshot_record(&before, 1, 20);
    let mut again = restored(&[snapshot], 1);
    let job = summary(&mut again, high);
    assert_eq!((job.pool.as_deref(), job.priority), (Some("heavy"), 9));
}

#[test]
fn list_pools_shows_each_pool_in_the_order_offers_serve_them() {
    let mut core = new_core(0);
    assert_eq!(
        core.api(ApiRequest::ListPools, 0),
        ApiReply::Pools {
            scheduling: "fifo".into(),
            pools: vec![]
        }
    );
    fair(
        &mut core,
        &["light:weight=1", "heavy:weight=3,min-share=1,mode=fair"],
    );
    submit(&mut core, in_pool(10, "light"), 1);
    submit(&mut core, in_pool(10, "heavy"), 2);
    submit(&mut core, in_pool(10, "adhoc"), 3);
    add(&mut core, "e1", 5, 4);
    let ApiReply::Pools { scheduling, pools } = core.api(ApiRequest::ListPools, 5) else {
        panic!("not a Pools reply");
    };
    assert_eq!(scheduling, "fair");
    let shown: Vec<_> = pools
        .iter()
        .map(|p| {
            (
                p.name.as_str(),
                p.declared,
                p.running_cores,
                p.jobs,
                p.mode.as_str(),
            )
        })
        .collect();
    // heavy 3/3, then adhoc 1/1 and light 1/1 by name: the order the next free core follows.
    assert_eq!(
        shown,
        [
            ("adhoc", false, 1, 1, "fifo"),
            ("heavy", true, 3, 1, "fair"),
            ("light", true, 1, 1, "fifo")
        ]
    );
    assert_eq!((pools[1].weight, pools[1].min_share), (3, 1));
}
