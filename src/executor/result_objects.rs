//! Results too large for one message: the executor puts the result's JSON text in the
//! cluster's object store, and its status names the object (`result_object`) instead of
//! carrying the result. The driver keeps the reference with its job (and the object while it
//! keeps the job); clients read the object from the store themselves.

use super::staging::ObjectAccess;
use crate::protocol::{ResultObject, StatusUpdate, TaskState};
use serde_json::Value;
use std::time::Duration;
use tracing::warn;

/// What a status update takes in a batch beside its result, at most: ids, state and framing.
const STATUS_FRAMING: usize = 256;

/// How many times a result's put is tried before the task fails for want of it.
const PUT_ATTEMPTS: u32 = 4;

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

/// Puts `status`'s result in the object store and returns the status naming it; or, if it
/// cannot be put, the status failed with a message that says why (there is no store without
/// a driver's JetStream journal, and a full store says its limit).
pub async fn store(
    objects: &ObjectAccess,
    mut status: StatusUpdate,
    status_limit: usize,
) -> StatusUpdate {
    let Some(result) = status.result.take() else {
        return status;
    };
    let json = match serde_json::to_vec(&result) {
        Ok(json) => bytes::Bytes::from(json),
        Err(error) => return failed(status, format!("could not encode the result: {error}")),
    };
    let size = json.len();
    let put = async {
        let store = objects.store().await?;
        let mut delay = Duration::from_millis(100);
        let mut attempt = 1;
        loop {
            match store.put_bytes(json.clone()).await {
                Ok(put) => return Ok(put),
                Err(error @ crate::objects::ObjectsError::Full { .. }) => {
                    return Err(error.to_string())
                }
                Err(error) if attempt >= PUT_ATTEMPTS => return Err(error.to_string()),
                Err(error) => {
                    warn!(%error, attempt, "a result was not put in the object store; trying again")
                }
            }
            tokio::time::sleep(delay).await;
            delay *= 2;
            attempt += 1;
        }
    };
    match put.await {
        Ok(put) => {
            objects.counts.put(put.size, put.sent);
            // Kept here too: a call that reads this result is sent here if it can be.
            if let Ok(cache) = objects.cache() {
                if let Err(error) = cache.keep(&put.object, &json) {
                    warn!(%error, "a result put in the object store was not kept in the cache");
                }
            }
            status.result_object = Some(ResultObject {
                object: put.object,
                bytes: put.size,
            });
            status
        }
        Err(error) => failed(
            status,
            format!(
                "the task's result is {size} bytes, over the limit of {status_limit} bytes of \
                 one message (the server's max_payload less headroom), and it could not be put \
                 in the object store: {error} (a driver with a JetStream journal makes the \
                 store; or raise max_payload in nats.conf)"
            ),
        ),
    }
}

fn failed(mut status: StatusUpdate, message: String) -> StatusUpdate {
    status.state = TaskState::Failed;
    status.result = None;
    status.result_object = None;
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
}
