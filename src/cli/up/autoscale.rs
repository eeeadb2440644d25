//! `ember up --autoscale MIN..MAX`: local executor processes that follow the driver's dynamic
//! allocation target. Every half second it reads the target from the api: below it, it starts
//! executors (ids `exec-N`, the lowest free); above it, it releases those the driver lists as
//! idle, through `ReleaseExecutor`, which decommissions an executor only if it runs nothing.
//! A released executor drains and exits by itself; it is never killed.

use super::local::Launcher;
use crate::cli::{parse_duration, show_duration};
use crate::client::EmberClient;
use crate::driver::core::{DEFAULT_BACKLOG_TIMEOUT, DEFAULT_IDLE_TIMEOUT};
use crate::ids::ExecutorId;
use crate::protocol::{AllocationStatus, ExecutorsSnapshot};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::process::Child;
use tokio::time::Instant;

/// How often the target is read.
const POLL: Duration = Duration::from_millis(500);
/// How long a released executor may take to leave before it is asked again (the first
/// decommission may have been lost).
const RELEASE_AGAIN: Duration = Duration::from_secs(15);

/// The flags of autoscaling.
#[derive(Debug, Clone, clap::Args)]
pub struct Scaling {
    /// Start and release executors to follow the driver's dynamic allocation target, between
    /// MIN and MAX (written `1..8`); replaces --executors.
    #[arg(long, env = "EMBER_UP_AUTOSCALE", value_name = "MIN..MAX", value_parser = parse_range,
          conflicts_with = "executors")]
    pub autoscale: Option<(u32, u32)>,
    /// With --autoscale: ask for more executors once tasks have waited this long (the
    /// driver's --backlog-timeout).
    #[arg(long, env = "EMBER_UP_BACKLOG_TIMEOUT",
          default_value = show_duration(DEFAULT_BACKLOG_TIMEOUT),
          value_parser = parse_duration, requires = "autoscale")]
    pub backlog_timeout: Duration,
    /// With --autoscale: release an executor that has run nothing for this long (the driver's
    /// --idle-timeout).
    #[arg(long, env = "EMBER_UP_IDLE_TIMEOUT", default_value = show_duration(DEFAULT_IDLE_TIMEOUT),
          value_parser = parse_duration, requires = "autoscale")]
    pub idle_timeout: Duration,
}

impl Scaling {
    pub fn range(&self) -> Option<(u32, u32)> {
        self.autoscale
    }

    /// The driver's flags that turn its signal on.
    pub fn driver_flags(&self) -> Vec<String> {
        let Some((min, max)) = self.autoscale else {
            return Vec::new();
        };
        let time = |d: Duration| humantime::format_duration(d).to_string();
        vec![
            "--min-executors".into(),
            min.to_string(),
            "--max-executors".into(),
            max.to_string(),
            "--backlog-timeout".into(),
            time(self.backlog_timeout),
            "--idle-timeout".into(),
            time(self.idle_timeout),
        ]
    }
}

/// Parses `MIN..MAX`: at least 1 executor at most, MIN no more than MAX.
pub fn parse_range(text: &str) -> Result<(u32, u32), String> {
    let hint = "write MIN..MAX, e.g. 1..8";
    let (min, max) = text
        .split_once("..")
        .ok_or_else(|| format!("{text:?} is not a range ({hint})"))?;
    let number = |n: &str| {
        n.trim()
            .parse::<u32>()
            .map_err(|_| format!("{n:?} in {text:?} is not a number ({hint})"))
    };
    let (min, max) = (number(min)?, number(max)?);
    if max == 0 || min > max {
        return Err(format!(
            "{text:?}: MAX must be at least 1 and MIN no more than MAX"
        ));
    }
    Ok((min, max))
}

/// One executor process started here.
struct Member {
    child: Child,
    /// When it was released, if it was.
    released: Option<Instant>,
}

/// The executors `ember up` runs, following the target.
pub struct Pool<'a> {
    launcher: &'a Launcher,
    api: EmberClient,
    cores: Option<u32>,
    max: u32,
    members: BTreeMap<u32, Member>,
    last_target: Option<u64>,
}

impl<'a> Pool<'a> {
    pub fn new(launcher: &'a Launcher, api: EmberClient, cores: Option<u32>, max: u32) -> Self {
        Self {
            launcher,
            api,
            cores,
            max,
            members: BTreeMap::new(),
            last_target: None,
        }
    }

    /// Starts `min` executors, then follows the target until `until` completes.
    pub async fn follow(
        &mut self,
        min: u32,
        until: impl std::future::Future<Output = anyhow::Result<()>>,
    ) -> anyhow::Result<()> {
        self.start(u64::from(min), &[])?;
        tokio::pin!(until);
        let mut poll = tokio::time::interval(POLL);
        loop {
            tokio::select! {
                result = &mut until => return result,
                _ = poll.tick() => self.step().await?,
            }
        }
    }

    /// The processes, to be stopped.
    pub fn into_children(self) -> Vec<Child> {
        self.members.into_values().map(|m| m.child).collect()
    }

    async fn step(&mut self) -> anyhow::Result<()> {
        self.reap();
        // The driver may not be up yet, or be failing over: the next poll asks again.
        let Ok(snapshot) = self.api.executors().await else {
            return Ok(());
        };
        let Some(allocation) = snapshot.allocation.clone() else {
            return Ok(());
        };
        if self.last_target != Some(allocation.target_executors) {
            eprintln!(
                "autoscale: target {} executors: {}",
                allocation.target_executors, allocation.reason
            );
            self.last_target = Some(allocation.target_executors);
        }
        let live = self
            .members
            .values()
            .filter(|m| m.released.is_none())
            .count() as u64;
        let target = allocation.target_executors.min(u64::from(self.max));
        if target > live {
            let registered = registered(&snapshot);
            self.start(target - live, &registered)?;
        } else if live > target {
            self.release(&allocation, (live - target) as usize).await;
        }
        self.release_again().await;
        Ok(())
    }

    /// Starts `n` executors on the lowest ids neither running here nor registered.
    fn start(&mut self, n: u64, registered: &[String]) -> anyhow::Result<()> {
        let mut started = Vec::new();
        for index in 1..=self.max {
            if started.len() as u64 >= n {
                break;
            }
            let id = format!("exec-{index}");
            if self.members.contains_key(&index) || registered.contains(&id) {
                continue;
            }
            let child = self.launcher.executor(&id, self.cores)?;
            self.members.insert(
                index,
                Member {
                    child,
                    released: None,
                },
            );
            started.push(id);
        }
        if !started.is_empty() {
            eprintln!("autoscale: starting {}", started.join(", "));
        }
        Ok(())
    }

    /// Releases up to `n` of the executors the driver lists as idle.
    async fn release(&mut self, allocation: &AllocationStatus, n: usize) {
        let ours = allocation
            .idle
            .iter()
            .filter_map(|id| Some((index_of(id)?, id)))
            .filter(|(i, _)| self.members.get(i).is_some_and(|m| m.released.is_none()))
            .take(n)
            .collect::<Vec<_>>();
        for (index, id) in ours {
            match self.api.release_executor(id.clone()).await {
                Ok(()) => {
                    eprintln!("autoscale: releasing idle {id}");
                    if let Some(member) = self.members.get_mut(&index) {
                        member.released = Some(Instant::now());
                    }
                }
                // Busy again since the driver listed it, say: it stays.
                Err(error) => eprintln!("autoscale: {id} stays: {error}"),
            }
        }
    }

    /// Asks again for released executors that have not left in a while.
    async fn release_again(&mut self) {
        for (index, member) in &mut self.members {
            let Some(at) = member.released else { continue };
            if at.elapsed() < RELEASE_AGAIN {
                continue;
            }
            member.released = Some(Instant::now());
            if let Ok(id) = ExecutorId::parse(format!("exec-{index}")) {
                let _ = self.api.release_executor(id).await;
            }
        }
    }

    /// Forgets executors that have exited, saying so.
    fn reap(&mut self) {
        self.members
            .retain(|index, member| match member.child.try_wait() {
                Ok(Some(status)) => {
                    let how = if member.released.is_some() {
                        "released"
                    } else {
                        "unexpectedly"
                    };
                    eprintln!("autoscale: exec-{index} exited ({how}, {status})");
                    false
                }
                _ => true,
            });
    }
}

fn registered(snapshot: &ExecutorsSnapshot) -> Vec<String> {
    snapshot
        .executors
        .iter()
        .map(|e| e.executor_id.to_string())
        .collect()
}

/// N of `exec-N`.
fn index_of(id: &ExecutorId) -> Option<u32> {
    id.as_str().strip_prefix("exec-")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::parse_range;

    #[test]
    fn ranges_parse_and_nonsense_is_refused() {
        assert_eq!(parse_range("1..8"), Ok((1, 8)));
        assert_eq!(parse_range("0..3"), Ok((0, 3)));
        for bad in ["", "8", "1-8", "8..1", "0..0", "a..b", "1..", "-1..4"] {
            assert!(parse_range(bad).is_err(), "{bad:?}");
        }
    }
}
