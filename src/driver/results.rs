//! The results bucket: a JetStream key-value bucket of the cluster (`EMBER_<cluster>_RESULTS`)
//! that holds task results instead of the driver's memory, each under `<job_id>.<index>`, for
//! `--results-max-age` and up to `--results-max-bytes` (the oldest go first). The driver
//! stores a result before it publishes the task's end, as it does journal records, and reads
//! a page's results back when `GetResults` asks. The results of a job a task reads are pinned:
//! they go to a second bucket (`EMBER_<cluster>_PINNED`), with no limit of age or size, and
//! are deleted when their job is forgotten.

use super::core::BucketRead;
use super::jetstream::until_answered;
use super::journal::{store, JournalError};
use crate::ids::JobId;
use crate::protocol::{encode, ApiReply, ResultsPage};
use crate::streams::Need;
use crate::subjects::Subjects;
use async_nats::jetstream::stream::{self, DiscardPolicy, StorageType};
use async_nats::jetstream::{self, kv};
use futures::future::BoxFuture;
use futures::future::{FutureExt, Shared};
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{debug, warn};

/// How long the bucket keeps a result unless told otherwise.
pub const DEFAULT_RESULTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// How many bytes of results the bucket keeps unless told otherwise.
pub const DEFAULT_RESULTS_MAX_BYTES: u64 = 256 << 20;

/// What a result that the bucket no longer holds says in its outcome.
const EXPIRED: &str = "the result is no longer in the results bucket, which keeps results for \
                       --results-max-age and up to --results-max-bytes";

/// How many results one pin copies at a time.
const COPIES_IN_FLIGHT: usize = 256;

/// How long a read of a stored result that fails is tried again before its error is told: a
/// clustered JetStream electing the bucket's leader (a node lost or parted) answers nothing
/// for a few seconds, and a result is no less there for it.
const READ_PATIENCE: Duration = Duration::from_secs(3);

/// The results bucket of one cluster, and beside it the stream of its pinned results: those a
/// task reads (a python task's `upstream`), which the bucket's limits do not reach and which
/// stay until their job is forgotten.
#[derive(Clone)]
pub struct ResultsBucket {
    context: jetstream::Context,
    store: kv::Store,
    bucket: String,
    pinned: kv::Store,
    pinned_bucket: String,
    pinned_stream: stream::Stream,
    /// The copies to the pinned results under way, by job: a read of the job waits for its.
    copies: Arc<Mutex<HashMap<JobId, Copy>>>,
}

/// A copy of results to the pinned results, which many may wait for.
type Copy = Shared<BoxFuture<'static, ()>>;

impl ResultsBucket {
    /// Opens the bucket and its pinned results, creating them if needed, beside the journal.
    pub async fn open(
        context: &jetstream::Context,
        subjects: &Subjects,
        max_age: Duration,
        max_bytes: u64,
        replicas: usize,
    ) -> Result<Self, JournalError> {
        let bucket = subjects.results_bucket();
        let max_bytes = i64::try_from(max_bytes).unwrap_or(i64::MAX);
        let (store, _) = open_bucket(context, &bucket, max_age, max_bytes, replicas, false).await?;
        // Pinned results leave with their job (a purge), not by age or size.
        let pinned_bucket = subjects.pinned_bucket();
        let (pinned, pinned_stream) =
            open_bucket(context, &pinned_bucket, Duration::ZERO, -1, replicas, true).await?;
        Ok(Self {
            context: context.clone(),
            store,
            bucket,
            pinned,
            pinned_bucket,
            pinned_stream,
            copies: Arc::default(),
        })
    }

    /// Stores the result of task `index` of job `job_id`, among the pinned results if
    /// `pinned`, trying again until it is stored.
    pub fn put(
        &self,
        job_id: JobId,
        index: u32,
        payload: bytes::Bytes,
        pinned: bool,
    ) -> BoxFuture<'static, ()> {
        let bucket = if pinned {
            &self.pinned_bucket
        } else {
            &self.bucket
        };
        let subject = format!("$KV.{bucket}.{job_id}.{index}");
        store(self.context.clone(), subject, payload, None)
    }

    /// Copies the results of tasks `indices` of job `job_id` from the bucket to the pinned
    /// results, once `after` (the writes that stored them) is done; reads of the job wait
    /// for it. One the bucket no longer holds is left out: the task that reads it is told.
    pub fn pin(
        &self,
        job_id: JobId,
        indices: Vec<u32>,
        after: BoxFuture<'static, ()>,
    ) -> BoxFuture<'static, ()> {
        let this = self.clone();
        let copy = async move {
            after.await;
            futures::stream::iter(indices)
                .map(|index| this.copy(job_id, index))
                .buffer_unordered(COPIES_IN_FLIGHT)
                .collect::<()>()
                .await;
        };
        let copy = copy.boxed().shared();
        let mut copies = self.copies.lock().unwrap_or_else(|e| e.into_inner());
        copies.retain(|_, copy| copy.peek().is_none());
        copies.insert(job_id, copy.clone());
        copy.boxed()
    }

    /// The copy of job `job_id`'s results to the pinned results under way, if one is.
    fn copying(&self, job_id: JobId) -> Option<Copy> {
        let copies = self.copies.lock().unwrap_or_else(|e| e.into_inner());
        copies
            .get(&job_id)
            .filter(|copy| copy.peek().is_none())
            .cloned()
    }

    async fn copy(&self, job_id: JobId, index: u32) {
        let key = format!("{job_id}.{index}");
        let mut delay = Duration::from_millis(50);
        for tries in 1.. {
            match self.store.get(&key).await {
                Ok(Some(value)) => {
                    let subject = format!("$KV.{}.{key}", self.pinned_bucket);
                    return store(self.context.clone(), subject, value, None).await;
                }
                Ok(None) => return,
                Err(error) if tries < 5 => {
                    debug!(%error, job_id, index, "could not read a result to pin; again");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(error) => {
                    return warn!(%error, job_id, index, "a result read by a task was not pinned")
                }
            }
        }
    }

    /// Deletes the pinned results of job `job_id`, forgotten.
    pub fn unpin(&self, job_id: JobId) -> BoxFuture<'static, ()> {
        let (stream, filter) = (
            self.pinned_stream.clone(),
            format!("$KV.{}.{job_id}.>", self.pinned_bucket),
        );
        Box::pin(async move {
            let mut delay = Duration::from_millis(50);
            for tries in 1..=5 {
                match stream.purge().filter(filter.clone()).await {
                    Ok(_) => return,
                    Err(error) if tries == 5 => {
                        warn!(%error, job_id, "the pinned results of a forgotten job stay")
                    }
                    Err(_) => {
                        tokio::time::sleep(delay).await;
                        delay *= 2;
                    }
                }
            }
        })
    }

    /// `read`'s page with the results of its `indices` read from the bucket (or the pinned
    /// results, first if `read.pinned`), cut short if they no longer fit in one reply of
    /// `max_bytes`.
    pub async fn fill(&self, read: BucketRead, max_bytes: usize) -> ApiReply {
        let BucketRead {
            mut page,
            indices,
            pinned,
        } = read;
        let job_id = page.job_id;
        if let Some(copy) = self.copying(job_id) {
            copy.await;
        }
        let (first, then) = match pinned {
            true => (&self.pinned, &self.store),
            false => (&self.store, &self.pinned),
        };
        let reads = indices.iter().map(|index| async move {
            let key = format!("{job_id}.{index}");
            let deadline = tokio::time::Instant::now() + READ_PATIENCE;
            let mut wait = Duration::from_millis(100);
            loop {
                let value = match read_key(first, &key).await {
                    Ok(None) => read_key(then, &key).await,
                    found => found,
                };
                if value.is_ok() || tokio::time::Instant::now() + wait > deadline {
                    break (*index, value);
                }
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        });
        let read = futures::future::join_all(reads).await;
        let mut found = HashMap::with_capacity(read.len());
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

/// The value of `key` in `store`; one a replica says is missing is asked of the stream's
/// leader before it is taken as missing (see [`leader_get`]).
async fn read_key(store: &kv::Store, key: &str) -> Result<Option<bytes::Bytes>, String> {
    match store.get(key).await {
        Ok(None) => leader_get(store, key).await,
        found => found.map_err(|error| error.to_string()),
    }
}

/// The value of `key` in `store` as its stream's leader holds it. A key-value read is a
/// direct get, which any replica may answer, and one that has not caught up (a node just back
/// from a partition) says a stored key is missing; the leader has every acknowledged write.
async fn leader_get(store: &kv::Store, key: &str) -> Result<Option<bytes::Bytes>, String> {
    let subject = format!("{}{key}", store.prefix);
    match store.stream.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => {
            let operation = message.headers.get("KV-Operation").map(|v| v.as_str());
            let deleted = matches!(operation, Some("DEL" | "PURGE"));
            Ok((!deleted).then_some(message.payload))
        }
        Err(error) if error.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(error) => Err(error.to_string()),
    }
}

/// Opens key-value bucket `bucket`, creating its stream (`KV_<bucket>`) if it does not exist
/// (one that does is used as it is, if it fits: see [`crate::streams`]): made here rather than
/// by `create_key_value`, whose buckets refuse writes once full; these drop their oldest
/// entries instead.
async fn open_bucket(
    context: &jetstream::Context,
    bucket: &str,
    max_age: Duration,
    max_bytes: i64,
    replicas: usize,
    purged: bool,
) -> Result<(kv::Store, stream::Stream), JournalError> {
    let config = stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        max_age,
        max_bytes,
        discard: DiscardPolicy::Old,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        storage: StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    };
    let failed = |message: String| JournalError::Stream {
        stream: bucket.to_string(),
        message,
    };
    let name = config.name.clone();
    let mut needs = vec![
        Need::MaxPerSubject,
        Need::Rollup,
        Need::Direct,
        Need::Discard,
    ];
    if purged {
        needs.push(Need::Purge);
    }
    if crate::streams::existing(context, &config, &needs)
        .await
        .map_err(failed)?
        .is_none()
    {
        until_answered(bucket, || context.create_or_update_stream(config.clone()))
            .await
            .map_err(|e| failed(e.to_string()))?;
    }
    let stream = context
        .get_stream(name)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let store = context
        .get_key_value(bucket)
        .await
        .map_err(|e| failed(e.to_string()))?;
    Ok((store, stream))
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
