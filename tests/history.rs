//! The event history on a real nats-server: `ember events` reads a job's whole history after
//! it ended, follows through a nats-server restart with every task end once, filters by job,
//! and refuses a `--since` it cannot read; a driver killed mid-job, or with events the stream
//! had refused, leaves each job start, task end and job end in the history once.

mod common;

use common::{eventually, sleepers, within, TestCluster};
use ember::protocol::{decode, Event, JobState, TaskState};
use ember::server::NatsServer;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

const LIMIT: Duration = Duration::from_secs(60);

/// Runs a job of `tasks` sleepers to its end and returns its id, once the driver answers (a
/// journaled driver takes its lease and reads its journal before it serves the api, and a
/// submission that finds no driver is refused).
async fn run_job(api: &ember::client::EmberClient, tasks: u32) -> u64 {
    eventually(LIMIT, "the driver's answer", || async {
        api.jobs().await.ok()
    })
    .await;
    let job_id = api.submit(sleepers(tasks, 5)).await.unwrap();
    let summary = eventually(LIMIT, "the job's end", || async {
        let s = api.job(job_id).await.ok()?;
        (s.state != JobState::Running).then_some(s)
    })
    .await;
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    job_id
}

/// The events `ember events <args> --json` prints before it exits by itself.
async fn cli_events(cluster: &TestCluster, args: &[&str]) -> Vec<Event> {
    let output = within(LIMIT, cluster.cli(args).arg("--json").output())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{args:?}: {stderr}");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| decode::<Event>(line.as_bytes(), usize::MAX).expect("an event per line"))
        .collect()
}

/// The whole history once it holds `job_id`'s end, read again a quarter second apart.
async fn history_through_end(cluster: &TestCluster, job_id: u64) -> Vec<Event> {
    eventually(LIMIT, "the job's end in the history", || async {
        let events = cli_events(cluster, &["events", "--from-start"]).await;
        let stored = events
            .iter()
            .any(|e| matches!(e, Event::JobEnd { job_id: j, .. } if *j == job_id));
        if !stored {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        stored.then_some(events)
    })
    .await
}

/// How many times each (task index, attempt) of `job_id` ended, and how many of its indices
/// finished.
fn task_ends(events: &[Event], job_id: u64) -> (BTreeMap<(u32, u32), usize>, usize) {
    let mut ends = BTreeMap::new();
    let mut finished = 0;
    for event in events.iter().filter(|e| e.job_id() == Some(job_id)) {
        for (_, end) in event.ended() {
            *ends.entry((end.index, end.attempt)).or_insert(0) += 1;
            finished += usize::from(end.state == TaskState::Finished);
        }
    }
    (ends, finished)
}

#[tokio::test]
async fn a_listener_started_after_a_job_ended_gets_its_whole_history() {
    let cluster = TestCluster::start_with_jetstream("history-late");
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("e1", 4, Default::default()).await;
    let api = cluster.api(cluster.client().await);
    let job_id = run_job(&api, 40).await;

    let events = cli_events(&cluster, &["events", "--from-start"]).await;
    let kinds: Vec<&str> = events.iter().map(Event::kind).collect();
    assert_eq!(kinds.first(), Some(&"executor.added"), "{kinds:?}");
    assert_eq!(
        kinds.iter().filter(|k| **k == "job.start").count(),
        1,
        "{kinds:?}"
    );
    assert!(
        matches!(events.last(), Some(Event::JobEnd { job_id: j, state: JobState::Succeeded, .. }) if *j == job_id),
        "{kinds:?}"
    );
    let (ends, finished) = task_ends(&events, job_id);
    assert_eq!(finished, 40);
    assert_eq!(ends.len(), 40);
    assert!(ends.values().all(|&n| n == 1), "{ends:?}");
    // Ten minutes back reaches the start too.
    let since = cli_events(&cluster, &["events", "--since", "10m"]).await;
    assert_eq!(since, events);
    // Each read deleted its consumer as it ended, rather than leaving it on the server (one of
    // the stream's 1,000) until it had been idle for 30 s.
    let consumers = history_consumers(&cluster).await;
    assert_eq!(consumers, 0, "consumers left by two finished reads");
}

/// `ember events --from-start --follow --json`, running, with its output's lines.
fn follow_from_start(cluster: &TestCluster) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut listener = cluster
        .cli(&["events", "--from-start", "--follow", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(listener.stdout.take().unwrap()).lines();
    (listener, lines)
}

/// How many consumers the cluster's events stream has.
async fn history_consumers(cluster: &TestCluster) -> usize {
    let client = cluster.client().await;
    let mut stream = async_nats::jetstream::new(client)
        .get_stream(cluster.subjects.events_stream())
        .await
        .unwrap();
    stream.info().await.unwrap().state.consumer_count
}

#[tokio::test]
async fn a_follower_whose_terminal_hangs_up_deletes_its_consumer() {
    let cluster = TestCluster::start_with_jetstream("history-hangup");
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("e1", 2, Default::default()).await;
    let api = cluster.api(cluster.client().await);
    run_job(&api, 4).await;
    let (mut listener, mut lines) = follow_from_start(&cluster);
    let first = within(LIMIT, lines.next_line()).await.unwrap();
    assert!(first.is_some(), "the follower printed no event");
    assert_eq!(
        history_consumers(&cluster).await,
        1,
        "the follower's consumer"
    );

    // What closing its terminal sends it.
    let pid = nix::unistd::Pid::from_raw(listener.id().expect("running") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let status = within(LIMIT, listener.wait()).await.unwrap();
    assert!(
        status.success(),
        "a hangup stops it as Ctrl-C does: {status}"
    );
    assert_eq!(
        history_consumers(&cluster).await,
        0,
        "the consumer a hung-up follower left"
    );
}

#[tokio::test]
async fn events_of_one_job_only_with_job() {
    let cluster = TestCluster::start_with_jetstream("history-job");
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("e1", 4, Default::default()).await;
    let api = cluster.api(cluster.client().await);
    let first = run_job(&api, 8).await;
    let second = run_job(&api, 12).await;

    for (job_id, tasks) in [(first, 8), (second, 12)] {
        let id = job_id.to_string();
        let events = cli_events(&cluster, &["events", "--from-start", "--job", &id]).await;
        assert!(
            events.iter().all(|e| e.job_id() == Some(job_id)),
            "{events:?}"
        );
        assert_eq!(events.first().map(Event::kind), Some("job.start"));
        assert_eq!(events.last().map(Event::kind), Some("job.end"));
        assert_eq!(task_ends(&events, job_id).1, tasks);
    }
    let none = cli_events(&cluster, &["events", "--from-start", "--job", "999"]).await;
    assert!(none.is_empty(), "{none:?}");
}

#[tokio::test]
async fn since_takes_a_duration_or_a_time_and_refuses_garbage() {
    let cluster = TestCluster::start_with_jetstream("history-since");
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("e1", 2, Default::default()).await;
    let api = cluster.api(cluster.client().await);
    eventually(LIMIT, "the executor registered", || async {
        (api.executors().await.ok()?.registered_executors == 1).then_some(())
    })
    .await;
    // The time is cut to the second: a second later, it falls after the registration.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let before = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let job_id = run_job(&api, 4).await;

    // From a time before the job: the job, but not the executor that came before it.
    let events = cli_events(&cluster, &["events", "--since", &before]).await;
    assert_eq!(
        events.first().map(Event::kind),
        Some("job.start"),
        "{events:?}"
    );
    assert_eq!(task_ends(&events, job_id).1, 4);
    // From a time to come: nothing, and it exits.
    let later =
        humantime::format_rfc3339_seconds(std::time::SystemTime::now() + Duration::from_secs(3600))
            .to_string();
    assert!(cli_events(&cluster, &["events", "--since", &later])
        .await
        .is_empty());
    for garbage in ["yesterday", "10 parsecs", "2026-13-45T00:00:00Z"] {
        let output = within(LIMIT, cluster.cli(&["events", "--since", garbage]).output())
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{garbage}: {stderr}");
        assert!(
            stderr.contains("neither a duration nor a time"),
            "{garbage}: {stderr}"
        );
    }
}

#[tokio::test]
async fn without_a_history_a_range_is_refused_and_live_events_still_flow() {
    let cluster = TestCluster::start("history-none");
    let _driver = cluster.driver().await;
    let output = within(LIMIT, cluster.cli(&["events", "--from-start"]).output())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("could not read the event history"),
        "{stderr}"
    );
    let mut live = cluster
        .cli(&["events", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(live.stdout.take().unwrap()).lines();
    // It subscribes once it has given up on the history: executors keep joining until then.
    let mut executors = Vec::new();
    let line = within(LIMIT, async {
        loop {
            let id = format!("e{}", executors.len());
            executors.push(cluster.executor(&id, 1, Default::default()).await);
            let next = tokio::time::timeout(Duration::from_millis(500), lines.next_line()).await;
            if let Ok(line) = next {
                return line.unwrap().expect("a line");
            }
        }
    })
    .await;
    let event = decode::<Event>(line.as_bytes(), usize::MAX).unwrap();
    assert!(matches!(event, Event::ExecutorAdded { .. }), "{event:?}");
    live.kill().await.unwrap();
}

#[tokio::test]
async fn a_listener_following_through_a_nats_server_restart_gets_every_task_end_once() {
    let store = std::env::temp_dir().join(format!("ember-history-{}", uuid::Uuid::new_v4()));
    let store_arg = store.display().to_string();
    let flags = ["-js", "-sd", store_arg.as_str()];
    let mut cluster = TestCluster::start("history-restart");
    let port = ember::server::free_port().unwrap();
    cluster.server = NatsServer::start_on(port, &flags).unwrap();
    let _driver = cluster.driver().await;
    let _executors = [
        cluster.executor("e1", 2, Default::default()).await,
        cluster.executor("e2", 2, Default::default()).await,
    ];
    let api = cluster.api(cluster.client().await);
    eventually(LIMIT, "executors registered", || async {
        (api.executors().await.ok()?.registered_executors == 2).then_some(())
    })
    .await;
    let (mut listener, mut lines) = follow_from_start(&cluster);
    let job_id = api.submit(sleepers(200, 20)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.server.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.server = NatsServer::start_on(port, &flags).unwrap();

    let mut events = Vec::new();
    within(Duration::from_secs(90), async {
        loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("the listener runs on");
            let event = decode::<Event>(line.as_bytes(), usize::MAX).unwrap();
            let ended = matches!(event, Event::JobEnd { job_id: j, .. } if j == job_id);
            events.push(event);
            if ended {
                return;
            }
        }
    })
    .await;
    listener.kill().await.unwrap();
    let (ends, finished) = task_ends(&events, job_id);
    assert!(
        ends.values().all(|&n| n == 1),
        "an attempt ended twice: {ends:?}"
    );
    assert_eq!(finished, 200, "every task's end, once");
    let _ = std::fs::remove_dir_all(&store);
}

#[tokio::test]
async fn events_a_killed_leader_had_not_stored_are_told_again_by_the_next() {
    let cluster = TestCluster::start_with_jetstream("history-told");
    let flags = ["--journal", "on"];
    let mut driver = cluster.driver_process(&flags).spawn().unwrap();
    let _executor = cluster.executor("e1", 2, Default::default()).await;
    let api = cluster.api(cluster.client().await);
    eventually(LIMIT, "the executor registered", || async {
        (api.executors().await.ok()?.registered_executors == 1).then_some(())
    })
    .await;
    // The events stream takes no more: the driver's history writes are refused (and tried
    // again) while its journal goes on, so the job's events reach live listeners and not the
    // history, as when the history's writes lag behind the journal's.
    let jetstream = async_nats::jetstream::new(cluster.client().await);
    let mut stream = jetstream
        .get_stream(cluster.subjects.events_stream())
        .await
        .unwrap();
    let info = stream.info().await.unwrap().clone();
    let mut full = info.config.clone();
    full.max_messages = info.state.messages as i64;
    full.discard = async_nats::jetstream::stream::DiscardPolicy::New;
    jetstream.update_stream(full).await.unwrap();
    let job_id = run_job(&api, 20).await;
    let held = cli_events(&cluster, &["events", "--from-start"]).await;
    assert!(
        held.iter().all(|e| e.job_id() != Some(job_id)),
        "the history took the job's events: {held:?}"
    );

    // SIGKILL: the events it held are gone with it. The stream is given back its limits (a
    // driver uses a stream that exists as it is, and would refuse one that refuses when full),
    // and the next driver tells the job's events again from the journal.
    driver.kill().await.unwrap();
    jetstream.update_stream(info.config).await.unwrap();
    let _next = cluster.driver_process(&flags).spawn().unwrap();
    let events = history_through_end(&cluster, job_id).await;
    let of_job: Vec<&str> = events
        .iter()
        .filter(|e| e.job_id() == Some(job_id))
        .map(Event::kind)
        .collect();
    assert_eq!(of_job.first(), Some(&"job.start"), "{of_job:?}");
    assert_eq!(of_job.last(), Some(&"job.end"), "{of_job:?}");
    assert_eq!(
        of_job.iter().filter(|k| **k != "task.end").count(),
        2,
        "one start and one end: {of_job:?}"
    );
    let (ends, finished) = task_ends(&events, job_id);
    assert_eq!(finished, 20, "every task's end: {ends:?}");
    assert!(ends.values().all(|&n| n == 1), "{ends:?}");
    let Some(Event::JobEnd {
        state, succeeded, ..
    }) = events.iter().rev().find(|e| e.job_id() == Some(job_id))
    else {
        unreachable!("found above");
    };
    assert_eq!((*state, *succeeded), (JobState::Succeeded, 20));
}

#[tokio::test]
async fn a_leader_killed_mid_job_leaves_every_task_end_in_the_history_once() {
    let cluster = TestCluster::start_with_jetstream("history-once");
    let flags = ["--journal", "on"];
    let mut driver = cluster.driver_process(&flags).spawn().unwrap();
    let _executor = cluster.executor("e1", 4, Default::default()).await;
    let api = cluster.api(cluster.client().await);
    eventually(LIMIT, "the executor registered", || async {
        (api.executors().await.ok()?.registered_executors == 1).then_some(())
    })
    .await;
    let job_id = api.submit(sleepers(200, 10)).await.unwrap();
    eventually(LIMIT, "some tasks done", || async {
        (api.job(job_id).await.ok()?.succeeded >= 40).then_some(())
    })
    .await;
    // Killed with task ends stored, some perhaps released and not stored, and more to come:
    // the next leader tells again only those the history lacks.
    driver.kill().await.unwrap();
    let _next = cluster.driver_process(&flags).spawn().unwrap();
    let events = history_through_end(&cluster, job_id).await;
    let kinds: Vec<&str> = events
        .iter()
        .filter(|e| e.job_id() == Some(job_id))
        .map(Event::kind)
        .filter(|k| *k != "task.start" && *k != "task.end")
        .collect();
    assert_eq!(kinds, ["job.start", "job.end"]);
    let mut finished = BTreeMap::new();
    for event in events.iter().filter(|e| e.job_id() == Some(job_id)) {
        for (_, end) in event.ended() {
            if end.state == TaskState::Finished {
                *finished.entry(end.index).or_insert(0) += 1;
            }
        }
    }
    assert_eq!(finished.len(), 200, "every task's end: {finished:?}");
    assert!(finished.values().all(|&n| n == 1), "{finished:?}");
}
