//! `ember events`: the cluster's events, one line each or as their wire JSON, live or from
//! the event history (`--since`, `--from-start`), of every job or one (`--job`).

use crate::events;
use crate::history::{self, Reader, Start};
use crate::protocol::Event;
use crate::subjects::Subjects;
use async_nats::Client;
use futures::StreamExt;
use std::future::Future;
use std::io::Write;
use std::time::SystemTime;

/// What `ember events` shows.
#[derive(Debug, Clone, clap::Args)]
pub struct EventsArgs {
    /// Print each event as its wire JSON, one object per line.
    #[arg(long, env = "EMBER_EVENTS_JSON")]
    pub json: bool,
    /// Start with the events stored in the last DURATION (10m, 2h) or since an RFC 3339 time
    /// (2026-01-31T09:00:00Z), from the event history; prints them and exits unless --follow.
    #[arg(long, env = "EMBER_EVENTS_SINCE", value_name = "DURATION|TIME",
          value_parser = history::parse_since, conflicts_with = "from_start")]
    pub since: Option<SystemTime>,
    /// Start with the oldest event the history still holds; prints them and exits unless
    /// --follow.
    #[arg(long, env = "EMBER_EVENTS_FROM_START")]
    pub from_start: bool,
    /// Show only the events of this job (its start, its tasks' starts and ends, its end).
    #[arg(long, env = "EMBER_EVENTS_JOB", value_name = "JOB_ID")]
    pub job: Option<u64>,
    /// Keep following new events after the range; the default when no range is given.
    #[arg(long, env = "EMBER_EVENTS_FOLLOW")]
    pub follow: bool,
}

impl EventsArgs {
    /// Where reading starts, if a range is asked for.
    fn range(&self) -> Option<Start> {
        match (self.from_start, self.since) {
            (true, _) => Some(Start::All),
            (false, Some(since)) => Some(Start::Since(since)),
            (false, None) => None,
        }
    }
}

/// Whether an event is shown when only `job`'s are, if only one job's are.
fn shows(job: Option<u64>, event: &Result<Event, String>) -> bool {
    match (job, event) {
        (None, _) => true,
        (Some(job), Ok(event)) => event.job_id() == Some(job),
        (Some(_), Err(_)) => false,
    }
}

/// Runs `ember events` until `shutdown` (or, for a range without --follow, its end).
pub async fn events(
    client: &Client,
    subjects: &Subjects,
    args: &EventsArgs,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let reader = match args.range() {
        Some(start) => Reader::open(client, subjects, start).await?,
        None => match Reader::open(client, subjects, Start::New).await {
            Ok(reader) => reader,
            Err(error) => {
                eprintln!("ember: {error}; following the events live instead");
                return follow_live(client, subjects, args.json, args.job, shutdown).await;
            }
        },
    };
    read_history(reader, args, shutdown).await
}

/// Prints the history from the reader's start, until its end unless it follows; then closes
/// the reader.
async fn read_history(
    mut reader: Reader,
    args: &EventsArgs,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let read = print_history(&mut reader, args, shutdown).await;
    reader.close().await;
    read
}

async fn print_history(
    reader: &mut Reader,
    args: &EventsArgs,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let stops_at_end = args.range().is_some() && !args.follow;
    if stops_at_end && reader.empty_at_open() {
        return Ok(());
    }
    tokio::pin!(shutdown);
    let mut out = std::io::stdout();
    loop {
        let stored = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            stored = reader.next() => stored,
        };
        if stored.current && shows(args.job, &stored.event) {
            print(&mut out, args.json, &stored.payload, stored.event)?;
        }
        if stops_at_end && stored.pending == 0 {
            return Ok(());
        }
    }
}

/// Follows the plain event subjects until `shutdown`, every job's events or only `job`'s: one
/// line per event, or the wire JSON.
pub async fn follow_live(
    client: &Client,
    subjects: &Subjects,
    json: bool,
    job: Option<u64>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let subscriber = events::subscribe(client, subjects).await?;
    client.flush().await?;
    let mut stream = Box::pin(events::decoded(subscriber));
    tokio::pin!(shutdown);
    let mut out = std::io::stdout();
    loop {
        let (raw, event) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            item = stream.next() => match item {
                Some(item) => item,
                None => anyhow::bail!("the event subscription closed"),
            },
        };
        if shows(job, &event) {
            print(&mut out, json, &raw, event)?;
        }
    }
}

fn print(
    out: &mut impl Write,
    json: bool,
    raw: &[u8],
    event: Result<Event, String>,
) -> std::io::Result<()> {
    if json {
        out.write_all(raw)?;
        out.write_all(b"\n")?;
    } else {
        match event {
            Ok(event) => writeln!(out, "{}", events::describe(&event))?,
            Err(error) => writeln!(out, "undecodable event: {error}")?,
        }
    }
    out.flush()
}
