//! Prometheus metrics: the driver's ([`DriverMetrics`]) and an executor's
//! ([`ExecutorMetrics`]), kept as they work and served at `/metrics` (OpenMetrics text) by one
//! small HTTP server on `--metrics-addr`. Counters only ever count up. Every labelled series
//! that the hot path touches is looked up once, when the metrics are made, so counting costs
//! an atomic add and no label hashing.

mod driver;
mod executor;

pub use driver::{
    CoreGauges, DriverMetrics, JournalWrites, ObjectGauges, RequestKind, ScrapeRequest,
};
pub use executor::ExecutorMetrics;

use futures::future::BoxFuture;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use tracing::{debug, info};

/// A metric's labels: `(name, value)` pairs.
pub type Labels = Vec<(&'static str, &'static str)>;

fn label(name: &'static str, value: &'static str) -> Labels {
    vec![(name, value)]
}

/// Buckets for the time a request or a write takes: 10 µs to about 84 s.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-5, 2.0, 24))
}

/// Buckets for counts of things in a batch: 1 to 32,768.
fn sizes_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 16))
}

type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// Metrics that [`serve`] can serve: a registry of them.
pub trait Scrape: Send + Sync + 'static {
    fn registry(&self) -> &Registry;

    /// The metrics in the OpenMetrics text format.
    fn encode(&self) -> String {
        let mut text = String::new();
        encode(&mut text, self.registry()).expect("writing to a String cannot fail");
        text
    }

    /// What a scrape serves: [`Scrape::encode`], unless the metrics know a better moment to
    /// take it.
    fn scrape(&self) -> BoxFuture<'_, String> {
        Box::pin(std::future::ready(self.encode()))
    }
}

/// The content type of [`Scrape::encode`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `GET /metrics` on `addr` from a task of its own, for as long as the process runs;
/// returns the address it listens on (the port chosen, for port 0). Anything else gets 404,
/// and a method other than GET or HEAD 405.
pub async fn serve<M: Scrape>(addr: SocketAddr, metrics: Arc<M>) -> std::io::Result<SocketAddr> {
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
                    let metrics = metrics.clone();
                    async move {
                        let response = respond(&request, metrics.as_ref()).await;
                        Ok::<_, std::convert::Infallible>(response)
                    }
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

async fn respond<B>(request: &Request<B>, metrics: &impl Scrape) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (request.method().as_str(), request.uri().path()) {
        ("GET" | "HEAD", "/metrics") => (StatusCode::OK, CONTENT_TYPE, metrics.scrape().await),
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
