//! The driver: a pure [`core`] owned by one actor task ([`run`]) that reads the driver's NATS
//! subscriptions, feeds the core, and sends what it returns.

pub mod actor;
mod admission;
pub mod advisories;
pub(crate) mod chain;
mod coalesce;
pub mod config;
pub mod core;
pub mod discovery;
pub mod history;
pub mod jetstream;
pub mod journal;
pub mod lease;
pub(crate) mod lease_clock;
mod objects;
pub(crate) mod outbox;
pub(crate) mod outgoing;
mod requests;
pub mod results;
mod shell;
mod snapshots;
mod start;

pub use actor::run;
pub use config::DriverConfig;
pub use journal::{JournalMode, Replicas};
pub use start::DriverError;

/// A point in time, as a piece of the driver that reads no clock is given it: an `Instant`,
/// or the simulator's virtual time since its start.
pub trait Moment: Copy + Ord + std::ops::Add<std::time::Duration, Output = Self> {}

impl<T: Copy + Ord + std::ops::Add<std::time::Duration, Output = T>> Moment for T {}
