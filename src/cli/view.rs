//! `ember events`, `ember executors` and `ember jobs`: what the cluster is doing, for people
//! (tables, one line per event) and for programs (`--json`).

use crate::client::EmberClient;
use crate::subjects::Subjects;
use crate::text::format_time;
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
/// What an executor's abandoned handlers hold, in one line; none when it has none.
pub fn abandoned_line(e: &crate::protocol::ExecutorSummary) -> Option<String> {
    if e.abandoned.is_empty() {
        return None;
    }
    let handlers = e.abandoned.len();
    let cores: u64 = e.abandoned.iter().map(|a| u64::from(a.cpus)).sum();
    let attempts: Vec<String> = e
        .abandoned
        .iter()
        .map(|a| {
            format!(
                "task {} attempt {}, abandoned at {}",
                a.task_id,
                a.attempt,
                format_time(a.since_ms)
            )
        })
        .collect();
    let (handler, holds) = match handlers {
        1 => ("handler", "holds"),
        _ => ("handlers", "hold"),
    };
    let core = if cores == 1 { "core" } else { "cores" };
    Some(format!(
        "executor {}: {handlers} abandoned {handler} {holds} {cores} {core} ({})",
        e.executor_id,
        attempts.join("; ")
    ))
}

pub async fn show_executors(client: &EmberClient, json: bool) -> anyhow::Result<()> {
    let snapshot = client.executors().await?;
    if json {
        println!("{}", serde_json::to_string(&snapshot)?);
        return Ok(());
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    // A resources column only when some executor has custom resources, a site column (and
    // the rows grouped by site) only when some executor has a site.
    let resources = snapshot.executors.iter().any(|e| !e.resources.is_empty());
    let sites = super::status::by_site(&snapshot.executors);
    fn site(e: &crate::protocol::ExecutorSummary) -> Option<&String> {
        e.attributes.get(crate::placement::SITE)
    }
    let mut executors: Vec<_> = snapshot.executors.iter().collect();
    executors.sort_by_key(|e| (site(e).is_none(), site(e)));
    let mut header = vec!["executor", "host:port"];
    if !sites.is_empty() {
        header.push("site");
    }
    header.push("cores free/total");
    if resources {
        header.push("resources free/total");
    }
    header.push("registered at");
    table.set_header(header);
    for e in executors {
        let mut row = vec![e.executor_id.to_string(), e.host_port.clone()];
        if !sites.is_empty() {
            row.push(site(e).cloned().unwrap_or_default());
        }
        row.push(format!("{}/{}", e.free_cores, e.total_cores));
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
        if let Some(line) = abandoned_line(e) {
            println!("{line}");
        }
    }
    println!(
        "{} executors registered, {} cores in total, {} pending",
        snapshot.registered_executors, snapshot.total_cores, snapshot.pending_executors
    );
    for s in &sites {
        let site = s
            .site
            .as_ref()
            .map_or("no site".to_string(), |site| format!("site {site}"));
        let plural = if s.executors == 1 { "" } else { "s" };
        println!(
            "{site}: {} executor{plural}, {} of {} cores free",
            s.executors, s.cores_free, s.cores_total
        );
    }
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
    println!("{}", jobs_table(&jobs));
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
    for line in jobs.iter().filter_map(speculative_line) {
        println!("{line}");
    }
    for line in jobs.iter().filter_map(key_line) {
        println!("{line}");
    }
    Ok(())
}

/// `job 7 concurrency key api: 4 at once, 10/s`, or that it has none, for an open job that
/// names a key.
fn key_line(job: &crate::protocol::JobSummary) -> Option<String> {
    let key = job
        .concurrency_key
        .as_deref()
        .filter(|_| !job.state.is_ended())?;
    let limits = job.key_limits.unwrap_or_default();
    Some(match limits.is_none() {
        true => format!(
            "job {} concurrency key {key}: no limits set, it runs unlimited",
            job.job_id
        ),
        false => format!("job {} concurrency key {key}: {limits}", job.job_id),
    })
}

/// `job 7 speculative copies: 2 launched, 1 finished first`, for a job with speculation on.
fn speculative_line(job: &crate::protocol::JobSummary) -> Option<String> {
    let copies = job.speculative?;
    Some(format!(
        "job {} speculative copies: {} launched, {} finished first",
        job.job_id, copies.launched, copies.won
    ))
}

/// Prints the scheduling mode and the pools as a table, or as JSON.
pub async fn show_pools(client: &EmberClient, json: bool) -> anyhow::Result<()> {
    let (scheduling, pools) = client.pools().await?;
    if json {
        println!(
            "{}",
            serde_json::json!({ "scheduling": scheduling, "pools": pools })
        );
        return Ok(());
    }
    if pools.is_empty() {
        println!("scheduling {scheduling}: jobs run by priority, then oldest first; no pools");
        return Ok(());
    }
    println!("{}", pools_table(&pools));
    println!("scheduling {scheduling}: pools in the order offers serve them now");
    Ok(())
}

fn pools_table(pools: &[crate::protocol::PoolSummary]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header([
        "pool",
        "weight",
        "min share",
        "mode",
        "cores in use",
        "jobs",
    ]);
    for p in pools {
        let name = match p.declared {
            true => p.name.clone(),
            false => format!("{} (undeclared)", p.name),
        };
        table.add_row([
            name,
            p.weight.to_string(),
            p.min_share.to_string(),
            p.mode.clone(),
            p.running_cores.to_string(),
            p.jobs.to_string(),
        ]);
    }
    table
}

/// The jobs as a table; pool and priority columns only when some job has one.
fn jobs_table(jobs: &[crate::protocol::JobSummary]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    let pools = jobs.iter().any(|j| j.pool.is_some() || j.priority != 0);
    let mut header = vec!["job", "name", "state"];
    if pools {
        header.extend(["pool", "priority"]);
    }
    header.extend([
        "tasks",
        "succeeded",
        "failed",
        "killed",
        "running",
        "submitted at",
    ]);
    table.set_header(header);
    for j in jobs {
        let mut row = vec![j.job_id.to_string(), j.name.clone(), j.state.to_string()];
        if pools {
            let pool = j
                .pool
                .as_deref()
                .unwrap_or(crate::driver::core::DEFAULT_POOL);
            row.extend([pool.to_string(), j.priority.to_string()]);
        }
        row.extend([
            j.tasks.to_string(),
            j.succeeded.to_string(),
            j.failed.to_string(),
            j.killed.to_string(),
            j.running.to_string(),
            format_time(j.submitted_at_ms),
        ]);
        table.add_row(row);
    }
    table
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{JobState, JobSummary};

    fn job(job_id: u64, pool: Option<&str>, priority: i32) -> JobSummary {
        JobSummary {
            pool: pool.map(str::to_string),
            priority,
            job_id,
            name: "n".into(),
            state: JobState::Running,
            tasks: 4,
            succeeded: 1,
            failed: 0,
            killed: 0,
            running: 2,
            submitted_at_ms: 0,
            ended_at_ms: None,
            reason: None,
            waiting: None,
            placement: None,
            speculative: None,
            waits_for: Vec::new(),
            waits: Vec::new(),
            concurrency_key: None,
            key_limits: None,
        }
    }

    #[test]
    fn speculative_copies_are_shown_only_for_a_job_with_speculation() {
        assert_eq!(speculative_line(&job(1, None, 0)), None);
        let copies = crate::protocol::SpeculativeCounts {
            launched: 3,
            won: 1,
        };
        let speculating = JobSummary {
            speculative: Some(copies),
            ..job(2, None, 0)
        };
        assert_eq!(
            speculative_line(&speculating).as_deref(),
            Some("job 2 speculative copies: 3 launched, 1 finished first")
        );
    }

    #[test]
    fn the_jobs_table_shows_pools_and_priorities_only_when_a_job_has_one() {
        let plain = jobs_table(&[job(1, None, 0)]).to_string();
        assert!(
            !plain.contains("pool") && !plain.contains("priority"),
            "{plain}"
        );
        let table = jobs_table(&[job(1, None, 0), job(2, Some("etl"), -2)]).to_string();
        let header = table.lines().nth(1).unwrap();
        assert!(
            header.contains("pool") && header.contains("priority"),
            "{table}"
        );
        let rows: Vec<&str> = table.lines().filter(|l| l.contains("RUNNING")).collect();
        assert!(
            rows[0].contains("default") && rows[0].contains(" 0 "),
            "{table}"
        );
        assert!(
            rows[1].contains("etl") && rows[1].contains(" -2 "),
            "{table}"
        );
    }
}
