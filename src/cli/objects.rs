//! `ember put` and `ember objects`: the cluster's object store from the command line.

use crate::client::EmberClient;
use crate::objects::{ObjectRef, ObjectStat};
use crate::text::format_time;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct PutArgs {
    /// The files to put. Each one's reference (the SHA-256 of its content) is printed on a
    /// line of its own, in the order given; what the store holds already is not sent again.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

#[derive(clap::Subcommand)]
pub enum ObjectsCommand {
    /// List the objects the store holds, with their size and when each was put.
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
            if *json {
                println!("{}", serde_json::json!({ "objects": stats }));
            } else {
                println!("{}", table(&stats));
            }
        }
        ObjectsCommand::Stat { object, json } => {
            let Some(stat) = objects.stat(object).await? else {
                eprintln!("object {object} not found");
                return Ok(false);
            };
            match json {
                true => println!("{}", serde_json::to_string(&stat)?),
                false => println!("{}", table(&[stat])),
            }
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

fn table(stats: &[ObjectStat]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(["object", "bytes", "chunks", "put at"]);
    for stat in stats {
        table.add_row([
            stat.object.to_string(),
            stat.size.to_string(),
            stat.chunks.to_string(),
            stat.put_ms.map(format_time).unwrap_or_default(),
        ]);
    }
    table
}
