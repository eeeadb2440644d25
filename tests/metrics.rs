//! The driver's Prometheus metrics: scraped over HTTP during a job and after it, they agree
//! with the job; the binary serves them on `--metrics-addr`.

mod common;

use common::{eventually, sleepers, TestCluster};
use ember::executor::Handlers;
use ember::metrics::{serve, DriverMetrics};
use ember::protocol::JobState;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LIMIT: Duration = Duration::from_secs(30);

/// `GET path` on `addr`: the status line and the body.
async fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: ember\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .expect("headers, then a body");
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of the sample `name` (with its labels, as written) in a scrape.
fn sample(scrape: &str, name: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

#[tokio::test]
async fn a_scrape_during_and_after_a_job_agrees_with_the_job() {
    let cluster = TestCluster::start("metrics");
    let metrics = Arc::new(DriverMetrics::new());
    let addr = serve("127.0.0.1:0".parse().unwrap(), metrics.clone())
        .await
        .unwrap();
    let shared = metrics.clone();
    let driver = cluster
        .driver_configured(move |config| config.metrics = shared)
        .await;
    let _a = cluster.executor("exec-a", 2, Handlers::builtin()).await;
    let _b = cluster.executor("exec-b", 3, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    eventually(LIMIT, "both executors in the metrics", || async {
        let (_, scrape) = get(addr, "/metrics").await;
        (sample(&scrape, "ember_driver_executors") == Some(2.0)).then_some(())
    })
    .await;

    // 20 tasks of 200 ms on 5 cores: about 0.8 s of work.
    let job_id = api.submit(sleepers(20, 200)).await.unwrap();
    let during = eventually(LIMIT, "a scrape with the job running", || async {
        let (_, scrape) = get(addr, "/metrics").await;
        let running = sample(&scrape, "ember_driver_jobs{state=\"running\"}") == Some(1.0);
        let busy = sample(&scrape, "ember_driver_tasks_running").unwrap_or(0.0) > 0.0;
        (running && busy).then_some(scrape)
    })
    .await;
    assert_eq!(
        sample(&during, "ember_driver_cores{state=\"total\"}"),
        Some(5.0)
    );
    let free = sample(&during, "ember_driver_cores{state=\"free\"}").unwrap();
    let running = sample(&during, "ember_driver_tasks_running").unwrap();
    assert_eq!(free + running, 5.0, "{during}");
    assert_eq!(sample(&during, "ember_driver_leader"), Some(1.0));

    let summary = common::within(LIMIT, api.wait(job_id, |_| {}))
        .await
        .unwrap();
    assert_eq!(summary.state, JobState::Succeeded);
    let after = eventually(LIMIT, "the job's end in the gauges", || async {
        let (_, scrape) = get(addr, "/metrics").await;
        let done = sample(&scrape, "ember_driver_jobs{state=\"succeeded\"}") == Some(1.0);
        done.then_some(scrape)
    })
    .await;
    let finished = "ember_driver_tasks_ended_total{state=\"finished\"}";
    assert_eq!(sample(&after, finished), Some(20.0), "{after}");
    assert_eq!(
        sample(&after, "ember_driver_tasks_launched_total"),
        Some(20.0)
    );
    assert_eq!(
        sample(&after, "ember_driver_jobs{state=\"running\"}"),
        Some(0.0)
    );
    assert_eq!(sample(&after, "ember_driver_tasks_waiting"), Some(0.0));
    let statuses = "ember_driver_request_duration_seconds_count{kind=\"status\"}";
    assert!(sample(&after, statuses).unwrap() >= 1.0, "{after}");
    let registers = "ember_driver_request_duration_seconds_count{kind=\"register\"}";
    assert_eq!(sample(&after, registers), Some(2.0), "{after}");
    // Each status batch's updates: at least the 20 ends, counted over the batches.
    let updates = sample(&after, "ember_driver_status_batch_updates_sum").unwrap();
    assert!(updates >= 20.0, "{after}");
    assert!(
        after.ends_with("# EOF\n"),
        "OpenMetrics text ends with # EOF"
    );

    let (status, _) = get(addr, "/nothing").await;
    assert!(status.contains("404"), "{status}");
    driver.stop().await.unwrap();
}

#[tokio::test]
async fn the_driver_binary_serves_metrics_on_its_metrics_addr() {
    let cluster = TestCluster::start("metrics-bin");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut driver = cluster
        .driver_process(&["--journal", "off", "--metrics-addr", &addr.to_string()])
        .spawn()
        .unwrap();
    let scrape = eventually(LIMIT, "the binary's metrics", || async {
        let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        drop(stream);
        let (status, scrape) = get(addr, "/metrics").await;
        (status.contains("200") && sample(&scrape, "ember_driver_leader") == Some(1.0))
            .then_some(scrape)
    })
    .await;
    assert_eq!(sample(&scrape, "ember_driver_executors"), Some(0.0));
    driver.kill().await.unwrap();
}
