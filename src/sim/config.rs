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
    /// How many objects the workload's object jobs name between them; 0: no job names one.
    pub objects: u32,
    /// The longest an ordinary object fetch takes, in virtual ms (each takes 1 ms up to
    /// this; one in ten is slow, up to ten times this).
    pub fetch_ms: u64,
    /// The chance that an object fetch fails (the attempts waiting on it fail with it). Like
    /// `task_failure` it goes on after the faults stop: it is the workload's, not the
    /// cluster's.
    pub fetch_failure: f64,
    /// Driver processes: one leads, the others stand by (with the journal only).
    pub drivers: u32,
    /// Whether the drivers keep a journal and take a lease, as the product does by default.
    /// Without it there is one driver, and the client submits again what a killed one held.
    pub journal: bool,
    /// The drivers' `--lease`, in ms.
    pub lease_ms: u64,
    /// Whether the fences are up: a leader stops sending when its lease runs out in its own
    /// eyes, the journal refuses a write that does not follow the last one its writer saw, and
    /// executors ignore older epochs. Off only to show that the invariants catch what they
    /// keep out.
    pub fencing: bool,
    /// How many outputs a leader holds behind its journal writes before its messages to
    /// executors wait too: the driver's limit, or less to make executors wait on the journal.
    pub max_held: usize,
    /// Whether the workload's jobs run after one another ([`SimConfig::upstreams`]).
    pub dependencies: bool,
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
    /// Kills the leading driver; the process starts again `restart_ms` later (a new instance,
    /// standing by). Without the journal jobs do not survive it, so the client submits the
    /// unfinished ones again.
    pub driver_restart: f64,
    /// Stops the leading driver (as SIGSTOP) for up to `pause_ms`, then lets it run on as if
    /// nothing happened, while what it had sent just before waits in its connection.
    pub driver_pause: f64,
    pub pause_ms: u64,
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
            driver_pause: 0.0,
            pause_ms: 10_000,
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
            driver_pause: 0.0,
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
            objects: 3,
            fetch_ms: 1_000,
            fetch_failure: 0.05,
            drivers: 1,
            journal: true,
            lease_ms: crate::driver::lease::DEFAULT_LEASE.as_millis() as u64,
            fencing: true,
            max_held: crate::driver::outbox::MAX_HELD,
            dependencies: false,
            faults: Faults::default(),
        }
    }
}

impl SimConfig {
    /// The jobs of the workload that job `origin` runs after, once they succeed and however
    /// they end, as numbers of the workload's jobs: with `dependencies`, most jobs run after
    /// an earlier one, and some after another however it ends, drawn from the seed.
    pub fn upstreams(&self, origin: usize) -> (Vec<usize>, Vec<usize>) {
        if !self.dependencies || origin == 0 {
            return (Vec::new(), Vec::new());
        }
        let draw = self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ origin as u64;
        let after = match draw % 4 {
            0 => Vec::new(),
            _ => vec![(draw / 4) as usize % origin],
        };
        let after_any = match (origin >= 2, (draw / 64) % 3) {
            (true, 0) => vec![(draw / 256) as usize % origin],
            _ => Vec::new(),
        };
        (after, after_any)
    }

    /// Why this configuration cannot run, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.drivers == 0 {
            return Err("--drivers must be at least 1".into());
        }
        if !self.journal && self.drivers > 1 {
            return Err("more than one driver needs the journal (--journal true)".into());
        }
        if !self.journal && self.faults.driver_pause > 0.0 {
            return Err("--driver-pause needs the journal: without it there is no lease".into());
        }
        if !(0.0..=1.0).contains(&self.fetch_failure) {
            return Err("--fetch-failure is a chance, from 0 to 1".into());
        }
        if self.fetch_ms == 0 {
            return Err("--fetch-ms must be at least 1".into());
        }
        if self.max_held == 0 {
            return Err("--max-held must be at least 1".into());
        }
        if self.journal && self.lease_ms < 200 {
            return Err("--lease-ms must be at least 200, as the driver's --lease".into());
        }
        Ok(())
    }

    /// The `ember sim` command that runs exactly this configuration.
    pub fn command(&self) -> String {
        let f = &self.faults;
        format!(
            "ember sim --seed {} --executors {} --cores {} --tasks {} --jobs {} --task-ms {} \
             --task-failure {} --objects {} --fetch-ms {} --fetch-failure {} --drivers {} \
             --journal {} --lease-ms {} --fencing {} --max-held {} --dependencies {} --drop {} --duplicate {} \
             --delay {} --delay-ms {} --partition {} --partition-ms {} --kill {} --restart-ms {} \
             --stop {} --driver-restart {} --driver-pause {} --pause-ms {} --faults-for-ms {}",
            self.seed,
            self.executors,
            self.cores,
            self.tasks,
            self.jobs,
            self.task_ms,
            self.task_failure,
            self.objects,
            self.fetch_ms,
            self.fetch_failure,
            self.drivers,
            self.journal,
            self.lease_ms,
            self.fencing,
            self.max_held,
            self.dependencies,
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
            f.driver_pause,
            f.pause_ms,
            f.for_ms
        )
    }
}
