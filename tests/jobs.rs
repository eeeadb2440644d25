//! Running work over a real nats-server: offers, launches, status batches, retries, aborts,
//! kills, results, size limits and the `ember submit` command.

mod common;

use common::{eventually, sh, within, TestCluster};
use ember::client::EmberClient;
use ember::executor::Handlers;
use ember::protocol::{
    decode, encode, Event, JobState, StatusReply, StatusRequest, StatusUpdate, SubmitJob, TaskSpec,
    TaskState,
};
use ember::subjects::Subjects;
use futures::StreamExt;
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

fn handler(name: &str, arg: serde_json::Value) -> TaskSpec {
    TaskSpec::Handler {
        name: name.into(),
        arg,
    }
}

fn job(tasks: Vec<TaskSpec>, repeat: u32) -> SubmitJob {
    SubmitJob {
        name: "test".into(),
        repeat,
        max_failures: 4,
        ..SubmitJob::new(tasks)
    }
}

#[tokio::test]
async fn ten_thousand_noop_tasks_on_four_executors_finish_exactly_once() {
    let cluster = TestCluster::start("jobs-10k");
    // Starts and ends on one subscription, so they arrive in the order the driver sent them.
    let mut ends = cluster.listen(cluster.subjects.event("task.*")).await;
    let _driver = cluster.driver().await;
    let mut executors = Vec::new();
    for i in 0..4 {
        executors.push(
            cluster
                .executor(&format!("w{i}"), 4, Handlers::builtin())
                .await,
        );
    }
    let api = cluster.api(cluster.client().await);
    eventually(LIMIT, "4 executors", || async {
        (api.executors().await.ok()?.registered_executors == 4).then_some(())
    })
    .await;

    let summary = within(
        LIMIT,
        api.run_job(job(vec![handler("noop", json!(null))], 10_000), |_| {}),
    )
    .await
    .unwrap();
    assert_eq!(summary.state, JobState::Succeeded);
    assert_eq!(
        (summary.tasks, summary.succeeded, summary.failed),
        (10_000, 10_000, 0)
    );

    // Count the task.end events: every task ended FINISHED exactly once, heard of after its
    // start, on the executor it started on.
    let mut started: HashMap<(u64, u32), String> = HashMap::new();
    let mut finished: HashMap<u64, u32> = HashMap::new();
    let mut per_executor: HashMap<String, u32> = HashMap::new();
    within(LIMIT, async {
        while finished.len() < 10_000 {
            let message = ends.next().await.unwrap();
            let event: Event = decode(&message.payload, usize::MAX).expect("an event");
            for (executor, t) in event.started() {
                started.insert((t.task_id, t.attempt), executor.to_string());
            }
            for (executor, t) in event.ended() {
                assert_eq!(
                    started.get(&(t.task_id, t.attempt)),
                    Some(&executor.to_string()),
                    "task {} attempt {} ended before it was heard starting",
                    t.task_id,
                    t.attempt
                );
                assert_eq!(t.state, TaskState::Finished);
                *finished.entry(t.task_id).or_default() += 1;
                *per_executor.entry(executor.to_string()).or_default() += 1;
            }
        }
    })
    .await;
    let late = tokio::time::timeout(Duration::from_millis(300), ends.next()).await;
    assert!(late.is_err(), "no task ends twice: {late:?}");
    assert!(finished.values().all(|&n| n == 1));
    assert_eq!(
        per_executor.len(),
        4,
        "work spread over all executors: {per_executor:?}"
    );

    let results = api.results(summary.job_id).await.unwrap();
    assert_eq!(results.len(), 10_000);
    assert!(results
        .iter()
        .enumerate()
        .all(|(i, r)| r.index == i as u32 && r.state == TaskState::Finished && r.attempts == 1));
    let registry = api.executors().await.unwrap();
    assert!(
        registry
            .executors
            .iter()
            .all(|e| e.free_cores == e.total_cores),
        "all cores free again"
    );
}

#[tokio::test]
async fn a_shell_command_job_returns_each_tasks_stdout() {
    let cluster = TestCluster::start("jobs-shell");
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 2, Handlers::builtin()).await;
    let _b = cluster.executor("b", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let script = "echo \"task $EMBER_TASK_INDEX of job $EMBER_JOB_ID\"; echo oops >&2";
    let summary = within(LIMIT, api.run_job(job(vec![sh(script)], 6), |_| {}))
        .await
        .unwrap();
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let results = api.results(summary.job_id).await.unwrap();
    for (i, r) in results.iter().enumerate() {
        let result = r.result.as_ref().expect("a result");
        assert_eq!(result["exit_code"], 0);
        assert_eq!(
            result["stdout"],
            format!("task {i} of job {}\n", summary.job_id)
        );
        assert_eq!(result["stderr"], "oops\n");
    }
}

#[tokio::test]
async fn a_task_that_fails_twice_then_succeeds_finishes_after_three_attempts() {
    let cluster = TestCluster::start("jobs-retry");
    let mut ends = cluster.listen(cluster.subjects.event("task.end")).await;
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 1, Handlers::builtin()).await;
    let _b = cluster.executor("b", 1, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let script = "if [ \"$EMBER_TASK_ATTEMPT\" -lt 2 ]; then echo \"attempt $EMBER_TASK_ATTEMPT\" >&2; exit 3; fi; echo done";
    let summary = within(LIMIT, api.run_job(job(vec![sh(script)], 1), |_| {}))
        .await
        .unwrap();
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    let results = api.results(summary.job_id).await.unwrap();
    assert_eq!(results[0].attempts, 3);
    assert_eq!(results[0].state, TaskState::Finished);
    assert_eq!(results[0].result.as_ref().unwrap()["stdout"], "done\n");

    let mut attempts = Vec::new();
    while attempts.len() < 3 {
        let message = within(LIMIT, ends.next()).await.unwrap();
        if let Ok(event) = decode::<Event>(&message.payload, usize::MAX) {
            attempts.extend(
                event.ended().map(|(executor, t)| {
                    (t.attempt, t.state, executor.to_string(), t.error.clone())
                }),
            );
        }
    }
    assert_eq!(attempts[0].1, TaskState::Failed);
    assert!(
        attempts[0]
            .3
            .as_deref()
            .unwrap()
            .contains("exited with code 3: attempt 0"),
        "{attempts:?}"
    );
    assert_eq!(attempts[1].1, TaskState::Failed);
    assert_eq!(attempts[2].1, TaskState::Finished);
    assert_ne!(
        attempts[0].2, attempts[1].2,
        "a retry goes to the other executor: {attempts:?}"
    );
}

#[tokio::test]
async fn a_task_that_always_fails_aborts_its_job_and_the_others_are_killed() {
    let cluster = TestCluster::start("jobs-abort");
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 4, Handlers::builtin()).await;
    let _b = cluster.executor("b", 4, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let tasks = vec![
        handler("fail", json!({"message": "boom"})),
        handler("sleep", json!({"ms": 60_000})),
        sh("sleep 60"),
    ];
    let summary = within(LIMIT, api.run_job(job(tasks, 2), |_| {}))
        .await
        .unwrap();
    assert_eq!(summary.state, JobState::Failed);
    let reason = summary.reason.clone().unwrap();
    assert!(
        reason.contains("failed 4 times") && reason.contains("boom"),
        "{reason}"
    );
    // The first failing task to use up its attempts fails the job; the other is killed.
    assert_eq!(summary.failed, 1, "{summary:?}");

    // The sleepers get KillTask; they report KILLED and their cores come back.
    let registry = eventually(LIMIT, "cores freed", || async {
        let r = api.executors().await.ok()?;
        r.executors
            .iter()
            .all(|e| e.free_cores == e.total_cores)
            .then_some(r)
    })
    .await;
    assert_eq!(registry.total_cores, 8);
    let results = api.results(summary.job_id).await.unwrap();
    let failed: Vec<_> = results
        .iter()
        .filter(|r| r.state == TaskState::Failed)
        .collect();
    assert_eq!(failed.len(), 1, "{results:?}");
    assert_eq!((failed[0].index % 3, failed[0].attempts), (0, 4));
    assert!(failed[0].error.as_deref().unwrap().contains("boom"));
    for r in results.iter().filter(|r| r.index % 3 != 0) {
        assert_eq!(r.state, TaskState::Killed, "{r:?}");
    }
}

#[tokio::test]
async fn a_killed_job_stops_its_tasks() {
    let cluster = TestCluster::start("jobs-kill");
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let job_id = api.submit(job(vec![sh("sleep 60")], 5)).await.unwrap();
    eventually(LIMIT, "2 running", || async {
        (api.job(job_id).await.ok()?.running == 2).then_some(())
    })
    .await;
    let output = within(LIMIT, cluster.cli(&["kill", &job_id.to_string()]).output())
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary = eventually(LIMIT, "tasks killed", || async {
        let s = api.job(job_id).await.ok()?;
        (s.running == 0).then_some(s)
    })
    .await;
    assert_eq!(summary.state, JobState::Killed);
    assert_eq!(summary.killed, 5);
    assert_eq!(api.executors().await.unwrap().executors[0].free_cores, 2);
    // Sent again (as a client does when the answer is lost), the kill is answered the same.
    api.kill(job_id)
        .await
        .expect("a killed job answers a kill as the kill did");
    assert_eq!(api.job(job_id).await.unwrap(), summary, "nothing changed");
}

#[tokio::test]
async fn a_status_from_the_wrong_executor_is_refused() {
    let cluster = TestCluster::start("jobs-wrong");
    let mut starts = cluster.listen(cluster.subjects.event("task.start")).await;
    let _driver = cluster.driver().await;
    let _real = cluster.executor("real", 1, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    eventually(LIMIT, "real registered", || async {
        (api.executors().await.ok()?.registered_executors == 1).then_some(())
    })
    .await;
    // An intruder registers with no cores to spare, so nothing is launched on it.
    let _intruder = cluster.executor("intruder", 1, Handlers::builtin()).await;
    eventually(LIMIT, "intruder registered", || async {
        (api.executors().await.ok()?.registered_executors == 2).then_some(())
    })
    .await;
    let job_id = api
        .submit(job(vec![sh("sleep 2; echo real")], 1))
        .await
        .unwrap();
    let message = within(LIMIT, starts.next()).await.unwrap();
    let Ok(event @ Event::TaskStart { .. }) = decode(&message.payload, usize::MAX) else {
        panic!()
    };
    let (executor, started) = event.started().next().unwrap();
    let (owner, other) = if executor.as_str() == "real" {
        ("real", "intruder")
    } else {
        ("intruder", "real")
    };

    let forger = cluster.executor_client(other).await;
    let forged = StatusRequest::StatusUpdates {
        executor_id: other.parse_id(),
        updates: vec![StatusUpdate {
            task_id: started.task_id,
            attempt: started.attempt,
            state: TaskState::Finished,
            result: Some(json!("forged")),
            error: None,
            result_object: None,
            no_retry: false,
        }],
        driver_instance: None,
    };
    let subject = format!("{}.driver.status.{other}", cluster.subjects.prefix());
    let reply = within(LIMIT, forger.request(subject, encode(&forged)))
        .await
        .unwrap();
    match decode::<StatusReply>(&reply.payload, usize::MAX).unwrap() {
        StatusReply::StatusAck {
            accepted, refused, ..
        } => {
            assert_eq!(accepted, 0);
            assert_eq!(refused.len(), 1);
            assert!(
                refused[0]
                    .reason
                    .contains(&format!("was not launched on executor {other}")),
                "{refused:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let summary = within(LIMIT, async {
        loop {
            let s = api.job(job_id).await.unwrap();
            if s.state != JobState::Running {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(summary.state, JobState::Succeeded);
    let results = api.results(job_id).await.unwrap();
    assert_eq!(
        results[0].result.as_ref().unwrap()["stdout"],
        "real\n",
        "the forged result was ignored"
    );
    assert_eq!(results[0].executor_id.as_ref().unwrap().as_str(), owner);
}

trait ParseId {
    fn parse_id(&self) -> ember::ids::ExecutorId;
}

impl ParseId for &str {
    fn parse_id(&self) -> ember::ids::ExecutorId {
        ember::ids::ExecutorId::parse(*self).unwrap()
    }
}

#[tokio::test]
async fn oversized_submissions_and_results_are_refused_with_the_limit_named() {
    let dir = std::env::temp_dir().join(format!("ember-small-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("small.conf");
    std::fs::write(&conf, "max_payload: 65536\n").unwrap();
    let cluster = TestCluster::start_with("jobs-size", &["-c", conf.to_str().unwrap()]);
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 2, Handlers::builtin()).await;
    let client = cluster.client().await;
    let api = cluster.api(client.clone());

    let big = "x".repeat(70_000);
    let error = api
        .submit(job(vec![handler("echo", json!({"value": big}))], 1))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("over the server's limit of")
            && error.to_string().contains("max_payload"),
        "{error}"
    );

    let summary = within(
        LIMIT,
        api.run_job(
            job(vec![sh("head -c 200000 /dev/zero | tr '\\\\0' y")], 1),
            |_| {},
        ),
    )
    .await
    .unwrap();
    let results = api.results(summary.job_id).await.unwrap();
    let error = results[0].error.clone().unwrap_or_default();
    assert!(
        error.contains("over the limit of") && error.contains("max_payload"),
        "{results:?}"
    );
    // The connection is still fine.
    assert_eq!(api.executors().await.unwrap().registered_executors, 1);
    let _ = std::fs::remove_dir_all(dir);
}

/// Launches too big to ride on a status acknowledgement go to the executor's inbox instead:
/// none is lost (a lost one would end LOST when a heartbeat misses it, and run again).
#[tokio::test]
async fn launches_too_big_for_the_acknowledgement_go_to_the_inbox() {
    let dir = std::env::temp_dir().join(format!("ember-overflow-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("small.conf");
    std::fs::write(&conf, "max_payload: 65536\n").unwrap();
    let cluster = TestCluster::start_with("jobs-overflow", &["-c", conf.to_str().unwrap()]);
    let mut ends = cluster.listen(cluster.subjects.event("task.end")).await;
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 64, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);

    // About 2 KB per task description: a round refilling 64 cores needs about 130 KB, twice
    // what one message may carry.
    let padding = "x".repeat(2_000);
    let tasks = 640;
    let summary = within(
        LIMIT,
        api.run_job(job(vec![handler("noop", json!(padding))], tasks), |_| {}),
    )
    .await
    .unwrap();
    assert_eq!((summary.succeeded, summary.failed), (tasks, 0));

    let mut states: HashMap<u64, Vec<TaskState>> = HashMap::new();
    within(LIMIT, async {
        while states
            .values()
            .filter(|s| s.contains(&TaskState::Finished))
            .count()
            < tasks as usize
        {
            let message = ends.next().await.unwrap();
            let Ok(event @ Event::TaskEnd { .. }) = decode(&message.payload, usize::MAX) else {
                panic!("bad event")
            };
            for (_, end) in event.ended() {
                states.entry(end.task_id).or_default().push(end.state);
            }
        }
    })
    .await;
    for (task_id, ended) in &states {
        assert_eq!(ended, &[TaskState::Finished], "task {task_id}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn ember_submit_prints_one_json_summary_and_exits_by_the_outcome() {
    let cluster = TestCluster::start("jobs-cli");
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 2, Handlers::builtin()).await;
    let ok = within(
        LIMIT,
        cluster.cli(&["submit", "--tasks", "50", "--json"]).output(),
    )
    .await
    .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let stdout = String::from_utf8(ok.stdout).unwrap();
    let last: serde_json::Value =
        serde_json::from_str(stdout.trim_end().lines().last().unwrap()).unwrap();
    assert_eq!(last["state"], "SUCCEEDED");
    assert_eq!(
        (
            last["tasks"].as_u64(),
            last["succeeded"].as_u64(),
            last["failed"].as_u64()
        ),
        (Some(50), Some(50), Some(0))
    );
    assert!(last["job_id"].is_u64() && last["elapsed_ms"].is_u64());

    let failed = within(
        LIMIT,
        cluster
            .cli(&["submit", "--kind", "fail", "--max-failures", "2", "--json"])
            .output(),
    )
    .await
    .unwrap();
    assert_eq!(failed.status.code(), Some(1));
    let stdout = String::from_utf8(failed.stdout).unwrap();
    let last: serde_json::Value =
        serde_json::from_str(stdout.trim_end().lines().last().unwrap()).unwrap();
    assert_eq!(last["state"], "FAILED");

    let jobs = within(LIMIT, cluster.cli(&["jobs", "--json"]).output())
        .await
        .unwrap();
    let jobs: serde_json::Value = serde_json::from_slice(&jobs.stdout).unwrap();
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn handlers_registered_by_an_embedding_program_run() {
    let cluster = TestCluster::start("jobs-custom");
    let _driver = cluster.driver().await;
    let mut handlers = Handlers::builtin();
    handlers.register("square", |ctx, arg| {
        let n = arg["n"].as_i64().ok_or("needs {\"n\": <integer>}")?;
        Ok(json!({"index": ctx.index, "square": n * n}))
    });
    let _a = cluster.executor("a", 2, handlers).await;
    let api = cluster.api(cluster.client().await);
    let summary = within(
        LIMIT,
        api.run_job(
            job(
                vec![
                    handler("square", json!({"n": 12})),
                    handler("square", json!({})),
                ],
                1,
            ),
            |_| {},
        ),
    )
    .await
    .unwrap();
    let results = api.results(summary.job_id).await.unwrap();
    assert_eq!(results[0].result, Some(json!({"index": 0, "square": 144})));
    assert_eq!(results[1].state, TaskState::Failed);
    assert!(results[1].error.as_deref().unwrap().contains("needs"));
    let unknown = within(
        LIMIT,
        api.run_job(
            SubmitJob {
                speculation: None,
                max_failures: 1,
                ..job(vec![handler("nope", json!(null))], 1)
            },
            |_| {},
        ),
    )
    .await
    .unwrap();
    assert_eq!(unknown.state, JobState::Failed);
    assert!(unknown
        .reason
        .unwrap()
        .contains("no handler named \"nope\""));
}

#[tokio::test]
async fn a_restarted_driver_restores_ended_jobs_goes_on_with_ids_and_skips_a_corrupt_record() {
    let cluster = TestCluster::start_with_jetstream("journal");
    let first = cluster.driver().await;
    let _executor = cluster.executor("e1", 2, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let echo = SubmitJob {
        name: "echo".into(),
        repeat: 3,
        max_failures: 4,
        ..SubmitJob::new(vec![handler("echo", json!({"value": "kept"}))])
    };
    let job = within(LIMIT, api.run_job(echo.clone(), |_| {}))
        .await
        .unwrap();
    first.stop().await.unwrap();
    // A record no driver wrote: the next one skips it.
    let jetstream = async_nats::jetstream::new(cluster.client().await);
    let ack = jetstream
        .publish(cluster.subjects.journal(), "not json".into())
        .await
        .unwrap();
    ack.await.unwrap();

    let _next = cluster.driver().await;
    let restored = eventually(LIMIT, "the next driver's answer", || async {
        api.job(job.job_id).await.ok()
    })
    .await;
    assert_eq!(restored, job, "the ended job is listed as it ended");
    let results = api.results(job.job_id).await.unwrap();
    assert!(results.iter().all(|r| r.result == Some(json!("kept"))));
    let again = within(LIMIT, api.run_job(echo, |_| {})).await.unwrap();
    assert_eq!(again.job_id, job.job_id + 1);
    let ids: Vec<u64> = api
        .results(again.job_id)
        .await
        .unwrap()
        .iter()
        .map(|r| r.task_id)
        .collect();
    assert_eq!(ids, [4, 5, 6], "task ids go on after the restored ones");
}

/// An executor numbers its status batches and asks for each answer at its own number. An answer
/// to a batch that has since gone again is dropped, launches and all; the answer to the batch in
/// flight starts what it launches. The driver here is the test itself, on a real server.
#[tokio::test]
async fn an_executor_takes_only_the_answer_to_the_batch_in_flight() {
    use ember::ids::ExecutorId;
    use ember::protocol::{ExecutorMessage, HeartbeatReply, RegisterReply, TaskDescription};
    let cluster = TestCluster::start("status-answers");
    let subjects = &cluster.subjects;
    let driver = cluster.client().await;
    let mut register = driver.subscribe(subjects.register_all()).await.unwrap();
    let mut status = driver.subscribe(subjects.status_all()).await.unwrap();
    let mut heartbeat = driver.subscribe(subjects.heartbeat_all()).await.unwrap();
    driver.flush().await.unwrap();
    // Heartbeats are answered throughout, so the executor keeps counting this driver alive.
    let beats = driver.clone();
    tokio::spawn(async move {
        while let Some(beat) = heartbeat.next().await {
            let answer = HeartbeatReply::HeartbeatResponse { reregister: false };
            let _ = beats.publish(beat.reply.unwrap(), encode(&answer)).await;
        }
    });
    let instance = uuid::Uuid::new_v4();
    let noop = |task_id: u64| TaskDescription {
        task_id,
        job_id: 1,
        index: task_id as u32,
        attempt: 0,
        cpus: 1,
        spec: std::sync::Arc::new(handler("noop", serde_json::Value::Null)),
        resources: Default::default(),
        gang_peers: Vec::new(),
    };
    let answer = |launch: Vec<TaskDescription>| {
        encode(&StatusReply::StatusAck {
            accepted: 1,
            refused: Vec::new(),
            launch,
        })
    };
    let tasks_of = |payload: &[u8]| -> Vec<u64> {
        let StatusRequest::StatusUpdates { updates, .. } = decode(payload, usize::MAX).unwrap();
        updates.iter().map(|u| u.task_id).collect()
    };

    let _executor = cluster.executor("x0", 1, Handlers::default()).await;
    let registration = within(LIMIT, register.next()).await.unwrap();
    let registered = RegisterReply::RegisteredExecutor {
        executor_id: ExecutorId::parse("x0").unwrap(),
        driver_instance: instance,
        term: 0,
        adopted: Vec::new(),
    };
    driver
        .publish(registration.reply.unwrap(), encode(&registered))
        .await
        .unwrap();
    let launch = ExecutorMessage::LaunchTasks {
        tasks: vec![noop(1)],
        driver_instance: Some(instance),
    };
    let inbox = subjects.executor_inbox(&ExecutorId::parse("x0").unwrap());
    driver.publish(inbox, encode(&launch)).await.unwrap();

    // Batch n's answer goes to `<an inbox of the executor's own>.<n>`.
    let numbered = |reply: &Option<async_nats::Subject>| {
        let (inbox, n) = reply.as_deref().unwrap().rsplit_once('.').unwrap();
        assert!(inbox.starts_with("_INBOX.x0."), "{inbox}");
        (inbox.to_string(), n.parse::<u64>().unwrap())
    };
    let first = within(LIMIT, status.next()).await.unwrap();
    let (inbox, n) = numbered(&first.reply);
    assert_eq!(n, 0);
    assert_eq!(tasks_of(&first.payload), [1]);
    // Unanswered, it goes again after the request timeout, under the next number.
    let again = within(LIMIT, status.next()).await.unwrap();
    assert_eq!(numbered(&again.reply), (inbox.clone(), 1));
    assert_eq!(tasks_of(&again.payload), [1]);

    // A late answer to the first launches task 2; the answer to the second, task 3.
    driver
        .publish(first.reply.unwrap(), answer(vec![noop(2)]))
        .await
        .unwrap();
    driver
        .publish(again.reply.unwrap(), answer(vec![noop(3)]))
        .await
        .unwrap();
    let next = within(LIMIT, status.next()).await.unwrap();
    assert_eq!(numbered(&next.reply), (inbox, 2));
    assert_eq!(
        tasks_of(&next.payload),
        [3],
        "only the batch in flight's answer counts"
    );
}

#[tokio::test]
async fn two_clusters_on_one_server_each_with_an_executor_x0_keep_to_their_own() {
    let cluster = TestCluster::start("jobs-twins");
    let twin = Subjects::new(&format!("{}-twin", cluster.cluster)).unwrap();
    let _driver = cluster.driver().await;
    let _executor = cluster.executor("x0", 2, Handlers::builtin()).await;
    // The twin cluster's driver and executor x0, on the same server under another name.
    let twin_driver = cluster.driver_of(twin.clone(), Default::default()).await;
    let _twin_executor = cluster
        .executor_of(twin.clone(), "x0", 2, Handlers::builtin())
        .await;
    let apis = [
        cluster.api(cluster.client().await),
        EmberClient::new(cluster.client().await, twin),
    ];
    for api in &apis {
        eventually(LIMIT, "x0 registered", || async {
            (api.executors().await.ok()?.registered_executors == 1).then_some(())
        })
        .await;
    }
    // Both executors report at once, each numbering its status batches from 0; each cluster's
    // tasks echo a value of their own.
    let echoes = |value: u32| job(vec![handler("echo", json!({ "value": value }))], 2_000);
    let (one, other) = within(
        LIMIT,
        futures::future::join(
            apis[0].run_job(echoes(1), |_| {}),
            apis[1].run_job(echoes(2), |_| {}),
        ),
    )
    .await;
    for ((api, summary), value) in apis.iter().zip([one.unwrap(), other.unwrap()]).zip([1, 2]) {
        assert_eq!(
            (summary.state, summary.succeeded),
            (JobState::Succeeded, 2_000)
        );
        // Every task ran on its own cluster's x0, once, and its status reached its own driver.
        let results = api.results(summary.job_id).await.unwrap();
        assert_eq!(results.len(), 2_000);
        for result in results {
            assert_eq!(
                (result.result, result.attempts),
                (Some(json!(value)), 1),
                "task {} of the cluster whose tasks echo {value}",
                result.index
            );
        }
    }
    twin_driver.stop().await.unwrap();
}

/// A failed command's error text is cut to a size that fits, so that the journal stores the
/// task's end and the job's, which carry it: a status just under the executor's limit, all of
/// it error, was acknowledged and its records dropped for being a little larger still.
#[tokio::test]
async fn a_huge_error_is_cut_so_that_the_journal_stores_the_failure() {
    use ember::protocol::ResultObject;
    let dir = std::env::temp_dir().join(format!("ember-clip-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("small.conf");
    let max_payload = 65_536;
    std::fs::write(&conf, format!("max_payload: {max_payload}\n")).unwrap();
    let cluster = TestCluster::start_with_jetstream_and("clip", &["-c", conf.to_str().unwrap()]);
    let first = cluster.driver().await;
    let _executor = cluster.executor("e1", 1, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);

    // The status of the failure, its result in chunks (the output is too large for a status),
    // is exactly as large as the executor's limit allows when the error is not cut.
    let limit = max_payload - ember::PAYLOAD_HEADROOM;
    let framing = encode(&StatusUpdate {
        task_id: 1,
        attempt: 0,
        state: TaskState::Failed,
        result: None,
        error: Some(String::new()),
        result_object: Some(ResultObject {
            object: ember::objects::ObjectRef::parse(&"ab".repeat(32)).unwrap(),
            bytes: 999_999,
        }),
        no_retry: false,
    })
    .len();
    let prefix = "exited with code 3: ";
    let line = limit - framing - prefix.len();
    let script = format!(
        r"head -c 70000 /dev/zero | tr '\0' y; head -c {line} /dev/zero | tr '\0' x >&2; exit 3"
    );
    let failing = SubmitJob {
        speculation: None,
        max_failures: 1,
        ..job(vec![sh(&script)], 1)
    };
    let summary = within(LIMIT, api.run_job(failing, |_| {})).await.unwrap();
    assert_eq!(summary.state, JobState::Failed);
    let reason = summary.reason.clone().unwrap();
    assert!(
        reason.starts_with("task 0 failed once; last error: exited with code 3: xxx")
            && reason.ends_with(&format!(" [cut: {} bytes in all]", prefix.len() + line))
            && reason.len() < 2 * ember::text::MAX_ERROR_BYTES,
        "{}",
        &reason[..200.min(reason.len())]
    );
    first.stop().await.unwrap();

    // What the journal kept: the job's end, and the task's with its error.
    let _next = cluster.driver().await;
    let restored = eventually(LIMIT, "the next driver's answer", || async {
        api.job(summary.job_id).await.ok()
    })
    .await;
    assert_eq!(restored.state, JobState::Failed);
    assert_eq!(restored.reason, summary.reason);
    let results = api.results(summary.job_id).await.unwrap();
    assert_eq!(results[0].state, TaskState::Failed);
    let error = results[0].error.clone().unwrap_or_default();
    assert!(
        error.starts_with(prefix)
            && error.contains("[cut: ")
            && error.len() <= ember::text::MAX_ERROR_BYTES,
        "{results:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A submission sent again with its submission id (as a client does when the first answer
/// was lost) is answered with the job it made, and makes no second one.
#[tokio::test]
async fn a_submission_sent_again_makes_one_job() {
    let cluster = TestCluster::start("jobs-resubmit");
    let _driver = cluster.driver().await;
    let api = cluster.api(cluster.client().await);
    let keyed = SubmitJob {
        submission_id: Some("once".into()),
        ..job(vec![handler("noop", json!(null))], 3)
    };
    let first = api.submit(keyed.clone()).await.expect("submitted");
    let again = api.submit(keyed.clone()).await.expect("sent again");
    assert_eq!(again, first);
    let changed = api
        .submit(SubmitJob { repeat: 4, ..keyed })
        .await
        .unwrap_err()
        .to_string();
    assert!(
        changed
            .contains("submission id \"once\" made job 1, which was submitted with other settings"),
        "{changed}"
    );
    let jobs = api.jobs().await.expect("jobs");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
}

#[tokio::test]
async fn failed_attempts_wait_out_their_backoff_before_they_run_again() {
    let cluster = TestCluster::start("jobs-backoff");
    let mut events = cluster.listen(cluster.subjects.event("task.*")).await;
    let _driver = cluster.driver().await;
    let _a = cluster.executor("a", 1, Handlers::builtin()).await;
    let api = cluster.api(cluster.client().await);
    let backoff = ember::protocol::RetryBackoff {
        initial_ms: 200,
        multiplier: 2.0,
        max_ms: None,
        jitter: 0.2,
    };
    let submission = SubmitJob {
        retry_backoff: Some(backoff),
        ..job(vec![handler("fail", json!(null))], 1)
    };
    let summary = within(LIMIT, api.run_job(submission, |_| {}))
        .await
        .unwrap();
    assert_eq!(summary.state, JobState::Failed, "{summary:?}");
    assert_eq!(api.results(summary.job_id).await.unwrap()[0].attempts, 4);

    // The driver's own times: each attempt starts at least its wait, less the jitter, after
    // the failure before it ends.
    let (mut starts, mut ends) = (Vec::new(), Vec::new());
    while starts.len() < 4 || ends.len() < 4 {
        let message = within(LIMIT, events.next()).await.unwrap();
        match decode::<Event>(&message.payload, usize::MAX) {
            Ok(Event::TaskStart { time_ms, .. }) => starts.push(time_ms),
            Ok(Event::TaskEnd { time_ms, .. }) => ends.push(time_ms),
            _ => {}
        }
    }
    for failures in 1..4u32 {
        let wait = starts[failures as usize] - ends[failures as usize - 1];
        let least = (backoff.base_delay_ms(failures) as f64 * (1.0 - backoff.jitter)) as u64;
        assert!(
            wait >= least,
            "retry {failures} started {wait} ms after the failure, before {least} ms: \
             starts {starts:?}, ends {ends:?}"
        );
    }
}
