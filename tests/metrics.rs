//! The Prometheus metrics of the driver and the executors: scraped over HTTP during a job and
//! after it, they agree with the job and with each other; the binaries serve them on
//! `--metrics-addr`; slow-consumer events are counted.

mod common;

use common::{eventually, sleepers, TestCluster};
use ember::executor::Handlers;
use ember::metrics::{serve, DriverMetrics, ExecutorMetrics};
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

async fn scrape(addr: SocketAddr) -> String {
    get(addr, "/metrics").await.1
}

/// The value of the sample `name` (with its labels, as written) in a scrape.
fn sample(scrape: &str, name: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// The sum of the sample `name` over scrapes, each of which must have it.
fn total(scrapes: &[String], name: &str) -> f64 {
    scrapes
        .iter()
        .map(|s| sample(s, name).unwrap_or_else(|| panic!("no {name} in {s}")))
        .sum()
}

/// An address on a port free now, for a process to listen on.
fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

const FINISHED: &str = "ember_executor_tasks_ended_total{state=\"finished\"}";
const RUNNING: &str = "ember_executor_tasks_running";
const CORES: &str = "ember_executor_cores{state=\"total\"}";
const FREE: &str = "ember_executor_cores{state=\"free\"}";

/// An executor's scrape as it must be at any time: no more attempts than cores, and the cores
/// they do not hold free (each task takes one core).
fn check_load(scrape: &str, cores: f64) {
    let running = sample(scrape, RUNNING).unwrap();
    assert_eq!(sample(scrape, CORES), Some(cores), "{scrape}");
    assert!(running <= cores, "{running} running on {cores} cores");
    assert_eq!(sample(scrape, FREE), Some(cores - running), "{scrape}");
}

#[tokio::test]
async fn driver_and_executor_scrapes_during_and_after_a_job_agree_with_the_job() {
    let cluster = TestCluster::start_with_jetstream("metrics");
    let metrics = Arc::new(DriverMetrics::new());
    let driver_addr = serve(any_port(), metrics.clone()).await.unwrap();
    let shared = metrics.clone();
    let driver = cluster
        .driver_configured(move |config| config.metrics = shared)
        .await;
    let (mut executors, mut addrs) = (Vec::new(), Vec::new());
    for (id, cores) in [("exec-a", 2), ("exec-b", 3)] {
        let metrics = Arc::new(ExecutorMetrics::new());
        addrs.push((serve(any_port(), metrics.clone()).await.unwrap(), cores));
        let configure = |config: &mut ember::executor::ExecutorConfig| config.metrics = metrics;
        executors.push(
            cluster
                .executor_configured(id, cores, Handlers::builtin(), configure)
                .await,
        );
    }
    let api = cluster.api(cluster.client().await);
    eventually(LIMIT, "both executors in the metrics", || async {
        let executors = sample(&scrape(driver_addr).await, "ember_driver_executors");
        (executors == Some(2.0)).then_some(())
    })
    .await;

    // 20 tasks of 200 ms on 5 cores: about 0.8 s of work.
    let job_id = api.submit(sleepers(20, 200)).await.unwrap();
    let during = eventually(LIMIT, "a scrape with the job running", || async {
        let scrape = scrape(driver_addr).await;
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

    // The driver and the executors, scraped again and again while the job runs. The driver's
    // gauges and counters are of one moment: every task is waiting, running or finished, and
    // every one launched is running or finished (none fails).
    let (mut scrapes, mut busy_seen) = (0, 0.0_f64);
    while api.job(job_id).await.unwrap().state == JobState::Running {
        let driver = scrape(driver_addr).await;
        let of = |name: &str| sample(&driver, name).unwrap();
        let running = of("ember_driver_tasks_running");
        let finished = of("ember_driver_tasks_ended_total{state=\"finished\"}");
        let waiting = of("ember_driver_tasks_waiting");
        let launched = of("ember_driver_tasks_launched_total");
        assert_eq!(waiting + running + finished, 20.0, "{driver}");
        assert_eq!(launched, running + finished, "{driver}");
        let mut running = 0.0;
        for &(addr, cores) in &addrs {
            let scrape = scrape(addr).await;
            check_load(&scrape, f64::from(cores));
            running += sample(&scrape, RUNNING).unwrap();
        }
        busy_seen = busy_seen.max(running);
        scrapes += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(scrapes > 0 && busy_seen > 0.0, "no scrape saw the job run");

    let after = eventually(LIMIT, "the job's end in the gauges", || async {
        let scrape = scrape(driver_addr).await;
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
    // At most 5 tasks start in a round on 5 cores: 20 take at least 4 rounds.
    assert!(sample(&after, "ember_driver_offer_rounds_total").unwrap() >= 4.0);
    // The job went through the journal, and JetStream took every write at once.
    let writes = "ember_driver_journal_write_duration_seconds_count";
    assert!(sample(&after, writes).unwrap() >= 2.0, "{after}");
    assert_eq!(
        sample(&after, "ember_driver_journal_write_retries_total"),
        Some(0.0)
    );
    assert!(sample(&after, "ember_driver_slow_consumers_total").is_some());
    assert!(
        after.ends_with("# EOF\n"),
        "OpenMetrics text ends with # EOF"
    );

    // The executors' side: their ends are counted once the driver acknowledges them.
    let executors_after = eventually(LIMIT, "every end in the executors' metrics", || async {
        let mut scrapes = Vec::new();
        for &(addr, _) in &addrs {
            scrapes.push(scrape(addr).await);
        }
        (total(&scrapes, FINISHED) == 20.0).then_some(scrapes)
    })
    .await;
    let each = |name: &str| total(&executors_after, name);
    assert_eq!(each(FINISHED), sample(&after, finished).unwrap());
    assert_eq!(
        each("ember_executor_tasks_ended_total{state=\"failed\"}"),
        0.0
    );
    assert_eq!(
        each("ember_executor_tasks_ended_total{state=\"killed\"}"),
        0.0
    );
    assert_eq!(each("ember_executor_tasks_launched_total"), 20.0);
    assert_eq!(each("ember_executor_task_run_duration_seconds_count"), 20.0);
    let ran = each("ember_executor_task_run_duration_seconds_sum");
    assert!(ran >= 20.0 * 0.2, "20 sleeps of 200 ms ran {ran} s in all");
    // A RUNNING status and an end for each task.
    assert_eq!(each("ember_executor_statuses_total"), 40.0);
    // The driver heard every batch the executors had acknowledged (and any sent again).
    let batches = each("ember_executor_status_batches_total");
    assert!(batches >= 1.0);
    assert!(sample(&after, "ember_driver_status_batch_updates_count").unwrap() >= batches);
    for (scrape, &(_, cores)) in executors_after.iter().zip(&addrs) {
        check_load(scrape, f64::from(cores));
        assert_eq!(sample(scrape, RUNNING), Some(0.0), "{scrape}");
        assert_eq!(
            sample(scrape, "ember_executor_registrations_total"),
            Some(1.0)
        );
        assert_eq!(
            sample(scrape, "ember_executor_reregistrations_total"),
            Some(0.0)
        );
        assert!(scrape.ends_with("# EOF\n"));
    }

    let (status, _) = get(driver_addr, "/nothing").await;
    assert!(status.contains("404"), "{status}");
    let (status, _) = get(addrs[0].0, "/nothing").await;
    assert!(status.contains("404"), "{status}");
    for executor in executors {
        executor.stop().await.unwrap();
    }
    driver.stop().await.unwrap();
}

#[tokio::test]
async fn the_driver_binary_serves_metrics_on_its_metrics_addr() {
    let cluster = TestCluster::start("metrics-bin");
    let addr = free_addr();
    let mut driver = cluster
        .driver_process(&["--journal", "off", "--metrics-addr", &addr.to_string()])
        .spawn()
        .unwrap();
    let scrape = eventually(LIMIT, "the binary's metrics", || async {
        tokio::net::TcpStream::connect(addr).await.ok()?;
        let (status, scrape) = get(addr, "/metrics").await;
        (status.contains("200") && sample(&scrape, "ember_driver_leader") == Some(1.0))
            .then_some(scrape)
    })
    .await;
    assert_eq!(sample(&scrape, "ember_driver_executors"), Some(0.0));
    assert_eq!(
        sample(&scrape, "ember_driver_offer_rounds_total"),
        Some(0.0)
    );
    assert_eq!(
        sample(&scrape, "ember_driver_slow_consumers_total"),
        Some(0.0)
    );
    assert_eq!(
        sample(&scrape, "ember_driver_journal_write_retries_total"),
        Some(0.0)
    );
    driver.kill().await.unwrap();
}

#[tokio::test]
async fn the_executor_binary_serves_metrics_on_its_metrics_addr() {
    let cluster = TestCluster::start("metrics-exec-bin");
    let driver = cluster.driver().await;
    let api = cluster.api(cluster.client().await);
    let addr = free_addr();
    let mut executor = cluster
        .executor_process(
            "exec-bin",
            &["--cores", "2", "--metrics-addr", &addr.to_string()],
        )
        .spawn()
        .unwrap();
    let registered = eventually(LIMIT, "the executor binary's metrics", || async {
        tokio::net::TcpStream::connect(addr).await.ok()?;
        let (status, scrape) = get(addr, "/metrics").await;
        let registered = sample(&scrape, "ember_executor_registrations_total") == Some(1.0);
        (status.contains("200") && registered).then_some(scrape)
    })
    .await;
    check_load(&registered, 2.0);
    assert_eq!(sample(&registered, RUNNING), Some(0.0));

    let job = api.run_job(sleepers(6, 50), |_| {}).await.unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    let after = eventually(
        LIMIT,
        "the job's ends in the executor's metrics",
        || async {
            let scrape = scrape(addr).await;
            (sample(&scrape, FINISHED) == Some(6.0)).then_some(scrape)
        },
    )
    .await;
    check_load(&after, 2.0);
    assert_eq!(
        sample(&after, "ember_executor_task_run_duration_seconds_count"),
        Some(6.0)
    );
    assert_eq!(
        sample(&after, "ember_executor_slow_consumers_total"),
        Some(0.0)
    );
    executor.kill().await.unwrap();
    driver.stop().await.unwrap();
}

/// A subscription nobody reads fills up; the client drops what comes next and says so, and
/// the connection Ember makes counts it.
#[tokio::test]
async fn slow_consumer_events_are_counted() {
    use clap::Parser;
    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        nats: ember::connect::NatsArgs,
    }
    let cluster = TestCluster::start("metrics-slow");
    let flags = Flags::parse_from(["test", "--nats-url", &cluster.url()]);
    let metrics = ExecutorMetrics::new();
    let client = flags
        .nats
        .connect_watched(
            "slow",
            None,
            ember::connect::Watch {
                slow_consumers: metrics.slow_consumers.clone(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let subject = format!("{}.flood", cluster.subjects.prefix());
    let _unread = client.subscribe(subject.clone()).await.unwrap();
    client.flush().await.unwrap();
    let publisher = cluster.client().await;
    for _ in 0..ember::SUBSCRIPTION_CAPACITY + 1_000 {
        publisher.publish(subject.clone(), "".into()).await.unwrap();
    }
    publisher.flush().await.unwrap();
    eventually(LIMIT, "slow-consumer events counted", || async {
        (metrics.slow_consumers.get() > 0).then_some(())
    })
    .await;
    let scrape = ember::metrics::Scrape::encode(&metrics);
    assert!(sample(&scrape, "ember_executor_slow_consumers_total").unwrap() > 0.0);
}
