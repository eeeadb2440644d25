//! Registration of executors, and listing them.

use super::*;
use crate::protocol::{
    ExecutorInfo, ExecutorSummary, ExecutorsSnapshot, HeartbeatReply, HeartbeatRequest,
};

#[test]
fn a_connection_with_an_unusable_server_id_is_refused_and_changes_nothing() {
    let mut core = new_core(0);
    let long = crate::protocol::ConnectionId {
        server_id: "N".repeat(crate::protocol::MAX_SERVER_ID_LEN + 1),
        client_id: 1,
    };
    let mut request = registration("exec-1", 2);
    request.connection = Some(long.clone());
    let answer = unchanged(&mut core, |core| core.register("exec-1", request, 10));
    assert!(
        matches!(&answer, RegisterReply::RegisterExecutorFailed { message } if message.contains("server_id")),
        "{answer:?}"
    );
    core.register("exec-1", registration("exec-1", 2), 20);
    core.take_effects();
    let beat = HeartbeatRequest::Heartbeat {
        executor_id: eid("exec-1"),
        instance_id: instance_of("exec-1"),
        running: Vec::new(),
        driver_instance: Some(core_driver()),
        objects: Default::default(),
        connection: Some(long),
        abandoned: Vec::new(),
    };
    let answer = unchanged(&mut core, |core| core.heartbeat("exec-1", beat, 30));
    assert!(matches!(answer, HeartbeatReply::Error { .. }), "{answer:?}");
}

#[test]
fn a_new_executor_is_registered_and_announced() {
    let mut core = new_core(2);
    let log_urls: BTreeMap<String, String> =
        [("stdout".into(), "http://worker-3.local:8081/stdout".into())].into();
    let attributes: BTreeMap<String, String> =
        [("rack".into(), "r1".into()), ("zone".into(), "z2".into())].into();
    let request = RegisterExecutor {
        executor_id: eid("exec-1"),
        instance_id: InstanceId::from_u128(7),
        host_port: "worker-3.local:7078".into(),
        cores: 4,
        log_urls: log_urls.clone(),
        attributes: attributes.clone(),
        resources: Default::default(),
        held: Vec::new(),
        connection: None,
    };
    assert_eq!(
        core.register("exec-1", request, 1_000),
        registered("exec-1")
    );
    let info = ExecutorInfo {
        host: "worker-3.local".into(),
        host_port: "worker-3.local:7078".into(),
        total_cores: 4,
        log_urls: log_urls.clone(),
        attributes: attributes.clone(),
        resources: Default::default(),
    };
    assert_eq!(
        core.take_effects(),
        vec![Effect::Publish(Event::ExecutorAdded {
            time_ms: 1_000,
            executor_id: eid("exec-1"),
            info,
        })]
    );
    assert_eq!(
        core.executors_snapshot(),
        ExecutorsSnapshot {
            executors: vec![ExecutorSummary {
                executor_id: eid("exec-1"),
                host: "worker-3.local".into(),
                host_port: "worker-3.local:7078".into(),
                free_cores: 4,
                total_cores: 4,
                log_urls,
                attributes,
                registered_at_ms: 1_000,
                last_seen_ms: 1_000,
                resources: Default::default(),
                exclusions: Vec::new(),
                objects: Default::default(),
                abandoned: Vec::new(),
            }],
            total_cores: 4,
            registered_executors: 1,
            pending_executors: 1,
            next_offset: None,
            allocation: None,
            start_gate: None,
            objects: Default::default(),
            driver: Some(crate::protocol::DriverInfo {
                driver_instance: InstanceId::from_u128(super::DRIVER),
                epoch: 0,
            }),
        }
    );
    check_invariants(&core);
}

#[test]
fn the_host_is_parsed_from_host_port() {
    let mut core = new_core(0);
    for (id, host_port, host) in [
        ("v6", "[::1]:7078", "::1"),
        ("v4", "10.0.0.1:0", "10.0.0.1"),
        ("name", "worker-3.local:65535", "worker-3.local"),
    ] {
        let request = RegisterExecutor {
            host_port: host_port.into(),
            ..registration(id, 1)
        };
        assert_eq!(core.register(id, request, 5), registered(id));
        match &core.take_effects()[..] {
            [Effect::Publish(Event::ExecutorAdded { info, .. })] => {
                assert_eq!(info.host, host, "{host_port}");
                assert_eq!(info.host_port, host_port);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn totals_and_pending_executors_follow_registrations() {
    let mut core = new_core(2);
    let totals = |core: &Core| {
        let s = core.executors_snapshot();
        (s.total_cores, s.registered_executors, s.pending_executors)
    };
    assert_eq!(totals(&core), (0, 0, 2));
    add(&mut core, "a", 3, 1);
    assert_eq!(totals(&core), (3, 1, 1));
    add(&mut core, "b", 5, 2);
    assert_eq!(totals(&core), (8, 2, 0));
    // More executors than expected: the pending count stays at 0.
    add(&mut core, "c", 1, 3);
    assert_eq!(totals(&core), (9, 3, 0));
    let ids: Vec<_> = core
        .executors_snapshot()
        .executors
        .iter()
        .map(|e| e.executor_id.to_string())
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
    check_invariants(&core);
}

#[test]
fn the_largest_and_fullest_valid_registration_is_accepted() {
    let mut core = new_core(0);
    let full: BTreeMap<String, String> = (0..64)
        .map(|i| (format!("{i:0>1024}"), "v".repeat(1024)))
        .collect();
    let request = RegisterExecutor {
        cores: 65_536,
        log_urls: full.clone(),
        attributes: full,
        ..registration("big", 1)
    };
    assert_eq!(core.register("big", request, 1), registered("big"));
    assert_eq!(core.executors_snapshot().total_cores, 65_536);
}

#[test]
fn a_retry_by_the_same_instance_is_registered_again_without_an_event() {
    let mut core = new_core(3);
    add(&mut core, "exec-1", 4, 100);
    for now in [200, 300] {
        // No second ExecutorAdded, and nothing else changes.
        let reply = unchanged(&mut core, |core| {
            core.register("exec-1", registration("exec-1", 4), now)
        });
        assert_eq!(reply, registered("exec-1"));
    }
    // The retry refreshed liveness, nothing else.
    assert_eq!(core.executors()[&eid("exec-1")].last_seen_ms, 300);
    assert_eq!(core.executors()[&eid("exec-1")].registered_at_ms, 100);
}

#[test]
fn another_instance_with_a_taken_id_is_refused() {
    let mut core = new_core(3);
    add(&mut core, "exec-1", 4, 100);
    let before = core.executors_snapshot();
    let impostor = RegisterExecutor {
        instance_id: InstanceId::from_u128(0xbad),
        cores: 8,
        host_port: "elsewhere:1".into(),
        ..registration("exec-1", 4)
    };
    let refused = RegisterReply::RegisterExecutorFailed {
        message: "Duplicate executor ID: exec-1".into(),
    };
    let reply = unchanged(&mut core, |core| {
        core.register("exec-1", impostor.clone(), 200)
    });
    assert_eq!(reply, refused);
    assert_eq!(core.executors()[&eid("exec-1")].last_seen_ms, 100);
    // The owner keeps the id; the impostor keeps being refused.
    assert_eq!(
        core.register("exec-1", registration("exec-1", 4), 300),
        registered("exec-1")
    );
    assert_eq!(core.register("exec-1", impostor, 400), refused);
    let mut after = core.executors_snapshot();
    assert_eq!(
        after.executors[0].last_seen_ms, 300,
        "the owner's retry says it lives"
    );
    after.executors[0].last_seen_ms = before.executors[0].last_seen_ms;
    assert_eq!(after, before);
}

#[test]
fn invalid_registrations_are_refused_and_change_nothing() {
    let base = || registration("exec-1", 4);
    let many: BTreeMap<String, String> = (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
    let long_value: BTreeMap<String, String> = [("rack".into(), "x".repeat(1025))].into();
    let long_key: BTreeMap<String, String> = [("k".repeat(1025), "v".into())].into();
    let empty_key: BTreeMap<String, String> = [(String::new(), "v".into())].into();
    let entry_message = |what: &str, key: &str| {
        format!("{what} entry {key:?} has an empty or over-long key or value (limit 1024 bytes)")
    };
    let bad_host = |host_port: &str| {
        let request = RegisterExecutor {
            host_port: host_port.into(),
            ..base()
        };
        let message = format!("host_port {host_port:?} is not host:port (e.g. \"worker-3:7078\")");
        (request, message)
    };
    let mut cases: Vec<(&str, &str, RegisterExecutor, String)> = vec![
        (
            "payload id differs from the subject",
            "exec-2",
            base(),
            "executor id \"exec-1\" in the message does not match \"exec-2\" in the subject".into(),
        ),
        (
            "no cores",
            "exec-1",
            RegisterExecutor { cores: 0, ..base() },
            "cores must be between 1 and 65536; got 0".into(),
        ),
        (
            "too many cores",
            "exec-1",
            RegisterExecutor {
                cores: 65_537,
                ..base()
            },
            "cores must be between 1 and 65536; got 65537".into(),
        ),
        (
            "too many log urls",
            "exec-1",
            RegisterExecutor {
                log_urls: many.clone(),
                ..base()
            },
            "log_urls has 65 entries; the limit is 64".into(),
        ),
        (
            "too many attributes",
            "exec-1",
            RegisterExecutor {
                attributes: many,
                ..base()
            },
            "attributes has 65 entries; the limit is 64".into(),
        ),
        (
            "over-long attribute value",
            "exec-1",
            RegisterExecutor {
                attributes: long_value,
                ..base()
            },
            entry_message("attributes", "rack"),
        ),
        (
            "over-long log url key",
            "exec-1",
            RegisterExecutor {
                log_urls: long_key,
                ..base()
            },
            entry_message("log_urls", &"k".repeat(40)),
        ),
        (
            "empty attribute key",
            "exec-1",
            RegisterExecutor {
                attributes: empty_key,
                ..base()
            },
            entry_message("attributes", ""),
        ),
    ];
    for (what, host_port) in [
        ("no port", "worker-3"),
        ("no host", ":7078"),
        ("empty port", "h:"),
        ("port too large", "h:99999"),
        ("port not a number", "h:x"),
        ("space in host", "a b:1"),
    ] {
        let (request, message) = bad_host(host_port);
        cases.push((what, "exec-1", request, message));
    }
    // Against an empty registry, and against one where the id is already registered.
    for preregistered in [false, true] {
        let mut core = new_core(5);
        if preregistered {
            add(&mut core, "exec-1", 4, 1);
        }
        for (what, subject, request, expected) in &cases {
            let reply = unchanged(&mut core, |core| {
                core.register(subject, request.clone(), 50)
            });
            let expected = RegisterReply::RegisterExecutorFailed {
                message: expected.clone(),
            };
            assert_eq!(reply, expected, "{what}");
        }
        // A valid registration still works afterwards.
        if !preregistered {
            add(&mut core, "exec-1", 4, 60);
            assert_eq!(core.executors_snapshot().pending_executors, 4);
        }
    }
}

#[test]
fn list_executors_returns_the_registry_and_its_totals() {
    let mut core = new_core(4);
    assert_eq!(
        core.api(ApiRequest::list_executors(), 0),
        ApiReply::Executors(ExecutorsSnapshot {
            executors: vec![],
            total_cores: 0,
            registered_executors: 0,
            pending_executors: 4,
            next_offset: None,
            allocation: None,
            start_gate: None,
            objects: Default::default(),
            driver: Some(crate::protocol::DriverInfo {
                driver_instance: InstanceId::from_u128(super::DRIVER),
                epoch: 0,
            }),
        })
    );
    add(&mut core, "b", 2, 10);
    add(&mut core, "a", 3, 20);
    start(&mut core, job(2, 1, 4), 30);
    let snapshot = unchanged(&mut core, |core| {
        match core.api(ApiRequest::list_executors(), 40) {
            ApiReply::Executors(snapshot) => snapshot,
            other => panic!("ListExecutors did not list executors: {other:?}"),
        }
    });
    assert_eq!(snapshot, core.executors_snapshot());
    assert_eq!(
        (
            snapshot.total_cores,
            snapshot.registered_executors,
            snapshot.pending_executors
        ),
        (5, 2, 2)
    );
    let rows: Vec<_> = snapshot
        .executors
        .iter()
        .map(|e| {
            (
                e.executor_id.to_string(),
                e.free_cores,
                e.total_cores,
                e.registered_at_ms,
            )
        })
        .collect();
    // One task each, round-robin; ordered by id.
    assert_eq!(rows, [("a".into(), 2, 3, 20), ("b".into(), 1, 2, 10)]);
}

/// An executor registered here whose answer never reached it (it registered with the driver
/// before this one meanwhile) says so in its heartbeat, and is told to register again; its
/// registering again is accepted, and then its heartbeats are.
#[test]
fn a_heartbeat_from_an_executor_registered_with_another_driver_asks_it_to_register_again() {
    let mut core = new_core(0);
    add(&mut core, "exec-1", 2, 10);
    let beat = |driver: Option<u128>| HeartbeatRequest::Heartbeat {
        executor_id: eid("exec-1"),
        instance_id: instance_of("exec-1"),
        running: Vec::new(),
        driver_instance: driver.map(InstanceId::from_u128),
        objects: Default::default(),
        connection: None,
        abandoned: Vec::new(),
    };
    let answer = |reregister| HeartbeatReply::HeartbeatResponse { reregister };
    let elsewhere = unchanged(&mut core, |core| {
        core.heartbeat("exec-1", beat(Some(7)), 20)
    });
    assert_eq!(elsewhere, answer(true));
    assert_eq!(core.heartbeat("exec-1", beat(None), 30), answer(false));
    assert_eq!(
        core.heartbeat("exec-1", beat(Some(DRIVER)), 40),
        answer(false)
    );
    assert_eq!(
        core.register("exec-1", registration("exec-1", 2), 50),
        registered("exec-1")
    );
    assert_eq!(
        core.heartbeat("exec-1", beat(Some(DRIVER)), 60),
        answer(false)
    );
}

/// What executors say in their heartbeats of the objects they fetched and put is in the
/// registry, each executor's own and their sum; an executor that leaves takes its counts out.
#[test]
fn heartbeats_carry_each_executors_object_counts_and_the_registry_sums_them() {
    let mut core = new_core(0);
    add(&mut core, "a", 2, 10);
    add(&mut core, "b", 2, 10);
    let beat = |id: &str, fetches: u64, puts: u64| HeartbeatRequest::Heartbeat {
        executor_id: eid(id),
        instance_id: instance_of(id),
        running: Vec::new(),
        driver_instance: Some(core_driver()),
        objects: crate::protocol::ObjectCounts {
            fetches,
            fetched_bytes: fetches.saturating_mul(1 << 20),
            host_takes: puts,
            host_taken_bytes: puts,
            cache_hits: fetches.saturating_mul(3),
            cache_misses: fetches,
            puts,
            put_bytes: puts * 10,
        },
        connection: None,
        abandoned: Vec::new(),
    };
    core.heartbeat("a", beat("a", 2, 1), 20);
    core.heartbeat("b", beat("b", 1, 0), 20);
    // A later heartbeat replaces what the earlier one said: the counts are the executor's own
    // running totals.
    core.heartbeat("a", beat("a", 3, 1), 30);
    let snapshot = core.executors_snapshot();
    let of = |id: &str| {
        let e = snapshot.executors.iter().find(|e| e.executor_id == eid(id));
        e.expect("listed").objects
    };
    assert_eq!((of("a").fetches, of("a").puts), (3, 1));
    assert_eq!((of("b").fetches, of("b").puts), (1, 0));
    assert_eq!(snapshot.objects.fetches, 4);
    assert_eq!(snapshot.objects.fetched_bytes, 4 << 20);
    assert_eq!(
        (snapshot.objects.cache_hits, snapshot.objects.cache_misses),
        (12, 4)
    );
    assert_eq!((snapshot.objects.puts, snapshot.objects.put_bytes), (1, 10));
    assert_eq!(snapshot.objects.host_takes, 1);
    core.remove_executor(&eid("a"), "gone".into(), 40);
    assert_eq!(core.executors_snapshot().objects.fetches, 1);
    // Counts near the top of a u64 from a wrong executor saturate the sum, not wrap it.
    core.heartbeat("b", beat("b", u64::MAX, 0), 50);
    add(&mut core, "c", 2, 50);
    core.heartbeat("c", beat("c", 5, 0), 60);
    let sum = core.executors_snapshot().objects;
    assert_eq!((sum.fetches, sum.cache_hits), (u64::MAX, u64::MAX));
    check_invariants(&core);
}

fn core_driver() -> InstanceId {
    InstanceId::from_u128(super::DRIVER)
}
