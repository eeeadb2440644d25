//! Hostile input changes nothing: 10,000 malformed messages across every subject the driver
//! and the executors listen on. Every request gets exactly one error answer, no process stops,
//! and the registry and the job table read the same before and after.

mod common;

use common::{eventually, heard_from_aside, noops, within, TestCluster};
use ember::protocol::{JobState, TaskState};
use futures::StreamExt;
use serde_json::Value;
use std::collections::HashMap;
use std::time::Duration;

/// The test server's max_payload: small, so that bodies just under it stay cheap to send.
const MAX_PAYLOAD: usize = 64 * 1024;
const MESSAGES: usize = 10_000;
/// The id no executor has; requests claiming it must be refused just the same.
const GHOST: &str = "ghost";

/// Valid messages of each subject family, as a sender in another language would write them:
/// their strict prefixes are the truncated JSON.
const VALID: [&str; 5] = [
    r#"{"type":"RegisterExecutor","executor_id":"exec-a","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","host_port":"h:1","cores":2,"log_urls":{},"attributes":{}}"#,
    r#"{"type":"StatusUpdates","executor_id":"exec-a","updates":[{"task_id":1,"attempt":0,"state":"FINISHED"},[2,0]]}"#,
    r#"{"type":"Heartbeat","executor_id":"exec-a","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","running":[]}"#,
    r#"{"type":"SubmitJob","name":"x","tasks":[{"kind":"handler","name":"noop"}],"repeat":1}"#,
    r#"{"type":"LaunchTasks","tasks":[{"job_id":1,"cpus":1,"spec":{"kind":"handler","name":"noop"},"tasks":[[1,0,0]]}]}"#,
];

/// Bodies no subject accepts.
fn malformed() -> Vec<Vec<u8>> {
    let mut bodies: Vec<Vec<u8>> = Vec::new();
    // Empty and blank.
    bodies.extend([b"".to_vec(), b"   ".to_vec(), b"\n\t\r ".to_vec()]);
    // Invalid UTF-8, bare and inside strings.
    bodies.extend([
        vec![0xff, 0xfe, 0xfd],
        b"{\"type\":\"\xff\xfe\"}".to_vec(),
        b"{\"type\":\"RegisterExecutor\",\"executor_id\":\"\xc3\x28\"}".to_vec(),
        b"{\"type\":\"SubmitJob\",\"name\":\"\xed\xa0\x80\",\"tasks\":[]}".to_vec(),
        b"\"\\ud800\"".to_vec(),
    ]);
    // Truncated JSON: every strict prefix of every valid message (the empty one included).
    for valid in VALID {
        bodies.extend((0..valid.len()).map(|k| valid.as_bytes()[..k].to_vec()));
    }
    // Not JSON, or JSON of the wrong shape.
    for text in [
        "null",
        "42",
        "\"RegisterExecutor\"",
        "[]",
        "{}",
        "true",
        "{\"type\":null}",
        "{\"type\":42}",
        "{\"type\":[\"Heartbeat\"]}",
        "{'type':'Heartbeat'}",
        "<xml/>",
        "{\"type\":\"ListExecutors\"} trailing",
        "{\"type\":\"ListExecutors\"}{}",
    ] {
        bodies.push(text.into());
    }
    // Unknown type tags (the names are case-sensitive).
    for tag in [
        "DropTables",
        "registerexecutor",
        "REGISTEREXECUTOR",
        "Register Executor",
        "",
    ] {
        bodies.push(format!("{{\"type\":\"{tag}\",\"executor_id\":\"exec-a\"}}").into());
    }
    // Wrong field types and bad ids.
    for text in [
        r#"{"type":"RegisterExecutor","executor_id":5,"instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","host_port":"h:1","cores":2}"#,
        r#"{"type":"RegisterExecutor","executor_id":"exec-a","instance_id":"not-a-uuid","host_port":"h:1","cores":2}"#,
        r#"{"type":"RegisterExecutor","executor_id":"exec-a","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","host_port":"h:1","cores":"2"}"#,
        r#"{"type":"RegisterExecutor","executor_id":"exec-a","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","host_port":"h:1","cores":-2}"#,
        r#"{"type":"RegisterExecutor","executor_id":"exec-a","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","host_port":"h:1","cores":1.5}"#,
        r#"{"type":"RegisterExecutor","executor_id":"a.b","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","host_port":"h:1","cores":2}"#,
        r#"{"type":"RegisterExecutor","executor_id":"*","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","host_port":"h:1","cores":2}"#,
        r#"{"type":"StatusUpdates","executor_id":"exec-a","updates":{"task_id":1}}"#,
        r#"{"type":"StatusUpdates","executor_id":"exec-a","updates":[{"task_id":1,"attempt":0,"state":"EXPLODED"}]}"#,
        r#"{"type":"StatusUpdates","executor_id":"exec-a","updates":[[1]]}"#,
        r#"{"type":"StatusUpdates","executor_id":"exec-a","updates":[[1,0,"FINISHED"]]}"#,
        r#"{"type":"StatusUpdates","executor_id":"exec-a","updates":[[-1,0]]}"#,
        r#"{"type":"Heartbeat","executor_id":"exec-a","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","running":"all"}"#,
        r#"{"type":"SubmitJob","tasks":[{"kind":"rm -rf","argv":["/"]}]}"#,
        r#"{"type":"SubmitJob","tasks":"noop"}"#,
        r#"{"type":"KillJob","job_id":"1"}"#,
        r#"{"type":"LaunchTasks","tasks":[{"task_id":"x"}]}"#,
        r#"{"type":"LaunchTasks","tasks":[{"task_id":1,"job_id":1,"index":0,"attempt":0,"cpus":1,"spec":{"kind":"handler","name":"noop"}}]}"#,
        r#"{"type":"LaunchTasks","tasks":[{"job_id":1,"cpus":1,"spec":{"kind":"handler","name":"noop"},"tasks":[]}]}"#,
        r#"{"type":"LaunchTasks","tasks":[{"job_id":1,"cpus":1,"spec":{"kind":"handler","name":"noop"},"tasks":[[1,0]]}]}"#,
        r#"{"type":"LaunchTasks","tasks":[{"job_id":1,"cpus":1,"spec":{"kind":"handler","name":"noop"},"tasks":[[1,0,0,0]]}]}"#,
        r#"{"type":"LaunchTasks","tasks":[{"job_id":1,"cpus":1,"spec":{"kind":"handler","name":"noop"},"tasks":[[1,-1,0]]}]}"#,
        r#"{"type":"KillTask","task_id":1}"#,
    ] {
        bodies.push(text.into());
    }
    // Huge numbers.
    for number in [
        "1e400",
        "-1e400",
        "18446744073709551616",
        "99999999999999999999999999999999",
        "4294967296",
        "-0.0",
    ] {
        bodies.push(format!(r#"{{"type":"KillJob","job_id":{number}}}"#).into());
        bodies.push(format!(r#"{{"type":"RegisterExecutor","executor_id":"exec-a","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","host_port":"h:1","cores":{number}}}"#).into());
    }
    // Nesting 10,000 deep: bare, and inside a field that takes any JSON.
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    bodies.push(deep(10_000).into());
    bodies.push(format!("{}{}", "{\"a\":".repeat(10_000), "}".repeat(10_000)).into());
    bodies.push(
        format!(
            r#"{{"type":"SubmitJob","tasks":[{{"kind":"handler","name":"noop","arg":{}}}]}}"#,
            deep(10_000)
        )
        .into(),
    );
    // Just under max_payload.
    let pad = MAX_PAYLOAD - 200;
    bodies.push(format!(r#"{{"type":"DropTables","pad":"{}"}}"#, "x".repeat(pad)).into());
    bodies.push(
        format!(
            r#"{{"type":"SubmitJob","name":"{}","tasks":[}}"#,
            "n".repeat(pad)
        )
        .into(),
    );
    bodies.push(vec![b'{'; pad]);
    bodies.push((0..pad).map(|i| (i * 7 + 3) as u8).collect());
    bodies
}

/// Decodable, and still refused: another's id in the payload, a duplicate, no cores.
fn refused_registrations() -> Vec<(&'static str, Vec<u8>)> {
    let register = |id: &str, cores: u32| {
        format!(r#"{{"type":"RegisterExecutor","executor_id":"{id}","instance_id":"{}","host_port":"h:1","cores":{cores}}}"#, uuid::Uuid::new_v4()).into_bytes()
    };
    vec![
        ("exec-a", register("exec-b", 4)),
        ("exec-a", register("exec-a", 4)),
        (GHOST, register(GHOST, 0)),
        (GHOST, register(GHOST, 70_000)),
    ]
}

/// A file in the temp dir, removed on drop.
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_malformed_messages_change_nothing() {
    let config =
        TempFile(std::env::temp_dir().join(format!("ember-hostile-{}.conf", uuid::Uuid::new_v4())));
    std::fs::write(&config.0, format!("max_payload: {MAX_PAYLOAD}\n")).expect("write config");
    let cluster = TestCluster::start_with("hostile", &["-c", config.0.to_str().expect("utf-8")]);
    let driver = cluster.driver().await;
    let exec_a = cluster
        .executor("exec-a", 2, ember::executor::Handlers::builtin())
        .await;
    let exec_b = cluster
        .executor("exec-b", 2, ember::executor::Handlers::builtin())
        .await;
    let api = cluster.api(cluster.client().await);
    common::eventually(Duration::from_secs(10), "two executors", || async {
        (api.executors().await.ok()?.registered_executors == 2).then_some(())
    })
    .await;
    let first = api.run_job(noops(8), |_| {}).await.expect("a first job");
    assert_eq!(first.state, JobState::Succeeded);
    let executors_before = api.executors().await.expect("registry");
    let jobs_before = api.jobs().await.expect("jobs");

    let s = &cluster.subjects;
    let (a, b, ghost) = (id("exec-a"), id("exec-b"), id(GHOST));
    // (subject, the id whose inbox may receive the answer; None: the api, any inbox.)
    let targets: Vec<(String, Option<&str>)> = vec![
        (s.register(&a), Some("exec-a")),
        (s.status(&a), Some("exec-a")),
        (s.heartbeat(&a), Some("exec-a")),
        (s.register(&ghost), Some(GHOST)),
        (s.status(&ghost), Some(GHOST)),
        (s.heartbeat(&ghost), Some(GHOST)),
        (s.api(), None),
    ];
    let inboxes = [s.executor_inbox(&a), s.executor_inbox(&b)];
    let sender = cluster.client().await;
    let collector = cluster.client().await;
    let mut answers = futures::stream::select_all([
        collector
            .subscribe("_INBOX.exec-a.hostile.>")
            .await
            .expect("sub"),
        collector
            .subscribe("_INBOX.ghost.hostile.>")
            .await
            .expect("sub"),
        collector
            .subscribe("_INBOX.hostile-api.>")
            .await
            .expect("sub"),
    ]);
    // Requests whose answer would go into someone else's inbox: refused, so nothing arrives.
    let mut stolen = collector
        .subscribe("_INBOX.exec-b.stolen.>")
        .await
        .expect("sub");
    collector.flush().await.expect("flush");

    let bodies = malformed();
    let mut expected: HashMap<String, &'static str> = HashMap::new();
    let mut sent = 0usize;
    for (n, (owner, body)) in refused_registrations().into_iter().enumerate() {
        let reply = format!("_INBOX.{owner}.hostile.r{n}");
        expected.insert(reply.clone(), "RegisterExecutorFailed");
        send(&sender, s.register(&id(owner)), Some(reply), body).await;
        sent += 1;
    }
    let mut n = 0;
    while sent < MESSAGES {
        let body = bodies[n % bodies.len()].clone();
        match n % 10 {
            // Executors' inboxes: nothing answers there.
            0 | 1 => send(&sender, inboxes[n % 2].clone(), None, body).await,
            // No reply subject, or one in another executor's inbox: no answer.
            2 if n % 20 == 2 => send(&sender, s.status(&a), None, body).await,
            2 => {
                let reply = format!("_INBOX.exec-b.stolen.{n}");
                send(&sender, s.register(&a), Some(reply), body).await
            }
            _ => {
                let (subject, owner) = &targets[n % targets.len()];
                let reply = match owner {
                    Some(owner) => format!("_INBOX.{owner}.hostile.{n}"),
                    None => format!("_INBOX.hostile-api.{n}"),
                };
                let family = if subject.contains(".driver.register.") {
                    "RegisterExecutorFailed"
                } else {
                    "Error"
                };
                expected.insert(reply.clone(), family);
                send(&sender, subject.clone(), Some(reply), body).await;
            }
        }
        sent += 1;
        if n % 500 == 0 {
            sender.flush().await.expect("flush");
        }
        n += 1;
    }
    sender.flush().await.expect("flush");

    // Exactly one answer per request, of the error kind of its subject.
    let mut got: HashMap<String, usize> = HashMap::new();
    within(Duration::from_secs(20), async {
        while got.len() < expected.len() {
            let message = answers.next().await.expect("subscription open");
            let answer: Value = serde_json::from_slice(&message.payload).expect("answers are JSON");
            let subject = message.subject.to_string();
            let family = expected
                .get(&subject)
                .unwrap_or_else(|| panic!("unexpected answer on {subject}"));
            assert_eq!(answer["type"], *family, "{subject}: {answer}");
            *got.entry(subject).or_default() += 1;
        }
    })
    .await;
    if let Ok(Some(extra)) = tokio::time::timeout(Duration::from_millis(300), answers.next()).await
    {
        panic!("a second answer on {}", extra.subject);
    }
    assert!(got.values().all(|&count| count == 1));
    if let Ok(Some(leak)) = tokio::time::timeout(Duration::from_millis(100), stolen.next()).await {
        panic!("an answer went into another's inbox: {}", leak.subject);
    }

    // Everyone is up, and nothing changed.
    assert!(!driver.is_finished() && !exec_a.is_finished() && !exec_b.is_finished());
    assert_eq!(
        heard_from_aside(api.executors().await.expect("registry")),
        heard_from_aside(executors_before)
    );
    assert_eq!(api.jobs().await.expect("jobs"), jobs_before);
    let after = api.run_job(noops(8), |_| {}).await.expect("a job after");
    assert_eq!((after.state, after.succeeded), (JobState::Succeeded, 8));
    println!("{sent} messages, {} answered requests", expected.len());
}

/// Publishes `body` on `subject`, with `reply` if given.
async fn send(sender: &async_nats::Client, subject: String, reply: Option<String>, body: Vec<u8>) {
    match reply {
        Some(reply) => sender.publish_with_reply(subject, reply, body.into()).await,
        None => sender.publish(subject, body.into()).await,
    }
    .expect("publish")
}

fn id(text: &str) -> ember::ids::ExecutorId {
    ember::ids::ExecutorId::parse(text).expect("valid id")
}

/// With no server there, every binary says why once, with the hint last.
#[test]
fn with_no_server_each_binary_names_the_cause_once_with_the_hint_last() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("nats://127.0.0.1:{port}");
    for (binary, args) in [
        (env!("CARGO_BIN_EXE_ember"), vec!["jobs"]),
        (env!("CARGO_BIN_EXE_ember-driver"), vec![]),
        (env!("CARGO_BIN_EXE_ember-executor"), vec![]),
    ] {
        let out = std::process::Command::new(binary)
            .args(["--nats-url", &url])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{binary} succeeded with no server");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = stderr.lines().last().unwrap_or_default();
        assert_eq!(
            line.matches("Connection refused").count(),
            1,
            "{binary}: {line}"
        );
        assert!(
            line.contains(&format!("could not connect to NATS at {url}")),
            "{line}"
        );
        assert!(
            line.ends_with("(is nats-server running? `ember up` starts one)"),
            "{line}"
        );
    }
}

/// The driver's resident memory in bytes, from `/proc`.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS");
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// A 100-byte request for ten million tasks costs the driver what those tasks cost while
/// they wait, not a record each: a job's memory grows with what it launches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_million_task_job_costs_the_driver_little_until_its_tasks_run() {
    let cluster = TestCluster::start_with_jetstream("big-job");
    let driver = cluster.driver_process(&[]).spawn().unwrap();
    let pid = driver.id().unwrap();
    let api = cluster.api(cluster.client().await);
    eventually(Duration::from_secs(20), "the driver answers", || async {
        api.executors().await.ok()
    })
    .await;
    let before = rss_bytes(pid);
    let job_id = api.submit(noops(10_000_000)).await.expect("accepted");
    let summary = api.job(job_id).await.expect("the job");
    assert_eq!((summary.tasks, summary.succeeded), (10_000_000, 0));
    let grown = rss_bytes(pid).saturating_sub(before);
    assert!(
        grown < 32 << 20,
        "the driver grew by {} MiB for a job none of whose tasks has run",
        grown >> 20
    );
    // Killed before any ran: every task counts killed, still without a record each.
    api.kill(job_id).await.expect("killed");
    let summary = api.job(job_id).await.expect("the job");
    assert_eq!(
        (summary.state, summary.killed),
        (JobState::Killed, 10_000_000)
    );
    let results = api
        .call(&ember::protocol::ApiRequest::GetResults {
            job_id,
            offset: 9_999_998,
            limit: 5,
        })
        .await
        .expect("a page of results");
    let ember::protocol::ApiReply::Results(page) = results else {
        panic!("not a results page: {results:?}");
    };
    let states: Vec<_> = page.results.iter().map(|o| (o.index, o.state)).collect();
    assert_eq!(
        states,
        vec![
            (9_999_998, TaskState::Killed),
            (9_999_999, TaskState::Killed)
        ]
    );
    assert!(rss_bytes(pid).saturating_sub(before) < 32 << 20);
}

/// An api client on an executor's own connection is told at once to open another, rather than
/// left to time out: the driver answers no api request whose reply lies under a registered
/// executor's inbox. The driver says why in its log, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_client_on_an_executor_s_connection_is_told_to_open_another() {
    use ember::client::ClientError;
    use ember::executor::Handlers;
    let cluster = TestCluster::start("executor-api");
    let driver = cluster
        .driver_process(&[])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _executor = cluster.executor("exec-1", 1, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    eventually(Duration::from_secs(20), "exec-1 registered", || async {
        let registered = api.executors().await.ok()?.registered_executors;
        (registered == 1).then_some(())
    })
    .await;

    let own = cluster.api(cluster.executor_client("exec-1").await);
    let started = std::time::Instant::now();
    let error = own.executors().await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1), "{error}");
    assert!(
        matches!(&error, ClientError::ExecutorInbox { executor } if executor.as_str() == "exec-1"),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.contains("_INBOX.exec-1") && text.contains("second connection"),
        "{text}"
    );
    // Other prefixes are a client's: the listener's, and one of more tokens.
    for prefix in [ember::subjects::Subjects::LISTENER_INBOX, "_INBOX.app.api"] {
        let nats = async_nats::ConnectOptions::new()
            .custom_inbox_prefix(prefix)
            .connect(cluster.url())
            .await
            .unwrap();
        let snapshot = cluster.api(nats).executors().await;
        assert_eq!(snapshot.unwrap().registered_executors, 1, "{prefix}");
    }

    // Asked twice from the executor's inbox with plain NATS, the driver answers neither, and
    // says why in its log once.
    let raw = cluster.executor_client("exec-1").await;
    let request = ember::protocol::encode(&ember::protocol::ApiRequest::GetJob { job_id: 1 });
    for _ in 0..2 {
        let asked = tokio::time::timeout(
            Duration::from_secs(1),
            raw.request(cluster.subjects.api(), request.clone()),
        )
        .await;
        assert!(
            !matches!(asked, Ok(Ok(_))),
            "answered into the executor's inbox"
        );
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(driver.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = within(Duration::from_secs(20), driver.wait_with_output())
        .await
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    let said = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("where the driver answers no api request"))
        .count();
    assert_eq!(said, 1, "{log}");
}
