//! `LaunchTasks`, one offer round's tasks for one executor: its one writer and its fast reader,
//! following one list of keys: `{"type":"LaunchTasks","tasks":[groups],"driver_instance":".."}`,
//! `driver_instance` only when there is one, the tasks in groups (`groups.rs`).

use super::cursor::Cursor;
use super::groups::{self, Groups};
use super::{ExecutorMessage, Message, TaskDescription};
use crate::ids::InstanceId;
use serde::ser::{SerializeStruct, Serializer};

const TAG: &str = "LaunchTasks";
const TASKS: &str = "tasks";
const DRIVER_INSTANCE: &str = "driver_instance";

/// Writes a `LaunchTasks` after its `type`, which serde writes first: the variant's
/// `serialize_with`.
pub(super) fn write<S: Serializer>(
    tasks: &[TaskDescription],
    driver_instance: &Option<InstanceId>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let len = 1 + usize::from(driver_instance.is_some());
    let mut launch = serializer.serialize_struct(TAG, len)?;
    launch.serialize_field(TASKS, &Groups(tasks))?;
    if let Some(driver) = driver_instance {
        launch.serialize_field(DRIVER_INSTANCE, driver)?;
    }
    launch.end()
}

/// Only a `LaunchTasks` has a fast reader: kills and stops are rare.
impl Message for ExecutorMessage {
    fn decode_fast(payload: &[u8]) -> Option<Self> {
        let mut c = Cursor::new(payload);
        c.open(TAG)?;
        c.key(TASKS)?;
        let tasks = groups::read(&mut c)?;
        let driver_instance = c.optional(DRIVER_INSTANCE, Cursor::string)?;
        c.close()?;
        Some(ExecutorMessage::LaunchTasks {
            tasks,
            driver_instance,
        })
    }
}
