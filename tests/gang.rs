//! Gangs over a real nats-server: all of a job's tasks start in one offer round once the cores
//! free up (a job submitted behind the gang does not take them first), and a gang the cluster
//! could never hold is refused by name.

mod common;

use common::{sleepers, within, TestCluster};
use ember::executor::Handlers;
use ember::protocol::{decode, Event, JobState, SubmitJob};
use futures::StreamExt;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_starts_whole_once_its_cores_free_up_and_one_too_large_is_refused() {
    let cluster = TestCluster::start("gang");
    let mut starts = cluster.listen(cluster.subjects.event("task.start")).await;
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 2, Handlers::builtin()).await;
    let _b = cluster.executor("b", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let busy = api.submit(sleepers(1, 1500)).await.unwrap();
    let gang = SubmitJob {
        gang: true,
        ..sleepers(4, 200)
    };
    let team = api.submit(gang).await.unwrap();
    let behind = api.submit(sleepers(1, 10)).await.unwrap();
    let waits = api.job(team).await.unwrap().waiting.unwrap_or_default();
    assert_eq!(
        waits, "the gang of 4 tasks needs 4 cores at once, and 3 are free to it",
        "{waits}"
    );
    for job_id in [busy, team, behind] {
        let done = within(LIMIT, api.wait(job_id, |_| {})).await.unwrap();
        assert_eq!(done.state, JobState::Succeeded, "{done:?}");
    }
    // The events of the three jobs' starts: the gang's four in one, before the job behind it.
    let mut order = Vec::new();
    while order.len() < 3 {
        let message = within(LIMIT, starts.next()).await.unwrap();
        if let Ok(Event::TaskStart {
            job_id, executors, ..
        }) = decode::<Event>(&message.payload, usize::MAX)
        {
            let tasks: usize = executors.iter().map(|e| e.tasks.len()).sum();
            order.push((job_id, tasks));
        }
    }
    assert_eq!(order, [(busy, 1), (team, 4), (behind, 1)]);

    let out = cluster
        .cli(&["submit", "--gang", "--tasks", "5"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        error.contains(
            "a gang of 5 tasks needs them all at once, and the executors registered hold at \
             most 4 such tasks at once"
        ),
        "{error}"
    );
}
