//! `ember status` against a live cluster with a job running: once as text, once as JSON, and
//! refreshed with `--watch` until SIGINT.

mod common;

use common::{eventually, sleepers, within, TestCluster};
use ember::executor::Handlers;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

const LIMIT: Duration = Duration::from_secs(30);
const TASKS: u32 = 200;

/// How many of the job's tasks a status screen says are done, from its line for `job_id`.
fn done(screen: &str, job_id: u64) -> Option<u32> {
    let line = screen
        .lines()
        .find(|l| l.starts_with(&format!("job {job_id} ")))?;
    let (before, _) = line.split_once(&format!("/{TASKS} done"))?;
    before.rsplit(' ').next()?.parse().ok()
}

#[tokio::test]
async fn ember_status_shows_the_cluster_and_the_running_job() {
    let cluster = TestCluster::start("status");
    let driver = cluster.driver().await;
    let _a = cluster.executor("exec-a", 2, Handlers::builtin()).await;
    let _b = cluster.executor("exec-b", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    eventually(LIMIT, "both executors", || async {
        (api.executors().await.ok()?.registered_executors == 2).then_some(())
    })
    .await;
    // 200 tasks of 200 ms on 4 cores: 10 s, longer than the test looks; killed at the end.
    let job_id = api.submit(sleepers(TASKS, 200)).await.unwrap();
    let seen = eventually(LIMIT, "some tasks done", || async {
        let job = api.job(job_id).await.ok()?;
        (job.succeeded > 0).then_some(job.succeeded)
    })
    .await;

    let once = cluster.cli(&["status"]).output().await.unwrap();
    assert!(once.status.success(), "{once:?}");
    let screen = String::from_utf8(once.stdout).unwrap();
    assert!(screen.contains("Ember cluster status-"), "{screen}");
    assert!(
        screen.contains("executors  2 (0 pending), cores 4 total"),
        "{screen}"
    );
    assert!(screen.contains("jobs       1 running"), "{screen}");
    assert!(
        screen.contains("tasks/s    -"),
        "one look measures no rate: {screen}"
    );
    let progress = done(&screen, job_id).unwrap_or_else(|| panic!("no job line: {screen}"));
    assert!(
        progress >= seen && progress < TASKS,
        "{progress} done: {screen}"
    );
    assert!(screen.contains('%') && screen.contains('░'), "{screen}");

    let json = cluster.cli(&["status", "--json"]).output().await.unwrap();
    assert!(json.status.success(), "{json:?}");
    let status: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(status["executors"], 2);
    assert_eq!(status["cores_total"], 4);
    assert_eq!(status["jobs"]["running"], 1);
    assert_eq!(status["running"][0]["job_id"], job_id);
    assert_eq!(status["running"][0]["tasks"], TASKS);
    assert!(status["running"][0]["succeeded"].as_u64().unwrap() >= u64::from(progress));
    assert!(status["driver"]["driver_instance"].is_string(), "{status}");
    assert!(status["tasks_per_second"].is_null());

    watch_until_a_rate_shows(&cluster, job_id).await;

    let refused = cluster
        .cli(&["status", "--interval", "0s"])
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--interval"));

    api.kill(job_id).await.unwrap();
    driver.stop().await.unwrap();
}

/// `ember status --watch` draws screen after screen; one shows tasks ending per second and the
/// job further on; SIGINT ends it with exit code 0.
async fn watch_until_a_rate_shows(cluster: &TestCluster, job_id: u64) {
    let mut watch = cluster
        .cli(&["status", "--watch", "--interval", "200ms"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let (mut screens, mut rate, mut progress) = (0, 0.0, Vec::new());
    within(LIMIT, async {
        while rate == 0.0 || progress.len() < 2 {
            let line = lines.next_line().await.unwrap().expect("the watch goes on");
            if line.starts_with("Ember cluster") {
                screens += 1;
            }
            if let Some(r) = line.strip_prefix("tasks/s    ") {
                rate = r.parse().unwrap_or(0.0_f64).max(rate);
            }
            progress.extend(done(&line, job_id));
        }
    })
    .await;
    assert!(screens >= 2, "a rate needs two looks");
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "{progress:?}");
    kill(Pid::from_raw(watch.id().unwrap() as i32), Signal::SIGINT).unwrap();
    let ended = within(LIMIT, watch.wait()).await.unwrap();
    assert!(ended.success(), "{ended:?}");
}
