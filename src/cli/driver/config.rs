//! How `ember-driver`'s flags become a [`DriverConfig`], with the checks clap cannot make of one
//! flag alone.

use super::DriverArgs;
use crate::connect::ConnectError;
use crate::driver::core::{
    AllocationConfig, ExclusionConfig, Liveness, Retention, Scheduling, SchedulingMode, StartGate,
};
use crate::driver::DriverConfig;
use crate::metrics::DriverMetrics;
use clap::error::ErrorKind;
use clap::CommandFactory;
use std::sync::Arc;
use std::time::Duration;

/// Flags that clap takes one by one but that do not make a driver's config together.
#[derive(Debug, thiserror::Error)]
pub enum DriverFlagsError {
    /// Flags that conflict or want another, refused as clap refuses its own:
    /// [`clap::Error::exit`] prints the usage and exits with code 2.
    #[error(transparent)]
    Usage(clap::Error),
    #[error(transparent)]
    Cluster(#[from] ConnectError),
    #[error("--min-executors {min} is more than --max-executors {max}")]
    MinExecutors { min: u32, max: u32 },
    /// The dynamic allocation signal counts in milliseconds.
    #[error("{0} must be more than 0")]
    BelowMillisecond(&'static str),
}

impl DriverArgs {
    /// The driver's config as the flags set it. Its metrics are new and it has no web page's
    /// link: [`serve`](super::serve) links the page it serves.
    pub fn config(&self) -> Result<DriverConfig, DriverFlagsError> {
        // In the order the driver has always made these checks: of several wrong flags, the
        // same one is named.
        let scheduling = self.scheduling()?;
        let subjects = self.nats.subjects()?;
        let allocation = self.allocation()?;
        let start_gate = self.start_gate()?;
        Ok(DriverConfig {
            subjects,
            expect_executors: self.expect_executors,
            revive_interval: self.revive_interval,
            scheduling,
            liveness: Liveness {
                executor_timeout_ms: ms(self.executor_timeout),
                no_executors_timeout_ms: ms(self.no_executors_timeout),
                adopt_wait_ms: ms(self.adopt_wait),
                ..Liveness::default()
            },
            journal: self.journal,
            journal_max_age: self.journal_max_age,
            retention: Retention {
                jobs: self.retain_jobs as usize,
                result_bytes: self.max_result_bytes,
                job_result_bytes: self.max_job_result_bytes,
            },
            snapshot_after: self.snapshot_after,
            results_max_age: self.results_max_age,
            results_max_bytes: self.results_max_bytes,
            objects_max_bytes: self.objects_max_bytes,
            objects_max_age: self.objects_max_age,
            events_max_age: self.events_max_age,
            events_max_bytes: self.events_max_bytes,
            lease: self.lease,
            replay_timeout: self.replay_timeout,
            replicas: self.replicas,
            metrics: Arc::new(DriverMetrics::new()),
            allocation,
            web: None,
            start_gate,
            exclusion: self.exclusion(),
            disconnect_grace: self.disconnect_grace.0,
            connection_lost: None,
        })
    }

    /// How jobs share the cores. Pools declared under fifo, which has none, or a pool declared
    /// twice, conflict.
    fn scheduling(&self) -> Result<Scheduling, DriverFlagsError> {
        if self.scheduling == SchedulingMode::Fifo && !self.pools.is_empty() {
            return Err(usage(
                ErrorKind::ArgumentConflict,
                "--pool declares a pool for --scheduling fair, and the scheduling is fifo",
            ));
        }
        Scheduling::new(self.scheduling, self.pools.clone())
            .map_err(|message| usage(ErrorKind::ArgumentConflict, message))
    }

    /// The start gate, if `--min-registered` or `--min-registered-ratio` sets one. A ratio of
    /// `--expect-executors` 0 asks for nothing, and wants `--expect-executors`.
    fn start_gate(&self) -> Result<Option<StartGate>, DriverFlagsError> {
        let min_registered = match (self.min_registered, self.min_registered_ratio) {
            (Some(n), _) => n,
            (None, Some(_)) if self.expect_executors == 0 => {
                return Err(usage(
                    ErrorKind::MissingRequiredArgument,
                    "--min-registered-ratio is a ratio of --expect-executors, which is 0; \
                     give --expect-executors, or --min-registered instead",
                ))
            }
            (None, Some(ratio)) => ((self.expect_executors as f64 * ratio).ceil() as u64).max(1),
            (None, None) => return Ok(None),
        };
        Ok(Some(StartGate {
            min_registered,
            max_wait_ms: ms(self.max_registered_wait),
        }))
    }

    /// Exclusion on failure's settings, if `--exclude-on-failure` turns it on.
    fn exclusion(&self) -> Option<ExclusionConfig> {
        self.exclude_on_failure.then_some(ExclusionConfig {
            max_task_attempts_per_executor: self.exclude_task_failures,
            max_failed_tasks_per_executor: self.exclude_job_failures,
            cluster_max_failed_tasks_per_executor: self.exclude_cluster_failures,
            timeout_ms: ms(self.exclude_timeout),
            unschedulable_timeout_ms: ms(self.exclude_unschedulable_timeout),
        })
    }

    /// The dynamic allocation settings, if `--max-executors` turns the signal on.
    fn allocation(&self) -> Result<Option<AllocationConfig>, DriverFlagsError> {
        let Some(max_executors) = self.max_executors else {
            return Ok(None);
        };
        if self.min_executors > max_executors {
            return Err(DriverFlagsError::MinExecutors {
                min: self.min_executors,
                max: max_executors,
            });
        }
        let positive = |d: Duration, flag| match ms(d) {
            0 => Err(DriverFlagsError::BelowMillisecond(flag)),
            ms => Ok(ms),
        };
        Ok(Some(AllocationConfig {
            min_executors: self.min_executors,
            max_executors,
            backlog_timeout_ms: positive(self.backlog_timeout, "--backlog-timeout")?,
            idle_timeout_ms: positive(self.idle_timeout, "--idle-timeout")?,
        }))
    }
}

/// Flags refused as clap refuses a command line, with the driver's usage.
fn usage(kind: ErrorKind, message: impl std::fmt::Display) -> DriverFlagsError {
    DriverFlagsError::Usage(DriverArgs::command().error(kind, message))
}

/// The milliseconds the core counts in; every duration flag is capped far below overflow.
fn ms(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Replicas;
    use clap::FromArgMatches;

    /// Parses `flags` as the command line alone sets them, whatever EMBER_* variables the tests
    /// run with.
    fn parse(flags: &[&str]) -> DriverArgs {
        let line = std::iter::once("ember-driver").chain(flags.iter().copied());
        let matches = crate::cli::without_env(DriverArgs::command())
            .try_get_matches_from(line)
            .unwrap();
        DriverArgs::from_arg_matches(&matches).unwrap()
    }

    /// Clap's own checks of the command line, and a help text for every flag.
    #[test]
    fn the_command_line_passes_clap_s_checks_and_explains_every_flag() {
        crate::cli::check_command_line(DriverArgs::command());
    }

    #[test]
    fn no_flags_give_the_config_s_defaults() {
        let config = parse(&[]).config().unwrap();
        let defaults = DriverConfig {
            metrics: config.metrics.clone(),
            ..DriverConfig::new(config.subjects.clone())
        };
        assert_eq!(format!("{config:#?}"), format!("{defaults:#?}"));
    }

    #[test]
    fn flags_set_the_config() {
        let config = parse(&[
            "--expect-executors=4",
            "--min-registered-ratio=0.5",
            "--max-executors=8",
            "--idle-timeout=2m",
            "--exclude-on-failure",
            "--retain-jobs=7",
            "--replicas=3",
        ])
        .config()
        .unwrap();
        assert_eq!(config.expect_executors, 4);
        assert_eq!(config.start_gate.unwrap().min_registered, 2);
        let allocation = config.allocation.unwrap();
        assert_eq!(
            (allocation.max_executors, allocation.idle_timeout_ms),
            (8, 120_000)
        );
        assert_eq!(config.exclusion, Some(ExclusionConfig::default()));
        assert_eq!(config.retention.jobs, 7);
        assert_eq!(config.replicas, Replicas::Exactly(3));
    }

    #[test]
    fn flags_that_do_not_go_together_are_refused_saying_why() {
        let refused = |flags: &[&str]| parse(flags).config().unwrap_err();
        for flags in [
            &["--pool=a"][..],
            &["--scheduling=fair", "--pool=a", "--pool=a"],
            &["--min-registered-ratio=0.5"],
        ] {
            assert!(
                matches!(refused(flags), DriverFlagsError::Usage(_)),
                "{flags:?}"
            );
        }
        let error = refused(&["--max-executors=2", "--min-executors=3"]);
        assert_eq!(
            error.to_string(),
            "--min-executors 3 is more than --max-executors 2"
        );
        let error = refused(&["--max-executors=2", "--backlog-timeout=500us"]);
        assert_eq!(error.to_string(), "--backlog-timeout must be more than 0");
        assert!(matches!(
            refused(&["--cluster=a b"]),
            DriverFlagsError::Cluster(_)
        ));
    }
}
