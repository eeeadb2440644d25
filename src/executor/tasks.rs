//! Task kinds: named handlers (the built-ins `noop`, `sleep`, `echo`, `fail`, and any an
//! embedding program registers) and shell commands.

use crate::ids::{JobId, TaskId};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How much of a command's stdout and stderr a result keeps: the last 64 KiB of each.
pub const OUTPUT_TAIL: usize = 64 * 1024;

/// What a handler knows about the task it runs.
#[derive(Debug, Clone)]
pub struct TaskContext {
    pub job_id: JobId,
    pub task_id: TaskId,
    pub index: u32,
    pub attempt: u32,
    /// The term of the driver that launched the attempt: with the task id and the attempt
    /// number, it names this run and no other (0 without a journal).
    pub term: u64,
    /// The addresses of the custom resources the driver gave this attempt (Spark's
    /// `TaskContext.resources()`); empty unless its job asked for some.
    pub resources: crate::resources::Addresses,
    /// A gang task's place in its gang: its peers, its port and its rank; `None` for other
    /// tasks. Its port is bound again by the executor once the last copy of the context is
    /// dropped, so a handler that hands its context elsewhere keeps the port its own.
    pub gang: Option<std::sync::Arc<super::GangSeat>>,
    /// Turns when the attempt is asked to stop (a `KillTask`, a timeout of the driver's, or
    /// its executor leaving): a handler that runs long should check it and return early. The
    /// attempt's cores stay busy until the handler returns, whatever it does with it.
    pub stop: StopToken,
}

/// Whether an attempt was asked to stop. Cheap to clone; the token of work that cannot be
/// stopped (one made by `default()`) never turns.
#[derive(Debug, Clone, Default)]
pub struct StopToken(Option<tokio::sync::watch::Receiver<bool>>);

impl StopToken {
    /// A token and what turns it.
    pub(crate) fn pair() -> (Stopper, StopToken) {
        let (sender, receiver) = tokio::sync::watch::channel(false);
        (Stopper(sender), StopToken(Some(receiver)))
    }

    /// Whether the attempt was asked to stop.
    pub fn is_stopped(&self) -> bool {
        self.0.as_ref().is_some_and(|stop| *stop.borrow())
    }

    /// Returns once the attempt is asked to stop; never, for work that cannot be.
    pub async fn stopped(&self) {
        let Some(mut stop) = self.0.clone() else {
            return std::future::pending().await;
        };
        // An error: the stopper is gone with the attempt's slot, and nothing will ask.
        if stop.wait_for(|stopped| *stopped).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// What asks an attempt to stop: kept with the attempt by its executor.
#[derive(Debug)]
pub(crate) struct Stopper(tokio::sync::watch::Sender<bool>);

impl Stopper {
    pub fn stop(&self) {
        self.0.send_replace(true);
    }
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
