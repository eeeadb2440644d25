//! Results too large for one message: the executor stores them in the cluster's results bucket
//! in chunks, under keys of its own (`chunks.<executor_id>.<task_id>.<attempt>.<n>`), and its
//! status points at them (`result_chunks`) instead of carrying the result. The driver reads a
//! chunk back for whoever asks (`GetResultChunk`), in base64, so each chunk is sized to fit
//! one answer that way.

use crate::ids::ExecutorId;
use crate::protocol::{ResultChunks, StatusUpdate, TaskState};
use crate::subjects::{result_chunk_key, Subjects};
use async_nats::jetstream;
use serde_json::Value;
use std::time::Duration;
use tracing::warn;

/// What a status update takes in a batch beside its result, at most: ids, state and framing.
const STATUS_FRAMING: usize = 256;

/// How many times a chunk's write is tried before the task fails for want of it.
const CHUNK_ATTEMPTS: u32 = 4;

/// The bytes of `value` as JSON, counted without building the text.
pub fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` into a sink that cannot fail cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Whether `status` carries a result too large for a status batch of `status_limit` bytes.
pub fn too_large(status: &StatusUpdate, status_limit: usize) -> bool {
    status
        .result
        .as_ref()
        .is_some_and(|result| json_len(result) + STATUS_FRAMING > status_limit)
}

/// The largest chunk for a status limit of `status_limit` bytes: its base64 (4 bytes for
/// every 3) and the answer's framing still fit in one answer.
pub fn chunk_bytes(status_limit: usize) -> usize {
    (status_limit.saturating_sub(1024) / 4 * 3).max(3)
}

/// Stores `status`'s result in the results bucket in chunks sized for a status limit of
/// `status_limit` bytes, and returns the status pointing at them; or, if they cannot be stored, the status failed with a message
/// that says why (there is no results bucket without a driver's JetStream journal).
pub async fn store(
    jetstream: jetstream::Context,
    subjects: Subjects,
    executor: ExecutorId,
    mut status: StatusUpdate,
    status_limit: usize,
) -> StatusUpdate {
    let chunk_bytes = chunk_bytes(status_limit);
    let Some(result) = status.result.take() else {
        return status;
    };
    let json = match serde_json::to_vec(&result) {
        Ok(json) => json,
        Err(error) => return failed(status, format!("could not encode the result: {error}")),
    };
    let count = json.len().div_ceil(chunk_bytes);
    let Ok(count) = u32::try_from(count) else {
        return failed(
            status,
            format!("the result of {} bytes is too large", json.len()),
        );
    };
    for (n, chunk) in json.chunks(chunk_bytes).enumerate() {
        let key = result_chunk_key(&executor, status.task_id, status.attempt, n as u32);
        let subject = subjects.results_key(&key);
        let chunk = bytes::Bytes::copy_from_slice(chunk);
        if let Err(error) = put(&jetstream, subject, chunk).await {
            let message = format!(
                "the task's result is {} bytes, over the limit of {status_limit} bytes of one \
                 message (the server's max_payload less headroom), and it could not be stored \
                 in the results bucket in chunks: {error} (a driver with a JetStream journal \
                 keeps that bucket; or raise max_payload in nats.conf)",
                json.len()
            );
            return failed(status, message);
        }
    }
    status.result_chunks = Some(ResultChunks {
        count,
        bytes: json.len() as u64,
    });
    status
}

/// Stores one chunk, trying a few times.
async fn put(
    jetstream: &jetstream::Context,
    subject: String,
    chunk: bytes::Bytes,
) -> Result<(), String> {
    let mut delay = Duration::from_millis(100);
    let mut attempt = 1;
    loop {
        let stored = match jetstream.publish(subject.clone(), chunk.clone()).await {
            Ok(ack) => ack.await.map(drop).map_err(|e| e.to_string()),
            Err(error) => Err(error.to_string()),
        };
        match stored {
            Ok(()) => return Ok(()),
            Err(error) if attempt >= CHUNK_ATTEMPTS => return Err(error),
            Err(error) => {
                warn!(%error, attempt, %subject, "a result's chunk was not stored; trying again")
            }
        }
        tokio::time::sleep(delay).await;
        delay *= 2;
        attempt += 1;
    }
}

fn failed(mut status: StatusUpdate, message: String) -> StatusUpdate {
    status.state = TaskState::Failed;
    status.result = None;
    status.result_chunks = None;
    status.error = Some(message);
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_len_counts_the_encoding() {
        for value in [json!(null), json!("a\"b\n ü"), json!({"k": [1, 2.5, "x"]})] {
            assert_eq!(json_len(&value), serde_json::to_vec(&value).unwrap().len());
        }
    }

    #[test]
    fn a_chunk_in_base64_fits_in_one_answer() {
        for limit in [4096, 1 << 20, (8 << 20) - 4096] {
            let chunk = chunk_bytes(limit);
            assert!(chunk.div_ceil(3) * 4 + 1024 <= limit, "{limit}");
        }
    }
}
