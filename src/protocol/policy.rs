//! What a job asks of its tasks' lives beside what they run: how failed tasks wait before
//! they run again, and how long a task may wait to start, an attempt may run and the job may
//! last.

use serde::{Deserialize, Serialize};

/// How a job's failed tasks wait before they run again (Temporal's retry policy, Celery's
/// `retry_backoff`): a task's n-th retry waits `initial_ms x multiplier^(n-1)`, at most `max_ms`
/// (by default 100 x `initial_ms`), less a part of it up to `jitter` (0 to 1), so that tasks
/// that failed together do not all come back at once. A task waiting holds no cores.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RetryBackoff {
    pub initial_ms: u64,
    #[serde(default = "default_backoff_multiplier")]
    pub multiplier: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ms: Option<u64>,
    #[serde(default = "default_backoff_jitter")]
    pub jitter: f64,
}

impl RetryBackoff {
    /// `initial_ms` with the defaults: doubling, at most 100 times it, 20% of jitter.
    pub fn starting_at(initial_ms: u64) -> Self {
        RetryBackoff {
            initial_ms,
            multiplier: default_backoff_multiplier(),
            max_ms: None,
            jitter: default_backoff_jitter(),
        }
    }

    /// The longest wait: `max_ms`, or 100 x `initial_ms`.
    pub fn cap_ms(&self) -> u64 {
        self.max_ms
            .unwrap_or_else(|| self.initial_ms.saturating_mul(100))
    }

    /// The wait before the retry that follows a task's `failures`-th failure, before jitter.
    pub fn base_delay_ms(&self, failures: u32) -> u64 {
        let exponent = failures.saturating_sub(1).min(1024) as i32;
        let delay = self.initial_ms as f64 * self.multiplier.powi(exponent);
        let cap = self.cap_ms();
        if delay.is_finite() && delay < cap as f64 {
            delay as u64
        } else {
            cap
        }
    }

    /// The wait after a task's `failures`-th failure: the base delay less `jitter x unit` of
    /// it, `unit` in [0, 1) (the core draws it from the task's ids, so the same failure waits
    /// the same on every driver).
    pub fn delay_ms(&self, failures: u32, unit: f64) -> u64 {
        let base = self.base_delay_ms(failures) as f64;
        (base * (1.0 - self.jitter * unit.clamp(0.0, 1.0))).round() as u64
    }
}

fn default_backoff_multiplier() -> f64 {
    2.0
}

fn default_backoff_jitter() -> f64 {
    0.2
}

/// A job's three timeouts (Temporal's schedule-to-start, start-to-close and
/// schedule-to-close), each off unless given, in ms:
/// - `queue_timeout_ms`: a task that has not started within it of being ready to run (the
///   job started, or its previous attempt ended and any retry wait is over) fails the job.
///   The wait of a job for the jobs it runs after does not count.
/// - `attempt_timeout_ms`: an attempt that runs longer is stopped and fails (and runs again
///   within `max_failures`). A command's or python call's own `timeout_ms` takes its place.
/// - `deadline_ms`: from the submission; past it the job ends FAILED and its running tasks
///   are stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTimeouts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
}

impl JobTimeouts {
    /// Whether none is set.
    pub fn is_none(&self) -> bool {
        *self == JobTimeouts::default()
    }
}

/// Why tasks of an open job wait, and until when: each reason a summary gives, in the order it
/// gives them. Its text (`Display`) is what `ember jobs` and the web page show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WaitReason {
    /// The job runs after jobs that have not ended (`WAITING`).
    After { jobs: Vec<crate::ids::JobId> },
    /// Offers wait for the start gate: `registered` executors of the `required`.
    StartGate { registered: u64, required: u64 },
    /// No executor may run the job's tasks as it stands (cores, resources, constraints,
    /// exclusion after failures): why, in words.
    NoFit { message: String },
    /// `tasks` tasks wait out their retry backoff, the next until `until_ms`.
    RetryBackoff { tasks: u32, until_ms: u64 },
    /// `tasks` tasks wait for free cores, and the job fails at `until_ms` if the one that has
    /// waited longest has not started by then (its queue timeout).
    QueueTimeout { tasks: u32, until_ms: u64 },
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let time = crate::text::format_time;
        match self {
            WaitReason::After { jobs } => {
                let (plural, verb) = if jobs.len() == 1 {
                    ("", "has")
                } else {
                    ("s", "have")
                };
                let jobs: Vec<String> = jobs.iter().map(|id| id.to_string()).collect();
                write!(
                    f,
                    "runs after job{plural} {}, which {verb} not ended",
                    jobs.join(", ")
                )
            }
            WaitReason::StartGate {
                registered,
                required,
            } => write!(
                f,
                "offers wait on the start gate: {} of the {required} required (or until \
                 --max-registered-wait passes)",
                crate::text::count(*registered, "executor registered", "executors registered"),
            ),
            WaitReason::NoFit { message } => f.write_str(message),
            WaitReason::RetryBackoff { tasks, until_ms } => write!(
                f,
                "{} out a retry backoff, the next until {}",
                crate::text::count(*tasks, "task waits", "tasks wait"),
                time(*until_ms)
            ),
            WaitReason::QueueTimeout { tasks, until_ms } => write!(
                f,
                "{} for a free core; the job fails at {} if the first has not started \
                 (queue timeout)",
                crate::text::count(*tasks, "task waits", "tasks wait"),
                time(*until_ms)
            ),
        }
    }
}
