//! Placement: constraints keep a job's tasks on the executors whose attributes meet them, and a
//! job no live executor meets waits and says why; preferred executors get the tasks while they
//! have free slots, and others only once the locality wait has passed.

use super::*;
use crate::placement::Placement;

/// Registers `id` with `cores` and the attributes `attributes`.
fn add_with(core: &mut Core, id: &str, cores: u32, attributes: &[(&str, &str)], now: u64) {
    let mut request = registration(id, cores);
    request.attributes = attributes
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(core.register(id, request, now), registered(id));
    let effects = core.take_effects();
    check_effects(core, &effects);
}

/// A job of `tasks` no-op tasks placed as `placement` says.
fn placed(tasks: u32, placement: Placement) -> SubmitJob {
    SubmitJob {
        placement,
        ..job(tasks, 1, 4)
    }
}

fn constrained(tasks: u32, constraints: &[&str]) -> SubmitJob {
    placed(
        tasks,
        Placement {
            constraints: constraints.iter().map(|c| c.to_string()).collect(),
            ..Default::default()
        },
    )
}

/// A job that prefers the executors `executors`, waiting `wait_ms` for them.
fn preferring(tasks: u32, executors: &[&str], wait_ms: Option<u64>) -> SubmitJob {
    placed(
        tasks,
        Placement {
            prefer_executors: executors.iter().map(|e| eid(e)).collect(),
            locality_wait_ms: wait_ms,
            ..Default::default()
        },
    )
}

/// How many tasks each executor was sent in `effects`.
fn sent(effects: &[Effect]) -> BTreeMap<String, usize> {
    tally(&launches(effects))
}

/// How many tasks each executor got in `launched`.
fn tally(launched: &[Launch]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (to, tasks) in launched {
        *counts.entry(to.clone()).or_default() += tasks.len();
    }
    counts
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect()
}

/// Every running attempt of `job` runs on an executor that meets its constraints, read again
/// from the text submitted and the attributes registered.
pub(super) fn check_placement(core: &Core, job: &super::super::Job) {
    let Some(placement) = &job.placement else {
        return;
    };
    let constraints = placement
        .wire
        .validate()
        .expect("accepted constraints parse");
    for (index, record) in job.tasks.launched().iter().enumerate() {
        let (TaskStatus::Running, Some(executor)) = (record.status, &record.executor) else {
            continue;
        };
        let Some(data) = core.executors.get(executor) else {
            continue;
        };
        for c in &constraints {
            assert!(
                c.holds(&data.info.attributes),
                "task {index} of job {} runs on {executor}, which does not meet {c}",
                job.id
            );
        }
    }
}

fn tick(core: &mut Core, now: u64) -> Vec<Effect> {
    core.tick(now);
    let effects = core.take_effects();
    check_effects(core, &effects);
    check_invariants(core);
    effects
}

#[test]
fn a_constrained_job_runs_only_where_every_constraint_holds() {
    let mut core = new_core(0);
    add_with(&mut core, "a", 4, &[("rack", "r1"), ("os", "linux")], 1);
    add_with(&mut core, "b", 4, &[("rack", "r2"), ("os", "linux")], 1);
    add_with(&mut core, "c", 4, &[("rack", "r1"), ("os", "windows")], 1);
    add_with(&mut core, "d", 4, &[("os", "freebsd")], 1);
    let (job_id, launched) = start(
        &mut core,
        constrained(10, &["rack!=r2", "os in (linux, freebsd)"]),
        2,
    );
    // `a` meets both; `d` has no rack, so it meets rack!=r2; `b` and `c` meet one each.
    let mut on: Vec<&str> = launched.iter().map(|(to, _)| to.as_str()).collect();
    on.sort();
    assert_eq!(on, ["a", "d"]);
    assert_eq!(tally(&launched), counts(&[("a", 4), ("d", 4)]));
    check_invariants(&core);
    assert_eq!(
        summary(&mut core, job_id).waiting,
        None,
        "it waits its turn"
    );
    // A job without placement takes the rest, beside it.
    let (_, plain) = start(&mut core, job(8, 1, 4), 3);
    let on: BTreeSet<&str> = plain.iter().map(|(to, _)| to.as_str()).collect();
    assert_eq!(on, ["b", "c"].into());
    // A slot freed on `b` goes to nothing of the constrained job.
    let effects = report(&mut core, "b", vec![finished(11, 0)], 4);
    assert!(launches(&effects).is_empty(), "{effects:?}");
    let effects = report(&mut core, "a", vec![finished(1, 0)], 5);
    assert_eq!(sent(&effects), counts(&[("a", 1)]));
    check_invariants(&core);
    assert_eq!(
        summary(&mut core, job_id).placement.unwrap().constraints,
        ["rack!=r2", "os in (linux, freebsd)"],
        "the summary shows the constraints as submitted"
    );
}

#[test]
fn a_job_no_live_executor_meets_waits_and_says_which_constraint() {
    let mut core = new_core(0);
    add_with(&mut core, "a", 2, &[("rack", "r1"), ("zone", "z1")], 1);
    add_with(&mut core, "b", 2, &[("rack", "r2"), ("zone", "z2")], 1);
    let (job_id, launched) = start(&mut core, constrained(3, &["zone!=z3", "rack=r9"]), 2);
    assert!(launched.is_empty(), "{launched:?}");
    assert_eq!(
        summary(&mut core, job_id).waiting.as_deref(),
        Some("no live executor meets rack=r9")
    );
    // Each is met somewhere, but not both on one executor.
    let (other, _) = start(&mut core, constrained(1, &["rack=r1", "zone=z2"]), 3);
    assert_eq!(
        summary(&mut core, other).waiting.as_deref(),
        Some("no live executor meets rack=r1, zone=z2 together")
    );
    assert!(tick(&mut core, 1_000).iter().all(|e| !matches!(
        e,
        Effect::Send {
            message: ExecutorMessage::LaunchTasks { .. },
            ..
        }
    )));
    // An executor meets it, but has too few cores for a task, though another has them.
    add_with(&mut core, "s", 1, &[("rack", "r5")], 4);
    let big = SubmitJob {
        cpus_per_task: 2,
        ..constrained(1, &["rack=r5"])
    };
    let (small, _) = start(&mut core, big, 5);
    assert_eq!(
        summary(&mut core, small).waiting.as_deref(),
        Some("no live executor that meets rack=r5 has 2 cores for a task")
    );
    // An executor that meets them registers: the tasks run there, and the job no longer waits.
    add_with(&mut core, "c", 4, &[("rack", "r9")], 2_000);
    let mut on: Vec<String> = core
        .executors()
        .iter()
        .filter(|(_, e)| !e.running.is_empty())
        .map(|(id, _)| id.to_string())
        .collect();
    on.sort();
    assert_eq!(on, ["c"]);
    assert_eq!(core.executors()[&eid("c")].running.len(), 3);
    assert_eq!(summary(&mut core, job_id).waiting, None);
}

#[test]
fn a_malformed_constraint_is_refused_by_name_and_changes_nothing() {
    let mut core = new_core(0);
    add_with(&mut core, "a", 2, &[("rack", "r1")], 1);
    for (bad, named) in [
        (constrained(1, &["rack=r1", "zone in z1"]), "\"zone in z1\""),
        (constrained(1, &["rack"]), "\"rack\""),
        (
            placed(
                1,
                Placement {
                    prefer_hosts: vec!["two words".into()],
                    ..Default::default()
                },
            ),
            "\"two words\"",
        ),
        (preferring(1, &["a"], Some(u64::MAX)), "locality_wait_ms"),
    ] {
        let message = unchanged(&mut core, |core| {
            api_error(core.api(ApiRequest::SubmitJob(bad), 2))
        });
        assert!(message.contains(named), "{message}");
    }
}

#[test]
fn a_retry_avoids_its_executor_only_for_one_that_meets_the_constraints() {
    let mut core = new_core(0);
    add_with(&mut core, "a", 1, &[("rack", "r1")], 1);
    add_with(&mut core, "b", 4, &[], 1);
    let (_, launched) = start(&mut core, constrained(1, &["rack=r1"]), 2);
    assert_eq!(launched, [("a".to_string(), vec![(1, 0, 0)])]);
    // `b` has free cores but does not meet rack=r1: the retry runs on `a` again.
    let effects = report(&mut core, "a", vec![failed(1, 0, "boom")], 3);
    assert_eq!(launches(&effects), [("a".to_string(), vec![(1, 0, 1)])]);
    check_invariants(&core);
}

#[test]
fn preferred_executors_get_the_tasks_and_others_only_after_the_locality_wait() {
    let mut core = new_core(0);
    add(&mut core, "o", 2, 1);
    add(&mut core, "p", 1, 1);
    let (job_id, launched) = start(&mut core, preferring(5, &["p"], None), 10);
    // `p` has one slot; `o`, not preferred, gets nothing while the wait (3s) runs.
    assert_eq!(launched, [("p".to_string(), vec![(1, 0, 0)])]);
    assert!(launches(&tick(&mut core, 3_009)).is_empty());
    // The wait is over: `o` takes any task.
    assert_eq!(sent(&tick(&mut core, 3_010)), counts(&[("o", 2)]));
    // A slot frees on `p` and it gets the next task: the wait starts over.
    let effects = report(&mut core, "p", vec![finished(1, 0)], 3_500);
    assert_eq!(sent(&effects), counts(&[("p", 1)]));
    let effects = report(&mut core, "o", vec![finished(2, 0)], 4_000);
    assert!(launches(&effects).is_empty(), "{effects:?}");
    assert!(launches(&tick(&mut core, 6_499)).is_empty());
    assert_eq!(sent(&tick(&mut core, 6_500)), counts(&[("o", 1)]));
    let shown = summary(&mut core, job_id).placement.unwrap();
    assert_eq!(shown.prefer_executors, [eid("p")]);
    assert_eq!(shown.locality_wait_ms(), 3_000);
}

#[test]
fn no_wait_without_a_live_preferred_executor_or_with_a_wait_of_zero() {
    let mut core = new_core(0);
    add(&mut core, "a", 1, 1);
    add(&mut core, "z", 3, 1);
    // The preferred executor is not registered: nothing to wait for.
    let (_, launched) = start(&mut core, preferring(1, &["gone"], None), 2);
    assert_eq!(launched, [("a".to_string(), vec![(1, 0, 0)])]);
    // `a` is full. A wait of zero takes any executor at once...
    let (_, launched) = start(&mut core, preferring(1, &["a"], Some(0)), 3);
    assert_eq!(launched, [("z".to_string(), vec![(2, 0, 0)])]);
    // ... where the default wait holds the task back.
    let (_, launched) = start(&mut core, preferring(1, &["a"], None), 4);
    assert!(launched.is_empty(), "{launched:?}");
    // A preferred executor must meet the constraints too.
    let both = Placement {
        constraints: vec!["rack=r1".into()],
        prefer_executors: vec![eid("z")],
        ..Default::default()
    };
    let (job_id, launched) = start(&mut core, placed(1, both), 5);
    assert!(launched.is_empty());
    assert_eq!(
        summary(&mut core, job_id).waiting.as_deref(),
        Some("no live executor meets rack=r1")
    );
}

#[test]
fn a_preferred_host_is_preferred_like_an_executor() {
    let mut core = new_core(0);
    add(&mut core, "o", 4, 1);
    add(&mut core, "p", 2, 1);
    // Registrations give host `<id>.example`.
    let on_host = Placement {
        prefer_hosts: vec!["p.example".into()],
        locality_wait_ms: Some(500),
        ..Default::default()
    };
    let (_, launched) = start(&mut core, placed(4, on_host), 10);
    assert_eq!(tally(&launched), counts(&[("p", 2)]));
    assert!(launches(&tick(&mut core, 509)).is_empty());
    assert_eq!(sent(&tick(&mut core, 510)), counts(&[("o", 2)]));
}

#[test]
fn a_preferred_site_is_preferred_like_a_host_and_a_site_constraint_binds() {
    let mut core = new_core(0);
    add_with(&mut core, "hub", 4, &[("site", "hub")], 1);
    add_with(&mut core, "edge", 2, &[("site", "edge")], 1);
    add(&mut core, "none", 4, 1);
    let at_edge = Placement {
        prefer_sites: vec!["edge".into()],
        locality_wait_ms: Some(500),
        ..Default::default()
    };
    let (_, launched) = start(&mut core, placed(4, at_edge), 10);
    assert_eq!(tally(&launched), counts(&[("edge", 2)]));
    assert!(launches(&tick(&mut core, 509)).is_empty());
    assert_eq!(sent(&tick(&mut core, 510)).values().sum::<usize>(), 2);
    // Required rather than preferred, the site is a constraint like any attribute's.
    let (_, launched) = start(&mut core, constrained(3, &["site=hub"]), 20);
    assert!(!launched.is_empty());
    assert!(launched.iter().all(|(id, _)| id == "hub"), "{launched:?}");
    check_invariants(&core);
}

#[test]
fn a_restored_driver_keeps_the_placement_and_starts_the_wait_over() {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    let both = Placement {
        constraints: vec!["os=linux".into()],
        prefer_executors: vec![eid("p")],
        locality_wait_ms: Some(1_000),
        ..Default::default()
    };
    let two_cores = SubmitJob {
        cpus_per_task: 2,
        ..placed(3, both.clone())
    };
    let job_id = submit(&mut core, two_cores, 10);
    take_journal(&mut core, &mut journal);
    let mut core = new_core(0);
    for record in journal {
        core.replay(record).unwrap();
    }
    core.resume(5_000);
    assert_eq!(summary(&mut core, job_id).placement, Some(both));
    // `p` is preferred and live, but a core short: the job waits the locality wait from the
    // restore before it takes `l`, and never takes `w`, which is not linux.
    add_with(&mut core, "p", 1, &[("os", "linux")], 5_100);
    add(&mut core, "w", 2, 5_150);
    add_with(&mut core, "l", 2, &[("os", "linux")], 5_200);
    assert!(core.executors().values().all(|e| e.running.is_empty()));
    assert!(launches(&tick(&mut core, 5_999)).is_empty());
    assert_eq!(sent(&tick(&mut core, 6_000)), counts(&[("l", 1)]));
}

/// A core with exclusion on failure: exclusions for 5s, unschedulable after 1s.
fn excluding() -> Core {
    let mut core = new_core(0);
    core.set_exclusion(crate::driver::core::ExclusionConfig {
        timeout_ms: 5_000,
        unschedulable_timeout_ms: 1_000,
        ..Default::default()
    });
    core
}

#[test]
fn a_job_excluded_from_every_executor_meeting_its_constraints_fails_though_others_are_free() {
    let mut core = excluding();
    add_with(&mut core, "a", 1, &[("rack", "r1")], 1);
    add_with(&mut core, "b", 1, &[("rack", "r2")], 1);
    let (job_id, launched) = start(&mut core, constrained(3, &["rack=r1"]), 10);
    assert_eq!(tally(&launched), counts(&[("a", 1)]));
    report(&mut core, "a", vec![failed(1, 0, "boom")], 20);
    // a takes fresh task 1, which fails too: a is excluded from the job, and b, free and
    // not excluded, may not run it.
    report(&mut core, "a", vec![failed(2, 0, "disk full")], 30);
    let waiting = summary(&mut core, job_id).waiting.unwrap_or_default();
    assert!(
        waiting.starts_with(
            "every live executor meeting its constraints is excluded from this job after \
             failures"
        ),
        "{waiting:?}"
    );
    assert_eq!(sent(&tick(&mut core, 40)), counts(&[]));
    assert_eq!(job_ends(&tick(&mut core, 40 + 999)), []);
    let ends = job_ends(&tick(&mut core, 40 + 1_000));
    let (reason, failed, killed) = one_failure(&ends);
    assert_eq!(
        reason,
        "task 1 cannot run anywhere: the one live executor meeting its constraints is \
         excluded after failures: a (this job) (exclusion on failure), for 1s; last error: \
         disk full"
    );
    assert_eq!((failed, killed), (1, 2));
    assert_eq!(summary(&mut core, job_id).state, JobState::Failed);
}

#[test]
fn a_task_excluded_from_every_executor_meeting_the_constraints_counts_only_those() {
    let mut core = excluding();
    add_with(&mut core, "a", 1, &[("rack", "r1")], 1);
    add_with(&mut core, "b", 1, &[("rack", "r1")], 1);
    add_with(&mut core, "c", 1, &[("rack", "r2")], 1);
    let (job_id, _) = start(&mut core, constrained(2, &["rack=r1"]), 10);
    // Task 0 fails on a, then on b, where it was retried; c may not run it.
    let effects = report(&mut core, "a", vec![failed(1, 0, "boom")], 20);
    assert_eq!(sent(&effects), counts(&[]), "b runs task 1; not a again");
    report(&mut core, "b", vec![finished(2, 0)], 25);
    report(&mut core, "b", vec![failed(1, 1, "boom")], 30);
    assert_eq!(summary(&mut core, job_id).waiting, None, "task scope only");
    tick(&mut core, 40);
    let ends = job_ends(&tick(&mut core, 40 + 1_000));
    let (reason, ..) = one_failure(&ends);
    assert!(
        reason.starts_with(
            "task 0 cannot run anywhere: all 2 live executors meeting its constraints are \
             excluded after failures: a (this task), b (this task)"
        ),
        "{reason}"
    );
}

#[test]
fn with_no_live_executor_meeting_the_constraints_a_job_waits_for_placement_not_exclusion() {
    let mut core = excluding();
    add_with(&mut core, "a", 1, &[("rack", "r1")], 1);
    add_with(&mut core, "b", 1, &[("rack", "r2")], 1);
    let (job_id, _) = start(&mut core, constrained(1, &["rack=r1"]), 10);
    report(&mut core, "a", vec![failed(1, 0, "boom")], 20);
    core.remove_executor(&eid("a"), "gone".into(), 30);
    core.take_effects();
    // Within the executor timeout (10s) and the exclusion's (5s).
    for now in [40, 40 + 1_000, 3_000] {
        assert_eq!(job_ends(&tick(&mut core, now)), []);
    }
    assert_eq!(
        summary(&mut core, job_id).waiting.as_deref(),
        Some("no live executor meets rack=r1")
    );
    // a registers again with the same id, still excluded from the task: now it counts.
    add_with(&mut core, "a", 1, &[("rack", "r1")], 3_001);
    tick(&mut core, 3_002);
    assert_eq!(job_ends(&tick(&mut core, 4_001)), []);
    let ends = job_ends(&tick(&mut core, 4_002));
    assert_eq!(ends.len(), 1, "{ends:?}");
}
