//! The Python workload: Python functions submitted from Python through the `ember` package
//! (maps, round trips and a tree of futures),
//! timed by `python/bench/bench.py` (built into this binary) under the interpreter given with
//! `--python`, which must have the package installed (`pip install ./python`).

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

/// The script, as the repository has it.
const SCRIPT: &str = include_str!("../../python/bench/bench.py");

/// How long one run of the script may take.
const LIMIT: Duration = Duration::from_secs(900);

/// One row of the script's figures: 2 executors of `workers` Python workers each.
#[derive(Debug, Serialize, Deserialize)]
pub struct PythonRow {
    pub executors: u32,
    pub workers: u32,
    /// `client.map(noop, range(calls))` with its default chunksize, calls/s.
    pub calls_per_s_default_chunksize: f64,
    /// The same with `chunksize=1`: one task per call, so calls/s are tasks/s.
    pub calls_per_s_chunksize_1: f64,
    /// One `client.submit(noop, n).result()`, p50.
    pub submit_result_p50_ms: f64,
    /// The tree of futures (10,000 leaf calls, 100 reduces of 100 futures, one combine),
    /// from the first submit to the combine's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_s: Option<f64>,
    /// The same 10,101 submits without dependencies, to the end of the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_flat_s: Option<f64>,
    /// What a dependency edge costs: the difference of the two over the 10,100 edges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_us_per_edge: Option<f64>,
}

/// Runs the script with `python` at 2 executors of 1 and of 8 workers: `--python-calls` calls
/// a map, `--python-round-trips` timed round trips, a tree of `--python-tree-leaves` leaves.
pub async fn run(python: &Path, args: &super::BenchArgs) -> anyhow::Result<Vec<PythonRow>> {
    use anyhow::Context;
    let dir = std::env::temp_dir().join(format!(
        "ember-bench-python-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("bench.py");
    std::fs::write(&script, SCRIPT)?;
    let bins = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let server = crate::server::find_binary()?;
    let output = tokio::time::timeout(
        LIMIT,
        tokio::process::Command::new(python)
            .arg(&script)
            .args(["--json", "--runs", "1", "--workers", "1", "8"])
            .args(["--calls", &args.python_calls.to_string()])
            .args(["--round-trips", &args.python_round_trips.to_string()])
            .args(["--tree-leaves", &args.python_tree_leaves.to_string()])
            .env("EMBER_BIN_DIR", &bins)
            .env("EMBER_NATS_SERVER", &server)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let output = output
        .map_err(|_| anyhow::anyhow!("the Python workload took over {LIMIT:?}"))?
        .with_context(|| format!("could not run {}", python.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "the Python workload under {} failed ({}); is the ember package installed there \
         (pip install ./python)? Its output:\n{}",
        python.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .context("the Python workload printed something other than its JSON figures")
}
