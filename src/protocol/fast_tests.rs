//! The fast readers of the hot messages (`status_updates.rs`, `status_ack.rs`,
//! `launch_tasks.rs`, `groups.rs`) against their writers: what `encode` writes they read back,
//! and anything else they leave to serde.

use super::{
    encode, ExecutorMessage, Message, RefusedStatus, StatusReply, StatusRequest, StatusUpdate,
    TaskDescription, TaskSpec, TaskState,
};
use crate::ids::ExecutorId;
use serde_json::json;
use std::sync::Arc;

/// What the fast reader of `T` makes of `payload`.
fn decode<T: Message>(payload: &[u8]) -> Option<T> {
    T::decode_fast(payload)
}

fn task(task_id: u64, job_id: u64, spec: &Arc<TaskSpec>) -> TaskDescription {
    TaskDescription {
        task_id,
        job_id,
        index: 3,
        attempt: 1,
        cpus: 2,
        spec: Arc::clone(spec),
        resources: Default::default(),
        gang_peers: Vec::new(),
    }
}

fn launch() -> Vec<TaskDescription> {
    let noop = Arc::new(TaskSpec::Handler {
        name: "noop".into(),
        arg: serde_json::Value::Null,
    });
    let command = Arc::new(TaskSpec::Command {
        argv: vec!["sh".into(), "-c".into(), "echo \"hi\"\n".into()],
        env: [("A".to_string(), "é".to_string())].into(),
        cwd: Some("/tmp".into()),
        timeout_ms: Some(5),
        inputs: Default::default(),
        outputs: Vec::new(),
    });
    vec![
        task(u64::MAX, 7, &noop),
        task(0, 7, &noop),
        task(9, 8, &command),
        TaskDescription {
            resources: [("gpu".to_string(), vec!["0".to_string()])].into(),
            ..task(10, 8, &command)
        },
    ]
}

fn requests() -> Vec<StatusRequest> {
    let id = ExecutorId::parse("exec-1_A").unwrap();
    let failed = StatusUpdate {
        state: TaskState::Failed,
        error: Some("boom \"x\"\n".into()),
        result: Some(json!({"exit_code": 3, "nested": [[1.5], {"a": null}]})),
        ..StatusUpdate::finished(11, 2)
    };
    vec![
        StatusRequest::StatusUpdates {
            executor_id: id.clone(),
            updates: vec![
                StatusUpdate::finished(u64::MAX, u32::MAX),
                StatusUpdate::finished(0, 0),
                failed,
                StatusUpdate::finished(10, 7),
            ],
            driver_instance: Some(uuid::Uuid::new_v4()),
        },
        StatusRequest::StatusUpdates {
            executor_id: id,
            updates: Vec::new(),
            driver_instance: None,
        },
    ]
}

fn replies() -> Vec<StatusReply> {
    let refused = vec![RefusedStatus {
        task_id: 1,
        attempt: 0,
        reason: "stale \u{1}".into(),
    }];
    let ack = |accepted, refused, launch| StatusReply::StatusAck {
        accepted,
        refused,
        launch,
    };
    vec![
        ack(3, Vec::new(), launch()),
        ack(0, Vec::new(), Vec::new()),
        ack(1, refused.clone(), Vec::new()),
        ack(u32::MAX, refused, launch()),
    ]
}

fn launches() -> Vec<ExecutorMessage> {
    vec![
        ExecutorMessage::LaunchTasks {
            tasks: launch(),
            driver_instance: Some(uuid::Uuid::new_v4()),
        },
        ExecutorMessage::LaunchTasks {
            tasks: Vec::new(),
            driver_instance: None,
        },
    ]
}

#[test]
fn what_encode_writes_takes_the_fast_path_and_reads_back_the_same() {
    for message in requests() {
        assert_eq!(decode(&encode(&message)), Some(message));
    }
    for message in replies() {
        assert_eq!(decode(&encode(&message)), Some(message));
    }
    for message in launches() {
        assert_eq!(decode(&encode(&message)), Some(message));
    }
}

#[test]
fn anything_else_is_left_to_serde() {
    let declined = |text: &str| {
        let bytes = text.as_bytes();
        decode::<StatusRequest>(bytes).is_none()
            && decode::<StatusReply>(bytes).is_none()
            && decode::<ExecutorMessage>(bytes).is_none()
    };
    let valid_elsewhere = [
        // Whitespace, and keys in another order.
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[[1,0] ]}"#,
        r#"{"type":"StatusUpdates","updates":[[1,0]],"executor_id":"e"}"#,
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[[1,0]]} "#,
        r#"{"type":"StatusAck","refused":[],"accepted":1}"#,
        r#"{"type":"LaunchTasks","tasks":[{"cpus":1,"job_id":1,"spec":{"kind":"handler","name":"noop"},"tasks":[[1,0,0]]}]}"#,
        // An escaped id, an unknown field, an update written out in full.
        r#"{"type":"StatusUpdates","executor_id":"\u0065","updates":[]}"#,
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[],"extra":1}"#,
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[{"task_id":1,"attempt":0,"state":"FINISHED"} ]}"#,
        // Answers other than an ack, messages other than a launch.
        r#"{"type":"UnknownExecutor","message":"m"}"#,
        r#"{"type":"KillTask","task_id":1,"attempt":0,"reason":"r"}"#,
    ];
    let invalid = [
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[[01,0]]}"#,
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[[-1,0]]}"#,
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[[1.0,0]]}"#,
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[[1e3,0]]}"#,
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[[18446744073709551616,0]]}"#,
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[[1,4294967296]]}"#,
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[[1,0,0]]}"#,
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[[1,0],]}"#,
        r#"{"type":"StatusUpdates","executor_id":"a.b","updates":[]}"#,
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[],"driver_instance":"x"}"#,
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[]}}"#,
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[{"task_id":1,"attempt":0}]}"#,
        r#"{"type":"StatusUpdates","executor_id":"e","updates":[{"task_id":1,"attempt":0,"state":"FINISHED","state":"FAILED"}]}"#,
        r#"{"type":"StatusAck","accepted":1,"refused":[{"task_id":1,"attempt":0}]}"#,
        r#"{"type":"StatusAck","accepted":1,"refused":[[1,0,"r"]]}"#,
        r#"{"type":"LaunchTasks","tasks":[{"job_id":1,"cpus":1,"spec":{"kind":"handler","name":"noop"},"tasks":[]}]}"#,
        r#"{"type":"LaunchTasks","tasks":[{"job_id":1,"cpus":1,"spec":{"kind":"nope"},"tasks":[[1,0,0]]}]}"#,
        r#"{"type":"LaunchTasks","tasks":[{"job_id":1,"cpus":1,"spec":{"kind":"handler","name":"noop"},"tasks":[[1,0,0]]}]"#,
        r#"{"type":"LaunchTasks","tasks":[{"job_id":1,"cpus":1,"spec":{"kind":"handler","name":"noop"},"resources":[],"tasks":[[1,0,0]]}]}"#,
        r#"{"type":"LaunchTasks","tasks":[{"job_id":1,"cpus":1,"spec":{"kind":"handler","name":"noop"},"resources":{"gpu":[0]},"tasks":[[1,0,0]]}]}"#,
    ];
    for text in valid_elsewhere.iter().chain(&invalid) {
        assert!(declined(text), "took the fast path: {text}");
    }
    // The valid ones are serde's to read, and it reads them.
    for text in valid_elsewhere {
        let read = serde_json::from_str::<StatusRequest>(text).is_ok()
            || serde_json::from_str::<StatusReply>(text).is_ok()
            || serde_json::from_str::<ExecutorMessage>(text).is_ok();
        assert!(read, "serde refused {text}");
    }
}

#[test]
fn a_deeply_nested_spec_or_result_is_left_to_serde() {
    let mut arg = json!(1);
    for _ in 0..super::cursor::EMBEDDED_DEPTH {
        arg = json!([arg]);
    }
    let spec = Arc::new(TaskSpec::Handler {
        name: "echo".into(),
        arg: arg.clone(),
    });
    let launch = ExecutorMessage::LaunchTasks {
        tasks: vec![task(1, 1, &spec)],
        driver_instance: None,
    };
    let bytes = encode(&launch);
    assert_eq!(decode::<ExecutorMessage>(&bytes), None);
    assert_eq!(
        serde_json::from_slice::<ExecutorMessage>(&bytes).unwrap(),
        launch
    );
    let batch = StatusRequest::StatusUpdates {
        executor_id: ExecutorId::parse("e").unwrap(),
        updates: vec![StatusUpdate {
            result: Some(arg),
            ..StatusUpdate::finished(1, 0)
        }],
        driver_instance: None,
    };
    let bytes = encode(&batch);
    assert_eq!(decode::<StatusRequest>(&bytes), None);
    assert_eq!(
        serde_json::from_slice::<StatusRequest>(&bytes).unwrap(),
        batch
    );
}
