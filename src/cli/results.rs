//! `ember results`: a job's outcomes, and with `--output-dir` its results and outputs as files.

use crate::client::EmberClient;
use crate::ids::JobId;
use crate::objects::{check_task_path, ObjectRef};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct ResultsArgs {
    /// The job's id.
    pub job_id: JobId,
    /// Write each task's outcome to DIR/<index>.json (its result read from the object store
    /// when it was too large for one message) and each of its outputs to DIR/<index>/<name>,
    /// instead of printing the outcomes.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
}

/// Prints a job's outcomes, one JSON line each, or writes them and their outputs under
/// `--output-dir`.
pub async fn results(client: &EmberClient, args: &ResultsArgs) -> anyhow::Result<()> {
    let outcomes = client.results(args.job_id).await?;
    let Some(dir) = &args.output_dir else {
        for outcome in &outcomes {
            println!("{}", serde_json::to_string(outcome)?);
        }
        return Ok(());
    };
    std::fs::create_dir_all(dir)?;
    let mut store = None;
    let (mut files, mut outputs) = (0, 0);
    for outcome in &outcomes {
        let path = dir.join(format!("{}.json", outcome.index));
        std::fs::write(&path, serde_json::to_vec_pretty(outcome)?)?;
        files += 1;
        let named = outcome
            .result
            .as_ref()
            .and_then(|r| r.get("outputs"))
            .and_then(|o| o.as_object());
        for (name, object) in named.into_iter().flatten() {
            if store.is_none() {
                store = Some(client.objects().await?);
            }
            let objects = store.as_ref().expect("opened above");
            let object = ObjectRef::parse(object.as_str().unwrap_or_default())
                .map_err(anyhow::Error::msg)?;
            let to = output_path(dir, outcome.index, name)?;
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent)?;
            }
            objects.fetch_to(&object, &to).await?;
            outputs += 1;
        }
    }
    eprintln!(
        "job {}: {files} outcomes and {outputs} outputs written under {}",
        args.job_id,
        dir.display()
    );
    Ok(())
}

/// Where task `index`'s output `name` goes: inside `dir/<index>`, never outside it.
fn output_path(dir: &Path, index: u32, name: &str) -> anyhow::Result<PathBuf> {
    check_task_path("output", name).map_err(anyhow::Error::msg)?;
    Ok(dir.join(index.to_string()).join(name))
}
