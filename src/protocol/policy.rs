//! What a job asks of its tasks' lives beside what they run: how failed tasks wait before
//! they run again, how long a task may wait to start, an attempt may run and the job may
//! last, and the limits of the concurrency key it names.

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

/// The limits of a concurrency key, which every job that names the key shares: at most
/// `max_concurrent` of their attempts run at once, and at most `rate.count` start in any
/// `rate.per_ms` window. Neither set: the key runs unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
}

/// The most a key's `max_concurrent` and its rate's `count` may be.
pub const MAX_KEY_LIMIT: u32 = 1_000_000;
/// The longest window of a key's rate: a day.
pub const MAX_RATE_WINDOW_MS: u64 = 24 * 3600 * 1000;
/// The longest name of a concurrency key.
pub const MAX_KEY_LEN: usize = 64;

impl KeyLimits {
    /// Whether neither limit is set.
    pub fn is_none(&self) -> bool {
        *self == KeyLimits::default()
    }

    /// Checks each limit: `max_concurrent` and the rate's count from 1 to [`MAX_KEY_LIMIT`],
    /// the rate's window from 1 ms to a day.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(n) = self
            .max_concurrent
            .filter(|n| !(1..=MAX_KEY_LIMIT).contains(n))
        {
            return Err(format!(
                "max_concurrent must be between 1 and {MAX_KEY_LIMIT}; got {n}"
            ));
        }
        if let Some(rate) = self.rate {
            if !(1..=MAX_KEY_LIMIT).contains(&rate.count) {
                return Err(format!(
                    "a rate's count must be between 1 and {MAX_KEY_LIMIT}; got {}",
                    rate.count
                ));
            }
            if !(1..=MAX_RATE_WINDOW_MS).contains(&rate.per_ms) {
                return Err(format!(
                    "a rate's window (per_ms) must be between 1 and {MAX_RATE_WINDOW_MS} (a \
                     day); got {}",
                    rate.per_ms
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for KeyLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.max_concurrent, self.rate) {
            (None, None) => f.write_str("no limits"),
            (Some(n), None) => write!(f, "{n} at once"),
            (None, Some(rate)) => write!(f, "{rate}"),
            (Some(n), Some(rate)) => write!(f, "{n} at once, {rate}"),
        }
    }
}

/// At most `count` task starts in any window of `per_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    pub count: u32,
    pub per_ms: u64,
}

impl Rate {
    /// Reads a rate as people write it: `10/s`, `600/min`, `5/h`, `1/day`, or a count over
    /// any duration (`3/500ms`, `20/10s`).
    pub fn parse(text: &str) -> Result<Rate, String> {
        const HINT: &str = "write e.g. 10/s, 600/min or 3/500ms";
        let (count, per) = text
            .trim()
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not a rate ({HINT})"))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| format!("{:?} is not a count of tasks ({HINT})", count.trim()))?;
        let per_ms = match per.trim() {
            "ms" => 1,
            "s" | "sec" | "second" => 1000,
            "m" | "min" | "minute" => 60_000,
            "h" | "hour" => 3_600_000,
            "d" | "day" => MAX_RATE_WINDOW_MS,
            period => {
                let period = humantime::parse_duration(period)
                    .map_err(|e| format!("{period:?}: {e} ({HINT})"))?;
                u64::try_from(period.as_millis()).unwrap_or(u64::MAX)
            }
        };
        let rate = Rate { count, per_ms };
        KeyLimits {
            max_concurrent: None,
            rate: Some(rate),
        }
        .validate()?;
        Ok(rate)
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.count;
        match self.per_ms {
            1000 => write!(f, "{count}/s"),
            60_000 => write!(f, "{count}/min"),
            3_600_000 => write!(f, "{count}/h"),
            MAX_RATE_WINDOW_MS => write!(f, "{count}/day"),
            ms => write!(
                f,
                "{count}/{}",
                humantime::format_duration(std::time::Duration::from_millis(ms))
            ),
        }
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
    /// The job's concurrency key runs `running` attempts, its `max_concurrent` or more.
    KeyConcurrency {
        key: String,
        running: u32,
        max_concurrent: u32,
    },
    /// The job's concurrency key started its rate's count of tasks in the last window; the
    /// next may start at `until_ms`.
    KeyRate {
        key: String,
        rate: Rate,
        until_ms: u64,
    },
    /// A gang's `tasks` need `cores` at once, and `free` of the cores that could take them
    /// are free.
    GangNeeds { tasks: u32, cores: u32, free: u32 },
    /// A gang waits for `running` attempts of it to stop before it starts again together.
    GangStopping { running: u32 },
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
            WaitReason::KeyConcurrency {
                key,
                running,
                max_concurrent,
            } => write!(
                f,
                "concurrency key {key} runs {running} of its {max_concurrent} at once"
            ),
            WaitReason::KeyRate {
                key,
                rate,
                until_ms,
            } => write!(
                f,
                "concurrency key {key} is at its rate of {rate}; the next task may start at {}",
                time(*until_ms)
            ),
            WaitReason::GangNeeds { tasks, cores, free } => write!(
                f,
                "the gang of {} needs {cores} cores at once, and {free} are free to it",
                crate::text::count(*tasks, "task", "tasks")
            ),
            WaitReason::GangStopping { running } => write!(
                f,
                "the gang waits for {} to stop, to start again together",
                crate::text::count(*running, "attempt", "attempts")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_written_and_show_as_read() {
        let cases = [
            ("10/s", 10, 1000, "10/s"),
            ("600/min", 600, 60_000, "600/min"),
            ("5/h", 5, 3_600_000, "5/h"),
            ("1/day", 1, MAX_RATE_WINDOW_MS, "1/day"),
            (" 3 / 500ms ", 3, 500, "3/500ms"),
            ("20/10s", 20, 10_000, "20/10s"),
        ];
        for (text, count, per_ms, shown) in cases {
            let rate = Rate::parse(text).unwrap();
            assert_eq!(rate, Rate { count, per_ms }, "{text}");
            assert_eq!(rate.to_string(), shown);
        }
        for (bad, says) in [
            ("10", "not a rate"),
            ("x/s", "not a count"),
            ("0/s", "between 1"),
            ("10/fortnight", "fortnight"),
            ("10/2days", "a day"),
            ("10/0s", "between 1"),
        ] {
            let error = Rate::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn key_limits_are_checked_and_shown_in_words() {
        let limits = KeyLimits {
            max_concurrent: Some(4),
            rate: Some(Rate {
                count: 10,
                per_ms: 1000,
            }),
        };
        assert_eq!(limits.validate(), Ok(()));
        assert_eq!(limits.to_string(), "4 at once, 10/s");
        assert_eq!(KeyLimits::default().to_string(), "no limits");
        let zero = KeyLimits {
            max_concurrent: Some(0),
            rate: None,
        };
        assert!(zero.validate().unwrap_err().contains("max_concurrent"));
    }
}
