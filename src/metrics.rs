//! Prometheus metrics: the driver's, kept as it works and served at `/metrics` (OpenMetrics
//! text) by a small HTTP server on `--metrics-addr`. Counters only ever count up; the gauges
//! (executors, cores, jobs by state, tasks waiting and running) are set from the core once a
//! revive tick, so a scrape sees them at most that old.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info};

/// A metric's labels: `(name, value)` pairs.
pub type Labels = Vec<(&'static str, &'static str)>;

fn label(name: &'static str, value: &'static str) -> Labels {
    vec![(name, value)]
}

fn seconds_histogram() -> Histogram {
    // 10 µs to about 84 s.
    Histogram::new(exponential_buckets(1e-5, 2.0, 24))
}

fn sizes_histogram() -> Histogram {
    // 1 to 32,768.
    Histogram::new(exponential_buckets(1.0, 2.0, 16))
}

type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// What a driver counts, shared by the actor and the metrics server.
#[derive(Debug)]
pub struct DriverMetrics {
    registry: Registry,
    pub leader: Gauge,
    pub epoch: Gauge,
    pub executors: Gauge,
    pub executors_target: Gauge,
    cores: Family<Labels, Gauge>,
    jobs: Family<Labels, Gauge>,
    pub tasks_waiting: Gauge,
    pub tasks_running: Gauge,
    pub tasks_launched: Counter,
    tasks_ended: Family<Labels, Counter>,
    requests: HistogramFamily,
    /// The request histogram of each kind, looked up once rather than on every request.
    by_kind: [Histogram; 4],
    status_batch: Histogram,
    refused: Family<Labels, Counter>,
}

/// The gauges a core reports once a tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreGauges {
    pub executors: u64,
    pub total_cores: u64,
    pub free_cores: u64,
    pub tasks_waiting: u64,
    pub tasks_running: u64,
    pub jobs_running: u64,
    pub jobs_succeeded: u64,
    pub jobs_failed: u64,
    pub jobs_killed: u64,
    pub executors_target: u64,
}

/// A kind of request the driver handles.
#[derive(Debug, Clone, Copy)]
pub enum RequestKind {
    Register,
    Status,
    Heartbeat,
    Api,
}

impl RequestKind {
    const ALL: [RequestKind; 4] = [
        RequestKind::Register,
        RequestKind::Status,
        RequestKind::Heartbeat,
        RequestKind::Api,
    ];

    fn label(self) -> &'static str {
        match self {
            RequestKind::Register => "register",
            RequestKind::Status => "status",
            RequestKind::Heartbeat => "heartbeat",
            RequestKind::Api => "api",
        }
    }
}

impl Default for DriverMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl DriverMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ember_driver");
        let metrics = Self {
            leader: Gauge::default(),
            epoch: Gauge::default(),
            executors: Gauge::default(),
            executors_target: Gauge::default(),
            cores: Family::default(),
            jobs: Family::default(),
            tasks_waiting: Gauge::default(),
            tasks_running: Gauge::default(),
            tasks_launched: Counter::default(),
            tasks_ended: Family::default(),
            requests: HistogramFamily::new_with_constructor(seconds_histogram),
            by_kind: [(); 4].map(|()| seconds_histogram()),
            status_batch: sizes_histogram(),
            refused: Family::default(),
            registry: Registry::default(),
        };
        let m = &metrics;
        registry.register(
            "leader",
            "1 while this driver leads its cluster",
            m.leader.clone(),
        );
        registry.register(
            "epoch",
            "The epoch of this driver's leadership (0 without a lease)",
            m.epoch.clone(),
        );
        registry.register("executors", "Executors registered", m.executors.clone());
        registry.register(
            "executors_target",
            "Executors the dynamic allocation signal asks for (0 when it is off)",
            m.executors_target.clone(),
        );
        registry.register(
            "cores",
            "Cores of the registered executors, by state (total, free)",
            m.cores.clone(),
        );
        registry.register(
            "jobs",
            "Jobs the driver holds (running, and finished ones retained), by state",
            m.jobs.clone(),
        );
        registry.register(
            "tasks_waiting",
            "Tasks waiting for a core",
            m.tasks_waiting.clone(),
        );
        registry.register(
            "tasks_running",
            "Attempts running on executors",
            m.tasks_running.clone(),
        );
        registry.register(
            "tasks_launched",
            "Attempts launched",
            m.tasks_launched.clone(),
        );
        registry.register(
            "tasks_ended",
            "Attempts ended, by state (finished, failed, killed, lost)",
            m.tasks_ended.clone(),
        );
        registry.register_with_unit(
            "request_duration",
            "Time the driver spent handling a request (decode, core, encode), by kind (register, status, heartbeat, api)",
            Unit::Seconds,
            m.requests.clone(),
        );
        registry.register(
            "status_batch_updates",
            "Status updates per status batch",
            m.status_batch.clone(),
        );
        registry.register(
            "refused_requests",
            "Requests dropped or refused before the core saw them, by reason (no_reply, foreign_reply, undecodable)",
            m.refused.clone(),
        );
        let by_kind = RequestKind::ALL.map(|kind| {
            metrics
                .requests
                .get_or_create_owned(&label("kind", kind.label()))
        });
        Self {
            registry,
            by_kind,
            ..metrics
        }
    }

    /// Sets the gauges from what the core holds now.
    pub fn set_core(&self, g: CoreGauges) {
        let set = |gauge: &Gauge, value: u64| {
            gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
        };
        set(&self.executors, g.executors);
        set(&self.executors_target, g.executors_target);
        set(
            &self.cores.get_or_create(&label("state", "total")),
            g.total_cores,
        );
        set(
            &self.cores.get_or_create(&label("state", "free")),
            g.free_cores,
        );
        set(&self.tasks_waiting, g.tasks_waiting);
        set(&self.tasks_running, g.tasks_running);
        for (state, value) in [
            ("running", g.jobs_running),
            ("succeeded", g.jobs_succeeded),
            ("failed", g.jobs_failed),
            ("killed", g.jobs_killed),
        ] {
            set(&self.jobs.get_or_create(&label("state", state)), value);
        }
    }

    /// The driver no longer leads: it holds nothing, so its gauges say so (the counters keep
    /// what it counted).
    pub fn stood_down(&self) {
        self.leader.set(0);
        self.epoch.set(0);
        self.set_core(CoreGauges::default());
    }

    /// Counts attempts ended in `state` (`finished`, `failed`, `killed`, `lost`).
    pub fn ended(&self, state: &'static str, n: u64) {
        self.tasks_ended
            .get_or_create(&label("state", state))
            .inc_by(n);
    }

    /// One request of `kind` handled in `took`.
    pub fn request(&self, kind: RequestKind, took: Duration) {
        self.by_kind[kind as usize].observe(took.as_secs_f64());
    }

    pub fn status_batch(&self, updates: usize) {
        self.status_batch.observe(updates as f64);
    }

    /// One request dropped or refused for `reason`.
    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&label("reason", reason)).inc();
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}

/// The content type of [`DriverMetrics::encode`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `GET /metrics` on `addr` from a task of its own, for as long as the process runs;
/// returns the address it listens on (the port chosen, for port 0). Anything else gets 404,
/// and a method other than GET or HEAD 405.
pub async fn serve(addr: SocketAddr, metrics: Arc<DriverMetrics>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    info!(%local, "serving metrics at http://{local}/metrics");
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let response = respond(&request, &metrics);
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
                let served = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                if let Err(error) = served {
                    debug!(%peer, %error, "metrics connection ended");
                }
            });
        }
    });
    Ok(local)
}

fn respond<B>(request: &Request<B>, metrics: &DriverMetrics) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (request.method().as_str(), request.uri().path()) {
        ("GET" | "HEAD", "/metrics") => (StatusCode::OK, CONTENT_TYPE, metrics.encode()),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".into(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: the metrics are at /metrics\n".into(),
        ),
    };
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}
