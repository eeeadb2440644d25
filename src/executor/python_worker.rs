//! The executor's side of one Python worker (`python_worker.py`, embedded here): starting it as
//! the leader of a process group of its own, its frames (4 bytes of big-endian length, then
//! JSON) both ways, a watch on its resident set while a call runs, and stopping it: retired
//! once it is not wanted, killed when it broke off or grew past its limit.

use super::command::Group;
use super::memory::resident_bytes;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::Value;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::time::{Instant, MissedTickBehavior};

/// The worker's program, run as `<interpreter> -c <script>`.
const WORKER_SCRIPT: &str = include_str!("python_worker.py");

/// How long a new worker has to import what it needs and say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest answer a worker may send: the driver's default limit on one task's result.
pub const MAX_ANSWER_BYTES: usize = 256 << 20;

/// How long a worker that broke off, or was retired, is waited for to end by itself.
const EXIT_WAIT: Duration = Duration::from_millis(500);

/// How often a running call's worker has its resident set looked at.
pub(super) const RSS_POLL: Duration = Duration::from_millis(200);

/// Why a call got no answer.
pub(super) enum Broke {
    /// The worker broke off: it exited, or its frames were wrong. Says what happened.
    Off(String),
    /// Its resident set (in bytes) passed the limit while the call ran.
    TooLarge(u64),
}

/// One worker process, the leader of a process group of its own.
pub(super) struct Worker {
    child: Child,
    pid: u32,
    /// Closed to tell the worker to end: its loop stops at the end of its input.
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    group: Option<Group>,
    /// The calls it has answered.
    pub(super) calls: u32,
    /// Its resident set when last looked at.
    pub(super) last_rss: Option<u64>,
}

impl Worker {
    /// Starts a worker and waits for its first frame, which says it is ready.
    pub(super) async fn start(interpreter: &str) -> Result<Worker, String> {
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
        let (Some(stdin), Some(stdout), Some(pid)) =
            (child.stdin.take(), child.stdout.take(), child.id())
        else {
            return Err("the python worker's pipes were not set up".into());
        };
        let mut worker = Worker {
            child,
            pid,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            group: Some(Group(Pid::from_raw(pid as i32))),
            calls: 0,
            last_rss: None,
        };
        let why = match tokio::time::timeout(START_TIMEOUT, worker.read()).await {
            Ok(Ok(ready)) if ready.get("ready").is_some() => return Ok(worker),
            Ok(Ok(other)) => format!("began with {other} instead of saying it was ready"),
            Ok(Err(e)) => e,
            Err(_) => format!("was not ready within {START_TIMEOUT:?}"),
        };
        let ended = how_it_ended(worker.end().await);
        Err(format!(
            "the python worker ({interpreter}) {why}{ended}; its standard error is in the \
             executor's"
        ))
    }

    /// Whether it is still running.
    pub(super) fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGINT to the worker alone, which raises `KeyboardInterrupt` in its call.
    pub(super) fn interrupt(&self) {
        let _ = nix::sys::signal::kill(Pid::from_raw(self.pid as i32), Signal::SIGINT);
    }

    /// Its resident set now, kept as the last look.
    pub(super) fn look_at_rss(&mut self) -> Option<u64> {
        let rss = resident_bytes(self.pid)?;
        self.last_rss = Some(rss);
        Some(rss)
    }

    /// Sends one request; its answer is the next frame [`Worker::read`] reads.
    pub(super) async fn send(&mut self, request: &Value) -> Result<(), String> {
        let body = serde_json::to_vec(request).map_err(|e| format!("could not be sent it: {e}"))?;
        let length = u32::try_from(body.len())
            .map_err(|_| format!("could not be sent a request of {} bytes", body.len()))?;
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&length.to_be_bytes());
        frame.extend_from_slice(&body);
        let Some(stdin) = self.stdin.as_mut() else {
            return Err("could not be sent the task (it was told to end)".into());
        };
        let sent = async {
            stdin.write_all(&frame).await?;
            stdin.flush().await
        };
        sent.await
            .map_err(|e| format!("could not be sent the task ({e})"))
    }

    /// Reads the answer to the call it runs, looking at its resident set every [`RSS_POLL`]
    /// meanwhile: past `max_rss`, the call is given up at once.
    pub(super) async fn answer(&mut self, max_rss: Option<u64>) -> Result<Value, Broke> {
        let pid = self.pid;
        let mut last_rss = self.last_rss;
        let mut looks = tokio::time::interval_at(Instant::now() + RSS_POLL, RSS_POLL);
        looks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let outcome = {
            // One read for the whole call: a frame read in part must not be dropped.
            let read = self.read();
            tokio::pin!(read);
            loop {
                tokio::select! {
                    answer = &mut read => break answer.map_err(Broke::Off),
                    _ = looks.tick() => {
                        let Some(rss) = resident_bytes(pid) else { continue };
                        last_rss = Some(rss);
                        if max_rss.is_some_and(|max| rss > max) {
                            break Err(Broke::TooLarge(rss));
                        }
                    }
                }
            }
        };
        self.last_rss = last_rss;
        outcome
    }

    /// Reads one frame: 4 bytes of big-endian length, then that much JSON.
    pub(super) async fn read(&mut self) -> Result<Value, String> {
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

    /// Stops the worker (its whole group), and how it ended if it had within [`EXIT_WAIT`].
    pub(super) async fn end(&mut self) -> Option<ExitStatus> {
        let ended = tokio::time::timeout(EXIT_WAIT, self.child.wait())
            .await
            .ok()
            .and_then(Result::ok);
        self.kill();
        ended
    }

    /// SIGKILL to the worker's whole group at once (its grace is over, or it grew past its
    /// limit), and a bounded wait for the worker's exit.
    pub(super) async fn kill_now(&mut self) {
        match &self.group {
            Some(group) => drop(group.signal(Signal::SIGKILL)),
            None => drop(self.child.start_kill()),
        }
        let _ = tokio::time::timeout(EXIT_WAIT, self.child.wait()).await;
    }

    /// Ends a worker that answered but is not wanted again, in the background so that its
    /// task's result does not wait: its input closed, which ends its loop, and after
    /// [`EXIT_WAIT`] what is left of its group is stopped as a dropped worker's is.
    pub(super) fn retire(mut self) {
        self.stdin = None;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(EXIT_WAIT, self.child.wait()).await;
        });
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

/// How a worker ended, for a message: " (exit status: 3)", or "" when it is not known.
pub(super) fn how_it_ended(status: Option<ExitStatus>) -> String {
    status.map_or_else(String::new, |status| format!(" ({status})"))
}
