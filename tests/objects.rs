//! The cluster's object store on a real nats-server: objects named by their content, stored
//! once, read back checked, and refused clearly when the store is full or an object is not
//! there.

mod common;

use bytes::Bytes;
use common::{within, TestCluster};
use ember::objects::{ObjectRef, Objects, ObjectsError, CHUNK_BYTES};
use std::time::Duration;

/// A driver with a journal (which makes the store), and the store as a client opens it.
async fn store_of(
    cluster: &TestCluster,
    max_bytes: u64,
) -> (
    common::Running<Result<(), ember::driver::DriverError>>,
    Objects,
) {
    store_with(cluster, |config| config.objects_max_bytes = max_bytes).await
}

/// A journaling driver configured as `configure` says, and the store once it has made it.
async fn store_with(
    cluster: &TestCluster,
    configure: impl FnOnce(&mut ember::driver::DriverConfig),
) -> (
    common::Running<Result<(), ember::driver::DriverError>>,
    Objects,
) {
    let driver = cluster
        .driver_configured(|config| {
            config.journal = ember::driver::journal::JournalMode::On;
            configure(config);
        })
        .await;
    let api = cluster.api(cluster.client().await);
    let objects = common::eventually(Duration::from_secs(20), "the object store", || async {
        api.objects().await.ok()
    })
    .await;
    (driver, objects)
}

/// An executor "exec-1" of `cores` in this process, with metrics and a data directory of its
/// own (and a cache of `cache_bytes`, if given): it, its metrics, and the directory.
async fn executor(
    cluster: &TestCluster,
    name: &str,
    cores: u32,
    cache_bytes: Option<u64>,
) -> (
    common::Running<Result<(), ember::executor::ExecutorError>>,
    std::sync::Arc<ember::metrics::ExecutorMetrics>,
    std::path::PathBuf,
) {
    let metrics = std::sync::Arc::new(ember::metrics::ExecutorMetrics::new());
    let data_dir = tempdir(&format!("{name}-exec"));
    let (counted, dir) = (metrics.clone(), data_dir.clone());
    let running = cluster
        .executor_configured(
            "exec-1",
            cores,
            ember::executor::Handlers::builtin(),
            move |c| {
                c.metrics = counted;
                c.data_dir = dir;
                // As on a host of its own: what it reads comes from the store.
                c.host_objects = ember::objects::host::HostSetting::Off;
                if let Some(bytes) = cache_bytes {
                    c.object_cache_bytes = bytes;
                }
            },
        )
        .await;
    (running, metrics, data_dir)
}

/// How many messages the store's stream holds.
async fn messages(cluster: &TestCluster) -> u64 {
    let jetstream = async_nats::jetstream::new(cluster.client().await);
    let name = format!("OBJ_{}", cluster.subjects.objects_bucket());
    let mut stream = jetstream
        .get_stream(name)
        .await
        .expect("the store's stream");
    stream.info().await.expect("stream info").state.messages
}

fn content(size: usize, seed: u8) -> Bytes {
    (0..size)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test]
async fn an_object_is_named_by_its_content_and_reads_back_whole() {
    let cluster = TestCluster::start_with_jetstream("objects-roundtrip");
    let (_driver, objects) = store_of(&cluster, 0).await;
    let bytes = content(3 * CHUNK_BYTES + 17, 1);

    let put = within(Duration::from_secs(20), objects.put_bytes(bytes.clone()))
        .await
        .expect("put");
    assert_eq!(put.object, ObjectRef::of(&bytes));
    assert_eq!(put.size, bytes.len() as u64);
    assert!(put.sent);

    let stat = objects
        .stat(&put.object)
        .await
        .expect("stat")
        .expect("stored");
    assert_eq!((stat.size, stat.chunks), (bytes.len() as u64, 4));
    assert!(stat.put_ms.is_some());
    let read = objects.get_bytes(&put.object).await.expect("get");
    assert_eq!(read, bytes.to_vec());

    let dir = tempdir("objects-roundtrip");
    let path = dir.join("copy.bin");
    let size = objects.fetch_to(&put.object, &path).await.expect("fetch");
    assert_eq!(size, bytes.len() as u64);
    assert_eq!(std::fs::read(&path).expect("fetched file"), bytes.to_vec());
    // Nothing but the object itself is left beside it.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("copy.bin")]);

    let listed = objects.list().await.expect("list");
    assert_eq!(
        listed.iter().map(|s| &s.object).collect::<Vec<_>>(),
        vec![&put.object]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_same_bytes_put_again_send_no_chunk_and_racing_puts_leave_one_object() {
    let cluster = TestCluster::start_with_jetstream("objects-once");
    let (_driver, objects) = store_of(&cluster, 0).await;
    let bytes = content(2 * CHUNK_BYTES, 2);
    let first = objects.put_bytes(bytes.clone()).await.expect("put");
    assert!(first.sent);
    // Two chunks and the metadata.
    assert_eq!(messages(&cluster).await, 3);

    let again = objects.put_bytes(bytes.clone()).await.expect("put again");
    assert_eq!(again.object, first.object);
    assert!(!again.sent, "the store held it: nothing is sent");
    assert_eq!(messages(&cluster).await, 3);

    // Ten writers of the same new bytes at once: one object, and only its chunks kept.
    let other = content(CHUNK_BYTES + 5, 3);
    let puts = (0..10).map(|_| objects.put_bytes(other.clone()));
    let puts = within(Duration::from_secs(30), futures::future::join_all(puts)).await;
    for put in &puts {
        assert_eq!(put.as_ref().expect("put").object, ObjectRef::of(&other));
    }
    assert!(puts.iter().any(|p| p.as_ref().unwrap().sent));
    assert_eq!(
        messages(&cluster).await,
        3 + 3,
        "one object's two chunks and metadata"
    );
    assert_eq!(
        objects.get_bytes(&ObjectRef::of(&other)).await.unwrap(),
        other.to_vec()
    );
}

#[tokio::test]
async fn a_full_store_refuses_a_put_with_its_limit_and_keeps_nothing_of_it() {
    let cluster = TestCluster::start_with_jetstream("objects-full");
    let (_driver, objects) = store_of(&cluster, 1 << 20).await;
    let small = objects
        .put_bytes(content(1000, 4))
        .await
        .expect("a small put fits");
    let before = messages(&cluster).await;

    let error = objects
        .put_bytes(content(2 << 20, 5))
        .await
        .expect_err("2 MiB do not fit in 1 MiB");
    assert!(
        matches!(error, ObjectsError::Full { limit: 1048576 }),
        "{error}"
    );
    assert!(error.to_string().contains("--objects-max-bytes"), "{error}");
    assert_eq!(
        messages(&cluster).await,
        before,
        "the refused put left no chunk"
    );
    // What was there still is.
    assert_eq!(objects.get_bytes(&small.object).await.unwrap().len(), 1000);
}

#[tokio::test]
async fn an_object_not_there_or_not_matching_its_name_is_refused() {
    let cluster = TestCluster::start_with_jetstream("objects-bad");
    let (_driver, objects) = store_of(&cluster, 0).await;
    let missing = ObjectRef::of(b"never put");
    assert_eq!(objects.stat(&missing).await.unwrap(), None);
    let error = objects.get_bytes(&missing).await.expect_err("not there");
    assert!(
        error.to_string().contains("not found: put it again"),
        "{error}"
    );

    // A writer that does not follow the rules: metadata named for one content, chunks of
    // another.
    let named = ObjectRef::of(b"what the name says");
    let store = async_nats::jetstream::new(cluster.client().await)
        .get_object_store(cluster.subjects.objects_bucket())
        .await
        .unwrap();
    let mut wrong: &[u8] = b"something else entirely";
    store
        .put(named.as_str(), &mut wrong)
        .await
        .expect("a raw put");
    let error = objects
        .get_bytes(&named)
        .await
        .expect_err("the bytes do not match");
    assert!(error.to_string().contains("do not match"), "{error}");
    let dir = tempdir("objects-bad");
    let path = dir.join("wrong");
    objects.fetch_to(&named, &path).await.expect_err("refused");
    assert!(!path.exists(), "a refused fetch leaves no file");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nor a part of one"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn without_a_driver_the_store_is_missing_and_says_what_makes_it() {
    let cluster = TestCluster::start_with_jetstream("objects-none");
    let api = cluster.api(cluster.client().await);
    let error = api.objects().await.err().expect("no store yet");
    assert!(
        error
            .to_string()
            .contains("a driver with a journal makes it"),
        "{error}"
    );
}

#[tokio::test]
async fn ember_put_prints_a_reference_that_ember_objects_reads() {
    let cluster = TestCluster::start_with_jetstream("objects-cli");
    let (_driver, objects) = store_of(&cluster, 0).await;
    let dir = tempdir("objects-cli");
    let (a, b) = (dir.join("a.bin"), dir.join("b.txt"));
    std::fs::write(&a, content(CHUNK_BYTES * 2 + 1, 6)).unwrap();
    std::fs::write(&b, "hello\n").unwrap();
    let printed = cluster
        .cli_stdout(&["put", a.to_str().unwrap(), b.to_str().unwrap()])
        .await;
    let lines: Vec<&str> = printed.lines().collect();
    let expected_a = ObjectRef::of(&std::fs::read(&a).unwrap());
    assert_eq!(
        lines,
        vec![expected_a.as_str(), ObjectRef::of(b"hello\n").as_str()]
    );
    assert!(objects.stat(&expected_a).await.unwrap().is_some());

    let stat = cluster
        .cli_stdout(&["objects", "stat", lines[1], "--json"])
        .await;
    let stat: serde_json::Value = serde_json::from_str(&stat).expect("json");
    assert_eq!(stat["size"], 6);
    let listed = cluster.cli_stdout(&["objects", "ls", "--json"]).await;
    let listed: serde_json::Value = serde_json::from_str(&listed).expect("json");
    assert_eq!(listed["objects"].as_array().unwrap().len(), 2);
    let out = dir.join("out.txt");
    cluster
        .cli_stdout(&["objects", "get", lines[1], out.to_str().unwrap()])
        .await;
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "hello\n");
    let stdout = cluster.cli_stdout(&["objects", "get", lines[1], "-"]).await;
    assert_eq!(stdout, "hello\n");
    // `ember status` says what the store holds.
    let status = cluster.cli_stdout(&["status", "--json"]).await;
    let status: serde_json::Value = serde_json::from_str(&status).expect("json");
    let stored = status["objects"]["bytes"]
        .as_u64()
        .expect("the store's bytes");
    assert!(stored > (CHUNK_BYTES * 2) as u64, "{status}");
    assert!(status["objects"]["max_bytes"].is_null(), "{status}");
    let screen = cluster.cli_stdout(&["status"]).await;
    assert!(
        screen.contains(&format!("objects    {stored} bytes stored, no limit")),
        "{screen}"
    );

    let missing = ObjectRef::of(b"no such thing");
    let output = cluster
        .cli(&["objects", "stat", missing.as_str()])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("not found"));
    let output = cluster
        .cli(&["objects", "stat", "not-a-ref"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("not an object reference"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ember-{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A job of commands, each reading `inputs` and keeping what `outputs` match.
fn command_job(
    tasks: u32,
    script: &str,
    inputs: &[(&str, &ObjectRef)],
    outputs: &[&str],
) -> ember::protocol::SubmitJob {
    let mut job = common::noops(tasks);
    job.tasks = vec![ember::protocol::TaskSpec::Command {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        env: Default::default(),
        cwd: None,
        timeout_ms: Some(30_000),
        inputs: inputs
            .iter()
            .map(|(name, object)| (name.to_string(), (*object).clone()))
            .collect(),
        outputs: outputs.iter().map(|p| p.to_string()).collect(),
    }];
    job
}

/// Reads an executor's metric from its metrics text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

#[tokio::test]
async fn commands_read_their_inputs_fetched_once_and_their_outputs_come_back_as_objects() {
    use ember::protocol::{JobState, TaskState};
    let cluster = TestCluster::start_with_jetstream("objects-commands");
    let (_driver, objects) = store_of(&cluster, 0).await;
    let (_executor, metrics, data_dir) = executor(&cluster, "objects-commands", 4, None).await;
    let api = cluster.api(cluster.client().await);
    let data = content(CHUNK_BYTES * 3, 7);
    let data_ref = objects.put_bytes(data.clone()).await.unwrap().object;
    let table = objects
        .put_bytes(Bytes::from_static(b"a,b\n1,2\n"))
        .await
        .unwrap()
        .object;

    let script = "set -e; test ! -w data.bin || [ $(id -u) = 0 ]; mkdir -p out; \
                  cat data.bin conf/table.csv > out/r-$EMBER_TASK_INDEX.bin; echo skip > other.txt";
    let job = command_job(
        8,
        script,
        &[("data.bin", &data_ref), ("conf/table.csv", &table)],
        &["out/*.bin"],
    );
    let summary = within(Duration::from_secs(60), api.run_job(job, |_| {}))
        .await
        .expect("the job runs");
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let mut expected = data.to_vec();
    expected.extend_from_slice(b"a,b\n1,2\n");
    let expected = ObjectRef::of(&expected);
    for outcome in api.results(summary.job_id).await.unwrap() {
        assert_eq!(outcome.state, TaskState::Finished);
        let outputs = &outcome.result.as_ref().expect("a result")["outputs"];
        let name = format!("out/r-{}.bin", outcome.index);
        assert_eq!(outputs.as_object().unwrap().len(), 1, "{outputs}");
        assert_eq!(outputs[&name], expected.as_str(), "{outputs}");
    }
    assert!(objects.stat(&expected).await.unwrap().is_some());
    // Eight tasks read two objects: each fetched once.
    let text = ember::metrics::Scrape::encode(metrics.as_ref());
    assert_eq!(
        metric(&text, "ember_executor_object_fetches_total"),
        2.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "ember_executor_object_fetched_bytes_total"),
        (data.len() + 8) as f64
    );
    assert_eq!(
        metric(&text, "ember_executor_object_cache_misses_total"),
        2.0
    );
    assert_eq!(
        metric(&text, "ember_executor_object_cache_hits_total"),
        14.0
    );
    // Eight outputs put, of the same bytes: sent by the puts that found the store without
    // them (racing puts may both send), not by the others.
    assert_eq!(metric(&text, "ember_executor_object_puts_total"), 8.0);
    let sent = metric(&text, "ember_executor_object_put_bytes_total") as usize;
    let size = data.len() + 8;
    assert!(
        sent >= size && sent % size == 0 && sent < 8 * size,
        "{sent}"
    );
    // The executor's heartbeats tell the driver the same, and `ember status` shows it.
    let status = common::eventually(Duration::from_secs(20), "the counts heard", || async {
        let out = cluster.cli_stdout(&["status", "--json"]).await;
        let status: serde_json::Value = serde_json::from_str(&out).ok()?;
        (status["executor_objects"]["puts"] == 8).then_some(status)
    })
    .await;
    let heard = &status["executor_objects"];
    assert_eq!(
        (
            &heard["fetches"],
            &heard["cache_hits"],
            &heard["cache_misses"]
        ),
        (
            &serde_json::json!(2),
            &serde_json::json!(14),
            &serde_json::json!(2)
        ),
        "{status}"
    );
    let screen = cluster.cli_stdout(&["status"]).await;
    assert!(screen.contains("executors fetched 2 ("), "{screen}");
    // The tasks' directories are gone; the cache stays.
    let tasks = std::fs::read_dir(data_dir.join("tasks")).unwrap().count();
    assert_eq!(tasks, 0);
    assert!(data_dir.join("objects").join(data_ref.as_str()).exists());
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// Runs `job`, which must succeed within a minute.
async fn succeeds(api: &ember::client::EmberClient, job: ember::protocol::SubmitJob) {
    let summary = within(Duration::from_secs(60), api.run_job(job, |_| {}))
        .await
        .expect("the job runs");
    assert_eq!(
        summary.state,
        ember::protocol::JobState::Succeeded,
        "{summary:?}"
    );
}

#[tokio::test]
async fn executors_on_the_host_of_a_put_take_the_object_from_it_and_others_fetch_it() {
    use ember::objects::host::HostSetting;
    let cluster = TestCluster::start_with_jetstream("objects-host");
    let (_driver, objects) = store_of(&cluster, 0).await;
    let shared = tempdir("objects-host-shared");
    let objects = objects.with_host(&HostSetting::Dir(shared.clone()), &cluster.subjects);
    let api = cluster.api(cluster.client().await);
    let data = content(CHUNK_BYTES * 2 + 5, 21);
    let put = objects.put_bytes(data.clone()).await.unwrap();
    assert!(put.sent, "the store did not have it: it went there too");
    let left = std::fs::read(shared.join(put.object.as_str())).expect("left on the host");
    assert_eq!(left, data.to_vec());
    let file = shared.with_extension("file");
    std::fs::write(&file, b"a file put").unwrap();
    let from_file = objects.put_file(&file).await.unwrap().object;
    let left = std::fs::read(shared.join(from_file.as_str())).expect("a file's copy left");
    assert_eq!(left, b"a file put");
    let _ = std::fs::remove_file(&file);
    // Tasks that check the bytes they read.
    let script = format!(
        "test \"$(sha256sum < in.bin | cut -c1-64)\" = {}",
        put.object
    );
    let job = || command_job(6, &script, &[("in.bin", &put.object)], &[]);

    // An executor on a host of its own fetches the object from the store.
    let (far, far_metrics, far_dir) = executor(&cluster, "objects-host-far", 2, None).await;
    succeeds(&api, job()).await;
    let text = ember::metrics::Scrape::encode(far_metrics.as_ref());
    assert_eq!(metric(&text, "ember_executor_object_fetches_total"), 1.0);
    assert_eq!(metric(&text, "ember_executor_object_host_takes_total"), 0.0);
    far.stop().await.expect("stops");

    // Two on the client's host take it from there, and fetch nothing.
    let mut near = Vec::new();
    for id in ["near-1", "near-2"] {
        let metrics = std::sync::Arc::new(ember::metrics::ExecutorMetrics::new());
        let (counted, dir, host) = (
            metrics.clone(),
            tempdir(&format!("objects-host-{id}")),
            HostSetting::Dir(shared.clone()),
        );
        let running = cluster
            .executor_configured(id, 1, ember::executor::Handlers::builtin(), move |c| {
                c.metrics = counted;
                c.data_dir = dir;
                c.host_objects = host;
            })
            .await;
        near.push((running, metrics));
    }
    succeeds(&api, job()).await;
    let mut took = 0.0;
    for (_, metrics) in &near {
        let text = ember::metrics::Scrape::encode(metrics.as_ref());
        let misses = metric(&text, "ember_executor_object_cache_misses_total");
        let taken = metric(&text, "ember_executor_object_host_takes_total");
        assert_eq!(
            metric(&text, "ember_executor_object_fetches_total"),
            0.0,
            "{text}"
        );
        assert_eq!(taken, misses, "each object it lacked it took: {text}");
        took += taken;
    }
    assert!(took >= 1.0, "the executors ran the tasks");
    for dir in [shared, far_dir] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[tokio::test]
async fn a_submission_naming_a_missing_object_or_a_path_outside_is_refused() {
    let cluster = TestCluster::start_with_jetstream("objects-refused");
    let (_driver, objects) = store_of(&cluster, 0).await;
    let api = cluster.api(cluster.client().await);
    let there = objects
        .put_bytes(Bytes::from_static(b"here"))
        .await
        .unwrap()
        .object;
    let missing = ObjectRef::of(b"not here");
    let job = command_job(1, "true", &[("a", &there), ("b", &missing)], &[]);
    let error = api.submit(job).await.expect_err("refused");
    assert!(
        error
            .to_string()
            .contains(&format!("object {missing} not found: put it again")),
        "{error}"
    );
    for (inputs, outputs) in [
        (vec![("../x", &there)], vec![]),
        (vec![("/etc/x", &there)], vec![]),
        (vec![], vec!["../*.json"]),
        (vec![("a//b", &there)], vec![]),
    ] {
        let error = api
            .submit(command_job(1, "true", &inputs, &outputs))
            .await
            .expect_err("refused");
        let text = error.to_string();
        assert!(
            text.contains("escapes the task's directory") || text.contains("not a path inside"),
            "{text}"
        );
    }
    assert!(
        api.jobs().await.unwrap().is_empty(),
        "nothing was submitted"
    );

    let output = cluster
        .cli(&["submit", "--input", "../x=/etc/hostname", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("escapes the task's directory"));
}

#[tokio::test]
async fn ember_submit_puts_an_input_file_and_keeps_the_outputs() {
    let cluster = TestCluster::start_with_jetstream("objects-submit");
    let (_driver, objects) = store_of(&cluster, 0).await;
    let _executor = cluster
        .executor_configured("exec-1", 2, ember::executor::Handlers::builtin(), |c| {
            c.data_dir = tempdir("objects-submit-exec");
        })
        .await;
    let dir = tempdir("objects-submit");
    let input = dir.join("words.txt");
    std::fs::write(&input, "b\na\nc\n").unwrap();
    let out = cluster
        .cli_stdout(&[
            "submit",
            "--tasks",
            "2",
            "--json",
            "--results",
            "--input",
            &format!("words.txt={}", input.display()),
            "--output",
            "sorted.txt",
            "--",
            "sh",
            "-c",
            "sort words.txt > sorted.txt",
        ])
        .await;
    let sorted = ObjectRef::of(b"a\nb\nc\n");
    let results: Vec<serde_json::Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &serde_json::Value| v.get("index").is_some())
        .collect();
    assert_eq!(results.len(), 2, "{out}");
    for result in results {
        assert_eq!(
            result["result"]["outputs"]["sorted.txt"],
            sorted.as_str(),
            "{out}"
        );
    }
    assert_eq!(objects.get_bytes(&sorted).await.unwrap(), b"a\nb\nc\n");
    // `ember results --output-dir` writes each outcome and each output as files.
    let job_id = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| {
            v.get("job_id")?
                .as_u64()
                .filter(|_| v.get("state").is_some())
        })
        .expect("the summary line");
    let written = dir.join("results");
    cluster
        .cli_stdout(&[
            "results",
            &job_id.to_string(),
            "--output-dir",
            &written.display().to_string(),
        ])
        .await;
    for index in 0..2 {
        let outcome: serde_json::Value =
            serde_json::from_slice(&std::fs::read(written.join(format!("{index}.json"))).unwrap())
                .unwrap();
        assert_eq!(outcome["state"], "FINISHED");
        let output = std::fs::read(written.join(index.to_string()).join("sorted.txt")).unwrap();
        assert_eq!(output, b"a\nb\nc\n");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_full_cache_lets_the_least_recently_used_object_go_and_fetches_it_again() {
    use ember::protocol::JobState;
    let cluster = TestCluster::start_with_jetstream("objects-evict");
    let (_driver, objects) = store_of(&cluster, 0).await;
    // Room for one of the two objects, not both.
    let (_executor, metrics, data_dir) =
        executor(&cluster, "objects-evict", 1, Some(1 << 20)).await;
    let api = cluster.api(cluster.client().await);
    let a = objects.put_bytes(content(700_000, 8)).await.unwrap().object;
    let b = objects.put_bytes(content(700_000, 9)).await.unwrap().object;
    // a, b, then a again: b's fetch lets a go (no task holds it then), so a is fetched twice.
    for object in [&a, &b, &a] {
        let job = command_job(1, "test -s in.bin", &[("in.bin", object)], &[]);
        let summary = within(Duration::from_secs(60), api.run_job(job, |_| {}))
            .await
            .expect("the job runs");
        assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    }
    let text = ember::metrics::Scrape::encode(metrics.as_ref());
    assert_eq!(
        metric(&text, "ember_executor_object_fetches_total"),
        3.0,
        "{text}"
    );
    let cached: Vec<_> = std::fs::read_dir(data_dir.join("objects"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        cached,
        vec![a.to_string()],
        "only the last object read is kept"
    );
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test]
async fn objects_outlive_a_driver_restart_and_the_next_driver_runs_jobs_that_name_them() {
    use ember::protocol::JobState;
    let cluster = TestCluster::start_with_jetstream("objects-restart");
    let (driver, objects) = store_of(&cluster, 0).await;
    let data = content(CHUNK_BYTES + 9, 10);
    let put = objects.put_bytes(data.clone()).await.unwrap();
    driver.stop().await.expect("the driver stops cleanly");

    // A new driver finds the store as it was, and takes jobs that name its objects.
    let (_driver, objects) = store_of(&cluster, 0).await;
    assert_eq!(objects.get_bytes(&put.object).await.unwrap(), data.to_vec());
    let again = objects.put_bytes(data.clone()).await.unwrap();
    assert!(
        !again.sent,
        "the restart kept the object: nothing is sent again"
    );
    let _executor = cluster
        .executor_configured("exec-1", 2, ember::executor::Handlers::builtin(), |c| {
            c.data_dir = tempdir("objects-restart-exec");
        })
        .await;
    let api = cluster.api(cluster.client().await);
    let job = command_job(2, "test -s in.bin", &[("in.bin", &put.object)], &[]);
    let summary = within(Duration::from_secs(60), api.run_job(job, |_| {}))
        .await
        .expect("the job runs");
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
}

#[tokio::test]
async fn a_task_whose_input_does_not_match_its_name_fails_saying_so() {
    use ember::protocol::{JobState, TaskState};
    let cluster = TestCluster::start_with_jetstream("objects-spoiled");
    let (_driver, _objects) = store_of(&cluster, 0).await;
    let (_executor, metrics, data_dir) = executor(&cluster, "objects-spoiled", 1, None).await;
    // A writer that broke the rules: metadata named for one content, chunks of another.
    let named = ObjectRef::of(b"what the name says");
    let store = async_nats::jetstream::new(cluster.client().await)
        .get_object_store(cluster.subjects.objects_bucket())
        .await
        .unwrap();
    let mut wrong: &[u8] = b"something else entirely";
    store
        .put(named.as_str(), &mut wrong)
        .await
        .expect("a raw put");
    let api = cluster.api(cluster.client().await);
    let mut job = command_job(1, "cat in.bin", &[("in.bin", &named)], &[]);
    job.max_failures = 2;
    let summary = within(Duration::from_secs(60), api.run_job(job, |_| {}))
        .await
        .expect("the job ends");
    assert_eq!(summary.state, JobState::Failed, "{summary:?}");
    let outcome = &api.results(summary.job_id).await.unwrap()[0];
    assert_eq!(outcome.state, TaskState::Failed);
    let error = outcome.error.as_deref().unwrap_or_default();
    assert!(
        error.contains(&format!("could not fetch object {named}")),
        "{error}"
    );
    assert!(error.contains("do not match its name"), "{error}");
    // Each attempt tried the store again: a failed fetch is not kept.
    let text = ember::metrics::Scrape::encode(metrics.as_ref());
    assert_eq!(
        metric(&text, "ember_executor_object_cache_misses_total"),
        2.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "ember_executor_object_fetches_total"),
        0.0,
        "{text}"
    );
    let cached = std::fs::read_dir(data_dir.join("objects")).unwrap().count();
    assert_eq!(cached, 0, "nothing of the spoiled object is kept");
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// A driver that keeps one finished job and sweeps objects unused for a second, and its store.
async fn sweeping_store(
    cluster: &TestCluster,
) -> (
    common::Running<Result<(), ember::driver::DriverError>>,
    Objects,
) {
    store_with(cluster, |config| {
        config.objects_max_age = Duration::from_secs(1);
        config.retention.jobs = 1;
    })
    .await
}

/// The kept jobs that use `object`, as the driver says.
async fn users(api: &ember::client::EmberClient, object: &ObjectRef) -> Vec<u64> {
    let asked = ember::protocol::ApiRequest::ObjectUses {
        objects: vec![object.clone()],
    };
    match api.call(&asked).await.expect("ObjectUses") {
        ember::protocol::ApiReply::ObjectUses { uses } => uses[0].jobs.clone(),
        other => panic!("unexpected {other:?}"),
    }
}

/// Runs a command that copies `input` to an output (one more line at its end), and returns
/// the job's summary and the output's reference.
async fn copy_job(
    api: &ember::client::EmberClient,
    input: &ObjectRef,
) -> (ember::protocol::JobSummary, ObjectRef) {
    let job = command_job(
        1,
        "cp in.bin out.bin && echo x >> out.bin",
        &[("in.bin", input)],
        &["out.bin"],
    );
    let first = within(Duration::from_secs(60), api.run_job(job, |_| {}))
        .await
        .expect("the job runs");
    assert_eq!(
        first.state,
        ember::protocol::JobState::Succeeded,
        "{first:?}"
    );
    let outcome = &api.results(first.job_id).await.unwrap()[0];
    let output = ObjectRef::parse(
        outcome.result.as_ref().unwrap()["outputs"]["out.bin"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    (first, output)
}

/// Waits until the store holds `object` no more.
async fn deleted(objects: &Objects, object: &ObjectRef) {
    common::eventually(Duration::from_secs(20), "the object's deletion", || async {
        objects.stat(object).await.unwrap().is_none().then_some(())
    })
    .await
}

#[tokio::test]
async fn objects_live_while_a_kept_job_uses_them_through_a_restart_and_go_after_max_age() {
    use ember::protocol::{ApiRequest, JobState};
    let cluster = TestCluster::start_with_jetstream("objects-retention");
    let (driver, objects) = sweeping_store(&cluster).await;
    let (_executor, _, data_dir) = executor(&cluster, "objects-retention", 2, None).await;
    let api = cluster.api(cluster.client().await);
    let input = objects.put_bytes(content(1000, 1)).await.unwrap().object;
    let unused = objects.put_bytes(content(1000, 2)).await.unwrap().object;

    let (first, output) = copy_job(&api, &input).await;
    assert_eq!(users(&api, &input).await, [first.job_id]);
    assert_eq!(
        users(&api, &output).await,
        [first.job_id],
        "an output is the job's too"
    );
    assert!(users(&api, &unused).await.is_empty());

    // What no kept job uses goes once it is a second old; what job 1 uses stays, and may not
    // be deleted by hand either.
    deleted(&objects, &unused).await;
    let refused = api
        .call(&ApiRequest::DeleteObject {
            object: input.clone(),
        })
        .await
        .expect_err("the input is in use");
    assert!(
        refused
            .to_string()
            .contains(&format!("used by kept job {}", first.job_id)),
        "{refused}"
    );

    // A new driver knows what job 1 uses from the journal, outputs included.
    driver.stop().await.expect("the driver stops cleanly");
    let (_driver, objects) = sweeping_store(&cluster).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    for object in [&input, &output] {
        assert!(
            objects.stat(object).await.unwrap().is_some(),
            "{object} was deleted"
        );
    }
    let api = cluster.api(cluster.client().await);
    assert_eq!(users(&api, &output).await, [first.job_id]);

    // Job 1 is forgotten once job 2 ends (one finished job is kept): its objects go too.
    let second = within(
        Duration::from_secs(60),
        api.run_job(common::noops(1), |_| {}),
    )
    .await
    .expect("the second job runs");
    assert_eq!(second.state, JobState::Succeeded);
    deleted(&objects, &input).await;
    deleted(&objects, &output).await;
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test]
async fn a_put_that_died_leaves_nothing_after_the_sweeps_and_rm_deletes_an_unused_object() {
    use ember::protocol::{ApiReply, ApiRequest};
    let cluster = TestCluster::start_with_jetstream("objects-sweep");
    let (_driver, objects) = sweeping_store(&cluster).await;
    let api = cluster.api(cluster.client().await);
    // What a put killed half-way leaves: chunks under a subject no metadata names.
    let jetstream = async_nats::jetstream::new(cluster.client().await);
    let subject = format!("$O.{}.C.deadbeef", cluster.subjects.objects_bucket());
    for chunk in 0..3u8 {
        let ack = jetstream
            .publish(subject.clone(), content(CHUNK_BYTES, chunk))
            .await
            .unwrap();
        ack.await.expect("the chunk is stored");
    }
    assert_eq!(messages(&cluster).await, 3);
    common::eventually(
        Duration::from_secs(20),
        "the dead put's chunks purged",
        || async { (messages(&cluster).await == 0).then_some(()) },
    )
    .await;

    // `DeleteObject` deletes an object no kept job uses, and says whether it was there.
    let object = objects.put_bytes(content(100, 3)).await.unwrap().object;
    let delete = ApiRequest::DeleteObject {
        object: object.clone(),
    };
    let answer = api.call(&delete).await.expect("deleted");
    assert_eq!(
        answer,
        ApiReply::ObjectDeleted {
            object: object.clone(),
            deleted: true
        }
    );
    assert!(objects.stat(&object).await.unwrap().is_none());
    let again = api.call(&delete).await.expect("answered");
    assert_eq!(
        again,
        ApiReply::ObjectDeleted {
            object,
            deleted: false
        }
    );
}

#[tokio::test]
async fn a_standby_that_takes_over_keeps_what_the_jobs_use_and_sweeps_the_rest() {
    use ember::protocol::JobState;
    let cluster = TestCluster::start_with_jetstream("objects-failover");
    let flags = [
        "--journal",
        "on",
        "--lease",
        "1s",
        "--objects-max-age",
        "1s",
        "--retain-jobs",
        "1",
    ];
    let mut drivers = vec![
        cluster.driver_process(&flags).spawn().unwrap(),
        cluster.driver_process(&flags).spawn().unwrap(),
    ];
    let (_executor, _, data_dir) = executor(&cluster, "objects-failover", 2, None).await;
    let api = cluster.api(cluster.client().await);
    let objects = common::eventually(Duration::from_secs(20), "the object store", || async {
        api.objects().await.ok()
    })
    .await;
    // One of the drivers leads once it has taken the lease and read the journal.
    common::eventually(Duration::from_secs(20), "a leading driver", || async {
        api.executors().await.ok()
    })
    .await;
    let input = objects.put_bytes(content(1000, 1)).await.unwrap().object;
    let (first, output) = copy_job(&api, &input).await;

    // The leader dies; the standby leads, and knows from the journal what job 1 uses.
    let leader = cluster
        .leader_among(&[&drivers[0], &drivers[1]], None)
        .await;
    let mut dead = drivers.remove(leader);
    let dead_pid = dead.id();
    dead.kill().await.expect("SIGKILL the leader");
    cluster.leader_among(&[&drivers[0]], dead_pid).await;
    let unused = objects.put_bytes(content(1000, 2)).await.unwrap().object;
    deleted(&objects, &unused).await;
    for object in [&input, &output] {
        assert!(
            objects.stat(object).await.unwrap().is_some(),
            "{object} was deleted after the failover"
        );
    }
    assert_eq!(users(&api, &output).await, [first.job_id]);

    // The new leader runs a job that reads the same input, and once it ends job 1 is
    // forgotten: the output only job 1 had goes, and the input, used by job 2, stays.
    let again = command_job(1, "cmp -n 1000 in.bin in.bin", &[("in.bin", &input)], &[]);
    let second = within(Duration::from_secs(60), api.run_job(again, |_| {}))
        .await
        .expect("the second job runs");
    assert_eq!(second.state, JobState::Succeeded, "{second:?}");
    deleted(&objects, &output).await;
    assert_eq!(users(&api, &input).await, [second.job_id]);
    assert!(objects.stat(&input).await.unwrap().is_some());
    let _ = std::fs::remove_dir_all(&data_dir);
}
