//! What the driver sends, held behind journal writes. What a record makes true is told to no
//! one before the record is stored: a step's answers to clients and its events wait, in order,
//! behind the writes before them, and leave when those are acknowledged.
//!
//! What goes to executors (status acknowledgements, launches, kills, heartbeat and
//! registration answers) need not wait: an executor is told nothing by them that a restarted
//! driver would have to remember. Should the driver die before a record is stored, the next
//! driver has another instance id, and an executor that registers with it drops the old
//! driver's attempts and statuses whether they were acknowledged or not, so the tasks run
//! again either way. Such messages leave at once, unless one is already waiting (they keep
//! their order) or too much waits behind the journal: then they wait too, and the executors,
//! getting no new tasks, slow down to what the journal stores.
//!
//! Records are stored in groups (group commit): while a group write is in flight, the records
//! of the steps that follow gather into the next group, which is written, one message of
//! records one per line, as soon as the write before it is stored (or once it is full). A
//! group of task ends alone also waits until `GROUP_INTERVAL` after the last write started,
//! so that a loop of one task at a time does not cost the broker a write per task; what waits
//! for it then is task events, which wait that long for company anyway. A group with any other
//! record (a job submitted or ended, which a client waits for) goes at once, even beside a
//! write in flight (what follows it still waits for both, in order).

use super::core::Effect;
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// How many group writes may be in flight before the next group waits for one to be stored.
/// One: the records of the steps that follow gather into the next group meanwhile, so the
/// journal costs the broker one write per round trip of its own, however fast the loop runs.
const GROUPS_IN_FLIGHT: usize = 1;

/// How many writes may be in flight before an urgent group waits: one that a client waits for
/// (a job's end, say) need not wait for the write before it to be stored.
const URGENT_IN_FLIGHT: usize = 2;

/// How long after the last write started a group of task ends alone waits for more.
pub const GROUP_INTERVAL: Duration = Duration::from_millis(1);

/// How many outputs may wait behind the journal before executors' messages wait too.
const MAX_HELD: usize = 8192;

/// A group write of the journal: it gives the sequence it took, if the driver leads.
pub type Write = BoxFuture<'static, Option<u64>>;

/// An api request taken from the driver's NATS service endpoint, to be answered through it so
/// that `$SRV.STATS` counts it.
pub type ReplyTo = Box<async_nats::service::Request>;

/// One thing to send.
pub enum Output {
    /// The answer to a client's request: (where it goes, payload).
    Reply(ReplyTo, bytes::Bytes),
    /// The answer to an executor's request: (reply subject, payload).
    ExecutorReply(async_nats::Subject, bytes::Bytes),
    /// An event or an executor's message.
    Effect(Effect),
    /// A page of results to read from the results bucket (`indices`) before it is sent.
    Results {
        reply: ReplyTo,
        page: crate::protocol::ResultsPage,
        indices: Vec<u32>,
    },
    /// A `ResultChunk` answer whose data is read from the results bucket (`key`) before it is
    /// sent.
    Chunk {
        reply: ReplyTo,
        answer: crate::protocol::ApiReply,
        key: String,
    },
}

impl Output {
    /// Whether it goes to an executor, and so need not wait for the journal.
    fn is_for_executor(&self) -> bool {
        matches!(
            self,
            Output::ExecutorReply(..) | Output::Effect(Effect::Send { .. })
        )
    }
}

// Held outputs are the common case: boxing each would cost an allocation per message.
#[allow(clippy::large_enum_variant)]
enum Held {
    /// Where a journal write sits in the order.
    Write,
    Output(Output),
}

/// Outputs waiting for the journal writes before them.
#[derive(Default)]
pub struct Outbox {
    held: VecDeque<Held>,
    /// Executors' messages among the held outputs.
    held_for_executors: usize,
    /// Outputs among `held`.
    held_outputs: usize,
    /// Each gives the journal sequence it took, if it is a journal write of a leader.
    writes: FuturesOrdered<BoxFuture<'static, Option<u64>>>,
    /// The sequence of the last journal write whose outputs were released.
    released_through: u64,
    /// The records gathering for the next group write, one per line, if any; its place in the
    /// order is the last `Held::Write`, which has no write in `writes` yet.
    group: Option<Vec<u8>>,
    /// Whether the group holds a record someone waits for, so it goes without waiting.
    urgent: bool,
    /// When the last group write started.
    last_started: Option<Instant>,
}

impl Outbox {
    /// Whether no write is in flight or gathering, so any output may leave at once.
    pub fn is_clear(&self) -> bool {
        self.writes.is_empty() && self.group.is_none()
    }

    /// Whether `output` may leave now rather than wait its turn.
    pub fn may_send(&self, output: &Output) -> bool {
        self.is_clear()
            || (output.is_for_executor()
                && self.held_for_executors == 0
                && self.held_outputs < MAX_HELD)
    }

    /// Queues a write that is not a journal record (a result for the results bucket): every
    /// output queued after it waits for it. The group gathering is written first, to keep the
    /// writes in their order.
    pub fn write(
        &mut self,
        write: BoxFuture<'static, ()>,
        store: impl FnOnce(bytes::Bytes) -> Write,
    ) {
        self.seal(store);
        self.held.push_back(Held::Write);
        self.writes.push_back(Box::pin(async move {
            write.await;
            None
        }));
    }

    /// Adds one encoded journal record (at most `max_bytes`) to the group gathering; a group
    /// it would make larger than `max_bytes` is written first. An `urgent` record is one a
    /// client waits for: its group goes without waiting for more.
    pub fn record(
        &mut self,
        record: &[u8],
        urgent: bool,
        max_bytes: usize,
        store: impl FnOnce(bytes::Bytes) -> Write,
    ) {
        if self
            .group
            .as_ref()
            .is_some_and(|group| group.len() + 1 + record.len() > max_bytes)
        {
            self.seal(store);
        }
        match &mut self.group {
            Some(group) => {
                group.push(b'\n');
                group.extend_from_slice(record);
            }
            None => {
                self.held.push_back(Held::Write);
                self.group = Some(record.to_vec());
            }
        }
        self.urgent |= urgent;
    }

    /// Writes the group gathering if the writes in flight leave room for it (more room for an
    /// urgent one), and it is urgent or `GROUP_INTERVAL` has passed since the last write
    /// started.
    pub fn commit(&mut self, store: impl FnOnce(bytes::Bytes) -> Write) {
        let room = match self.urgent {
            true => URGENT_IN_FLIGHT,
            false => GROUPS_IN_FLIGHT,
        };
        if self.group.is_none() || self.writes.len() >= room {
            return;
        }
        if self.urgent || self.commit_due().map_or(true, |due| Instant::now() >= due) {
            self.seal(store);
        }
    }

    /// When the group gathering is due to be written, if it waits only for time to pass.
    pub fn commit_due(&self) -> Option<Instant> {
        let waits = self.group.is_some() && self.writes.len() < GROUPS_IN_FLIGHT && !self.urgent;
        waits.then_some(self.last_started?.checked_add(GROUP_INTERVAL)?)
    }

    /// Writes the group gathering now, if there is one.
    pub fn seal(&mut self, store: impl FnOnce(bytes::Bytes) -> Write) {
        if let Some(group) = self.group.take() {
            self.urgent = false;
            self.last_started = Some(Instant::now());
            self.writes.push_back(store(group.into()));
        }
    }

    /// Queues an output behind the writes in flight.
    pub fn hold(&mut self, output: Output) {
        self.held_outputs += 1;
        self.held_for_executors += usize::from(output.is_for_executor());
        self.held.push_back(Held::Output(output));
    }

    /// The journal sequence of the last group write whose outputs [`Outbox::released`] gave
    /// (0 before any): every output held behind it, and behind the writes before it, has left.
    pub fn released_through(&self) -> u64 {
        self.released_through
    }

    /// Waits for the oldest write to be stored and returns the outputs it released, in
    /// order. Never completes while no write is in flight. Cancel-safe.
    pub async fn released(&mut self) -> Vec<Output> {
        match self.writes.next().await {
            None => return std::future::pending().await,
            Some(Some(sequence)) => self.released_through = sequence,
            Some(None) => {}
        }
        debug_assert!(matches!(self.held.front(), Some(Held::Write)));
        self.held.pop_front();
        let mut released = Vec::new();
        while let Some(Held::Output(_)) = self.held.front() {
            if let Some(Held::Output(output)) = self.held.pop_front() {
                self.held_outputs -= 1;
                self.held_for_executors -= usize::from(output.is_for_executor());
                released.push(output);
            }
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ExecutorId;
    use crate::protocol::{Event, ExecutorMessage, JobState};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tokio::sync::oneshot;

    /// Something told to clients, named `r<n>` (an event; an api answer waits the same way).
    fn reply(n: u8) -> Output {
        Output::Effect(Effect::Publish(Event::JobStart {
            time_ms: 0,
            job_id: u64::from(n),
            name: format!("r{n}"),
            tasks: 1,
        }))
    }

    fn to_executor(n: u8) -> Output {
        Output::ExecutorReply(format!("x{n}").into(), bytes::Bytes::new())
    }

    fn job_end() -> Output {
        Output::Effect(Effect::Publish(Event::JobEnd {
            time_ms: 0,
            job_id: 1,
            state: JobState::Succeeded,
            succeeded: 1,
            failed: 0,
            killed: 0,
            reason: None,
        }))
    }

    fn names(outputs: &[Output]) -> Vec<String> {
        outputs
            .iter()
            .map(|o| match o {
                Output::ExecutorReply(subject, _) => subject.to_string(),
                Output::Reply(..) => "reply".into(),
                Output::Effect(Effect::Publish(Event::JobStart { name, .. })) => name.clone(),
                Output::Effect(_) => "effect".into(),
                Output::Results { .. } => "results".into(),
                Output::Chunk { .. } => "chunk".into(),
            })
            .collect()
    }

    fn gate() -> (oneshot::Sender<()>, BoxFuture<'static, ()>) {
        let (open, opened) = oneshot::channel();
        (open, Box::pin(async move { opened.await.unwrap() }))
    }

    /// A journal that records each group it is given and stores it when its gate opens.
    /// Each group written, with the gate that stores it.
    type Groups = Arc<Mutex<Vec<(bytes::Bytes, Option<oneshot::Sender<()>>)>>>;

    #[derive(Default, Clone)]
    struct Journal {
        groups: Groups,
    }

    impl Journal {
        /// Stores groups as a journal of a leader would: the n-th takes sequence n.
        fn store(&self) -> impl FnOnce(bytes::Bytes) -> Write + '_ {
            |group| {
                let (open, write) = gate();
                let mut groups = self.groups.lock().unwrap();
                groups.push((group, Some(open)));
                let sequence = groups.len() as u64;
                Box::pin(async move {
                    write.await;
                    Some(sequence)
                })
            }
        }

        fn groups(&self) -> Vec<String> {
            let groups = self.groups.lock().unwrap();
            let text = |g: &bytes::Bytes| String::from_utf8(g.to_vec()).unwrap();
            groups.iter().map(|(g, _)| text(g)).collect()
        }

        fn open(&self, n: usize) {
            let open = self.groups.lock().unwrap()[n].1.take();
            open.unwrap().send(()).unwrap();
        }
    }

    #[tokio::test]
    async fn outputs_leave_in_order_as_the_writes_before_them_are_stored() {
        let mut outbox = Outbox::default();
        let journal = Journal::default();
        let (first, write) = gate();
        outbox.write(write, journal.store());
        outbox.hold(reply(1));
        let (second, write) = gate();
        outbox.write(write, journal.store());
        outbox.hold(reply(2));
        outbox.hold(job_end());
        // The second write is stored first: nothing may leave before the first is.
        second.send(()).unwrap();
        let early = tokio::time::timeout(Duration::from_millis(50), outbox.released()).await;
        assert!(early.is_err(), "released before the first write was stored");
        first.send(()).unwrap();
        assert_eq!(names(&outbox.released().await), ["r1"]);
        assert_eq!(names(&outbox.released().await), ["r2", "effect"]);
        assert!(outbox.is_clear());
        assert!(journal.groups().is_empty(), "no records, no group");
    }

    // Time stands still but for the sleep: the wait is exact.
    #[tokio::test(start_paused = true)]
    async fn records_gather_into_one_group_while_a_write_is_in_flight() {
        let mut outbox = Outbox::default();
        let journal = Journal::default();
        outbox.record(b"a", false, 100, journal.store());
        outbox.commit(journal.store());
        outbox.hold(reply(1));
        // The first group is in flight: these gather into the next.
        outbox.record(b"b", false, 100, journal.store());
        outbox.hold(reply(2));
        outbox.record(b"c", false, 100, journal.store());
        outbox.commit(journal.store());
        outbox.hold(reply(3));
        assert_eq!(journal.groups(), ["a"]);
        assert_eq!(outbox.released_through(), 0);
        journal.open(0);
        assert_eq!(names(&outbox.released().await), ["r1"]);
        assert_eq!(outbox.released_through(), 1, "the first group's sequence");
        // Room again, and its time: the gathered group goes as one write, and both replies
        // wait for it.
        tokio::time::sleep_until(outbox.commit_due().expect("waits for time")).await;
        outbox.commit(journal.store());
        assert_eq!(journal.groups(), ["a", "b\nc"]);
        journal.open(1);
        assert_eq!(names(&outbox.released().await), ["r2", "r3"]);
        assert_eq!(outbox.released_through(), 2);
        assert!(outbox.is_clear());
    }

    #[tokio::test]
    async fn a_group_a_client_waits_for_does_not_wait_for_the_write_before_it() {
        let mut outbox = Outbox::default();
        let journal = Journal::default();
        outbox.record(b"a", false, 100, journal.store());
        outbox.commit(journal.store());
        outbox.record(b"b", true, 100, journal.store());
        outbox.hold(reply(1));
        outbox.commit(journal.store());
        assert_eq!(journal.groups(), ["a", "b"], "a second write in flight");
        outbox.record(b"c", true, 100, journal.store());
        outbox.commit(journal.store());
        assert_eq!(journal.groups(), ["a", "b"], "but not a third");
        // Its answer still waits for both writes, in order.
        journal.open(1);
        let early = tokio::time::timeout(Duration::from_millis(20), outbox.released()).await;
        assert!(early.is_err(), "released before the first write was stored");
        journal.open(0);
        assert!(outbox.released().await.is_empty());
        assert_eq!(names(&outbox.released().await), ["r1"]);
    }

    #[tokio::test]
    async fn a_full_group_is_written_at_once_and_the_record_starts_the_next() {
        let mut outbox = Outbox::default();
        let journal = Journal::default();
        outbox.record(b"aaaa", true, 9, journal.store());
        outbox.record(b"bbbb", true, 9, journal.store());
        assert_eq!(
            journal.groups(),
            Vec::<String>::new(),
            "4 + 1 + 4 fits in 9"
        );
        outbox.record(b"cccc", true, 9, journal.store());
        assert_eq!(journal.groups(), ["aaaa\nbbbb"]);
        outbox.seal(journal.store());
        assert_eq!(journal.groups(), ["aaaa\nbbbb", "cccc"]);
    }

    #[tokio::test]
    async fn a_result_write_sends_the_gathering_group_first_to_keep_the_order() {
        let mut outbox = Outbox::default();
        let journal = Journal::default();
        outbox.record(b"a", true, 100, journal.store());
        outbox.hold(reply(1));
        let (result, write) = gate();
        outbox.write(write, journal.store());
        outbox.hold(reply(2));
        assert_eq!(journal.groups(), ["a"]);
        result.send(()).unwrap();
        journal.open(0);
        assert_eq!(names(&outbox.released().await), ["r1"]);
        assert_eq!(outbox.released_through(), 1);
        // A result's write takes no journal sequence.
        assert_eq!(names(&outbox.released().await), ["r2"]);
        assert_eq!(outbox.released_through(), 1);
    }

    #[tokio::test]
    async fn executors_messages_pass_the_journal_until_one_has_to_wait() {
        let mut outbox = Outbox::default();
        let journal = Journal::default();
        let launch = || {
            Output::Effect(Effect::Send {
                to: ExecutorId::parse("e1").unwrap(),
                message: ExecutorMessage::StopExecutor { reason: "r".into() },
            })
        };
        assert!(
            outbox.may_send(&reply(0)),
            "nothing in flight: anything leaves"
        );
        outbox.record(b"a", true, 100, journal.store());
        outbox.commit(journal.store());
        assert!(
            !outbox.may_send(&reply(1)),
            "a client's answer waits for the record"
        );
        assert!(!outbox.may_send(&job_end()), "so does an event");
        assert!(outbox.may_send(&to_executor(1)));
        assert!(outbox.may_send(&launch()));
        // Once too much waits, an executor's message waits too, and those after it keep its
        // order even when the queue is short again.
        for _ in 0..MAX_HELD {
            outbox.hold(job_end());
        }
        assert!(!outbox.may_send(&to_executor(2)));
        outbox.hold(to_executor(2));
        journal.open(0);
        assert_eq!(outbox.released().await.len(), MAX_HELD + 1);
        outbox.record(b"b", true, 100, journal.store());
        outbox.commit(journal.store());
        outbox.hold(to_executor(3));
        assert!(
            !outbox.may_send(&to_executor(4)),
            "one is waiting: it keeps its place"
        );
        journal.open(1);
        assert_eq!(names(&outbox.released().await), ["x3"]);
        assert!(outbox.may_send(&to_executor(5)));
    }

    // Time stands still but for the sleep: the wait is exact.
    #[tokio::test(start_paused = true)]
    async fn a_group_of_task_ends_alone_waits_for_company_and_an_urgent_one_does_not() {
        let mut outbox = Outbox::default();
        let journal = Journal::default();
        outbox.record(b"a", false, 100, journal.store());
        outbox.commit(journal.store());
        assert_eq!(journal.groups(), ["a"], "the first write goes at once");
        journal.open(0);
        outbox.released().await;
        // The next group of task ends waits until GROUP_INTERVAL after the last write began.
        outbox.record(b"b", false, 100, journal.store());
        outbox.commit(journal.store());
        assert_eq!(journal.groups(), ["a"]);
        let due = outbox.commit_due().expect("it waits for time alone");
        tokio::time::sleep_until(due).await;
        outbox.commit(journal.store());
        assert_eq!(journal.groups(), ["a", "b"]);
        journal.open(1);
        outbox.released().await;
        // A record a client waits for takes the group with it at once.
        outbox.record(b"c", false, 100, journal.store());
        outbox.record(b"d", true, 100, journal.store());
        assert_eq!(outbox.commit_due(), None);
        outbox.commit(journal.store());
        assert_eq!(journal.groups(), ["a", "b", "c\nd"]);
    }

    #[tokio::test]
    async fn an_empty_outbox_never_releases() {
        let mut outbox = Outbox::default();
        let waited = tokio::time::timeout(Duration::from_millis(20), outbox.released()).await;
        assert!(waited.is_err());
    }
}
