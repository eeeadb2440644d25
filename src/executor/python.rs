//! Python tasks: a pool of warm Python worker processes, as PySpark's daemon keeps. Each worker
//! runs `python_worker.py` ([`super::python_worker`] starts it and speaks its frames) and takes
//! one task at a time over its pipes: the pickled function and arguments in, the pickled result
//! or the exception and its traceback out. A worker outlives its task, so a map's thousands of
//! calls pay for one interpreter start per worker, not per call.
//!
//! Workers start on the first python task and are kept, at most one per slot of the pool. A
//! worker that dies, hangs past the task's timeout, breaks the framing or whose task is killed
//! is stopped (SIGTERM to its process group, so what it started ends too, and SIGKILL
//! [`KILL_GRACE`] later to what is left, as for commands) and fails only that task; the next
//! task starts a new one in its place. As Celery's `max_tasks_per_child` and
//! `max_memory_per_child`, a worker that has answered `max_tasks` calls, or has grown past
//! `max_rss`, is retired after its answer; one that grows past `max_rss` during a call is
//! killed with the call. A worker the kernel's out-of-memory killer killed is named as such.

use super::command::KILL_GRACE;
use super::memory::{show_size, MemoryCgroup};
use super::python_worker::{how_it_ended, Broke, Worker};
use super::tasks::{TaskContext, TaskResult};
use serde_json::{json, Value};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Semaphore;
use tracing::debug;

/// The interpreter a worker runs unless `--python` names another and none is beside the
/// executor ([`default_interpreter`]).
pub const DEFAULT_INTERPRETER: &str = "python3";

/// The interpreter an executor's workers run unless told: the `python` beside the executor's
/// own executable when there is one (a virtualenv's, when Ember was installed into it with pip,
/// so that workers unpickle with the clients' cloudpickle), else [`DEFAULT_INTERPRETER`].
pub fn default_interpreter() -> String {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("python")));
    match beside.filter(|path| path.is_file()) {
        // Not canonicalized: a virtualenv's python is a link that knows its virtualenv only
        // through the path it is started by.
        Some(path) => path.display().to_string(),
        None => DEFAULT_INTERPRETER.into(),
    }
}

/// How an executor runs python tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonConfig {
    /// The interpreter to start workers with: a name looked up on PATH, or a path.
    pub interpreter: String,
    /// The most workers at once; 0 for one per core.
    pub workers: u32,
    /// The calls a worker answers before it is retired (`--python-max-tasks`); `None` for no
    /// limit.
    pub max_tasks: Option<u32>,
    /// The resident set in bytes past which a worker is retired after its call, or killed
    /// during one (`--python-max-rss`); `None` for no limit.
    pub max_rss: Option<u64>,
}

impl Default for PythonConfig {
    fn default() -> Self {
        Self {
            interpreter: DEFAULT_INTERPRETER.into(),
            workers: 0,
            max_tasks: None,
            max_rss: None,
        }
    }
}

/// The warm workers of one executor.
pub(crate) struct PythonPool {
    interpreter: String,
    max_tasks: Option<u32>,
    max_rss: Option<u64>,
    /// The executor's memory cgroup, whose out-of-memory kills tell a worker the kernel killed.
    cgroup: Option<MemoryCgroup>,
    /// Workers between tasks.
    idle: Mutex<Vec<Worker>>,
    /// One permit per worker that may run at once.
    slots: Semaphore,
}

impl PythonPool {
    pub fn new(config: &PythonConfig, cores: u32) -> Self {
        let workers = if config.workers == 0 {
            cores
        } else {
            config.workers
        };
        Self {
            interpreter: config.interpreter.clone(),
            max_tasks: config.max_tasks,
            max_rss: config.max_rss,
            cgroup: MemoryCgroup::of_self(),
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(workers.max(1) as usize),
        }
    }

    /// Runs one python task to its end: the pickled result, or why it failed with what the
    /// worker said of it (the exception's type, traceback and pickle) as the detail. The
    /// timeout counts from the call, the wait for a free worker included.
    pub async fn run(
        &self,
        context: &TaskContext,
        function: &str,
        args: &str,
        map: bool,
        files: Value,
        timeout: Option<Duration>,
    ) -> (TaskResult, Option<Value>) {
        let work = self.call(context, function, args, map, files);
        match timeout {
            None => work.await,
            // A worker still running when the time is up is dropped with the call: killed.
            Some(limit) => match tokio::time::timeout(limit, work).await {
                Ok(outcome) => outcome,
                Err(_) => (
                    Err(format!(
                        "timed out after {limit:?}; its python worker was stopped"
                    )),
                    None,
                ),
            },
        }
    }

    async fn call(
        &self,
        context: &TaskContext,
        function: &str,
        args: &str,
        map: bool,
        files: Value,
    ) -> (TaskResult, Option<Value>) {
        let Ok(_slot) = self.slots.acquire().await else {
            return (Err("the python worker pool is closed".into()), None);
        };
        let mut worker = match self.take_idle() {
            Some(worker) => worker,
            None => match Worker::start(&self.interpreter).await {
                Ok(worker) => worker,
                Err(e) => return (Err(e), None),
            },
        };
        let oom_kills = self.cgroup.as_ref().and_then(MemoryCgroup::oom_kills);
        let request = request(context, function, args, map, files);
        let answered = match worker.send(&request).await {
            Err(e) => Err(Broke::Off(e)),
            Ok(()) => {
                let answer = tokio::select! {
                    answer = worker.answer(self.max_rss) => Some(answer),
                    () = context.stop.stopped() => None,
                };
                match answer {
                    Some(answer) => answer,
                    None => return self.interrupt(worker).await,
                }
            }
        };
        match answered {
            Ok(answer) => {
                self.done_with(worker);
                outcome(answer)
            }
            Err(broke) => (Err(self.give_up(worker, broke, oom_kills).await), None),
        }
    }

    /// Ends a worker whose call got no answer, and says why for the task's error.
    /// `oom_kills` is the cgroup's count of out-of-memory kills when the call began.
    async fn give_up(&self, mut worker: Worker, broke: Broke, oom_kills: Option<u64>) -> String {
        let replaced = "a new worker takes its place";
        match broke {
            Broke::TooLarge(rss) => {
                worker.kill_now().await;
                let max = show_size(self.max_rss.unwrap_or_default());
                format!(
                    "its python worker used {}, more than the executor's --python-max-rss of \
                     {max}, and was killed; {replaced}",
                    show_size(rss)
                )
            }
            Broke::Off(e) => {
                let ended = worker.end().await;
                match ended.filter(|status| self.oom_killed(*status, oom_kills)) {
                    Some(_) => format!("{}; {replaced}", self.oom_reason(worker.last_rss)),
                    None => format!(
                        "the python worker running the task {e}{}; {replaced}",
                        how_it_ended(ended)
                    ),
                }
            }
        }
    }

    /// Whether a worker that ended with `status` was killed by the out-of-memory killer: by
    /// SIGKILL, with the cgroup's count of such kills up since the call began (from
    /// `before`).
    fn oom_killed(&self, status: ExitStatus, before: Option<u64>) -> bool {
        let now = self.cgroup.as_ref().and_then(MemoryCgroup::oom_kills);
        status.signal() == Some(nix::libc::SIGKILL)
            && matches!((before, now), (Some(before), Some(now)) if now > before)
    }

    /// What the task's error says of a worker the out-of-memory killer killed.
    fn oom_reason(&self, last_rss: Option<u64>) -> String {
        let had = match last_rss {
            Some(rss) => format!("it had {} resident at the last look", show_size(rss)),
            None => "its resident set had not been looked at yet".into(),
        };
        let limit = match self.cgroup.as_ref().and_then(MemoryCgroup::limit) {
            Some(limit) => format!("the executor's cgroup limit is {}", show_size(limit)),
            None => "the executor's cgroup has no limit of its own".into(),
        };
        format!(
            "its python worker was killed by the kernel's out-of-memory killer ({had}; {limit})"
        )
    }

    /// Puts a worker that answered back among the idle ones, or retires it when it has
    /// answered its `max_tasks` calls or grown past `max_rss`.
    fn done_with(&self, mut worker: Worker) {
        worker.calls += 1;
        let used_up = self.max_tasks.is_some_and(|max| worker.calls >= max);
        let too_large = match self.max_rss {
            Some(max) => worker.look_at_rss().is_some_and(|rss| rss > max),
            None => false,
        };
        if used_up || too_large {
            debug!(
                calls = worker.calls,
                rss = worker.last_rss,
                used_up,
                too_large,
                "python worker retired"
            );
            worker.retire();
            return;
        }
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(worker);
    }

    /// Stops the call `worker` runs, which was asked to stop: `KeyboardInterrupt` in it
    /// (SIGINT to the worker), and if it has not answered within [`KILL_GRACE`] the worker and
    /// all it started are killed (a new one takes its place). Returns once the call is over.
    async fn interrupt(&self, mut worker: Worker) -> (TaskResult, Option<Value>) {
        worker.interrupt();
        match tokio::time::timeout(KILL_GRACE, worker.read()).await {
            Ok(Ok(answer)) => {
                self.done_with(worker);
                (Err("stopped by request: interrupted".into()), Some(answer))
            }
            _ => {
                worker.kill_now().await;
                let error = format!(
                    "stopped by request: its python worker did not stop within {KILL_GRACE:?} \
                     of the interrupt and was killed"
                );
                (Err(error), None)
            }
        }
    }

    /// An idle worker that is still alive, if there is one.
    fn take_idle(&self) -> Option<Worker> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(mut worker) = idle.pop() {
            if worker.is_alive() {
                return Some(worker);
            }
        }
        None
    }
}

/// The request of one call: the pickles, what the task sees of itself, and the files of what
/// it names in the object store, if it names any.
fn request(context: &TaskContext, function: &str, args: &str, map: bool, files: Value) -> Value {
    let mut request = json!({
        "function": function,
        "args": args,
        "map": map,
        "job_id": context.job_id,
        "task_id": context.task_id,
        "index": context.index,
        "attempt": context.attempt,
        "term": context.term,
        // Set in the worker's environment for this call only, as a command task gets them.
        "resources": context.resources,
    });
    if let (Value::Object(request), Some(gang)) = (&mut request, &context.gang) {
        let env: serde_json::Map<String, Value> = gang
            .env()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into()))
            .collect();
        request.insert("gang".into(), Value::Object(env));
    }
    if let (Value::Object(request), Value::Object(files)) = (&mut request, files) {
        request.extend(files);
    }
    request
}

/// What a worker's answer makes of the task: `{"pickle": <b64>}` for a result, or the error
/// (with the remote traceback) and the answer itself as the failed attempt's detail.
fn outcome(answer: Value) -> (TaskResult, Option<Value>) {
    if let Some(pickle) = answer.get("ok").and_then(Value::as_str) {
        return (Ok(json!({ "pickle": pickle })), None);
    }
    let error = answer
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("the python worker answered neither a result nor an error");
    let message = match answer.get("traceback").and_then(Value::as_str) {
        Some(traceback) if !traceback.is_empty() => {
            format!("{error}\n{}", traceback.trim_end())
        }
        _ => error.to_string(),
    };
    (Err(message), Some(answer))
}
