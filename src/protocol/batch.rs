//! Messages that carry a batch (launches, task events, journal records of task ends) and are
//! cut in halves when too large for one NATS message.

use super::{encode, ExecutorMessage};
use bytes::Bytes;
use serde::Serialize;

/// A message that carries a batch and can be cut in two when it is too large for one NATS
/// message: launches and task events.
pub trait Batch: Sized {
    /// The two halves, or the message itself when it holds fewer than two items.
    fn split(self) -> Result<(Self, Self), Self>;
}

/// `message` encoded, cut in halves until each part is at most `max_bytes`, in order; a part
/// that cannot be cut and does not fit is dropped with a warning naming `subject`.
pub fn fit<T: Batch + Serialize>(message: T, max_bytes: usize, subject: &str) -> Vec<Bytes> {
    let mut parts = vec![message];
    let mut fitted = Vec::new();
    while let Some(part) = parts.pop() {
        let payload = encode(&part);
        if payload.len() <= max_bytes {
            fitted.push(payload);
            continue;
        }
        match part.split() {
            // Second half pushed first: parts go out in order.
            Ok((first, second)) => parts.extend([second, first]),
            Err(_) => {
                tracing::warn!(%subject, size = payload.len(), "message over max_payload dropped")
            }
        }
    }
    fitted
}

pub(super) fn halve<T>(mut items: Vec<T>) -> Result<(Vec<T>, Vec<T>), Vec<T>> {
    if items.len() < 2 {
        return Err(items);
    }
    let rest = items.split_off(items.len() / 2);
    Ok((items, rest))
}

impl Batch for ExecutorMessage {
    fn split(self) -> Result<(Self, Self), Self> {
        match self {
            ExecutorMessage::LaunchTasks {
                tasks,
                driver_instance,
            } => {
                let launch = |tasks| Self::LaunchTasks {
                    tasks,
                    driver_instance,
                };
                halve(tasks)
                    .map(|(a, b)| (launch(a), launch(b)))
                    .map_err(launch)
            }
            other => Err(other),
        }
    }
}
