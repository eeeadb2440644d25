//! Python tasks: a pool of warm Python worker processes, as PySpark's daemon keeps. Each worker
//! runs `python_worker.py` (embedded here) and takes one task at a time over its pipes: the
//! pickled function and arguments in, the pickled result or the exception and its traceback
//! out. A worker outlives its task, so a map's thousands of calls pay for one interpreter
//! start per worker, not per call.
//!
//! Workers start on the first python task and are kept, at most one per slot of the pool. A
//! worker that dies, hangs past the task's timeout, breaks the framing or whose task is killed
//! is stopped (SIGTERM to its process group, so what it started ends too, and SIGKILL
//! [`KILL_GRACE`](super::command::KILL_GRACE) later to what is left, as for commands) and fails
//! only that task; the next task starts a new one in its place.

use super::command::{Group, KILL_GRACE};
use super::tasks::{TaskContext, TaskResult};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::{json, Value};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::Semaphore;

/// The worker's program, run as `<interpreter> -c <script>`.
const WORKER_SCRIPT: &str = include_str!("python_worker.py");

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

/// How long a new worker has to import what it needs and say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest answer a worker may send: the driver's default limit on one task's result.
pub const MAX_ANSWER_BYTES: usize = 256 << 20;

/// How long a worker that broke off is waited for, to say how it ended, before it is killed.
const EXIT_WAIT: Duration = Duration::from_millis(500);

/// How an executor runs python tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonConfig {
    /// The interpreter to start workers with: a name looked up on PATH, or a path.
    pub interpreter: String,
    /// The most workers at once; 0 for one per core.
    pub workers: u32,
}

impl Default for PythonConfig {
    fn default() -> Self {
        Self {
            interpreter: DEFAULT_INTERPRETER.into(),
            workers: 0,
        }
    }
}

/// The warm workers of one executor.
pub(crate) struct PythonPool {
    interpreter: String,
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
        // The files of what the task names in the object store, if it names any.
        if let (Value::Object(request), Value::Object(files)) = (&mut request, files) {
            request.extend(files);
        }
        let answered = match worker.send(&request).await {
            Err(e) => Err(e),
            Ok(()) => {
                let answer = tokio::select! {
                    answer = worker.read() => Some(answer),
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
                self.keep(worker);
                outcome(answer)
            }
            Err(e) => {
                let ended = worker.end().await;
                (
                    Err(format!(
                        "the python worker running the task {e}{ended}; a new worker takes \
                         its place"
                    )),
                    None,
                )
            }
        }
    }

    /// Puts a worker that answered back among the idle ones.
    fn keep(&self, worker: Worker) {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(worker);
    }

    /// Stops the call `worker` runs, which was asked to stop: `KeyboardInterrupt` in it
    /// (SIGINT to the worker), and if it has not answered within [`KILL_GRACE`] the worker and
    /// all it started are killed (a new one takes its place). Returns once the call is over.
    async fn interrupt(&self, mut worker: Worker) -> (TaskResult, Option<Value>) {
        if let Some(pid) = worker.child.id() {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGINT);
        }
        match tokio::time::timeout(KILL_GRACE, worker.read()).await {
            Ok(Ok(answer)) => {
                self.keep(worker);
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
            if matches!(worker.child.try_wait(), Ok(None)) {
                return Some(worker);
            }
        }
        None
    }
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

/// One worker process, the leader of a process group of its own.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    group: Option<Group>,
}

impl Worker {
    /// Starts a worker and waits for its first frame, which says it is ready.
    async fn start(interpreter: &str) -> Result<Worker, String> {
        let mut command = tokio::process::Command::new(interpreter);
        command
            .arg("-c")
            .arg(WORKER_SCRIPT)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            // Its group is stopped with a grace period when the worker is dropped; killing the
            // leader at once would cut the grace short.
            .kill_on_drop(false);
        let mut child = command
            .spawn()
            .map_err(|e| format!("could not start the python interpreter {interpreter:?}: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the python worker's pipes were not set up".into());
        };
        let group = child.id().map(|pid| Group(Pid::from_raw(pid as i32)));
        let mut worker = Worker {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            group,
        };
        let why = match tokio::time::timeout(START_TIMEOUT, worker.read()).await {
            Ok(Ok(ready)) if ready.get("ready").is_some() => return Ok(worker),
            Ok(Ok(other)) => format!("began with {other} instead of saying it was ready"),
            Ok(Err(e)) => e,
            Err(_) => format!("was not ready within {START_TIMEOUT:?}"),
        };
        let ended = worker.end().await;
        Err(format!(
            "the python worker ({interpreter}) {why}{ended}; its standard error is in the \
             executor's"
        ))
    }

    /// Sends one request; its answer is the next frame [`Worker::read`] reads.
    async fn send(&mut self, request: &Value) -> Result<(), String> {
        let body = serde_json::to_vec(request).map_err(|e| format!("could not be sent it: {e}"))?;
        let length = u32::try_from(body.len())
            .map_err(|_| format!("could not be sent a request of {} bytes", body.len()))?;
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&length.to_be_bytes());
        frame.extend_from_slice(&body);
        let sent = async {
            self.stdin.write_all(&frame).await?;
            self.stdin.flush().await
        };
        sent.await
            .map_err(|e| format!("could not be sent the task ({e})"))
    }

    /// Reads one frame: 4 bytes of big-endian length, then that much JSON.
    async fn read(&mut self) -> Result<Value, String> {
        let mut head = [0u8; 4];
        self.stdout
            .read_exact(&mut head)
            .await
            .map_err(|_| "exited".to_string())?;
        let length = u32::from_be_bytes(head) as usize;
        if length > MAX_ANSWER_BYTES {
            return Err(format!(
                "answered with {length} bytes, more than the limit of {MAX_ANSWER_BYTES}"
            ));
        }
        let mut body = vec![0u8; length];
        self.stdout
            .read_exact(&mut body)
            .await
            .map_err(|_| "exited in the middle of its answer".to_string())?;
        serde_json::from_slice(&body).map_err(|e| format!("answered with bad JSON ({e})"))
    }

    /// Stops the worker (its whole group), and says how it ended if it had: " (exit status
    /// ...)" or "".
    async fn end(&mut self) -> String {
        let ended = match tokio::time::timeout(EXIT_WAIT, self.child.wait()).await {
            Ok(Ok(status)) => format!(" ({status})"),
            _ => String::new(),
        };
        self.kill();
        ended
    }

    /// SIGKILL to the worker's whole group at once (its grace is over), and a bounded wait for
    /// the worker's exit.
    async fn kill_now(&mut self) {
        match &self.group {
            Some(group) => drop(group.signal(Signal::SIGKILL)),
            None => drop(self.child.start_kill()),
        }
        let _ = tokio::time::timeout(EXIT_WAIT, self.child.wait()).await;
    }

    /// SIGTERM to the worker's group, and SIGKILL to what is left of it after the grace
    /// period; the worker alone at once if it has no group.
    fn kill(&mut self) {
        match self.group.take() {
            Some(group) => drop(group),
            None => drop(self.child.start_kill()),
        }
    }
}

impl Drop for Worker {
    /// A worker dropped in the middle of a task (the task was killed or timed out, or its
    /// executor stops) ends with everything it started.
    fn drop(&mut self) {
        self.kill();
    }
}
