use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

/// An output of a test: something told to a client (or a listener), a client's answer, or
/// something told to an executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Out {
    Client(u32),
    Answer(u32),
    Executor(u32),
}

impl Addressed for Out {
    fn to_executor(&self) -> bool {
        matches!(self, Out::Executor(_))
    }

    fn awaited(&self) -> bool {
        matches!(self, Out::Answer(_))
    }
}

type Test = Outbox<Out, &'static str, Duration>;

fn at(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The records of a group, as the journal's message holds them.
fn text(group: Option<Group<&str>>) -> Option<(u64, String)> {
    group.map(|g| (g.write, g.records.join("\n")))
}

#[test]
fn outputs_leave_in_order_as_the_writes_before_them_are_stored() {
    let mut outbox = Test::default();
    let (none, first) = outbox.write(at(0));
    assert!(none.is_none());
    assert_eq!(outbox.send_or_hold(Out::Client(1)), None);
    let (_, second) = outbox.write(at(0));
    assert_eq!(outbox.send_or_hold(Out::Client(2)), None);
    assert_eq!(outbox.send_or_hold(Out::Client(3)), None);
    // The second write is stored first: nothing may leave before the first is.
    assert!(outbox.stored(second, None).is_empty());
    assert!(
        outbox.is_in_flight(second),
        "in flight until the first is stored"
    );
    assert_eq!(
        outbox.stored(first, None),
        [Out::Client(1), Out::Client(2), Out::Client(3)]
    );
    assert!(outbox.is_clear());
    assert_eq!(outbox.released_through(), 0, "no journal write");
}

#[test]
fn records_gather_into_one_group_while_a_write_is_in_flight() {
    let mut outbox = Test::default();
    assert_eq!(outbox.record("a", 1, false, 100, at(0)), None);
    assert_eq!(text(outbox.commit(at(0))), Some((1, "a".into())));
    assert_eq!(outbox.send_or_hold(Out::Client(1)), None);
    // The first group is in flight: these gather into the next.
    outbox.record("b", 1, false, 100, at(0));
    outbox.send_or_hold(Out::Client(2));
    outbox.record("c", 1, false, 100, at(0));
    assert_eq!(outbox.commit(at(5)), None, "no room");
    outbox.send_or_hold(Out::Client(3));
    assert_eq!(
        outbox.commit_due(),
        None,
        "it waits for the write, not for time"
    );
    assert_eq!(outbox.stored(1, Some(11)), [Out::Client(1)]);
    assert_eq!(outbox.released_through(), 11, "the first group's sequence");
    // Room again, and its time: the gathered group goes as one write, and both outputs
    // wait for it.
    assert_eq!(outbox.commit_due(), Some(GROUP_INTERVAL));
    assert_eq!(
        text(outbox.commit(GROUP_INTERVAL)),
        Some((2, "b\nc".into()))
    );
    assert_eq!(outbox.stored(2, Some(12)), [Out::Client(2), Out::Client(3)]);
    assert_eq!(outbox.released_through(), 12);
    assert!(outbox.is_clear());
}

#[test]
fn a_group_a_client_waits_for_does_not_wait_for_the_write_before_it() {
    let mut outbox = Test::default();
    outbox.record("a", 1, false, 100, at(0));
    assert_eq!(text(outbox.commit(at(0))), Some((1, "a".into())));
    outbox.record("b", 1, true, 100, at(0));
    outbox.send_or_hold(Out::Client(1));
    assert_eq!(
        text(outbox.commit(at(0))),
        Some((2, "b".into())),
        "a second write in flight"
    );
    outbox.record("c", 1, true, 100, at(0));
    assert_eq!(outbox.commit(at(0)), None, "but not a third");
    // Its answer still waits for both writes, in order.
    assert!(outbox.stored(2, Some(2)).is_empty());
    assert_eq!(outbox.released_through(), 0);
    assert_eq!(outbox.stored(1, Some(1)), [Out::Client(1)]);
    assert_eq!(outbox.released_through(), 2);
}

#[test]
fn a_full_group_is_sealed_at_once_and_the_record_starts_the_next() {
    let mut outbox = Test::default();
    assert_eq!(outbox.record("aaaa", 4, true, 9, at(0)), None);
    assert_eq!(
        outbox.record("bbbb", 4, true, 9, at(0)),
        None,
        "4 + 1 + 4 fits"
    );
    assert_eq!(
        text(outbox.record("cccc", 4, true, 9, at(0))),
        Some((1, "aaaa\nbbbb".into()))
    );
    assert_eq!(text(outbox.seal(at(0))), Some((2, "cccc".into())));
    assert_eq!(outbox.seal(at(0)), None);
}

#[test]
fn a_result_write_seals_the_gathering_group_first_to_keep_the_order() {
    let mut outbox = Test::default();
    outbox.record("a", 1, true, 100, at(0));
    outbox.send_or_hold(Out::Client(1));
    let (sealed, result) = outbox.write(at(0));
    assert_eq!(text(sealed), Some((1, "a".into())));
    assert_eq!(result, 2);
    outbox.send_or_hold(Out::Client(2));
    assert!(outbox.stored(result, None).is_empty());
    assert_eq!(outbox.stored(1, Some(7)), [Out::Client(1), Out::Client(2)]);
    // A result's write takes no journal sequence.
    assert_eq!(outbox.released_through(), 7);
}

#[test]
fn executors_messages_pass_the_journal_until_one_has_to_wait() {
    let mut outbox = Test::default();
    assert_eq!(
        outbox.send_or_hold(Out::Client(0)),
        Some(Out::Client(0)),
        "nothing in flight: anything leaves"
    );
    outbox.record("a", 1, true, 100, at(0));
    outbox.commit(at(0));
    assert_eq!(outbox.send_or_hold(Out::Client(1)), None, "a client waits");
    assert_eq!(
        outbox.send_or_hold(Out::Executor(1)),
        Some(Out::Executor(1))
    );
    // Once too much waits, an executor's message waits too, and those after it keep its
    // order even when the queue is short again.
    for n in 2..MAX_HELD as u32 + 1 {
        outbox.send_or_hold(Out::Client(n));
    }
    assert_eq!(outbox.held(), MAX_HELD);
    assert_eq!(outbox.send_or_hold(Out::Executor(2)), None);
    assert_eq!(outbox.stored(1, Some(1)).len(), MAX_HELD + 1);
    outbox.record("b", 1, true, 100, at(0));
    outbox.commit(at(0));
    assert_eq!(
        outbox.send_or_hold(Out::Executor(3)),
        Some(Out::Executor(3))
    );
    let mut small = Test::new(Limits {
        max_held: 1,
        ..Limits::default()
    });
    small.write(at(0));
    small.send_or_hold(Out::Client(1));
    assert_eq!(
        small.send_or_hold(Out::Executor(1)),
        None,
        "one is too many"
    );
    assert_eq!(small.held(), 2);
    assert_eq!(
        small.send_or_hold(Out::Executor(2)),
        None,
        "one is waiting: it keeps its place"
    );
    assert_eq!(
        small.stored(1, None),
        [Out::Client(1), Out::Executor(1), Out::Executor(2)]
    );
    assert_eq!(small.send_or_hold(Out::Executor(3)), Some(Out::Executor(3)));
}

#[test]
fn a_group_of_task_ends_alone_waits_for_company_and_an_urgent_one_does_not() {
    let mut outbox = Test::default();
    outbox.record("a", 1, false, 100, at(10));
    assert_eq!(
        outbox.commit_due(),
        None,
        "no write yet: nothing to wait from"
    );
    assert_eq!(
        text(outbox.commit(at(10))),
        Some((1, "a".into())),
        "the first write goes at once"
    );
    outbox.stored(1, Some(1));
    // The next group of task ends waits until GROUP_INTERVAL after the last write began.
    outbox.record("b", 1, false, 100, at(10));
    assert_eq!(outbox.commit(at(10)), None);
    assert_eq!(outbox.commit_due(), Some(at(10) + GROUP_INTERVAL));
    assert_eq!(outbox.commit(at(10) + GROUP_INTERVAL / 2), None);
    let due = at(10) + GROUP_INTERVAL;
    assert_eq!(text(outbox.commit(due)), Some((2, "b".into())));
    outbox.stored(2, Some(2));
    // A record a client waits for takes the group with it at once.
    outbox.record("c", 1, false, 100, due);
    outbox.record("d", 1, true, 100, due);
    assert_eq!(outbox.commit_due(), None);
    assert_eq!(text(outbox.commit(due)), Some((3, "c\nd".into())));
}

#[test]
fn an_answer_held_behind_a_group_of_task_ends_takes_it_at_once() {
    let mut outbox = Test::default();
    outbox.record("a", 1, false, 100, at(10));
    assert!(outbox.commit(at(10)).is_some());
    outbox.stored(1, Some(1));
    outbox.record("b", 1, false, 100, at(10));
    // An event may wait with the group for company...
    assert_eq!(outbox.send_or_hold(Out::Client(1)), None);
    assert_eq!(outbox.commit(at(10)), None);
    assert_eq!(outbox.commit_due(), Some(at(10) + GROUP_INTERVAL));
    // ...an answer may not: the group goes now, and the answer follows its storing in order.
    assert_eq!(outbox.send_or_hold(Out::Answer(2)), None);
    assert_eq!(outbox.commit_due(), None);
    assert_eq!(text(outbox.commit(at(10))), Some((2, "b".into())));
    assert_eq!(outbox.stored(2, Some(2)), [Out::Client(1), Out::Answer(2)]);
    // An answer held only behind a write in flight hurries no group: there is none.
    outbox.record("c", 1, true, 100, at(10));
    assert!(outbox.commit(at(10)).is_some());
    assert_eq!(outbox.send_or_hold(Out::Answer(3)), None);
    outbox.record("d", 1, false, 100, at(10));
    assert_eq!(
        outbox.commit_due(),
        None,
        "one write in flight: the group waits for it"
    );
    assert_eq!(outbox.stored(3, Some(3)), [Out::Answer(3)]);
    assert_eq!(outbox.commit_due(), Some(at(10) + GROUP_INTERVAL));
}

/// One step of a script the property tests run.
#[derive(Debug, Clone)]
enum Step {
    Record {
        urgent: bool,
        bytes: usize,
    },
    Result,
    Output {
        to_executor: bool,
    },
    /// A client's answer.
    Answer,
    Commit,
    Seal,
    /// Time passes.
    Wait(u64),
    /// The `n`-th (modulo) write in flight not yet stored is stored.
    Store(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (any::<bool>(), 0..8usize).prop_map(|(urgent, bytes)| Step::Record { urgent, bytes }),
        1 => Just(Step::Result),
        4 => any::<bool>().prop_map(|to_executor| Step::Output { to_executor }),
        1 => Just(Step::Answer),
        3 => Just(Step::Commit),
        1 => Just(Step::Seal),
        2 => (0..3u64).prop_map(Step::Wait),
        4 => any::<usize>().prop_map(Step::Store),
    ]
}

/// A script run against the outbox, with what the rules promise checked as it goes.
struct Run {
    outbox: Outbox<Out, usize, Duration>,
    now: Duration,
    /// Whether a group gathers, and the number of the last write started or gathering.
    gathering: bool,
    writes: u64,
    /// Writes started and not yet stored, and those stored.
    started: Vec<u64>,
    stored: BTreeSet<u64>,
    /// Group writes (they take a journal sequence: their number plus 100).
    groups: BTreeSet<u64>,
    /// For each output, by its number: the last write before it.
    behind: Vec<u64>,
    /// The outputs as they left, and whether each was held first.
    sent: Vec<(Out, bool)>,
}

impl Run {
    fn new(limits: Limits) -> Self {
        Self {
            outbox: Outbox::new(limits),
            now: Duration::ZERO,
            gathering: false,
            writes: 0,
            started: Vec::new(),
            stored: BTreeSet::new(),
            groups: BTreeSet::new(),
            behind: Vec::new(),
            sent: Vec::new(),
        }
    }

    fn started(&mut self, group: Option<Group<usize>>) {
        if let Some(group) = group {
            assert!(!group.records.is_empty());
            self.started.push(group.write);
            self.groups.insert(group.write);
        }
    }

    fn step(&mut self, step: Step) {
        let now = self.now;
        match step {
            Step::Record { urgent, bytes } => {
                let sealed = self.outbox.record(0, bytes, urgent, 12, now);
                if !self.gathering || sealed.is_some() {
                    self.writes += 1;
                }
                self.gathering = true;
                self.started(sealed);
            }
            Step::Result => {
                let (sealed, write) = self.outbox.write(now);
                self.gathering = false;
                self.started(sealed);
                self.writes += 1;
                assert_eq!(write, self.writes, "writes are numbered in order");
                self.started.push(write);
            }
            Step::Output { to_executor } => {
                let n = self.behind.len() as u32;
                let output = match to_executor {
                    true => Out::Executor(n),
                    false => Out::Client(n),
                };
                self.behind.push(self.writes);
                if let Some(output) = self.outbox.send_or_hold(output) {
                    self.sent(output, false);
                }
            }
            Step::Answer => {
                let n = self.behind.len() as u32;
                self.behind.push(self.writes);
                match self.outbox.send_or_hold(Out::Answer(n)) {
                    Some(output) => self.sent(output, false),
                    // Held behind a group gathering: the group waits for room, not for time.
                    None => assert!(
                        !self.gathering || self.outbox.commit_due().is_none(),
                        "a group an answer waits behind waits for company"
                    ),
                }
            }
            Step::Commit => {
                let in_flight = self.started.len() + self.in_flight_stored();
                let group = self.outbox.commit(now);
                if group.is_some() {
                    assert!(in_flight < URGENT_IN_FLIGHT, "no room for a group");
                    self.gathering = false;
                }
                self.started(group);
            }
            Step::Seal => {
                let group = self.outbox.seal(now);
                self.gathering &= group.is_none();
                self.started(group);
            }
            Step::Wait(ms) => self.now += at(ms),
            Step::Store(n) => self.store(n),
        }
    }

    /// Writes stored but still counted in flight, behind one that is not stored.
    fn in_flight_stored(&self) -> usize {
        let oldest = self.started.iter().min();
        oldest.map_or(0, |&o| self.stored.iter().filter(|&&s| s > o).count())
    }

    fn store(&mut self, n: usize) {
        if self.started.is_empty() {
            return;
        }
        let write = self.started.remove(n % self.started.len());
        self.stored.insert(write);
        let sequence = self.groups.contains(&write).then_some(write + 100);
        let before = self.outbox.released_through();
        for output in self.outbox.stored(write, sequence) {
            self.sent(output, true);
        }
        let through = self.outbox.released_through();
        assert!(through >= before, "released_through goes back");
        if through > 0 {
            let last = through - 100;
            assert!((1..=last).all(|w| self.stored.contains(&w)));
        }
    }

    fn sent(&mut self, output: Out, held: bool) {
        let (Out::Client(n) | Out::Answer(n) | Out::Executor(n)) = output;
        let behind = self.behind[n as usize];
        if !output.to_executor() || held {
            // Told only once every write before it is stored.
            for write in 1..=behind {
                assert!(
                    self.stored.contains(&write),
                    "{output:?} left before write {write} was stored"
                );
            }
        }
        self.sent.push((output, held));
    }

    /// Stores everything, as the journal eventually does, and checks that all has left, in
    /// order.
    fn finish(mut self) {
        self.step(Step::Seal);
        while !self.started.is_empty() {
            let last = self.started.len() - 1;
            self.store(last);
        }
        assert!(self.outbox.is_clear());
        assert_eq!(self.outbox.held(), 0);
        assert_eq!(self.sent.len(), self.behind.len(), "everything left");
        let number = |o: &Out| match *o {
            Out::Client(n) | Out::Answer(n) | Out::Executor(n) => n,
        };
        for (i, (later, later_held)) in self.sent.iter().enumerate() {
            for (earlier, _) in &self.sent[i + 1..] {
                if number(earlier) < number(later) {
                    // Only an executor's message that left at once passes one before it,
                    // and never another executor's message.
                    assert!(
                        later.to_executor() && !later_held && !earlier.to_executor(),
                        "{later:?} left before {earlier:?}"
                    );
                }
            }
        }
    }
}

proptest! {
    #[test]
    fn nothing_is_told_before_the_writes_before_it_are_stored(
        steps in prop::collection::vec(step(), 0..200),
        max_held in 1..6usize,
    ) {
        let mut run = Run::new(Limits { max_held, ..Limits::default() });
        for step in steps {
            run.step(step);
        }
        run.finish();
    }

    #[test]
    fn with_the_drivers_limits_too(steps in prop::collection::vec(step(), 0..200)) {
        let mut run = Run::new(Limits::default());
        for step in steps {
            run.step(step);
        }
        run.finish();
    }
}
