//! What a simulated run looks like: its size, its workload and its fault rates. Every field is
//! an `ember sim` flag, so a failing run prints the command that replays it.

/// One simulated run; with the same values, the same trace.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub seed: u64,
    pub executors: u32,
    pub cores: u32,
    pub tasks: u64,
    pub jobs: u32,
    /// The longest a task runs, in virtual ms (each runs 1 ms up to this).
    pub task_ms: u64,
    /// The chance that an attempt fails (the driver retries it up to `max_failures`).
    pub task_failure: f64,
    pub faults: Faults,
}

/// Fault rates. Message faults are chances per message; node faults are rates per executor per
/// virtual minute (the driver's, per minute). Faults stop after `for_ms` of virtual time; then
/// every job must end.
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    pub drop: f64,
    pub duplicate: f64,
    /// The chance a message is held up to `delay_ms` (so later ones overtake it).
    pub delay: f64,
    pub delay_ms: u64,
    /// Cuts an executor off from the driver for up to `partition_ms`.
    pub partition: f64,
    pub partition_ms: u64,
    /// Kills an executor; a new one (a new id, as a restarted process) starts `restart_ms` later.
    pub kill: f64,
    pub restart_ms: u64,
    /// Decommissions an executor (as `ember stop-executor` would); a new one starts later.
    pub stop: f64,
    /// Kills the driver; a new driver instance starts `restart_ms` later. Jobs do not survive it
    /// (the driver keeps them in memory only), so the client submits the unfinished ones again.
    pub driver_restart: f64,
    pub for_ms: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            drop: 0.01,
            duplicate: 0.01,
            delay: 0.02,
            delay_ms: 3_000,
            partition: 0.01,
            partition_ms: 15_000,
            kill: 0.01,
            restart_ms: 5_000,
            stop: 0.005,
            driver_restart: 0.0,
            for_ms: 60_000,
        }
    }
}

impl Faults {
    /// No faults at all.
    pub fn none() -> Self {
        Self {
            drop: 0.0,
            duplicate: 0.0,
            delay: 0.0,
            partition: 0.0,
            kill: 0.0,
            stop: 0.0,
            driver_restart: 0.0,
            ..Self::default()
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            seed: 1,
            executors: 20,
            cores: 4,
            tasks: 2_000,
            jobs: 4,
            task_ms: 2_000,
            task_failure: 0.01,
            faults: Faults::default(),
        }
    }
}

impl SimConfig {
    /// The `ember sim` command that runs exactly this configuration.
    pub fn command(&self) -> String {
        let f = &self.faults;
        format!(
            "ember sim --seed {} --executors {} --cores {} --tasks {} --jobs {} --task-ms {} \
             --task-failure {} --drop {} --duplicate {} --delay {} --delay-ms {} --partition {} \
             --partition-ms {} --kill {} --restart-ms {} --stop {} --driver-restart {} \
             --faults-for-ms {}",
            self.seed,
            self.executors,
            self.cores,
            self.tasks,
            self.jobs,
            self.task_ms,
            self.task_failure,
            f.drop,
            f.duplicate,
            f.delay,
            f.delay_ms,
            f.partition,
            f.partition_ms,
            f.kill,
            f.restart_ms,
            f.stop,
            f.driver_restart,
            f.for_ms
        )
    }
}
