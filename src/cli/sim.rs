//! `ember sim`: runs the deterministic simulation for one seed or many, prints what each run
//! did, and on a broken invariant prints the seed, the step and the command that replays it.

use crate::sim::{run, Faults, Report, SimConfig};
use std::time::Instant;

/// Flags of `ember sim`; the defaults are [`SimConfig::default`]'s.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// The seed of the (first) run.
    #[arg(long, env = "EMBER_SIM_SEED", default_value_t = SimConfig::default().seed)]
    pub seed: u64,
    /// How many runs, with seeds from --seed up.
    #[arg(long, env = "EMBER_SIM_SEEDS", default_value_t = 1)]
    pub seeds: u64,
    /// Executors at the start (a killed one is replaced by a new one).
    #[arg(long, env = "EMBER_SIM_EXECUTORS", default_value_t = SimConfig::default().executors)]
    pub executors: u32,
    /// Cores per executor.
    #[arg(long, env = "EMBER_SIM_CORES", default_value_t = SimConfig::default().cores)]
    pub cores: u32,
    /// Tasks in all, split evenly over the jobs.
    #[arg(long, env = "EMBER_SIM_TASKS", default_value_t = SimConfig::default().tasks)]
    pub tasks: u64,
    /// Jobs the client submits; --tasks is split evenly over them.
    #[arg(long, env = "EMBER_SIM_JOBS", default_value_t = SimConfig::default().jobs)]
    pub jobs: u32,
    /// The longest a task runs, in virtual ms.
    #[arg(long, env = "EMBER_SIM_TASK_MS", default_value_t = SimConfig::default().task_ms)]
    pub task_ms: u64,
    /// The chance that an attempt fails.
    #[arg(long, env = "EMBER_SIM_TASK_FAILURE", default_value_t = SimConfig::default().task_failure)]
    pub task_failure: f64,
    /// How many objects the object jobs name between them (every job whose number is 2 or 3
    /// in 4 names two of them); 0: no job names an object.
    #[arg(long, env = "EMBER_SIM_OBJECTS", default_value_t = SimConfig::default().objects)]
    pub objects: u32,
    /// The longest an ordinary object fetch takes, in virtual ms (one in ten is slow, up to
    /// ten times this).
    #[arg(long, env = "EMBER_SIM_FETCH_MS", default_value_t = SimConfig::default().fetch_ms)]
    pub fetch_ms: u64,
    /// The chance that an object fetch fails, failing the attempts that wait on it.
    #[arg(long, env = "EMBER_SIM_FETCH_FAILURE", default_value_t = SimConfig::default().fetch_failure)]
    pub fetch_failure: f64,
    /// Driver processes: one leads, the others stand by (needs the journal beyond one).
    #[arg(long, env = "EMBER_SIM_DRIVERS", default_value_t = SimConfig::default().drivers)]
    pub drivers: u32,
    /// Whether the drivers keep a journal and take a lease (`false`: one driver that forgets
    /// everything when killed, and a client that submits its jobs again).
    #[arg(long, env = "EMBER_SIM_JOURNAL", action = clap::ArgAction::Set,
          default_value_t = SimConfig::default().journal)]
    pub journal: bool,
    /// The drivers' lease, in virtual ms.
    #[arg(long, env = "EMBER_SIM_LEASE_MS", default_value_t = SimConfig::default().lease_ms)]
    pub lease_ms: u64,
    /// Whether the fences are up (epochs, the journal's sequence check, a leader stopping when
    /// its lease runs out); `false` shows what the invariants catch without them.
    #[arg(long, env = "EMBER_SIM_FENCING", action = clap::ArgAction::Set,
          default_value_t = SimConfig::default().fencing)]
    pub fencing: bool,
    /// How many outputs a leader holds behind the journal before its messages to executors
    /// wait too (the driver's limit by default; less makes executors wait on the journal).
    #[arg(long, env = "EMBER_SIM_MAX_HELD", default_value_t = SimConfig::default().max_held)]
    pub max_held: usize,
    /// The chance that a message is lost.
    #[arg(long, env = "EMBER_SIM_DROP", default_value_t = Faults::default().drop)]
    pub drop: f64,
    /// The chance that a message arrives twice.
    #[arg(long, env = "EMBER_SIM_DUPLICATE", default_value_t = Faults::default().duplicate)]
    pub duplicate: f64,
    /// The chance that a message is held up to --delay-ms.
    #[arg(long, env = "EMBER_SIM_DELAY", default_value_t = Faults::default().delay)]
    pub delay: f64,
    /// The longest a delayed message is held up, in virtual ms.
    #[arg(long, env = "EMBER_SIM_DELAY_MS", default_value_t = Faults::default().delay_ms)]
    pub delay_ms: u64,
    /// Partitions per executor per virtual minute.
    #[arg(long, env = "EMBER_SIM_PARTITION", default_value_t = Faults::default().partition)]
    pub partition: f64,
    /// The longest partition, in virtual ms.
    #[arg(long, env = "EMBER_SIM_PARTITION_MS", default_value_t = Faults::default().partition_ms)]
    pub partition_ms: u64,
    /// Kills per executor per virtual minute.
    #[arg(long, env = "EMBER_SIM_KILL", default_value_t = Faults::default().kill)]
    pub kill: f64,
    /// How long after a process goes away its replacement starts, in virtual ms.
    #[arg(long, env = "EMBER_SIM_RESTART_MS", default_value_t = Faults::default().restart_ms)]
    pub restart_ms: u64,
    /// Decommissions per executor per virtual minute.
    #[arg(long, env = "EMBER_SIM_STOP", default_value_t = Faults::default().stop)]
    pub stop: f64,
    /// Driver kills per virtual minute (its jobs are lost: it keeps them in memory only).
    #[arg(long, env = "EMBER_SIM_DRIVER_RESTART", default_value_t = Faults::default().driver_restart)]
    pub driver_restart: f64,
    /// How long faults go on, in virtual ms; then every job must end.
    /// Pauses of the leading driver per virtual minute (as SIGSTOP, then SIGCONT).
    #[arg(long, env = "EMBER_SIM_DRIVER_PAUSE", default_value_t = Faults::default().driver_pause)]
    pub driver_pause: f64,
    /// The longest pause, in virtual ms.
    #[arg(long, env = "EMBER_SIM_PAUSE_MS", default_value_t = Faults::default().pause_ms)]
    pub pause_ms: u64,
    /// Faults stop after this much virtual time, in ms; then every job must end.
    #[arg(long, env = "EMBER_SIM_FAULTS_FOR_MS", default_value_t = Faults::default().for_ms)]
    pub faults_for_ms: u64,
    /// Whether the workload's jobs run after one another (most after an earlier one once it
    /// succeeds, some after another however it ends, drawn from the seed).
    #[arg(long, env = "EMBER_SIM_DEPENDENCIES", default_value_t = false, action = clap::ArgAction::Set)]
    pub dependencies: bool,
    /// Print every step of the run.
    #[arg(long, env = "EMBER_SIM_TRACE")]
    pub trace: bool,
}

impl SimArgs {
    /// The configuration of the run with `seed`.
    pub fn config(&self, seed: u64) -> SimConfig {
        SimConfig {
            seed,
            executors: self.executors,
            cores: self.cores,
            tasks: self.tasks,
            jobs: self.jobs,
            task_ms: self.task_ms,
            task_failure: self.task_failure,
            objects: self.objects,
            fetch_ms: self.fetch_ms,
            fetch_failure: self.fetch_failure,
            drivers: self.drivers,
            journal: self.journal,
            lease_ms: self.lease_ms,
            fencing: self.fencing,
            max_held: self.max_held,
            dependencies: self.dependencies,
            faults: Faults {
                drop: self.drop,
                duplicate: self.duplicate,
                delay: self.delay,
                delay_ms: self.delay_ms,
                partition: self.partition,
                partition_ms: self.partition_ms,
                kill: self.kill,
                restart_ms: self.restart_ms,
                stop: self.stop,
                driver_restart: self.driver_restart,
                driver_pause: self.driver_pause,
                pause_ms: self.pause_ms,
                for_ms: self.faults_for_ms,
            },
        }
    }
}

/// Runs the seeds; false once one breaks an invariant (the rest are not run).
pub fn sim(args: &SimArgs) -> bool {
    let started = Instant::now();
    if let Err(error) = args.config(args.seed).check() {
        eprintln!("error: {error}");
        return false;
    }
    for seed in args.seed..args.seed.saturating_add(args.seeds) {
        let config = args.config(seed);
        let run_started = Instant::now();
        let report = run(config.clone(), args.trace);
        println!("{}", summary(&report, run_started.elapsed().as_secs_f64()));
        if let Some(violation) = &report.violation {
            println!(
                "seed {seed} broke an invariant at step {} (virtual {} ms): {}",
                violation.step, violation.time_ms, violation.what
            );
            println!("replay it: {}", config.command());
            return false;
        }
    }
    if args.seeds > 1 {
        let secs = started.elapsed().as_secs_f64();
        println!("{} seeds passed in {secs:.1} s", args.seeds);
    }
    true
}

fn summary(report: &Report, secs: f64) -> String {
    let f = &report.faults;
    format!(
        "seed {}: {} steps, {:.1} s virtual, {} tasks finished, {} jobs ended; faults: {} \
         (dropped {}, duplicated {}, delayed {}, partitions {}, kills {}, stops {}, driver \
         kills {}, driver pauses {}, failovers {}); writes off their turns {}; fetches {} \
         (failed {}, shared {}; attempts failed {}, jobs failed {}); trace {:016x}; \
         {secs:.2} s",
        report.seed,
        report.steps,
        report.virtual_ms as f64 / 1000.0,
        report.tasks_finished,
        report.jobs_ended,
        f.total(),
        f.dropped,
        f.duplicated,
        f.delayed,
        f.partitions,
        f.kills,
        f.stops,
        f.driver_restarts,
        f.driver_pauses,
        report.leaderships.saturating_sub(1),
        report.skipped_writes,
        report.fetches.fetches,
        report.fetches.failed,
        report.fetches.shared,
        report.fetches.attempts_failed,
        report.fetches.jobs_failed,
        report.trace
    )
}
