//! One script fed to the driver's outbox as its actor runs it (`Outgoing`, the journal's
//! writes as futures that end when the script says) and to the simulator's: the same
//! groups written, with the same records, and the same outputs leaving, step by step.

use super::*;
use crate::driver::core::Effect;
use crate::driver::outbox::Output as DriverOutput;
use crate::driver::outgoing::{self, Outgoing};
use crate::protocol::{Event, JobState};
use futures::FutureExt;
use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

#[derive(Debug, Clone)]
enum Step {
    /// A job ends (`urgent`), or a task ends.
    Record {
        urgent: bool,
    },
    /// An event, told once what comes before it is stored.
    Event,
    /// A message to an executor.
    Executor,
    Wait(u64),
    /// The `n`-th (modulo) group write in flight not yet stored is stored.
    Store(usize),
}

fn record(n: u64, urgent: bool) -> JournalRecord {
    match urgent {
        true => JournalRecord::JobEnded {
            job_id: n,
            state: JobState::Succeeded,
            time_ms: n,
            reason: None,
        },
        false => JournalRecord::TasksEnded {
            time_ms: n,
            tasks: Vec::new(),
            term: 0,
        },
    }
}

fn job_start(n: u64) -> Event {
    Event::JobStart {
        time_ms: 0,
        job_id: n,
        name: String::new(),
        tasks: 1,
    }
}

fn name(output: &Output) -> String {
    match output {
        Output::Publish(Event::JobStart { job_id, .. }) => format!("e{job_id}"),
        Output::Inbox { to, .. } => format!("x{to}"),
        other => format!("{other:?}"),
    }
}

fn driver_name(output: &DriverOutput) -> String {
    match output {
        DriverOutput::Effect(Effect::Publish(Event::JobStart { job_id, .. })) => {
            format!("e{job_id}")
        }
        DriverOutput::ExecutorReply(subject, _) => subject.to_string(),
        _ => "other".into(),
    }
}

/// The journal as the driver's test sees it: each group written, and the gate that
/// stores it at its sequence.
type Journal = Arc<Mutex<Vec<(bytes::Bytes, Option<oneshot::Sender<()>>)>>>;

fn store(journal: &Journal) -> impl FnOnce(bytes::Bytes) -> outgoing::Write + '_ {
    |group| {
        let (open, opened) = oneshot::channel::<()>();
        let mut groups = journal.lock().unwrap();
        groups.push((group, Some(open)));
        let sequence = groups.len() as u64;
        Box::pin(async move { opened.await.ok().map(|()| sequence) })
    }
}

/// Both users of the outbox, fed the same steps.
struct Both {
    driver: Outgoing,
    journal: Journal,
    start: tokio::time::Instant,
    sim: Writes,
    now: u64,
    /// The simulator's group writes, in the order they started.
    sim_groups: Vec<Write>,
    stored: Vec<bool>,
    driver_sent: Vec<String>,
    sim_sent: Vec<String>,
    n: u64,
    /// How many outputs were given to each.
    outputs: usize,
}

impl Both {
    fn new() -> Self {
        Self {
            driver: Outgoing::default(),
            journal: Journal::default(),
            start: tokio::time::Instant::now(),
            sim: Writes::new(0, crate::sim::SimConfig::default().max_held),
            now: 0,
            sim_groups: Vec::new(),
            stored: Vec::new(),
            driver_sent: Vec::new(),
            sim_sent: Vec::new(),
            n: 0,
            outputs: 0,
        }
    }

    fn started(&mut self, write: Option<Write>) {
        self.sim_groups.extend(write);
    }

    async fn step(&mut self, step: Step) {
        self.n += 1;
        let n = self.n;
        match step {
            Step::Record { urgent } => {
                let record = record(n, urgent);
                let (bytes, urgent) = (crate::protocol::encode(&record), outbox::urgent(&record));
                self.driver
                    .record(bytes, urgent, MAX_BYTES, store(&self.journal));
                let write = self.sim.record(record, self.now);
                self.started(write);
            }
            Step::Event => {
                self.outputs += 1;
                let output = DriverOutput::Effect(Effect::Publish(job_start(n)));
                if let Some(output) = self.driver.send_or_hold(output) {
                    self.driver_sent.push(driver_name(&output));
                }
                if let Some(output) = self.sim.send_or_hold(Output::Publish(job_start(n))) {
                    self.sim_sent.push(name(&output));
                }
            }
            Step::Executor => {
                self.outputs += 1;
                let output =
                    DriverOutput::ExecutorReply(format!("x{n}").into(), Default::default());
                if let Some(output) = self.driver.send_or_hold(output) {
                    self.driver_sent.push(driver_name(&output));
                }
                let output = Output::Inbox {
                    to: n as Pid,
                    body: ExecutorMessage::StopExecutor {
                        reason: String::new(),
                    },
                };
                if let Some(output) = self.sim.send_or_hold(output) {
                    self.sim_sent.push(name(&output));
                }
            }
            Step::Wait(ms) => {
                tokio::time::advance(Duration::from_millis(ms)).await;
                self.now += ms;
            }
            Step::Store(k) => self.store(k),
        }
        // After every step, as the actor's loop and the simulator's driver do.
        self.driver.commit(store(&self.journal));
        let write = self.sim.commit(self.now);
        self.started(write);
        self.compare();
    }

    fn store(&mut self, k: usize) {
        self.stored.resize(self.sim_groups.len(), false);
        let waiting: Vec<usize> = (0..self.stored.len())
            .filter(|&i| !self.stored[i])
            .collect();
        if waiting.is_empty() {
            return;
        }
        let i = waiting[k % waiting.len()];
        self.stored[i] = true;
        let open = self.journal.lock().unwrap()[i].1.take();
        open.expect("a gate for each group").send(()).unwrap();
        while let Some(released) = self.driver.released().now_or_never() {
            self.driver_sent.extend(released.iter().map(driver_name));
        }
        let released = self.sim.stored(self.sim_groups[i].write, i as u64 + 1);
        self.sim_sent.extend(released.iter().map(name));
    }

    fn compare(&self) {
        let driver_groups: Vec<bytes::Bytes> = self
            .journal
            .lock()
            .unwrap()
            .iter()
            .map(|(g, _)| g.clone())
            .collect();
        let sim_groups: Vec<bytes::Bytes> = self
            .sim_groups
            .iter()
            .map(|w| {
                let lines: Vec<_> = w.records.iter().map(crate::protocol::encode).collect();
                lines.join(&b"\n"[..]).into()
            })
            .collect();
        assert_eq!(driver_groups, sim_groups, "the same groups written");
        assert_eq!(self.driver_sent, self.sim_sent, "the same outputs sent");
        let driver_due = self.driver.commit_due().map(|due| due - self.start);
        let sim_due = self.sim.commit_due().map(Duration::from_millis);
        assert_eq!(driver_due, sim_due, "the same wait for company");
    }
}

/// How long a group of task ends alone waits for company, in the simulator's milliseconds.
const GROUP_MS: u64 = crate::driver::outbox::GROUP_INTERVAL.as_millis() as u64;

async fn run(steps: Vec<Step>) -> Both {
    let mut both = Both::new();
    for step in steps {
        both.step(step).await;
    }
    both
}

#[tokio::test(start_paused = true)]
async fn the_driver_and_the_simulator_run_one_outbox() {
    use Step::*;
    let both = run(vec![
        Record { urgent: false },
        Event,
        Executor,
        // A second group gathers behind the first, and a job's end sends it beside it.
        Record { urgent: false },
        Event,
        Record { urgent: true },
        Executor,
        Record { urgent: false },
        Event,
        // The second is stored first: nothing leaves before the first is.
        Store(1),
        Store(0),
        // Task ends alone wait for company, then go.
        Wait(GROUP_MS),
        Record { urgent: false },
        Event,
        Store(0),
        Wait(GROUP_MS),
        Store(0),
        Executor,
    ])
    .await;
    assert_eq!(both.sim_groups.len(), 4);
    assert_eq!(
        both.sim_sent,
        ["x3", "x7", "e2", "e5", "e9", "e14", "x18"],
        "executors' messages at once, events once stored"
    );
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => any::<bool>().prop_map(|urgent| Step::Record { urgent }),
        3 => Just(Step::Event),
        2 => Just(Step::Executor),
        2 => (0..3u64).prop_map(Step::Wait),
        4 => any::<usize>().prop_map(Step::Store),
    ]
}

proptest! {
    #[test]
    fn any_script_gives_the_same_writes_and_outputs_to_both(
        steps in prop::collection::vec(step(), 0..120),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut both = run(steps).await;
            // Everything stored in the end (a group gathering goes once its time has come):
            // everything has left, on both sides.
            loop {
                both.step(Step::Wait(GROUP_MS)).await;
                let started = both.sim_groups.len();
                if both.stored.len() == started && both.stored.iter().all(|s| *s) {
                    break;
                }
                both.step(Step::Store(0)).await;
            }
            assert_eq!(both.sim_sent.len(), both.outputs, "everything has left");
        });
    }
}
