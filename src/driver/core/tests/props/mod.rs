//! Property tests: random sequences of registrations, submissions, status updates (right and
//! wrong), repeats, kills and ticks keep the invariants after every request, and once every
//! attempt has run out, every task has ended exactly once and the events say so.

mod apply;
mod check;

use super::*;
use proptest::prelude::*;

/// Who sends a status for a running attempt.
#[derive(Debug, Clone)]
enum Sender {
    /// The executor it runs on.
    Right,
    /// Another registered executor (the `usize` picks which).
    Other(usize),
    /// An executor that never registered.
    Unregistered,
    /// The right executor, on another executor's subject.
    WrongSubject,
    /// The right executor, naming an attempt that was never launched.
    WrongAttempt,
    /// The right executor, naming a task no job has.
    UnknownTask,
}

#[derive(Debug, Clone)]
enum Op {
    Register {
        cores: u32,
        /// GPUs it offers beside its cores (none, mostly).
        gpus: u32,
    },
    /// The same process registers again.
    Retry {
        pick: usize,
    },
    /// Another process claims a registered id.
    Impostor {
        pick: usize,
    },
    Submit {
        tasks: u32,
        cpus: u32,
        max_failures: u32,
        /// GPUs each task asks for (none, mostly).
        gpus: u32,
    },
    Status {
        pick: usize,
        state: TaskState,
        sender: Sender,
    },
    /// One batch of terminal statuses from one executor, for attempts running there (some
    /// named twice).
    Batch {
        executor: usize,
        picks: Vec<(usize, TaskState)>,
    },
    /// An accepted status is delivered again.
    Repeat {
        pick: usize,
    },
    Kill {
        pick: usize,
    },
    /// `KillJobTask` for task `index` of a job (past its tasks, sometimes).
    KillTask {
        pick: usize,
        index: usize,
        retry: bool,
    },
    Tick,
}

fn terminal_state() -> impl Strategy<Value = TaskState> {
    prop_oneof![
        4 => Just(TaskState::Finished),
        3 => Just(TaskState::Failed),
        1 => Just(TaskState::Killed),
        1 => Just(TaskState::Lost),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let state = prop_oneof![
        9 => terminal_state(),
        1 => Just(TaskState::Running),
    ];
    let sender = prop_oneof![
        8 => Just(Sender::Right),
        1 => any::<usize>().prop_map(Sender::Other),
        1 => Just(Sender::Unregistered),
        1 => Just(Sender::WrongSubject),
        1 => Just(Sender::WrongAttempt),
        1 => Just(Sender::UnknownTask),
    ];
    let batch = (
        any::<usize>(),
        prop::collection::vec((any::<usize>(), terminal_state()), 1..6),
    )
        .prop_map(|(executor, picks)| Op::Batch { executor, picks });
    prop_oneof![
        2 => (1u32..=6, prop_oneof![3 => Just(0u32), 1 => 1u32..=2])
            .prop_map(|(cores, gpus)| Op::Register { cores, gpus }),
        2 => batch,
        1 => any::<usize>().prop_map(|pick| Op::Retry { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Impostor { pick }),
        3 => (1u32..=8, 1u32..=3, 1u32..=4, prop_oneof![3 => Just(0u32), 1 => Just(1u32)])
            .prop_map(|(tasks, cpus, max_failures, gpus)| {
                Op::Submit { tasks, cpus, max_failures, gpus }
            }),
        10 => (any::<usize>(), state, sender)
            .prop_map(|(pick, state, sender)| Op::Status { pick, state, sender }),
        2 => any::<usize>().prop_map(|pick| Op::Repeat { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Kill { pick }),
        2 => (any::<usize>(), any::<usize>(), prop::bool::weighted(0.3))
            .prop_map(|(pick, index, retry)| Op::KillTask { pick, index, retry }),
        2 => Just(Op::Tick),
    ]
}

/// A core driven by random operations, with everything it sent.
struct Sim {
    core: Core,
    now: u64,
    /// Registered executors and their cores.
    executors: Vec<(String, u32)>,
    /// The GPUs of those that have some.
    gpus: BTreeMap<String, u32>,
    /// Terminal statuses that were accepted, for delivering again.
    accepted: Vec<(String, StatusUpdate)>,
    log: Vec<Effect>,
    /// The journal records emitted, apart from the other effects.
    journal: Vec<JournalRecord>,
    /// Snapshots taken along the way: where in the journal, and the snapshot.
    snapshots: Vec<(usize, JournalRecord)>,
}

impl Sim {
    fn new() -> Self {
        Self::retaining(crate::driver::core::DEFAULT_RETAIN_JOBS as usize)
    }

    /// A cluster whose driver keeps `jobs` finished jobs.
    fn retaining(jobs: usize) -> Self {
        let mut core = journaled_core(3);
        core.config.retention.jobs = jobs;
        // Some jobs name `k1`, which runs two at once at most, or `k2`, which has no limits.
        let limits = crate::protocol::KeyLimits {
            max_concurrent: Some(2),
            rate: None,
        };
        let request = ApiRequest::SetKeyLimits {
            key: "k1".into(),
            limits,
        };
        assert!(matches!(core.api(request, 0), ApiReply::Keys { .. }));
        let mut journal = Vec::new();
        take_journal(&mut core, &mut journal);
        Self {
            core,
            now: 1_000,
            executors: Vec::new(),
            gpus: BTreeMap::new(),
            accepted: Vec::new(),
            log: Vec::new(),
            journal,
            snapshots: Vec::new(),
        }
    }

    /// Takes the effects of the last request (journal records aside), checks them and logs
    /// them.
    fn effects(&mut self) -> Vec<Effect> {
        let effects = take_journal(&mut self.core, &mut self.journal);
        check_effects(&self.core, &effects);
        self.log.extend(effects.iter().cloned());
        effects
    }

    /// Runs `f`, which must change nothing and send nothing.
    fn unchanged<T>(&mut self, f: impl FnOnce(&mut Core) -> T) -> T {
        unchanged(&mut self.core, f)
    }

    /// Sends `updates` from `from` on `subject`'s subject.
    fn send(&mut self, subject: &str, from: &str, updates: Vec<StatusUpdate>) -> StatusReply {
        send_status(&mut self.core, subject, from, updates, self.now)
    }

    fn tick(&mut self) {
        self.core.tick(self.now);
        self.effects();
    }

    fn register(&mut self, name: String, cores: u32) {
        self.register_with(name, cores, 0);
    }

    /// Registers `name` with `cores` and `gpus` GPUs (addresses 0 to `gpus - 1`).
    fn register_with(&mut self, name: String, cores: u32, gpus: u32) {
        let before = self.core.executors_snapshot();
        let mut request = with_gang_ports(registration(&name, cores));
        let rack = format!("r{}", rack(self.executors.len(), &name));
        request.attributes = [("rack".to_string(), rack)].into();
        if gpus > 0 {
            let addresses = (0..gpus).map(|i| i.to_string()).collect();
            request.resources.insert("gpu".to_string(), addresses);
            self.gpus.insert(name.clone(), gpus);
        }
        let reply = self.core.register(&name, request, self.now);
        assert_eq!(reply, registered(&name));
        let effects = self.effects();
        assert!(matches!(
            &effects[0],
            Effect::Publish(Event::ExecutorAdded { executor_id, info, .. })
                if executor_id.as_str() == name && info.total_cores == cores
        ));
        let after = self.core.executors_snapshot();
        assert_eq!(after.total_cores, before.total_cores + u64::from(cores));
        assert_eq!(after.registered_executors, before.registered_executors + 1);
        assert_eq!(
            after.pending_executors,
            before.pending_executors.saturating_sub(1)
        );
        self.executors.push((name, cores));
    }
}

/// The rack of the executor registered `index`th as `name`: r0 and r1 by turns, for the jobs
/// that ask for r0; the large executor that drains what waits is on r0.
fn rack(index: usize, name: &str) -> usize {
    match name {
        "drain" => 0,
        _ => index % 2,
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_operations_keep_the_invariants(ops in prop::collection::vec(op(), 1..80)) {
        let mut sim = Sim::new();
        for op in &ops {
            sim.apply(op);
        }
        sim.drain();
        sim.check_final();
        sim.check_replay();
    }

    #[test]
    fn forgetting_finished_jobs_keeps_the_invariants(
        keep in 1usize..=3,
        ops in prop::collection::vec(op(), 20..120),
    ) {
        let mut sim = Sim::retaining(keep);
        sim.register("e0".into(), 2);
        sim.register("e1".into(), 3);
        for op in &ops {
            sim.apply(op);
        }
        sim.drain();
        sim.check_final();
        sim.check_replay();
    }

    #[test]
    fn fair_pools_keep_the_invariants(
        cores in prop::collection::vec(1u32..=4, 0..4),
        ops in prop::collection::vec(op(), 20..120),
    ) {
        let mut sim = Sim::new();
        let pools = ["p0:weight=1,min-share=2", "p1:weight=3,mode=fair"]
            .map(|p| crate::driver::core::PoolConfig::parse(p).unwrap());
        sim.core.set_scheduling(crate::driver::core::Scheduling {
            mode: crate::driver::core::SchedulingMode::Fair,
            pools: pools.to_vec(),
        });
        for (i, c) in cores.iter().enumerate() {
            sim.register(format!("e{i}"), *c);
        }
        for op in &ops {
            sim.apply(op);
        }
        sim.drain();
        sim.check_final();
        sim.check_replay();
    }

    #[test]
    fn busy_clusters_keep_the_invariants(
        cores in prop::collection::vec(1u32..=4, 1..5),
        ops in prop::collection::vec(op(), 20..120),
    ) {
        // Executors first, so most operations find work running.
        let mut sim = Sim::new();
        for (i, c) in cores.iter().enumerate() {
            sim.register(format!("e{i}"), *c);
        }
        for op in &ops {
            sim.apply(op);
        }
        sim.drain();
        sim.check_final();
        sim.check_replay();
    }
}

/// `request` with a gang port for each of its cores, as `ember-executor` reserves by default.
fn with_gang_ports(mut request: RegisterExecutor) -> RegisterExecutor {
    let ports = (0..request.cores)
        .map(|i| (41_000 + i).to_string())
        .collect();
    request
        .resources
        .insert(crate::resources::GANG_PORT.to_string(), ports);
    request
}
