//! The flags of `ember submit` for retries that wait (Temporal's retry policy).

use crate::protocol::RetryBackoff;
use std::time::Duration;

/// How the job's failed tasks wait before they run again; at once unless `--retry-backoff`.
#[derive(Debug, Clone, clap::Args)]
pub struct BackoffArgs {
    /// A failed task waits this long before its first retry (e.g. 1s), holding no cores, and
    /// each later retry waits --retry-backoff-multiplier times longer, up to
    /// --retry-backoff-max. The wait survives a driver restart.
    #[arg(long, value_name = "DURATION", value_parser = super::durations::parse_duration)]
    pub retry_backoff: Option<Duration>,
    /// The longest wait [default: 100 times --retry-backoff].
    #[arg(long, value_name = "DURATION", value_parser = super::durations::parse_duration,
          requires = "retry_backoff")]
    pub retry_backoff_max: Option<Duration>,
    /// How many times longer each retry waits than the one before.
    #[arg(
        long,
        value_name = "FACTOR",
        default_value_t = 2.0,
        requires = "retry_backoff"
    )]
    pub retry_backoff_multiplier: f64,
    /// The fraction of each wait that may be taken off at random (0 to 1), so that tasks
    /// that failed together do not all come back at once.
    #[arg(
        long,
        value_name = "FRACTION",
        default_value_t = 0.2,
        requires = "retry_backoff"
    )]
    pub retry_jitter: f64,
}

impl BackoffArgs {
    /// What the job asks for, checked as the driver checks it.
    pub fn config(&self) -> anyhow::Result<Option<RetryBackoff>> {
        let Some(initial) = self.retry_backoff else {
            return Ok(None);
        };
        let millis = |d: Duration| (d.as_millis() as u64).max(1);
        let config = RetryBackoff {
            initial_ms: millis(initial),
            multiplier: self.retry_backoff_multiplier,
            max_ms: self.retry_backoff_max.map(millis),
            jitter: self.retry_jitter,
        };
        crate::driver::core::validate_retry_backoff(&config).map_err(anyhow::Error::msg)?;
        Ok(Some(config))
    }
}
