//! Shell command tasks. Each command runs in a process group of its own, so that what it
//! starts (the children of `sh -c '...'`) ends with it: when the command exits, times out or
//! is killed, its group gets SIGTERM, and SIGKILL [`KILL_GRACE`] later if any of it is left.
//! The wait for the output tails is bounded, so a descendant that still holds a pipe cannot
//! hold up the task's status.

use super::tasks::{TaskContext, TaskResult, OUTPUT_TAIL};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::process::Child;
use tokio::sync::watch;

/// How long a command's process group has to end after SIGTERM before it gets SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(5);
/// How long the output tails are read after the command has ended (or been stopped): a
/// descendant that holds a pipe open past it is cut off, not waited for.
pub const TAIL_WAIT: Duration = Duration::from_millis(500);

/// Runs a command: exit 0 is success; a non-zero exit, a signal or a timeout is a failure.
/// The result holds the exit code and the tails of stdout and stderr either way.
pub(crate) async fn run_command(
    context: &TaskContext,
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
    timeout: Option<Duration>,
) -> (TaskResult, Option<Value>) {
    let mut child = match spawn(context, argv, env, cwd) {
        Ok(child) => child,
        Err(e) => return (Err(e), None),
    };
    // Dropped on every way out, an abort by KillTask included: the group ends with the task.
    let group = child.id().map(|pid| Group(Pid::from_raw(pid as i32)));
    let (stop, stopped) = watch::channel(false);
    let stdout = child.stdout.take().map(|p| read_tail(p, stopped.clone()));
    let stderr = child.stderr.take().map(|p| read_tail(p, stopped));
    let limit = async {
        match timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    // Asked to stop (killed), the command gets as long to end as one that timed out, and the
    // attempt ends only once its group has.
    let (waited, stopped) = tokio::select! {
        waited = child.wait() => (Some(waited), false),
        () = limit => (None, false),
        () = context.stop.stopped() => (None, true),
    };
    if waited.is_none() {
        stop_group(group.as_ref(), &mut child).await;
    }
    drop(group);
    let tails = async { (join_tail(stdout).await, join_tail(stderr).await) };
    tokio::pin!(tails);
    let (stdout, stderr) = match tokio::time::timeout(TAIL_WAIT, &mut tails).await {
        Ok(tails) => tails,
        Err(_) => {
            let _ = stop.send(true);
            tails.await
        }
    };
    let error = match &waited {
        None if stopped => Some("stopped by request".to_string()),
        None => Some(format!("timed out after {:?}", timeout.unwrap_or_default())),
        Some(waited) => failure(waited, &stderr),
    };
    let code = waited.and_then(|w| w.ok()).and_then(|s| s.code());
    let result = json!({ "exit_code": code, "stdout": stdout, "stderr": stderr });
    match error {
        None => (Ok(result), None),
        Some(e) => (Err(e), Some(result)),
    }
}

/// Starts `argv` as the leader of a new process group, its output piped.
fn spawn(
    context: &TaskContext,
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
) -> Result<Child, String> {
    let Some((program, args)) = argv.split_first() else {
        return Err("empty argv".into());
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .envs(env)
        .env("EMBER_TASK_INDEX", context.index.to_string())
        .env("EMBER_TASK_ID", context.task_id.to_string())
        .env("EMBER_JOB_ID", context.job_id.to_string())
        .env("EMBER_TASK_ATTEMPT", context.attempt.to_string())
        .env("EMBER_TASK_TERM", context.term.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    if let Some(gang) = &context.gang {
        command.envs(gang.env());
    }
    if !context.resources.is_empty() {
        let all = serde_json::to_string(&context.resources).unwrap_or_default();
        command.env(crate::resources::ENV_ALL, all);
        for (name, addresses) in &context.resources {
            command.env(crate::resources::env_name(name), addresses.join(","));
        }
    }
    command
        .spawn()
        .map_err(|e| format!("could not start {program:?}: {e}"))
}

/// Why an ended command failed, or `None` if it succeeded.
fn failure(waited: &std::io::Result<ExitStatus>, stderr: &str) -> Option<String> {
    match waited {
        Err(e) => Some(format!("could not wait for the command: {e}")),
        Ok(status) if status.success() => None,
        Ok(status) => Some(match status.code() {
            Some(code) => format!("exited with code {code}: {}", last_line(stderr)),
            None => format!("killed by a signal ({status})"),
        }),
    }
}

/// A process group, led by the process started in it (a command, or a python worker): when
/// dropped, SIGTERM to all of it, and SIGKILL [`KILL_GRACE`] later to what is left.
pub(super) struct Group(pub(super) Pid);

impl Group {
    /// Sends `signal` to the whole group; false if none of it is left.
    pub(super) fn signal(&self, signal: Signal) -> bool {
        killpg(self.0, signal).is_ok()
    }
}

impl Drop for Group {
    /// SIGTERM to what is left of the group now, SIGKILL after [`KILL_GRACE`]. Drop cannot
    /// wait, so the SIGKILL is sent by a timer task of its own (at once, outside a runtime).
    fn drop(&mut self) {
        if !self.signal(Signal::SIGTERM) {
            return;
        }
        let pgid = self.0;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep(KILL_GRACE).await;
                    let _ = killpg(pgid, Signal::SIGKILL);
                });
            }
            Err(_) => {
                let _ = killpg(pgid, Signal::SIGKILL);
            }
        }
    }
}

/// A timed-out or stopped command: SIGTERM to its group, and SIGKILL once [`KILL_GRACE`] has
/// passed without the command's exit.
async fn stop_group(group: Option<&Group>, child: &mut Child) {
    let Some(group) = group else { return };
    group.signal(Signal::SIGTERM);
    if tokio::time::timeout(KILL_GRACE, child.wait())
        .await
        .is_err()
    {
        group.signal(Signal::SIGKILL);
        let _ = child.wait().await;
    }
}

type Tail = tokio::task::JoinHandle<String>;

/// Reads a pipe to its end, or until `stop` turns true, keeping its last [`OUTPUT_TAIL`] bytes.
fn read_tail(
    mut pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    mut stop: watch::Receiver<bool>,
) -> Tail {
    tokio::spawn(async move {
        let mut tail: Vec<u8> = Vec::new();
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let n = tokio::select! {
                read = pipe.read(&mut buffer) => read.unwrap_or(0),
                _ = stop.wait_for(|stop| *stop) => 0,
            };
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
