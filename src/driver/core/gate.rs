//! The start gate: Spark's `minRegisteredResourcesRatio` and `maxRegisteredResourcesWaitingTime`.
//! Offers are held until enough executors have registered, or until the longest wait has passed,
//! so that the first jobs spread over the cluster instead of piling onto the first executor.
//! Once open, the gate stays open for the life of the driver, as Spark's `isReady` does.

use super::Core;
use crate::protocol::StartGateStatus;
use std::time::Duration;

/// How long the gate holds offers at most (Spark's `maxRegisteredResourcesWaitingTime`).
pub const DEFAULT_MAX_REGISTERED_WAIT: Duration = Duration::from_secs(30);

/// The gate's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartGate {
    /// Offers wait until this many executors have registered...
    pub min_registered: u64,
    /// ...or until this long after the driver started.
    pub max_wait_ms: u64,
}

impl Core {
    /// Holds offers, from `now`, as `gate` says.
    pub fn set_start_gate(&mut self, gate: StartGate, now: u64) {
        self.gate = Some(StartGateStatus {
            min_registered: gate.min_registered,
            opens_by_ms: now.saturating_add(gate.max_wait_ms),
            opened_at_ms: None,
            reason: None,
        });
        self.gate_open(now);
    }

    /// The start gate, if one was set.
    pub fn start_gate(&self) -> Option<&StartGateStatus> {
        self.gate.as_ref()
    }

    /// Whether offers may be made at `now`; opens the gate, and logs why, the first time they
    /// may.
    pub(super) fn gate_open(&mut self, now: u64) -> bool {
        let registered = self.executors.len() as u64;
        let Some(gate) = self.gate.as_mut() else {
            return true;
        };
        if gate.opened_at_ms.is_some() {
            return true;
        }
        let reason = if registered >= gate.min_registered {
            format!(
                "{} registered, of the {} required",
                crate::text::count(registered, "executor", "executors"),
                gate.min_registered
            )
        } else if now >= gate.opens_by_ms {
            format!(
                "the longest wait (--max-registered-wait) passed with {} registered, of the {} \
                 required",
                crate::text::count(registered, "executor", "executors"),
                gate.min_registered
            )
        } else {
            return false;
        };
        tracing::info!(%reason, "the start gate opened: offers are made from now on");
        gate.opened_at_ms = Some(now);
        gate.reason = Some(reason);
        true
    }
}
