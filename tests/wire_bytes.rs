//! The wire in bytes: every message of the hot path, built in Rust, must be written as exactly
//! the bytes spelled out here, key order and all, and those bytes must read back as the same
//! value. tests/protocol_golden.rs compares JSON values, which a change of key order or of
//! whitespace passes; a receiver that reads Ember's own form directly (`fast.rs`) does not, and
//! neither does anyone who compares payloads. A change here is a change of the wire.

use ember::ids::{ExecutorId, InstanceId};
use ember::protocol::*;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

const LIMIT: usize = 1024 * 1024;

const INSTANCE: &str = "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b";
const DRIVER: &str = "0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3";

fn instance() -> InstanceId {
    InstanceId::parse_str(INSTANCE).unwrap()
}

fn driver() -> Option<InstanceId> {
    Some(InstanceId::parse_str(DRIVER).unwrap())
}

fn exec(id: &str) -> ExecutorId {
    ExecutorId::parse(id).unwrap()
}

/// `encode` writes `value` as exactly `wire`, and `decode` reads `wire` back as `value`.
#[track_caller]
fn pin<T>(value: &T, wire: &str)
where
    T: Serialize + Message + PartialEq + Debug,
{
    let written = encode(value);
    assert_eq!(String::from_utf8_lossy(&written), wire, "the bytes written");
    let read: T = decode(wire.as_bytes(), LIMIT).unwrap_or_else(|e| panic!("{wire}: {e}"));
    assert_eq!(&read, value, "the value read back");
}

// ---------------------------------------------------------------------------------------------
// Status batches

fn updates() -> Vec<StatusUpdate> {
    let finished = |task_id, attempt| StatusUpdate {
        task_id,
        attempt,
        state: TaskState::Finished,
        result: None,
        error: None,
        result_object: None,
        no_retry: false,
    };
    vec![
        finished(42, 0),
        StatusUpdate {
            result: Some(json!({"exit_code": 0, "out": "a \"b\"\n"})),
            ..finished(43, 1)
        },
        StatusUpdate {
            state: TaskState::Failed,
            error: Some("boom: é\u{1}".into()),
            ..finished(44, 2)
        },
        StatusUpdate {
            result_object: Some(ResultObject {
                object: ember::objects::ObjectRef::parse(&"ab".repeat(32)).unwrap(),
                bytes: 2_500_000,
            }),
            ..finished(45, 0)
        },
        StatusUpdate {
            state: TaskState::Killed,
            ..finished(46, 0)
        },
        finished(u64::MAX, u32::MAX),
        finished(0, 0),
    ]
}

/// Each batch, and the bytes both its writers write: `encode`, and the executor's queue.
fn batches() -> Vec<(StatusRequest, &'static str)> {
    let batch = |updates, driver_instance| StatusRequest::StatusUpdates {
        executor_id: exec("exec-1"),
        updates,
        driver_instance,
    };
    let finishes = updates()[5..].to_vec();
    vec![
        (
            batch(Vec::new(), None),
            r#"{"type":"StatusUpdates","executor_id":"exec-1","updates":[]}"#,
        ),
        (
            batch(finishes.clone(), driver()),
            r#"{"type":"StatusUpdates","executor_id":"exec-1","updates":[[18446744073709551615,4294967295],[0,0]],"driver_instance":"0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3"}"#,
        ),
        (
            batch(finishes, None),
            r#"{"type":"StatusUpdates","executor_id":"exec-1","updates":[[18446744073709551615,4294967295],[0,0]]}"#,
        ),
        (
            batch(updates(), driver()),
            r#"{"type":"StatusUpdates","executor_id":"exec-1","updates":[[42,0],{"task_id":43,"attempt":1,"state":"FINISHED","result":{"exit_code":0,"out":"a \"b\"\n"}},{"task_id":44,"attempt":2,"state":"FAILED","error":"boom: é\u0001"},{"task_id":45,"attempt":0,"state":"FINISHED","result_object":{"object":"abababababababababababababababababababababababababababababababab","bytes":2500000}},{"task_id":46,"attempt":0,"state":"KILLED"},[18446744073709551615,4294967295],[0,0]],"driver_instance":"0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3"}"#,
        ),
    ]
}

#[test]
fn status_updates_as_encode_writes_them() {
    for (batch, wire) in batches() {
        pin(&batch, wire);
    }
}

#[test]
fn status_updates_as_the_executor_writes_them() {
    for (batch, wire) in batches() {
        let StatusRequest::StatusUpdates {
            executor_id,
            updates,
            driver_instance,
        } = batch;
        let written = ember::executor::encode_status_batch(executor_id, driver_instance, updates);
        assert_eq!(String::from_utf8_lossy(&written), wire);
    }
}

// ---------------------------------------------------------------------------------------------
// Launches, alone and riding on a status answer

fn noop() -> Arc<TaskSpec> {
    Arc::new(TaskSpec::Handler {
        name: "noop".into(),
        arg: Value::Null,
    })
}

fn task(task_id: u64, job_id: u64, index: u32, spec: &Arc<TaskSpec>) -> TaskDescription {
    TaskDescription {
        task_id,
        job_id,
        index,
        attempt: 0,
        cpus: 1,
        spec: Arc::clone(spec),
        resources: Default::default(),
        gang_peers: Vec::new(),
    }
}

/// Tasks that make every kind of group: a run of one job's tasks sharing a spec, a job with
/// other cores, each kind of spec, a task holding resources (a group of its own), and a task of
/// the first job again after the others (a group again).
fn launched() -> Vec<TaskDescription> {
    let noop = noop();
    let command = Arc::new(TaskSpec::Command {
        argv: vec!["sh".into(), "-c".into(), "echo \"hi\"".into()],
        env: [("A".to_string(), "1".to_string())].into(),
        cwd: Some("/tmp".into()),
        timeout_ms: Some(5000),
        inputs: Default::default(),
        outputs: Vec::new(),
    });
    let bare = Arc::new(TaskSpec::Command {
        argv: vec!["true".into()],
        env: BTreeMap::new(),
        cwd: None,
        timeout_ms: None,
        inputs: Default::default(),
        outputs: Vec::new(),
    });
    let python = Arc::new(TaskSpec::Python {
        function: "gASVFAAAAAAAAACMCGJ1aWx0aW5zlIwDbGVulJOULg==".into(),
        args: "gASVDAAAAAAAAABDAmFilIWUfZSGlC4=".into(),
        map: true,
        timeout_ms: Some(1000),
        function_object: None,
        args_object: None,
        objects: Vec::new(),
        upstream: Vec::new(),
        no_retry_on: Vec::new(),
        retry_on: Vec::new(),
    });
    let echo = Arc::new(TaskSpec::Handler {
        name: "echo".into(),
        arg: json!({"value": [1, "x"]}),
    });
    vec![
        task(40, 7, 0, &noop),
        task(41, 7, 1, &noop),
        TaskDescription {
            attempt: 3,
            ..task(42, 7, 2, &noop)
        },
        TaskDescription {
            cpus: 4,
            ..task(50, 8, 0, &command)
        },
        task(51, 8, 1, &bare),
        task(60, 9, 0, &python),
        TaskDescription {
            resources: [("gpu".to_string(), vec!["0".to_string(), "1".to_string()])].into(),
            ..task(61, 9, 1, &echo)
        },
        task(u64::MAX, u64::MAX, u32::MAX, &noop),
        task(43, 7, 3, &noop),
    ]
}

#[test]
fn launch_tasks() {
    pin(
        &ExecutorMessage::LaunchTasks {
            tasks: launched(),
            driver_instance: driver(),
        },
        r#"{"type":"LaunchTasks","tasks":[{"job_id":7,"cpus":1,"spec":{"kind":"handler","name":"noop","arg":null},"tasks":[[40,0,0],[41,1,0],[42,2,3]]},{"job_id":8,"cpus":4,"spec":{"kind":"command","argv":["sh","-c","echo \"hi\""],"env":{"A":"1"},"cwd":"/tmp","timeout_ms":5000},"tasks":[[50,0,0]]},{"job_id":8,"cpus":1,"spec":{"kind":"command","argv":["true"],"env":{}},"tasks":[[51,1,0]]},{"job_id":9,"cpus":1,"spec":{"kind":"python","function":"gASVFAAAAAAAAACMCGJ1aWx0aW5zlIwDbGVulJOULg==","args":"gASVDAAAAAAAAABDAmFilIWUfZSGlC4=","map":true,"timeout_ms":1000},"tasks":[[60,0,0]]},{"job_id":9,"cpus":1,"spec":{"kind":"handler","name":"echo","arg":{"value":[1,"x"]}},"resources":{"gpu":["0","1"]},"tasks":[[61,1,0]]},{"job_id":18446744073709551615,"cpus":1,"spec":{"kind":"handler","name":"noop","arg":null},"tasks":[[18446744073709551615,4294967295,0]]},{"job_id":7,"cpus":1,"spec":{"kind":"handler","name":"noop","arg":null},"tasks":[[43,3,0]]}],"driver_instance":"0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3"}"#,
    );
    pin(
        &ExecutorMessage::LaunchTasks {
            tasks: vec![task(40, 7, 0, &noop())],
            driver_instance: None,
        },
        r#"{"type":"LaunchTasks","tasks":[{"job_id":7,"cpus":1,"spec":{"kind":"handler","name":"noop","arg":null},"tasks":[[40,0,0]]}]}"#,
    );
    pin(
        &ExecutorMessage::LaunchTasks {
            tasks: Vec::new(),
            driver_instance: None,
        },
        r#"{"type":"LaunchTasks","tasks":[]}"#,
    );
    // A gang's tasks: each holds its port, and knows its peers in task order (serde reads it).
    let peers = vec!["a.local:41000".to_string(), "b.local:41007".to_string()];
    let gang = |task_id, index: u32, port: &str| TaskDescription {
        resources: [("gang_port".to_string(), vec![port.to_string()])].into(),
        gang_peers: peers.clone(),
        ..task(task_id, 10, index, &noop())
    };
    pin(
        &ExecutorMessage::LaunchTasks {
            tasks: vec![gang(70, 0, "41000"), gang(71, 1, "41007")],
            driver_instance: None,
        },
        r#"{"type":"LaunchTasks","tasks":[{"job_id":10,"cpus":1,"spec":{"kind":"handler","name":"noop","arg":null},"resources":{"gang_port":["41000"]},"gang_peers":["a.local:41000","b.local:41007"],"tasks":[[70,0,0]]},{"job_id":10,"cpus":1,"spec":{"kind":"handler","name":"noop","arg":null},"resources":{"gang_port":["41007"]},"gang_peers":["a.local:41000","b.local:41007"],"tasks":[[71,1,0]]}]}"#,
    );
}

#[test]
fn the_other_executor_messages() {
    pin(
        &ExecutorMessage::KillTask {
            task_id: 42,
            attempt: 1,
            reason: "job 7 killed".into(),
            driver_instance: driver(),
        },
        r#"{"type":"KillTask","task_id":42,"attempt":1,"reason":"job 7 killed","driver_instance":"0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3"}"#,
    );
    pin(
        &ExecutorMessage::KillTask {
            task_id: 42,
            attempt: 0,
            reason: "speculative copy lost".into(),
            driver_instance: None,
        },
        r#"{"type":"KillTask","task_id":42,"attempt":0,"reason":"speculative copy lost"}"#,
    );
    pin(
        &ExecutorMessage::StopExecutor {
            reason: "decommissioned by request".into(),
        },
        r#"{"type":"StopExecutor","reason":"decommissioned by request"}"#,
    );
}

fn refused() -> Vec<RefusedStatus> {
    vec![
        RefusedStatus {
            task_id: 43,
            attempt: 1,
            reason: "stale attempt".into(),
        },
        RefusedStatus {
            task_id: 44,
            attempt: 0,
            reason: "unknown task".into(),
        },
    ]
}

#[test]
fn status_ack() {
    let ack = |accepted, refused, launch| StatusReply::StatusAck {
        accepted,
        refused,
        launch,
    };
    pin(
        &ack(0, Vec::new(), Vec::new()),
        r#"{"type":"StatusAck","accepted":0,"refused":[]}"#,
    );
    pin(
        &ack(2, refused(), Vec::new()),
        r#"{"type":"StatusAck","accepted":2,"refused":[{"task_id":43,"attempt":1,"reason":"stale attempt"},{"task_id":44,"attempt":0,"reason":"unknown task"}]}"#,
    );
    pin(
        &ack(9, Vec::new(), launched()),
        r#"{"type":"StatusAck","accepted":9,"refused":[],"launch":[{"job_id":7,"cpus":1,"spec":{"kind":"handler","name":"noop","arg":null},"tasks":[[40,0,0],[41,1,0],[42,2,3]]},{"job_id":8,"cpus":4,"spec":{"kind":"command","argv":["sh","-c","echo \"hi\""],"env":{"A":"1"},"cwd":"/tmp","timeout_ms":5000},"tasks":[[50,0,0]]},{"job_id":8,"cpus":1,"spec":{"kind":"command","argv":["true"],"env":{}},"tasks":[[51,1,0]]},{"job_id":9,"cpus":1,"spec":{"kind":"python","function":"gASVFAAAAAAAAACMCGJ1aWx0aW5zlIwDbGVulJOULg==","args":"gASVDAAAAAAAAABDAmFilIWUfZSGlC4=","map":true,"timeout_ms":1000},"tasks":[[60,0,0]]},{"job_id":9,"cpus":1,"spec":{"kind":"handler","name":"echo","arg":{"value":[1,"x"]}},"resources":{"gpu":["0","1"]},"tasks":[[61,1,0]]},{"job_id":18446744073709551615,"cpus":1,"spec":{"kind":"handler","name":"noop","arg":null},"tasks":[[18446744073709551615,4294967295,0]]},{"job_id":7,"cpus":1,"spec":{"kind":"handler","name":"noop","arg":null},"tasks":[[43,3,0]]}]}"#,
    );
    pin(
        &ack(1, refused(), vec![task(40, 7, 0, &noop())]),
        r#"{"type":"StatusAck","accepted":1,"refused":[{"task_id":43,"attempt":1,"reason":"stale attempt"},{"task_id":44,"attempt":0,"reason":"unknown task"}],"launch":[{"job_id":7,"cpus":1,"spec":{"kind":"handler","name":"noop","arg":null},"tasks":[[40,0,0]]}]}"#,
    );
}

#[test]
fn the_other_status_replies() {
    pin(
        &StatusReply::UnknownExecutor {
            message: "executor exec-1 is not registered".into(),
        },
        r#"{"type":"UnknownExecutor","message":"executor exec-1 is not registered"}"#,
    );
    pin(
        &StatusReply::Error {
            message: "a batch of 70000 updates".into(),
        },
        r#"{"type":"Error","message":"a batch of 70000 updates"}"#,
    );
}

// ---------------------------------------------------------------------------------------------
// Heartbeats and registration

fn running() -> Vec<RunningAttempt> {
    vec![
        RunningAttempt {
            task_id: 42,
            attempt: 0,
            term: 0,
            ended: false,
        },
        RunningAttempt {
            task_id: 43,
            attempt: 2,
            term: 5,
            ended: false,
        },
    ]
}

#[test]
fn heartbeats() {
    pin(
        &HeartbeatRequest::Heartbeat {
            executor_id: exec("exec-1"),
            instance_id: instance(),
            running: running(),
            driver_instance: driver(),
            objects: Default::default(),
            connection: Some(ember::protocol::ConnectionId {
                server_id: "NSERVER".into(),
                client_id: 12,
            }),
            abandoned: Vec::new(),
        },
        r#"{"type":"Heartbeat","executor_id":"exec-1","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","running":[{"task_id":42,"attempt":0},{"task_id":43,"attempt":2,"term":5}],"driver_instance":"0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3","connection":{"server_id":"NSERVER","client_id":12}}"#,
    );
    pin(
        &HeartbeatRequest::Heartbeat {
            executor_id: exec("exec-1"),
            instance_id: instance(),
            running: Vec::new(),
            driver_instance: None,
            objects: Default::default(),
            connection: None,
            abandoned: Vec::new(),
        },
        r#"{"type":"Heartbeat","executor_id":"exec-1","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","running":[]}"#,
    );
    pin(
        &HeartbeatRequest::Heartbeat {
            executor_id: exec("exec-1"),
            instance_id: instance(),
            running: Vec::new(),
            driver_instance: None,
            objects: ember::protocol::ObjectCounts {
                fetches: 1,
                fetched_bytes: 1 << 20,
                // Objects taken from the host: omitted while none were.
                host_takes: 0,
                host_taken_bytes: 0,
                cache_hits: 7,
                cache_misses: 1,
                puts: 0,
                put_bytes: 0,
            },
            connection: None,
            abandoned: Vec::new(),
        },
        r#"{"type":"Heartbeat","executor_id":"exec-1","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","running":[],"objects":{"fetches":1,"fetched_bytes":1048576,"cache_hits":7,"cache_misses":1,"puts":0,"put_bytes":0}}"#,
    );
    // Abandoned handlers, only when there are some: the list after everything else.
    pin(
        &HeartbeatRequest::Heartbeat {
            executor_id: exec("exec-1"),
            instance_id: instance(),
            running: Vec::new(),
            driver_instance: None,
            objects: Default::default(),
            connection: None,
            abandoned: vec![AbandonedAttempt {
                task_id: 17,
                attempt: 0,
                cpus: 2,
            }],
        },
        r#"{"type":"Heartbeat","executor_id":"exec-1","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","running":[],"abandoned":[{"task_id":17,"attempt":0,"cpus":2}]}"#,
    );
    pin(
        &HeartbeatRequest::DecommissionExecutor {
            executor_id: exec("exec-1"),
            instance_id: instance(),
        },
        r#"{"type":"DecommissionExecutor","executor_id":"exec-1","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"}"#,
    );
    pin(
        &HeartbeatRequest::ExecutorExiting {
            executor_id: exec("exec-1"),
            instance_id: instance(),
        },
        r#"{"type":"ExecutorExiting","executor_id":"exec-1","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"}"#,
    );
    pin(
        &HeartbeatReply::HeartbeatResponse { reregister: false },
        r#"{"type":"HeartbeatResponse","reregister":false}"#,
    );
    pin(
        &HeartbeatReply::HeartbeatResponse { reregister: true },
        r#"{"type":"HeartbeatResponse","reregister":true}"#,
    );
    pin(
        &HeartbeatReply::Error {
            message: "not the leader".into(),
        },
        r#"{"type":"Error","message":"not the leader"}"#,
    );
}

fn registration(full: bool) -> RegisterRequest {
    let pairs = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .filter(|_| full)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    RegisterRequest::RegisterExecutor(RegisterExecutor {
        executor_id: exec("exec-1"),
        instance_id: instance(),
        host_port: "worker-3:7078".into(),
        cores: 8,
        log_urls: pairs(&[("stderr", "http://worker-3/logs/stderr")]),
        attributes: pairs(&[("zone", "eu-1"), ("rack", "r1")]),
        resources: match full {
            true => [("gpu".to_string(), vec!["0".to_string(), "1".to_string()])].into(),
            false => BTreeMap::new(),
        },
        held: match full {
            true => running(),
            false => Vec::new(),
        },
        connection: None,
    })
}

#[test]
fn registration_requests_and_replies() {
    pin(
        &registration(false),
        r#"{"type":"RegisterExecutor","executor_id":"exec-1","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","host_port":"worker-3:7078","cores":8,"log_urls":{},"attributes":{}}"#,
    );
    pin(
        &registration(true),
        r#"{"type":"RegisterExecutor","executor_id":"exec-1","instance_id":"6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b","host_port":"worker-3:7078","cores":8,"log_urls":{"stderr":"http://worker-3/logs/stderr"},"attributes":{"rack":"r1","zone":"eu-1"},"resources":{"gpu":["0","1"]},"held":[{"task_id":42,"attempt":0},{"task_id":43,"attempt":2,"term":5}]}"#,
    );
    pin(
        &RegisterReply::RegisteredExecutor {
            executor_id: exec("exec-1"),
            driver_instance: driver().unwrap(),
            term: 0,
            adopted: Vec::new(),
        },
        r#"{"type":"RegisteredExecutor","executor_id":"exec-1","driver_instance":"0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3"}"#,
    );
    pin(
        &RegisterReply::RegisteredExecutor {
            executor_id: exec("exec-1"),
            driver_instance: driver().unwrap(),
            term: 9,
            adopted: vec![Adopted {
                task_id: 43,
                attempt: 2,
                term: 5,
                new_attempt: 0,
            }],
        },
        r#"{"type":"RegisteredExecutor","executor_id":"exec-1","driver_instance":"0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3","term":9,"adopted":[{"task_id":43,"attempt":2,"term":5,"new_attempt":0}]}"#,
    );
    pin(
        &RegisterReply::RegisterExecutorFailed {
            message: "Duplicate executor ID: exec-1".into(),
        },
        r#"{"type":"RegisterExecutorFailed","message":"Duplicate executor ID: exec-1"}"#,
    );
}

// ---------------------------------------------------------------------------------------------
// Task events

fn started(task_id: u64, index: u32, attempt: u32) -> TaskStarted {
    TaskStarted {
        task_id,
        index,
        attempt,
    }
}

fn ended(task_id: u64, index: u32, duration_ms: u64) -> TaskEnded {
    TaskEnded {
        task_id,
        index,
        attempt: 0,
        state: TaskState::Finished,
        duration_ms,
        error: None,
    }
}

fn on<T>(id: &str, tasks: Vec<T>) -> ExecutorTasks<T> {
    ExecutorTasks {
        executor_id: exec(id),
        tasks,
    }
}

#[test]
fn task_start() {
    let executors = || {
        vec![
            on(
                "exec-1",
                vec![
                    started(40, 0, 0),
                    started(41, 1, 0),
                    started(42, 2, 0),
                    started(44, 4, 0),
                    started(45, 5, 1),
                ],
            ),
            on("exec-2", vec![started(43, 3, 0)]),
        ]
    };
    let event = |term| Event::TaskStart {
        time_ms: 2000,
        job_id: 7,
        executors: executors(),
        term,
    };
    pin(
        &event(0),
        r#"{"type":"TaskStart","time_ms":2000,"job_id":7,"executors":[{"executor_id":"exec-1","tasks":[[40,0,0,3],[44,4,0],[45,5,1]]},{"executor_id":"exec-2","tasks":[[43,3,0]]}]}"#,
    );
    pin(
        &event(12),
        r#"{"type":"TaskStart","time_ms":2000,"job_id":7,"executors":[{"executor_id":"exec-1","tasks":[[40,0,0,3],[44,4,0],[45,5,1]]},{"executor_id":"exec-2","tasks":[[43,3,0]]}],"term":12}"#,
    );
}

#[test]
fn task_end() {
    let executors = || {
        vec![
            on(
                "exec-1",
                vec![
                    ended(40, 0, 3),
                    ended(41, 1, 0),
                    ended(42, 2, 17),
                    TaskEnded {
                        state: TaskState::Failed,
                        error: Some("boom \"x\"".into()),
                        ..ended(43, 3, 15)
                    },
                    TaskEnded {
                        state: TaskState::Killed,
                        ..ended(44, 4, 1)
                    },
                    ended(46, 6, 2),
                ],
            ),
            on("exec-2", vec![ended(45, 5, 9)]),
        ]
    };
    let event = |term| Event::TaskEnd {
        time_ms: 3000,
        job_id: 7,
        executors: executors(),
        term,
    };
    pin(
        &event(0),
        r#"{"type":"TaskEnd","time_ms":3000,"job_id":7,"executors":[{"executor_id":"exec-1","tasks":[[40,0,0,[3,0,17]],{"task_id":43,"index":3,"attempt":0,"state":"FAILED","duration_ms":15,"error":"boom \"x\""},{"task_id":44,"index":4,"attempt":0,"state":"KILLED","duration_ms":1},[46,6,0,2]]},{"executor_id":"exec-2","tasks":[[45,5,0,9]]}]}"#,
    );
    pin(
        &event(12),
        r#"{"type":"TaskEnd","time_ms":3000,"job_id":7,"executors":[{"executor_id":"exec-1","tasks":[[40,0,0,[3,0,17]],{"task_id":43,"index":3,"attempt":0,"state":"FAILED","duration_ms":15,"error":"boom \"x\""},{"task_id":44,"index":4,"attempt":0,"state":"KILLED","duration_ms":1},[46,6,0,2]]},{"executor_id":"exec-2","tasks":[[45,5,0,9]]}],"term":12}"#,
    );
}

// ---------------------------------------------------------------------------------------------
// The journal

fn outcome(task_id: u64, executor: &str) -> JournaledTask {
    JournaledTask {
        task_id,
        attempt: 0,
        executor_id: exec(executor),
        state: TaskState::Finished,
        result: None,
        error: None,
        in_bucket: false,
        result_object: None,
        objects: Vec::new(),
    }
}

#[test]
fn tasks_ended() {
    let tasks = || {
        vec![
            outcome(40, "exec-1"),
            outcome(41, "exec-1"),
            outcome(42, "exec-1"),
            outcome(43, "exec-2"),
            JournaledTask {
                result: Some(json!({"exit_code": 0})),
                ..outcome(44, "exec-2")
            },
            JournaledTask {
                state: TaskState::Failed,
                attempt: 3,
                error: Some("boom".into()),
                ..outcome(45, "exec-2")
            },
            JournaledTask {
                in_bucket: true,
                result_object: Some(ResultObject {
                    object: ember::objects::ObjectRef::parse(&"ab".repeat(32)).unwrap(),
                    bytes: 1_500_000,
                }),
                ..outcome(46, "exec-2")
            },
            outcome(47, "exec-2"),
        ]
    };
    let record = |term| JournalRecord::TasksEnded {
        time_ms: 5000,
        tasks: tasks(),
        term,
    };
    pin(
        &record(0),
        r#"{"type":"TasksEnded","time_ms":5000,"tasks":[[40,0,"exec-1",3],[43,0,"exec-2"],{"task_id":44,"attempt":0,"executor_id":"exec-2","state":"FINISHED","result":{"exit_code":0}},{"task_id":45,"attempt":3,"executor_id":"exec-2","state":"FAILED","error":"boom"},{"task_id":46,"attempt":0,"executor_id":"exec-2","state":"FINISHED","in_bucket":true,"result_object":{"object":"abababababababababababababababababababababababababababababababab","bytes":1500000}},[47,0,"exec-2"]]}"#,
    );
    pin(
        &record(12),
        r#"{"type":"TasksEnded","time_ms":5000,"tasks":[[40,0,"exec-1",3],[43,0,"exec-2"],{"task_id":44,"attempt":0,"executor_id":"exec-2","state":"FINISHED","result":{"exit_code":0}},{"task_id":45,"attempt":3,"executor_id":"exec-2","state":"FAILED","error":"boom"},{"task_id":46,"attempt":0,"executor_id":"exec-2","state":"FINISHED","in_bucket":true,"result_object":{"object":"abababababababababababababababababababababababababababababababab","bytes":1500000}},[47,0,"exec-2"]],"term":12}"#,
    );
}

#[test]
fn job_submitted() {
    let bare = SubmitJob {
        max_failures: 4,
        resources: BTreeMap::new(),
        ..SubmitJob::new(vec![(*noop()).clone()])
    };
    let full = SubmitJob {
        name: "nightly".into(),
        repeat: 1000,
        max_failures: 2,
        cpus_per_task: 2,
        resources: [("gpu".to_string(), 1)].into(),
        placement: ember::placement::Placement {
            constraints: vec!["rack=r1".into()],
            prefer_executors: vec![exec("exec-2")],
            prefer_hosts: vec!["worker-3".into()],
            prefer_sites: vec![],
            locality_wait_ms: Some(500),
        },
        pool: Some("etl".into()),
        priority: -5,
        speculation: Some(Speculation::default()),
        submission_id: Some("nightly-2024".into()),
        ..SubmitJob::new(vec![
            (*noop()).clone(),
            TaskSpec::Command {
                argv: vec!["true".into()],
                env: BTreeMap::new(),
                cwd: None,
                timeout_ms: Some(1000),
                inputs: Default::default(),
                outputs: Vec::new(),
            },
        ])
    };
    let record = |job: &SubmitJob, term| JournalRecord::JobSubmitted {
        job_id: 7,
        first_task: 40,
        time_ms: 1000,
        job: Box::new(job.clone()),
        term,
        tenant: None,
    };
    pin(
        &record(&bare, None),
        r#"{"type":"JobSubmitted","job_id":7,"first_task":40,"time_ms":1000,"job":{"name":"","tasks":[{"kind":"handler","name":"noop","arg":null}],"repeat":1,"max_failures":4,"cpus_per_task":1}}"#,
    );
    pin(
        &record(&full, Some(12)),
        r#"{"type":"JobSubmitted","job_id":7,"first_task":40,"time_ms":1000,"job":{"name":"nightly","tasks":[{"kind":"handler","name":"noop","arg":null},{"kind":"command","argv":["true"],"env":{},"timeout_ms":1000}],"repeat":1000,"max_failures":2,"cpus_per_task":2,"resources":{"gpu":1},"constraints":["rack=r1"],"prefer_executors":["exec-2"],"prefer_hosts":["worker-3"],"locality_wait_ms":500,"pool":"etl","priority":-5,"speculation":{"quantile":0.75,"multiplier":1.5,"min_runtime_ms":100},"submission_id":"nightly-2024"},"term":12}"#,
    );
}

#[test]
fn a_submission_that_names_only_its_tasks_reads_as_submit_job_new() {
    let read: SubmitJob =
        serde_json::from_str(r#"{"tasks":[{"kind":"handler","name":"noop","arg":null}]}"#).unwrap();
    assert_eq!(read, SubmitJob::new(vec![TaskSpec::clone(&noop())]));
}
