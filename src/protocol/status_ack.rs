//! `StatusAck`, the driver's answer to a status batch, with the tasks it launched on the cores
//! the batch freed: its one writer and its fast reader, following one list of keys:
//! `{"type":"StatusAck","accepted":n,"refused":[..],"launch":[groups]}`, `launch` only when it
//! launched anything (`groups.rs`).

use super::cursor::Cursor;
use super::groups::{self, Groups};
use super::{Message, RefusedStatus, StatusReply, TaskDescription};
use serde::ser::{SerializeStruct, Serializer};

const TAG: &str = "StatusAck";
const ACCEPTED: &str = "accepted";
const REFUSED: &str = "refused";
const LAUNCH: &str = "launch";

/// Writes a `StatusAck` after its `type`, which serde writes first: the variant's
/// `serialize_with`.
pub(super) fn write<S: Serializer>(
    accepted: &u32,
    refused: &[RefusedStatus],
    launch: &[TaskDescription],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let mut ack = serializer.serialize_struct(TAG, 2 + usize::from(!launch.is_empty()))?;
    ack.serialize_field(ACCEPTED, accepted)?;
    ack.serialize_field(REFUSED, refused)?;
    if !launch.is_empty() {
        ack.serialize_field(LAUNCH, &Groups(launch))?;
    }
    ack.end()
}

/// Only a `StatusAck` has a fast reader: the other answers are rare.
impl Message for StatusReply {
    fn decode_fast(payload: &[u8]) -> Option<Self> {
        let mut c = Cursor::new(payload);
        c.open(TAG)?;
        c.key(ACCEPTED)?;
        let accepted = c.u32()?;
        c.key(REFUSED)?;
        let mut refused = Vec::new();
        c.list(|c| {
            refused.push(c.embedded()?);
            Some(())
        })?;
        let launch = c.optional(LAUNCH, groups::read)?.unwrap_or_default();
        c.close()?;
        Some(StatusReply::StatusAck {
            accepted,
            refused,
            launch,
        })
    }
}
