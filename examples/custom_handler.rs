//! Embedding an executor with a handler of your own.
//!
//! A program that links the `ember` library can run an executor in-process and register named
//! handlers beside the built-ins (`noop`, `sleep`, `echo`, `fail`). Each handler gets the task's
//! context and its JSON argument, and returns a JSON result or an error message (the attempt
//! then FAILs and is retried). Handlers run on tokio's blocking pool, so CPU work and blocking
//! I/O are fine.
//!
//! Run it against a cluster (`ember up` starts one), then submit work to it:
//!
//! ```text
//! cargo run --release --example custom_handler -- --executor-id squares-1
//! ember submit --tasks 10 --kind square --arg '{"n": 12}' --results
//! ```

use clap::Parser;
use ember::cli::{init_tracing, runtime, shutdown_signal, SERVICE_LOG};
use ember::connect::NatsArgs;
use ember::executor::{run, ExecutorConfig, Handlers, TaskContext, TaskResult};
use ember::ids::ExecutorId;
use ember::subjects::Subjects;
use serde_json::{json, Value};

/// An executor that can also run `square {n}`.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    nats: NatsArgs,
    #[arg(long, default_value = "squares-1")]
    executor_id: String,
    #[arg(long, default_value_t = 2)]
    cores: u32,
}

/// `square {"n": 12}` -> `{"index": <task index>, "square": 144}`.
fn square(context: TaskContext, arg: Value) -> TaskResult {
    let n = arg["n"].as_i64().ok_or("square needs {\"n\": <integer>}")?;
    let square = n
        .checked_mul(n)
        .ok_or_else(|| format!("{n} squared overflows"))?;
    Ok(json!({ "index": context.index, "square": square }))
}

/// The built-ins plus `square`.
fn handlers() -> Handlers {
    let mut handlers = Handlers::builtin();
    handlers.register("square", square);
    handlers
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_tracing(false, SERVICE_LOG);
    runtime()?.block_on(async {
        let executor_id = ExecutorId::parse(args.executor_id).map_err(anyhow::Error::msg)?;
        let prefix = Subjects::executor_reply_prefix(&executor_id);
        let client = args.nats.connect("custom-handler", Some(prefix)).await?;
        let config = ExecutorConfig::new(
            args.nats.subjects()?,
            executor_id,
            "localhost:0".into(),
            args.cores,
        );
        run(client, config, handlers(), shutdown_signal()).await?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> TaskContext {
        TaskContext {
            job_id: 1,
            task_id: 7,
            index: 3,
            attempt: 0,
            term: 0,
            resources: Default::default(),
            gang: None,
            stop: Default::default(),
        }
    }

    #[test]
    fn square_squares_and_explains_bad_input() {
        assert_eq!(
            square(context(), json!({"n": 12})),
            Ok(json!({"index": 3, "square": 144}))
        );
        assert!(square(context(), json!({})).unwrap_err().contains("needs"));
        assert!(square(context(), json!({"n": i64::MAX}))
            .unwrap_err()
            .contains("overflows"));
    }

    /// The example's executor, on a real nats-server with a real driver, runs `square` jobs.
    #[tokio::test]
    async fn the_embedded_executor_runs_square_jobs() {
        use std::time::Duration;
        let server = ember::server::NatsServer::start(&[]).expect("nats-server");
        let subjects = Subjects::new("example-square").unwrap();
        let connect = |prefix: Option<String>| {
            let mut options = async_nats::ConnectOptions::new();
            if let Some(prefix) = prefix {
                options = options.custom_inbox_prefix(prefix);
            }
            options.connect(server.url())
        };
        let driver_config = ember::driver::DriverConfig {
            revive_interval: Duration::from_millis(200),
            ..ember::driver::DriverConfig::new(subjects.clone())
        };
        let driver = tokio::spawn(ember::driver::run(
            connect(None).await.unwrap(),
            driver_config,
            std::future::pending(),
        ));
        let id = ExecutorId::parse("squares-1").unwrap();
        let config = ExecutorConfig::new(subjects.clone(), id.clone(), "localhost:0".into(), 2);
        let client = connect(Some(Subjects::executor_reply_prefix(&id)))
            .await
            .unwrap();
        let executor = tokio::spawn(run(client, config, handlers(), std::future::pending()));
        let api = ember::client::EmberClient::new(connect(None).await.unwrap(), subjects);
        // The driver and the executor start beside this test: wait until the driver answers
        // and has the executor, since a submission that finds no driver at all is refused.
        let registered = async {
            loop {
                match api.executors().await {
                    Ok(registry) if registry.registered_executors == 1 => break,
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), registered)
            .await
            .expect("the driver answers with the executor registered");
        let square = ember::protocol::TaskSpec::Handler {
            name: "square".into(),
            arg: json!({"n": 9}),
        };
        let job = ember::protocol::SubmitJob {
            name: "squares".into(),
            repeat: 4,
            max_failures: 1,
            ..ember::protocol::SubmitJob::new(vec![square])
        };
        let summary = tokio::time::timeout(Duration::from_secs(30), api.run_job(job, |_| {}))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(summary.succeeded, 4);
        let results = api.results(summary.job_id).await.unwrap();
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.result, Some(json!({"index": i, "square": 81})));
        }
        driver.abort();
        executor.abort();
    }
}
