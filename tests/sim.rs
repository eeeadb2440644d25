//! The deterministic simulation: hundreds of small seeds with heavy faults keep every
//! invariant, a thousand seeds with leader kills and pauses among standby drivers keep them
//! too, the invariants catch a deposed leader once the fences are down, a seed replays to the
//! same trace, and regressions replay the seeds that found bugs.

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

/// Standby drivers under fire: 2 or 3 drivers whose leader is killed (half of the time by
/// SIGTERM, which lets the lease go) or stopped for up to 10 s about 3 times a virtual minute
/// each, beside the executor and message faults.
fn failover(seed: u64) -> SimConfig {
    let heavy = small(seed);
    SimConfig {
        executors: 5,
        tasks: 500,
        drivers: 2 + (seed % 2) as u32,
        faults: Faults {
            driver_restart: 3.0,
            driver_pause: 3.0,
            for_ms: 40_000,
            ..heavy.faults.clone()
        },
        ..heavy
    }
}

/// The workload a seed that found a bug ran: no task names an object, so the seed replays the
/// same steps it did then.
fn as_found(config: SimConfig) -> SimConfig {
    SimConfig {
        objects: 0,
        ..config
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
    let (mut faults, mut copies) = (0, 0);
    for seed in 1..=300 {
        let report = passes(small(seed));
        assert_eq!(report.jobs_ended, 4, "seed {seed}");
        assert!(report.tasks_finished >= 300, "seed {seed}");
        faults += report.faults.kills + report.faults.partitions + report.faults.stops;
        copies += report.copies;
    }
    assert!(
        faults > 300,
        "the seeds hardly killed anything: {faults} node faults"
    );
    // Half the jobs have speculation on: slow tasks were copied, and the invariants held.
    assert!(
        copies > 300,
        "the seeds hardly copied anything: {copies} copies"
    );
}

/// The outbox's hold limit, lowered so that executors' messages wait behind the journal
/// often: the invariants hold while they do, with the driver killed and restarted too.
#[test]
fn executors_messages_waiting_behind_the_journal_keep_every_invariant() {
    let mut waited = 0;
    for seed in 1..=200 {
        let config = SimConfig {
            faults: Faults {
                driver_restart: 2.0,
                ..small(seed).faults
            },
            ..small(seed)
        };
        let unlimited = run(config.clone(), false);
        let report = passes(SimConfig {
            max_held: 1 + (seed % 4) as usize,
            ..config
        });
        assert_eq!(report.jobs_ended, 4, "seed {seed}");
        waited += usize::from(report.trace != unlimited.trace);
    }
    assert!(
        waited > 100,
        "only {waited} of 200 runs held executors' messages"
    );
}

#[test]
fn a_thousand_seeds_with_leader_kills_and_pauses_keep_every_invariant() {
    let (mut failovers, mut kills, mut pauses, mut adopted) = (0, 0, 0, 0);
    for seed in 1..=1_000 {
        let report = passes(failover(seed));
        assert_eq!(report.jobs_ended, 4, "seed {seed}");
        // A task whose object fetches all failed fails its job, whose other tasks stop.
        if report.fetches.jobs_failed == 0 {
            assert!(report.tasks_finished >= 500, "seed {seed}: {report:?}");
        }
        failovers += report.leaderships - 1;
        kills += report.faults.driver_restarts;
        pauses += report.faults.driver_pauses;
        adopted += report.adopted;
    }
    // New leaders adopted what still ran, and the run invariants held for those runs too.
    assert!(adopted > 1_000, "only {adopted} runs adopted");
    assert!(failovers > 2_000, "only {failovers} failovers");
    assert!(kills > 1_000, "only {kills} leader kills");
    assert!(pauses > 500, "only {pauses} leader pauses");
}

/// Jobs that run after jobs, under the failover faults and tasks that fail a fifth of the time
/// (so some jobs fail and the jobs after them must too): no task of a job is launched before
/// the end of each job it runs after is stored, and at the end a job after one that did not
/// succeed failed, and one that succeeded ran after jobs that all did.
#[test]
fn a_thousand_seeds_of_jobs_after_jobs_with_leader_kills_keep_every_invariant() {
    for seed in 1..=1_000 {
        let config = SimConfig {
            dependencies: true,
            task_failure: 0.2,
            ..failover(seed)
        };
        let report = passes(config);
        assert_eq!(report.jobs_ended, 4, "seed {seed}");
    }
}

/// A leader deposed with two journal writes in flight: its successor's mark refuses the first,
/// but the second expects exactly the sequence the mark took and is stored after it, as
/// JetStream does. Restoring leaders skip it (nothing behind it was told), and every
/// invariant holds. These seeds each have such a write.
#[test]
fn a_deposed_leaders_write_stored_after_its_successors_mark_is_skipped() {
    for seed in [448, 502, 786] {
        let config = SimConfig {
            seed,
            executors: 5,
            tasks: 500,
            jobs: 50,
            drivers: 3,
            lease_ms: 1000,
            faults: Faults {
                drop: 0.05,
                duplicate: 0.05,
                delay: 0.3,
                partition: 0.5,
                kill: 0.5,
                stop: 0.2,
                for_ms: 40_000,
                driver_restart: 3.0,
                driver_pause: 5.0,
                ..Faults::default()
            },
            ..SimConfig::default()
        };
        let report = passes(as_found(config));
        assert!(
            report.skipped_writes > 0,
            "seed {seed} stored no write off its turn: {report:?}"
        );
    }
}

/// The invariants are not idle: with the fences down (a leader sends on after its lease ran
/// out, the journal takes any write, executors hear every epoch) a deposed leader is caught.
#[test]
fn without_the_fences_the_invariants_catch_a_deposed_leader() {
    let broken: Vec<String> = (1..=200)
        .filter_map(|seed| {
            let config = SimConfig {
                fencing: false,
                ..failover(seed)
            };
            run(config, false).violation.map(|v| v.what)
        })
        .collect();
    assert!(
        broken.len() > 20,
        "only {} of 200 unfenced seeds broke an invariant",
        broken.len()
    );
    let deposed = broken
        .iter()
        .filter(|what| what.contains("holds the lease") || what.contains("epoch"))
        .count();
    assert!(deposed > 0, "none named the deposed leader: {broken:?}");
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
        fetch_failure: 0.0,
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
    let mut config = failover(9);
    config.lease_ms = 1_500;
    config.max_held = 3;
    config.faults.pause_ms = 4_000;
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
    let mut config = as_found(small(553));
    config.journal = false;
    config.faults.driver_restart = 2.0;
    passes(config);
}

/// Found by the run invariants: a `LaunchTasks` delivered twice started a second run under the
/// attempt's name on the same executor (the first one's work ran on unwatched). The machine
/// now remembers its recent launches and ignores a repeat.
#[test]
fn a_repeated_launch_starts_no_second_run() {
    passes(as_found(small(1)));
}

/// Leader kills on an otherwise faultless cluster: every executor stays connected, so every
/// run still alive at a failover must be adopted, not started again (the run invariants judge
/// each; `sim::runs`'s unit tests show they report wrong inputs).
#[test]
fn failovers_adopt_runs_without_faults_on_the_executors() {
    let config = SimConfig {
        faults: Faults {
            driver_restart: 3.0,
            driver_pause: 0.0,
            ..Faults::none()
        },
        ..failover(5)
    };
    let report = passes(config);
    assert!(report.leaderships > 1, "no failover");
    assert!(report.adopted > 0, "nothing adopted");
}

/// Found by the simulation with standby drivers: a late copy of an executor's registration
/// reached the next leader, which registered it and answered an executor that had meanwhile
/// registered with the leader before. Its heartbeats were accepted, its launches ignored,
/// and one task was launched and lost every 6 s for ever. A heartbeat now says which driver
/// the executor registered with, and any other driver tells it to register again.
#[test]
fn an_executor_registered_with_another_leader_registers_again() {
    let mut config = as_found(failover(696));
    config.drivers = 2;
    passes(config);
}

/// Object fetches that are slow and fail one time in five, under heavy faults and, for every
/// other seed, leader kills and pauses: no work starts before its objects are fetched on its
/// executor, none is fetched twice there, attempts share fetches in flight, fetches fail and
/// fail their attempts, and every job still ends.
#[test]
fn slow_failing_object_fetches_keep_every_invariant() {
    let mut totals = ember::sim::fetches::Counts::default();
    for seed in 1..=40 {
        let config = match seed % 2 {
            0 => small(seed),
            _ => failover(seed),
        };
        let report = passes(SimConfig {
            fetch_failure: 0.2,
            fetch_ms: 2_000,
            ..config
        });
        assert_eq!(report.jobs_ended, 4, "seed {seed}");
        let f = &report.fetches;
        totals.fetches += f.fetches;
        totals.failed += f.failed;
        totals.shared += f.shared;
        totals.attempts_failed += f.attempts_failed;
    }
    assert!(totals.fetches > 1_000, "only {totals:?}");
    assert!(totals.failed > 200, "only {totals:?}");
    assert!(totals.shared > 500, "only {totals:?}");
    assert!(totals.attempts_failed > 200, "only {totals:?}");
}

/// Fetches that always fail: each job that names objects ends FAILED, its reason the fetch's
/// error, and the others succeed; nothing hangs.
#[test]
fn a_job_whose_fetches_always_fail_ends_failed_saying_why() {
    for seed in 1..=5 {
        let report = passes(SimConfig {
            fetch_failure: 1.0,
            ..small(seed)
        });
        assert_eq!(report.jobs_ended, 4, "seed {seed}");
        assert_eq!(report.fetches.jobs_failed, 2, "seed {seed}: {report:?}");
        assert!(report.tasks_finished >= 150, "seed {seed}: {report:?}");
    }
}
