//! Task kinds: named handlers (the built-ins `noop`, `sleep`, `echo`, `fail`, and any an
//! embedding program registers) and shell commands.

use crate::ids::{JobId, TaskId};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// How much of a command's stdout and stderr a result keeps: the last 64 KiB of each.
pub const OUTPUT_TAIL: usize = 64 * 1024;

/// What a handler knows about the task it runs.
#[derive(Debug, Clone)]
pub struct TaskContext {
    pub job_id: JobId,
    pub task_id: TaskId,
    pub index: u32,
    pub attempt: u32,
}

/// A handler's outcome: a JSON result, or an error message (the attempt FAILED).
pub type TaskResult = Result<Value, String>;

/// A handler an embedding program registers. It runs on tokio's blocking pool, so it may do
/// CPU work or blocking I/O without holding up heartbeats or statuses.
pub type BlockingHandler = Arc<dyn Fn(TaskContext, Value) -> TaskResult + Send + Sync>;

#[derive(Clone)]
pub(crate) enum Handler {
    /// Answers at once, on the messaging thread: for trivial built-ins.
    Inline(fn(&TaskContext, &Value) -> TaskResult),
    /// `sleep {ms}`: a timer, not a thread.
    Sleep,
    Blocking(BlockingHandler),
}

/// The named handlers an executor can run. A few names, looked up once per task: a sorted map
/// compares a short name or two where a hash map would hash it first.
#[derive(Clone)]
pub struct Handlers {
    map: BTreeMap<String, Handler>,
}

impl Default for Handlers {
    fn default() -> Self {
        Self::builtin()
    }
}

impl Handlers {
    /// The built-ins: `noop`, `sleep {ms}`, `echo {value}`, `fail {message}`.
    pub fn builtin() -> Self {
        let mut map = BTreeMap::new();
        map.insert("noop".into(), Handler::Inline(|_, _| Ok(Value::Null)));
        map.insert("echo".into(), Handler::Inline(echo));
        map.insert("fail".into(), Handler::Inline(fail));
        map.insert("sleep".into(), Handler::Sleep);
        Self { map }
    }

    /// Adds (or replaces) handler `name`.
    pub fn register(
        &mut self,
        name: impl Into<String>,
        handler: impl Fn(TaskContext, Value) -> TaskResult + Send + Sync + 'static,
    ) -> &mut Self {
        self.map
            .insert(name.into(), Handler::Blocking(Arc::new(handler)));
        self
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Handler> {
        self.map.get(name)
    }

    /// The names this executor can run, sorted.
    pub fn names(&self) -> Vec<String> {
        self.map.keys().cloned().collect()
    }
}

fn echo(_: &TaskContext, arg: &Value) -> TaskResult {
    Ok(arg.get("value").cloned().unwrap_or_else(|| arg.clone()))
}

fn fail(_: &TaskContext, arg: &Value) -> TaskResult {
    let message = arg
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("failed on purpose");
    Err(message.to_string())
}

/// How long `sleep` waits: `{"ms": N}`.
pub(crate) fn sleep_duration(arg: &Value) -> Result<Duration, String> {
    arg.get("ms")
        .and_then(Value::as_u64)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("sleep needs {{\"ms\": <milliseconds>}}; got {arg}"))
}

/// Runs a command: exit 0 is success; a non-zero exit, a signal or a timeout is a failure.
/// The result holds the exit code and the tails of stdout and stderr either way.
pub(crate) async fn run_command(
    context: &TaskContext,
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
    timeout: Option<Duration>,
) -> (TaskResult, Option<Value>) {
    let Some((program, args)) = argv.split_first() else {
        return (Err("empty argv".into()), None);
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .envs(env)
        .env("EMBER_TASK_INDEX", context.index.to_string())
        .env("EMBER_TASK_ID", context.task_id.to_string())
        .env("EMBER_JOB_ID", context.job_id.to_string())
        .env("EMBER_TASK_ATTEMPT", context.attempt.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return (Err(format!("could not start {program:?}: {e}")), None),
    };
    let stdout = child.stdout.take().map(read_tail);
    let stderr = child.stderr.take().map(read_tail);
    let waited = match timeout {
        Some(limit) => tokio::time::timeout(limit, child.wait()).await.ok(),
        None => Some(child.wait().await),
    };
    if waited.is_none() {
        let _ = child.kill().await;
    }
    let stdout = join_tail(stdout).await;
    let stderr = join_tail(stderr).await;
    let (code, error) = match waited {
        None => (
            None,
            Some(format!("timed out after {:?}", timeout.unwrap_or_default())),
        ),
        Some(Err(e)) => (None, Some(format!("could not wait for the command: {e}"))),
        Some(Ok(status)) if status.success() => (Some(0), None),
        Some(Ok(status)) => (
            status.code(),
            Some(match status.code() {
                Some(code) => format!("exited with code {code}: {}", last_line(&stderr)),
                None => format!("killed by a signal ({status})"),
            }),
        ),
    };
    let result = json!({ "exit_code": code, "stdout": stdout, "stderr": stderr });
    match error {
        None => (Ok(result), None),
        Some(e) => (Err(e), Some(result)),
    }
}

type Tail = tokio::task::JoinHandle<String>;

fn read_tail(mut pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static) -> Tail {
    tokio::spawn(async move {
        let mut tail: Vec<u8> = Vec::new();
        let mut buffer = vec![0u8; 16 * 1024];
        while let Ok(n) = pipe.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            tail.extend_from_slice(&buffer[..n]);
            if tail.len() > 2 * OUTPUT_TAIL {
                tail.drain(..tail.len() - OUTPUT_TAIL);
            }
        }
        if tail.len() > OUTPUT_TAIL {
            tail.drain(..tail.len() - OUTPUT_TAIL);
        }
        String::from_utf8_lossy(&tail).into_owned()
    })
}

async fn join_tail(tail: Option<Tail>) -> String {
    match tail {
        Some(handle) => handle.await.unwrap_or_default(),
        None => String::new(),
    }
}

fn last_line(text: &str) -> &str {
    text.trim_end().lines().last().unwrap_or("").trim()
}
