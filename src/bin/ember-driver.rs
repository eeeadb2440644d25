//! `ember-driver`: keeps the executor registry and schedules tasks on executors' free cores.

use clap::Parser;
use ember::cli::driver::{serve, DriverArgs, DriverFlagsError};
use ember::cli::{init_tracing, run_as_task, runtime, shutdown_signal, SERVICE_LOG};
use std::process::ExitCode;

fn main() -> ExitCode {
    ember::cli::return_big_blocks_when_freed();
    let args = DriverArgs::parse();
    let config = match args.config() {
        Ok(config) => config,
        Err(DriverFlagsError::Usage(error)) => error.exit(),
        Err(error) => {
            eprintln!("ember-driver: {error}");
            return ExitCode::FAILURE;
        }
    };
    init_tracing(args.log_json, SERVICE_LOG);
    let result = runtime()
        .map_err(anyhow::Error::from)
        // The signals are awaited on a task of the runtime's: asked for inside it.
        .and_then(|rt| {
            run_as_task(
                &rt,
                async move { serve(&args, config, shutdown_signal()).await },
            )
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ember-driver: {error:#}");
            ExitCode::FAILURE
        }
    }
}
