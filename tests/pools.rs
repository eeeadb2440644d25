//! Scheduling modes on a real nats-server: FAIR pools share the cores by weight, a FIFO job of
//! higher priority starts before an older one, and flags that make no sense are refused.

mod common;

use common::*;
use ember::client::EmberClient;
use ember::executor::Handlers;
use ember::protocol::{JobState, SubmitJob};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

fn in_pool(pool: &str, tasks: u32, ms: u64) -> SubmitJob {
    SubmitJob {
        pool: Some(pool.into()),
        name: pool.into(),
        ..sleepers(tasks, ms)
    }
}

/// Waits until job `job_id` has ended, and says how.
async fn until_ended(api: &EmberClient, job_id: u64) -> JobState {
    eventually(LIMIT, "the job to end", || async {
        let job = api.job(job_id).await.ok()?;
        (job.state != JobState::Running).then_some(job.state)
    })
    .await
}

#[tokio::test]
async fn fair_pools_of_weights_1_and_3_share_4_cores_1_to_3() {
    let cluster = TestCluster::start("pools-fair");
    let mut driver = cluster
        .driver_process(&[
            "--scheduling",
            "fair",
            "--pool",
            "light:weight=1",
            "--pool",
            "heavy:weight=3,mode=fifo",
        ])
        .spawn()
        .unwrap();
    let mut executors = Vec::new();
    for i in 0..4 {
        executors.push(
            cluster
                .executor(&format!("e{i}"), 1, Handlers::builtin())
                .await,
        );
    }
    let api = cluster.api(cluster.client().await);
    // The light job comes first and takes every core; as its tasks end, the heavy pool gets
    // three of the four.
    let light = eventually(LIMIT, "the driver to take the job", || async {
        api.submit(in_pool("light", 60, 200)).await.ok()
    })
    .await;
    let heavy = api.submit(in_pool("heavy", 60, 200)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    // Sample while both have tasks waiting: 60 tasks of 200ms on at most 3 cores last 4s.
    let (mut light_running, mut heavy_running, mut samples) = (0, 0, 0);
    for _ in 0..20 {
        let jobs = api.jobs().await.unwrap();
        let running = |id: u64| jobs.iter().find(|j| j.job_id == id).unwrap().running;
        light_running += running(light);
        heavy_running += running(heavy);
        samples += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let jobs = api.jobs().await.unwrap();
    let job = |id: u64| jobs.iter().find(|j| j.job_id == id).unwrap().clone();
    assert_eq!(job(light).pool.as_deref(), Some("light"));
    assert!(
        job(light).state == JobState::Running && job(heavy).state == JobState::Running,
        "both still run: {jobs:?}"
    );
    // 1:3 would be 1 and 3 in each sample; FIFO would give the light job all 4.
    let (light_mean, heavy_mean) = (
        light_running as f64 / samples as f64,
        heavy_running as f64 / samples as f64,
    );
    assert!(
        heavy_mean >= 2.0 * light_mean && heavy_mean >= 2.0 && light_mean >= 0.5,
        "light ran {light_mean:.2} tasks on average, heavy {heavy_mean:.2}"
    );
    // `ember jobs` shows each job's pool.
    let table = cluster.cli_stdout(&["jobs"]).await;
    assert!(table.contains("pool") && table.contains("heavy"), "{table}");
    // `ember pools` lists both, with their weights.
    let out = cluster.cli(&["pools", "--json"]).output().await.unwrap();
    assert!(out.status.success(), "{out:?}");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["scheduling"], "fair");
    let mut weights: Vec<(String, u64)> = listed["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["weight"].as_u64().unwrap(),
            )
        })
        .collect();
    weights.sort();
    assert_eq!(
        weights,
        [("heavy".to_string(), 3), ("light".to_string(), 1)]
    );
    assert_eq!(until_ended(&api, light).await, JobState::Succeeded);
    assert_eq!(until_ended(&api, heavy).await, JobState::Succeeded);
    driver.start_kill().unwrap();
}

#[tokio::test]
async fn a_later_job_of_higher_priority_starts_first() {
    let cluster = TestCluster::start("pools-priority");
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("e1", 1, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    // One core: the first job holds it while two more wait, the higher one submitted last.
    let first = eventually(LIMIT, "the driver to take the job", || async {
        api.submit(sleepers(1, 1500)).await.ok()
    })
    .await;
    let plain = api.submit(sleepers(1, 10)).await.unwrap();
    let mut urgent = cluster
        .cli(&[
            "submit",
            "--priority",
            "5",
            "--name",
            "urgent",
            "--kind",
            "sleep",
            "--arg",
            r#"{"ms": 10}"#,
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let urgent_id = eventually(LIMIT, "the urgent job to be taken", || async {
        let jobs = api.jobs().await.ok()?;
        jobs.iter().find(|j| j.name == "urgent").map(|j| j.job_id)
    })
    .await;
    assert!(urgent_id > plain);
    let status = within(LIMIT, urgent.wait()).await.unwrap();
    assert!(status.success());
    assert_eq!(until_ended(&api, plain).await, JobState::Succeeded);
    let started = |results: Vec<ember::protocol::TaskOutcome>| results[0].started_ms.unwrap();
    let urgent_started = started(api.results(urgent_id).await.unwrap());
    let plain_started = started(api.results(plain).await.unwrap());
    assert!(
        urgent_started <= plain_started,
        "the urgent job started at {urgent_started}, the older one at {plain_started}"
    );
    let job = api.job(urgent_id).await.unwrap();
    assert_eq!((job.priority, job.pool), (5, None));
    assert_eq!(api.job(first).await.unwrap().state, JobState::Succeeded);
}

#[tokio::test]
async fn scheduling_flags_and_submissions_that_make_no_sense_are_refused() {
    let cluster = TestCluster::start("pools-flags");
    for (args, says) in [
        (&["--scheduling", "lifo"][..], "not a scheduling mode"),
        (
            &["--scheduling", "fair", "--pool", "a:weight=0"][..],
            "weight must be a whole number from 1",
        ),
        (&["--pool", "a:weight=2"][..], "--scheduling fair"),
        (
            &[
                "--scheduling",
                "fair",
                "--pool",
                "a",
                "--pool",
                "a:weight=2",
            ][..],
            "declared twice",
        ),
    ] {
        let out = cluster.driver_process(args).output().await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let out = cluster
        .cli(&["submit", "--priority", "1001"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--priority"), "{stderr}");
    // The driver checks pool names: a submission from any client gets the rule.
    let _driver = cluster.driver().await;
    let api = cluster.api(cluster.client().await);
    let refused = eventually(LIMIT, "the driver to answer", || async {
        match api.submit(in_pool("a b", 1, 1)).await {
            Err(ember::client::ClientError::Driver(message)) => Some(message),
            _ => None,
        }
    })
    .await;
    assert!(refused.contains("use letters, digits"), "{refused}");
}
