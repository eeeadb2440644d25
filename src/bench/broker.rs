//! What NATS alone does on this machine with the same client library: the ceiling Ember's
//! figures are compared with.

use super::percentiles;
use anyhow::Context;
use async_nats::Client;
use futures::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

#[derive(Debug, Serialize, Deserialize)]
pub struct Limit {
    pub request_p50_ms: f64,
    pub request_p99_ms: f64,
    pub pipelined_requests_per_s: f64,
    pub pubsub_msgs_per_s: f64,
    /// Pub/sub messages the subscriber never got.
    pub pubsub_lost: u64,
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
    let (pubsub_msgs_per_s, pubsub_lost) = pubsub(url, messages).await?;
    Ok(Limit {
        request_p50_ms: latency.p50_ms,
        request_p99_ms: latency.p99_ms,
        pipelined_requests_per_s: pipelined,
        pubsub_msgs_per_s,
        pubsub_lost,
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

/// Messages per second from one publisher to one subscriber, from the first publish until the
/// subscriber has them all, and how many it never got: NATS drops messages for a subscriber
/// that falls behind. The subscription can queue every message, so that the rate is the
/// broker's, not the subscriber's (with Ember's capacity, 5-13% of a million messages went
/// missing). The publisher ends with a marker on a subject of its own. The server passes one
/// connection's messages on in order, and the client queues them for their subscriptions in
/// order, so once the marker is in, every message before it is queued or lost: the count ends
/// then, not after a wait for lost messages. A marker that never comes fails the measurement
/// after a minute.
async fn pubsub(url: &str, total: usize) -> anyhow::Result<(f64, u64)> {
    let publisher = async_nats::connect(url).await?;
    let subscriber = async_nats::ConnectOptions::new()
        .subscription_capacity(total.max(crate::SUBSCRIPTION_CAPACITY))
        .connect(url)
        .await?;
    let mut messages = subscriber.subscribe("bench.pubsub").await?;
    let mut end = subscriber.subscribe("bench.pubsub.end").await?;
    // A flush only writes the SUBs; a message of its own coming back through the server shows
    // both subscriptions are in place before the publisher (another connection) starts.
    subscriber.publish("bench.pubsub", "probe".into()).await?;
    tokio::time::timeout(Duration::from_secs(5), messages.next()).await?;
    let mut counter = tokio::spawn(async move {
        let mut seen = 0u64;
        loop {
            tokio::select! {
                biased;
                Some(_) = messages.next() => seen += 1,
                _ = end.next() => break,
            }
        }
        // On a runtime of several threads, messages queued between the two polls above.
        while let Some(Some(_)) = messages.next().now_or_never() {
            seen += 1;
        }
        (seen, Instant::now())
    });
    let payload = bytes::Bytes::from_static(&[b'x'; 64]);
    let started = Instant::now();
    for _ in 0..total {
        publisher.publish("bench.pubsub", payload.clone()).await?;
    }
    publisher.publish("bench.pubsub.end", "".into()).await?;
    publisher.flush().await?;
    let counted = tokio::time::timeout(Duration::from_secs(60), &mut counter).await;
    if counted.is_err() {
        counter.abort();
    }
    let (seen, ended) = counted.context("the pub/sub run's end marker never came back")??;
    let lost = (total as u64).saturating_sub(seen);
    Ok((seen as f64 / (ended - started).as_secs_f64(), lost))
}
