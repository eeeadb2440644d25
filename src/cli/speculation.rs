//! The flags of `ember submit` for speculative execution (Spark's `spark.speculation.*`).

use crate::protocol::Speculation;

/// Speculative execution for the job, off unless `--speculation`.
#[derive(Debug, Clone, clap::Args)]
pub struct SpeculationArgs {
    /// Copy tasks that run much longer than the job's others onto another executor; the
    /// first copy to finish counts and the other is killed.
    #[arg(long)]
    pub speculation: bool,
    /// The fraction of the job's tasks that must have finished before any is copied.
    #[arg(
        long,
        value_name = "FRACTION",
        default_value_t = 0.75,
        requires = "speculation"
    )]
    pub speculation_quantile: f64,
    /// How many times the median finished duration a task must have run to be copied.
    #[arg(
        long,
        value_name = "FACTOR",
        default_value_t = 1.5,
        requires = "speculation"
    )]
    pub speculation_multiplier: f64,
    /// The least a task must have run to be copied (e.g. 100ms, 5s).
    #[arg(long, value_name = "DURATION", value_parser = super::durations::parse_wait, requires = "speculation")]
    pub speculation_min_runtime: Option<std::time::Duration>,
}

impl SpeculationArgs {
    /// What the job asks for, checked as the driver checks it.
    pub fn config(&self) -> anyhow::Result<Option<Speculation>> {
        if !self.speculation {
            return Ok(None);
        }
        let defaults = Speculation::default();
        let config = Speculation {
            quantile: self.speculation_quantile,
            multiplier: self.speculation_multiplier,
            min_runtime_ms: self
                .speculation_min_runtime
                .map_or(defaults.min_runtime_ms, |d| d.as_millis() as u64),
        };
        crate::driver::core::validate_speculation(&config).map_err(anyhow::Error::msg)?;
        Ok(Some(config))
    }
}
