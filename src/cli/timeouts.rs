//! The flags of `ember submit` for a job's three timeouts (Temporal's schedule-to-start,
//! start-to-close and schedule-to-close).

use crate::protocol::JobTimeouts;
use std::time::Duration;

/// How long a task may wait to start, an attempt run, and the job last; none by default.
#[derive(Debug, Clone, clap::Args)]
pub struct TimeoutArgs {
    /// Fail the job when a task has not started this long (e.g. 30s) after it could run: the
    /// job started, or the task's last attempt ended and any retry wait is over. The wait of
    /// a job for the jobs it runs --after does not count.
    #[arg(long, value_name = "DURATION", value_parser = super::durations::parse_timeout)]
    pub queue_timeout: Option<Duration>,
    /// Stop an attempt of any kind that runs longer than this (e.g. 5m): it fails, and runs
    /// again while --max-failures allows. A command's --timeout takes its place.
    #[arg(long, value_name = "DURATION", value_parser = super::durations::parse_timeout)]
    pub attempt_timeout: Option<Duration>,
    /// Fail the job if it has not ended this long after its submission (e.g. 1h), stopping its
    /// running tasks.
    #[arg(long, value_name = "DURATION", value_parser = super::durations::parse_timeout)]
    pub deadline: Option<Duration>,
}

impl TimeoutArgs {
    /// What the job asks for, checked as the driver checks it.
    pub fn config(&self) -> anyhow::Result<JobTimeouts> {
        let millis = |d: Option<Duration>| d.map(|d| d.as_millis() as u64);
        let timeouts = JobTimeouts {
            queue_timeout_ms: millis(self.queue_timeout),
            attempt_timeout_ms: millis(self.attempt_timeout),
            deadline_ms: millis(self.deadline),
        };
        crate::driver::core::validate_timeouts(&timeouts).map_err(anyhow::Error::msg)?;
        Ok(timeouts)
    }
}
