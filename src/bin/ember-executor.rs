//! `ember-executor`: registers with the driver and runs the tasks it is offered. Run many.

use clap::Parser;
use ember::cli::executor::{serve, ExecutorArgs};
use ember::cli::{init_tracing, run_as_task, runtime, shutdown_signal, SERVICE_LOG};
use ember::executor::{ExecutorError, EXIT_REGISTRATION_REFUSED};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = ExecutorArgs::parse();
    init_tracing(args.log_json, SERVICE_LOG);
    let config = match args.config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("ember-executor: {error}");
            return ExitCode::from(error.exit_code());
        }
    };
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
            eprintln!("ember-executor: {error:#}");
            match error.downcast_ref::<ExecutorError>() {
                Some(ExecutorError::Refused(_)) => ExitCode::from(EXIT_REGISTRATION_REFUSED as u8),
                Some(ExecutorError::DriverLost(_)) => ExitCode::from(ember::EXIT_DRIVER_LOST as u8),
                _ => ExitCode::FAILURE,
            }
        }
    }
}
