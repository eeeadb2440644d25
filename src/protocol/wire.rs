//! Faster decoding for the messages on the hot path (launches, status batches and their
//! answers, task specs).
//!
//! serde decodes an internally tagged enum by buffering the whole object first and then reading
//! it a second time; for a batch of thousands of updates that dominated the decode. These
//! structs read the same JSON in one pass, every field optional, and then build the enum,
//! reporting a missing field as serde would. They only read: the hot messages' writers are
//! beside their fast readers (`status_updates.rs`, `status_ack.rs`, `launch_tasks.rs`).

use super::groups::TaskList;
use super::{ExecutorMessage, RefusedStatus, StatusReply, StatusRequest, StatusUpdate, TaskSpec};
use crate::ids::{ExecutorId, InstanceId, TaskId};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

fn missing(field: &str) -> String {
    format!("missing field `{field}`")
}

#[derive(Deserialize)]
enum SpecKind {
    #[serde(rename = "handler")]
    Handler,
    #[serde(rename = "command")]
    Command,
    #[serde(rename = "python")]
    Python,
}

#[derive(Deserialize)]
pub(super) struct TaskSpecWire {
    kind: Option<SpecKind>,
    name: Option<String>,
    #[serde(default)]
    arg: Value,
    argv: Option<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    timeout_ms: Option<u64>,
    function: Option<String>,
    args: Option<String>,
    #[serde(default)]
    map: bool,
}

impl TryFrom<TaskSpecWire> for TaskSpec {
    type Error = String;
    fn try_from(w: TaskSpecWire) -> Result<Self, String> {
        match w.kind.ok_or_else(|| missing("kind"))? {
            SpecKind::Handler => Ok(TaskSpec::Handler {
                name: w.name.ok_or_else(|| missing("name"))?,
                arg: w.arg,
            }),
            SpecKind::Command => Ok(TaskSpec::Command {
                argv: w.argv.ok_or_else(|| missing("argv"))?,
                env: w.env,
                cwd: w.cwd,
                timeout_ms: w.timeout_ms,
            }),
            SpecKind::Python => Ok(TaskSpec::Python {
                function: base64_field("function", w.function)?,
                args: base64_field("args", w.args)?,
                map: w.map,
                timeout_ms: w.timeout_ms,
            }),
        }
    }
}

/// A python task's pickled field: present, not empty, and base64 in the standard alphabet
/// with padding (checked by its shape, not decoded, so a launch costs no copy of it).
fn base64_field(field: &str, value: Option<String>) -> Result<String, String> {
    let value = value.ok_or_else(|| missing(field))?;
    let bytes = value.as_bytes();
    let body = bytes
        .strip_suffix(b"==")
        .or_else(|| bytes.strip_suffix(b"="))
        .unwrap_or(bytes);
    let alphabet = |b: &u8| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/';
    if bytes.is_empty() || bytes.len() % 4 != 0 || !body.iter().all(alphabet) {
        return Err(format!(
            "a python task's `{field}` must be a pickle in base64 (standard alphabet, padded)"
        ));
    }
    Ok(value)
}

#[derive(Deserialize)]
enum MessageKind {
    LaunchTasks,
    KillTask,
    StopExecutor,
}

#[derive(Deserialize)]
pub(super) struct ExecutorMessageWire {
    #[serde(rename = "type")]
    kind: Option<MessageKind>,
    tasks: Option<TaskList>,
    driver_instance: Option<InstanceId>,
    task_id: Option<TaskId>,
    attempt: Option<u32>,
    reason: Option<String>,
}

impl TryFrom<ExecutorMessageWire> for ExecutorMessage {
    type Error = String;
    fn try_from(w: ExecutorMessageWire) -> Result<Self, String> {
        match w.kind.ok_or_else(|| missing("type"))? {
            MessageKind::LaunchTasks => Ok(ExecutorMessage::LaunchTasks {
                tasks: w.tasks.ok_or_else(|| missing("tasks"))?.0,
                driver_instance: w.driver_instance,
            }),
            MessageKind::KillTask => Ok(ExecutorMessage::KillTask {
                task_id: w.task_id.ok_or_else(|| missing("task_id"))?,
                attempt: w.attempt.ok_or_else(|| missing("attempt"))?,
                reason: w.reason.ok_or_else(|| missing("reason"))?,
                driver_instance: w.driver_instance,
            }),
            MessageKind::StopExecutor => Ok(ExecutorMessage::StopExecutor {
                reason: w.reason.ok_or_else(|| missing("reason"))?,
            }),
        }
    }
}

#[derive(Deserialize)]
enum StatusKind {
    StatusUpdates,
}

#[derive(Deserialize)]
pub(super) struct StatusRequestWire {
    #[serde(rename = "type")]
    kind: Option<StatusKind>,
    executor_id: Option<ExecutorId>,
    updates: Option<Vec<StatusUpdate>>,
    driver_instance: Option<InstanceId>,
}

impl TryFrom<StatusRequestWire> for StatusRequest {
    type Error = String;
    fn try_from(w: StatusRequestWire) -> Result<Self, String> {
        let StatusKind::StatusUpdates = w.kind.ok_or_else(|| missing("type"))?;
        Ok(StatusRequest::StatusUpdates {
            executor_id: w.executor_id.ok_or_else(|| missing("executor_id"))?,
            updates: w.updates.ok_or_else(|| missing("updates"))?,
            driver_instance: w.driver_instance,
        })
    }
}

#[derive(Deserialize)]
enum ReplyKind {
    StatusAck,
    UnknownExecutor,
    Error,
}

#[derive(Deserialize)]
pub(super) struct StatusReplyWire {
    #[serde(rename = "type")]
    kind: Option<ReplyKind>,
    accepted: Option<u32>,
    refused: Option<Vec<RefusedStatus>>,
    #[serde(default)]
    launch: TaskList,
    message: Option<String>,
}

impl TryFrom<StatusReplyWire> for StatusReply {
    type Error = String;
    fn try_from(w: StatusReplyWire) -> Result<Self, String> {
        let message = || w.message.clone().ok_or_else(|| missing("message"));
        match w.kind.as_ref().ok_or_else(|| missing("type"))? {
            ReplyKind::StatusAck => Ok(StatusReply::StatusAck {
                accepted: w.accepted.ok_or_else(|| missing("accepted"))?,
                refused: w.refused.ok_or_else(|| missing("refused"))?,
                launch: w.launch.0,
            }),
            ReplyKind::UnknownExecutor => Ok(StatusReply::UnknownExecutor {
                message: message()?,
            }),
            ReplyKind::Error => Ok(StatusReply::Error {
                message: message()?,
            }),
        }
    }
}
