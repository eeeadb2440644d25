//! `ember`: the command line for people: start a local cluster, follow its events, look at the
//! registry and jobs, submit and kill jobs.

use ember::cli::command::{dispatch, parse};
use ember::cli::{init_tracing, runtime};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = parse();
    init_tracing(false, cli.log_filter());
    let result = runtime()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(dispatch(cli)));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("ember: {error:#}");
            ExitCode::FAILURE
        }
    }
}
