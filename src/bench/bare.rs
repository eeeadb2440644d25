//! Ember's own message patterns with no Ember in between: the ceiling its loop could reach on
//! this machine with this client library. Each party (a driver, an executor, the client) runs on
//! a thread of its own, in a current-thread runtime and with a connection of its own, as Ember's
//! processes do, and sends payloads of the size Ember sends, encoded from its own messages.
//!
//! - **loop**: E executors each wait for the answer to one status batch at a time, as Ember's
//!   executors do. At C cores each batch reports C finished tasks and its answer launches C
//!   more: the bound on Ember's E x C throughput.
//! - **chain**: submit -> launch -> status -> job end, four hops through two relays: the bound
//!   on Ember's task round trip.
//! - **journaled chain**: the chain with the two acknowledged JetStream writes that a journal
//!   which stores before it tells adds to a one-task job (the submission, written as the
//!   launch goes out; the task's and the job's end, written when the status comes, and the end
//!   told once both are stored): the bound on Ember's round trip with its journal.
//! - **stored-status chain and loop**: the floor of a design in which the store happens on
//!   the way to the driver. The executor publishes its status into a JetStream file stream,
//!   which acknowledges it to the executor and republishes it, stored, to the driver: the
//!   driver writes nothing when a status comes. In the chain the relay still writes the
//!   submission as it sends the launch, and tells the end once that write and the status are
//!   stored; in the loop each executor sends its next batch once it has both the launches the
//!   driver answered with (on its inbox) and the stream's acknowledgement of the batch before.

use super::{noop, noops, percentiles};
use crate::ids::ExecutorId;
use crate::protocol::{
    encode, ApiRequest, Event, ExecutorMessage, JobState, StatusReply, StatusRequest, StatusUpdate,
    TaskDescription,
};
use anyhow::Context;
use async_nats::Client;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

mod stored;

pub use stored::{stored_status_chain, stored_status_loops};

#[derive(Debug, Serialize, Deserialize)]
pub struct Bare {
    /// Executors in the loop.
    pub executors: u32,
    /// The loop at each core count measured.
    pub loops: Vec<Loop>,
    pub chain_p50_ms: f64,
    pub chain_p99_ms: f64,
    /// The journaled chain, measured when the journaled workloads run.
    #[serde(default)]
    pub journaled_chain: Option<super::Percentiles>,
    /// The stored-status chain, measured when the journaled workloads run.
    #[serde(default)]
    pub stored_status_chain: Option<super::Percentiles>,
    /// The stored-status loop at each core count, measured when the journaled workloads run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stored_status_loops: Vec<Loop>,
}

/// The bare loop at one core count: each status batch reports `cores` tasks, and each answer
/// launches as many.
#[derive(Debug, Serialize, Deserialize)]
pub struct Loop {
    pub cores: u32,
    /// Status -> answer cycles per second, all executors together.
    pub cycles_per_s: f64,
    /// Tasks per second: cycles per second times `cores`.
    pub tasks_per_s: f64,
}

/// Each loop of `loops`, `(cores, cycles)`, at the cycles per second `measure` finds for it.
fn each_loop(
    loops: Vec<(u32, usize)>,
    measure: impl Fn(u32, usize) -> anyhow::Result<f64>,
) -> anyhow::Result<Vec<Loop>> {
    loops
        .into_iter()
        .map(|(cores, cycles)| {
            let cycles_per_s = measure(cores, cycles)?;
            Ok(Loop {
                cores,
                cycles_per_s,
                tasks_per_s: cycles_per_s * f64::from(cores),
            })
        })
        .collect()
}

impl Bare {
    /// The loop at `cores` cores, if it was measured.
    pub fn at(&self, cores: u32) -> Option<&Loop> {
        self.loops.iter().find(|l| l.cores == cores)
    }
}

/// How the chain's parties store what they are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Storing {
    /// Nothing is stored.
    Nothing,
    /// The driver stores the submission and the status before it tells the end.
    Journal,
    /// The driver stores the submission; the executor's status is stored on its way.
    StatusOnTheWay,
}

/// How long a party waits for any one message before the measurement fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// Measures the bare loop with `executors` executors, at each `(cores, cycles)` given, and
/// `rounds` round trips through the bare chain.
pub async fn measure(
    url: &str,
    executors: u32,
    loops: Vec<(u32, usize)>,
    rounds: usize,
) -> anyhow::Result<Bare> {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || {
        let loops = each_loop(loops, |cores, cycles| {
            bare_loop(&url, executors, cores, cycles)
        })?;
        let chain = chain(&url, rounds)?;
        Ok(Bare {
            executors,
            loops,
            chain_p50_ms: chain.p50_ms,
            chain_p99_ms: chain.p99_ms,
            journaled_chain: None,
            stored_status_chain: None,
            stored_status_loops: Vec::new(),
        })
    })
    .await?
}

/// A status batch of `cores` finished tasks, and the answer carrying as many launches, as
/// Ember encodes them.
fn status_and_answer(executor: u32, cores: u32) -> (bytes::Bytes, bytes::Bytes) {
    let executor_id = ExecutorId::parse(format!("bench-{executor}")).expect("a valid id");
    let status = StatusRequest::StatusUpdates {
        executor_id,
        updates: (0..u64::from(cores))
            .map(|i| StatusUpdate::finished(123_456 + i, 0))
            .collect(),
        driver_instance: Some(uuid::Uuid::new_v4()),
    };
    let answer = StatusReply::StatusAck {
        accepted: cores,
        refused: Vec::new(),
        launch: (0..cores)
            .map(|i| launch(123_457 + u64::from(i), 123_456 + i))
            .collect(),
    };
    (encode(&status), encode(&answer))
}

/// The launch of a one-task job, and its end event.
fn launch_and_end() -> (bytes::Bytes, bytes::Bytes) {
    let launch = ExecutorMessage::LaunchTasks {
        tasks: vec![launch(123_457, 123_456)],
        driver_instance: Some(uuid::Uuid::new_v4()),
    };
    let end = Event::JobEnd {
        time_ms: crate::now_ms(),
        job_id: 2,
        state: JobState::Succeeded,
        succeeded: 1,
        failed: 0,
        killed: 0,
        reason: None,
    };
    (encode(&launch), encode(&end))
}

fn launch(task_id: u64, index: u32) -> TaskDescription {
    TaskDescription {
        task_id,
        job_id: 2,
        index,
        attempt: 0,
        cpus: 1,
        spec: Arc::new(noop()),
        resources: Default::default(),
        gang_peers: Vec::new(),
    }
}

/// Runs `party` on a thread of its own in a current-thread runtime, with its own connection,
/// as a task of the runtime's as Ember's processes run their loops.
fn spawn_party<T, F>(
    url: &str,
    party: impl FnOnce(Client) -> F + Send + 'static,
) -> std::thread::JoinHandle<anyhow::Result<T>>
where
    F: Future<Output = anyhow::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let url = url.to_string();
    std::thread::spawn(move || {
        let runtime = crate::cli::runtime()?;
        crate::cli::run_as_task(&runtime, async move {
            let client = async_nats::ConnectOptions::new()
                .subscription_capacity(crate::SUBSCRIPTION_CAPACITY)
                .connect(url)
                .await?;
            party(client).await
        })
    })
}

fn join<T>(party: std::thread::JoinHandle<anyhow::Result<T>>) -> anyhow::Result<T> {
    party
        .join()
        .map_err(|_| anyhow::anyhow!("a bench party panicked"))?
}

/// Answers every request on `subject` with `answer` until `stop`.
async fn answer_all(
    client: Client,
    subject: &'static str,
    answer: bytes::Bytes,
    mut stop: oneshot::Receiver<()>,
) -> anyhow::Result<()> {
    let mut requests = client.subscribe(subject).await?;
    client.flush().await?;
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            message = requests.next() => {
                let Some(reply) = message.context("subscription closed")?.reply else { continue };
                client.publish(reply, answer.clone()).await?;
            }
        }
    }
}

/// For each message on a route's first subject, publishes the route's payload on its second,
/// until `stop`.
async fn relay(
    client: Client,
    routes: Vec<(&'static str, &'static str, bytes::Bytes)>,
    stop: oneshot::Receiver<()>,
) -> anyhow::Result<()> {
    let mut inputs = Vec::with_capacity(routes.len());
    for (route, (from, _, _)) in routes.iter().enumerate() {
        inputs.push(client.subscribe(*from).await?.map(move |_| route));
    }
    client.flush().await?;
    let mut inputs = futures::stream::select_all(inputs);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            Some(route) = inputs.next() => {
                let (_, to, payload) = &routes[route];
                client.publish(*to, payload.clone()).await?;
            }
        }
    }
}

/// The chain's driver with a journal: as [`relay`] with the routes of the chain, but the
/// submission is first written to a JetStream stream (`BENCH_CHAIN`, file storage, as Ember's
/// journal), and so is the status if `store_status`; the launch goes out at once, and the end
/// once the writes are stored.
async fn journaled_relay(
    client: Client,
    routes: Vec<(&'static str, &'static str, bytes::Bytes)>,
    store_status: bool,
    stop: oneshot::Receiver<()>,
) -> anyhow::Result<()> {
    use async_nats::jetstream::{self, stream};
    let js = jetstream::new(client.clone());
    js.get_or_create_stream(stream::Config {
        name: "BENCH_CHAIN".into(),
        subjects: vec!["bench.chain.journal".into()],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .map_err(|e| anyhow::anyhow!("creating the bench's journal stream: {e}"))?;
    let (submit, status) = (routes[0].0, routes[1].0);
    let mut submits = client.subscribe(submit).await?;
    let mut statuses = client.subscribe(status).await?;
    client.flush().await?;
    tokio::pin!(stop);
    let mut submitted = None;
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            Some(message) = submits.next() => {
                let write = js.publish("bench.chain.journal", message.payload).await?;
                client.publish(routes[0].1, routes[0].2.clone()).await?;
                submitted = Some(write);
            }
            Some(message) = statuses.next() => {
                let ended = match store_status {
                    true => Some(js.publish("bench.chain.journal", message.payload).await?),
                    false => None,
                };
                if let Some(write) = submitted.take() {
                    write.await?;
                }
                if let Some(ended) = ended {
                    ended.await?;
                }
                client.publish(routes[1].1, routes[1].2.clone()).await?;
            }
        }
    }
}

/// Once every executor party has warmed up (`warm` is this one's outcome), the moment its
/// timed cycles start. Every party reaches the barrier, warm or not, or the others would wait
/// forever.
fn warmed_up(start: &Barrier, warm: anyhow::Result<()>) -> anyhow::Result<Instant> {
    start.wait();
    warm?;
    Ok(Instant::now())
}

/// Cycles per second of the executors `parties`, each giving the time its `cycles` took, once
/// all have ended; then stops the `driver`.
fn cycles_per_s(
    parties: Vec<std::thread::JoinHandle<anyhow::Result<Duration>>>,
    cycles: usize,
    stop: oneshot::Sender<()>,
    driver: std::thread::JoinHandle<anyhow::Result<()>>,
) -> anyhow::Result<f64> {
    let executors = parties.len();
    let mut slowest = Duration::ZERO;
    for party in parties {
        match join(party) {
            Ok(took) => slowest = slowest.max(took),
            // An executor that heard nothing may only show that the driver failed first.
            Err(error) => {
                let _ = stop.send(());
                return Err(match join(driver) {
                    Err(failed) => failed.context("the loop's driver failed"),
                    Ok(()) => error,
                });
            }
        }
    }
    let _ = stop.send(());
    join(driver)?;
    Ok(executors as f64 * cycles as f64 / slowest.as_secs_f64())
}

/// Sends requests until one is answered: a flush only writes the SUB, so the other party's
/// subscription may not be in place yet.
async fn wait_for_answers(
    client: &Client,
    subject: &str,
    payload: &bytes::Bytes,
) -> anyhow::Result<()> {
    let ready = Instant::now() + PATIENCE;
    loop {
        let attempt = client.request(subject.to_string(), payload.clone());
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(100), attempt).await {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < ready, "no answer on {subject}");
    }
}

/// Cycles per second of `executors` executors of `cores` cores, each waiting for one answer at
/// a time.
fn bare_loop(url: &str, executors: u32, cores: u32, cycles: usize) -> anyhow::Result<f64> {
    let (stop, stopped) = oneshot::channel();
    let (_, answer) = status_and_answer(0, cores);
    let driver = spawn_party(url, move |client| {
        answer_all(client, "bench.loop.status.*", answer, stopped)
    });
    let start = Arc::new(Barrier::new(executors as usize));
    let parties: Vec<_> = (0..executors)
        .map(|i| {
            let start = start.clone();
            spawn_party(url, move |client| async move {
                let (status, _) = status_and_answer(i, cores);
                let subject = format!("bench.loop.status.bench-{i}");
                let warm = async {
                    wait_for_answers(&client, &subject, &status).await?;
                    for _ in 0..200 {
                        client.request(subject.clone(), status.clone()).await?;
                    }
                    anyhow::Ok(())
                }
                .await;
                let started = warmed_up(&start, warm)?;
                for _ in 0..cycles {
                    let answer = client.request(subject.clone(), status.clone());
                    tokio::time::timeout(PATIENCE, answer).await??;
                }
                Ok(started.elapsed())
            })
        })
        .collect();
    cycles_per_s(parties, cycles, stop, driver)
}

/// Round trips through two relays, one message at a time: the client's submit reaches the
/// driver, which launches on the executor, whose status reaches the driver, which tells the
/// client the job ended.
fn chain(url: &str, rounds: usize) -> anyhow::Result<super::Percentiles> {
    chain_through(url, rounds, Storing::Nothing)
}

/// `rounds` round trips through the journaled chain, on a server with JetStream.
pub async fn journaled_chain(url: &str, rounds: usize) -> anyhow::Result<super::Percentiles> {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || chain_through(&url, rounds, Storing::Journal)).await?
}

/// The chain, its parties storing as `storing` says in JetStream streams of their own.
fn chain_through(url: &str, rounds: usize, storing: Storing) -> anyhow::Result<super::Percentiles> {
    let (stop_driver, driver_stopped) = oneshot::channel();
    let (stop_executor, executor_stopped) = oneshot::channel();
    let (status, _) = status_and_answer(0, 1);
    let (launch, end) = launch_and_end();
    let driver = spawn_party(url, move |client| {
        let routes = vec![
            ("bench.chain.submit", "bench.chain.launch", launch),
            // Stored statuses come republished, under the executor's name.
            match storing {
                Storing::StatusOnTheWay => ("bench.chain.status.>", "bench.chain.end", end),
                _ => ("bench.chain.status", "bench.chain.end", end),
            },
        ];
        async move {
            match storing {
                Storing::Nothing => relay(client, routes, driver_stopped).await,
                Storing::Journal => journaled_relay(client, routes, true, driver_stopped).await,
                Storing::StatusOnTheWay => {
                    journaled_relay(client, routes, false, driver_stopped).await
                }
            }
        }
    });
    let executor = spawn_party(url, move |client| async move {
        match storing {
            Storing::StatusOnTheWay => {
                stored::chain_executor(client, status, executor_stopped).await
            }
            _ => {
                let routes = vec![("bench.chain.launch", "bench.chain.status", status)];
                relay(client, routes, executor_stopped).await
            }
        }
    });
    let samples = crate::cli::runtime()?.block_on(async {
        let client = async_nats::connect(url).await?;
        let mut ends = client.subscribe("bench.chain.end").await?;
        client.flush().await?;
        let submit = encode(&ApiRequest::SubmitJob(noops(1)));
        // Until a round goes through: the relays' subscriptions may not be in place yet.
        let ready = Instant::now() + PATIENCE;
        while round(&client, &mut ends, &submit, Duration::from_millis(100))
            .await
            .is_err()
        {
            anyhow::ensure!(Instant::now() < ready, "the bare chain never answered");
        }
        // A late answer to a timed-out round would be taken for the next one's.
        tokio::time::sleep(Duration::from_millis(100)).await;
        while let Ok(Some(_)) = tokio::time::timeout(Duration::ZERO, ends.next()).await {}
        let mut samples = Vec::with_capacity(rounds);
        for i in 0..rounds + 200 {
            let started = Instant::now();
            round(&client, &mut ends, &submit, PATIENCE).await?;
            if i >= 200 {
                samples.push(started.elapsed());
            }
        }
        anyhow::Ok(samples)
    })?;
    let _ = stop_driver.send(());
    let _ = stop_executor.send(());
    join(driver)?;
    join(executor)?;
    Ok(percentiles(samples))
}

/// One round through the bare chain.
async fn round(
    client: &Client,
    ends: &mut async_nats::Subscriber,
    submit: &bytes::Bytes,
    patience: Duration,
) -> anyhow::Result<()> {
    client.publish("bench.chain.submit", submit.clone()).await?;
    tokio::time::timeout(patience, ends.next())
        .await?
        .context("subscription closed")
        .map(drop)
}
