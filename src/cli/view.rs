//! `ember events`, `ember executors` and `ember jobs`: what the cluster is doing, for people
//! (tables, one line per event) and for programs (`--json`).

use super::format_time;
use crate::client::EmberClient;
use crate::subjects::Subjects;
use async_nats::Client;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use std::future::Future;

/// Follows the listener bus until `shutdown`: one line per event, or the wire JSON.
pub async fn follow_events(
    client: &Client,
    subjects: &Subjects,
    json: bool,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    super::events::follow_live(client, subjects, json, None, shutdown).await
}

/// Prints the registry as a table with its totals, or as JSON.
pub async fn show_executors(client: &EmberClient, json: bool) -> anyhow::Result<()> {
    let snapshot = client.executors().await?;
    if json {
        println!("{}", serde_json::to_string(&snapshot)?);
        return Ok(());
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    // A resources column only when some executor has custom resources.
    let resources = snapshot.executors.iter().any(|e| !e.resources.is_empty());
    let mut header = vec!["executor", "host:port", "cores free/total"];
    if resources {
        header.push("resources free/total");
    }
    header.push("registered at");
    table.set_header(header);
    for e in &snapshot.executors {
        let mut row = vec![
            e.executor_id.to_string(),
            e.host_port.clone(),
            format!("{}/{}", e.free_cores, e.total_cores),
        ];
        if resources {
            row.push(show_resources(&e.resources));
        }
        row.push(format_time(e.registered_at_ms));
        table.add_row(row);
    }
    println!("{table}");
    for e in &snapshot.executors {
        for x in &e.exclusions {
            println!(
                "executor {} is excluded from {} until {}: {}",
                e.executor_id,
                crate::events::exclusion_target(x.scope, x.job_id, x.index),
                format_time(x.until_ms),
                x.reason
            );
        }
    }
    println!(
        "{} executors registered, {} cores in total, {} pending",
        snapshot.registered_executors, snapshot.total_cores, snapshot.pending_executors
    );
    if let Some(gate) = &snapshot.start_gate {
        match (&gate.opened_at_ms, &gate.reason) {
            (Some(at), Some(reason)) => {
                println!("start gate opened at {}: {reason}", format_time(*at))
            }
            _ => println!(
                "start gate holds offers until {} executors have registered, or until {}",
                gate.min_registered,
                format_time(gate.opens_by_ms)
            ),
        }
    }
    match &snapshot.driver {
        Some(d) if d.epoch > 0 => println!(
            "answered by driver {}, leading in epoch {}",
            d.driver_instance, d.epoch
        ),
        Some(d) => println!(
            "answered by driver {} (no journal, no lease)",
            d.driver_instance
        ),
        None => {}
    }
    Ok(())
}

/// Prints the jobs with their state and counts, or as JSON.
pub async fn show_jobs(client: &EmberClient, json: bool) -> anyhow::Result<()> {
    let jobs = client.jobs().await?;
    if json {
        println!("{}", serde_json::json!({ "jobs": jobs }));
        return Ok(());
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header([
        "job",
        "name",
        "state",
        "tasks",
        "succeeded",
        "failed",
        "killed",
        "running",
        "submitted at",
    ]);
    for j in &jobs {
        table.add_row([
            j.job_id.to_string(),
            j.name.clone(),
            j.state.to_string(),
            j.tasks.to_string(),
            j.succeeded.to_string(),
            j.failed.to_string(),
            j.killed.to_string(),
            j.running.to_string(),
            format_time(j.submitted_at_ms),
        ]);
    }
    println!("{table}");
    for j in jobs.iter().filter(|j| j.waiting.is_some()) {
        let waiting = j.waiting.as_deref().unwrap_or_default();
        println!("job {} waits: {waiting}", j.job_id);
    }
    for j in &jobs {
        // A locality wait alone, without preferences, says nothing.
        let shown = j.placement.as_ref().map(|p| p.describe());
        if let Some(placement) = shown.filter(|d| !d.is_empty()) {
            println!("job {} placement: {placement}", j.job_id);
        }
    }
    Ok(())
}

/// `gpu 1/2, mem_gb 64/64`: each resource's free and total addresses.
fn show_resources(
    resources: &std::collections::BTreeMap<String, crate::protocol::ResourceCount>,
) -> String {
    resources
        .iter()
        .map(|(name, c)| format!("{name} {}/{}", c.free, c.total))
        .collect::<Vec<_>>()
        .join(", ")
}
