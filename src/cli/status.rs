//! `ember status`: the cluster at a glance on one screen: the driver that answered, the
//! executors and their cores, the jobs running with a progress bar each, and tasks ended per
//! second. Once, as JSON, or refreshed in place until Ctrl-C (`--watch`).

use crate::client::EmberClient;
use crate::placement::SITE;
use crate::protocol::{DriverInfo, ExecutorSummary, JobState, JobSummary};
use serde::Serialize;
use std::fmt::Write as _;
use std::future::Future;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How often `--watch` refreshes unless told.
pub const DEFAULT_STATUS_INTERVAL: &str = "1s";
/// The shortest refresh `--interval` takes: faster would load the driver for nothing a person
/// can read.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// The width of a job's progress bar, in characters.
const BAR_WIDTH: usize = 30;

#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// Refresh until Ctrl-C, redrawing the screen in place.
    #[arg(long)]
    pub watch: bool,
    /// How often --watch refreshes (at least 100ms).
    #[arg(long, env = "EMBER_STATUS_INTERVAL", default_value = DEFAULT_STATUS_INTERVAL,
          value_parser = parse_interval)]
    pub interval: Duration,
    /// Print the status once as one JSON object.
    #[arg(long, conflicts_with = "watch")]
    pub json: bool,
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = super::parse_duration(text)?;
    if interval < MIN_INTERVAL {
        return Err(format!("{text:?} is shorter than {MIN_INTERVAL:?}"));
    }
    Ok(interval)
}

/// The cluster at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// The driver that answered: the one that leads.
    pub driver: Option<DriverInfo>,
    pub executors: u64,
    pub pending_executors: u64,
    pub cores_total: u64,
    pub cores_free: u64,
    /// The executors and cores of each site, when some executor has one (`--site`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<SiteCount>,
    /// Jobs the driver holds, by state (finished ones as far as it retains them).
    pub jobs: JobCounts,
    /// The jobs not ended (running, and waiting for the jobs they run after), first submitted
    /// first.
    pub running: Vec<JobSummary>,
    /// Attempts ended (succeeded, failed or killed) over the jobs the driver holds.
    pub tasks_ended: u64,
    /// Tasks ended per second since the previous look, if there was one.
    pub tasks_per_second: Option<f64>,
    /// What the cluster's object store holds, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objects: Option<crate::objects::Usage>,
    /// What the registered executors have done with the objects, summed.
    pub executor_objects: crate::protocol::ObjectCounts,
}

/// The executors at one site, and their cores.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SiteCount {
    /// The site; none for the executors started without one.
    pub site: Option<String>,
    pub executors: u64,
    pub cores_total: u64,
    pub cores_free: u64,
}

/// The executors counted by site, sites by name and those without one last; empty when no
/// executor has a site.
pub fn by_site(executors: &[ExecutorSummary]) -> Vec<SiteCount> {
    if executors.iter().all(|e| !e.attributes.contains_key(SITE)) {
        return Vec::new();
    }
    let mut sites = std::collections::BTreeMap::<(bool, Option<&String>), SiteCount>::new();
    for e in executors {
        let site = e.attributes.get(SITE);
        let count = sites
            .entry((site.is_none(), site))
            .or_insert_with(|| SiteCount {
                site: site.cloned(),
                ..Default::default()
            });
        count.executors += 1;
        count.cores_total += u64::from(e.total_cores);
        count.cores_free += u64::from(e.free_cores);
    }
    sites.into_values().collect()
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct JobCounts {
    /// Jobs waiting for the jobs they run after.
    pub waiting: u64,
    pub running: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub killed: u64,
}

/// What an earlier look saw: when, and how many tasks had ended.
#[derive(Debug, Clone, Copy)]
pub struct Previous {
    at: Instant,
    tasks_ended: u64,
}

/// Asks the driver for the registry and the jobs; with `previous`, works out tasks per
/// second since then.
pub async fn fetch(client: &EmberClient, previous: Option<Previous>) -> anyhow::Result<Status> {
    let (snapshot, jobs) = tokio::try_join!(client.executors(), client.jobs())?;
    // A cluster without a store (no journal), or a user without its rights, shows none.
    let objects = match client.objects().await {
        Ok(store) => store.usage().await.ok(),
        Err(_) => None,
    };
    let at = Instant::now();
    let mut counts = JobCounts::default();
    for job in &jobs {
        *match job.state {
            JobState::Waiting => &mut counts.waiting,
            JobState::Running => &mut counts.running,
            JobState::Succeeded => &mut counts.succeeded,
            JobState::Failed => &mut counts.failed,
            JobState::Killed => &mut counts.killed,
        } += 1;
    }
    let tasks_ended: u64 = jobs.iter().map(ended).sum();
    let tasks_per_second = previous.map(|p| {
        // Fewer than before (finished jobs forgotten, a new driver): nothing to measure.
        let more = tasks_ended.saturating_sub(p.tasks_ended);
        more as f64 / at.duration_since(p.at).as_secs_f64().max(1e-3)
    });
    Ok(Status {
        driver: snapshot.driver,
        executors: snapshot.registered_executors,
        pending_executors: snapshot.pending_executors,
        cores_total: snapshot.total_cores,
        cores_free: snapshot
            .executors
            .iter()
            .map(|e| u64::from(e.free_cores))
            .sum(),
        sites: by_site(&snapshot.executors),
        jobs: counts,
        running: jobs.into_iter().filter(|j| !j.state.is_ended()).collect(),
        tasks_ended,
        tasks_per_second,
        objects,
        executor_objects: snapshot.objects,
    })
}

impl Status {
    /// What the next look measures tasks per second against.
    pub fn previous(&self, at: Instant) -> Previous {
        Previous {
            at,
            tasks_ended: self.tasks_ended,
        }
    }
}

fn ended(job: &JobSummary) -> u64 {
    u64::from(job.succeeded) + u64::from(job.failed) + u64::from(job.killed)
}

/// The screen for `status` of cluster `cluster`.
pub fn render(status: &Status, cluster: &str) -> String {
    let mut out = String::new();
    let driver = match &status.driver {
        Some(d) if d.epoch > 0 => {
            format!("driver {} leading in epoch {}", d.driver_instance, d.epoch)
        }
        Some(d) => format!("driver {} (no journal, no lease)", d.driver_instance),
        None => "driver unknown".into(),
    };
    let _ = writeln!(out, "Ember cluster {cluster}: {driver}");
    let _ = writeln!(
        out,
        "executors  {} ({} pending), cores {} total, {} free",
        status.executors, status.pending_executors, status.cores_total, status.cores_free
    );
    for s in &status.sites {
        let site = s
            .site
            .as_ref()
            .map_or("no site".to_string(), |site| format!("site {site}"));
        let plural = if s.executors == 1 { "" } else { "s" };
        let _ = writeln!(
            out,
            "           {site}: {} executor{plural}, cores {} total, {} free",
            s.executors, s.cores_total, s.cores_free
        );
    }
    let j = &status.jobs;
    let waiting = match j.waiting {
        0 => String::new(),
        n => format!(", {n} waiting"),
    };
    let _ = writeln!(
        out,
        "jobs       {} running{waiting}, {} succeeded, {} failed, {} killed",
        j.running, j.succeeded, j.failed, j.killed
    );
    let rate = status
        .tasks_per_second
        .map_or("-".to_string(), |r| format!("{r:.1}"));
    let _ = writeln!(out, "tasks/s    {rate}");
    if let Some(usage) = &status.objects {
        let limit = usage
            .max_bytes
            .map_or("no limit".to_string(), |m| format!("of at most {m}"));
        let _ = writeln!(out, "objects    {} bytes stored, {limit}", usage.bytes);
    }
    let o = &status.executor_objects;
    if *o != Default::default() {
        let _ = writeln!(
            out,
            "           executors fetched {} ({} bytes), took {} from their hosts ({} bytes), \
             cache hits {}, misses {}; put {} ({} bytes sent)",
            o.fetches,
            o.fetched_bytes,
            o.host_takes,
            o.host_taken_bytes,
            o.cache_hits,
            o.cache_misses,
            o.puts,
            o.put_bytes
        );
    }
    for job in &status.running {
        let _ = writeln!(out, "{}", job_line(job));
    }
    out
}

/// One running job: its id and name, a progress bar, and its counts.
fn job_line(job: &JobSummary) -> String {
    if job.state == JobState::Waiting {
        let jobs: Vec<String> = job.waits_for.iter().map(|id| id.to_string()).collect();
        return format!(
            "job {:<5} {:<16} waits for job{} {} to end",
            job.job_id,
            job.name,
            if jobs.len() == 1 { "" } else { "s" },
            jobs.join(", ")
        );
    }
    let done = ended(job);
    let tasks = u64::from(job.tasks).max(1);
    let filled = (done * BAR_WIDTH as u64 / tasks) as usize;
    let bar = "█".repeat(filled) + &"░".repeat(BAR_WIDTH - filled.min(BAR_WIDTH));
    format!(
        "job {:<5} {:<16} {bar} {:>3}%  {}/{} done, {} running, {} failed, {} killed",
        job.job_id,
        job.name,
        done * 100 / tasks,
        done,
        job.tasks,
        job.running,
        job.failed,
        job.killed
    )
}

/// Prints the status once (as text or JSON), or with `--watch` refreshes it every interval
/// until `shutdown`. While watching, a driver that does not answer is shown as such and
/// asked again at the next refresh.
pub async fn status(
    client: &EmberClient,
    cluster: &str,
    args: &StatusArgs,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    if !args.watch {
        let status = fetch(client, None).await?;
        match args.json {
            true => println!("{}", serde_json::to_string(&status)?),
            false => print!("{}", render(&status, cluster)),
        }
        return Ok(());
    }
    tokio::pin!(shutdown);
    let mut ticks = tokio::time::interval(args.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let terminal = std::io::stdout().is_terminal();
    let mut previous = None;
    loop {
        let fetched = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            fetched = async { ticks.tick().await; fetch(client, previous).await } => fetched,
        };
        let screen = match fetched {
            Ok(status) => {
                previous = Some(status.previous(Instant::now()));
                render(&status, cluster)
            }
            Err(error) => {
                format!("Ember cluster {cluster}: no answer from the driver ({error:#})\n")
            }
        };
        draw(&screen, terminal)?;
    }
}

/// Draws a screen: over the last one on a terminal, else after it with a blank line between.
fn draw(screen: &str, terminal: bool) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match terminal {
        // Cursor home, the screen cleared below it.
        true => write!(out, "\x1b[H\x1b[J{screen}")?,
        false => writeln!(out, "{screen}")?,
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(tasks: u32, succeeded: u32, running: u32) -> JobSummary {
        JobSummary {
            pool: None,
            priority: 0,
            speculative: None,
            job_id: 7,
            name: "sleepers".into(),
            state: JobState::Running,
            tasks,
            succeeded,
            failed: 0,
            killed: 0,
            running,
            submitted_at_ms: 0,
            ended_at_ms: None,
            reason: None,
            waiting: None,
            placement: None,
            waits_for: Vec::new(),
            waits: Vec::new(),
            concurrency_key: None,
            key_limits: None,
        }
    }

    #[test]
    fn a_job_line_shows_its_progress_as_a_bar_and_counts() {
        let line = job_line(&job(40, 10, 4));
        assert!(line.starts_with("job 7 "), "{line}");
        assert!(line.contains(" 25%"), "{line}");
        assert!(line.contains("10/40 done, 4 running"), "{line}");
        assert_eq!(line.matches('█').count(), BAR_WIDTH / 4);
        assert_eq!(line.matches('░').count(), BAR_WIDTH - BAR_WIDTH / 4);
        let done = job_line(&job(3, 3, 0));
        assert!(done.contains("100%"), "{done}");
        assert_eq!(done.matches('█').count(), BAR_WIDTH);
    }

    #[test]
    fn executors_are_counted_by_site_only_when_one_has_a_site() {
        let executor = |id: &str, site: Option<&str>, total: u32, free: u32| {
            let attributes = site.map(|s| (SITE.to_string(), s.to_string()));
            serde_json::from_value::<ExecutorSummary>(serde_json::json!({
                "executor_id": id, "host": "h", "host_port": "h:0", "free_cores": free,
                "total_cores": total, "log_urls": {}, "registered_at_ms": 0,
                "attributes": attributes.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
            }))
            .expect("an executor summary")
        };
        assert!(by_site(&[executor("a", None, 4, 4)]).is_empty());
        let sites = by_site(&[
            executor("a", None, 4, 1),
            executor("b", Some("hub"), 8, 2),
            executor("c", Some("edge"), 2, 2),
            executor("d", Some("hub"), 8, 8),
        ]);
        let shown: Vec<_> = sites
            .iter()
            .map(|s| (s.site.as_deref(), s.executors, s.cores_total, s.cores_free))
            .collect();
        assert_eq!(
            shown,
            [
                (Some("edge"), 1, 2, 2),
                (Some("hub"), 2, 16, 10),
                (None, 1, 4, 1)
            ]
        );
    }

    #[test]
    fn an_interval_below_the_least_is_refused() {
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_interval("0s").is_err());
        assert!(parse_interval("10ms").is_err());
        assert!(parse_interval("soon").is_err());
    }
}
