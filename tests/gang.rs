//! Gangs over a real nats-server: all of a job's tasks start in one offer round once the cores
//! free up (a job submitted behind the gang does not take them first), a gang the cluster
//! could never hold is refused by name, and each task of a gang reaches its peers at the
//! `host:port` it is told, on the port its executor reserved for it.

mod common;

use common::{sleepers, within, TestCluster};
use ember::executor::Handlers;
use ember::protocol::{decode, Event, JobState, SubmitJob, TaskSpec};
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

/// A gang task that listens on `EMBER_GANG_PORT`, sends its rank to the next peer in
/// `EMBER_GANG_PEERS` (trying again while that one has not started), and prints what it was
/// told and what it heard.
const RING: &str = r#"
import json, os, socket, time
peers = os.environ["EMBER_GANG_PEERS"].split(",")
rank, port = int(os.environ["EMBER_GANG_RANK"]), int(os.environ["EMBER_GANG_PORT"])
server = socket.socket()
server.bind(("0.0.0.0", port))
server.listen()
host, next_port = peers[(rank + 1) % len(peers)].rsplit(":", 1)
deadline = time.time() + 30
while True:
    try:
        out = socket.create_connection((host, int(next_port)), timeout=5)
        break
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(0.05)
out.sendall(str(rank).encode())
out.close()
conn, _ = server.accept()
heard = int(conn.recv(16).decode())
print(json.dumps({"rank": rank, "port": port, "peers": peers, "heard": heard}))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tasks_of_a_gang_reach_each_other_on_the_ports_their_executors_reserved() {
    let cluster = TestCluster::start("gang-peers");
    let _driver = cluster.driver().await;
    let local = |config: &mut ember::executor::ExecutorConfig| {
        config.host_port = "127.0.0.1:7078".into();
    };
    let _a = cluster
        .executor_configured("a", 2, Handlers::builtin(), local)
        .await;
    let _b = cluster
        .executor_configured("b", 2, Handlers::builtin(), local)
        .await;
    let api = cluster.api(cluster.client().await);
    let ring = SubmitJob {
        gang: true,
        tasks: vec![TaskSpec::Command {
            argv: vec!["python3".into(), "-c".into(), RING.into()],
            env: Default::default(),
            cwd: None,
            timeout_ms: Some(60_000),
            inputs: Default::default(),
            outputs: Vec::new(),
        }],
        max_failures: 1,
        ..sleepers(4, 0)
    };
    let summary = within(LIMIT, api.run_job(ring, |_| {})).await.unwrap();
    let results = api.results(summary.job_id).await.unwrap();
    assert_eq!(
        summary.state,
        JobState::Succeeded,
        "{summary:?} {results:?}"
    );
    let told: Vec<serde_json::Value> = results
        .iter()
        .map(|r| {
            let stdout = r.result.as_ref().unwrap()["stdout"].as_str().unwrap();
            serde_json::from_str(stdout.trim()).unwrap()
        })
        .collect();
    // Every task was told the same peers, four distinct ports, its own at its rank (its
    // index: all four started together), and heard from the one before it in the ring.
    let peers = told[0]["peers"].as_array().unwrap().clone();
    assert_eq!(peers.len(), 4);
    let mut ports: Vec<&serde_json::Value> = told.iter().map(|t| &t["port"]).collect();
    ports.dedup();
    assert_eq!(ports.len(), 4, "{told:?}");
    for (index, task) in told.iter().enumerate() {
        assert_eq!(task["rank"], index, "{told:?}");
        assert_eq!(task["peers"].as_array().unwrap(), &peers);
        assert_eq!(peers[index], format!("127.0.0.1:{}", task["port"]));
        assert_eq!(task["heard"], (index + 3) % 4, "{told:?}");
    }
    // The executors hold their ports again: none of them can be bound (a port a connection
    // left in TIME_WAIT is bound again once that ends, in at most a minute).
    for port in ports {
        let port = port.as_u64().unwrap() as u16;
        let deadline = std::time::Instant::now() + Duration::from_secs(75);
        while std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "port {port} not reserved again"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
