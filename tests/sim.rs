//! The deterministic simulation: hundreds of small seeds with heavy faults keep every
//! invariant, a seed replays to the same trace, and regressions replay the seeds that found
//! bugs.

use clap::Parser;
use ember::cli::sim::SimArgs;
use ember::sim::{run, Faults, Report, SimConfig};

/// A small cluster under heavy faults: 10 executors, 300 tasks, every fault kind but the
/// driver's.
fn small(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        executors: 10,
        tasks: 300,
        faults: Faults {
            drop: 0.05,
            duplicate: 0.05,
            delay: 0.1,
            partition: 0.5,
            kill: 0.5,
            stop: 0.2,
            for_ms: 30_000,
            ..Faults::default()
        },
        ..SimConfig::default()
    }
}

fn passes(config: SimConfig) -> Report {
    let command = config.command();
    let report = run(config, false);
    if let Some(v) = &report.violation {
        panic!(
            "step {} at {} ms: {}\nreplay it: {command}",
            v.step, v.time_ms, v.what
        );
    }
    report
}

#[test]
fn three_hundred_small_seeds_keep_every_invariant() {
    let mut faults = 0;
    for seed in 1..=300 {
        let report = passes(small(seed));
        assert_eq!(report.jobs_ended, 4, "seed {seed}");
        assert!(report.tasks_finished >= 300, "seed {seed}");
        faults += report.faults.kills + report.faults.partitions + report.faults.stops;
    }
    assert!(
        faults > 300,
        "the seeds hardly killed anything: {faults} node faults"
    );
}

#[test]
fn a_seed_replays_to_the_same_trace() {
    let first = run(small(42), false);
    let again = run(small(42), false);
    assert_eq!(first, again);
    let other = run(small(43), false);
    assert_ne!(first.trace, other.trace);
}

#[test]
fn a_thousand_executors_with_default_faults() {
    let config = SimConfig {
        executors: 1_000,
        tasks: 50_000,
        jobs: 10,
        ..SimConfig::default()
    };
    let report = passes(config);
    assert_eq!(report.tasks_finished, 50_000);
    assert!(report.faults.total() > 1_000);
}

#[test]
fn without_faults_every_task_finishes_once() {
    let config = SimConfig {
        task_failure: 0.0,
        faults: Faults::none(),
        ..small(7)
    };
    let report = passes(config);
    assert_eq!(report.tasks_finished, 300);
    assert_eq!(report.faults.total(), 0);
}

/// The command a failing run prints parses back into exactly its configuration.
#[test]
fn the_replay_command_replays_the_same_configuration() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }
    let mut config = small(9);
    config.faults.driver_restart = 0.25;
    let command = config.command();
    let words = command.split_whitespace().skip(1).filter(|w| *w != "sim");
    let parsed = Cli::try_parse_from(std::iter::once("ember").chain(words)).expect(&command);
    assert_eq!(parsed.sim.config(9), config);
}

/// Found by the simulation with driver restarts on: a status batch sent to the old driver
/// instance, arriving late (or twice) at the new one after the executor has registered there,
/// was accepted for the new driver's attempt with the same task id and attempt number, a
/// different task. Status batches and launches now say which driver instance they are for.
#[test]
fn a_restarted_driver_refuses_the_old_drivers_statuses() {
    let mut config = small(553);
    config.faults.driver_restart = 2.0;
    passes(config);
}
