//! Golden wire shapes: every message in `ember::protocol`, built in Rust, must serialize to the
//! exact JSON written out here (the shapes docs/protocol.md documents), and that JSON must decode
//! back to the same value through `ember::protocol::decode`. Also: what `decode` refuses.

use ember::ids::{ExecutorId, InstanceId, JobId};
use ember::protocol::*;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;

/// A generous decode limit for the round trips.
const LIMIT: usize = 1024 * 1024;

const INSTANCE: &str = "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b";
const DRIVER: &str = "0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3";

fn instance() -> InstanceId {
    InstanceId::parse_str(INSTANCE).unwrap()
}

fn driver_instance() -> InstanceId {
    InstanceId::parse_str(DRIVER).unwrap()
}

fn exec(id: &str) -> ExecutorId {
    ExecutorId::parse(id).unwrap()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `value` serializes to exactly `wire`, `encode` agrees, and `wire` decodes back to `value`.
fn golden<T>(value: &T, wire: Value)
where
    T: Serialize + Message + PartialEq + Debug + 'static,
{
    assert_eq!(
        serde_json::to_value(value).unwrap(),
        wire,
        "serialized shape"
    );
    let encoded: Value = serde_json::from_slice(&encode(value)).unwrap();
    assert_eq!(encoded, wire, "encode() shape");
    let bytes = serde_json::to_vec(&wire).unwrap();
    let back: T = decode(&bytes, LIMIT).unwrap_or_else(|e| panic!("decode {wire}: {e}"));
    assert_eq!(&back, value, "decoded value");
    // Both readers of what `encode` writes agree: `decode`, which tries a message's own fast
    // reader first where it has one (`fast_reads` checks that it did), and serde alone.
    let written = encode(value);
    let read: T = decode(&written, LIMIT).unwrap_or_else(|e| panic!("decode {wire}: {e}"));
    assert_eq!(&read, value, "decode() of encode()'s bytes");
    let by_serde: T = serde_json::from_slice(&written).unwrap();
    assert_eq!(&by_serde, value, "serde's read of encode()'s bytes");
}

/// The message's fast reader, not serde, reads what `encode` writes of `value`: a golden
/// message of the hot path that serde alone would read leaves the fast reader untested.
fn fast_reads<T>(value: &T)
where
    T: Serialize + Message + PartialEq + Debug,
{
    assert_eq!(
        T::decode_fast(&encode(value)).as_ref(),
        Some(value),
        "the fast reader of {value:?}"
    );
}

/// `wire` decodes to `value` (for inputs that leave out defaulted fields).
fn decodes_to<T>(wire: Value, value: &T)
where
    T: Message + PartialEq + Debug + 'static,
{
    let bytes = serde_json::to_vec(&wire).unwrap();
    let back: T = decode(&bytes, LIMIT).unwrap_or_else(|e| panic!("decode {wire}: {e}"));
    assert_eq!(&back, value);
}

/// Decoding `payload` as `T` fails with a JSON error whose message contains every `needles`.
fn json_error<T: Message + Debug + 'static>(payload: &[u8], needles: &[&str]) -> String {
    match decode::<T>(payload, LIMIT) {
        Err(DecodeError::Json(e)) => {
            let message = DecodeError::Json(e).to_string();
            for needle in needles {
                assert!(
                    message.contains(needle),
                    "error {message:?} should mention {needle:?}"
                );
            }
            message
        }
        other => panic!("expected a JSON error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------------------------

fn register_request() -> RegisterRequest {
    RegisterRequest::RegisterExecutor(RegisterExecutor {
        executor_id: exec("exec-1"),
        instance_id: instance(),
        host_port: "worker-3:7078".into(),
        cores: 8,
        log_urls: map(&[("stderr", "http://worker-3/logs/stderr")]),
        attributes: map(&[("rack", "r1"), ("zone", "eu-1")]),
        resources: Default::default(),
        held: Vec::new(),
        connection: Some(ember::protocol::ConnectionId {
            server_id: "NBUTR4XR4ECFS5XYWGHY5JJERSGQC6K47STJSF6WVQRFONML7MYFO2M6".into(),
            client_id: 7,
        }),
    })
}

#[test]
fn register_executor() {
    golden(
        &register_request(),
        json!({
            "type": "RegisterExecutor",
            "executor_id": "exec-1",
            "instance_id": INSTANCE,
            "host_port": "worker-3:7078",
            "cores": 8,
            "log_urls": {"stderr": "http://worker-3/logs/stderr"},
            "attributes": {"rack": "r1", "zone": "eu-1"},
            "connection": {"server_id": "NBUTR4XR4ECFS5XYWGHY5JJERSGQC6K47STJSF6WVQRFONML7MYFO2M6", "client_id": 7}
        }),
    );
}

#[test]
fn register_executor_without_maps() {
    let value = RegisterRequest::RegisterExecutor(RegisterExecutor {
        executor_id: exec("e_2"),
        instance_id: instance(),
        host_port: "[::1]:0".into(),
        cores: 1,
        log_urls: BTreeMap::new(),
        attributes: BTreeMap::new(),
        resources: Default::default(),
        held: Vec::new(),
        connection: None,
    });
    golden(
        &value,
        json!({
            "type": "RegisterExecutor",
            "executor_id": "e_2",
            "instance_id": INSTANCE,
            "host_port": "[::1]:0",
            "cores": 1,
            "log_urls": {},
            "attributes": {}
        }),
    );
    // log_urls and attributes may be left out.
    decodes_to(
        json!({
            "type": "RegisterExecutor",
            "executor_id": "e_2",
            "instance_id": INSTANCE,
            "host_port": "[::1]:0",
            "cores": 1
        }),
        &value,
    );
}

#[test]
fn registered_executor() {
    golden(
        &RegisterReply::RegisteredExecutor {
            executor_id: exec("exec-1"),
            driver_instance: driver_instance(),
            term: 0,
            adopted: Vec::new(),
        },
        json!({
            "type": "RegisteredExecutor",
            "executor_id": "exec-1",
            "driver_instance": DRIVER
        }),
    );
}

/// An executor registering again with a new leader says what it holds of the driver before,
/// each attempt with that driver's term; the leader answers with its own term and what it
/// adopted, each under its new number.
#[test]
fn registration_with_held_attempts_and_their_adoption() {
    let request = RegisterRequest::RegisterExecutor(RegisterExecutor {
        executor_id: exec("e_2"),
        instance_id: instance(),
        host_port: "[::1]:0".into(),
        cores: 1,
        log_urls: BTreeMap::new(),
        attributes: BTreeMap::new(),
        resources: Default::default(),
        held: vec![
            RunningAttempt {
                task_id: 41,
                attempt: 0,
                term: 5,
                ended: false,
            },
            RunningAttempt {
                task_id: 42,
                attempt: 2,
                term: 0,
                ended: true,
            },
        ],
        connection: None,
    });
    golden(
        &request,
        json!({
            "type": "RegisterExecutor",
            "executor_id": "e_2",
            "instance_id": INSTANCE,
            "host_port": "[::1]:0",
            "cores": 1,
            "log_urls": {},
            "attributes": {},
            "held": [
                {"task_id": 41, "attempt": 0, "term": 5},
                {"task_id": 42, "attempt": 2, "ended": true}
            ]
        }),
    );
    golden(
        &RegisterReply::RegisteredExecutor {
            executor_id: exec("e_2"),
            driver_instance: driver_instance(),
            term: 9,
            adopted: vec![Adopted {
                task_id: 41,
                attempt: 0,
                term: 5,
                new_attempt: 1,
            }],
        },
        json!({
            "type": "RegisteredExecutor",
            "executor_id": "e_2",
            "driver_instance": DRIVER,
            "term": 9,
            "adopted": [{"task_id": 41, "attempt": 0, "term": 5, "new_attempt": 1}]
        }),
    );
}

#[test]
fn register_executor_failed() {
    golden(
        &RegisterReply::RegisterExecutorFailed {
            message: "Duplicate executor ID: exec-1".into(),
        },
        json!({
            "type": "RegisterExecutorFailed",
            "message": "Duplicate executor ID: exec-1"
        }),
    );
}

// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

#[test]
fn event_executor_added() {
    let event = Event::ExecutorAdded {
        time_ms: 1_700_000_000_000,
        executor_id: exec("exec-1"),
        info: ExecutorInfo {
            host: "worker-3".into(),
            host_port: "worker-3:7078".into(),
            total_cores: 8,
            log_urls: map(&[("stderr", "http://worker-3/logs/stderr")]),
            attributes: map(&[("rack", "r1")]),
            resources: Default::default(),
        },
    };
    assert_eq!(event.kind(), "executor.added");
    golden(
        &event,
        json!({
            "type": "ExecutorAdded",
            "time_ms": 1_700_000_000_000u64,
            "executor_id": "exec-1",
            "info": {
                "host": "worker-3",
                "host_port": "worker-3:7078",
                "total_cores": 8,
                "log_urls": {"stderr": "http://worker-3/logs/stderr"},
                "attributes": {"rack": "r1"}
            }
        }),
    );
}

#[test]
fn executor_info() {
    golden(
        &ExecutorInfo {
            host: "::1".into(),
            host_port: "[::1]:7078".into(),
            total_cores: 2,
            log_urls: BTreeMap::new(),
            attributes: BTreeMap::new(),
            resources: Default::default(),
        },
        json!({
            "host": "::1",
            "host_port": "[::1]:7078",
            "total_cores": 2,
            "log_urls": {},
            "attributes": {}
        }),
    );
}

#[test]
fn event_executor_removed() {
    let event = Event::ExecutorRemoved {
        time_ms: 1_700_000_000_500,
        executor_id: exec("exec-1"),
        reason: "heartbeat timed out".into(),
    };
    assert_eq!(event.kind(), "executor.removed");
    golden(
        &event,
        json!({
            "type": "ExecutorRemoved",
            "time_ms": 1_700_000_000_500u64,
            "executor_id": "exec-1",
            "reason": "heartbeat timed out"
        }),
    );
}

#[test]
fn event_job_start() {
    let event = Event::JobStart {
        time_ms: 1000,
        job_id: 7,
        name: "pi".into(),
        tasks: 100,
    };
    assert_eq!(event.kind(), "job.start");
    golden(
        &event,
        json!({"type": "JobStart", "time_ms": 1000, "job_id": 7, "name": "pi", "tasks": 100}),
    );
}

fn task_started() -> TaskStarted {
    TaskStarted {
        task_id: 42,
        index: 3,
        attempt: 0,
    }
}

fn on<T>(id: &str, tasks: Vec<T>) -> ExecutorTasks<T> {
    ExecutorTasks {
        executor_id: exec(id),
        tasks,
    }
}

#[test]
fn task_started_shape() {
    golden(&task_started(), json!([42, 3, 0]));
    // Written out in full, it reads the same.
    decodes_to(
        json!({"task_id": 42, "index": 3, "attempt": 0}),
        &task_started(),
    );
    let expected = "a started attempt: [task_id, index, attempt]";
    for (entry, needles) in [
        ("[42,3]", vec!["invalid length 2", expected]),
        ("[42,3,0,0]", vec!["invalid length 4", expected]),
        (
            "[42,-3,0]",
            vec!["invalid value: integer `-3`", "expected u32"],
        ),
        ("42", vec!["invalid type: integer `42`", expected]),
        (
            r#"{"task_id":42,"index":3}"#,
            vec!["missing field `attempt`"],
        ),
    ] {
        json_error::<TaskStarted>(entry.as_bytes(), &needles);
    }
}

#[test]
fn event_task_start() {
    let event = Event::TaskStart {
        time_ms: 2000,
        job_id: 7,
        executors: vec![
            on(
                "exec-1",
                vec![
                    task_started(),
                    TaskStarted {
                        task_id: 44,
                        index: 5,
                        attempt: 0,
                    },
                ],
            ),
            on(
                "exec-2",
                vec![TaskStarted {
                    task_id: 43,
                    index: 4,
                    attempt: 1,
                }],
            ),
        ],
        term: 0,
    };
    assert_eq!(event.kind(), "task.start");
    golden(
        &event,
        json!({
            "type": "TaskStart",
            "time_ms": 2000,
            "job_id": 7,
            "executors": [
                {
                    "executor_id": "exec-1",
                    "tasks": [[42, 3, 0], [44, 5, 0]]
                },
                {
                    "executor_id": "exec-2",
                    "tasks": [[43, 4, 1]]
                }
            ]
        }),
    );
    // Each attempt with the executor it was launched on, in the event's order.
    let started: Vec<_> = event
        .started()
        .map(|(executor, t)| (executor.as_str(), t.task_id))
        .collect();
    assert_eq!(started, [("exec-1", 42), ("exec-1", 44), ("exec-2", 43)]);
    assert_eq!(event.task_count(), 3);
    assert_eq!(event.ended().count(), 0);
}

/// A journaled leader's task events say its term, which with a task id and attempt names one
/// run; a `TaskEnd` and a `TasksEnded` record the same.
#[test]
fn task_events_and_records_of_a_term() {
    golden(
        &Event::TaskStart {
            time_ms: 2000,
            job_id: 7,
            executors: vec![on("exec-1", vec![task_started()])],
            term: 12,
        },
        json!({
            "type": "TaskStart",
            "time_ms": 2000,
            "job_id": 7,
            "executors": [{"executor_id": "exec-1", "tasks": [[42, 3, 0]]}],
            "term": 12
        }),
    );
    golden(
        &Event::TaskEnd {
            time_ms: 3000,
            job_id: 7,
            executors: vec![on("exec-1", vec![task_ended_ok()])],
            term: 12,
        },
        json!({
            "type": "TaskEnd",
            "time_ms": 3000,
            "job_id": 7,
            "executors": [{"executor_id": "exec-1", "tasks": [[42, 3, 0, 15]]}],
            "term": 12
        }),
    );
    golden(
        &JournalRecord::TasksEnded {
            time_ms: 1,
            tasks: vec![JournaledTask {
                task_id: 42,
                attempt: 0,
                executor_id: exec("exec-1"),
                state: TaskState::Finished,
                result: None,
                error: None,
                in_bucket: false,
                result_object: None,
                objects: Vec::new(),
            }],
            term: 12,
        },
        json!({"type": "TasksEnded", "time_ms": 1, "tasks": [[42, 0, "exec-1"]], "term": 12}),
    );
}

fn task_ended_ok() -> TaskEnded {
    TaskEnded {
        task_id: 42,
        index: 3,
        attempt: 0,
        state: TaskState::Finished,
        duration_ms: 15,
        error: None,
    }
}

fn task_ended_failed() -> TaskEnded {
    TaskEnded {
        task_id: 43,
        index: 4,
        attempt: 1,
        state: TaskState::Failed,
        duration_ms: 2,
        error: Some("boom".into()),
    }
}

#[test]
fn task_ended_shape() {
    // A plain finish is [task_id, index, attempt, duration_ms]; anything else an object, without
    // `error` when there is none.
    golden(&task_ended_ok(), json!([42, 3, 0, 15]));
    decodes_to(
        json!({
            "task_id": 42,
            "index": 3,
            "attempt": 0,
            "state": "FINISHED",
            "duration_ms": 15
        }),
        &task_ended_ok(),
    );
    let killed = TaskEnded {
        state: TaskState::Killed,
        error: None,
        ..task_ended_ok()
    };
    golden(
        &killed,
        json!({"task_id": 42, "index": 3, "attempt": 0, "state": "KILLED", "duration_ms": 15}),
    );
    let finished_with_error = TaskEnded {
        error: Some("late".into()),
        ..task_ended_ok()
    };
    golden(
        &finished_with_error,
        json!({
            "task_id": 42,
            "index": 3,
            "attempt": 0,
            "state": "FINISHED",
            "duration_ms": 15,
            "error": "late"
        }),
    );
    golden(
        &task_ended_failed(),
        json!({
            "task_id": 43,
            "index": 4,
            "attempt": 1,
            "state": "FAILED",
            "duration_ms": 2,
            "error": "boom"
        }),
    );
    // An explicit null error reads as none.
    decodes_to(
        json!({
            "task_id": 42,
            "index": 3,
            "attempt": 0,
            "state": "FINISHED",
            "duration_ms": 15,
            "error": null
        }),
        &task_ended_ok(),
    );
    let expected =
        "an ended attempt: an object, or [task_id, index, attempt, duration_ms] for a plain finish";
    for (entry, needles) in [
        ("[42,3,0]", vec!["invalid length 3", expected]),
        ("[42,3,0,15,\"FAILED\"]", vec!["invalid length 5", expected]),
        (
            "[42,3,0,-1]",
            vec!["invalid value: integer `-1`", "expected u64"],
        ),
        ("null", vec!["invalid type: null", expected]),
        (
            r#"{"task_id":42,"index":3,"attempt":0,"duration_ms":1}"#,
            vec!["missing field `state`"],
        ),
    ] {
        json_error::<TaskEnded>(entry.as_bytes(), &needles);
    }
}

#[test]
fn event_task_end() {
    let event = Event::TaskEnd {
        time_ms: 3000,
        job_id: 7,
        executors: vec![
            on("exec-1", vec![task_ended_ok()]),
            on("exec-2", vec![task_ended_failed()]),
        ],
        term: 0,
    };
    assert_eq!(event.kind(), "task.end");
    golden(
        &event,
        json!({
            "type": "TaskEnd",
            "time_ms": 3000,
            "job_id": 7,
            "executors": [
                {
                    "executor_id": "exec-1",
                    "tasks": [[42, 3, 0, 15]]
                },
                {
                    "executor_id": "exec-2",
                    "tasks": [
                        {
                            "task_id": 43,
                            "index": 4,
                            "attempt": 1,
                            "state": "FAILED",
                            "duration_ms": 2,
                            "error": "boom"
                        }
                    ]
                }
            ]
        }),
    );
    let ended: Vec<_> = event
        .ended()
        .map(|(executor, t)| (executor.as_str(), t.task_id, t.state))
        .collect();
    assert_eq!(
        ended,
        [
            ("exec-1", 42, TaskState::Finished),
            ("exec-2", 43, TaskState::Failed)
        ]
    );
    assert_eq!(event.task_count(), 2);
    assert_eq!(event.started().count(), 0);
}

/// `count` attempts from task 42 (index 3) on: consecutive ids and indices, attempt `attempt`.
fn run_started(count: u64, attempt: u32) -> Vec<TaskStarted> {
    (0..count)
        .map(|n| TaskStarted {
            task_id: 42 + n,
            index: 3 + n as u32,
            attempt,
        })
        .collect()
}

/// Plain finishes of consecutive tasks from task 42 (index 3) on, one per duration.
fn run_ended(durations: &[u64]) -> Vec<TaskEnded> {
    durations
        .iter()
        .zip(0..)
        .map(|(&duration_ms, n)| TaskEnded {
            task_id: 42 + n,
            index: 3 + n as u32,
            attempt: 0,
            state: TaskState::Finished,
            duration_ms,
            error: None,
        })
        .collect()
}

#[test]
fn event_task_start_writes_runs_of_consecutive_attempts() {
    let mut tasks = run_started(3, 0);
    // A gap in the ids, then an attempt of another number: each ends the run before it.
    tasks.push(TaskStarted {
        task_id: 50,
        index: 11,
        attempt: 0,
    });
    tasks.push(TaskStarted {
        task_id: 51,
        index: 12,
        attempt: 1,
    });
    let event = Event::TaskStart {
        time_ms: 2000,
        job_id: 7,
        executors: vec![on("exec-1", tasks)],
        term: 0,
    };
    golden(
        &event,
        json!({
            "type": "TaskStart",
            "time_ms": 2000,
            "job_id": 7,
            "executors": [{"executor_id": "exec-1", "tasks": [[42, 3, 0, 3], [50, 11, 0], [51, 12, 1]]}]
        }),
    );
    assert_eq!(event.task_count(), 5);
}

#[test]
fn event_task_end_writes_runs_of_plain_finishes() {
    let mut tasks = run_ended(&[15, 9, 0]);
    tasks.insert(2, task_ended_failed());
    // The failure between them cuts the run in two: [42, 43], then 43's failed retry, then 44.
    let event = Event::TaskEnd {
        time_ms: 3000,
        job_id: 7,
        executors: vec![on("exec-1", tasks.clone())],
        term: 0,
    };
    golden(
        &event,
        json!({
            "type": "TaskEnd",
            "time_ms": 3000,
            "job_id": 7,
            "executors": [{"executor_id": "exec-1", "tasks": [
                [42, 3, 0, [15, 9]],
                {"task_id": 43, "index": 4, "attempt": 1, "state": "FAILED", "duration_ms": 2, "error": "boom"},
                [44, 5, 0, 0]
            ]}]
        }),
    );
    let ended: Vec<_> = event.ended().map(|(_, t)| t.clone()).collect();
    assert_eq!(ended, tasks);
}

#[test]
fn runs_in_task_events_that_cannot_be_are_refused() {
    let event = |tasks: &str| {
        format!(
            r#"{{"type":"TaskEnd","time_ms":1,"job_id":7,"executors":[{{"executor_id":"e","tasks":[{tasks}]}}]}}"#
        )
    };
    let start = |tasks: &str| event(tasks).replace("TaskEnd", "TaskStart");
    let short = "a run of fewer than two attempts";
    let past = "past the largest task id or index";
    for (payload, needle) in [
        (event("[42,3,0,[5]]"), short),
        (event("[42,3,0,[]]"), short),
        (start("[42,3,0,1]"), short),
        (start("[42,3,0,0]"), short),
        (event("[18446744073709551615,3,0,[1,2]]"), past),
        (start("[42,4294967295,0,2]"), past),
        (start("[42,3,0,2000000]"), "more than 1048576 attempts"),
        (event("[42,3,0,[1,-2]]"), "invalid value: integer `-2`"),
        (
            event(r#"[42,3,0,"7"]"#),
            "a duration in ms, or a list of them",
        ),
    ] {
        json_error::<Event>(payload.as_bytes(), &[needle]);
    }
}

/// A `TaskEnd` of job 7 with `sizes[i]` attempts on executor `exec-<i>`, task ids counting up
/// from 1 across the executors.
fn task_end_of(sizes: &[usize]) -> Event {
    let mut next = 0;
    let executors = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let tasks = (0..size)
                .map(|_| {
                    next += 1;
                    TaskEnded {
                        task_id: next,
                        index: next as u32 - 1,
                        attempt: 0,
                        state: TaskState::Finished,
                        duration_ms: 1,
                        error: None,
                    }
                })
                .collect();
            on(&format!("exec-{i}"), tasks)
        })
        .collect();
    Event::TaskEnd {
        time_ms: 3000,
        job_id: 7,
        executors,
        term: 0,
    }
}

/// `event` as (executor, task id) pairs.
fn pairs(event: &Event) -> Vec<(String, u64)> {
    let started = event.started().map(|(e, t)| (e.to_string(), t.task_id));
    let ended = event.ended().map(|(e, t)| (e.to_string(), t.task_id));
    started.chain(ended).collect()
}

/// `event` cut in halves, as the driver does, until each part encodes to at most `limit` bytes.
fn fit(event: Event, limit: usize) -> Vec<Event> {
    let mut parts = vec![event];
    let mut fitted = Vec::new();
    while let Some(part) = parts.pop() {
        if encode(&part).len() <= limit {
            fitted.push(part);
            continue;
        }
        match part.split() {
            Ok((first, second)) => parts.extend([second, first]),
            Err(part) => panic!("cannot split {part:?}"),
        }
    }
    fitted
}

#[test]
fn task_event_split_cuts_the_attempts_in_half() {
    // Nine attempts: the first half takes four, all on exec-0, which the second names again.
    let (first, second) = task_end_of(&[5, 3, 1]).split().unwrap();
    let ids = |event: &Event| -> Vec<(String, Vec<u64>)> {
        let Event::TaskEnd { executors, .. } = event else {
            panic!("not a TaskEnd: {event:?}");
        };
        executors
            .iter()
            .map(|g| {
                let ids = g.tasks.iter().map(|t| t.task_id).collect();
                (g.executor_id.to_string(), ids)
            })
            .collect()
    };
    assert_eq!(ids(&first), [("exec-0".to_string(), vec![1, 2, 3, 4])]);
    assert_eq!(
        ids(&second),
        [
            ("exec-0".to_string(), vec![5]),
            ("exec-1".to_string(), vec![6, 7, 8]),
            ("exec-2".to_string(), vec![9]),
        ]
    );
    // A cut between two executors leaves no empty group behind.
    let (first, second) = task_end_of(&[2, 2]).split().unwrap();
    assert_eq!(ids(&first), [("exec-0".to_string(), vec![1, 2])]);
    assert_eq!(ids(&second), [("exec-1".to_string(), vec![3, 4])]);
    // One attempt cannot be cut; the event comes back whole.
    let single = task_end_of(&[1]);
    assert_eq!(single.clone().split().unwrap_err(), single);
    // Nor can an event that is not a task event.
    let job_start = Event::JobStart {
        time_ms: 1,
        job_id: 7,
        name: String::new(),
        tasks: 1,
    };
    assert_eq!(job_start.clone().split().unwrap_err(), job_start);
}

#[test]
fn an_oversize_task_event_splits_into_parts_that_keep_every_attempt_once_in_order() {
    for sizes in [
        vec![64, 64],
        vec![1, 1, 1, 1, 1, 1, 1],
        vec![100],
        vec![3, 50, 1, 20],
    ] {
        let whole = task_end_of(&sizes);
        let one = encode(&task_end_of(&[1])).len();
        let entry = encode(&task_end_of(&[2])).len() - one;
        // Room for about three attempts a part.
        let limit = one + 2 * entry;
        let parts = fit(whole.clone(), limit);
        assert!(parts.len() > 1, "{sizes:?}: not split");
        let mut rejoined = Vec::new();
        for part in &parts {
            assert!(
                encode(part).len() <= limit,
                "{sizes:?}: a part over the limit"
            );
            let Event::TaskEnd {
                time_ms,
                job_id,
                executors,
                ..
            } = part
            else {
                panic!("{sizes:?}: a part that is not a TaskEnd");
            };
            assert_eq!((*time_ms, *job_id), (3000, 7));
            let named: BTreeSet<_> = executors.iter().map(|g| &g.executor_id).collect();
            assert_eq!(named.len(), executors.len(), "{sizes:?}: an executor twice");
            assert!(executors.iter().all(|g| !g.tasks.is_empty()), "{sizes:?}");
            rejoined.extend(pairs(part));
        }
        assert_eq!(rejoined, pairs(&whole), "{sizes:?}");
    }
    // A TaskStart splits the same way.
    let start = Event::TaskStart {
        time_ms: 2000,
        job_id: 7,
        executors: vec![
            on("exec-1", vec![task_started(); 3]),
            on("exec-2", vec![task_started(); 2]),
        ],
        term: 0,
    };
    let (first, second) = start.clone().split().unwrap();
    assert_eq!((first.task_count(), second.task_count()), (2, 3));
    let rejoined: Vec<_> = pairs(&first).into_iter().chain(pairs(&second)).collect();
    assert_eq!(rejoined, pairs(&start));
}

#[test]
fn event_job_end() {
    let succeeded = Event::JobEnd {
        time_ms: 4000,
        job_id: 7,
        state: JobState::Succeeded,
        succeeded: 100,
        failed: 0,
        killed: 0,
        reason: None,
    };
    assert_eq!(succeeded.kind(), "job.end");
    // `reason` is always present, null when there is none.
    golden(
        &succeeded,
        json!({
            "type": "JobEnd",
            "time_ms": 4000,
            "job_id": 7,
            "state": "SUCCEEDED",
            "succeeded": 100,
            "failed": 0,
            "killed": 0,
            "reason": null
        }),
    );
    golden(
        &Event::JobEnd {
            time_ms: 4001,
            job_id: 8,
            state: JobState::Killed,
            succeeded: 1,
            failed: 0,
            killed: 9,
            reason: Some("killed by request".into()),
        },
        json!({
            "type": "JobEnd",
            "time_ms": 4001,
            "job_id": 8,
            "state": "KILLED",
            "succeeded": 1,
            "failed": 0,
            "killed": 9,
            "reason": "killed by request"
        }),
    );
}

// ---------------------------------------------------------------------------------------------
// States
// ---------------------------------------------------------------------------------------------

#[test]
fn task_state_values() {
    let all = [
        (TaskState::Launching, "LAUNCHING", false),
        (TaskState::Running, "RUNNING", false),
        (TaskState::Finished, "FINISHED", true),
        (TaskState::Failed, "FAILED", true),
        (TaskState::Killed, "KILLED", true),
        (TaskState::Lost, "LOST", true),
    ];
    for (state, wire, terminal) in all {
        golden(&state, json!(wire));
        assert_eq!(state.is_terminal(), terminal, "{wire}");
    }
    json_error::<TaskState>(b"\"finished\"", &["unknown variant"]);
    json_error::<TaskState>(b"\"Finished\"", &["unknown variant"]);
}

#[test]
fn job_state_values() {
    let all = [
        (JobState::Running, "RUNNING"),
        (JobState::Succeeded, "SUCCEEDED"),
        (JobState::Failed, "FAILED"),
        (JobState::Killed, "KILLED"),
    ];
    for (state, wire) in all {
        golden(&state, json!(wire));
    }
    json_error::<JobState>(b"\"LOST\"", &["unknown variant"]);
}

// ---------------------------------------------------------------------------------------------
// Task specs and jobs
// ---------------------------------------------------------------------------------------------

#[test]
fn task_spec_handler() {
    golden(
        &TaskSpec::Handler {
            name: "sleep".into(),
            arg: json!({"ms": 250}),
        },
        json!({"kind": "handler", "name": "sleep", "arg": {"ms": 250}}),
    );
    // A missing arg is null, and null is written out.
    let noop = TaskSpec::Handler {
        name: "noop".into(),
        arg: Value::Null,
    };
    golden(
        &noop,
        json!({"kind": "handler", "name": "noop", "arg": null}),
    );
    decodes_to(json!({"kind": "handler", "name": "noop"}), &noop);
}

#[test]
fn task_spec_command() {
    golden(
        &TaskSpec::Command {
            argv: vec!["sh".into(), "-c".into(), "echo $EMBER_TASK_INDEX".into()],
            env: map(&[("LANG", "C")]),
            cwd: Some("/tmp".into()),
            timeout_ms: Some(60_000),
            inputs: Default::default(),
            outputs: Vec::new(),
        },
        json!({
            "kind": "command",
            "argv": ["sh", "-c", "echo $EMBER_TASK_INDEX"],
            "env": {"LANG": "C"},
            "cwd": "/tmp",
            "timeout_ms": 60000
        }),
    );
    // env is always written; cwd and timeout_ms only when set.
    let minimal = TaskSpec::Command {
        argv: vec!["true".into()],
        env: BTreeMap::new(),
        cwd: None,
        timeout_ms: None,
        inputs: Default::default(),
        outputs: Vec::new(),
    };
    golden(
        &minimal,
        json!({"kind": "command", "argv": ["true"], "env": {}}),
    );
    decodes_to(json!({"kind": "command", "argv": ["true"]}), &minimal);
    json_error::<TaskSpec>(br#"{"kind":"shell","argv":["true"]}"#, &["unknown variant"]);
    json_error::<TaskSpec>(br#"{"kind":"command"}"#, &["missing field `argv`"]);
}

#[test]
fn task_spec_python() {
    // pickle.dumps(len) and pickle.dumps(((b"ab",), {})), in base64.
    let function = "gASVFAAAAAAAAACMCGJ1aWx0aW5zlIwDbGVulJOULg==";
    let args = "gASVDAAAAAAAAABDAmFilIWUfZSGlC4=";
    golden(
        &TaskSpec::Python {
            function: function.into(),
            args: args.into(),
            map: true,
            timeout_ms: Some(5_000),
            function_object: None,
            args_object: None,
            objects: Vec::new(),
            upstream: Vec::new(),
            retry_on: Vec::new(),
            no_retry_on: Vec::new(),
        },
        json!({
            "kind": "python",
            "function": function,
            "args": args,
            "map": true,
            "timeout_ms": 5000
        }),
    );
    // map is written only when true, timeout_ms only when set.
    let reading = |upstream: Vec<JobId>| TaskSpec::Python {
        function: function.into(),
        args: args.into(),
        map: false,
        timeout_ms: None,
        function_object: None,
        args_object: None,
        objects: Vec::new(),
        upstream,
        retry_on: Vec::new(),
        no_retry_on: Vec::new(),
    };
    let call = reading(Vec::new());
    golden(
        &call,
        json!({"kind": "python", "function": function, "args": args}),
    );
    decodes_to(
        json!({"kind": "python", "function": function, "args": args, "map": false}),
        &call,
    );
    // A call that reads the results of jobs 4 and 9 (futures in its arguments).
    golden(
        &reading(vec![4, 9]),
        json!({"kind": "python", "function": function, "args": args, "upstream": [4, 9]}),
    );
    // Inside a launch (the fast path reads the spec with serde too).
    let launch = ExecutorMessage::LaunchTasks {
        tasks: vec![TaskDescription {
            task_id: 3,
            job_id: 1,
            index: 0,
            attempt: 0,
            cpus: 1,
            spec: Arc::new(call.clone()),
            resources: Default::default(),
            gang_peers: Vec::new(),
        }],
        driver_instance: None,
    };
    let bytes = encode(&launch);
    assert_eq!(
        decode::<ExecutorMessage>(&bytes, LIMIT).unwrap(),
        launch,
        "a launch of a python task round-trips"
    );
    // Without `function` (or `args`) a spec still reads: either may come as an object
    // instead (`function_object`), and the driver refuses a job with neither at submit.
    let by_reference = decode::<TaskSpec>(
        format!(
            r#"{{"kind":"python","function_object":"{}","args":"{args}"}}"#,
            "ab".repeat(32)
        )
        .as_bytes(),
        LIMIT,
    )
    .expect("a function by reference reads");
    let TaskSpec::Python {
        function,
        function_object,
        ..
    } = &by_reference
    else {
        panic!("{by_reference:?}");
    };
    assert_eq!(
        (
            function.as_str(),
            function_object.as_ref().map(|o| o.as_str().len())
        ),
        ("", Some(64))
    );
    assert_eq!(
        String::from_utf8(encode(&by_reference).to_vec()).unwrap(),
        format!(
            r#"{{"kind":"python","args":"{args}","function_object":"{}"}}"#,
            "ab".repeat(32)
        ),
        "an empty `function` is not written"
    );
    for bad in ["", "abc", "ab!d", "a=bc", "gASV\\n==="] {
        json_error::<TaskSpec>(
            format!(r#"{{"kind":"python","function":"{bad}","args":"{args}"}}"#).as_bytes(),
            &["`function` must be a pickle in base64"],
        );
    }
}

fn full_job() -> SubmitJob {
    SubmitJob {
        name: "nightly".into(),
        repeat: 3,
        max_failures: 2,
        cpus_per_task: 4,
        ..SubmitJob::new(vec![
            TaskSpec::Handler {
                name: "echo".into(),
                arg: json!({"value": [1, 2]}),
            },
            TaskSpec::Command {
                argv: vec!["true".into()],
                env: BTreeMap::new(),
                cwd: None,
                timeout_ms: Some(1000),
                inputs: Default::default(),
                outputs: Vec::new(),
            },
        ])
    }
}

fn full_job_wire() -> Value {
    json!({
        "name": "nightly",
        "tasks": [
            {"kind": "handler", "name": "echo", "arg": {"value": [1, 2]}},
            {"kind": "command", "argv": ["true"], "env": {}, "timeout_ms": 1000}
        ],
        "repeat": 3,
        "max_failures": 2,
        "cpus_per_task": 4
    })
}

fn default_job() -> SubmitJob {
    SubmitJob {
        max_failures: 4,
        ..SubmitJob::new(vec![TaskSpec::Handler {
            name: "noop".into(),
            arg: Value::Null,
        }])
    }
}

#[test]
fn submit_job_in_full() {
    golden(&full_job(), full_job_wire());
}

#[test]
fn submit_job_with_defaults() {
    // name "", repeat 1, max_failures 4, cpus_per_task 1.
    assert_eq!(ember::DEFAULT_MAX_FAILURES, 4);
    decodes_to(
        json!({"tasks": [{"kind": "handler", "name": "noop"}]}),
        &default_job(),
    );
    golden(
        &default_job(),
        json!({
            "name": "",
            "tasks": [{"kind": "handler", "name": "noop", "arg": null}],
            "repeat": 1,
            "max_failures": 4,
            "cpus_per_task": 1
        }),
    );
    json_error::<SubmitJob>(br#"{"name":"x"}"#, &["missing field `tasks`"]);
}

// ---------------------------------------------------------------------------------------------
// The api
// ---------------------------------------------------------------------------------------------

#[test]
fn api_list_executors() {
    golden(
        &ApiRequest::list_executors(),
        json!({"type": "ListExecutors"}),
    );
    golden(
        &ApiRequest::ListExecutors {
            offset: 100,
            limit: Some(0),
        },
        json!({"type": "ListExecutors", "offset": 100, "limit": 0}),
    );
}

#[test]
fn api_submit_job() {
    let mut wire = full_job_wire();
    wire["type"] = json!("SubmitJob");
    golden(&ApiRequest::SubmitJob(full_job()), wire);
    golden(
        &ApiRequest::SubmitJob(default_job()),
        json!({
            "type": "SubmitJob",
            "name": "",
            "tasks": [{"kind": "handler", "name": "noop", "arg": null}],
            "repeat": 1,
            "max_failures": 4,
            "cpus_per_task": 1
        }),
    );
    decodes_to(
        json!({"type": "SubmitJob", "tasks": [{"kind": "handler", "name": "noop"}]}),
        &ApiRequest::SubmitJob(default_job()),
    );
}

#[test]
fn api_kill_job() {
    golden(
        &ApiRequest::KillJob { job_id: 7 },
        json!({"type": "KillJob", "job_id": 7}),
    );
}

#[test]
fn api_kill_job_task() {
    golden(
        &ApiRequest::KillJobTask {
            job_id: 7,
            index: 3,
            retry: false,
        },
        json!({"type": "KillJobTask", "job_id": 7, "index": 3}),
    );
    golden(
        &ApiRequest::KillJobTask {
            job_id: 7,
            index: 3,
            retry: true,
        },
        json!({"type": "KillJobTask", "job_id": 7, "index": 3, "retry": true}),
    );
    json_error::<ApiRequest>(
        br#"{"type": "KillJobTask", "job_id": 7, "index": -1}"#,
        &["invalid value"],
    );
    json_error::<ApiRequest>(br#"{"type": "KillJobTask", "job_id": 7}"#, &["index"]);
}

#[test]
fn api_reply_task_killed() {
    golden(
        &ApiReply::TaskKilled {
            job_id: 7,
            index: 3,
            attempt: Some(1),
            retry: false,
        },
        json!({"type": "TaskKilled", "job_id": 7, "index": 3, "attempt": 1}),
    );
    golden(
        &ApiReply::TaskKilled {
            job_id: 7,
            index: 3,
            attempt: None,
            retry: false,
        },
        json!({"type": "TaskKilled", "job_id": 7, "index": 3}),
    );
    golden(
        &ApiReply::TaskKilled {
            job_id: 7,
            index: 3,
            attempt: Some(0),
            retry: true,
        },
        json!({"type": "TaskKilled", "job_id": 7, "index": 3, "attempt": 0, "retry": true}),
    );
}

#[test]
fn api_list_jobs() {
    golden(&ApiRequest::list_jobs(), json!({"type": "ListJobs"}));
    golden(
        &ApiRequest::ListJobs {
            offset: 5,
            limit: Some(10),
            from_job: 0,
        },
        json!({"type": "ListJobs", "offset": 5, "limit": 10}),
    );
    golden(
        &ApiRequest::ListJobs {
            offset: 0,
            limit: Some(50),
            from_job: 1200,
        },
        json!({"type": "ListJobs", "limit": 50, "from_job": 1200}),
    );
}

#[test]
fn api_get_job() {
    golden(
        &ApiRequest::GetJob { job_id: 7 },
        json!({"type": "GetJob", "job_id": 7}),
    );
}

#[test]
fn api_get_results() {
    golden(
        &ApiRequest::GetResults {
            job_id: 7,
            offset: 2000,
            limit: 500,
        },
        json!({"type": "GetResults", "job_id": 7, "offset": 2000, "limit": 500}),
    );
    // offset defaults to 0 and limit to 1000.
    let defaults = ApiRequest::GetResults {
        job_id: 7,
        offset: 0,
        limit: 1000,
    };
    decodes_to(json!({"type": "GetResults", "job_id": 7}), &defaults);
    golden(
        &defaults,
        json!({"type": "GetResults", "job_id": 7, "offset": 0, "limit": 1000}),
    );
}

/// A result too large for one message: its status, outcome and journal entry name the object
/// that holds it; and the object requests.
#[test]
fn result_objects_and_object_requests() {
    let object = ember::objects::ObjectRef::parse(&"ab".repeat(32)).unwrap();
    let chunks = ResultObject {
        object: object.clone(),
        bytes: 2_500_000,
    };
    golden(
        &StatusUpdate {
            task_id: 42,
            attempt: 0,
            state: TaskState::Finished,
            result: None,
            error: None,
            result_object: Some(chunks.clone()),
            no_retry: false,
        },
        json!({"task_id": 42, "attempt": 0, "state": "FINISHED", "result_object": {"object": "abababababababababababababababababababababababababababababababab", "bytes": 2500000}}),
    );
    golden(
        &TaskOutcome {
            index: 0,
            task_id: 42,
            state: TaskState::Finished,
            attempts: 1,
            executor_id: Some(exec("exec-1")),
            result: None,
            error: None,
            result_object: Some(chunks.clone()),
            started_ms: None,
            duration_ms: None,
        },
        json!({"index": 0, "task_id": 42, "state": "FINISHED", "attempts": 1, "executor_id": "exec-1", "result_object": {"object": "abababababababababababababababababababababababababababababababab", "bytes": 2500000}}),
    );
    golden(
        &ApiRequest::ObjectUses {
            objects: vec![object.clone()],
        },
        json!({"type": "ObjectUses", "objects": [object.as_str()]}),
    );
    golden(
        &ApiReply::ObjectUses {
            uses: vec![ember::protocol::ObjectUse {
                object: object.clone(),
                jobs: vec![7, 9],
                jobs_count: 2,
            }],
        },
        json!({"type": "ObjectUses", "uses": [{"object": object.as_str(), "jobs": [7, 9], "jobs_count": 2}]}),
    );
    golden(
        &ApiRequest::DeleteObject {
            object: object.clone(),
        },
        json!({"type": "DeleteObject", "object": object.as_str()}),
    );
    golden(
        &ApiReply::ObjectDeleted {
            object: object.clone(),
            deleted: true,
        },
        json!({"type": "ObjectDeleted", "object": object.as_str(), "deleted": true}),
    );
    golden(
        &JournaledTask {
            task_id: 104,
            attempt: 0,
            executor_id: exec("exec-1"),
            state: TaskState::Finished,
            result: None,
            error: None,
            in_bucket: false,
            result_object: Some(chunks),
            objects: Vec::new(),
        },
        json!({"task_id": 104, "attempt": 0, "executor_id": "exec-1", "state": "FINISHED", "result_object": {"object": "abababababababababababababababababababababababababababababababab", "bytes": 2500000}}),
    );
}

#[test]
fn api_reply_executors() {
    // What an executor has done with the objects: sent in its heartbeats, summed in the reply.
    let counts = || ember::protocol::ObjectCounts {
        fetches: 2,
        fetched_bytes: 3_000_000,
        host_takes: 1,
        host_taken_bytes: 1_500_000,
        cache_hits: 14,
        cache_misses: 2,
        puts: 1,
        put_bytes: 4096,
    };
    let objects = json!({"fetches": 2, "fetched_bytes": 3_000_000, "host_takes": 1,
        "host_taken_bytes": 1_500_000, "cache_hits": 14, "cache_misses": 2, "puts": 1,
        "put_bytes": 4096});
    golden(
        &ApiReply::Executors(ExecutorsSnapshot {
            executors: vec![ExecutorSummary {
                executor_id: exec("exec-1"),
                host: "worker-3".into(),
                host_port: "worker-3:7078".into(),
                free_cores: 6,
                total_cores: 8,
                log_urls: map(&[("stderr", "http://worker-3/logs/stderr")]),
                attributes: BTreeMap::new(),
                registered_at_ms: 1_700_000_000_000,
                last_seen_ms: 1_700_000_002_000,
                resources: Default::default(),
                exclusions: Vec::new(),
                objects: counts(),
                abandoned: Vec::new(),
            }],
            total_cores: 8,
            registered_executors: 1,
            pending_executors: 2,
            next_offset: Some(1),
            driver: Some(ember::protocol::DriverInfo {
                driver_instance: uuid::Uuid::from_u128(0x1ead),
                epoch: 12,
            }),
            allocation: None,
            start_gate: None,
            objects: counts(),
        }),
        json!({
            "type": "Executors",
            "executors": [{
                "executor_id": "exec-1",
                "host": "worker-3",
                "host_port": "worker-3:7078",
                "free_cores": 6,
                "total_cores": 8,
                "log_urls": {"stderr": "http://worker-3/logs/stderr"},
                "attributes": {},
                "registered_at_ms": 1_700_000_000_000u64,
                "last_seen_ms": 1_700_000_002_000u64,
                "objects": objects
            }],
            "total_cores": 8,
            "registered_executors": 1,
            "pending_executors": 2,
            "next_offset": 1,
            "driver": {"driver_instance": "00000000-0000-0000-0000-000000001ead", "epoch": 12},
            "objects": objects
        }),
    );
    golden(
        &ApiReply::Executors(ExecutorsSnapshot {
            executors: vec![],
            total_cores: 0,
            registered_executors: 0,
            pending_executors: 0,
            next_offset: None,
            driver: None,
            allocation: None,
            start_gate: None,
            objects: Default::default(),
        }),
        json!({
            "type": "Executors",
            "executors": [],
            "total_cores": 0,
            "registered_executors": 0,
            "pending_executors": 0
        }),
    );
}

#[test]
fn api_reply_executors_with_the_start_gate() {
    let with = |gate: StartGateStatus| {
        ApiReply::Executors(ExecutorsSnapshot {
            executors: vec![],
            total_cores: 1,
            registered_executors: 1,
            pending_executors: 1,
            next_offset: None,
            driver: None,
            allocation: None,
            start_gate: Some(gate),
            objects: Default::default(),
        })
    };
    let shut = StartGateStatus {
        min_registered: 2,
        opens_by_ms: 1_700_000_030_000,
        opened_at_ms: None,
        reason: None,
    };
    golden(
        &with(shut.clone()),
        json!({
            "type": "Executors",
            "executors": [],
            "total_cores": 1,
            "registered_executors": 1,
            "pending_executors": 1,
            "start_gate": {"min_registered": 2, "opens_by_ms": 1700000030000u64}
        }),
    );
    golden(
        &with(StartGateStatus {
            opened_at_ms: Some(1_700_000_004_000),
            reason: Some("2 executors registered, of the 2 required".into()),
            ..shut
        }),
        json!({
            "type": "Executors",
            "executors": [],
            "total_cores": 1,
            "registered_executors": 1,
            "pending_executors": 1,
            "start_gate": {
                "min_registered": 2,
                "opens_by_ms": 1700000030000u64,
                "opened_at_ms": 1700000004000u64,
                "reason": "2 executors registered, of the 2 required"
            }
        }),
    );
}

#[test]
fn api_reply_executors_with_the_allocation_signal() {
    golden(
        &ApiReply::Executors(ExecutorsSnapshot {
            executors: vec![],
            total_cores: 4,
            registered_executors: 2,
            pending_executors: 0,
            next_offset: None,
            driver: None,
            start_gate: None,
            objects: Default::default(),
            allocation: Some(ember::protocol::AllocationStatus {
                target_executors: 4,
                min_executors: 1,
                max_executors: 8,
                executors_needed: 50,
                tasks_waiting: 96,
                tasks_running: 4,
                cores_per_executor: 2,
                backlog_since_ms: Some(1_700_000_000_000),
                idle: vec![exec("exec-2")],
                reason: "96 tasks have waited; 2 more asked for (they need 50)".into(),
            }),
        }),
        json!({
            "type": "Executors",
            "executors": [],
            "total_cores": 4,
            "registered_executors": 2,
            "pending_executors": 0,
            "allocation": {
                "target_executors": 4,
                "min_executors": 1,
                "max_executors": 8,
                "executors_needed": 50,
                "tasks_waiting": 96,
                "tasks_running": 4,
                "cores_per_executor": 2,
                "backlog_since_ms": 1_700_000_000_000u64,
                "idle": ["exec-2"],
                "reason": "96 tasks have waited; 2 more asked for (they need 50)"
            }
        }),
    );
}

#[test]
fn api_request_release_executor() {
    golden(
        &ApiRequest::ReleaseExecutor {
            executor_id: exec("exec-2"),
        },
        json!({"type": "ReleaseExecutor", "executor_id": "exec-2"}),
    );
}

#[test]
fn event_executor_target() {
    let event = Event::ExecutorTarget {
        time_ms: 1_700_000_000_000,
        target_executors: 4,
        previous: 2,
        reason: "96 tasks have waited; 2 more asked for (they need 50)".into(),
    };
    assert_eq!(event.kind(), "executor.target");
    golden(
        &event,
        json!({
            "type": "ExecutorTarget",
            "time_ms": 1_700_000_000_000u64,
            "target_executors": 4,
            "previous": 2,
            "reason": "96 tasks have waited; 2 more asked for (they need 50)"
        }),
    );
}

#[test]
fn event_executor_excluded_and_unexcluded() {
    let event = Event::ExecutorExcluded {
        time_ms: 1_700_000_000_000,
        executor_id: exec("exec-1"),
        scope: ExclusionScope::Task,
        job_id: Some(7),
        index: Some(3),
        reason: "task 3 failed once on it".into(),
        until_ms: 1_700_003_600_000,
    };
    assert_eq!(event.kind(), "executor.excluded");
    assert_eq!(event.job_id(), Some(7));
    golden(
        &event,
        json!({
            "type": "ExecutorExcluded",
            "time_ms": 1_700_000_000_000u64,
            "executor_id": "exec-1",
            "scope": "task",
            "job_id": 7,
            "index": 3,
            "reason": "task 3 failed once on it",
            "until_ms": 1_700_003_600_000u64
        }),
    );
    let event = Event::ExecutorExcluded {
        time_ms: 1_700_000_000_000,
        executor_id: exec("exec-1"),
        scope: ExclusionScope::Cluster,
        job_id: None,
        index: None,
        reason: "2 tasks failed on it in jobs that succeeded, within 1h".into(),
        until_ms: 1_700_003_600_000,
    };
    assert_eq!(event.job_id(), None);
    golden(
        &event,
        json!({
            "type": "ExecutorExcluded",
            "time_ms": 1_700_000_000_000u64,
            "executor_id": "exec-1",
            "scope": "cluster",
            "reason": "2 tasks failed on it in jobs that succeeded, within 1h",
            "until_ms": 1_700_003_600_000u64
        }),
    );
    let event = Event::ExecutorUnexcluded {
        time_ms: 1_700_003_600_000,
        executor_id: exec("exec-1"),
        scope: ExclusionScope::Job,
        job_id: Some(7),
        index: None,
        reason: "excluded for 1h (--exclude-timeout), which has passed".into(),
    };
    assert_eq!(event.kind(), "executor.unexcluded");
    golden(
        &event,
        json!({
            "type": "ExecutorUnexcluded",
            "time_ms": 1_700_003_600_000u64,
            "executor_id": "exec-1",
            "scope": "job",
            "job_id": 7,
            "reason": "excluded for 1h (--exclude-timeout), which has passed"
        }),
    );
    let error = json_error::<Event>(
        br#"{"type":"ExecutorExcluded","time_ms":1,"executor_id":"e","scope":"rack","reason":"r","until_ms":2}"#,
        &["rack"],
    );
    assert!(error.contains("task"), "{error}");
}

#[test]
fn executor_summary_with_abandoned_handlers() {
    golden(
        &ExecutorSummary {
            executor_id: exec("exec-1"),
            host: "worker-3".into(),
            host_port: "worker-3:7078".into(),
            free_cores: 0,
            total_cores: 1,
            log_urls: BTreeMap::new(),
            attributes: BTreeMap::new(),
            registered_at_ms: 1_700_000_000_000,
            last_seen_ms: 1_700_000_002_000,
            resources: Default::default(),
            exclusions: Vec::new(),
            objects: Default::default(),
            abandoned: vec![AbandonedStatus {
                task_id: 17,
                attempt: 0,
                cpus: 1,
                since_ms: 1_700_000_001_000,
            }],
        },
        json!({
            "executor_id": "exec-1",
            "host": "worker-3",
            "host_port": "worker-3:7078",
            "free_cores": 0,
            "total_cores": 1,
            "log_urls": {},
            "attributes": {},
            "registered_at_ms": 1_700_000_000_000u64,
            "last_seen_ms": 1_700_000_002_000u64,
            "abandoned": [{"task_id": 17, "attempt": 0, "cpus": 1, "since_ms": 1_700_000_001_000u64}]
        }),
    );
}

#[test]
fn a_heartbeat_lists_abandoned_handlers_and_an_older_one_decodes_without() {
    let beat = |abandoned| HeartbeatRequest::Heartbeat {
        executor_id: exec("exec-1"),
        instance_id: InstanceId::from_u128(1),
        running: Vec::new(),
        driver_instance: None,
        objects: Default::default(),
        connection: None,
        abandoned,
    };
    golden(
        &beat(vec![AbandonedAttempt {
            task_id: 17,
            attempt: 0,
            cpus: 1,
        }]),
        json!({
            "type": "Heartbeat",
            "executor_id": "exec-1",
            "instance_id": "00000000-0000-0000-0000-000000000001",
            "running": [],
            "abandoned": [{"task_id": 17, "attempt": 0, "cpus": 1}]
        }),
    );
    golden(
        &beat(Vec::new()),
        json!({
            "type": "Heartbeat",
            "executor_id": "exec-1",
            "instance_id": "00000000-0000-0000-0000-000000000001",
            "running": []
        }),
    );
}

#[test]
fn executor_summary_with_exclusions() {
    golden(
        &ExecutorSummary {
            executor_id: exec("exec-1"),
            host: "worker-3".into(),
            host_port: "worker-3:7078".into(),
            free_cores: 8,
            total_cores: 8,
            log_urls: BTreeMap::new(),
            attributes: BTreeMap::new(),
            registered_at_ms: 1_700_000_000_000,
            last_seen_ms: 1_700_000_002_000,
            resources: Default::default(),
            exclusions: vec![
                ExclusionStatus {
                    scope: ExclusionScope::Job,
                    job_id: Some(7),
                    index: None,
                    reason: "2 tasks of job 7 failed on it".into(),
                    until_ms: 1_700_003_600_000,
                },
                ExclusionStatus {
                    scope: ExclusionScope::Task,
                    job_id: Some(7),
                    index: Some(3),
                    reason: "task 3 failed once on it".into(),
                    until_ms: 1_700_003_600_000,
                },
            ],
            objects: Default::default(),
            abandoned: Vec::new(),
        },
        json!({
            "executor_id": "exec-1",
            "host": "worker-3",
            "host_port": "worker-3:7078",
            "free_cores": 8,
            "total_cores": 8,
            "log_urls": {},
            "attributes": {},
            "registered_at_ms": 1_700_000_000_000u64,
            "last_seen_ms": 1_700_000_002_000u64,
            "exclusions": [
                {"scope": "job", "job_id": 7, "reason": "2 tasks of job 7 failed on it", "until_ms": 1_700_003_600_000u64},
                {"scope": "task", "job_id": 7, "index": 3, "reason": "task 3 failed once on it", "until_ms": 1_700_003_600_000u64}
            ]
        }),
    );
}

#[test]
fn api_reply_job_accepted() {
    golden(
        &ApiReply::JobAccepted { job_id: 7 },
        json!({"type": "JobAccepted", "job_id": 7}),
    );
}

#[test]
fn api_reply_job_killed() {
    golden(
        &ApiReply::JobKilled { job_id: 7 },
        json!({"type": "JobKilled", "job_id": 7}),
    );
}

fn running_summary() -> JobSummary {
    JobSummary {
        pool: None,
        priority: 0,
        speculative: None,
        job_id: 7,
        name: "nightly".into(),
        state: JobState::Running,
        tasks: 6,
        succeeded: 2,
        failed: 0,
        killed: 0,
        running: 4,
        submitted_at_ms: 1000,
        ended_at_ms: None,
        reason: None,
        waiting: None,
        placement: None,
        waits_for: Vec::new(),
        waits: Vec::new(),
        concurrency_key: None,
        key_limits: None,
    }
}

fn running_summary_wire() -> Value {
    json!({
        "job_id": 7,
        "name": "nightly",
        "state": "RUNNING",
        "tasks": 6,
        "succeeded": 2,
        "failed": 0,
        "killed": 0,
        "running": 4,
        "submitted_at_ms": 1000,
        "ended_at_ms": null,
        "reason": null
    })
}

#[test]
fn api_reply_jobs() {
    let failed = JobSummary {
        pool: None,
        priority: 0,
        speculative: None,
        job_id: 8,
        name: String::new(),
        state: JobState::Failed,
        tasks: 1,
        succeeded: 0,
        failed: 1,
        killed: 0,
        running: 0,
        submitted_at_ms: 2000,
        ended_at_ms: Some(2500),
        reason: Some("task 0 failed 4 times; last error: boom".into()),
        waiting: None,
        placement: None,
        waits_for: Vec::new(),
        waits: Vec::new(),
        concurrency_key: None,
        key_limits: None,
    };
    golden(
        &ApiReply::Jobs {
            jobs: vec![running_summary(), failed],
            next_offset: Some(2),
            next_job: Some(9),
        },
        json!({
            "type": "Jobs",
            "jobs": [
                running_summary_wire(),
                {
                    "job_id": 8,
                    "name": "",
                    "state": "FAILED",
                    "tasks": 1,
                    "succeeded": 0,
                    "failed": 1,
                    "killed": 0,
                    "running": 0,
                    "submitted_at_ms": 2000,
                    "ended_at_ms": 2500,
                    "reason": "task 0 failed 4 times; last error: boom"
                }
            ],
            "next_offset": 2,
            "next_job": 9
        }),
    );
    golden(
        &ApiReply::Jobs {
            jobs: vec![],
            next_offset: None,
            next_job: None,
        },
        json!({"type": "Jobs", "jobs": []}),
    );
}

#[test]
fn api_reply_job() {
    golden(
        &ApiReply::Job {
            job: running_summary(),
        },
        json!({"type": "Job", "job": running_summary_wire()}),
    );
}

#[test]
fn api_reply_results() {
    let page = ResultsPage {
        job_id: 7,
        results: vec![
            TaskOutcome {
                index: 0,
                task_id: 40,
                state: TaskState::Finished,
                attempts: 1,
                executor_id: Some(exec("exec-1")),
                result: Some(json!({"exit_code": 0, "stdout": "0\n", "stderr": ""})),
                error: None,
                result_object: None,
                started_ms: Some(1_700_000_000_000),
                duration_ms: Some(120),
            },
            TaskOutcome {
                index: 1,
                task_id: 41,
                state: TaskState::Failed,
                attempts: 4,
                executor_id: Some(exec("exec-2")),
                result: None,
                error: Some("boom".into()),
                result_object: None,
                started_ms: None,
                duration_ms: None,
            },
            TaskOutcome {
                index: 2,
                task_id: 42,
                state: TaskState::Launching,
                attempts: 0,
                executor_id: None,
                result: None,
                error: None,
                result_object: None,
                started_ms: None,
                duration_ms: None,
            },
        ],
        next_offset: Some(3),
    };
    golden(
        &ApiReply::Results(page),
        json!({
            "type": "Results",
            "job_id": 7,
            "results": [
                {
                    "index": 0,
                    "task_id": 40,
                    "state": "FINISHED",
                    "attempts": 1,
                    "executor_id": "exec-1",
                    "result": {"exit_code": 0, "stdout": "0\n", "stderr": ""},
                    "started_ms": 1_700_000_000_000u64,
                    "duration_ms": 120
                },
                {
                    "index": 1,
                    "task_id": 41,
                    "state": "FAILED",
                    "attempts": 4,
                    "executor_id": "exec-2",
                    "error": "boom"
                },
                {
                    "index": 2,
                    "task_id": 42,
                    "state": "LAUNCHING",
                    "attempts": 0,
                    "executor_id": null
                }
            ],
            "next_offset": 3
        }),
    );
    golden(
        &ApiReply::Results(ResultsPage {
            job_id: 7,
            results: vec![],
            next_offset: None,
        }),
        json!({"type": "Results", "job_id": 7, "results": [], "next_offset": null}),
    );
}

#[test]
fn api_reply_error() {
    golden(
        &ApiReply::Error {
            message: "no job with id 99".into(),
        },
        json!({"type": "Error", "message": "no job with id 99"}),
    );
}

// ---------------------------------------------------------------------------------------------
// The executor's inbox
// ---------------------------------------------------------------------------------------------

#[test]
fn executor_launch_tasks() {
    let echo = Arc::new(TaskSpec::Handler {
        name: "echo".into(),
        arg: json!({"value": "hi"}),
    });
    let message = ExecutorMessage::LaunchTasks {
        tasks: vec![
            launched(42, 7, 3, 0, &echo),
            launched(44, 7, 5, 0, &echo),
            launched(40, 7, 1, 2, &echo),
            TaskDescription {
                task_id: 43,
                job_id: 9,
                index: 0,
                attempt: 0,
                cpus: 2,
                spec: Arc::new(TaskSpec::Command {
                    argv: vec!["./work.sh".into()],
                    env: map(&[("MODE", "fast")]),
                    cwd: Some("/srv".into()),
                    timeout_ms: None,
                    inputs: Default::default(),
                    outputs: Vec::new(),
                }),
                resources: Default::default(),
                gang_peers: Vec::new(),
            },
        ],
        driver_instance: Some(driver_instance()),
    };
    fast_reads(&message);
    golden(
        &message,
        json!({
            "type": "LaunchTasks",
            "driver_instance": DRIVER,
            "tasks": [
                {
                    "job_id": 7,
                    "cpus": 1,
                    "spec": {"kind": "handler", "name": "echo", "arg": {"value": "hi"}},
                    "tasks": [[42, 3, 0], [44, 5, 0], [40, 1, 2]]
                },
                {
                    "job_id": 9,
                    "cpus": 2,
                    "spec": {
                        "kind": "command",
                        "argv": ["./work.sh"],
                        "env": {"MODE": "fast"},
                        "cwd": "/srv"
                    },
                    "tasks": [[43, 0, 0]]
                }
            ]
        }),
    );
}

fn noop() -> Arc<TaskSpec> {
    Arc::new(TaskSpec::Handler {
        name: "noop".into(),
        arg: Value::Null,
    })
}

/// Attempt `attempt` of task `task_id`, index `index` of job `job_id`, on one core.
fn launched(
    task_id: u64,
    job_id: u64,
    index: u32,
    attempt: u32,
    spec: &Arc<TaskSpec>,
) -> TaskDescription {
    TaskDescription {
        task_id,
        job_id,
        index,
        attempt,
        cpus: 1,
        spec: Arc::clone(spec),
        resources: Default::default(),
        gang_peers: Vec::new(),
    }
}

fn launch(tasks: Vec<TaskDescription>) -> ExecutorMessage {
    ExecutorMessage::LaunchTasks {
        tasks,
        driver_instance: None,
    }
}

/// One group of `LaunchTasks.tasks` or `StatusAck.launch`, of a one-core job.
fn group(job_id: u64, spec: Value, tasks: Value) -> Value {
    json!({"job_id": job_id, "cpus": 1, "spec": spec, "tasks": tasks})
}

fn noop_wire() -> Value {
    json!({"kind": "handler", "name": "noop", "arg": null})
}

#[test]
fn launch_groups_keep_the_order_of_interleaved_jobs() {
    let sleep = Arc::new(TaskSpec::Handler {
        name: "sleep".into(),
        arg: json!({"ms": 5}),
    });
    let noop = noop();
    golden(
        &launch(vec![
            launched(10, 1, 0, 0, &noop),
            launched(11, 1, 1, 0, &noop),
            launched(20, 2, 0, 0, &sleep),
            launched(12, 1, 2, 0, &noop),
        ]),
        json!({
            "type": "LaunchTasks",
            "tasks": [
                group(1, noop_wire(), json!([[10, 0, 0], [11, 1, 0]])),
                group(
                    2,
                    json!({"kind": "handler", "name": "sleep", "arg": {"ms": 5}}),
                    json!([[20, 0, 0]])
                ),
                group(1, noop_wire(), json!([[12, 2, 0]])),
            ]
        }),
    );
}

#[test]
fn launch_groups_part_a_job_by_spec_and_cores() {
    // A job of two specs runs them by turns (index 0, 2, 4.. the first; 1, 3.. the second).
    let (noop, command) = (
        noop(),
        Arc::new(TaskSpec::Command {
            argv: vec!["true".into()],
            env: BTreeMap::new(),
            cwd: None,
            timeout_ms: None,
            inputs: Default::default(),
            outputs: Vec::new(),
        }),
    );
    let two_cores = TaskDescription {
        cpus: 2,
        ..launched(36, 3, 6, 0, &noop)
    };
    golden(
        &launch(vec![
            launched(30, 3, 0, 0, &noop),
            launched(31, 3, 1, 0, &command),
            launched(32, 3, 2, 0, &noop),
            launched(34, 3, 4, 3, &noop),
            two_cores,
        ]),
        json!({
            "type": "LaunchTasks",
            "tasks": [
                group(3, noop_wire(), json!([[30, 0, 0]])),
                group(3, json!({"kind": "command", "argv": ["true"], "env": {}}), json!([[31, 1, 0]])),
                group(3, noop_wire(), json!([[32, 2, 0], [34, 4, 3]])),
                {"job_id": 3, "cpus": 2, "spec": noop_wire(), "tasks": [[36, 6, 0]]},
            ]
        }),
    );
}

#[test]
fn launch_groups_join_equal_specs_held_apart() {
    let tasks = vec![launched(1, 1, 0, 0, &noop()), launched(2, 1, 1, 0, &noop())];
    assert!(!Arc::ptr_eq(&tasks[0].spec, &tasks[1].spec));
    golden(
        &launch(tasks),
        json!({
            "type": "LaunchTasks",
            "tasks": [group(1, noop_wire(), json!([[1, 0, 0], [2, 1, 0]]))]
        }),
    );
}

/// The tasks `wire` decodes to, as a `LaunchTasks` and as the `launch` of a `StatusAck`.
fn decoded_both_ways(groups: Value) -> [Vec<TaskDescription>; 2] {
    let message = json!({"type": "LaunchTasks", "tasks": groups});
    let ack = json!({"type": "StatusAck", "accepted": 0, "refused": [], "launch": groups});
    let launched = match decode(&serde_json::to_vec(&message).unwrap(), LIMIT) {
        Ok(ExecutorMessage::LaunchTasks { tasks, .. }) => tasks,
        other => panic!("expected LaunchTasks, got {other:?}"),
    };
    let acked = match decode(&serde_json::to_vec(&ack).unwrap(), LIMIT) {
        Ok(StatusReply::StatusAck { launch, .. }) => launch,
        other => panic!("expected StatusAck, got {other:?}"),
    };
    [launched, acked]
}

#[test]
fn tasks_decoded_from_one_group_share_its_spec() {
    let groups = json!([
        group(
            1,
            json!({"kind": "handler", "name": "noop"}),
            json!([[1, 0, 0], [2, 1, 0], [3, 2, 1]])
        ),
        group(
            1,
            json!({"kind": "handler", "name": "noop"}),
            json!([[4, 3, 0]])
        ),
    ]);
    for tasks in decoded_both_ways(groups) {
        let noop = noop();
        assert_eq!(
            tasks,
            [
                launched(1, 1, 0, 0, &noop),
                launched(2, 1, 1, 0, &noop),
                launched(3, 1, 2, 1, &noop),
                launched(4, 1, 3, 0, &noop),
            ]
        );
        assert!(Arc::ptr_eq(&tasks[0].spec, &tasks[1].spec));
        assert!(Arc::ptr_eq(&tasks[0].spec, &tasks[2].spec));
    }
}

#[test]
fn a_launch_carries_its_job_spec_once() {
    let noop = noop();
    let ack = StatusReply::StatusAck {
        accepted: 64,
        refused: vec![],
        launch: (0..64)
            .map(|i| launched(100_001 + i, 2, 100_000 + i as u32, 0, &noop))
            .collect(),
    };
    let encoded = encode(&ack);
    let text = std::str::from_utf8(&encoded).unwrap();
    assert_eq!(text.matches("noop").count(), 1, "{text}");
    // 64 tasks of [6-digit id, 6-digit index, attempt]: 18 bytes each, and one group around them.
    assert!(
        encoded.len() <= 64 * 18 + 150,
        "{} bytes: {text}",
        encoded.len()
    );
}

/// The driver refuses a job whose spec leaves less than 1024 bytes of a message's room: that
/// must be enough for everything else in a launch of one task, whatever its numbers.
#[test]
fn a_one_task_launch_is_its_spec_and_little_more() {
    let spec = Arc::new(TaskSpec::Handler {
        name: "x".repeat(10_000),
        arg: Value::Null,
    });
    let task = TaskDescription {
        task_id: u64::MAX,
        job_id: u64::MAX,
        index: u32::MAX,
        attempt: u32::MAX,
        cpus: u32::MAX,
        spec: Arc::clone(&spec),
        resources: Default::default(),
        gang_peers: Vec::new(),
    };
    let spec_bytes = encode(&*spec).len();
    let launch = ExecutorMessage::LaunchTasks {
        tasks: vec![task.clone()],
        driver_instance: Some(driver_instance()),
    };
    let ack = StatusReply::StatusAck {
        accepted: u32::MAX,
        refused: vec![],
        launch: vec![task],
    };
    for size in [encode(&launch).len(), encode(&ack).len()] {
        assert!(
            size - spec_bytes < 250,
            "{size} bytes for a spec of {spec_bytes}"
        );
    }
}

/// `group` (the text of one task group) as a `LaunchTasks` and as a `StatusAck`'s launch: both
/// are refused with an error that mentions every `needles`.
fn group_refused(group: &str, needles: &[&str]) {
    let message = format!(r#"{{"type":"LaunchTasks","tasks":[{group}]}}"#);
    json_error::<ExecutorMessage>(message.as_bytes(), needles);
    let ack = format!(r#"{{"type":"StatusAck","accepted":0,"refused":[],"launch":[{group}]}}"#);
    json_error::<StatusReply>(ack.as_bytes(), needles);
}

#[test]
fn decode_refuses_malformed_task_groups() {
    let spec = r#"{"kind":"handler","name":"noop"}"#;
    let with_tasks =
        |tasks: &str| format!(r#"{{"job_id":1,"cpus":1,"spec":{spec},"tasks":{tasks}}}"#);
    let expected = "expected a task as [task_id, index, attempt]";
    for (tasks, needles) in [
        ("[[1,0]]", ["invalid length 2", expected]),
        ("[[]]", ["invalid length 0", expected]),
        ("[[1,0,0,0]]", ["invalid length 4", expected]),
        ("[[1,0,0],[2,1,0,0,0]]", ["invalid length 5", expected]),
        (
            r#"[{"task_id":1,"index":0,"attempt":0}]"#,
            ["invalid type: map", expected],
        ),
        ("[[-1,0,0]]", ["integer `-1`", "expected u64"]),
        ("[[1,0,-1]]", ["integer `-1`", "expected u32"]),
        (
            "[[1,4294967296,0]]",
            ["integer `4294967296`", "expected u32"],
        ),
        (
            "[[18446744073709551616,0,0]]",
            ["invalid type: floating point", "expected u64"],
        ),
        (
            "[[1.5,0,0]]",
            ["invalid type: floating point", "expected u64"],
        ),
        ("[[\"1\",0,0]]", ["invalid type: string", "expected u64"]),
        ("[1,0,0]", ["invalid type: integer", expected]),
        ("{}", ["invalid type: map", "a sequence"]),
    ] {
        group_refused(&with_tasks(tasks), &needles);
    }
    // An empty group is refused, not skipped: a sender that writes one has lost its tasks.
    group_refused(&with_tasks("[]"), &["a task group of job 1 has no tasks"]);
    // Every field is needed.
    for (field, group) in [
        (
            "job_id",
            format!(r#"{{"cpus":1,"spec":{spec},"tasks":[[1,0,0]]}}"#),
        ),
        (
            "cpus",
            format!(r#"{{"job_id":1,"spec":{spec},"tasks":[[1,0,0]]}}"#),
        ),
        (
            "spec",
            r#"{"job_id":1,"cpus":1,"tasks":[[1,0,0]]}"#.to_string(),
        ),
        ("tasks", format!(r#"{{"job_id":1,"cpus":1,"spec":{spec}}}"#)),
        (
            "tasks",
            format!(r#"{{"job_id":1,"cpus":1,"spec":{spec},"tasks":null}}"#),
        ),
    ] {
        group_refused(
            &group,
            &[&format!("missing field `{field}` in a task group")],
        );
    }
    // A task written out in full, as before groups, names what it lacks.
    group_refused(
        &format!(r#"{{"task_id":1,"job_id":1,"index":0,"attempt":0,"cpus":1,"spec":{spec}}}"#),
        &["missing field `tasks` in a task group"],
    );
    group_refused(
        &format!(r#"{{"job_id":1,"job_id":2,"cpus":1,"spec":{spec},"tasks":[[1,0,0]]}}"#),
        &["duplicate field `job_id`"],
    );
    group_refused(
        r#"{"job_id":1,"cpus":1,"spec":{"kind":"handler"},"tasks":[[1,0,0]]}"#,
        &["missing field `name`"],
    );
    group_refused("[1,0,0]", &[]);
    group_refused(
        r#""noop""#,
        &["invalid type: string", "expected a task group"],
    );
    json_error::<ExecutorMessage>(
        br#"{"type":"LaunchTasks","tasks":{"job_id":1}}"#,
        &["invalid type: map", "a list of task groups"],
    );
}

#[test]
fn a_launch_decodes_no_more_than_its_limit_allows() {
    let tasks = vec!["[1,0,0]"; 200_000].join(",");
    let payload = format!(
        r#"{{"type":"LaunchTasks","tasks":[{{"job_id":1,"cpus":1,"spec":{{"kind":"handler","name":"noop"}},"tasks":[{tasks}]}}]}}"#
    );
    assert!(matches!(
        decode::<ExecutorMessage>(payload.as_bytes(), LIMIT),
        Err(DecodeError::TooLarge { .. })
    ));
    match decode::<ExecutorMessage>(payload.as_bytes(), 2 * LIMIT) {
        Ok(ExecutorMessage::LaunchTasks { tasks, .. }) => {
            assert_eq!(tasks.len(), 200_000);
            assert!(tasks.iter().all(|t| Arc::ptr_eq(&t.spec, &tasks[0].spec)));
        }
        other => panic!("expected LaunchTasks, got {other:?}"),
    }
}

#[test]
fn executor_kill_task() {
    let kill = |driver_instance| ExecutorMessage::KillTask {
        task_id: 43,
        attempt: 2,
        reason: "job 7 ended: killed by request".into(),
        driver_instance,
    };
    golden(
        &kill(Some(driver_instance())),
        json!({
            "type": "KillTask",
            "task_id": 43,
            "attempt": 2,
            "reason": "job 7 ended: killed by request",
            "driver_instance": DRIVER
        }),
    );
    // Without `driver_instance` it is a kill from whichever driver the executor has.
    golden(
        &kill(None),
        json!({
            "type": "KillTask",
            "task_id": 43,
            "attempt": 2,
            "reason": "job 7 ended: killed by request"
        }),
    );
}

#[test]
fn executors_told_a_driver_leads() {
    golden(
        &ExecutorMessage::Leading {
            driver_instance: driver_instance(),
        },
        json!({ "type": "Leading", "driver_instance": DRIVER }),
    );
}

// ---------------------------------------------------------------------------------------------
// Status updates
// ---------------------------------------------------------------------------------------------

#[test]
fn status_updates() {
    let request = StatusRequest::StatusUpdates {
        executor_id: exec("exec-1"),
        updates: vec![
            StatusUpdate {
                task_id: 42,
                attempt: 0,
                state: TaskState::Running,
                result: None,
                error: None,
                result_object: None,
                no_retry: false,
            },
            StatusUpdate {
                task_id: 42,
                attempt: 0,
                state: TaskState::Finished,
                result: Some(json!("hi")),
                error: None,
                result_object: None,
                no_retry: false,
            },
            StatusUpdate {
                task_id: 43,
                attempt: 2,
                state: TaskState::Failed,
                result: Some(json!({"exit_code": 3, "stdout": "", "stderr": "bad\n"})),
                error: Some("exited with code 3: bad".into()),
                result_object: None,
                no_retry: false,
            },
        ],
        driver_instance: Some(driver_instance()),
    };
    golden(
        &request,
        json!({
            "type": "StatusUpdates",
            "executor_id": "exec-1",
            "driver_instance": DRIVER,
            "updates": [
                {"task_id": 42, "attempt": 0, "state": "RUNNING"},
                {"task_id": 42, "attempt": 0, "state": "FINISHED", "result": "hi"},
                {
                    "task_id": 43,
                    "attempt": 2,
                    "state": "FAILED",
                    "result": {"exit_code": 3, "stdout": "", "stderr": "bad\n"},
                    "error": "exited with code 3: bad"
                }
            ]
        }),
    );
    // A plain finish (no result, no error) goes as [task_id, attempt], and reads back as one
    // written out in full.
    let plain = StatusUpdate {
        task_id: 44,
        attempt: 1,
        state: TaskState::Finished,
        result: None,
        error: None,
        result_object: None,
        no_retry: false,
    };
    golden(
        &StatusRequest::StatusUpdates {
            executor_id: exec("exec-1"),
            updates: vec![plain.clone(), plain.clone()],
            driver_instance: None,
        },
        json!({"type": "StatusUpdates", "executor_id": "exec-1", "updates": [[44, 1], [44, 1]]}),
    );
    fast_reads(&StatusRequest::StatusUpdates {
        executor_id: exec("exec-1"),
        updates: vec![plain.clone(), plain.clone()],
        driver_instance: Some(driver_instance()),
    });
    decodes_to(
        json!({"task_id": 44, "attempt": 1, "state": "FINISHED"}),
        &plain,
    );
    // A null result or error reads as none; a batch need not name its driver.
    decodes_to(
        json!({
            "type": "StatusUpdates",
            "executor_id": "exec-1",
            "updates": [{"task_id": 42, "attempt": 0, "state": "KILLED", "result": null, "error": null}]
        }),
        &StatusRequest::StatusUpdates {
            executor_id: exec("exec-1"),
            updates: vec![StatusUpdate {
                task_id: 42,
                attempt: 0,
                state: TaskState::Killed,
                result: None,
                error: None,
                result_object: None,
                no_retry: false,
            }],
            driver_instance: None,
        },
    );
}

#[test]
fn a_plain_finish_is_exactly_two_numbers() {
    let expected = "a status update: an object, or [task_id, attempt] for a plain finish";
    for (update, needles) in [
        ("[]", vec!["invalid length 0", expected]),
        ("[1]", vec!["invalid length 1", expected]),
        ("[1,0,0]", vec!["invalid length 3", expected]),
        ("[1,0,\"FAILED\"]", vec!["invalid length 3", expected]),
        (
            "[-1,0]",
            vec!["invalid value: integer `-1`", "expected u64"],
        ),
        (
            "[1,4294967296]",
            vec!["invalid value: integer `4294967296`", "expected u32"],
        ),
        ("[\"1\",0]", vec!["invalid type: string", "expected u64"]),
        (
            "[1.5,0]",
            vec!["invalid type: floating point", "expected u64"],
        ),
        ("42", vec!["invalid type: integer `42`", expected]),
        ("\"FINISHED\"", vec!["invalid type: string", expected]),
        ("null", vec!["invalid type: null", expected]),
    ] {
        let batch =
            format!(r#"{{"type":"StatusUpdates","executor_id":"e1","updates":[{update}]}}"#);
        json_error::<StatusRequest>(batch.as_bytes(), &needles);
    }
}

#[test]
fn status_ack() {
    golden(
        &StatusReply::StatusAck {
            accepted: 2,
            refused: vec![RefusedStatus {
                task_id: 43,
                attempt: 2,
                reason: "task 43 attempt 2 was not launched on executor exec-1".into(),
            }],
            launch: vec![],
        },
        json!({
            "type": "StatusAck",
            "accepted": 2,
            "refused": [{
                "task_id": 43,
                "attempt": 2,
                "reason": "task 43 attempt 2 was not launched on executor exec-1"
            }]
        }),
    );
    golden(
        &StatusReply::StatusAck {
            accepted: 0,
            refused: vec![],
            launch: vec![],
        },
        json!({"type": "StatusAck", "accepted": 0, "refused": []}),
    );
    let noop = noop();
    let ack = StatusReply::StatusAck {
        accepted: 1,
        refused: vec![],
        launch: vec![
            launched(44, 2, 3, 0, &noop),
            launched(45, 2, 4, 0, &noop),
            launched(41, 2, 0, 1, &noop),
        ],
    };
    fast_reads(&ack);
    golden(
        &ack,
        json!({
            "type": "StatusAck",
            "accepted": 1,
            "refused": [],
            "launch": [{
                "job_id": 2,
                "cpus": 1,
                "spec": {"kind": "handler", "name": "noop", "arg": null},
                "tasks": [[44, 3, 0], [45, 4, 0], [41, 0, 1]]
            }]
        }),
    );
}

#[test]
fn status_error() {
    golden(
        &StatusReply::Error {
            message: "executor exec-9 is not registered".into(),
        },
        json!({"type": "Error", "message": "executor exec-9 is not registered"}),
    );
}

#[test]
fn refused_status() {
    golden(
        &RefusedStatus {
            task_id: 99,
            attempt: 0,
            reason: "task 99 is not known to this driver".into(),
        },
        json!({"task_id": 99, "attempt": 0, "reason": "task 99 is not known to this driver"}),
    );
}

// ---------------------------------------------------------------------------------------------
// What decode refuses
// ---------------------------------------------------------------------------------------------

#[test]
fn decode_refuses_a_payload_over_the_limit() {
    let payload = encode(&register_request());
    let size = payload.len();
    // Exactly at the limit is fine; one byte over is not, and nothing is parsed.
    assert!(decode::<RegisterRequest>(&payload, size).is_ok());
    match decode::<RegisterRequest>(&payload, size - 1) {
        Err(DecodeError::TooLarge { size: s, limit }) => {
            assert_eq!((s, limit), (size, size - 1));
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let garbage = vec![b'x'; 100];
    let error = decode::<ApiRequest>(&garbage, 10).unwrap_err();
    assert!(matches!(
        error,
        DecodeError::TooLarge {
            size: 100,
            limit: 10
        }
    ));
    assert_eq!(
        error.to_string(),
        "message of 100 bytes exceeds the limit of 10 bytes"
    );
}

#[test]
fn decode_refuses_an_empty_payload() {
    for payload in [&b""[..], b" ", b"\n\t\r  "] {
        let error = decode::<ApiRequest>(payload, LIMIT).unwrap_err();
        assert!(
            matches!(error, DecodeError::Empty),
            "{payload:?}: {error:?}"
        );
        assert_eq!(error.to_string(), "message is empty");
    }
}

#[test]
fn decode_refuses_an_unknown_type() {
    let message = json_error::<ApiRequest>(
        br#"{"type":"DropTables"}"#,
        &["unknown variant `DropTables`", "ListExecutors"],
    );
    assert!(message.starts_with("message is not valid JSON for this subject: "));
    // A reply type is not a request type.
    json_error::<ApiRequest>(
        br#"{"type":"JobAccepted","job_id":1}"#,
        &["unknown variant"],
    );
    // Tags are case-sensitive.
    json_error::<RegisterRequest>(
        br#"{"type":"registerExecutor"}"#,
        &["unknown variant `registerExecutor`"],
    );
    json_error::<ExecutorMessage>(br#"{"type":"Shutdown"}"#, &["unknown variant `Shutdown`"]);
    json_error::<Event>(br#"{"type":"StageStart"}"#, &["unknown variant"]);
    // No tag at all.
    json_error::<StatusRequest>(
        br#"{"executor_id":"e","updates":[]}"#,
        &["missing field `type`"],
    );
}

/// The records of docs/protocol.md's journal section, exactly as written there.
#[test]
fn journal_records() {
    let job = SubmitJob {
        name: "nightly".into(),
        repeat: 50,
        max_failures: 4,
        ..SubmitJob::new(vec![TaskSpec::Handler {
            name: "noop".into(),
            arg: Value::Null,
        }])
    };
    golden(
        &JournalRecord::JobSubmitted {
            job_id: 3,
            first_task: 101,
            time_ms: 1_700_000_000_000,
            job: Box::new(job.clone()),
            term: None,
            tenant: None,
        },
        json!({"type":"JobSubmitted","job_id":3,"first_task":101,"time_ms":1700000000000u64,"job":{"name":"nightly","tasks":[{"kind":"handler","name":"noop","arg":null}],"repeat":50,"max_failures":4,"cpus_per_task":1}}),
    );
    // With the term of the leader that accepted it.
    golden(
        &JournalRecord::JobSubmitted {
            job_id: 3,
            first_task: 101,
            time_ms: 1_700_000_000_000,
            job: Box::new(job.clone()),
            term: Some(12),
            tenant: None,
        },
        json!({"type":"JobSubmitted","job_id":3,"first_task":101,"time_ms":1700000000000u64,"job":{"name":"nightly","tasks":[{"kind":"handler","name":"noop","arg":null}],"repeat":50,"max_failures":4,"cpus_per_task":1},"term":12}),
    );
    // A tenant's job.
    golden(
        &JournalRecord::JobSubmitted {
            job_id: 3,
            first_task: 101,
            time_ms: 1_700_000_000_000,
            job: Box::new(job),
            term: Some(12),
            tenant: Some("EMBER_prod_TENANT_acme".into()),
        },
        json!({"type":"JobSubmitted","job_id":3,"first_task":101,"time_ms":1700000000000u64,"job":{"name":"nightly","tasks":[{"kind":"handler","name":"noop","arg":null}],"repeat":50,"max_failures":4,"cpus_per_task":1},"term":12,"tenant":"EMBER_prod_TENANT_acme"}),
    );
    golden(
        &JournalRecord::TasksEnded {
            time_ms: 1_700_000_000_120,
            tasks: vec![JournaledTask {
                task_id: 101,
                attempt: 0,
                executor_id: exec("exec-1"),
                state: TaskState::Finished,
                result: Some(json!("ok")),
                error: None,
                in_bucket: false,
                result_object: None,
                objects: Vec::new(),
            }],
            term: 0,
        },
        json!({"type":"TasksEnded","time_ms":1700000000120u64,"tasks":[{"task_id":101,"attempt":0,"executor_id":"exec-1","state":"FINISHED","result":"ok"}]}),
    );
    // A plain finish is an array; with its result in the bucket, an object that says so.
    let plain = JournaledTask {
        task_id: 102,
        attempt: 1,
        executor_id: exec("exec-2"),
        state: TaskState::Finished,
        result: None,
        error: None,
        in_bucket: false,
        result_object: None,
        objects: Vec::new(),
    };
    let in_bucket = JournaledTask {
        task_id: 103,
        in_bucket: true,
        ..plain.clone()
    };
    golden(
        &JournalRecord::TasksEnded {
            time_ms: 1_700_000_000_130,
            tasks: vec![plain.clone(), in_bucket],
            term: 0,
        },
        json!({"type":"TasksEnded","time_ms":1700000000130u64,"tasks":[[102,1,"exec-2"],{"task_id":103,"attempt":1,"executor_id":"exec-2","state":"FINISHED","in_bucket":true}]}),
    );
    // A finish whose result names objects (a command's outputs) is an object that lists them.
    let output = ember::objects::ObjectRef::of(b"out");
    golden(
        &JournalRecord::TasksEnded {
            time_ms: 1_700_000_000_135,
            tasks: vec![JournaledTask {
                task_id: 104,
                in_bucket: true,
                objects: vec![output.clone()],
                ..plain.clone()
            }],
            term: 0,
        },
        json!({"type":"TasksEnded","time_ms":1700000000135u64,"tasks":[{"task_id":104,"attempt":1,"executor_id":"exec-2","state":"FINISHED","in_bucket":true,"objects":[output.as_str()]}]}),
    );
    // Plain finishes of consecutive ids, one attempt and one executor, go as a run.
    let run: Vec<_> = (110..113)
        .map(|task_id| JournaledTask {
            task_id,
            attempt: 0,
            ..plain.clone()
        })
        .collect();
    golden(
        &JournalRecord::TasksEnded {
            time_ms: 1_700_000_000_140,
            tasks: [run.clone(), vec![plain.clone()]].concat(),
            term: 0,
        },
        json!({"type":"TasksEnded","time_ms":1700000000140u64,"tasks":[[110,0,"exec-2",3],[102,1,"exec-2"]]}),
    );
    json_error::<JournalRecord>(
        br#"{"type":"TasksEnded","time_ms":1,"tasks":[[110,0,"exec-2",0]]}"#,
        &["a run of no tasks"],
    );
    json_error::<JournalRecord>(
        br#"{"type":"TasksEnded","time_ms":1,"tasks":[[110,0,"exec-2",99999999999]]}"#,
        &["a record of more than"],
    );
    json_error::<JournalRecord>(
        br#"{"type":"TasksEnded","time_ms":1,"tasks":[[18446744073709551615,0,"exec-2",2]]}"#,
        &["past the largest id"],
    );
    // The object form of a plain finish reads the same.
    let object = br#"{"type":"TasksEnded","time_ms":1,"tasks":[{"task_id":102,"attempt":1,"executor_id":"exec-2","state":"FINISHED"}]}"#;
    assert_eq!(
        decode::<JournalRecord>(object, usize::MAX).unwrap(),
        JournalRecord::TasksEnded {
            time_ms: 1,
            tasks: vec![plain],
            term: 0,
        }
    );
    json_error::<JournalRecord>(
        br#"{"type":"TasksEnded","time_ms":1,"tasks":[[102,1,"bad id!"]]}"#,
        &["contains"],
    );
    golden(
        &JournalRecord::JobEnded {
            job_id: 3,
            state: JobState::Succeeded,
            time_ms: 1_700_000_000_950,
            reason: None,
        },
        json!({"type":"JobEnded","job_id":3,"state":"SUCCEEDED","time_ms":1700000000950u64}),
    );
    golden(
        &JournalRecord::ResultsDropped { job_id: 3 },
        json!({"type":"ResultsDropped","job_id":3}),
    );
    golden(
        &JournalRecord::TaskKilledByRequest {
            job_id: 3,
            index: 5,
            time_ms: 1_700_000_000_960,
        },
        json!({"type":"TaskKilledByRequest","job_id":3,"index":5,"time_ms":1700000000960u64}),
    );
    golden(
        &JournalRecord::TaskRetryWaits {
            job_id: 3,
            index: 5,
            failures: 2,
            until_ms: 1_700_000_002_960,
        },
        json!({"type":"TaskRetryWaits","job_id":3,"index":5,"failures":2,"until_ms":1700000002960u64}),
    );
    golden(
        &JournalRecord::Leader {
            epoch: 12,
            driver_instance: uuid::Uuid::from_u128(0x1ead),
            time_ms: 1_700_000_000_990,
        },
        json!({"type":"Leader","epoch":12,"driver_instance":"00000000-0000-0000-0000-000000001ead","time_ms":1700000000990u64}),
    );
    golden(
        &JournalRecord::SnapshotPart {
            snapshot: uuid::Uuid::from_u128(0x5a),
            part: 0,
            parts: 1,
            time_ms: 1_700_000_001_000,
            next_job: 4,
            next_task: 151,
            records: vec![JournalRecord::JobEnded {
                job_id: 3,
                state: JobState::Succeeded,
                time_ms: 1_700_000_000_950,
                reason: None,
            }],
        },
        json!({"type":"SnapshotPart","snapshot":"00000000-0000-0000-0000-00000000005a","part":0,"parts":1,"time_ms":1700000001000u64,"next_job":4,"next_task":151,"records":[{"type":"JobEnded","job_id":3,"state":"SUCCEEDED","time_ms":1700000000950u64}]}),
    );
}

#[test]
fn decode_refuses_a_missing_field() {
    json_error::<RegisterRequest>(
        format!(
            r#"{{"type":"RegisterExecutor","executor_id":"e1","instance_id":"{INSTANCE}","host_port":"h:1"}}"#
        )
        .as_bytes(),
        &["missing field `cores`"],
    );
    json_error::<ApiRequest>(br#"{"type":"KillJob"}"#, &["missing field `job_id`"]);
    json_error::<ExecutorMessage>(
        br#"{"type":"KillTask","task_id":1,"attempt":0}"#,
        &["missing field `reason`"],
    );
    json_error::<StatusRequest>(
        br#"{"type":"StatusUpdates","executor_id":"e1","updates":[{"task_id":1,"attempt":0}]}"#,
        &["missing field `state`"],
    );
}

#[test]
fn decode_ignores_unknown_fields() {
    decodes_to(
        json!({"type": "KillJob", "job_id": 7, "force": true}),
        &ApiRequest::KillJob { job_id: 7 },
    );
    decodes_to(
        json!({"type": "ListJobs", "extra": 1}),
        &ApiRequest::list_jobs(),
    );
}

fn register_with_id(id: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "type": "RegisterExecutor",
        "executor_id": id,
        "instance_id": INSTANCE,
        "host_port": "h:1",
        "cores": 1
    }))
    .unwrap()
}

#[test]
fn decode_refuses_an_invalid_executor_id() {
    json_error::<RegisterRequest>(
        &register_with_id("a.b"),
        &[
            r#"executor id "a.b" contains '.'"#,
            "only A-Z, a-z, 0-9, '_' and '-' are allowed",
        ],
    );
    json_error::<RegisterRequest>(
        &register_with_id(&"x".repeat(65)),
        &["executor id is 65 bytes long; the limit is 64"],
    );
    json_error::<RegisterRequest>(&register_with_id(""), &["executor id is empty"]);
    for bad in ["a*", ">", "a b", "é"] {
        json_error::<RegisterRequest>(&register_with_id(bad), &["executor id", "contains"]);
    }
    // 64 characters of the allowed set are fine.
    let longest = format!("{}_-9Z", "a".repeat(60));
    assert!(decode::<RegisterRequest>(&register_with_id(&longest), LIMIT).is_ok());
    // The same rule holds wherever an executor id appears.
    json_error::<StatusRequest>(
        br#"{"type":"StatusUpdates","executor_id":"a.b","updates":[]}"#,
        &[r#"executor id "a.b" contains '.'"#],
    );
    json_error::<Event>(
        br#"{"type":"ExecutorRemoved","time_ms":1,"executor_id":"","reason":"x"}"#,
        &["executor id is empty"],
    );
}

#[test]
fn decode_refuses_deep_nesting_without_overflowing() {
    let depth = 10_000;
    let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    json_error::<Value>(deep.as_bytes(), &["recursion limit exceeded"]);
    // Inside a free-form field of a tagged message.
    let submit = format!(
        r#"{{"type":"SubmitJob","tasks":[{{"kind":"handler","name":"echo","arg":{deep}}}]}}"#
    );
    json_error::<ApiRequest>(submit.as_bytes(), &["recursion limit exceeded"]);
    let objects = format!("{}{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
    let status = format!(
        r#"{{"type":"StatusUpdates","executor_id":"e1","updates":[{{"task_id":1,"attempt":0,"state":"FINISHED","result":{objects}}}]}}"#
    );
    json_error::<StatusRequest>(status.as_bytes(), &["recursion limit exceeded"]);
    // Unterminated nesting too.
    json_error::<Event>("[".repeat(depth).as_bytes(), &[]);
}

#[test]
fn decode_refuses_invalid_utf8() {
    let mut payload = br#"{"type":"SubmitJob","name":"caf"#.to_vec();
    payload.extend_from_slice(&[0xC3, 0x28]);
    payload.extend_from_slice(br#"","tasks":[{"kind":"handler","name":"noop"}]}"#);
    json_error::<ApiRequest>(&payload, &[]);
    json_error::<ApiRequest>(&[0xFF, 0xFE, b'{', b'}'], &[]);
    // Valid UTF-8 beyond ASCII is fine.
    decodes_to(
        json!({"type": "SubmitJob", "name": "café ☕", "tasks": [{"kind": "handler", "name": "noop"}]}),
        &ApiRequest::SubmitJob(SubmitJob {
            name: "café ☕".into(),
            ..default_job()
        }),
    );
}

#[test]
fn decode_refuses_trailing_garbage_and_wrong_types() {
    json_error::<ApiRequest>(br#"{"type":"ListJobs"} {"type":"ListJobs"}"#, &["trailing"]);
    json_error::<ApiRequest>(br#"{"type":"KillJob","job_id":-1}"#, &[]);
    json_error::<ApiRequest>(br#"{"type":"KillJob","job_id":"7"}"#, &[]);
    json_error::<RegisterRequest>(
        br#"{"type":"RegisterExecutor","executor_id":"e1","instance_id":"not-a-uuid","host_port":"h:1","cores":1}"#,
        &[],
    );
    json_error::<ApiRequest>(br#"[]"#, &[]);
}

// ---------------------------------------------------------------------------------------------
// Custom resources
// ---------------------------------------------------------------------------------------------

fn addresses(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    pairs
        .iter()
        .map(|(name, list)| {
            (
                name.to_string(),
                list.iter().map(|a| a.to_string()).collect(),
            )
        })
        .collect()
}

#[test]
fn register_executor_with_resources() {
    let RegisterRequest::RegisterExecutor(mut request) = register_request();
    request.attributes = BTreeMap::new();
    request.log_urls = BTreeMap::new();
    request.resources = addresses(&[("gpu", &["0", "3"]), ("mem_gb", &["0", "1"])]);
    request.connection = None;
    golden(
        &RegisterRequest::RegisterExecutor(request),
        json!({
            "type": "RegisterExecutor",
            "executor_id": "exec-1",
            "instance_id": INSTANCE,
            "host_port": "worker-3:7078",
            "cores": 8,
            "log_urls": {},
            "attributes": {},
            "resources": {"gpu": ["0", "3"], "mem_gb": ["0", "1"]}
        }),
    );
}

#[test]
fn executor_added_with_resources() {
    let event = Event::ExecutorAdded {
        time_ms: 5,
        executor_id: exec("exec-1"),
        info: ExecutorInfo {
            host: "worker-3".into(),
            host_port: "worker-3:7078".into(),
            total_cores: 8,
            log_urls: BTreeMap::new(),
            attributes: BTreeMap::new(),
            resources: addresses(&[("gpu", &["0", "1"])]),
        },
    };
    golden(
        &event,
        json!({
            "type": "ExecutorAdded",
            "time_ms": 5,
            "executor_id": "exec-1",
            "info": {
                "host": "worker-3",
                "host_port": "worker-3:7078",
                "total_cores": 8,
                "log_urls": {},
                "attributes": {},
                "resources": {"gpu": ["0", "1"]}
            }
        }),
    );
}

#[test]
fn submit_job_asking_for_resources() {
    let mut job = default_job();
    job.resources = [("gpu".to_string(), 1), ("mem_gb".to_string(), 4)].into();
    golden(
        &job,
        json!({
            "name": "",
            "tasks": [{"kind": "handler", "name": "noop", "arg": null}],
            "repeat": 1,
            "max_failures": 4,
            "cpus_per_task": 1,
            "resources": {"gpu": 1, "mem_gb": 4}
        }),
    );
    json_error::<SubmitJob>(
        br#"{"tasks":[],"resources":{"gpu":-1}}"#,
        &["invalid value"],
    );
}

#[test]
fn executor_summary_with_resources() {
    let summary = ExecutorSummary {
        executor_id: exec("exec-1"),
        host: "worker-3".into(),
        host_port: "worker-3:7078".into(),
        free_cores: 6,
        total_cores: 8,
        log_urls: BTreeMap::new(),
        attributes: BTreeMap::new(),
        registered_at_ms: 1,
        last_seen_ms: 2,
        resources: [(
            "gpu".to_string(),
            ember::protocol::ResourceCount { total: 2, free: 1 },
        )]
        .into(),
        exclusions: Vec::new(),
        objects: Default::default(),
        abandoned: Vec::new(),
    };
    golden(
        &summary,
        json!({
            "executor_id": "exec-1",
            "host": "worker-3",
            "host_port": "worker-3:7078",
            "free_cores": 6,
            "total_cores": 8,
            "log_urls": {},
            "attributes": {},
            "registered_at_ms": 1,
            "last_seen_ms": 2,
            "resources": {"gpu": {"total": 2, "free": 1}}
        }),
    );
}

#[test]
fn job_summary_that_waits() {
    let summary = JobSummary {
        speculative: None,
        waiting: Some("no executor has gpu=4; largest: gpu=2".into()),
        ..running_summary()
    };
    let mut wire = running_summary_wire();
    wire["waiting"] = json!("no executor has gpu=4; largest: gpu=2");
    golden(
        &ApiReply::Job { job: summary },
        json!({"type": "Job", "job": wire}),
    );
}

#[test]
fn launch_tasks_holding_resources() {
    let noop = noop();
    let mut first = launched(10, 1, 0, 0, &noop);
    first.resources = addresses(&[("gpu", &["0"])]);
    let mut second = launched(11, 1, 1, 0, &noop);
    second.resources = addresses(&[("gpu", &["1"])]);
    let plain = launched(20, 2, 0, 0, &noop);
    let plain_too = launched(21, 2, 1, 0, &noop);
    let with = |tasks: Value, gpu: &str| {
        json!({
            "job_id": 1,
            "cpus": 1,
            "spec": noop_wire(),
            "resources": {"gpu": [gpu]},
            "tasks": tasks
        })
    };
    golden(
        &launch(vec![first, second, plain, plain_too]),
        json!({
            "type": "LaunchTasks",
            "tasks": [
                with(json!([[10, 0, 0]]), "0"),
                with(json!([[11, 1, 0]]), "1"),
                group(2, noop_wire(), json!([[20, 0, 0], [21, 1, 0]])),
            ]
        }),
    );
}

/// The placement of docs/protocol.md's `SubmitJob` example.
fn placement() -> ember::placement::Placement {
    ember::placement::Placement {
        constraints: vec!["rack=r1".into(), "os in (linux,freebsd)".into()],
        prefer_executors: vec![exec("worker-3")],
        prefer_hosts: vec!["10.0.0.7".into()],
        prefer_sites: vec!["edge".into()],
        locality_wait_ms: Some(1500),
    }
}

#[test]
fn submit_job_with_a_placement() {
    let job = SubmitJob {
        placement: placement(),
        ..default_job()
    };
    let wire = json!({
        "name": "",
        "tasks": [{"kind": "handler", "name": "noop", "arg": null}],
        "repeat": 1,
        "max_failures": 4,
        "cpus_per_task": 1,
        "constraints": ["rack=r1", "os in (linux,freebsd)"],
        "prefer_executors": ["worker-3"],
        "prefer_hosts": ["10.0.0.7"],
        "prefer_sites": ["edge"],
        "locality_wait_ms": 1500
    });
    golden(&job, wire.clone());
    // Inside the api's tagged request too.
    let mut request = wire;
    request["type"] = json!("SubmitJob");
    golden(&ApiRequest::SubmitJob(job), request);
    // Each field alone; the rest absent.
    let only = SubmitJob {
        placement: ember::placement::Placement {
            constraints: vec!["zone!=z3".into()],
            ..Default::default()
        },
        ..default_job()
    };
    decodes_to(
        json!({"tasks": [{"kind": "handler", "name": "noop"}], "constraints": ["zone!=z3"]}),
        &only,
    );
    json_error::<SubmitJob>(
        br#"{"tasks":[],"constraints":"rack=r1"}"#,
        &["invalid type"],
    );
    json_error::<SubmitJob>(
        br#"{"tasks":[],"prefer_executors":["a b"]}"#,
        &["executor id"],
    );
    json_error::<SubmitJob>(br#"{"tasks":[],"prefer_sites":"edge"}"#, &["invalid type"]);
}

#[test]
fn job_summary_with_a_placement() {
    let summary = JobSummary {
        placement: Some(placement()),
        waiting: Some("no live executor meets rack=r1".into()),
        ..running_summary()
    };
    let mut wire = running_summary_wire();
    wire["waiting"] = json!("no live executor meets rack=r1");
    wire["placement"] = json!({
        "constraints": ["rack=r1", "os in (linux,freebsd)"],
        "prefer_executors": ["worker-3"],
        "prefer_hosts": ["10.0.0.7"],
        "prefer_sites": ["edge"],
        "locality_wait_ms": 1500
    });
    golden(
        &ApiReply::Job { job: summary },
        json!({"type": "Job", "job": wire}),
    );
}

// ---------------------------------------------------------------------------------------------
// Pools and priorities
// ---------------------------------------------------------------------------------------------

#[test]
fn submit_job_in_a_pool_with_a_priority() {
    let mut job = default_job();
    job.pool = Some("etl".into());
    job.priority = -3;
    golden(
        &ApiRequest::SubmitJob(job),
        json!({
            "type": "SubmitJob",
            "name": "",
            "tasks": [{"kind": "handler", "name": "noop", "arg": null}],
            "repeat": 1,
            "max_failures": 4,
            "cpus_per_task": 1,
            "pool": "etl",
            "priority": -3
        }),
    );
    json_error::<SubmitJob>(br#"{"tasks":[],"priority":2147483648}"#, &["invalid value"]);
    json_error::<SubmitJob>(br#"{"tasks":[],"pool":7}"#, &["invalid type"]);
}

#[test]
fn job_summary_with_its_pool_and_priority() {
    let summary = JobSummary {
        pool: Some("etl".into()),
        priority: 5,
        ..running_summary()
    };
    let mut wire = running_summary_wire();
    wire["pool"] = json!("etl");
    wire["priority"] = json!(5);
    golden(
        &ApiReply::Job { job: summary },
        json!({"type": "Job", "job": wire}),
    );
}

#[test]
fn api_list_pools() {
    golden(&ApiRequest::ListPools, json!({"type": "ListPools"}));
    golden(
        &ApiReply::Pools {
            scheduling: "fair".into(),
            pools: vec![ember::protocol::PoolSummary {
                name: "etl".into(),
                weight: 3,
                min_share: 2,
                mode: "fifo".into(),
                declared: true,
                running_cores: 6,
                jobs: 2,
            }],
        },
        json!({
            "type": "Pools",
            "scheduling": "fair",
            "pools": [{
                "name": "etl", "weight": 3, "min_share": 2, "mode": "fifo", "declared": true,
                "running_cores": 6, "jobs": 2
            }]
        }),
    );
    golden(
        &ApiReply::Pools {
            scheduling: "fifo".into(),
            pools: vec![],
        },
        json!({"type": "Pools", "scheduling": "fifo", "pools": []}),
    );
}

#[test]
fn submit_job_with_speculation() {
    let job = SubmitJob {
        speculation: Some(Speculation {
            quantile: 0.5,
            multiplier: 2.0,
            min_runtime_ms: 5000,
        }),
        ..default_job()
    };
    golden(
        &job,
        json!({
            "name": "",
            "tasks": [{"kind": "handler", "name": "noop", "arg": null}],
            "repeat": 1,
            "max_failures": 4,
            "cpus_per_task": 1,
            "speculation": {"quantile": 0.5, "multiplier": 2.0, "min_runtime_ms": 5000}
        }),
    );
    // Each setting is optional, with Spark's defaults; `{}` turns it on with them all.
    let with_defaults = SubmitJob {
        speculation: Some(Speculation {
            quantile: 0.75,
            multiplier: 1.5,
            min_runtime_ms: 100,
        }),
        ..default_job()
    };
    assert_eq!(with_defaults.speculation, Some(Speculation::default()));
    decodes_to(
        json!({"tasks": [{"kind": "handler", "name": "noop"}], "speculation": {}}),
        &with_defaults,
    );
    json_error::<SubmitJob>(
        br#"{"tasks":[{"kind":"handler","name":"noop"}],"speculation":{"quantile":"high"}}"#,
        &["expected f64"],
    );
}

#[test]
fn submit_job_with_a_retry_backoff() {
    let job = SubmitJob {
        retry_backoff: Some(ember::protocol::RetryBackoff {
            initial_ms: 1000,
            multiplier: 3.0,
            max_ms: Some(60_000),
            jitter: 0.1,
        }),
        ..default_job()
    };
    golden(
        &job,
        json!({
            "name": "",
            "tasks": [{"kind": "handler", "name": "noop", "arg": null}],
            "repeat": 1,
            "max_failures": 4,
            "cpus_per_task": 1,
            "retry_backoff": {"initial_ms": 1000, "multiplier": 3.0, "max_ms": 60000, "jitter": 0.1}
        }),
    );
    // Only the first wait is needed: doubling, capped at 100 times it, 20% of jitter.
    decodes_to(
        json!({"tasks": [{"kind": "handler", "name": "noop"}], "retry_backoff": {"initial_ms": 500}}),
        &SubmitJob {
            retry_backoff: Some(ember::protocol::RetryBackoff::starting_at(500)),
            ..default_job()
        },
    );
    json_error::<SubmitJob>(
        br#"{"tasks":[{"kind":"handler","name":"noop"}],"retry_backoff":{"multiplier":2}}"#,
        &["missing field `initial_ms`"],
    );
}

#[test]
fn job_summary_with_speculative_copies() {
    let summary = JobSummary {
        speculative: Some(SpeculativeCounts {
            launched: 2,
            won: 1,
        }),
        ..running_summary()
    };
    let mut wire = serde_json::to_value(running_summary()).unwrap();
    wire["speculative"] = json!({"launched": 2, "won": 1});
    golden(&summary, wire);
}

#[test]
fn speculative_task_start_event() {
    let event = Event::SpeculativeTaskStart {
        time_ms: 1_700_000_001_201,
        job_id: 7,
        executor_id: exec("exec-1"),
        task_id: 4,
        index: 3,
        attempt: 1,
        copy_of: 0,
        running_ms: 201,
        threshold_ms: 200,
    };
    assert_eq!(event.kind(), "task.speculative");
    assert_eq!(event.job_id(), Some(7));
    golden(
        &event,
        json!({
            "type": "SpeculativeTaskStart",
            "time_ms": 1_700_000_001_201u64,
            "job_id": 7,
            "executor_id": "exec-1",
            "task_id": 4,
            "index": 3,
            "attempt": 1,
            "copy_of": 0,
            "running_ms": 201,
            "threshold_ms": 200
        }),
    );
}

#[test]
fn submit_job_with_a_submission_id() {
    let job = SubmitJob {
        submission_id: Some("nightly-2026-12-03".into()),
        ..default_job()
    };
    golden(
        &job,
        json!({
            "name": "",
            "tasks": [{"kind": "handler", "name": "noop", "arg": null}],
            "repeat": 1,
            "max_failures": 4,
            "cpus_per_task": 1,
            "submission_id": "nightly-2026-12-03"
        }),
    );
    json_error::<SubmitJob>(
        br#"{"tasks":[{"kind":"handler","name":"noop"}],"submission_id":7}"#,
        &["expected a string"],
    );
}

#[test]
fn unavailable() {
    golden(
        &ApiReply::Unavailable {
            message: "no driver of cluster prod can lead".into(),
        },
        json!({"type": "Unavailable", "message": "no driver of cluster prod can lead"}),
    );
}

#[test]
fn submit_job_after_other_jobs() {
    let mut job = default_job();
    job.after = vec![12, 13];
    job.after_any = vec![14];
    golden(
        &ApiRequest::SubmitJob(job),
        json!({
            "type": "SubmitJob",
            "name": "",
            "tasks": [{"kind": "handler", "name": "noop", "arg": null}],
            "repeat": 1,
            "max_failures": 4,
            "cpus_per_task": 1,
            "after": [12, 13],
            "after_any": [14]
        }),
    );
    json_error::<SubmitJob>(br#"{"tasks":[],"after":[-1]}"#, &["invalid value"]);
    json_error::<SubmitJob>(br#"{"tasks":[],"after":12}"#, &["invalid type"]);
}

#[test]
fn job_summary_of_a_job_waiting_for_others() {
    let summary = JobSummary {
        state: JobState::Waiting,
        running: 0,
        succeeded: 0,
        waiting: Some("runs after job 12, which has not ended".into()),
        waits_for: vec![12],
        ..running_summary()
    };
    let mut wire = running_summary_wire();
    wire["state"] = json!("WAITING");
    wire["running"] = json!(0);
    wire["succeeded"] = json!(0);
    wire["waiting"] = json!("runs after job 12, which has not ended");
    wire["waits_for"] = json!([12]);
    golden(
        &ApiReply::Job { job: summary },
        json!({"type": "Job", "job": wire}),
    );
}

#[test]
fn submit_job_with_timeouts() {
    let job = SubmitJob {
        timeouts: ember::protocol::JobTimeouts {
            queue_timeout_ms: Some(30_000),
            attempt_timeout_ms: Some(300_000),
            deadline_ms: Some(3_600_000),
        },
        ..default_job()
    };
    golden(
        &job,
        json!({
            "name": "",
            "tasks": [{"kind": "handler", "name": "noop", "arg": null}],
            "repeat": 1,
            "max_failures": 4,
            "cpus_per_task": 1,
            "queue_timeout_ms": 30000,
            "attempt_timeout_ms": 300000,
            "deadline_ms": 3600000
        }),
    );
    // Each is optional, and none is written unless set.
    decodes_to(
        json!({"tasks": [{"kind": "handler", "name": "noop"}], "deadline_ms": 60000}),
        &SubmitJob {
            timeouts: ember::protocol::JobTimeouts {
                deadline_ms: Some(60_000),
                ..Default::default()
            },
            ..default_job()
        },
    );
    json_error::<SubmitJob>(
        br#"{"tasks":[{"kind":"handler","name":"noop"}],"queue_timeout_ms":"5s"}"#,
        &["invalid type: string \"5s\", expected u64"],
    );
}

#[test]
fn a_failure_said_final() {
    let update = StatusUpdate {
        task_id: 7,
        attempt: 0,
        state: TaskState::Failed,
        result: Some(json!({"error": "the task raised: ValueError: no", "no_retry": true})),
        error: Some(
            "the task raised: ValueError: no (not retried: no_retry_on names ValueError)".into(),
        ),
        result_object: None,
        no_retry: true,
    };
    golden(
        &update,
        json!({
            "task_id": 7,
            "attempt": 0,
            "state": "FAILED",
            "result": {"error": "the task raised: ValueError: no", "no_retry": true},
            "error": "the task raised: ValueError: no (not retried: no_retry_on names ValueError)",
            "no_retry": true
        }),
    );
}

#[test]
fn task_spec_python_with_a_retry_policy() {
    let function = "gASVFAAAAAAAAACMCGJ1aWx0aW5zlIwDbGVulJOULg==";
    let args = "gASVDAAAAAAAAABDAmFilIWUfZSGlC4=";
    golden(
        &TaskSpec::Python {
            function: function.into(),
            args: args.into(),
            map: false,
            timeout_ms: None,
            function_object: None,
            args_object: None,
            objects: Vec::new(),
            upstream: Vec::new(),
            retry_on: vec!["ConnectionError".into(), "mylib.Throttled".into()],
            no_retry_on: vec!["ValueError".into()],
        },
        json!({
            "kind": "python",
            "function": function,
            "args": args,
            "retry_on": ["ConnectionError", "mylib.Throttled"],
            "no_retry_on": ["ValueError"]
        }),
    );
}

#[test]
fn wait_reasons() {
    use ember::protocol::WaitReason;
    let reasons = vec![
        WaitReason::After { jobs: vec![12] },
        WaitReason::StartGate {
            registered: 1,
            required: 4,
        },
        WaitReason::NoFit {
            message: "no executor has 8 cores; largest: 4".into(),
        },
        WaitReason::RetryBackoff {
            tasks: 3,
            until_ms: 1_700_000_000_000,
        },
        WaitReason::QueueTimeout {
            tasks: 5,
            until_ms: 1_700_000_030_000,
        },
        WaitReason::KeyConcurrency {
            key: "api".into(),
            running: 4,
            max_concurrent: 4,
        },
        WaitReason::KeyRate {
            key: "api".into(),
            rate: ember::protocol::Rate {
                count: 10,
                per_ms: 1000,
            },
            until_ms: 1_700_000_000_500,
        },
        WaitReason::GangNeeds {
            tasks: 8,
            cores: 16,
            free: 9,
        },
        WaitReason::GangStopping { running: 3 },
    ];
    // As a job summary's `waits` carries them, and reads them back.
    let wire = json!([
        {"kind": "after", "jobs": [12]},
        {"kind": "start_gate", "registered": 1, "required": 4},
        {"kind": "no_fit", "message": "no executor has 8 cores; largest: 4"},
        {"kind": "retry_backoff", "tasks": 3, "until_ms": 1700000000000u64},
        {"kind": "queue_timeout", "tasks": 5, "until_ms": 1700000030000u64},
        {"kind": "key_concurrency", "key": "api", "running": 4, "max_concurrent": 4},
        {"kind": "key_rate", "key": "api", "rate": {"count": 10, "per_ms": 1000},
         "until_ms": 1700000000500u64},
        {"kind": "gang_needs", "tasks": 8, "cores": 16, "free": 9},
        {"kind": "gang_stopping", "running": 3}
    ]);
    assert_eq!(serde_json::to_value(&reasons).unwrap(), wire);
    let read: Vec<WaitReason> = serde_json::from_value(wire).unwrap();
    assert_eq!(read, reasons);
    let text: Vec<String> = reasons.iter().map(ToString::to_string).collect();
    assert_eq!(
        text,
        [
            "runs after job 12, which has not ended",
            "offers wait on the start gate: 1 executor registered of the 4 required (or until \
             --max-registered-wait passes)",
            "no executor has 8 cores; largest: 4",
            "3 tasks wait out a retry backoff, the next until 2023-11-14T22:13:20Z",
            "5 tasks wait for a free core; the job fails at 2023-11-14T22:13:50Z if the first \
             has not started (queue timeout)",
            "concurrency key api runs 4 of its 4 at once",
            "concurrency key api is at its rate of 10/s; the next task may start at \
             2023-11-14T22:13:20Z",
            "the gang of 8 tasks needs 16 cores at once, and 9 are free to it",
            "the gang waits for 3 attempts to stop, to start again together",
        ]
    );
}

#[test]
fn concurrency_keys() {
    use ember::protocol::{KeyLimits, KeySummary, Rate};
    let limits = KeyLimits {
        max_concurrent: Some(4),
        rate: Some(Rate {
            count: 10,
            per_ms: 1000,
        }),
    };
    golden(
        &SubmitJob {
            concurrency_key: Some("api".into()),
            ..default_job()
        },
        json!({
            "name": "",
            "tasks": [{"kind": "handler", "name": "noop", "arg": null}],
            "repeat": 1,
            "max_failures": 4,
            "cpus_per_task": 1,
            "concurrency_key": "api"
        }),
    );
    golden(
        &ApiRequest::SetKeyLimits {
            key: "api".into(),
            limits,
        },
        json!({"type": "SetKeyLimits", "key": "api", "max_concurrent": 4,
               "rate": {"count": 10, "per_ms": 1000}}),
    );
    // Neither limit: the key's limits are cleared.
    golden(
        &ApiRequest::SetKeyLimits {
            key: "api".into(),
            limits: KeyLimits::default(),
        },
        json!({"type": "SetKeyLimits", "key": "api"}),
    );
    golden(&ApiRequest::ListKeys, json!({"type": "ListKeys"}));
    golden(
        &SubmitJob {
            gang: true,
            ..default_job()
        },
        json!({
            "name": "",
            "tasks": [{"kind": "handler", "name": "noop", "arg": null}],
            "repeat": 1,
            "max_failures": 4,
            "cpus_per_task": 1,
            "gang": true
        }),
    );
    golden(
        &ApiReply::Keys {
            keys: vec![
                KeySummary {
                    key: "api".into(),
                    limits,
                    running: 4,
                    jobs: 2,
                    started_in_window: Some(7),
                },
                KeySummary {
                    key: "free".into(),
                    limits: KeyLimits::default(),
                    running: 1,
                    jobs: 1,
                    started_in_window: None,
                },
            ],
        },
        json!({"type": "Keys", "keys": [
            {"key": "api", "max_concurrent": 4, "rate": {"count": 10, "per_ms": 1000},
             "running": 4, "jobs": 2, "started_in_window": 7},
            {"key": "free", "running": 1, "jobs": 1}
        ]}),
    );
    golden(
        &JournalRecord::KeyLimitsSet {
            key: "api".into(),
            limits: KeyLimits {
                max_concurrent: Some(4),
                rate: None,
            },
            time_ms: 1_700_000_000_000,
        },
        json!({"type": "KeyLimitsSet", "key": "api", "max_concurrent": 4,
               "time_ms": 1700000000000u64}),
    );
}
