//! The driver: a pure [`core`] owned by one actor task ([`run`]) that reads the driver's NATS
//! subscriptions, feeds the core, and sends what it returns.

pub mod actor;
mod coalesce;
pub mod core;
pub mod discovery;
pub mod history;
pub mod journal;
pub mod lease;
mod outbox;
pub mod results;
mod snapshots;

pub use actor::{run, DriverConfig, DriverError};
pub use journal::{JournalMode, Replicas};
