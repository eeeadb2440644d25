//! Placement on a real nats-server: constraints keep a job's tasks on the executors whose
//! attributes meet them, a job no executor meets waits and says why (in `ember jobs` too), and a
//! job that prefers an executor runs there while it has room and elsewhere only after the
//! locality wait.

mod common;

use common::*;
use ember::client::EmberClient;
use ember::executor::Handlers;
use ember::placement::Placement;
use ember::protocol::{JobState, JobSummary, SubmitJob, TaskOutcome, TaskState};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// Starts executor `id` with `cores` and the attributes `attributes`.
async fn executor_with(
    cluster: &TestCluster,
    id: &str,
    cores: u32,
    attributes: &[(&str, &str)],
) -> Running<Result<(), ember::executor::ExecutorError>> {
    let attributes = attributes
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    cluster
        .executor_configured(id, cores, Handlers::builtin(), |config| {
            config.attributes = attributes;
        })
        .await
}

async fn until_registered(api: &EmberClient, count: usize) {
    eventually(LIMIT, "the executors to register", || async {
        let snapshot = api.executors().await.ok()?;
        (snapshot.executors.len() == count).then_some(())
    })
    .await
}

async fn until_ended(api: &EmberClient, job_id: u64) -> (JobSummary, Vec<TaskOutcome>) {
    let job = eventually(LIMIT, "the job to end", || async {
        let job = api.job(job_id).await.ok()?;
        (job.state != JobState::Running).then_some(job)
    })
    .await;
    (job, api.results(job_id).await.unwrap())
}

fn executors_of(results: &[TaskOutcome]) -> Vec<String> {
    results
        .iter()
        .map(|r| r.executor_id.as_ref().map_or("-".into(), |e| e.to_string()))
        .collect()
}

fn with_placement(job: SubmitJob, placement: Placement) -> SubmitJob {
    SubmitJob { placement, ..job }
}

fn constraints(list: &[&str]) -> Placement {
    Placement {
        constraints: list.iter().map(|c| c.to_string()).collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_constrained_job_runs_only_where_its_constraints_hold_and_an_unmet_one_waits() {
    let cluster = TestCluster::start("constraints");
    let _driver = cluster.driver().await;
    let _r1 = executor_with(&cluster, "e1", 2, &[("rack", "r1"), ("os", "linux")]).await;
    let _r2 = executor_with(&cluster, "e2", 2, &[("rack", "r2"), ("os", "linux")]).await;
    let api = cluster.api(cluster.client().await);
    until_registered(&api, 2).await;

    // Eight short tasks would spread over both executors; rack=r1 keeps them on e1.
    let job = with_placement(
        sleepers(8, 50),
        constraints(&["rack=r1", "os in (linux,freebsd)"]),
    );
    let job_id = api.submit(job).await.unwrap();
    let (summary, results) = until_ended(&api, job_id).await;
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    assert_eq!(executors_of(&results), vec!["e1"; 8]);
    // `!=` is met by an executor without the attribute as well as by one with another value.
    let job = with_placement(sleepers(8, 50), constraints(&["rack!=r1", "gpu!=yes"]));
    let job_id = api.submit(job).await.unwrap();
    let (_, results) = until_ended(&api, job_id).await;
    assert_eq!(executors_of(&results), vec!["e2"; 8]);

    // No executor has rack=r9: the job waits and says why, here and in `ember jobs`.
    let job = with_placement(noops(2), constraints(&["rack=r9"]));
    let waiting = api.submit(job).await.unwrap();
    let summary = eventually(LIMIT, "the reason to show", || async {
        let job = api.job(waiting).await.ok()?;
        job.waiting.is_some().then_some(job)
    })
    .await;
    assert_eq!(
        summary.waiting.as_deref(),
        Some("no live executor meets rack=r9")
    );
    assert_eq!(summary.running + summary.succeeded, 0);
    let stdout = cluster.cli_stdout(&["jobs"]).await;
    assert!(
        stdout.contains(&format!(
            "job {waiting} waits: no live executor meets rack=r9"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("job {waiting} placement: runs where rack=r9")),
        "{stdout}"
    );
    // An executor that meets it registers: the job runs there.
    let _r9 = executor_with(&cluster, "e9", 1, &[("rack", "r9")]).await;
    let (summary, results) = until_ended(&api, waiting).await;
    assert_eq!(summary.state, JobState::Succeeded);
    assert_eq!(executors_of(&results), ["e9", "e9"]);
}

#[tokio::test]
async fn ember_submit_takes_placement_flags_and_refuses_a_malformed_constraint() {
    let cluster = TestCluster::start("constraint-flags");
    let _driver = cluster.driver().await;
    let _a = executor_with(&cluster, "a1", 2, &[("zone", "z1")]).await;
    let _b = executor_with(&cluster, "b1", 2, &[("zone", "z3")]).await;
    let api = cluster.api(cluster.client().await);
    until_registered(&api, 2).await;
    let out = within(
        LIMIT,
        cluster
            .cli(&[
                "submit",
                "--tasks",
                "6",
                "--constraint",
                "zone not in (z3, z4)",
                "--prefer-host",
                "host-a1",
                "--locality-wait",
                "0",
                "--results",
            ])
            .output(),
    )
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let outcomes: Vec<TaskOutcome> = stdout
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    assert_eq!(outcomes.len(), 6, "{stdout}");
    assert!(
        outcomes
            .iter()
            .all(|o| o.state == TaskState::Finished
                && o.executor_id.as_ref().unwrap().as_str() == "a1"),
        "{stdout}"
    );
    // A malformed constraint: refused before anything is submitted, naming it.
    let out = within(
        LIMIT,
        cluster
            .cli(&["submit", "--constraint", "zone in z1"])
            .output(),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("\"zone in z1\""), "{stderr}");
    assert_eq!(api.jobs().await.unwrap().len(), 1, "nothing more submitted");
}

#[tokio::test]
async fn a_preferred_executor_takes_the_tasks_while_it_has_room_and_others_after_the_wait() {
    let cluster = TestCluster::start("locality");
    let _driver = cluster.driver().await;
    // Offers go round the executors in id order: `a-other` comes first, so only the
    // preference keeps the first tasks off it.
    let _other = executor_with(&cluster, "a-other", 2, &[]).await;
    let _preferred = executor_with(&cluster, "b-pref", 2, &[]).await;
    let api = cluster.api(cluster.client().await);
    until_registered(&api, 2).await;

    let wait_ms = 1_500;
    let job = with_placement(
        sleepers(4, 3_000),
        Placement {
            prefer_executors: vec![ember::ids::ExecutorId::parse("b-pref").unwrap()],
            locality_wait_ms: Some(wait_ms),
            ..Default::default()
        },
    );
    let job_id = api.submit(job).await.unwrap();
    let (summary, results) = until_ended(&api, job_id).await;
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    // The preferred executor's two slots take the first two tasks at once; the other two wait
    // out the locality wait (the driver's clock, so exactly), then take `a-other` rather than
    // wait for `b-pref`, whose tasks run 3 s.
    assert_eq!(
        executors_of(&results),
        ["b-pref", "b-pref", "a-other", "a-other"]
    );
    let started = |index: usize| results[index].started_ms.unwrap();
    let since_submit = |index: usize| started(index) - summary.submitted_at_ms;
    for index in [2, 3] {
        assert!(
            since_submit(index) >= wait_ms,
            "task {index} started {} ms after the submission",
            since_submit(index)
        );
        // Generous: the wait, a revive interval (200 ms here) and a slow, shared machine.
        assert!(
            started(index) < started(0) + 2_900,
            "task {index} waited for a preferred slot instead: {results:?}"
        );
    }
}

#[tokio::test]
async fn a_restarted_driver_keeps_a_jobs_constraints() {
    let cluster = TestCluster::start_with_jetstream("placement-journal");
    let first = cluster.driver().await;
    let _r2 = executor_with(&cluster, "e2", 2, &[("rack", "r2")]).await;
    let api = cluster.api(cluster.client().await);
    until_registered(&api, 1).await;
    let job = with_placement(sleepers(3, 50), constraints(&["rack=r1"]));
    let job_id = api.submit(job).await.unwrap();
    let reason = |api: EmberClient| async move {
        eventually(LIMIT, "the job to say why it waits", || async {
            let job = api.job(job_id).await.ok()?;
            job.waiting.is_some().then_some(job)
        })
        .await
    };
    let before = reason(api.clone()).await;
    first.stop().await.unwrap();

    let _next = cluster.driver().await;
    // `e2` registers with the new driver, which restored the job from the journal.
    let after = reason(api.clone()).await;
    assert_eq!(after.waiting, before.waiting);
    assert_eq!(
        after.waiting.as_deref(),
        Some("no live executor meets rack=r1")
    );
    assert_eq!(after.placement, before.placement);
    let _r1 = executor_with(&cluster, "e1", 1, &[("rack", "r1")]).await;
    let (summary, results) = until_ended(&api, job_id).await;
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    assert_eq!(executors_of(&results), ["e1", "e1", "e1"]);
}

#[tokio::test]
async fn executors_started_with_a_site_are_grouped_by_it_and_jobs_require_or_prefer_it() {
    let cluster = TestCluster::start("sites");
    let _driver = cluster.driver().await;
    let mut processes = Vec::new();
    for (id, site) in [("hub-1", "hub"), ("hub-2", "hub"), ("edge-1", "edge")] {
        let mut executor = cluster.executor_process(id, &["--cores", "2", "--site", site]);
        processes.push(executor.spawn().expect("ember-executor starts"));
    }
    // Two ways to name one site must agree.
    let refused = within(
        LIMIT,
        cluster
            .executor_process("odd", &["--site", "hub", "--attribute", "site=edge"])
            .output(),
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("disagree"), "{stderr}");
    let api = cluster.api(cluster.client().await);
    until_registered(&api, 3).await;

    // Required: only the edge runs it. Preferred: the edge first, the hub after the wait.
    let edge_only = with_placement(noops(4), constraints(&["site=edge"]));
    let (summary, results) = until_ended(&api, api.submit(edge_only).await.unwrap()).await;
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    assert_eq!(executors_of(&results), vec!["edge-1"; 4]);
    let out = within(
        LIMIT,
        cluster
            .cli(&[
                "submit",
                "--tasks",
                "2",
                "--prefer-site",
                "edge",
                "--results",
            ])
            .output(),
    )
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_eq!(
        stdout.matches("\"executor_id\":\"edge-1\"").count(),
        2,
        "{stdout}"
    );

    let status: serde_json::Value =
        serde_json::from_str(&cluster.cli_stdout(&["status", "--json"]).await).unwrap();
    assert_eq!(
        status["sites"],
        serde_json::json!([
            {"site": "edge", "executors": 1, "cores_total": 2, "cores_free": 2},
            {"site": "hub", "executors": 2, "cores_total": 4, "cores_free": 4},
        ])
    );
    let screen = cluster.cli_stdout(&["status"]).await;
    assert!(
        screen.contains("site hub: 2 executors, cores 4 total"),
        "{screen}"
    );
    let table = cluster.cli_stdout(&["executors"]).await;
    let edge = table.find("edge-1").expect("edge-1 listed");
    assert!(
        table[..edge].find("hub-1").is_none(),
        "grouped by site: {table}"
    );
    assert!(
        table.contains("site edge: 1 executor, 2 of 2 cores free"),
        "{table}"
    );
}
