//! `ember limits`: the limits of concurrency keys, which every job that names a key shares.

use crate::client::EmberClient;
use crate::protocol::{KeyLimits, KeySummary, Rate};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

#[derive(clap::Args)]
pub struct LimitsArgs {
    #[command(subcommand)]
    pub command: Option<LimitsCommand>,
    /// Print `{"keys": [...]}` instead of a table (when listing).
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Subcommand)]
pub enum LimitsCommand {
    /// Set a key's limits (journaled: they outlive the driver). The running tasks of all jobs
    /// that name the key (`ember submit --concurrency-key KEY`) stay within them; a limit not
    /// given is lifted.
    Set {
        /// The key (1 to 64 letters, digits, '_', '-' or '.').
        key: String,
        /// At most this many of the key's tasks run at once.
        #[arg(long, value_name = "N")]
        max_concurrent: Option<u32>,
        /// At most this many of the key's tasks start in any window of the period: 10/s,
        /// 600/min, 5/h, 1/day, or a count over a duration (3/500ms).
        #[arg(long, value_name = "COUNT/PERIOD", value_parser = Rate::parse)]
        rate: Option<Rate>,
    },
    /// Lift a key's limits: its jobs run unlimited.
    Clear {
        /// The key.
        key: String,
    },
}

/// Runs `ember limits`: lists the keys, or sets or clears one's limits.
pub async fn limits(client: &EmberClient, args: &LimitsArgs) -> anyhow::Result<()> {
    match &args.command {
        None => {
            let keys = client.keys().await?;
            if args.json {
                println!("{}", serde_json::json!({ "keys": keys }));
            } else if keys.is_empty() {
                println!("no concurrency key has limits or an open job");
            } else {
                println!("{}", keys_table(&keys));
            }
        }
        Some(LimitsCommand::Set {
            key,
            max_concurrent,
            rate,
        }) => {
            let limits = KeyLimits {
                max_concurrent: *max_concurrent,
                rate: *rate,
            };
            if limits.is_none() {
                anyhow::bail!(
                    "give --max-concurrent, --rate or both (`ember limits clear {key}` lifts \
                     the limits)"
                );
            }
            limits.validate().map_err(anyhow::Error::msg)?;
            let set = client.set_key_limits(key, limits).await?;
            println!("concurrency key {}: {}", set.key, set.limits);
        }
        Some(LimitsCommand::Clear { key }) => {
            let set = client.set_key_limits(key, KeyLimits::default()).await?;
            println!(
                "concurrency key {}: no limits, its jobs run unlimited",
                set.key
            );
        }
    }
    Ok(())
}

fn keys_table(keys: &[KeySummary]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(["key", "limits", "running", "open jobs", "started in window"]);
    for k in keys {
        let started = match (k.started_in_window, k.limits.rate) {
            (Some(n), Some(rate)) => format!("{n} of {}", rate.count),
            _ => "-".into(),
        };
        table.add_row([
            k.key.clone(),
            k.limits.to_string(),
            k.running.to_string(),
            k.jobs.to_string(),
            started,
        ]);
    }
    table
}
