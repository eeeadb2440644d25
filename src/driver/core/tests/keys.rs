//! Concurrency keys: the running attempts of all jobs that name a key stay within its
//! `max_concurrent`, its starts within its rate, a key without limits runs unlimited, and the
//! limits outlive the driver through the journal.

use super::*;
use crate::protocol::{KeyLimits, KeySummary, Rate, WaitReason};

fn keyed(tasks: u32, key: &str) -> SubmitJob {
    SubmitJob {
        concurrency_key: Some(key.into()),
        ..job(tasks, 1, 1)
    }
}

fn at_once(n: u32) -> KeyLimits {
    KeyLimits {
        max_concurrent: Some(n),
        rate: None,
    }
}

fn set_limits(core: &mut Core, key: &str, limits: KeyLimits, now: u64) -> KeySummary {
    let request = ApiRequest::SetKeyLimits {
        key: key.into(),
        limits,
    };
    match core.api(request, now) {
        ApiReply::Keys { mut keys } if keys.len() == 1 => keys.remove(0),
        other => panic!("limits refused: {other:?}"),
    }
}

fn list_keys(core: &mut Core, now: u64) -> Vec<KeySummary> {
    match unchanged(core, |core| core.api(ApiRequest::ListKeys, now)) {
        ApiReply::Keys { keys } => keys,
        other => panic!("{other:?}"),
    }
}

fn summary_at(core: &mut Core, job_id: JobId, now: u64) -> JobSummary {
    match core.api(ApiRequest::GetJob { job_id }, now) {
        ApiReply::Job { job } => job,
        other => panic!("{other:?}"),
    }
}

/// How many tasks `launches` start in all.
fn launched(launches: &[Launch]) -> usize {
    launches.iter().map(|(_, tasks)| tasks.len()).sum()
}

#[test]
fn the_running_tasks_of_all_jobs_with_a_key_stay_within_its_limit() {
    let mut core = new_core(0);
    set_limits(&mut core, "api", at_once(2), 0);
    core.take_effects();
    add(&mut core, "a", 8, 0);
    let (first, started) = start(&mut core, keyed(3, "api"), 0);
    assert_eq!(started, [("a".into(), vec![(1, 0, 0), (2, 1, 0)])]);
    let (second, started) = start(&mut core, keyed(2, "api"), 0);
    assert_eq!(started, []);
    // A job without the key takes the free cores.
    let (_, started) = start(&mut core, job(3, 1, 1), 0);
    assert_eq!(launched(&started), 3);
    let waits = summary(&mut core, second).waits;
    let full = WaitReason::KeyConcurrency {
        key: "api".into(),
        running: 2,
        max_concurrent: 2,
    };
    assert_eq!(waits, std::slice::from_ref(&full));
    assert_eq!(
        full.to_string(),
        "concurrency key api runs 2 of its 2 at once"
    );
    assert_eq!(summary(&mut core, first).key_limits, Some(at_once(2)));
    check_invariants(&core);

    // One ends: the first job's third task takes its place, then the second job's, one at a
    // time; an executor lost frees what it ran.
    let effects = report(&mut core, "a", vec![finished(1, 0)], 10);
    assert_eq!(launches(&effects), [("a".into(), vec![(3, 2, 0)])]);
    check_invariants(&core);
    let effects = report(&mut core, "a", vec![failed(2, 0, "boom")], 20);
    assert_eq!(launches(&effects), [("a".into(), vec![(4, 0, 0)])]);
    add(&mut core, "b", 8, 30);
    core.take_effects();
    core.remove_executor(&eid("a"), "gone".into(), 40);
    let effects = core.take_effects();
    // Two attempts of the key ended with the executor; two start on the other one.
    let keyed_starts: usize = launches(&effects)
        .iter()
        .flat_map(|(_, tasks)| tasks)
        .filter(|(task_id, _, _)| (4..=5).contains(task_id))
        .count();
    assert_eq!(keyed_starts, 2, "{:?}", launches(&effects));
    check_invariants(&core);
    let keys = list_keys(&mut core, 50);
    assert_eq!(keys.len(), 1);
    assert_eq!((keys[0].running, keys[0].jobs), (2, 1));
}

#[test]
fn a_key_without_limits_runs_unlimited_and_says_so() {
    let mut core = new_core(0);
    add(&mut core, "a", 4, 0);
    let (job_id, started) = start(&mut core, keyed(4, "free"), 0);
    assert_eq!(launched(&started), 4);
    let summary = summary(&mut core, job_id);
    assert_eq!(summary.concurrency_key.as_deref(), Some("free"));
    assert_eq!(summary.key_limits, Some(KeyLimits::default()));
    assert_eq!(KeyLimits::default().to_string(), "no limits");
    let keys = list_keys(&mut core, 0);
    assert_eq!(
        keys,
        [KeySummary {
            key: "free".into(),
            limits: KeyLimits::default(),
            running: 4,
            jobs: 1,
            started_in_window: None,
        }]
    );
    check_invariants(&core);
}

#[test]
fn a_key_s_rate_holds_starts_until_its_window_opens() {
    let mut core = new_core(0);
    let rate = Rate {
        count: 2,
        per_ms: 1000,
    };
    let limits = KeyLimits {
        max_concurrent: None,
        rate: Some(rate),
    };
    set_limits(&mut core, "api", limits, 0);
    add(&mut core, "a", 8, 0);
    core.take_effects();
    let (job_id, started) = start(&mut core, keyed(5, "api"), 100);
    assert_eq!(launched(&started), 2);
    assert_eq!(core.next_due_ms(), Some(1100));
    let waits = summary_at(&mut core, job_id, 600).waits;
    assert_eq!(
        waits,
        [WaitReason::KeyRate {
            key: "api".into(),
            rate,
            until_ms: 1100,
        }]
    );
    // Nothing starts inside the window, ended attempts or not.
    let effects = report(&mut core, "a", vec![finished(1, 0)], 500);
    assert_eq!(launches(&effects), []);
    core.on_timers(1099);
    assert_eq!(launches(&core.take_effects()), []);
    core.on_timers(1100);
    assert_eq!(launched(&launches(&core.take_effects())), 2);
    assert_eq!(list_keys(&mut core, 1100)[0].started_in_window, Some(2));
    core.on_timers(2100);
    assert_eq!(launched(&launches(&core.take_effects())), 1);
    check_invariants(&core);
}

#[test]
fn raising_a_limit_starts_more_at_once_and_clearing_it_lifts_it() {
    let mut core = new_core(0);
    set_limits(&mut core, "api", at_once(1), 0);
    add(&mut core, "a", 8, 0);
    core.take_effects();
    let (_, started) = start(&mut core, keyed(4, "api"), 0);
    assert_eq!(launched(&started), 1);
    let set = set_limits(&mut core, "api", at_once(2), 10);
    assert_eq!((set.running, set.limits), (2, at_once(2)));
    assert_eq!(launched(&launches(&core.take_effects())), 1);
    let cleared = set_limits(&mut core, "api", KeyLimits::default(), 20);
    assert_eq!(cleared.limits, KeyLimits::default());
    assert_eq!(launched(&launches(&core.take_effects())), 2);
    check_invariants(&core);
}

#[test]
fn limits_outlive_the_driver_through_the_journal_and_its_snapshots() {
    let mut core = journaled_core(0);
    let mut journal = Vec::new();
    let limits = KeyLimits {
        max_concurrent: Some(3),
        rate: Some(Rate {
            count: 10,
            per_ms: 60_000,
        }),
    };
    set_limits(&mut core, "api", limits, 5);
    set_limits(&mut core, "old", at_once(1), 6);
    set_limits(&mut core, "old", KeyLimits::default(), 7);
    take_journal(&mut core, &mut journal);
    assert_eq!(
        journal[0],
        JournalRecord::KeyLimitsSet {
            key: "api".into(),
            limits,
            time_ms: 5,
        }
    );
    let listed = |core: &mut Core| -> Vec<(String, KeyLimits)> {
        list_keys(core, 0)
            .into_iter()
            .map(|k| (k.key, k.limits))
            .collect()
    };
    let expected = vec![("api".to_string(), limits)];
    // Each record replayed twice: setting is idempotent.
    let mut again = restored(&journal, 2);
    assert_eq!(listed(&mut again), expected);
    let mut from_snapshot = restored(&[snapshot_record(&core, 1, 10)], 1);
    assert_eq!(listed(&mut from_snapshot), expected);
    // The restored key holds as the first one did.
    add(&mut from_snapshot, "a", 8, 20);
    from_snapshot.take_effects();
    let (_, started) = start(&mut from_snapshot, keyed(5, "api"), 20);
    assert_eq!(launched(&started), 3);
}

#[test]
fn bad_keys_and_limits_are_refused_and_change_nothing() {
    let mut core = new_core(0);
    add(&mut core, "a", 2, 0);
    core.take_effects();
    let cases = [
        ("a b", at_once(1), "has ' '"),
        ("", at_once(1), "may not be empty"),
        ("api", at_once(0), "max_concurrent must be between 1"),
        (
            "api",
            KeyLimits {
                max_concurrent: None,
                rate: Some(Rate {
                    count: 1,
                    per_ms: 0,
                }),
            },
            "window (per_ms) must be between 1",
        ),
    ];
    for (key, limits, says) in cases {
        let request = ApiRequest::SetKeyLimits {
            key: key.into(),
            limits,
        };
        let error = api_error(unchanged(&mut core, |core| core.api(request, 0)));
        assert!(error.contains(says), "{key:?}: {error}");
    }
    let bad = SubmitJob {
        concurrency_key: Some("x".repeat(65)),
        ..job(1, 1, 1)
    };
    let error = api_error(unchanged(&mut core, |core| {
        core.api(ApiRequest::SubmitJob(bad), 0)
    }));
    assert!(error.contains("longer than 64 bytes"), "{error}");
    assert_eq!(list_keys(&mut core, 0), []);
}

#[test]
fn speculative_copies_count_against_the_key() {
    let mut core = new_core(0);
    set_limits(&mut core, "api", at_once(2), 0);
    add(&mut core, "a", 2, 0);
    add(&mut core, "b", 2, 0);
    core.take_effects();
    let speculative = SubmitJob {
        speculation: Some(crate::protocol::Speculation {
            quantile: 0.5,
            multiplier: 1.5,
            min_runtime_ms: 0,
        }),
        ..keyed(2, "api")
    };
    let (_, started) = start(&mut core, speculative, 0);
    assert_eq!(launched(&started), 2);
    let first_executor = started[0].0.clone();
    let done = report(&mut core, &first_executor, vec![finished(1, 0)], 100);
    assert_eq!(launches(&done), []);
    // Task 1 runs far past the median: a copy would start, but the key holds one running
    // and a copy makes two, within the limit of two.
    core.speculate(10_000);
    let copies = launched(&launches(&core.take_effects()));
    assert_eq!(copies, 1);
    check_invariants(&core);
    // At the limit now: a second keyed job waits.
    let (_, started) = start(&mut core, keyed(1, "api"), 10_001);
    assert_eq!(started, []);
    check_invariants(&core);
}
