//! A driver as a long-lived service, on a real nats-server: results live in the cluster's
//! results bucket and come back byte for byte from the next driver; without JetStream, results
//! are bounded and the oldest finished jobs lose theirs first, saying so; retention forgets
//! old jobs and says so; while the journal cannot store, executors work on but no client or
//! listener is told anything until it is stored.

mod common;

use common::{within, TestCluster};
use ember::driver::core::Retention;
use ember::executor::Handlers;
use ember::protocol::{JobState, SubmitJob, TaskSpec};
use serde_json::json;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// A job of `repeat` echo tasks that each return `value`.
fn echoes(value: serde_json::Value, repeat: u32) -> SubmitJob {
    SubmitJob {
        name: "echo".into(),
        repeat,
        max_failures: 4,
        ..SubmitJob::new(vec![TaskSpec::Handler {
            name: "echo".into(),
            arg: json!({ "value": value }),
        }])
    }
}

/// Job `job_id`'s results, once a driver that has just started answers for them.
async fn results_from_the_next_driver(
    api: &ember::client::EmberClient,
    job_id: ember::ids::JobId,
) -> Vec<ember::protocol::TaskOutcome> {
    common::eventually(LIMIT, "the next driver's results", || async {
        api.results(job_id).await.ok()
    })
    .await
}

#[tokio::test]
async fn results_live_in_the_bucket_and_come_back_byte_for_byte_from_the_next_driver() {
    let cluster = TestCluster::start_with_jetstream("results-bucket");
    let first = cluster.driver().await;
    let _executor = cluster.executor("e1", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    // 600 KiB of text with escapes and characters past ASCII: two such results are more
    // than one reply can carry (max_payload 1 MiB), so the pages are cut to fit.
    let big = format!("{}\"\\\n ü €", "x".repeat(600 * 1024));
    let job = within(LIMIT, api.run_job(echoes(json!(big), 3), |_| {}))
        .await
        .unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    let check = |results: Vec<ember::protocol::TaskOutcome>| {
        assert_eq!(results.len(), 3);
        for outcome in results {
            assert_eq!(
                outcome.result.as_ref().and_then(|v| v.as_str()),
                Some(big.as_str())
            );
        }
    };
    check(api.results(job.job_id).await.unwrap());
    // In the bucket, as the result's JSON.
    let jetstream = async_nats::jetstream::new(cluster.client().await);
    let bucket = jetstream
        .get_key_value(cluster.subjects.results_bucket())
        .await
        .unwrap();
    let stored = bucket
        .get(format!("{}.1", job.job_id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored, serde_json::to_vec(&json!(big)).unwrap());
    first.stop().await.unwrap();

    let _next = cluster.driver().await;
    check(results_from_the_next_driver(&api, job.job_id).await);
}

#[tokio::test]
async fn without_jetstream_the_oldest_finished_jobs_lose_their_results_first_and_say_so() {
    let cluster = TestCluster::start("results-memory");
    let _driver = cluster
        .driver_configured(|config| {
            config.retention = Retention {
                result_bytes: 64 * 1024,
                ..Retention::default()
            }
        })
        .await;
    let _executor = cluster.executor("e1", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let value = json!("y".repeat(10 * 1024));
    let mut jobs = Vec::new();
    for _ in 0..4 {
        // 30 KiB of results each: the third passes 64 KiB, the fourth again.
        let job = within(LIMIT, api.run_job(echoes(value.clone(), 3), |_| {}))
            .await
            .unwrap();
        jobs.push(job.job_id);
    }
    for dropped in &jobs[..2] {
        let error = api.results(*dropped).await.unwrap_err().to_string();
        assert!(
            error.contains(&format!("the results of job {dropped} were dropped"))
                && error.contains("--max-result-bytes"),
            "{error}"
        );
        assert_eq!(
            api.job(*dropped).await.unwrap().succeeded,
            3,
            "the job itself stays"
        );
    }
    for kept in &jobs[2..] {
        let results = api.results(*kept).await.unwrap();
        assert!(results.iter().all(|r| r.result.as_ref() == Some(&value)));
    }
}

#[tokio::test]
async fn a_full_results_bucket_drops_its_oldest_results_and_a_reader_is_told() {
    let cluster = TestCluster::start_with_jetstream("results-full");
    let _driver = cluster
        .driver_configured(|config| config.results_max_bytes = 256 * 1024)
        .await;
    let _executor = cluster.executor("e1", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let value = json!("z".repeat(60 * 1024));
    let first = within(LIMIT, api.run_job(echoes(value.clone(), 3), |_| {}))
        .await
        .unwrap();
    let second = within(LIMIT, api.run_job(echoes(value.clone(), 3), |_| {}))
        .await
        .unwrap();
    assert_eq!(
        second.state,
        JobState::Succeeded,
        "a full bucket refuses nothing"
    );
    let old = api.results(first.job_id).await.unwrap();
    let gone: Vec<_> = old.iter().filter(|r| r.result.is_none()).collect();
    assert!(!gone.is_empty(), "the oldest results went");
    for outcome in gone {
        let error = outcome.error.as_deref().unwrap_or_default();
        assert!(error.contains("no longer in the results bucket"), "{error}");
    }
    let new = api.results(second.job_id).await.unwrap();
    assert!(new.iter().all(|r| r.result.as_ref() == Some(&value)));
}

/// The journal's records, in order, read back from its stream (one or more per message).
async fn journal_records(cluster: &TestCluster) -> Vec<ember::protocol::JournalRecord> {
    let mut records = Vec::new();
    for message in cluster.journal_messages().await {
        for line in message.payload.split(|&b| b == b'\n') {
            records.push(ember::protocol::decode(line, usize::MAX).unwrap());
        }
    }
    records
}

#[tokio::test]
async fn while_the_journal_cannot_store_executors_work_on_but_no_client_or_listener_is_told() {
    use ember::protocol::{decode, encode, ApiReply, ApiRequest, JournalRecord};
    use futures::StreamExt;
    let cluster = TestCluster::start_with_jetstream("journal-outage");
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("e1", 1, Handlers::builtin()).await;
    let client = cluster.client().await;
    let jetstream = async_nats::jetstream::new(client.clone());
    let journal = cluster.subjects.journal_stream();
    let config = jetstream
        .get_stream(&journal)
        .await
        .unwrap()
        .cached_info()
        .config
        .clone();
    let mut events = cluster.listen(cluster.subjects.events_all()).await;
    // Writes to the journal now find no stream that takes them, and are retried until the
    // stream takes its subject back.
    let elsewhere = async_nats::jetstream::stream::Config {
        subjects: vec![format!("{}.elsewhere", cluster.subjects.prefix())],
        ..config.clone()
    };
    jetstream.update_stream(elsewhere).await.unwrap();

    let marker = std::env::temp_dir().join(format!("ember-outage-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let job = SubmitJob {
        name: "outage".into(),
        max_failures: 1,
        ..SubmitJob::new(vec![common::sh(&format!("touch {}", marker.display()))])
    };
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(inbox.clone()).await.unwrap();
    client
        .publish_with_reply(
            cluster.subjects.api(),
            inbox,
            encode(&ApiRequest::SubmitJob(job)),
        )
        .await
        .unwrap();
    // The launch does not wait for the job's record: the task runs.
    common::eventually(LIMIT, "the task to run", || async {
        marker.exists().then_some(())
    })
    .await;
    // But the client is not told its job was accepted, nor a listener that anything happened,
    // while nothing of it is stored.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let told = tokio::time::timeout(Duration::from_millis(1), answers.next()).await;
    assert!(
        told.is_err(),
        "JobAccepted came before its record was stored"
    );
    let heard = tokio::time::timeout(Duration::from_millis(1), events.next()).await;
    assert!(
        heard.is_err(),
        "an event came before the records before it were stored: {heard:?}"
    );

    jetstream.update_stream(config).await.unwrap();
    let answer = within(LIMIT, answers.next()).await.unwrap();
    let ApiReply::JobAccepted { job_id } = decode(&answer.payload, usize::MAX).unwrap() else {
        panic!("not JobAccepted: {:?}", answer.payload)
    };
    let api = cluster.api(client.clone());
    let ended = common::eventually(LIMIT, "the job to end", || async {
        let job = api.job(job_id).await.ok()?;
        (job.state != JobState::Running).then_some(job)
    })
    .await;
    assert_eq!(ended.state, JobState::Succeeded);
    let _ = std::fs::remove_file(&marker);
    // Everything that was told is in the journal.
    let records = journal_records(&cluster).await;
    let submitted = records
        .iter()
        .any(|r| matches!(r, JournalRecord::JobSubmitted { job_id: id, .. } if *id == job_id));
    let task_ended = records
        .iter()
        .any(|r| matches!(r, JournalRecord::TasksEnded { tasks, .. } if tasks.len() == 1));
    let job_ended = records.iter().any(
        |r| matches!(r, JournalRecord::JobEnded { job_id: id, state: JobState::Succeeded, .. } if *id == job_id),
    );
    assert!(submitted && task_ended && job_ended, "{records:?}");
}

#[tokio::test]
async fn a_result_larger_than_max_payload_is_an_object_of_its_job_and_comes_back_whole() {
    let cluster = TestCluster::start_with_jetstream("results-objects");
    let first = cluster.driver().await;
    // 2.5 MiB of text with escapes and characters past ASCII, on a server whose max_payload
    // is 1 MiB: each result is put in the object store, in chunks cut inside characters.
    let big = format!("{}\"\\\n ü €", "ü€x".repeat(400 * 1024));
    let mut handlers = Handlers::builtin();
    let made = big.clone();
    handlers.register("big", move |_, _| Ok(json!(made)));
    let _executor = cluster.executor("e1", 2, handlers).await;
    let api = cluster.api(cluster.client().await);
    let job = SubmitJob {
        speculation: None,
        tasks: vec![TaskSpec::Handler {
            name: "big".into(),
            arg: json!(null),
        }],
        ..echoes(json!(null), 2)
    };
    let job = within(LIMIT, api.run_job(job, |_| {})).await.unwrap();
    assert_eq!(job.state, JobState::Succeeded, "{:?}", job.reason);
    let check = |results: Vec<ember::protocol::TaskOutcome>| {
        assert_eq!(results.len(), 2);
        for outcome in results {
            let object = outcome.result_object.expect("put in the object store");
            assert_eq!(
                object.bytes,
                serde_json::to_vec(&json!(big)).unwrap().len() as u64
            );
            assert_eq!(
                outcome.result.as_ref().and_then(|v| v.as_str()),
                Some(big.as_str()),
                "{:?}",
                outcome.error
            );
        }
    };
    check(api.results(job.job_id).await.unwrap());
    // The two tasks made the same bytes: one object, which the job keeps.
    let outcomes = api.results(job.job_id).await.unwrap();
    let object = outcomes[0].result_object.clone().unwrap().object;
    let uses = api
        .call(&ember::protocol::ApiRequest::ObjectUses {
            objects: vec![object.clone()],
        })
        .await
        .unwrap();
    let ember::protocol::ApiReply::ObjectUses { uses } = uses else {
        panic!("unexpected {uses:?}");
    };
    assert_eq!(uses[0].jobs, [job.job_id]);
    first.stop().await.unwrap();

    // The next driver restores the reference from the journal.
    let _next = cluster.driver().await;
    check(results_from_the_next_driver(&api, job.job_id).await);
}

#[tokio::test]
async fn a_driver_whose_journal_another_leader_marked_stops_before_telling_anyone() {
    use ember::protocol::{encode, JournalRecord};
    let cluster = TestCluster::start_with_jetstream("journal-fence");
    let _driver = cluster
        .driver_configured(|c| c.lease = Duration::from_secs(1))
        .await;
    let _executor = cluster.executor("e1", 1, Handlers::builtin()).await;
    let client = cluster.client().await;
    let api = cluster.api(client.clone());
    common::eventually(LIMIT, "the driver answers", || async {
        api.executors().await.ok()
    })
    .await;
    // Another driver's mark, as a successor writes when it takes over: from here on, what
    // this driver writes is refused, and it must tell no one of it.
    let jetstream = async_nats::jetstream::new(client.clone());
    let mark = JournalRecord::Leader {
        epoch: 1_000_000,
        driver_instance: uuid::Uuid::new_v4(),
        time_ms: 0,
    };
    jetstream
        .publish(cluster.subjects.journal(), encode(&mark))
        .await
        .unwrap()
        .await
        .unwrap();
    // Sent once (`submit` would send it again, to the driver once it leads anew).
    let request = ember::protocol::ApiRequest::SubmitJob(echoes(json!(1), 1));
    let submitted = api.call(&request).await;
    assert!(
        matches!(submitted, Err(ember::client::ClientError::Timeout(_))),
        "a job was accepted whose record the journal refused: {submitted:?}"
    );
    let records = journal_records(&cluster).await;
    let after_mark = records.iter().skip_while(|r| **r != mark).skip(1);
    assert!(
        after_mark
            .clone()
            .all(|r| matches!(r, JournalRecord::Leader { .. })),
        "records written after another leader's mark: {:?}",
        after_mark.collect::<Vec<_>>()
    );
    // Deposed, it stands by; its own lease lapses and it leads again, from the journal as it
    // is: a job goes through.
    let ended = common::eventually(LIMIT, "the driver to lead again", || async {
        api.run_job(echoes(json!(2), 1), |_| {}).await.ok()
    })
    .await;
    assert_eq!(ended.state, JobState::Succeeded);
}

/// Every reply to one request on `subject` that arrives within half a second, as JSON.
async fn gather(client: &async_nats::Client, subject: String) -> Vec<serde_json::Value> {
    use futures::StreamExt;
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await.unwrap();
    client
        .publish_with_reply(subject, inbox, bytes::Bytes::new())
        .await
        .unwrap();
    client.flush().await.unwrap();
    let mut out = Vec::new();
    let until = tokio::time::Instant::now() + Duration::from_millis(500);
    while let Ok(Some(reply)) = tokio::time::timeout_at(until, replies.next()).await {
        out.push(serde_json::from_slice(&reply.payload).expect("a JSON reply"));
    }
    out
}

/// A plain NATS client finds both drivers of a cluster by `$SRV.PING.ember-driver`, tells the
/// leader from the standby by their metadata, reads the leader's api endpoint from
/// `$SRV.INFO`, sees the api's requests counted in `$SRV.STATS`, error answers apart, and a
/// refusal's service error headers.
#[tokio::test]
async fn nats_service_discovery_finds_every_driver_and_counts_the_api() {
    let cluster = TestCluster::start_with_jetstream("discovery");
    let name = cluster
        .subjects
        .prefix()
        .trim_start_matches("ember.")
        .to_string();
    let short_lease = |config: &mut ember::driver::DriverConfig| {
        config.lease = Duration::from_secs(1);
    };
    let first = cluster.driver_configured(short_lease).await;
    let second = cluster.driver_configured(short_lease).await;
    let client = cluster.client().await;
    let ours = common::eventually(LIMIT, "a leader and a standby", || async {
        let ours: Vec<_> = gather(&client, "$SRV.PING.ember-driver".into())
            .await
            .into_iter()
            .filter(|r| r["metadata"]["cluster"] == name.as_str())
            .collect();
        let leaders = ours
            .iter()
            .filter(|r| r["metadata"]["leader"] == "true")
            .count();
        (ours.len() == 2 && leaders == 1).then_some(ours)
    })
    .await;
    let leader = ours
        .iter()
        .find(|r| r["metadata"]["leader"] == "true")
        .unwrap();
    let standby = ours
        .iter()
        .find(|r| r["metadata"]["leader"] == "false")
        .unwrap();
    assert_eq!(leader["name"], "ember-driver");
    assert_eq!(leader["version"], env!("CARGO_PKG_VERSION"));
    assert_ne!(
        leader["metadata"]["driver_instance"],
        standby["metadata"]["driver_instance"]
    );
    assert!(
        leader["metadata"]["epoch"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    assert!(standby["metadata"].get("epoch").is_none());

    let info = |id: &serde_json::Value| format!("$SRV.INFO.ember-driver.{}", id.as_str().unwrap());
    let leader_info = gather(&client, info(&leader["id"])).await;
    let endpoints = &leader_info[0]["endpoints"];
    assert_eq!(endpoints[0]["name"], "api");
    assert_eq!(endpoints[0]["subject"], cluster.subjects.api());
    let standby_info = gather(&client, info(&standby["id"])).await;
    let none = standby_info[0]["endpoints"].as_array().map_or(0, Vec::len);
    assert_eq!(none, 0, "a standby serves no api: {standby_info:?}");

    // What the api had answered before (the harness asks once whether a started driver
    // answers), for the counts below.
    let stats_of =
        |id: &serde_json::Value| format!("$SRV.STATS.ember-driver.{}", id.as_str().unwrap());
    let before = gather(&client, stats_of(&leader["id"])).await[0]["endpoints"][0]["num_requests"]
        .as_u64()
        .unwrap();
    let api = cluster.api(client.clone());
    for _ in 0..3 {
        api.jobs().await.unwrap();
    }
    assert!(api.job(999).await.is_err(), "no job 999");
    let raw = client
        .request(cluster.subjects.api(), "not json".into())
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&raw.payload).contains("could not decode"));
    // The refusal is a micro service error too (ADR-32), beside its JSON.
    let headers = raw.headers.expect("a refusal's headers");
    let header = |name: &str| headers.get(name).map(|v| v.as_str().to_string());
    assert_eq!(header("Nats-Service-Error-Code").as_deref(), Some("400"));
    assert!(
        header("Nats-Service-Error").is_some_and(|e| e.contains("could not decode")),
        "{headers:?}"
    );

    let stats = gather(&client, stats_of(&leader["id"])).await;
    let api_stats = &stats[0]["endpoints"][0];
    assert_eq!(api_stats["name"], "api");
    assert_eq!(
        api_stats["num_requests"].as_u64(),
        Some(before + 5),
        "{api_stats}"
    );
    assert!(
        api_stats["processing_time"].as_u64().unwrap() > 0,
        "{api_stats}"
    );
    assert_eq!(api_stats["data"]["error_answers"], 2, "{api_stats}");
    first.stop().await.unwrap();
    second.stop().await.unwrap();
}

#[tokio::test]
async fn a_driver_uses_the_streams_that_exist_as_their_operators_made_them() {
    use async_nats::jetstream::stream;
    let cluster = TestCluster::start_with_jetstream("bind");
    let js = async_nats::jetstream::new(cluster.client().await);
    let subjects = &cluster.subjects;
    // The operators made the journal and the events stream their own way.
    let day = Duration::from_secs(86_400);
    js.create_stream(stream::Config {
        name: subjects.journal_stream(),
        subjects: vec![subjects.journal()],
        description: Some("the operators' journal".into()),
        max_age: 2 * day,
        ..Default::default()
    })
    .await
    .expect("the journal stream");
    js.create_stream(stream::Config {
        name: subjects.events_stream(),
        subjects: vec![subjects.history_all()],
        subject_transform: Some(stream::SubjectTransform {
            source: subjects.history_all(),
            destination: subjects.events_all(),
        }),
        description: Some("the operators' events".into()),
        max_age: day,
        max_bytes: 10 << 20,
        ..Default::default()
    })
    .await
    .expect("the events stream");
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("e1", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let ended = within(LIMIT, api.run_job(echoes(json!(1), 3), |_| {}))
        .await
        .unwrap();
    assert_eq!(ended.state, JobState::Succeeded);
    let mut journal = js.get_stream(subjects.journal_stream()).await.unwrap();
    let journal = journal.info().await.unwrap().clone();
    assert_eq!(
        journal.config.description.as_deref(),
        Some("the operators' journal")
    );
    assert_eq!(journal.config.max_age, 2 * day, "its own age limit");
    assert_eq!(journal.config.duplicate_window, Duration::from_secs(120));
    assert!(journal.state.messages > 0, "the job is in the journal");
    let mut events = js.get_stream(subjects.events_stream()).await.unwrap();
    let events = events.info().await.unwrap().clone();
    assert_eq!(
        events.config.description.as_deref(),
        Some("the operators' events")
    );
    assert_eq!(
        (events.config.max_age, events.config.max_bytes),
        (day, 10 << 20)
    );
    assert!(events.state.messages > 0, "the job's events are stored");
}

#[tokio::test]
async fn a_driver_refuses_a_stream_that_does_not_fit_naming_each_setting_it_needs() {
    use async_nats::jetstream::stream;
    let cluster = TestCluster::start_with_jetstream("misfit");
    let js = async_nats::jetstream::new(cluster.client().await);
    let name = cluster.subjects.events_stream();
    // An events stream that stores under the subjects it is sent on and refuses when full.
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![cluster.subjects.history_all()],
        discard: stream::DiscardPolicy::New,
        max_bytes: 1 << 20,
        ..Default::default()
    })
    .await
    .expect("the events stream");
    let driver = cluster.driver().await;
    let error = driver
        .join()
        .await
        .expect_err("the driver refuses to start");
    let error = error.to_string();
    for words in [
        format!("stream {name} exists with settings Ember cannot use"),
        format!(
            "subject_transform is none; needs {} -> {}",
            cluster.subjects.history_all(),
            cluster.subjects.events_all()
        ),
        "discard is New; needs Old".into(),
        format!("nats stream edit {name}"),
    ] {
        assert!(error.contains(&words), "{words:?} in {error}");
    }
    let mut events = js.get_stream(&name).await.unwrap();
    let events = events.info().await.unwrap();
    assert_eq!(
        events.config.discard,
        stream::DiscardPolicy::New,
        "unchanged"
    );
    assert!(events.config.subject_transform.is_none(), "unchanged");
}
