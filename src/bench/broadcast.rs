//! The broadcast workload: one large object read by many tasks on 2 executors of 2 cores, as
//! Spark's broadcast variables, Ray's `ray.put` and Dask's `scatter(broadcast=True)` are used.
//! Each task is a command that names the object as an input and checks its size; each executor
//! gets the object once and links it into each task's directory from its cache. It runs twice,
//! each time on a cluster of its own: with the executors on the client's host, taking the copy
//! the put left there; and with executors that share nothing with the client, as on other
//! hosts, each fetching it from the store. Beside the second, the limit: two concurrent gets
//! of the same object, over two connections, by a bare async-nats client, from the first
//! request to the last byte.

use super::procs::{metric, Cluster};
use super::workloads::{connect, wait_for_executors};
use super::BenchArgs;
use crate::objects::host::HostSetting;
use crate::objects::ObjectRef;
use crate::protocol::{JobState, SubmitJob, TaskSpec};
use crate::server::free_port;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(600);
/// Executors, and cores each, as the peers' 2 workers of 2 slots.
const EXECUTORS: u32 = 2;
const CORES: u32 = 2;

#[derive(Debug, Serialize, Deserialize)]
pub struct Broadcast {
    pub object_bytes: u64,
    pub tasks: u32,
    /// The client's put of the object: it names it, leaves a copy on this host for its
    /// executors and sends its chunks to the store.
    pub put_s: f64,
    /// From the submission to the job's last result, the executors on the client's host.
    pub run_s: f64,
    /// The object's bytes times the tasks that read it, over `run_s`, in GB/s.
    pub gbps: f64,
    /// The objects each executor took from its host's shared directory: the fewest and the
    /// most (1 and 1).
    pub host_takes_min: u64,
    pub host_takes_max: u64,
    /// The same job on executors that share nothing with the client, as on other hosts: each
    /// fetches the object from the store.
    pub run_apart_s: f64,
    /// The fetches of the object by each of those executors: the fewest and the most (1 and 1).
    pub fetches_min: u64,
    pub fetches_max: u64,
    /// Two concurrent gets of the object from two connections, bare async-nats.
    pub bare_gets_s: f64,
    /// `run_apart_s / bare_gets_s`.
    pub ratio: f64,
}

/// One cluster's run of the workload.
struct Sitting {
    put_s: f64,
    run_s: f64,
    /// Each executor's fetches from the store, and objects taken from its host.
    fetches: Vec<u64>,
    takes: Vec<u64>,
    bare_gets_s: f64,
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<Broadcast> {
    let bytes = args.broadcast_mib as usize * (1 << 20);
    let tasks = args.broadcast_tasks;
    let near = on_a_cluster(bytes, tasks, true).await?;
    let apart = on_a_cluster(bytes, tasks, false).await?;
    let span = |counts: &[u64]| {
        let min = counts.iter().copied().min().unwrap_or(0);
        (min, counts.iter().copied().max().unwrap_or(0))
    };
    let ((host_takes_min, host_takes_max), (fetches_min, fetches_max)) =
        (span(&near.takes), span(&apart.fetches));
    anyhow::ensure!(
        near.fetches.iter().all(|f| *f == 0),
        "executors on the client's host fetched the object: {:?}",
        near.fetches
    );
    Ok(Broadcast {
        object_bytes: bytes as u64,
        tasks,
        put_s: near.put_s,
        run_s: near.run_s,
        gbps: bytes as f64 * f64::from(tasks) / near.run_s / 1e9,
        host_takes_min,
        host_takes_max,
        run_apart_s: apart.run_s,
        fetches_min,
        fetches_max,
        bare_gets_s: apart.bare_gets_s,
        ratio: apart.run_s / apart.bare_gets_s,
    })
}

/// The workload on a cluster of its own, whose executors share the client's host if `near`.
async fn on_a_cluster(bytes: usize, tasks: u32, near: bool) -> anyhow::Result<Sitting> {
    let mut cluster = Cluster::start("broadcast", true)?;
    let data = tempdir()?;
    let host = match near {
        true => HostSetting::Dir(data.join("host")),
        false => HostSetting::Off,
    };
    let shown = match &host {
        HostSetting::Dir(dir) => dir.display().to_string(),
        _ => "off".to_string(),
    };
    let mut ports = Vec::new();
    for i in 0..EXECUTORS {
        let port = free_port()?;
        let dir = data.join(format!("exec-{i}"));
        let extra = [
            "--metrics-addr".to_string(),
            format!("127.0.0.1:{port}"),
            "--data-dir".into(),
            dir.display().to_string(),
            "--host-objects".into(),
            shown.clone(),
        ];
        cluster.add_executor(&format!("bench-{i}"), CORES, &extra)?;
        ports.push(port);
    }
    let measured = measure(&cluster, bytes, tasks, &ports, &host).await;
    drop(cluster);
    let _ = std::fs::remove_dir_all(&data);
    measured
}

async fn measure(
    cluster: &Cluster,
    bytes: usize,
    tasks: u32,
    ports: &[u16],
    host: &HostSetting,
) -> anyhow::Result<Sitting> {
    let api = connect(cluster).await?;
    wait_for_executors(&api, u64::from(EXECUTORS)).await?;
    let subjects = crate::subjects::Subjects::new(&cluster.cluster).map_err(anyhow::Error::msg)?;
    let objects = api.objects().await?.with_host(host, &subjects);
    // Content no earlier run stored: the put sends every chunk.
    let mut content = vec![0u8; bytes];
    let seed = uuid::Uuid::new_v4().as_u128();
    for (i, byte) in content.iter_mut().enumerate() {
        *byte = (i as u128).wrapping_mul(seed | 1).to_le_bytes()[(i / 7) % 16];
    }
    let content = bytes::Bytes::from(content);
    let started = Instant::now();
    let put = objects.put_bytes(content.clone()).await?;
    let put_s = started.elapsed().as_secs_f64();
    anyhow::ensure!(put.sent, "the object was stored already");

    let started = Instant::now();
    let summary = tokio::time::timeout(
        LIMIT,
        api.run_job(readers(&put.object, bytes, tasks), |_| {}),
    )
    .await??;
    let run_s = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        summary.state == JobState::Succeeded,
        "the broadcast job did not succeed: {summary:?}"
    );
    let (mut fetches, mut takes) = (Vec::new(), Vec::new());
    for port in ports {
        fetches.push(metric(*port, "ember_executor_object_fetches_total").await?);
        takes.push(metric(*port, "ember_executor_object_host_takes_total").await?);
    }
    let bare_gets_s = match host {
        HostSetting::Off => {
            bare_gets(&cluster.server.url(), &cluster.cluster, &put.object, bytes).await?
        }
        _ => 0.0,
    };
    Ok(Sitting {
        put_s,
        run_s,
        fetches,
        takes,
        bare_gets_s,
    })
}

/// `tasks` commands that each find the object in their directory, whole.
fn readers(object: &ObjectRef, bytes: usize, tasks: u32) -> SubmitJob {
    let script = format!("test \"$(wc -c < data.bin)\" -eq {bytes}");
    SubmitJob {
        name: "broadcast".into(),
        tasks: vec![TaskSpec::Command {
            argv: vec!["sh".into(), "-c".into(), script],
            env: Default::default(),
            cwd: None,
            timeout_ms: None,
            inputs: [("data.bin".to_string(), object.clone())].into(),
            outputs: Vec::new(),
        }],
        repeat: tasks,
        ..super::noops(1)
    }
}

/// Two gets of `object` at once, each on a connection of its own, with async-nats alone: from
/// the first request to the last byte.
async fn bare_gets(
    url: &str,
    cluster: &str,
    object: &ObjectRef,
    bytes: usize,
) -> anyhow::Result<f64> {
    let subjects = crate::subjects::Subjects::new(cluster).map_err(anyhow::Error::msg)?;
    let mut stores = Vec::new();
    for _ in 0..2 {
        let client = async_nats::connect(url).await?;
        let jetstream = async_nats::jetstream::new(client);
        stores.push(
            jetstream
                .get_object_store(subjects.objects_bucket())
                .await?,
        );
    }
    let started = Instant::now();
    let gets = stores.iter().map(|store| async move {
        use tokio::io::AsyncReadExt;
        let mut reader = store.get(object.as_str()).await?;
        let mut read = Vec::with_capacity(bytes);
        reader.read_to_end(&mut read).await?;
        anyhow::ensure!(read.len() == bytes, "a bare get read {} bytes", read.len());
        Ok(())
    });
    for got in futures::future::join_all(gets).await {
        got?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// A directory for the executors' caches and the host's shared objects: in memory
/// (`/dev/shm`) where the machine has it, as Ray keeps its object store, else the temp dir.
fn tempdir() -> anyhow::Result<std::path::PathBuf> {
    let shm = std::path::Path::new("/dev/shm");
    let base = match shm.is_dir() {
        true => shm.to_path_buf(),
        false => std::env::temp_dir(),
    };
    let dir = base.join(format!(
        "ember-bench-broadcast-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

impl Broadcast {
    /// Its row of `ember bench`'s table.
    pub fn row(&self) -> [String; 3] {
        [
            format!(
                "broadcast: {} MiB read by {} tasks, 2 x 2 cores",
                self.object_bytes >> 20,
                self.tasks
            ),
            format!(
                "put {:.3} s; {:.3} s from submit to the last result ({:.1} GB/s read), each \
                 executor taking it from the host {}-{} times; {:.3} s on executors apart, each \
                 fetching it {}-{} times",
                self.put_s,
                self.run_s,
                self.gbps,
                self.host_takes_min,
                self.host_takes_max,
                self.run_apart_s,
                self.fetches_min,
                self.fetches_max
            ),
            format!(
                "2 bare concurrent gets {:.3} s: apart {:.2}x",
                self.bare_gets_s, self.ratio
            ),
        ]
    }
}
