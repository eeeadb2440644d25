//! A command task's processes end with it: a timeout and a kill reach everything the command
//! started (the children of `sh -c`); a killed attempt ends once the command has (after the
//! SIGKILL, for one that ignores SIGTERM), and no status waits for what the command left
//! holding its output.

mod common;

use common::{eventually, within, TestCluster};
use ember::executor::Handlers;
use ember::protocol::{JobState, SubmitJob, TaskSpec};
use nix::errno::Errno;
use nix::sys::signal::killpg;
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Well under the 600 s the script's sleeps would last, and over the 5 s SIGKILL grace.
const LIMIT: Duration = Duration::from_secs(20);

/// A command whose shell writes its pid (the process group's id) to `pid_file`, then waits
/// on one sleep while another, in the background, holds the output pipes.
fn sleepers(pid_file: &Path, timeout_ms: Option<u64>) -> SubmitJob {
    let script = format!(
        "echo $$ > {}.tmp && mv {0}.tmp {0}; sleep 600 & sleep 600",
        pid_file.display()
    );
    SubmitJob {
        name: "group".into(),
        max_failures: 1,
        ..SubmitJob::new(vec![TaskSpec::Command {
            argv: vec!["sh".into(), "-c".into(), script],
            env: Default::default(),
            cwd: None,
            timeout_ms,
            inputs: Default::default(),
            outputs: Vec::new(),
        }])
    }
}

fn pid_file(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "ember-{name}-{}.pid",
        uuid::Uuid::new_v4().simple()
    ))
}

async fn group_of(pid_file: &Path) -> Pid {
    eventually(LIMIT, "the command's pid", || async {
        let text = std::fs::read_to_string(pid_file).ok()?;
        text.trim().parse().ok().map(Pid::from_raw)
    })
    .await
}

/// Waits until no process of group `pgid` is left: `kill(-pgid, 0)` fails with ESRCH.
async fn assert_group_gone(pgid: Pid) {
    eventually(LIMIT, "the process group to end", || async {
        (killpg(pgid, None) == Err(Errno::ESRCH)).then_some(())
    })
    .await;
}

/// Ends what a failed run of this test left behind, so it does not outlive the test.
struct Reap(Option<Pid>);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            let _ = killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[tokio::test]
async fn a_timed_out_command_ends_with_its_whole_group_and_reports_promptly() {
    let cluster = TestCluster::start("group-timeout");
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("a", 1, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let file = pid_file("timeout");
    let started = Instant::now();
    let job_id = api.submit(sleepers(&file, Some(500))).await.unwrap();
    let mut reap = Reap(None);
    reap.0 = Some(group_of(&file).await);
    let summary = eventually(LIMIT, "the job to end", || async {
        let summary = api.job(job_id).await.ok()?;
        (summary.state != JobState::Running).then_some(summary)
    })
    .await;
    let took = started.elapsed();
    assert_eq!(summary.state, JobState::Failed, "{summary:?}");
    assert!(
        summary
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("timed out"),
        "{summary:?}"
    );
    assert!(took < Duration::from_secs(10), "the status took {took:?}");
    assert_group_gone(reap.0.unwrap()).await;
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn a_killed_command_ends_with_its_whole_group() {
    let cluster = TestCluster::start("group-kill");
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("a", 1, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let file = pid_file("kill");
    let job_id = api.submit(sleepers(&file, None)).await.unwrap();
    let mut reap = Reap(None);
    let pgid = group_of(&file).await;
    reap.0 = Some(pgid);
    assert_eq!(killpg(pgid, None), Ok(()), "the group runs before the kill");
    within(LIMIT, api.kill(job_id)).await.unwrap();
    let summary = eventually(LIMIT, "the task's KILLED status", || async {
        let summary = api.job(job_id).await.ok()?;
        (summary.running == 0 && summary.killed == 1).then_some(summary)
    })
    .await;
    assert_eq!(summary.state, JobState::Killed, "{summary:?}");
    assert_group_gone(pgid).await;
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn a_killed_command_that_ignores_sigterm_frees_its_core_only_once_killed() {
    let cluster = TestCluster::start("group-ignores-term");
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("a", 1, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let file = pid_file("ignores-term");
    let mut job = sleepers(&file, None);
    let script = format!(
        "trap '' TERM; echo $$ > {}.tmp && mv {0}.tmp {0}; sleep 600",
        file.display()
    );
    job.tasks[0] = TaskSpec::Command {
        argv: vec!["sh".into(), "-c".into(), script],
        env: Default::default(),
        cwd: None,
        timeout_ms: None,
        inputs: Default::default(),
        outputs: Vec::new(),
    };
    let job_id = api.submit(job).await.unwrap();
    let mut reap = Reap(None);
    let pgid = group_of(&file).await;
    reap.0 = Some(pgid);
    let killed = Instant::now();
    within(LIMIT, api.kill(job_id)).await.unwrap();
    // SIGTERM changes nothing: the attempt runs on, holding its core, until the SIGKILL the
    // grace ends with.
    let summary = eventually(LIMIT, "the task's KILLED status", || async {
        let summary = api.job(job_id).await.ok()?;
        (summary.running == 0).then_some(summary)
    })
    .await;
    let took = killed.elapsed();
    assert!(
        took >= Duration::from_millis(4500),
        "the attempt ended {took:?} after the kill, inside the grace"
    );
    assert_eq!(summary.killed, 1, "{summary:?}");
    // The command itself was gone when its end was reported.
    assert_eq!(
        nix::sys::signal::kill(pgid, None),
        Err(Errno::ESRCH),
        "the command outlived its reported end"
    );
    assert_group_gone(pgid).await;
    let _ = std::fs::remove_file(file);
}
