//! What NATS alone does on this machine with the same client library: the ceiling Ember's
//! figures are compared with.

use super::percentiles;
use anyhow::Context;
use async_nats::Client;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

#[derive(Debug, Serialize, Deserialize)]
pub struct Limit {
    pub request_p50_ms: f64,
    pub request_p99_ms: f64,
    pub pipelined_requests_per_s: f64,
    pub pubsub_msgs_per_s: f64,
}

/// Measures request/reply latency, pipelined requests/s and pub/sub messages/s on `url`.
pub async fn measure(url: &str, requests: usize, messages: usize) -> anyhow::Result<Limit> {
    let responder = async_nats::connect(url).await?;
    let requester = async_nats::connect(url).await?;
    let mut service = responder.subscribe("bench.echo").await?;
    let echo = responder.clone();
    let server = tokio::spawn(async move {
        while let Some(message) = service.next().await {
            if let Some(reply) = message.reply {
                let _ = echo.publish(reply, message.payload).await;
            }
        }
    });
    responder.flush().await?;
    let payload =
        bytes::Bytes::from_static(br#"{"type":"StatusUpdates","executor_id":"e","updates":[]}"#);
    // A flush only writes the SUB; the other connection's requests may reach the server first.
    let ready = Instant::now() + Duration::from_secs(5);
    while requester
        .request("bench.echo", payload.clone())
        .await
        .is_err()
    {
        anyhow::ensure!(Instant::now() < ready, "the echo responder never answered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..200 {
        requester
            .request("bench.echo", payload.clone())
            .await
            .context("warm-up")?;
    }
    let mut samples = Vec::with_capacity(requests);
    for _ in 0..requests {
        let started = Instant::now();
        requester
            .request("bench.echo", payload.clone())
            .await
            .context("latency")?;
        samples.push(started.elapsed());
    }
    let latency = percentiles(samples);
    let pipelined = pipelined(&requester, payload, requests * 20).await?;
    server.abort();
    Ok(Limit {
        request_p50_ms: latency.p50_ms,
        request_p99_ms: latency.p99_ms,
        pipelined_requests_per_s: pipelined,
        pubsub_msgs_per_s: pubsub(url, messages).await?,
    })
}

/// Requests per second with many in flight at once.
async fn pipelined(client: &Client, payload: bytes::Bytes, total: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut in_flight = futures::stream::iter(0..total)
        .map(|_| client.request("bench.echo", payload.clone()))
        .buffer_unordered(256);
    while let Some(reply) = in_flight.next().await {
        reply.context("pipelined")?;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Messages per second from one publisher to one subscriber.
async fn pubsub(url: &str, total: usize) -> anyhow::Result<f64> {
    let publisher = async_nats::connect(url).await?;
    let subscriber = async_nats::ConnectOptions::new()
        .subscription_capacity(crate::SUBSCRIPTION_CAPACITY)
        .connect(url)
        .await?;
    let mut sub = subscriber.subscribe("bench.pubsub").await?;
    // A flush only writes the SUB; a message of its own coming back through the server shows
    // the subscription is in place before the publisher (another connection) starts.
    subscriber.publish("bench.pubsub", "probe".into()).await?;
    tokio::time::timeout(Duration::from_secs(5), sub.next()).await?;
    let counter = tokio::spawn(async move {
        let mut seen = 0;
        let mut first = None;
        while seen < total {
            match tokio::time::timeout(Duration::from_secs(5), sub.next()).await {
                Ok(Some(_)) => {
                    first.get_or_insert_with(Instant::now);
                    seen += 1;
                }
                _ => break,
            }
        }
        (seen, first.map(|f| f.elapsed()))
    });
    let payload = bytes::Bytes::from_static(&[b'x'; 64]);
    let started = Instant::now();
    for _ in 0..total {
        publisher.publish("bench.pubsub", payload.clone()).await?;
    }
    publisher.flush().await?;
    let (seen, _) = counter.await?;
    Ok(seen as f64 / started.elapsed().as_secs_f64())
}
