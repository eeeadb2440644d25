//! The floor of a design that stores each status batch on its way to the driver: the
//! executor publishes it into a JetStream file stream, which acknowledges it to the executor
//! and republishes it, stored, to the driver, which writes nothing for it (see the parent
//! module for the chain and the loop it measures).

use super::{
    chain_through, cycles_per_s, launch, spawn_party, status_and_answer, warmed_up, Loop, Storing,
    PATIENCE,
};
use crate::protocol::{encode, ExecutorMessage};
use anyhow::Context;
use async_nats::Client;
use futures::StreamExt;
use std::future::IntoFuture;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The chain's executor: stores each `status` on its way (see [`storing_relay`]), in a stream
/// that republishes it on the subject the chain's driver takes statuses on, until `stop`.
pub(super) async fn chain_executor(
    client: Client,
    status: bytes::Bytes,
    stop: oneshot::Receiver<()>,
) -> anyhow::Result<()> {
    let stored = "bench.chain.stored";
    status_stream(&client, "BENCH_CHAIN_STATUS", stored, "bench.chain.status").await?;
    storing_relay(client, "bench.chain.launch", stored, status, stop).await
}

/// Makes `name`, a JetStream file stream of the statuses published on `subjects`, which
/// republishes each once stored: `subjects` with its first `from` token replaced by `to`.
async fn status_stream(client: &Client, name: &str, from: &str, to: &str) -> anyhow::Result<()> {
    use async_nats::jetstream::{self, stream};
    let subjects = format!("{from}.>");
    jetstream::new(client.clone())
        .get_or_create_stream(stream::Config {
            name: name.into(),
            subjects: vec![subjects.clone()],
            storage: stream::StorageType::File,
            republish: Some(stream::Republish {
                source: subjects,
                destination: format!("{to}.>"),
                headers_only: false,
            }),
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("creating the bench's {name} stream: {e}"))?;
    Ok(())
}

/// The chain's executor when statuses are stored on their way: for each launch, publishes
/// `status` into the status stream (on `stored`) and lets the stream tell the driver; each
/// acknowledgement is awaited beside the next launches.
async fn storing_relay(
    client: Client,
    launches: &'static str,
    stored: &'static str,
    status: bytes::Bytes,
    stop: oneshot::Receiver<()>,
) -> anyhow::Result<()> {
    let js = async_nats::jetstream::new(client.clone());
    let mut launched = client.subscribe(launches).await?;
    client.flush().await?;
    let subject = format!("{stored}.bench-0");
    let mut acks = futures::stream::FuturesUnordered::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            Some(ack) = acks.next(), if !acks.is_empty() => {
                let _: async_nats::jetstream::publish::PublishAck = ack?;
            }
            Some(_) = launched.next() => {
                let ack = js.publish(subject.clone(), status.clone()).await?;
                acks.push(ack.into_future());
            }
        }
    }
}

/// Cycles per second of `executors` executors of `cores` cores that store each status batch
/// on its way to the driver: each publishes a batch into a status stream, which republishes
/// it, stored, to the driver; the driver answers with the launches on the executor's inbox,
/// and the executor sends its next batch once it has them and the stream's acknowledgement.
fn stored_status_loop(url: &str, executors: u32, cores: u32, cycles: usize) -> anyhow::Result<f64> {
    let (stop, stopped) = oneshot::channel();
    let launches = launches(cores);
    // A stream and subjects of each core count's own: streams may not share subjects.
    let stream = format!("BENCH_LOOP_STATUS_{cores}");
    let (into, stored) = (
        format!("bench.loop{cores}.in"),
        format!("bench.loop{cores}.stored"),
    );
    let driver = spawn_party(url, move |client| async move {
        status_stream(&client, &stream, &into, &stored).await?;
        let mut statuses = client.subscribe(format!("{stored}.>")).await?;
        client.flush().await?;
        tokio::pin!(stopped);
        loop {
            tokio::select! {
                _ = &mut stopped => return anyhow::Ok(()),
                Some(status) = statuses.next() => {
                    let executor = status.subject.rsplit('.').next().unwrap_or_default();
                    let inbox = format!("bench.loop{cores}.launch.{executor}");
                    client.publish(inbox, launches.clone()).await?;
                }
            }
        }
    });
    let start = Arc::new(Barrier::new(executors as usize));
    let parties: Vec<_> = (0..executors)
        .map(|i| {
            let start = start.clone();
            spawn_party(url, move |client| async move {
                let js = async_nats::jetstream::new(client.clone());
                let (status, _) = status_and_answer(i, cores);
                let subject = format!("bench.loop{cores}.in.bench-{i}");
                let mut launched = client
                    .subscribe(format!("bench.loop{cores}.launch.bench-{i}"))
                    .await?;
                client.flush().await?;
                let (js, subject) = (&js, subject.as_str());
                // Until the driver answers: its subscription and the stream may not be in
                // place yet.
                let ready = Instant::now() + PATIENCE;
                let warm = async {
                    let short = Duration::from_millis(100);
                    while let Err(error) =
                        stored_cycle(js, subject, &status, &mut launched, short).await
                    {
                        anyhow::ensure!(
                            Instant::now() < ready,
                            "no stored-status answer: {error:#}"
                        );
                    }
                    // A late answer to a cycle that timed out would be taken for the next
                    // one's.
                    tokio::time::sleep(short).await;
                    while let Ok(Some(_)) =
                        tokio::time::timeout(Duration::ZERO, launched.next()).await
                    {
                    }
                    for _ in 0..200 {
                        stored_cycle(js, subject, &status, &mut launched, PATIENCE).await?;
                    }
                    anyhow::Ok(())
                }
                .await;
                let started = warmed_up(&start, warm)?;
                for _ in 0..cycles {
                    stored_cycle(js, subject, &status, &mut launched, PATIENCE).await?;
                }
                Ok(started.elapsed())
            })
        })
        .collect();
    cycles_per_s(parties, cycles, stop, driver)
}

/// One cycle of a stored-status executor: publishes `status` into the status stream, then
/// waits for the driver's launches and the stream's acknowledgement.
async fn stored_cycle(
    js: &async_nats::jetstream::Context,
    subject: &str,
    status: &bytes::Bytes,
    launched: &mut async_nats::Subscriber,
    patience: Duration,
) -> anyhow::Result<()> {
    let ack = js.publish(subject.to_string(), status.clone()).await?;
    tokio::time::timeout(patience, launched.next())
        .await?
        .context("subscription closed")?;
    tokio::time::timeout(PATIENCE, ack.into_future()).await??;
    Ok(())
}

/// The launches of `cores` tasks to one executor, as Ember encodes them.
fn launches(cores: u32) -> bytes::Bytes {
    encode(&ExecutorMessage::LaunchTasks {
        tasks: (0..cores)
            .map(|i| launch(123_457 + u64::from(i), 123_456 + i))
            .collect(),
        driver_instance: Some(uuid::Uuid::new_v4()),
    })
}

/// `rounds` round trips through the stored-status chain, on a server with JetStream.
pub async fn stored_status_chain(
    url: &str,
    rounds: usize,
) -> anyhow::Result<crate::bench::Percentiles> {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || chain_through(&url, rounds, Storing::StatusOnTheWay))
        .await?
}

/// The stored-status loop at each `(cores, cycles)` given, on a server with JetStream.
pub async fn stored_status_loops(
    url: &str,
    executors: u32,
    loops: Vec<(u32, usize)>,
) -> anyhow::Result<Vec<Loop>> {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || {
        super::each_loop(loops, |cores, cycles| {
            stored_status_loop(&url, executors, cores, cycles)
        })
    })
    .await?
}
