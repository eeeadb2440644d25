//! `ember bench` at smoke size: every workload runs and reports a figure. Not a measurement:
//! figures are taken on a quiet machine (docs/benchmarks.md).

use std::time::Duration;

#[tokio::test]
async fn ember_bench_quick_reports_every_workload() {
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["bench", "--quick", "--runs", "2", "--json", "--huge-tasks"])
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("ember bench --quick finishes")
    .expect("ember bench runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(report["register"]["executors"], 20);
    assert!(report["register"]["wall_ms"].as_f64().unwrap() > 0.0);
    let runs = report["throughput"].as_array().unwrap();
    let cores: Vec<u64> = runs.iter().map(|r| r["cores"].as_u64().unwrap()).collect();
    assert_eq!(cores, [1, 64]);
    assert!(runs
        .iter()
        .all(|r| r["tasks_per_s"].as_f64().unwrap() > 0.0));
    // CPU per task, in clock ticks of 10 ms: a short run may round to none.
    for field in [
        "driver_cpu_us_per_task",
        "executors_cpu_us_per_task",
        "server_cpu_us_per_task",
    ] {
        assert!(
            runs.iter()
                .all(|r| r[field].as_f64().is_some_and(|us| us >= 0.0)),
            "{field}"
        );
    }
    assert_eq!(report["latency"]["samples"], 20);
    assert!(report["latency"]["p50_ms"].as_f64().unwrap() > 0.0);
    for field in [
        "request_p50_ms",
        "pipelined_requests_per_s",
        "pubsub_msgs_per_s",
    ] {
        assert!(report["limit"][field].as_f64().unwrap() > 0.0, "{field}");
    }
    // 2,000 messages fit in the subscription's queue: none may be lost.
    assert_eq!(report["limit"]["pubsub_lost"], 0);
    assert_eq!(
        report["slow_consumers"], 0,
        "NATS dropped messages: {stderr}"
    );
    assert_eq!(report["bare"]["executors"], 2);
    for field in ["chain_p50_ms", "chain_p99_ms"] {
        assert!(report["bare"][field].as_f64().unwrap() > 0.0, "{field}");
    }
    // The journaled round trip's floor: the chain with two acknowledged JetStream writes, over
    // as many rounds as the latency workload.
    let journaled = &report["bare"]["journaled_chain"];
    assert_eq!(journaled["samples"], report["latency"]["samples"]);
    assert!(journaled["p50_ms"].as_f64().unwrap() > 0.0, "{journaled}");
    // The floor of storing each status on its way to the driver: its round trip over as many
    // rounds, and its loop at each core count.
    let stored = &report["bare"]["stored_status_chain"];
    assert_eq!(stored["samples"], report["latency"]["samples"]);
    assert!(stored["p50_ms"].as_f64().unwrap() > 0.0, "{stored}");
    let stored_loops = report["bare"]["stored_status_loops"].as_array().unwrap();
    assert_eq!(stored_loops.len(), 2, "{stored_loops:?}");
    assert!(stored_loops
        .iter()
        .all(|l| l["tasks_per_s"].as_f64().unwrap() > 0.0));
    let loops = report["bare"]["loops"].as_array().unwrap();
    assert_eq!(loops.len(), 2, "one bare loop per core count: {loops:?}");
    assert!(loops
        .iter()
        .all(|l| l["tasks_per_s"].as_f64().unwrap() > 0.0));
    for field in [
        "driver_idle_mb",
        "executor_idle_mb",
        "driver_with_many_executors_mb",
    ] {
        assert!(report["memory"][field].as_f64().unwrap() > 1.0, "{field}");
    }
    // The wide workload: every task of every job ran (the bench checks each job's end), and
    // the driver's offer rounds were counted from its metrics endpoint.
    assert_eq!(report["wide"]["executors"], 50);
    assert_eq!(report["wide"]["jobs"], 10);
    assert_eq!(report["wide"]["tasks"], 2000);
    assert_eq!(report["wide"]["scheduling"], "fifo");
    assert_eq!(report["wide"]["pools"], 0);
    assert!(report["wide"]["tasks_per_s"].as_f64().unwrap() > 0.0);
    assert!(report["wide"]["offer_rounds"].as_u64().unwrap() > 0);
    // The broadcast workload: each executor on the client's host took the object from it
    // once, and each apart fetched it once, counted from their metrics endpoints, for the 8
    // tasks that read it.
    let broadcast = &report["broadcast"];
    assert_eq!(broadcast["object_bytes"], 16 << 20);
    assert_eq!(broadcast["tasks"], 8);
    for counted in ["host_takes", "fetches"] {
        assert_eq!(
            (
                &broadcast[format!("{counted}_min")],
                &broadcast[format!("{counted}_max")]
            ),
            (&serde_json::json!(1), &serde_json::json!(1)),
            "{broadcast}"
        );
    }
    assert!(broadcast["run_apart_s"].as_f64().unwrap() > 0.0);
    assert!(broadcast["bare_gets_s"].as_f64().unwrap() > 0.0);
    // The huge workload at a fiftieth of its size: both jobs ran whole on drivers of their
    // own, and each driver's peak is above its idle.
    let huge = &report["huge"];
    assert_eq!(
        (&huge["tasks_1m"], &huge["tasks_10m"]),
        (&20_000.into(), &200_000.into()),
        "{huge}"
    );
    for field in [
        "tasks_per_s_1m",
        "tasks_per_s_10m",
        "marginal_ratio",
        "rate_ratio",
    ] {
        assert!(huge[field].as_f64().unwrap() > 0.0, "{field}: {huge}");
    }
    let idle = huge["rss_idle_mb"].as_f64().unwrap();
    assert!(idle > 1.0, "{huge}");
    assert!(huge["peak_rss_mb_10m"].as_f64().unwrap() >= idle, "{huge}");
    // Two runs, each reported whole; the figures above are the lower of each pair.
    let each = report["runs"].as_array().expect("every run's report");
    assert_eq!(each.len(), 2);
    for (i, throughput) in runs.iter().enumerate() {
        let rates: Vec<f64> = each
            .iter()
            .map(|r| r["throughput"][i]["tasks_per_s"].as_f64().unwrap())
            .collect();
        let median = throughput["tasks_per_s"].as_f64().unwrap();
        assert_eq!(median, rates[0].min(rates[1]), "{rates:?}");
    }
    assert!(each.iter().all(|r| r["slow_consumers"] == 0));
}

#[test]
fn ember_bench_refuses_an_empty_workload_before_it_starts_anything() {
    for (flag, value, says) in [
        ("--executors", "0", "0 is not in 1..=1000"),
        ("--cores", "1,0", "0 is not in 1..=65536"),
        ("--register", "0", "must be at least 1"),
        ("--tasks", "0", "0 is not in 1.."),
        ("--runs", "0", "0 is not in 1..=100"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["bench", "--quick", flag, value])
            .output()
            .expect("ember runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flag} {value}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains(says),
            "{flag} {value}: {stderr}"
        );
    }
}

/// `ember bench --sync-always`'s servers really sync every write: the server says so on its
/// monitoring port.
#[test]
fn a_synced_jetstream_server_syncs_every_write() {
    use std::io::{Read, Write};
    let monitor = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let port = monitor.to_string();
    let jetstream = |synced: bool| {
        let server = match synced {
            true => ember::server::NatsServer::start_with_synced_jetstream(&["-m", &port]),
            false => ember::server::NatsServer::start_with_jetstream(&["-m", &port]),
        }
        .expect("a nats-server with JetStream");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let varz: serde_json::Value = loop {
            let answer = std::net::TcpStream::connect(("127.0.0.1", monitor)).and_then(|mut s| {
                s.write_all(b"GET /varz HTTP/1.0\r\n\r\n")?;
                let mut text = String::new();
                s.read_to_string(&mut text)?;
                Ok(text)
            });
            let body = answer.ok().and_then(|text| {
                let body = text.split_once("\r\n\r\n")?.1.to_string();
                serde_json::from_str(&body).ok()
            });
            match body {
                Some(varz) => break varz,
                None if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                None => panic!("the server's /varz did not answer"),
            }
        };
        drop(server);
        varz["jetstream"]["config"]["sync_always"].as_bool()
    };
    assert_eq!(jetstream(true), Some(true));
    assert_ne!(jetstream(false), Some(true));
}
