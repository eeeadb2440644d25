//! Task slots: starts each launched attempt as its kind requires, and turns every way an attempt
//! can end (a result, an error, a kill) into exactly one terminal [`StatusUpdate`].

use super::tasks::{run_command, sleep_duration, Handler, Handlers, TaskContext, TaskResult};
use crate::ids::TaskId;
use crate::protocol::{RunningAttempt, StatusUpdate, TaskDescription, TaskSpec, TaskState};
use serde_json::Value;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tracing::warn;

/// An attempt's end, sent by the task that ran it.
pub(crate) struct Done {
    task_id: TaskId,
    attempt: u32,
    outcome: TaskResult,
    /// A result kept even when the attempt failed (a command's output).
    detail: Option<Value>,
}

struct Running {
    attempt: u32,
    cpus: u32,
    /// Set for work that can be cancelled (timers, processes).
    abort: Option<AbortHandle>,
    /// A kill that arrived while blocking work ran: its end will report KILLED.
    killed: bool,
}

/// The attempts running on this executor.
pub(crate) struct Runner {
    handlers: Handlers,
    cores: u32,
    running: HashMap<TaskId, Running>,
    done: mpsc::UnboundedSender<Done>,
}

impl Runner {
    /// A runner of `cores` slots; ends of attempts that run in the background arrive on the
    /// returned receiver and go back through [`Runner::finish`].
    pub fn new(handlers: Handlers, cores: u32) -> (Self, mpsc::UnboundedReceiver<Done>) {
        let (done, ends) = mpsc::unbounded_channel();
        let runner = Self {
            handlers,
            cores,
            running: HashMap::new(),
            done,
        };
        (runner, ends)
    }

    /// The attempts running now.
    pub fn running(&self) -> impl Iterator<Item = RunningAttempt> + '_ {
        self.running.iter().map(|(task_id, r)| RunningAttempt {
            task_id: *task_id,
            attempt: r.attempt,
        })
    }

    pub fn len(&self) -> usize {
        self.running.len()
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Gives up every running attempt: cancellable work stops; blocking work runs on but its
    /// end is ignored. Returns the attempts given up.
    pub fn abandon_all(&mut self) -> Vec<(TaskId, u32)> {
        self.running
            .drain()
            .map(|(task_id, r)| {
                if let Some(handle) = r.abort {
                    handle.abort();
                }
                (task_id, r.attempt)
            })
            .collect()
    }

    /// Starts one attempt and returns its first status: its end, for work done at once, or
    /// RUNNING for work that goes on in the background.
    pub fn launch(&mut self, task: TaskDescription) -> StatusUpdate {
        let busy: u32 = self.running.values().map(|r| r.cpus).sum();
        if busy + task.cpus > self.cores {
            warn!(
                task = task.task_id,
                busy,
                cores = self.cores,
                "launch beyond this executor's cores"
            );
        }
        let context = TaskContext {
            job_id: task.job_id,
            task_id: task.task_id,
            index: task.index,
            attempt: task.attempt,
        };
        let done = self.done.clone();
        let (task_id, attempt) = (task.task_id, task.attempt);
        let report = move |outcome, detail| {
            let _ = done.send(Done {
                task_id,
                attempt,
                outcome,
                detail,
            });
        };
        let abort = match task.spec.as_ref() {
            TaskSpec::Handler { name, arg } => match self.handlers.get(name) {
                None => {
                    let error = format!(
                        "no handler named {name:?} on this executor (it has {})",
                        self.handlers.names().join(", ")
                    );
                    return status(task_id, attempt, Err(error), None);
                }
                Some(Handler::Inline(f)) => {
                    return status(task_id, attempt, f(&context, arg), None);
                }
                Some(Handler::Sleep) => match sleep_duration(arg) {
                    Err(e) => return status(task_id, attempt, Err(e), None),
                    Ok(pause) => Some(
                        tokio::spawn(async move {
                            tokio::time::sleep(pause).await;
                            report(Ok(Value::Null), None);
                        })
                        .abort_handle(),
                    ),
                },
                Some(Handler::Blocking(f)) => {
                    let (f, arg) = (f.clone(), arg.clone());
                    tokio::task::spawn_blocking(move || report(f(context, arg), None));
                    None
                }
            },
            TaskSpec::Command {
                argv,
                env,
                cwd,
                timeout_ms,
            } => {
                let (argv, env, cwd) = (argv.clone(), env.clone(), cwd.clone());
                let timeout = timeout_ms.map(Duration::from_millis);
                Some(
                    tokio::spawn(async move {
                        let (outcome, detail) =
                            run_command(&context, &argv, &env, cwd.as_deref(), timeout).await;
                        report(outcome, detail);
                    })
                    .abort_handle(),
                )
            }
        };
        let running = Running {
            attempt,
            cpus: task.cpus,
            abort,
            killed: false,
        };
        self.running.insert(task_id, running);
        StatusUpdate {
            task_id,
            attempt,
            state: TaskState::Running,
            result: None,
            error: None,
        }
    }

    /// An attempt that ran in the background has ended.
    pub fn finish(&mut self, done: Done) -> Option<StatusUpdate> {
        let entry = self.running.get(&done.task_id)?;
        if entry.attempt != done.attempt {
            return None;
        }
        let killed = entry.killed;
        self.running.remove(&done.task_id);
        if killed {
            return Some(killed_status(done.task_id, done.attempt));
        }
        Some(status(
            done.task_id,
            done.attempt,
            done.outcome,
            done.detail,
        ))
    }

    /// Kills an attempt. Cancellable work stops now and reports KILLED at once; blocking work
    /// reports KILLED when it returns.
    pub fn kill(&mut self, task_id: TaskId, attempt: u32) -> Option<StatusUpdate> {
        let entry = self.running.get_mut(&task_id)?;
        if entry.attempt != attempt {
            return None;
        }
        match entry.abort.take() {
            Some(handle) => {
                handle.abort();
                self.running.remove(&task_id);
                Some(killed_status(task_id, attempt))
            }
            None => {
                entry.killed = true;
                None
            }
        }
    }
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
        },
        Err(error) => StatusUpdate {
            task_id,
            attempt,
            state: TaskState::Failed,
            result: detail,
            error: Some(error),
        },
    }
}

fn killed_status(task_id: TaskId, attempt: u32) -> StatusUpdate {
    StatusUpdate {
        task_id,
        attempt,
        state: TaskState::Killed,
        result: None,
        error: Some("killed by the driver".into()),
    }
}
