//! `StatusUpdates`, the status batch an executor sends on `<p>.driver.status.<id>`: its one
//! writer, which `encode` and the executor's status queue both write with, and its fast reader,
//! following one list of keys:
//! `{"type":"StatusUpdates","executor_id":"..","updates":[..],"driver_instance":".."}`,
//! `driver_instance` only when there is one, each update in its compact form (`compact.rs`): a
//! plain finish as `[task_id, attempt]`, anything else an object.

use super::cursor::Cursor;
use super::{Message, StatusRequest, StatusUpdate};
use crate::ids::{ExecutorId, InstanceId};
use serde::ser::{SerializeStruct, Serializer};
use serde::Serialize;

const TAG: &str = "StatusUpdates";
const EXECUTOR_ID: &str = "executor_id";
const UPDATES: &str = "updates";
const DRIVER_INSTANCE: &str = "driver_instance";

/// A status batch to write. `updates` are [`StatusUpdate`]s, or anything that writes as one: the
/// executor keeps each status that is not a plain finish as the JSON it was encoded to when it
/// was queued, and puts its batches together from those.
pub struct StatusBatch<'a, U> {
    pub executor_id: &'a ExecutorId,
    pub updates: &'a [U],
    pub driver_instance: Option<&'a InstanceId>,
}

impl<U: Serialize> Serialize for StatusBatch<'_, U> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let len = 3 + usize::from(self.driver_instance.is_some());
        let mut batch = serializer.serialize_struct(TAG, len)?;
        batch.serialize_field("type", TAG)?;
        batch.serialize_field(EXECUTOR_ID, self.executor_id)?;
        batch.serialize_field(UPDATES, self.updates)?;
        if let Some(driver) = self.driver_instance {
            batch.serialize_field(DRIVER_INSTANCE, driver)?;
        }
        batch.end()
    }
}

impl Serialize for StatusRequest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let StatusRequest::StatusUpdates {
            executor_id,
            updates,
            driver_instance,
        } = self;
        StatusBatch {
            executor_id,
            updates,
            driver_instance: driver_instance.as_ref(),
        }
        .serialize(serializer)
    }
}

impl Message for StatusRequest {
    fn decode_fast(payload: &[u8]) -> Option<Self> {
        let mut c = Cursor::new(payload);
        c.open(TAG)?;
        c.key(EXECUTOR_ID)?;
        let executor_id = c.string()?;
        c.key(UPDATES)?;
        let mut updates = Vec::new();
        c.list(|c| {
            updates.push(update(c)?);
            Some(())
        })?;
        let driver_instance = c.optional(DRIVER_INSTANCE, Cursor::string)?;
        c.close()?;
        Some(StatusRequest::StatusUpdates {
            executor_id,
            updates,
            driver_instance,
        })
    }
}

/// One update: `[task_id, attempt]`, or an object, which serde reads.
fn update(c: &mut Cursor<'_>) -> Option<StatusUpdate> {
    if c.at_object() {
        return c.embedded();
    }
    let [task_id, attempt] = c.numbers()?;
    Some(StatusUpdate::finished(
        task_id,
        u32::try_from(attempt).ok()?,
    ))
}
