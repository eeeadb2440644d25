//! Ember: Spark's coarse-grained driver/executor loop on NATS.
//!
//! Executors register with a driver over NATS; the driver keeps the registry, rejects duplicate
//! ids, publishes listener events, and offers free cores to waiting tasks by sending them to each
//! executor's own inbox; executors run the tasks and report back.
//!
//! - [`protocol`], [`ids`], [`subjects`]: the wire: every message, id and subject.
//! - [`driver`]: a pure state machine ([`driver::core`]) owned by one actor task
//!   ([`driver::run`]) behind a thin NATS layer.
//! - [`executor`]: registration, the inbox, task slots and status batches.
//! - [`client`]: jobs and queries for programs and the CLI; [`events`]: the listener bus.
//! - [`objects`]: the cluster's object store, data that tasks read and make.
//! - [`connect`]: NATS connection options shared by every binary; [`server`]: starting a local
//!   `nats-server` for `ember up`, the demo and the tests.

pub mod bench;
pub mod cli;
pub mod client;
pub mod connect;
pub mod driver;
pub mod epoch;
pub mod events;
pub mod executor;
pub mod history;
pub mod ids;
pub mod metrics;
pub mod objects;
pub mod placement;
pub mod protocol;
pub mod resources;
pub mod server;
pub mod sim;
pub mod streams;
pub mod subjects;
pub mod text;
pub mod web;

use std::time::Duration;

/// The cluster name used when none is given.
pub const DEFAULT_CLUSTER: &str = "default";
/// The NATS server used when none is given.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";
/// Attempts a task gets before its job fails (Spark's `spark.task.maxFailures`).
pub const DEFAULT_MAX_FAILURES: u32 = 4;
/// How long an executor keeps trying to register before it gives up.
pub const DEFAULT_REGISTER_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the driver offers free cores even when nothing else prompts it.
pub const DEFAULT_REVIVE_INTERVAL: Duration = Duration::from_secs(1);
/// How often an executor sends a heartbeat.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);
/// How long the driver waits without a heartbeat before it removes an executor, and how long an
/// executor waits without an answer before it counts the driver lost.
pub const DEFAULT_EXECUTOR_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a job waits with no executor registered before it fails.
pub const DEFAULT_NO_EXECUTORS_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a draining executor lets its tasks finish before it hands them back.
pub const DEFAULT_DECOMMISSION_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the driver's journal keeps a record (the JetStream stream's max age).
pub const DEFAULT_JOURNAL_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How much the driver's journal grows between two snapshots, at least.
pub const DEFAULT_SNAPSHOT_AFTER: u64 = 8 << 20;
/// Exit code of an executor that lost its driver with --exit-on-driver-loss (as Spark's 56).
pub const EXIT_DRIVER_LOST: i32 = 56;
/// How long one request waits for its answer before it is retried.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Room left under the server's max_payload for headers and framing.
pub const PAYLOAD_HEADROOM: usize = 4 * 1024;
/// The largest message a receiver decodes when the server does not say (NATS's own default).
pub const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;
/// How often every Ember connection pings its NATS server. A client leaves a server that has
/// not answered three pings (async-nats' limit), so a node cut off silently is left within
/// about 1.8 s, rather than the minutes of NATS's default of 60 s (`nats-server` itself pings
/// its clients every 2 minutes).
pub const PING_INTERVAL: Duration = Duration::from_millis(600);
/// How long one connection attempt to one NATS server may take before the next is tried: a
/// reconnect that first picks a node that is down costs this much more.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How many messages a subscription buffers before NATS would call it a slow consumer.
pub const SUBSCRIPTION_CAPACITY: usize = 1 << 16;

/// Hashing with fixed keys, for the maps whose iteration order reaches messages: the same
/// inputs then give the same outputs, which a seeded simulation needs to replay a run.
pub type FixedHasher = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// Hashing for keys the driver hands out itself (task ids, a job's task indexes), in the maps
/// touched for every task: a rotation and a multiplication per word (FxHash's), then the
/// finishing mix of MurmurHash3, a fraction of SipHash's cost and as deterministic as
/// [`FixedHasher`]. Not for keys that come from the wire: whoever knows the function can
/// choose keys that all collide.
pub type IdHasher = std::hash::BuildHasherDefault<IdHash>;

/// The hasher of [`IdHasher`].
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHash(u64);

impl IdHash {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for IdHash {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.add(u64::from(byte));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    /// Mixes every bit of the state into the low bits, where a map picks its bucket: a product
    /// alone keeps the key's low bits there, and ids that step by a power of two (one
    /// executor's tasks, dealt round-robin among 64) would crowd a few buckets.
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }
}

/// Milliseconds since the Unix epoch: the clock fed into the driver core and stamped on events.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::IdHasher;
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    /// Where a map of 128 buckets would put each of 64 ids that start at 1 and step by `stride`.
    fn buckets(stride: u64) -> HashSet<u64> {
        (0..64)
            .map(|i| IdHasher::default().hash_one(1 + stride * i) & 127)
            .collect()
    }

    #[test]
    fn ids_spread_over_buckets_whatever_their_step() {
        // Spread at random, 64 ids would fill about 50 of 128 buckets.
        for stride in [1, 2, 3, 7, 64, 1024, 1 << 20, 1 << 32] {
            let used = buckets(stride).len();
            assert!(used >= 40, "step {stride}: 64 ids in {used} of 128 buckets");
        }
    }

    #[test]
    fn id_hashing_is_the_same_in_every_process() {
        let hash = |key: (u32, u32)| IdHasher::default().hash_one(key);
        assert_eq!(hash((7, 1)), hash((7, 1)));
        assert_ne!(hash((7, 1)), hash((1, 7)));
    }
}
