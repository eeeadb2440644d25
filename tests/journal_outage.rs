//! JetStream going away under a journaling driver, on a real nats-server: what the driver does
//! while its writes are refused, and that it takes work again once they are stored.

mod common;

use common::{eventually, noops, TestCluster};
use ember::client::ClientError;
use ember::driver::JournalMode;
use ember::executor::Handlers;
use ember::protocol::JobState;
use ember::server::NatsServer;
use ember::subjects::Subjects;
use std::path::PathBuf;
use std::time::Duration;

/// A directory in the temp dir, removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A full store (the server's `max_file_store` reached): JetStream refuses every write, the
/// lease's renewals included, so the leader stands down within its lease, and standing by, it
/// answers every api request with `Unavailable`, saying why, once it finds that no driver can
/// write the lease. Once there is room again it leads again: the jobs answered before are all
/// there, and new ones run.
#[tokio::test]
async fn a_full_store_makes_the_driver_answer_unavailable_until_there_is_room_again() {
    let dir = TempDir(std::env::temp_dir().join(format!("ember-full-{}", uuid::Uuid::new_v4())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let config = dir.0.join("nats.conf");
    std::fs::write(
        &config,
        format!(
            "jetstream {{ store_dir: {:?}, max_file_store: 16MB }}\n",
            dir.0.join("js").display().to_string()
        ),
    )
    .expect("config");
    let server = NatsServer::start(&["-c", config.to_str().expect("utf-8 path")])
        .expect("start nats-server");
    let name = format!("full-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let cluster = TestCluster {
        server,
        subjects: Subjects::new(&name).expect("valid cluster"),
        cluster: name,
    };
    let _driver = cluster
        .driver_configured(|config| {
            config.journal = JournalMode::On;
            // Streams that reserve no more than the small store holds.
            config.events_max_bytes = 1 << 20;
            config.results_max_bytes = 1 << 20;
        })
        .await;
    let _executor = cluster.executor("exec-1", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    eventually(Duration::from_secs(20), "exec-1 registered", || async {
        (api.executors().await.ok()?.registered_executors == 1).then_some(())
    })
    .await;
    let first = api.run_job(noops(5), |_| {}).await.expect("a job runs");
    assert_eq!(first.state, JobState::Succeeded);

    // Something else fills the store.
    let jetstream = async_nats::jetstream::new(cluster.client().await);
    jetstream
        .create_stream(async_nats::jetstream::stream::Config {
            name: "FILLER".into(),
            subjects: vec!["filler".into()],
            ..Default::default()
        })
        .await
        .expect("filler stream");
    let chunk = bytes::Bytes::from(vec![b'x'; 500_000]);
    let refused = async {
        for _ in 0..100 {
            let stored = match jetstream.publish("filler", chunk.clone()).await {
                Ok(ack) => ack.await.map(drop).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(error) = stored {
                return error;
            }
        }
        panic!("16 MB of store took 50 MB")
    }
    .await;
    assert!(refused.contains("insufficient resources"), "{refused}");

    // The leader cannot renew its lease: it stands down, and nothing can lead.
    let said = eventually(
        Duration::from_secs(20),
        "the driver answers Unavailable",
        || async {
            match api.executors().await {
                Err(ClientError::Unavailable(message)) => Some(message),
                _ => None,
            }
        },
    )
    .await;
    assert!(
        said.contains(&format!(
            "no driver of cluster {} can lead",
            cluster.cluster
        )) && said.contains("insufficient resources"),
        "{said}"
    );
    // A submission is refused the same way, and a client sends it again until it gives up.
    let submitted = api.submit(noops(5)).await;
    assert!(
        matches!(submitted, Err(ClientError::Unavailable(_))),
        "{submitted:?}"
    );

    // Room again: it leads again, knows the job answered before, and runs new ones.
    jetstream
        .delete_stream("FILLER")
        .await
        .expect("delete the filler");
    eventually(
        Duration::from_secs(30),
        "the driver answers again",
        || async { api.executors().await.ok() },
    )
    .await;
    let jobs = api.jobs().await.expect("jobs");
    assert!(
        jobs.iter()
            .any(|job| job.job_id == first.job_id && job.state == JobState::Succeeded),
        "{jobs:?}"
    );
    eventually(Duration::from_secs(30), "a new job runs", || async {
        let job = api.run_job(noops(5), |_| {}).await.ok()?;
        (job.state == JobState::Succeeded).then_some(())
    })
    .await;
}
