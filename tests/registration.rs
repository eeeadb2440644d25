//! Registration over a real nats-server: the handshake, duplicates, retries, many executors at
//! once, executors that come up before the driver, and every kind of invalid input.

mod common;

use common::{collect_events, eventually, within, TestCluster};
use ember::executor::Handlers;
use ember::ids::ExecutorId;
use ember::protocol::{
    decode, encode, ApiReply, Event, ExecutorsSnapshot, RegisterExecutor, RegisterReply,
    RegisterRequest,
};
use futures::StreamExt;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(20);

fn request(id: &str, instance: uuid::Uuid) -> RegisterExecutor {
    RegisterExecutor {
        executor_id: ExecutorId::parse(id).unwrap(),
        instance_id: instance,
        host_port: "worker-1:7078".into(),
        cores: 4,
        log_urls: BTreeMap::new(),
        attributes: BTreeMap::from([("zone".to_string(), "a".to_string())]),
        resources: Default::default(),
        held: Vec::new(),
        connection: None,
    }
}

/// Sends raw bytes on `id`'s register subject from a client whose inbox is `_INBOX.<id>`.
async fn raw_register(cluster: &TestCluster, id: &str, payload: Vec<u8>) -> RegisterReply {
    let client = cluster.executor_client(id).await;
    let subject = format!("{}.driver.register.{id}", cluster.subjects.prefix());
    let reply = within(LIMIT, client.request(subject, payload.into()))
        .await
        .expect("an answer");
    decode(&reply.payload, usize::MAX).expect("a RegisterReply")
}

async fn snapshot(cluster: &TestCluster) -> ExecutorsSnapshot {
    cluster
        .api(cluster.client().await)
        .executors()
        .await
        .expect("ListExecutors")
}

fn failure(reply: RegisterReply) -> String {
    match reply {
        RegisterReply::RegisterExecutorFailed { message } => message,
        other => panic!("expected RegisterExecutorFailed, got {other:?}"),
    }
}

#[tokio::test]
async fn an_executor_registers_and_listeners_see_it() {
    let cluster = TestCluster::start("register-one");
    let mut events = cluster
        .listen(cluster.subjects.event("executor.added"))
        .await;
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("exec-1", 3, Handlers::builtin()).await;

    let events = collect_events(&mut events, 1, LIMIT).await;
    let Event::ExecutorAdded {
        executor_id,
        info,
        time_ms,
    } = &events[0]
    else {
        panic!("expected ExecutorAdded, got {:?}", events[0]);
    };
    assert_eq!(executor_id.as_str(), "exec-1");
    assert_eq!(info.host, "host-exec-1");
    assert_eq!(info.host_port, "host-exec-1:7078");
    assert_eq!(info.total_cores, 3);
    assert_eq!(info.log_urls["stdout"], "http://host-exec-1/stdout");
    assert!(*time_ms > 0);

    let registry = snapshot(&cluster).await;
    assert_eq!(registry.registered_executors, 1);
    assert_eq!(registry.total_cores, 3);
    assert_eq!(registry.executors[0].free_cores, 3);
    assert_eq!(registry.executors[0].executor_id.as_str(), "exec-1");
}

#[tokio::test]
async fn a_duplicate_id_is_refused_and_the_process_exits_1_with_the_message() {
    let cluster = TestCluster::start("register-dup");
    let mut events = cluster.listen(cluster.subjects.events_all()).await;
    let _driver = cluster.driver().await;
    let _first = cluster.executor("twin", 2, Handlers::builtin()).await;
    collect_events(&mut events, 1, LIMIT).await;

    let output = within(
        LIMIT,
        cluster.executor_process("twin", &["--cores", "2"]).output(),
    )
    .await
    .expect("run ember-executor");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("Duplicate executor ID: twin"),
        "stderr: {stderr}"
    );

    let registry = snapshot(&cluster).await;
    assert_eq!(registry.registered_executors, 1);
    assert_eq!(registry.total_cores, 2);
    // No second ExecutorAdded.
    let extra = tokio::time::timeout(Duration::from_millis(300), events.next()).await;
    assert!(extra.is_err(), "unexpected event: {extra:?}");
}

#[tokio::test]
async fn the_same_instance_retrying_gets_one_event_only() {
    let cluster = TestCluster::start("register-retry");
    let mut events = cluster.listen(cluster.subjects.events_all()).await;
    let _driver = cluster.driver().await;
    let instance = uuid::Uuid::new_v4();
    let payload = encode(&RegisterRequest::RegisterExecutor(request(
        "again", instance,
    )))
    .to_vec();
    for _ in 0..3 {
        let reply = raw_register(&cluster, "again", payload.clone()).await;
        assert!(
            matches!(reply, RegisterReply::RegisteredExecutor { ref executor_id, .. } if executor_id.as_str() == "again"),
            "{reply:?}"
        );
    }
    // Another instance with the same id is a duplicate.
    let other = encode(&RegisterRequest::RegisterExecutor(request(
        "again",
        uuid::Uuid::new_v4(),
    )))
    .to_vec();
    assert_eq!(
        failure(raw_register(&cluster, "again", other).await),
        "Duplicate executor ID: again"
    );

    collect_events(&mut events, 1, LIMIT).await;
    let extra = tokio::time::timeout(Duration::from_millis(300), events.next()).await;
    assert!(extra.is_err(), "unexpected second event: {extra:?}");
    let registry = snapshot(&cluster).await;
    assert_eq!(
        (registry.registered_executors, registry.total_cores),
        (1, 4)
    );
}

#[tokio::test]
async fn two_hundred_executors_register_at_once() {
    const N: usize = 200;
    let cluster = TestCluster::start("register-200");
    let mut subscription = cluster
        .listen(cluster.subjects.event("executor.added"))
        .await;
    let _driver = cluster.driver().await;
    let mut executors = Vec::new();
    for i in 0..N {
        executors.push(
            cluster
                .executor(&format!("e{i}"), 2, Handlers::builtin())
                .await,
        );
    }
    let events = collect_events(&mut subscription, N, Duration::from_secs(60)).await;
    let ids: HashSet<String> = events
        .iter()
        .map(|e| match e {
            Event::ExecutorAdded { executor_id, .. } => executor_id.to_string(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(ids.len(), N, "every executor exactly one event");
    let registry = snapshot(&cluster).await;
    assert_eq!(registry.registered_executors, N as u64);
    assert_eq!(registry.total_cores, 2 * N as u64);
    assert_eq!(registry.executors.len(), N);
    let extra = tokio::time::timeout(Duration::from_millis(300), subscription.next()).await;
    assert!(extra.is_err(), "no event beyond the {N}: {extra:?}");
    assert!(
        executors.iter().all(|e| !e.is_finished()),
        "no executor stopped"
    );
}

#[tokio::test]
async fn executors_started_before_the_driver_register_once_it_is_up() {
    let cluster = TestCluster::start("register-early");
    let mut early = Vec::new();
    for i in 0..3 {
        early.push(
            cluster
                .executor(&format!("early-{i}"), 1, Handlers::builtin())
                .await,
        );
    }
    let mut process = cluster
        .executor_process("early-proc", &["--cores", "1"])
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let _driver = cluster.driver().await;
    let registry = eventually(LIMIT, "4 executors", || async {
        let s = snapshot(&cluster).await;
        (s.registered_executors == 4).then_some(s)
    })
    .await;
    assert_eq!(registry.total_cores, 4);
    assert!(
        process.try_wait().unwrap().is_none(),
        "the process keeps serving"
    );
    // SIGTERM: it exits 0.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(process.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = within(LIMIT, process.wait()).await.unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn an_executor_gives_up_when_no_driver_answers() {
    let cluster = TestCluster::start("register-timeout");
    let output = within(
        LIMIT,
        cluster
            .executor_process("lonely", &["--register-timeout", "1s"])
            .output(),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.contains("no driver answered"), "stderr: {stderr}");
}

#[tokio::test]
async fn invalid_registrations_get_clear_errors_and_change_nothing() {
    let cluster = TestCluster::start("register-invalid");
    let mut events = cluster.listen(cluster.subjects.events_all()).await;
    let _driver = cluster.driver().await;
    let _ok = cluster.executor("good", 2, Handlers::builtin()).await;
    collect_events(&mut events, 1, LIMIT).await;
    let before = snapshot(&cluster).await;

    let valid = |id: &str| {
        serde_json::to_value(RegisterRequest::RegisterExecutor(request(
            id,
            uuid::Uuid::new_v4(),
        )))
        .unwrap()
    };
    let with = |id: &str, field: &str, value: serde_json::Value| {
        let mut v = valid(id);
        v[field] = value;
        serde_json::to_vec(&v).unwrap()
    };
    let long = "x".repeat(65);
    let many: BTreeMap<String, String> = (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "bad",
            with("bad", "executor_id", "bad$id".into()),
            "contains '$'",
        ),
        (
            "bad$id",
            with("bad", "executor_id", "bad$id".into()),
            "contains '$'",
        ),
        (
            &long,
            with("bad", "executor_id", long.clone().into()),
            "limit is 64",
        ),
        (
            "mismatch",
            with("other", "executor_id", "other".into()),
            "does not match",
        ),
        (
            "zero",
            with("zero", "cores", 0.into()),
            "cores must be between 1 and",
        ),
        (
            "huge",
            with("huge", "cores", 1_000_000.into()),
            "cores must be between 1 and",
        ),
        ("neg", with("neg", "cores", (-1).into()), "could not decode"),
        (
            "hp",
            with("hp", "host_port", "no-port".into()),
            "not host:port",
        ),
        (
            "attrs",
            with("attrs", "attributes", serde_json::to_value(&many).unwrap()),
            "the limit is 64",
        ),
        (
            "json",
            b"{\"type\": \"RegisterExecutor\", ".to_vec(),
            "could not decode",
        ),
        ("notjson", b"\xff\xfe garbage".to_vec(), "could not decode"),
        ("empty", Vec::new(), "empty"),
        (
            "unknown",
            br#"{"type":"Hello","executor_id":"unknown"}"#.to_vec(),
            "unknown variant",
        ),
        (
            "notype",
            br#"{"executor_id":"notype"}"#.to_vec(),
            "missing field `type`",
        ),
        (
            "good",
            with("good", "host_port", "other:1".into()),
            "Duplicate executor ID: good",
        ),
    ];
    for (subject_id, payload, expected) in cases {
        let message = failure(raw_register(&cluster, subject_id, payload).await);
        assert!(
            message.contains(expected),
            "{subject_id}: {message:?} should contain {expected:?}"
        );
    }

    // A request whose reply points outside the sender's own inbox gets no answer at all.
    let spoofer = cluster.client().await;
    let victim_inbox = "_INBOX.good.stolen";
    let mut victim = spoofer.subscribe(victim_inbox).await.unwrap();
    let payload = encode(&RegisterRequest::RegisterExecutor(request(
        "spoof",
        uuid::Uuid::new_v4(),
    )));
    let subject = format!("{}.driver.register.spoof", cluster.subjects.prefix());
    spoofer
        .publish_with_reply(subject, victim_inbox, payload)
        .await
        .unwrap();
    spoofer.flush().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), victim.next())
            .await
            .is_err(),
        "nothing reaches another inbox"
    );

    // Garbage on the api gets an Error answer.
    let api = cluster.client().await;
    let reply = within(LIMIT, api.request(cluster.subjects.api(), "{nope".into()))
        .await
        .unwrap();
    assert!(matches!(
        decode::<ApiReply>(&reply.payload, usize::MAX),
        Ok(ApiReply::Error { .. })
    ));

    let after = snapshot(&cluster).await;
    assert_eq!(
        common::heard_from_aside(before),
        common::heard_from_aside(after),
        "the registry is unchanged"
    );
    let extra = tokio::time::timeout(Duration::from_millis(300), events.next()).await;
    assert!(extra.is_err(), "no event: {extra:?}");

    // And the driver still serves.
    let reply = raw_register(
        &cluster,
        "late",
        encode(&RegisterRequest::RegisterExecutor(request(
            "late",
            uuid::Uuid::new_v4(),
        )))
        .to_vec(),
    )
    .await;
    assert!(
        matches!(reply, RegisterReply::RegisteredExecutor { .. }),
        "{reply:?}"
    );
    assert_eq!(snapshot(&cluster).await.registered_executors, 2);
}
