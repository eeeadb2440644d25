//! Task work: starts each launched attempt as its kind requires, and turns its outcome (a
//! result or an error) into its terminal [`StatusUpdate`].

use super::gang_ports::GangPorts;
use super::machine::{Run, Started};
use super::python::PythonPool;
use super::staging::{fetch_pickles, run_staged, ObjectAccess};
use super::tasks::{sleep_duration, Handler, Handlers, TaskContext, TaskResult};
use crate::ids::TaskId;
use crate::metrics::ExecutorMetrics;
use crate::protocol::{StatusUpdate, TaskDescription, TaskSpec, TaskState};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

/// A running attempt's work, as its executor keeps it: what stops it when it is killed.
#[derive(Debug, Default)]
pub(crate) struct Work {
    /// Work that stops the moment it is aborted (a sleep).
    abort: Option<AbortHandle>,
    /// Work that is asked to stop and ends once it has (a command's process group, a python
    /// worker, a blocking handler that checks its token): its end comes when it has stopped.
    stopper: Option<super::tasks::Stopper>,
}

impl super::machine::Cancel for Work {
    fn cancel(&mut self) -> bool {
        if let Some(stopper) = &self.stopper {
            stopper.stop();
            return false;
        }
        self.abort.take().map(|handle| handle.abort()).is_some()
    }

    /// A blocking handler: asked to stop, with nothing to abort. Commands and python calls
    /// have a task to abort too, and are killed once their grace is over.
    fn may_ignore_stop(&self) -> bool {
        self.stopper.is_some() && self.abort.is_none()
    }
}

impl Work {
    fn aborted_by(handle: AbortHandle) -> Self {
        Work {
            abort: Some(handle),
            stopper: None,
        }
    }
}

/// An attempt's end, sent by the task that ran it.
pub(crate) struct Done {
    /// The run it ended, as the machine numbered it.
    run: Run,
    task_id: TaskId,
    attempt: u32,
    outcome: Outcome,
    /// A result kept even when the attempt failed (a command's output).
    detail: Option<Value>,
}

/// Starts launched attempts; ends of attempts that run in the background arrive on the receiver
/// [`Runner::new`] returns. Which attempts hold the slots is the executor machine's business.
pub(crate) struct Runner {
    handlers: Handlers,
    done: mpsc::UnboundedSender<Done>,
    /// The largest status batch: a result done at once that would not fit in one goes the
    /// way of work done in the background, for the executor's loop to store in chunks.
    status_limit: usize,
    /// Where attempts started and their run times are counted.
    metrics: Arc<ExecutorMetrics>,
    /// The warm Python workers; none where python tasks are refused (`--no-python`).
    python: Option<Arc<PythonPool>>,
    /// The object store and the executor's cache of it.
    objects: Option<Arc<ObjectAccess>>,
    /// The ports reserved for gang tasks, lent to each while its work runs.
    gang_ports: Option<Arc<GangPorts>>,
}

impl Done {
    /// The run that ended, and the attempt's terminal status.
    pub fn into_end(self) -> (Run, StatusUpdate) {
        let end = match self.outcome {
            Outcome::Ran(outcome) => status(self.task_id, self.attempt, outcome, self.detail),
            Outcome::Status(status) => status,
        };
        (self.run, end)
    }

    /// The end of work done at once, sent the way of work done in the background.
    fn from_status(run: Run, status: StatusUpdate) -> Self {
        Self {
            run,
            task_id: status.task_id,
            attempt: status.attempt,
            outcome: Outcome::Status(status),
            detail: None,
        }
    }
}

/// How an attempt ended: what its work returned, or its status already made.
enum Outcome {
    Ran(TaskResult),
    Status(StatusUpdate),
}

impl Runner {
    pub fn new(
        handlers: Handlers,
        status_limit: usize,
        metrics: Arc<ExecutorMetrics>,
        python: Option<Arc<PythonPool>>,
        objects: Option<Arc<ObjectAccess>>,
        gang_ports: Option<Arc<GangPorts>>,
    ) -> (Self, mpsc::UnboundedReceiver<Done>) {
        let (done, ends) = mpsc::unbounded_channel();
        let runner = Self {
            handlers,
            done,
            status_limit,
            metrics,
            python,
            objects,
            gang_ports,
        };
        (runner, ends)
    }

    /// Starts one attempt as run `run`: its end, for work done at once, or what stops work
    /// that goes on in the background, whose end names the run.
    pub fn start(&self, task: &TaskDescription, run: Run, term: u64) -> Started<Work> {
        let mut context = TaskContext {
            job_id: task.job_id,
            task_id: task.task_id,
            index: task.index,
            attempt: task.attempt,
            term,
            resources: task.resources.clone(),
            gang: match task.gang_peers.is_empty() {
                true => None,
                false => self.gang_ports.as_ref().and_then(|ports| ports.seat(task)),
            },
            stop: Default::default(),
        };
        // Work that stops when asked and ends once it has gets a token of its own (below); a
        // sleep is aborted, and work done at once has nothing to stop.
        let stoppable = |context: &mut TaskContext| {
            let (stopper, token) = super::tasks::StopToken::pair();
            context.stop = token;
            Some(stopper)
        };
        let (task_id, attempt) = (task.task_id, task.attempt);
        self.metrics.launched();
        let started = Instant::now();
        // For work that ends in the background: sends its end to the executor's loop. Built
        // only there, so that work done at once costs no clone of the sender.
        let reporter = || {
            let (done, metrics) = (self.done.clone(), self.metrics.clone());
            move |outcome, detail| {
                metrics.ran(started.elapsed());
                let _ = done.send(Done {
                    run,
                    task_id,
                    attempt,
                    outcome: Outcome::Ran(outcome),
                    detail,
                });
            }
        };
        let abort = match task.spec.as_ref() {
            TaskSpec::Handler { name, arg } => match self.handlers.get(name) {
                None => {
                    let error = format!(
                        "no handler named {name:?} on this executor (it has {})",
                        self.handlers.names().join(", ")
                    );
                    return self.ended(started, status(task_id, attempt, Err(error), None));
                }
                Some(Handler::Inline(f)) => {
                    let end = status(task_id, attempt, f(&context, arg), None);
                    if !super::result_objects::too_large(&end, self.status_limit) {
                        return self.ended(started, end);
                    }
                    self.metrics.ran(started.elapsed());
                    let _ = self.done.send(Done::from_status(run, end));
                    Work::default()
                }
                Some(Handler::Sleep) => match sleep_duration(arg) {
                    Err(e) => return self.ended(started, status(task_id, attempt, Err(e), None)),
                    Ok(pause) => {
                        let report = reporter();
                        let work = tokio::spawn(async move {
                            tokio::time::sleep(pause).await;
                            report(Ok(Value::Null), None);
                        });
                        Work::aborted_by(work.abort_handle())
                    }
                },
                Some(Handler::Blocking(f)) => {
                    let stopper = stoppable(&mut context);
                    let (f, arg, report) = (f.clone(), arg.clone(), reporter());
                    tokio::task::spawn_blocking(move || report(f(context, arg), None));
                    Work {
                        abort: None,
                        stopper,
                    }
                }
            },
            TaskSpec::Command { timeout_ms, .. } => {
                let (spec, objects) = (task.spec.clone(), self.objects.clone());
                let timeout = timeout_ms.map(Duration::from_millis);
                let report = reporter();
                let stopper = stoppable(&mut context);
                let work = tokio::spawn(async move {
                    let TaskSpec::Command {
                        argv,
                        env,
                        cwd,
                        inputs,
                        outputs,
                        ..
                    } = spec.as_ref()
                    else {
                        unreachable!("matched as a command above");
                    };
                    let (outcome, detail) = run_staged(
                        objects.as_deref(),
                        &context,
                        argv,
                        env,
                        cwd.as_deref(),
                        timeout,
                        inputs,
                        outputs,
                    )
                    .await;
                    report(outcome, detail);
                });
                Work {
                    abort: Some(work.abort_handle()),
                    stopper,
                }
            }
            TaskSpec::Python { timeout_ms, .. } => {
                let Some(pool) = self.python.clone() else {
                    let error = "this executor runs no python tasks (it was started with \
                                 --no-python)";
                    return self.ended(started, status(task_id, attempt, Err(error.into()), None));
                };
                let (spec, timeout) = (task.spec.clone(), timeout_ms.map(Duration::from_millis));
                let objects = self.objects.clone();
                let report = reporter();
                let stopper = stoppable(&mut context);
                let work = tokio::spawn(async move {
                    let TaskSpec::Python {
                        function,
                        args,
                        map,
                        retry_on,
                        no_retry_on,
                        ..
                    } = spec.as_ref()
                    else {
                        unreachable!("matched as a python task above");
                    };
                    let (outcome, detail) = match fetch_pickles(objects.as_deref(), &spec).await {
                        Ok((mut files, _held)) => {
                            retry_policy(&mut files, retry_on, no_retry_on);
                            pool.run(&context, function, args, *map, files, timeout)
                                .await
                        }
                        Err(error) => (Err(error), None),
                    };
                    report(outcome, detail);
                });
                Work {
                    abort: Some(work.abort_handle()),
                    stopper,
                }
            }
        };
        Started::Running(abort)
    }

    /// An attempt ended as it started, `started` then: counted, and its end.
    fn ended(&self, started: Instant, end: StatusUpdate) -> Started<Work> {
        self.metrics.ran(started.elapsed());
        Started::Ended(end)
    }
}

/// Adds a python task's `retry_on` and `no_retry_on` to what its worker is told, when it
/// names any: the worker says of a failure whether it may run again.
fn retry_policy(request: &mut Value, retry_on: &[String], no_retry_on: &[String]) {
    if retry_on.is_empty() && no_retry_on.is_empty() {
        return;
    }
    if !request.is_object() {
        *request = Value::Object(Default::default());
    }
    request["retry_on"] = serde_json::json!(retry_on);
    request["no_retry_on"] = serde_json::json!(no_retry_on);
}

/// A failure is final when its detail says so: a python worker's `"no_retry": true`.
fn said_final(detail: Option<&Value>) -> bool {
    detail
        .and_then(|d| d.get("no_retry"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

fn status(
    task_id: TaskId,
    attempt: u32,
    outcome: TaskResult,
    detail: Option<Value>,
) -> StatusUpdate {
    match outcome {
        Ok(result) => StatusUpdate {
            task_id,
            attempt,
            state: TaskState::Finished,
            result: (!result.is_null()).then_some(result),
            error: None,
            result_object: None,
            no_retry: false,
        },
        Err(error) => StatusUpdate {
            task_id,
            attempt,
            state: TaskState::Failed,
            no_retry: said_final(detail.as_ref()),
            result: detail,
            error: Some(error),
            result_object: None,
        },
    }
}
