//! `ember put` and `ember objects`: the cluster's object store from the command line.

use crate::client::EmberClient;
use crate::objects::{ObjectRef, ObjectStat};
use crate::protocol::{ApiReply, ApiRequest, ObjectUse, MAX_OBJECTS_ASKED};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::json;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct PutArgs {
    /// The files to put. Each one's reference (the SHA-256 of its content) is printed on a
    /// line of its own, in the order given; what the store holds already is not sent again.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

#[derive(clap::Subcommand)]
pub enum ObjectsCommand {
    /// List the objects the store holds: size, age (since its put) and the kept jobs that
    /// use each (an object no kept job uses is deleted after the driver's --objects-max-age).
    Ls {
        /// Print `{"objects": [...]}` instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Describe one object; exits 1 if the store does not hold it.
    Stat {
        /// The object's reference, as `ember put` prints it.
        object: ObjectRef,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete objects now. The driver refuses to delete one a kept job uses; exits 1 if any
    /// was refused.
    Rm {
        /// The objects' references.
        #[arg(required = true)]
        objects: Vec<ObjectRef>,
    },
    /// Write an object's content to a file (checked against its reference), or to stdout
    /// with `-`.
    Get {
        /// The object's reference.
        object: ObjectRef,
        /// Where to write it.
        #[arg(value_name = "FILE")]
        to: PathBuf,
    },
}

/// Puts each file and prints its reference.
pub async fn put(client: &EmberClient, args: &PutArgs) -> anyhow::Result<()> {
    let objects = client.objects().await?;
    for file in &args.files {
        let put = objects.put_file(file).await?;
        let what = match put.sent {
            true => "stored",
            false => "already stored",
        };
        eprintln!("{}: {} bytes, {what}", file.display(), put.size);
        println!("{}", put.object);
    }
    Ok(())
}

/// Runs one `ember objects` command: false if it found nothing to show.
pub async fn objects(client: &EmberClient, command: &ObjectsCommand) -> anyhow::Result<bool> {
    let objects = client.objects().await?;
    match command {
        ObjectsCommand::Ls { json } => {
            let stats = objects.list().await?;
            show(
                client,
                &stats,
                *json,
                |described| json!({ "objects": described }),
            )
            .await?;
        }
        ObjectsCommand::Stat { object, json } => {
            let Some(stat) = objects.stat(object).await? else {
                eprintln!("object {object} not found");
                return Ok(false);
            };
            show(client, &[stat], *json, |mut described| described.remove(0)).await?;
        }
        ObjectsCommand::Rm { objects } => {
            let mut all_done = true;
            for object in objects {
                match client
                    .call(&ApiRequest::DeleteObject {
                        object: object.clone(),
                    })
                    .await
                {
                    Ok(ApiReply::ObjectDeleted { deleted: true, .. }) => {
                        println!("{object}: deleted")
                    }
                    Ok(ApiReply::ObjectDeleted { .. }) => println!("{object}: not there"),
                    Ok(other) => anyhow::bail!("unexpected answer from the driver: {other:?}"),
                    Err(error) => {
                        eprintln!("{object}: {error}");
                        all_done = false;
                    }
                }
            }
            return Ok(all_done);
        }
        ObjectsCommand::Get { object, to } if to.as_os_str() == "-" => {
            use std::io::Write;
            let bytes = objects.get_bytes(object).await?;
            std::io::stdout().write_all(&bytes)?;
        }
        ObjectsCommand::Get { object, to } => {
            let size = objects.fetch_to(object, to).await?;
            eprintln!("{}: {size} bytes", to.display());
        }
    }
    Ok(true)
}

/// Prints `stats` with the kept jobs that use each, as the driver says, in a table or as the
/// JSON `wrap` makes of the objects described (each stat with `jobs` and `jobs_count`; both
/// left out when no driver answers, which a warning says).
async fn show(
    client: &EmberClient,
    stats: &[ObjectStat],
    as_json: bool,
    wrap: impl FnOnce(Vec<serde_json::Value>) -> serde_json::Value,
) -> anyhow::Result<()> {
    let uses = match uses(client, stats).await {
        Ok(uses) => Some(uses),
        Err(error) => {
            eprintln!("warning: which kept jobs use each object is not shown: {error}");
            None
        }
    };
    let used = |object: &ObjectRef| uses.as_ref().and_then(|u| u.get(object));
    if as_json {
        let described = stats
            .iter()
            .map(|stat| {
                let mut value = serde_json::to_value(stat).unwrap_or_default();
                if let Some(u) = used(&stat.object) {
                    value["jobs"] = json!(u.jobs);
                    value["jobs_count"] = json!(u.jobs_count);
                }
                value
            })
            .collect();
        println!("{}", wrap(described));
        return Ok(());
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(["object", "bytes", "age", "kept jobs using it"]);
    let now = crate::now_ms();
    for stat in stats {
        let age = stat.put_ms.map(|put| {
            let secs = now.saturating_sub(put) / 1000;
            humantime::format_duration(Duration::from_secs(secs)).to_string()
        });
        let jobs = match used(&stat.object) {
            None => "?".to_string(),
            Some(u) if u.jobs_count == 0 => "none".to_string(),
            Some(u) => {
                let mut listed: Vec<String> = u.jobs.iter().map(u64::to_string).collect();
                if u.jobs_count as usize > u.jobs.len() {
                    listed.push(format!("+{}", u.jobs_count as usize - u.jobs.len()));
                }
                listed.join(" ")
            }
        };
        table.add_row([
            stat.object.to_string(),
            stat.size.to_string(),
            age.unwrap_or_default(),
            jobs,
        ]);
    }
    println!("{table}");
    Ok(())
}

/// Which kept jobs use each of `stats`' objects, asked of the driver a page at a time.
async fn uses(
    client: &EmberClient,
    stats: &[ObjectStat],
) -> anyhow::Result<HashMap<ObjectRef, ObjectUse>> {
    let mut uses = HashMap::new();
    for page in stats.chunks(MAX_OBJECTS_ASKED) {
        let objects = page.iter().map(|s| s.object.clone()).collect();
        match client.call(&ApiRequest::ObjectUses { objects }).await? {
            ApiReply::ObjectUses { uses: answered } => {
                uses.extend(answered.into_iter().map(|u| (u.object.clone(), u)))
            }
            other => anyhow::bail!("unexpected answer from the driver: {other:?}"),
        }
    }
    Ok(uses)
}
