//! The results bucket: a JetStream key-value bucket of the cluster (`EMBER_<cluster>_RESULTS`)
//! that holds task results instead of the driver's memory, each under `<job_id>.<index>`, for
//! `--results-max-age` and up to `--results-max-bytes` (the oldest go first). The driver
//! stores a result before it publishes the task's end, as it does journal records, and reads
//! a page's results back when `GetResults` asks.

use super::journal::{store, JournalError};
use crate::ids::JobId;
use crate::protocol::{encode, ApiReply, ResultsPage};
use crate::subjects::Subjects;
use async_nats::jetstream::stream::{self, DiscardPolicy, StorageType};
use async_nats::jetstream::{self, kv};
use futures::future::BoxFuture;
use std::time::Duration;

/// How long the bucket keeps a result unless told otherwise.
pub const DEFAULT_RESULTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// How many bytes of results the bucket keeps unless told otherwise.
pub const DEFAULT_RESULTS_MAX_BYTES: u64 = 256 << 20;

/// What a result that the bucket no longer holds says in its outcome.
const EXPIRED: &str = "the result is no longer in the results bucket, which keeps results for \
                       --results-max-age and up to --results-max-bytes";

/// The results bucket of one cluster.
#[derive(Clone)]
pub struct ResultsBucket {
    context: jetstream::Context,
    store: kv::Store,
    bucket: String,
}

impl ResultsBucket {
    /// Opens the bucket, creating it if needed, beside the journal.
    pub async fn open(
        context: &jetstream::Context,
        subjects: &Subjects,
        max_age: Duration,
        max_bytes: u64,
        replicas: usize,
    ) -> Result<Self, JournalError> {
        let bucket = subjects.results_bucket();
        // The bucket's stream made here rather than by `create_key_value`, whose buckets
        // refuse writes once full: this one drops its oldest results instead.
        let config = stream::Config {
            name: format!("KV_{bucket}"),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            max_age,
            max_bytes: i64::try_from(max_bytes).unwrap_or(i64::MAX),
            discard: DiscardPolicy::Old,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            storage: StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        };
        let failed = |message: String| JournalError::Stream {
            stream: bucket.clone(),
            message,
        };
        context
            .create_or_update_stream(config)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let store = context
            .get_key_value(&bucket)
            .await
            .map_err(|e| failed(e.to_string()))?;
        Ok(Self {
            context: context.clone(),
            store,
            bucket,
        })
    }

    /// Stores the result of task `index` of job `job_id`, trying again until it is stored.
    pub fn put(&self, job_id: JobId, index: u32, payload: bytes::Bytes) -> BoxFuture<'static, ()> {
        let subject = format!("$KV.{}.{job_id}.{index}", self.bucket);
        store(self.context.clone(), subject, payload, None)
    }

    /// `page` with the results of `indices` read from the bucket, cut short if they no longer
    /// fit in one reply of `max_bytes`.
    pub async fn fill(
        &self,
        mut page: ResultsPage,
        indices: Vec<u32>,
        max_bytes: usize,
    ) -> ApiReply {
        let job_id = page.job_id;
        let reads = indices.iter().map(|index| {
            let store = self.store.clone();
            async move { (*index, store.get(format!("{job_id}.{index}")).await) }
        });
        let read = futures::future::join_all(reads).await;
        let mut found = std::collections::HashMap::with_capacity(read.len());
        for (index, value) in read {
            let value = match value {
                Ok(Some(bytes)) => serde_json::from_slice(&bytes).map_err(|e| e.to_string()),
                Ok(None) => Err(EXPIRED.to_string()),
                Err(error) => Err(format!(
                    "could not read the result from the bucket: {error}"
                )),
            };
            found.insert(index, value);
        }
        for outcome in &mut page.results {
            match found.remove(&outcome.index) {
                Some(Ok(result)) => outcome.result = Some(result),
                Some(Err(note)) => outcome.error = Some(note),
                None => {}
            }
        }
        fit_page(&mut page, max_bytes);
        ApiReply::Results(page)
    }
}

/// Cuts `page` after the outcomes that fit in `max_bytes` (keeping at least one), pointing
/// `next_offset` at the first one left out.
fn fit_page(page: &mut ResultsPage, max_bytes: usize) {
    let mut size = 512;
    let mut keep = page.results.len();
    for (at, outcome) in page.results.iter().enumerate() {
        size += encode(outcome).len() + 1;
        if size > max_bytes && at > 0 {
            keep = at;
            break;
        }
    }
    if keep < page.results.len() {
        page.next_offset = Some(page.results[keep].index);
        page.results.truncate(keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{TaskOutcome, TaskState};

    fn outcome(index: u32, result: &str) -> TaskOutcome {
        TaskOutcome {
            index,
            task_id: 100 + u64::from(index),
            state: TaskState::Finished,
            attempts: 1,
            executor_id: None,
            result: Some(serde_json::json!(result)),
            error: None,
            result_object: None,
            started_ms: None,
            duration_ms: None,
        }
    }

    #[test]
    fn a_page_grown_past_the_limit_by_its_results_is_cut_and_goes_on_where_it_stopped() {
        let big = "x".repeat(400);
        let mut page = ResultsPage {
            job_id: 1,
            results: (5..10).map(|i| outcome(i, &big)).collect(),
            next_offset: Some(10),
        };
        fit_page(&mut page, 1500);
        assert_eq!(page.results.len(), 2);
        assert_eq!(page.next_offset, Some(7));
        let mut one = ResultsPage {
            job_id: 1,
            results: vec![outcome(0, &big)],
            next_offset: None,
        };
        fit_page(&mut one, 10);
        assert_eq!(
            (one.results.len(), one.next_offset),
            (1, None),
            "one always stays"
        );
    }
}
