//! A handler that ignores its stop token, over a real nats-server: killed, it is abandoned
//! once the grace is over, its attempt ends KILLED saying so, and its core stays busy, shown as
//! such, until the handler returns; only then does other work run on it.

mod common;

use common::{eventually, noops, within, TestCluster};
use ember::executor::Handlers;
use ember::protocol::{decode, Event, JobState, SubmitJob, TaskSpec, TaskState};
use futures::StreamExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(30);
const LIMIT_BYTES: usize = usize::MAX;
/// How long the handler runs, whatever it is asked: past the 5 s grace, by enough to look.
const STUBBORN: Duration = Duration::from_secs(7);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_ignores_its_stop_is_abandoned_and_holds_its_core_until_it_returns() {
    let cluster = TestCluster::start("abandoned");
    let mut ends = cluster.listen(cluster.subjects.event("task.end")).await;
    let _driver = cluster.driver().await;
    let (started, returned) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let mut handlers = Handlers::builtin();
    let (s, r) = (started.clone(), returned.clone());
    handlers.register("stubborn", move |_context, _arg| {
        s.store(true, Ordering::SeqCst);
        // Never looks at `_context.stop`.
        std::thread::sleep(STUBBORN);
        r.store(true, Ordering::SeqCst);
        Ok(serde_json::Value::Null)
    });
    let _a = cluster.executor("a", 1, handlers).await;
    let api = cluster.api(cluster.client().await);
    let stubborn = SubmitJob {
        tasks: vec![TaskSpec::Handler {
            name: "stubborn".into(),
            arg: serde_json::Value::Null,
        }],
        ..noops(1)
    };
    let first = api.submit(stubborn).await.unwrap();
    eventually(LIMIT, "the handler started", || async {
        started.load(Ordering::SeqCst).then_some(())
    })
    .await;
    let asked = Instant::now();
    api.kill(first).await.unwrap();

    // The job ends at once; its task's attempt ends KILLED once the grace is over, saying it
    // was abandoned, though the handler still runs.
    let ended = within(Duration::from_secs(9), async {
        loop {
            let message = ends.next().await.expect("events");
            let Ok(Event::TaskEnd { executors, .. }) =
                decode::<Event>(&message.payload, LIMIT_BYTES)
            else {
                continue;
            };
            if let Some(end) = executors.into_iter().flat_map(|e| e.tasks).next() {
                return end;
            }
        }
    })
    .await;
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_millis(4_500),
        "ended after {waited:?}"
    );
    assert!(
        !returned.load(Ordering::SeqCst),
        "the handler returned already"
    );
    assert_eq!(api.job(first).await.unwrap().state, JobState::Killed);
    assert_eq!(ended.state, TaskState::Killed, "{ended:?}");
    let error = ended.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("did not return within 5s of being asked to stop")
            && error.contains("its core stays busy until it returns"),
        "{error}"
    );
    let outcome = &api.results(first).await.unwrap()[0];
    assert_eq!(outcome.state, TaskState::Killed, "{outcome:?}");

    // Its core is busy, and shown as held by the abandoned handler.
    let snapshot = api.executors().await.unwrap();
    let a = &snapshot.executors[0];
    assert_eq!(a.free_cores, 0, "{a:?}");
    assert_eq!(a.abandoned.len(), 1, "{a:?}");
    assert_eq!(
        (
            a.abandoned[0].task_id,
            a.abandoned[0].attempt,
            a.abandoned[0].cpus
        ),
        (outcome.task_id, 0, 1)
    );
    let shown = cluster.cli_stdout(&["executors"]).await;
    assert!(
        shown.contains("executor a: 1 abandoned handler holds 1 core (task "),
        "{shown}"
    );

    // Another job's task waits for that core until the handler returns.
    let second = api.submit(noops(1)).await.unwrap();
    let summary = within(LIMIT, api.wait(second, |_| {})).await.unwrap();
    assert_eq!(summary.state, JobState::Succeeded, "{summary:?}");
    assert!(
        returned.load(Ordering::SeqCst),
        "the second job ran before the abandoned handler returned"
    );
    assert!(asked.elapsed() >= STUBBORN - Duration::from_millis(500));
    eventually(LIMIT, "the core free and nothing abandoned", || async {
        let snapshot = api.executors().await.ok()?;
        let a = &snapshot.executors[0];
        (a.free_cores == 1 && a.abandoned.is_empty()).then_some(())
    })
    .await;
}
