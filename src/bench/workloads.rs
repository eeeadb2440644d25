//! The Ember workloads of `ember bench`.

use super::procs::{cpu_seconds, machine, rss_mb, Cluster};
use super::{broker, noops, percentiles, BenchArgs, Memory, Register, Report, Throughput};
use crate::client::EmberClient;
use crate::ids::ExecutorId;
use crate::protocol::{encode, Event, RegisterExecutor, RegisterRequest};
use crate::subjects::Subjects;
use futures::StreamExt;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(600);

pub async fn run_all(args: &BenchArgs) -> anyhow::Result<Report> {
    let mut report = Report {
        machine: machine(),
        ..Report::default()
    };
    // Every journaled server of the run syncs as asked.
    super::procs::set_sync_always(args.sync_always);
    eprintln!("bench: broker alone");
    let cluster = Cluster::start("limit", false)?;
    report.limit = Some(
        broker::measure(
            &cluster.server.url(),
            args.latency_jobs.max(100),
            args.tasks as usize,
        )
        .await?,
    );
    eprintln!("bench: the bare loop and round trip");
    report.bare = Some(
        super::bare::measure(
            &cluster.server.url(),
            args.executors,
            args.cores
                .iter()
                .map(|&cores| (cores, args.cycles_per_executor(cores)))
                .collect(),
            args.latency_jobs,
        )
        .await?,
    );
    drop(cluster);
    if args.journal == super::Journal::On {
        eprintln!("bench: the bare round trip with a journal");
        let server = super::procs::server(true)?;
        let journaled = super::bare::journaled_chain(&server.url(), args.latency_jobs).await?;
        eprintln!("bench: the bare round trip and loop with each status stored on its way");
        let stored_chain =
            super::bare::stored_status_chain(&server.url(), args.latency_jobs).await?;
        let stored_loops = super::bare::stored_status_loops(
            &server.url(),
            args.executors,
            args.cores
                .iter()
                .map(|&cores| (cores, args.cycles_per_executor(cores)))
                .collect(),
        )
        .await?;
        if let Some(bare) = report.bare.as_mut() {
            bare.journaled_chain = Some(journaled);
            bare.stored_status_chain = Some(stored_chain);
            bare.stored_status_loops = stored_loops;
        }
    }

    eprintln!("bench: register {} executors", args.register);
    report.register = Some(register(args.register).await?);

    let mut memory = Memory::default_zero();
    report.journal = args.journal == super::Journal::On;
    report.sync_always = args.sync_always;
    let (throughput, latency) = loop_and_latency(args, report.journal, &mut memory).await?;
    (report.throughput, report.latency) = (throughput, latency);
    if report.journal {
        eprintln!("bench: the same with --journal off");
        let (throughput, latency) =
            loop_and_latency(args, false, &mut Memory::default_zero()).await?;
        report.journal_off = Some(super::Unjournaled {
            throughput,
            latency,
        });
    }
    eprintln!(
        "bench: driver memory with {} executors",
        args.memory_executors
    );
    memory.many_executors = args.memory_executors;
    memory.driver_with_many_executors_mb = many_executors_rss(args.memory_executors).await?;
    report.memory = Some(memory);
    if args.wide_executors > 0 {
        eprintln!(
            "bench: wide, {} jobs at once on {} executors of 1 core",
            args.wide_jobs, args.wide_executors
        );
        report.wide = Some(
            super::wide::run_wide(
                args.wide_executors as usize,
                args.wide_jobs,
                args.wide_tasks,
                args.wide_scheduling,
                report.journal,
            )
            .await?,
        );
    }
    if args.soak_jobs > 0 {
        eprintln!(
            "bench: soak, {} jobs on a driver that keeps {}",
            2 * args.soak_jobs,
            args.soak_retain
        );
        report.soak = Some(super::soak::run(args).await?);
    }
    if args.broadcast_mib > 0 {
        eprintln!(
            "bench: broadcast, {} MiB read by {} tasks on 2 x 2 cores",
            args.broadcast_mib, args.broadcast_tasks
        );
        report.broadcast = Some(super::broadcast::run(args).await?);
    }
    if args.huge_tasks {
        report.huge = Some(super::huge::run(args, report.journal).await?);
    }
    if let Some(python) = &args.python {
        eprintln!(
            "bench: Python functions from Python, under {}",
            python.display()
        );
        report.python = Some(super::python::run(python, args).await?);
    }
    report.slow_consumers = super::procs::slow_consumers();
    Ok(report)
}

/// The throughput runs at each core count and the latency run, with or without a journal;
/// the driver's and an executor's memory go into `memory`.
async fn loop_and_latency(
    args: &BenchArgs,
    journal: bool,
    memory: &mut Memory,
) -> anyhow::Result<(Vec<Throughput>, Option<super::Percentiles>)> {
    let (mut throughput, mut latency_report) = (Vec::new(), None);
    for &cores in &args.cores {
        let tasks = args.tasks_at(cores);
        eprintln!(
            "bench: {tasks} no-op tasks on {} x {cores} cores (journal {})",
            args.executors,
            if journal { "on" } else { "off" }
        );
        let mut cluster = Cluster::start("throughput", journal)?;
        let api = with_executors(&mut cluster, args.executors, cores).await?;
        memory.driver_idle_mb = rss_mb(cluster.driver.id()).0;
        memory.executor_idle_mb = rss_mb(cluster.executors[0].id()).0;
        let before = CpuTimes::of(&cluster);
        let seconds = time_noops(&api, tasks, LIMIT).await?;
        let cpu = CpuTimes::of(&cluster).per_task_us(&before, tasks);
        throughput.push(Throughput {
            executors: args.executors,
            cores,
            tasks,
            seconds,
            tasks_per_s: f64::from(tasks) / seconds,
            driver_cpu_us_per_task: cpu.driver,
            executors_cpu_us_per_task: cpu.executors,
            server_cpu_us_per_task: cpu.server,
        });
        memory.driver_peak_mb = memory.driver_peak_mb.max(rss_mb(cluster.driver.id()).1);
        memory.executor_peak_mb = memory
            .executor_peak_mb
            .max(rss_mb(cluster.executors[0].id()).1);
        if cores == 1 {
            eprintln!("bench: latency, {} single-task jobs", args.latency_jobs);
            latency_report = Some(latency(&cluster, &api, args.latency_jobs).await?);
        }
    }
    Ok((throughput, latency_report))
}

/// The CPU seconds a cluster's processes have used: its driver, its executors together, its
/// nats-server.
struct CpuTimes {
    driver: f64,
    executors: f64,
    server: f64,
}

impl CpuTimes {
    fn of(cluster: &Cluster) -> Self {
        Self {
            driver: cpu_seconds(cluster.driver.id()),
            executors: cluster.executors.iter().map(|e| cpu_seconds(e.id())).sum(),
            server: cpu_seconds(cluster.server.pid()),
        }
    }

    /// The microseconds each used per task of `tasks` since `before`.
    fn per_task_us(&self, before: &Self, tasks: u32) -> Self {
        let per = |now: f64, then: f64| (now - then) * 1e6 / f64::from(tasks.max(1));
        Self {
            driver: per(self.driver, before.driver),
            executors: per(self.executors, before.executors),
            server: per(self.server, before.server),
        }
    }
}

impl Memory {
    fn default_zero() -> Self {
        Memory {
            driver_idle_mb: 0.0,
            driver_peak_mb: 0.0,
            executor_idle_mb: 0.0,
            executor_peak_mb: 0.0,
            driver_with_many_executors_mb: 0.0,
            many_executors: 0,
        }
    }
}

/// Starts `executors` executors of `cores` each in `cluster`, and a client of it once all have
/// registered.
pub(super) async fn with_executors(
    cluster: &mut Cluster,
    executors: u32,
    cores: u32,
) -> anyhow::Result<EmberClient> {
    cluster.add_executors(executors, cores)?;
    let api = connect(cluster).await?;
    wait_for_executors(&api, u64::from(executors)).await?;
    Ok(api)
}

/// Runs one job of `tasks` no-op tasks to its end, each of which must succeed, within `limit`:
/// the seconds from its submission to its end.
pub(super) async fn time_noops(
    api: &EmberClient,
    tasks: u32,
    limit: Duration,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let summary = tokio::time::timeout(limit, api.run_job(noops(tasks), |_| {})).await??;
    let seconds = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        summary.succeeded == tasks,
        "the job of {tasks} tasks did not succeed: {summary:?}"
    );
    Ok(seconds)
}

pub(super) async fn connect(cluster: &Cluster) -> anyhow::Result<EmberClient> {
    let client = async_nats::ConnectOptions::new()
        .subscription_capacity(crate::SUBSCRIPTION_CAPACITY)
        .event_callback(|event| async move {
            if let async_nats::Event::SlowConsumer(_) = event {
                super::procs::count_slow_consumer();
            }
        })
        .connect(cluster.server.url())
        .await?;
    Ok(EmberClient::new(
        client,
        Subjects::new(&cluster.cluster).map_err(anyhow::Error::msg)?,
    ))
}

pub(super) async fn wait_for_executors(api: &EmberClient, n: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if api
            .executors_page(0, Some(0))
            .await
            .is_ok_and(|s| s.registered_executors == n)
        {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{n} executors did not register within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// N connections register at once; wall time until a listener has N ExecutorAdded.
async fn register(n: usize) -> anyhow::Result<Register> {
    let cluster = Cluster::start("register", false)?;
    let api = connect(&cluster).await?;
    wait_for_executors(&api, 0).await?;
    let subjects = Subjects::new(&cluster.cluster).map_err(anyhow::Error::msg)?;
    let mut added = api
        .nats()
        .subscribe(subjects.event("executor.added"))
        .await?;
    api.nats().flush().await?;
    let mut clients = Vec::with_capacity(n);
    for i in 0..n {
        let prefix = format!("_INBOX.reg-{i}");
        clients.push(
            async_nats::ConnectOptions::new()
                .custom_inbox_prefix(prefix)
                .connect(cluster.server.url())
                .await?,
        );
    }
    let started = Instant::now();
    let requests = clients.iter().enumerate().map(|(i, client)| {
        let id = ExecutorId::parse(format!("reg-{i}")).expect("valid id");
        let subject = subjects.register(&id);
        let payload = encode(&RegisterRequest::RegisterExecutor(registration(id)));
        async move {
            let one = Instant::now();
            client
                .request(subject, payload)
                .await
                .map(|_| one.elapsed())
        }
    });
    let samples: Vec<Duration> = futures::future::try_join_all(requests).await?;
    let mut seen = 0;
    while seen < n {
        let message = tokio::time::timeout(Duration::from_secs(30), added.next()).await?;
        if message.is_some() {
            seen += 1;
        }
    }
    let wall = started.elapsed();
    let one = percentiles(samples);
    Ok(Register {
        executors: n,
        wall_ms: wall.as_secs_f64() * 1000.0,
        one_p50_ms: one.p50_ms,
        one_p99_ms: one.p99_ms,
    })
}

fn registration(executor_id: ExecutorId) -> RegisterExecutor {
    RegisterExecutor {
        held: Vec::new(),
        executor_id,
        instance_id: uuid::Uuid::new_v4(),
        host_port: "bench:0".into(),
        cores: 1,
        log_urls: Default::default(),
        attributes: Default::default(),
        resources: Default::default(),
        connection: None,
    }
}

/// One single-task job at a time: submit to the job's end event.
async fn latency(
    cluster: &Cluster,
    api: &EmberClient,
    jobs: usize,
) -> anyhow::Result<super::Percentiles> {
    let subjects = Subjects::new(&cluster.cluster).map_err(anyhow::Error::msg)?;
    let mut ends = api.nats().subscribe(subjects.event("job.end")).await?;
    api.nats().flush().await?;
    let mut samples = Vec::with_capacity(jobs);
    for round in 0..jobs + 200 {
        let started = Instant::now();
        let job_id = api.submit(noops(1)).await?;
        loop {
            let message = tokio::time::timeout(Duration::from_secs(10), ends.next())
                .await?
                .ok_or_else(|| anyhow::anyhow!("events closed"))?;
            if let Ok(Event::JobEnd { job_id: id, .. }) =
                crate::protocol::decode(&message.payload, usize::MAX)
            {
                if id == job_id {
                    break;
                }
            }
        }
        if round >= 200 {
            samples.push(started.elapsed());
        }
    }
    Ok(percentiles(samples))
}

/// Driver RSS after `n` executors registered (through one connection, for the driver's sake).
async fn many_executors_rss(n: usize) -> anyhow::Result<f64> {
    let cluster = Cluster::start("memory", false)?;
    let api = connect(&cluster).await?;
    wait_for_executors(&api, 0).await?;
    let subjects = Subjects::new(&cluster.cluster).map_err(anyhow::Error::msg)?;
    let client = api.nats();
    let mut replies = client.subscribe("_INBOX.>").await?;
    for i in 0..n {
        let id = ExecutorId::parse(format!("m-{i}")).expect("valid id");
        let reply = format!("_INBOX.{id}.r");
        client
            .publish_with_reply(
                subjects.register(&id),
                reply,
                encode(&RegisterRequest::RegisterExecutor(registration(id))),
            )
            .await?;
    }
    client.flush().await?;
    for _ in 0..n {
        tokio::time::timeout(Duration::from_secs(30), replies.next()).await?;
    }
    wait_for_executors(&api, n as u64).await?;
    Ok(rss_mb(cluster.driver.id()).0)
}
