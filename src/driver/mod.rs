//! The driver: a pure [`core`] owned by one actor task ([`run`]) that reads the driver's NATS
//! subscriptions, feeds the core, and sends what it returns.

pub mod actor;
mod admission;
mod coalesce;
pub mod config;
pub mod core;
pub mod discovery;
pub mod history;
pub mod journal;
pub mod lease;
mod outbox;
mod requests;
pub mod results;
mod shell;
mod snapshots;
mod start;

pub use actor::run;
pub use config::DriverConfig;
pub use journal::{JournalMode, Replicas};
pub use start::DriverError;
