//! The results a python task reads from the jobs it runs after (futures in its arguments):
//! asked of the leading driver on the executor's own results subject, page by page, each
//! result too large for one message fetched from the object store through the executor's
//! cache. The bytes go from the cluster to the executor, never through the client.

use super::staging::ObjectAccess;
use crate::ids::JobId;
use crate::protocol::{decode, encode, ApiReply, ApiRequest, TaskOutcome, TaskState};
use serde_json::{Map, Value};
use std::time::{Duration, Instant};

/// How long a read is tried again while no driver answers (a failover, say) before the task
/// fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// How long one ask waits for its answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// The pause between asks that had no answer.
const PAUSE: Duration = Duration::from_millis(200);

/// Results asked for at once.
const PAGE: u32 = 1000;

/// The results of `jobs`, as the worker takes them: `{"<job id>": [<result>, ...]}`, each
/// job's in task order; or why they cannot be read.
pub(crate) async fn read_results(access: &ObjectAccess, jobs: &[JobId]) -> Result<Value, String> {
    let reads = jobs.iter().map(|&job_id| async move {
        let results = read_job(access, job_id).await.map_err(|why| {
            format!("could not read the results of job {job_id}, which the task reads: {why}")
        })?;
        Ok::<_, String>((job_id.to_string(), Value::Array(results)))
    });
    let read = futures::future::join_all(reads).await;
    Ok(Value::Object(
        read.into_iter().collect::<Result<Map<_, _>, _>>()?,
    ))
}

/// Every task's result of job `job_id`, in index order.
async fn read_job(access: &ObjectAccess, job_id: JobId) -> Result<Vec<Value>, String> {
    let mut results = Vec::new();
    let mut offset = 0;
    loop {
        let request = ApiRequest::GetResults {
            job_id,
            offset,
            limit: PAGE,
        };
        let page = match ask(access, &request).await? {
            ApiReply::Results(page) => page,
            ApiReply::Error { message } => return Err(message),
            other => return Err(format!("the driver answered {other:?}")),
        };
        for outcome in page.results {
            results.push(result_of(access, job_id, outcome).await?);
        }
        match page.next_offset {
            Some(next) if next > offset => offset = next,
            _ => return Ok(results),
        }
    }
}

/// The result of one finished task: as the page has it, or read from its object.
async fn result_of(
    access: &ObjectAccess,
    job_id: JobId,
    outcome: TaskOutcome,
) -> Result<Value, String> {
    let index = outcome.index;
    if outcome.state != TaskState::Finished {
        return Err(format!(
            "task {index} of job {job_id} has not finished (it is {:?})",
            outcome.state
        ));
    }
    if let Some(object) = outcome.result_object {
        let held = access.hold(&object.object).await?;
        let text = tokio::fs::read(held.path())
            .await
            .map_err(|e| format!("could not read the result of task {index}: {e}"))?;
        return serde_json::from_slice(&text)
            .map_err(|e| format!("the result object of task {index} is not JSON: {e}"));
    }
    match (outcome.result, outcome.error) {
        (Some(result), _) => Ok(result),
        (None, Some(error)) => Err(format!("task {index}'s result: {error}")),
        (None, None) => Ok(Value::Null),
    }
}

/// One request to the leading driver, sent again while none answers, for up to [`PATIENCE`].
async fn ask(access: &ObjectAccess, request: &ApiRequest) -> Result<ApiReply, String> {
    let (client, subject) = access.results_route();
    let payload = encode(request);
    let start = Instant::now();
    loop {
        let asked = client.request(subject.to_string(), payload.clone());
        let why = match tokio::time::timeout(ASK_TIMEOUT, asked).await {
            Ok(Ok(reply)) => {
                return decode::<ApiReply>(&reply.payload, usize::MAX).map_err(|e| e.to_string())
            }
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("no answer within {ASK_TIMEOUT:?}"),
        };
        if start.elapsed() >= PATIENCE {
            return Err(format!("no driver answered for {PATIENCE:?} ({why})"));
        }
        tokio::time::sleep(PAUSE).await;
    }
}
