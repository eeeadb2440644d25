//! Concurrency keys over a real nats-server, set with `ember limits`: the tasks of two jobs
//! that name a key never run more at once than its limit (as the tasks themselves saw it), a
//! key's rate spaces their starts, a key without limits runs unlimited and `ember jobs` says
//! so, and a driver that takes over keeps the limits from the journal.

mod common;

use common::{eventually, sh, within, TestCluster};
use ember::executor::Handlers;
use ember::protocol::{JobState, SubmitJob, WaitReason};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// A directory of this test's own, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ember-{name}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `tasks` commands under `key` that each write when they start and end (ns since the epoch)
/// into `dir`, with `ms` of sleep between.
fn logged(tasks: u32, ms: u64, key: &str, dir: &std::path::Path) -> SubmitJob {
    let dir = dir.display();
    let script = format!(
        "date +%s%N > {dir}/$EMBER_TASK_ID.start; sleep {}; date +%s%N > {dir}/$EMBER_TASK_ID.end",
        ms as f64 / 1000.0
    );
    SubmitJob {
        name: "logged".into(),
        tasks: vec![sh(&script)],
        repeat: tasks,
        concurrency_key: Some(key.into()),
        ..common::noops(1)
    }
}

/// The (start, end) of every task logged in `dir`, in ns, by start.
fn intervals(dir: &std::path::Path) -> Vec<(u128, u128)> {
    let read = |path: std::path::PathBuf| -> u128 {
        let text = std::fs::read_to_string(&path).unwrap();
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{path:?}: {text:?}"))
    };
    let mut spans: Vec<(u128, u128)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|entry| {
            let path = entry.unwrap().path();
            let stem = path
                .file_name()?
                .to_str()?
                .strip_suffix(".start")?
                .to_string();
            Some((read(path.clone()), read(dir.join(format!("{stem}.end")))))
        })
        .collect();
    spans.sort();
    spans
}

/// The most intervals that overlap at any time.
fn most_at_once(spans: &[(u128, u128)]) -> usize {
    let mut edges: Vec<(u128, i32)> = spans
        .iter()
        .flat_map(|(start, end)| [(*start, 1), (*end, -1)])
        .collect();
    // An end before a start at the same instant.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    most as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tasks_of_all_jobs_with_a_key_stay_within_its_limits_which_outlive_the_driver() {
    let cluster = TestCluster::start_with_jetstream("keys-limit");
    let driver = cluster.driver().await;
    let _a = cluster.executor("a", 8, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let set = cluster
        .cli_stdout(&["limits", "set", "api", "--max-concurrent", "2"])
        .await;
    assert_eq!(set.trim(), "concurrency key api: 2 at once");
    let dir = Scratch::new("keys-limit");
    let first = api.submit(logged(4, 300, "api", dir.path())).await.unwrap();
    let second = api.submit(logged(3, 300, "api", dir.path())).await.unwrap();
    // While they run, the one that waits says why, and `ember jobs` shows the key's limits.
    let summary = api.job(second).await.unwrap();
    assert!(
        summary
            .waits
            .iter()
            .any(|w| matches!(w, WaitReason::KeyConcurrency { key, max_concurrent: 2, .. } if key == "api")),
        "{summary:?}"
    );
    let jobs = cluster.cli_stdout(&["jobs"]).await;
    assert!(
        jobs.contains(&format!("job {second} concurrency key api: 2 at once")),
        "{jobs}"
    );
    assert!(
        jobs.contains(&format!(
            "job {second} waits: concurrency key api runs 2 of its 2 at once"
        )),
        "{jobs}"
    );
    for job_id in [first, second] {
        let done = within(LIMIT, api.wait(job_id, |_| {})).await.unwrap();
        assert_eq!(done.state, JobState::Succeeded, "{done:?}");
    }
    let spans = intervals(dir.path());
    assert_eq!(spans.len(), 7);
    assert_eq!(most_at_once(&spans), 2, "{spans:?}");

    // A driver that takes over reads the limits back from the journal.
    driver.stop().await.unwrap();
    let _next = cluster.driver().await;
    let listed = eventually(LIMIT, "the next driver's keys", || async {
        let text = cluster.cli(&["limits"]).output().await.ok()?;
        let text = String::from_utf8_lossy(&text.stdout).into_owned();
        text.contains("2 at once").then_some(text)
    })
    .await;
    assert!(listed.contains("api"), "{listed}");
    let cleared = cluster.cli_stdout(&["limits", "clear", "api"]).await;
    assert_eq!(
        cleared.trim(),
        "concurrency key api: no limits, its jobs run unlimited"
    );
    let listed = cluster.cli_stdout(&["limits", "--json"]).await;
    assert_eq!(listed.trim(), r#"{"keys":[]}"#);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_s_rate_spaces_the_starts_of_its_tasks() {
    let cluster = TestCluster::start("keys-rate");
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 8, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    cluster
        .cli_stdout(&["limits", "set", "paced", "--rate", "2/s"])
        .await;
    let dir = Scratch::new("keys-rate");
    let job = logged(6, 10, "paced", dir.path());
    let done = within(LIMIT, api.run_job(job, |_| {})).await.unwrap();
    assert_eq!(done.state, JobState::Succeeded, "{done:?}");
    let starts: Vec<u128> = intervals(dir.path()).iter().map(|(s, _)| *s).collect();
    assert_eq!(starts.len(), 6);
    // No three starts within one second: the third after any start comes a window later,
    // less what a task's own start lags its launch (it is measured inside the task).
    for w in starts.windows(3) {
        let apart_ms = (w[2] - w[0]) / 1_000_000;
        assert!(
            apart_ms >= 900,
            "three starts within {apart_ms} ms: {starts:?}"
        );
    }
    let span_ms = (starts[5] - starts[0]) / 1_000_000;
    assert!(span_ms >= 1900, "six starts within {span_ms} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_without_limits_runs_unlimited_and_ember_jobs_says_so() {
    let cluster = TestCluster::start("keys-free");
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 4, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let job = SubmitJob {
        concurrency_key: Some("free".into()),
        ..common::sleepers(4, 60_000)
    };
    let job_id = api.submit(job).await.unwrap();
    eventually(LIMIT, "all four running", || async {
        (api.job(job_id).await.ok()?.running == 4).then_some(())
    })
    .await;
    let jobs = cluster.cli_stdout(&["jobs"]).await;
    assert!(
        jobs.contains(&format!(
            "job {job_id} concurrency key free: no limits set, it runs unlimited"
        )),
        "{jobs}"
    );
    let keys = cluster.cli_stdout(&["limits", "--json"]).await;
    let keys: serde_json::Value = serde_json::from_str(&keys).unwrap();
    assert_eq!(
        keys,
        serde_json::json!({"keys": [{"key": "free", "running": 4, "jobs": 1}]})
    );
    // A malformed key or limit is refused before anything is sent.
    let out = cluster
        .cli(&["limits", "set", "api", "--rate", "ten/s"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(error.contains("is not a count of tasks"), "{error}");
    let out = cluster
        .cli(&["limits", "set", "api"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("give --max-concurrent, --rate or both"),
        "{out:?}"
    );
    api.kill(job_id).await.unwrap();
}
