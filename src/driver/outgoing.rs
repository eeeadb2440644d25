//! The [`outbox`](super::outbox)'s rules at work in the driver: the writes they start run as
//! futures here (the journal's group writes and the results bucket's puts, each a task of its
//! own, so they go out however busy the actor is), and each write's end is fed back to the
//! rules, which say what it releases. The actor owns this and awaits [`Outgoing::released`]
//! in its loop.

use super::outbox::{Group, Outbox, Output};
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use tokio::time::Instant;

/// A group write of the journal: it gives the sequence it took, if the driver leads.
pub type Write = BoxFuture<'static, Option<u64>>;

/// What the driver sends, held behind the writes in flight.
pub struct Outgoing {
    outbox: Outbox<Output, bytes::Bytes, Instant>,
    /// The writes in flight, in the order they started: each gives its number and, for a
    /// journal write of a leader, the sequence it took.
    writes: FuturesOrdered<BoxFuture<'static, (u64, Option<u64>)>>,
    /// How many writes have started, and how many of them `released` has given back.
    started: u64,
    ended: tokio::sync::watch::Sender<u64>,
}

impl Default for Outgoing {
    fn default() -> Self {
        Self {
            outbox: Outbox::default(),
            writes: FuturesOrdered::new(),
            started: 0,
            ended: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Outgoing {
    /// Whether no write is in flight or gathering, so any output may leave at once.
    pub fn is_clear(&self) -> bool {
        self.outbox.is_clear()
    }

    /// `output`, if it may leave now; else it waits its turn (see [`Outbox::send_or_hold`]).
    pub fn send_or_hold(&mut self, output: Output) -> Option<Output> {
        self.outbox.send_or_hold(output)
    }

    /// Starts a write that is not a journal record (a result for the results bucket): every
    /// output held after it waits for it. The group gathering is written first, to keep the
    /// writes in their order.
    pub fn write(
        &mut self,
        write: BoxFuture<'static, ()>,
        store: impl FnOnce(bytes::Bytes) -> Write,
    ) {
        let (sealed, number) = self.outbox.write(Instant::now());
        self.start(sealed, store);
        self.started += 1;
        self.writes.push_back(Box::pin(async move {
            write.await;
            (number, None)
        }));
    }

    /// Completes once every write started so far is stored (a write that reads what they
    /// wrote awaits it before it starts).
    pub fn after_writes(&self) -> BoxFuture<'static, ()> {
        let (before, mut ended) = (self.started, self.ended.subscribe());
        Box::pin(async move {
            // Dropped with the driver's loop: nothing is left to wait for.
            let _ = ended.wait_for(|ended| *ended >= before).await;
        })
    }

    /// Adds one encoded journal record (at most `max_bytes`) to the group gathering; a group
    /// it would make larger than `max_bytes` is written first. An `urgent` record is one a
    /// client waits for: its group goes without waiting for more.
    pub fn record(
        &mut self,
        record: bytes::Bytes,
        urgent: bool,
        max_bytes: usize,
        store: impl FnOnce(bytes::Bytes) -> Write,
    ) {
        let bytes = record.len();
        let sealed = self
            .outbox
            .record(record, bytes, urgent, max_bytes, Instant::now());
        self.start(sealed, store);
    }

    /// Writes the group gathering if the outbox's rules say it may go now.
    pub fn commit(&mut self, store: impl FnOnce(bytes::Bytes) -> Write) {
        let group = self.outbox.commit(Instant::now());
        self.start(group, store);
    }

    /// When the group gathering is due to be written, if it waits only for time to pass.
    pub fn commit_due(&self) -> Option<Instant> {
        self.outbox.commit_due()
    }

    /// Writes the group gathering now, if there is one.
    pub fn seal(&mut self, store: impl FnOnce(bytes::Bytes) -> Write) {
        let group = self.outbox.seal(Instant::now());
        self.start(group, store);
    }

    /// The journal sequence of the last group write whose outputs [`Outgoing::released`] gave
    /// (0 before any).
    pub fn released_through(&self) -> u64 {
        self.outbox.released_through()
    }

    /// Waits for the oldest write to be stored and returns the outputs it released, in
    /// order. Never completes while no write is in flight. Cancel-safe.
    pub async fn released(&mut self) -> Vec<Output> {
        match self.writes.next().await {
            Some((write, sequence)) => {
                self.ended.send_modify(|ended| *ended += 1);
                self.outbox.stored(write, sequence)
            }
            None => std::future::pending().await,
        }
    }

    fn start(
        &mut self,
        group: Option<Group<bytes::Bytes>>,
        store: impl FnOnce(bytes::Bytes) -> Write,
    ) {
        let Some(Group { write, records }) = group else {
            return;
        };
        let stored = store(lines(records));
        self.started += 1;
        self.writes
            .push_back(Box::pin(async move { (write, stored.await) }));
    }
}

/// One message of `records`, one per line.
fn lines(records: Vec<bytes::Bytes>) -> bytes::Bytes {
    if let [record] = &records[..] {
        return record.clone();
    }
    let bytes = records.iter().map(|r| r.len() + 1).sum::<usize>();
    let mut message = Vec::with_capacity(bytes.saturating_sub(1));
    for (n, record) in records.iter().enumerate() {
        if n > 0 {
            message.push(b'\n');
        }
        message.extend_from_slice(record);
    }
    message.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Event;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tokio::sync::oneshot;

    /// An event named `r<n>`: something told to listeners, which waits for the journal.
    fn event(n: u8) -> Output {
        Output::Effect(super::super::core::Effect::Publish(Event::JobStart {
            time_ms: 0,
            job_id: u64::from(n),
            name: format!("r{n}"),
            tasks: 1,
        }))
    }

    fn names(outputs: &[Output]) -> Vec<String> {
        outputs
            .iter()
            .map(|o| match o {
                Output::Effect(super::super::core::Effect::Publish(Event::JobStart {
                    name,
                    ..
                })) => name.clone(),
                _ => "other".into(),
            })
            .collect()
    }

    fn gate() -> (oneshot::Sender<()>, BoxFuture<'static, ()>) {
        let (open, opened) = oneshot::channel();
        (open, Box::pin(async move { opened.await.unwrap() }))
    }

    /// Each group written, with the gate that stores it.
    type Groups = Arc<Mutex<Vec<(bytes::Bytes, Option<oneshot::Sender<()>>)>>>;

    /// A journal that records each group it is given and stores it, the n-th at sequence n,
    /// when its gate opens.
    #[derive(Default, Clone)]
    struct Journal {
        groups: Groups,
    }

    impl Journal {
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

    // Time stands still but for the sleep: the wait is exact.
    #[tokio::test(start_paused = true)]
    async fn the_writes_the_rules_start_release_what_waits_for_them_in_order() {
        let mut outgoing = Outgoing::default();
        let journal = Journal::default();
        let record = |text: &'static str| bytes::Bytes::from_static(text.as_bytes());
        outgoing.record(record("a"), false, 100, journal.store());
        outgoing.commit(journal.store());
        assert!(outgoing.send_or_hold(event(1)).is_none());
        // A result's write, behind the group in flight.
        let (result, put) = gate();
        outgoing.write(put, journal.store());
        assert!(outgoing.send_or_hold(event(2)).is_none());
        outgoing.record(record("b"), false, 100, journal.store());
        outgoing.record(record("c"), false, 100, journal.store());
        outgoing.commit(journal.store());
        assert!(outgoing.send_or_hold(event(3)).is_none());
        assert_eq!(journal.groups(), ["a"]);
        // The result is stored first: nothing leaves before the group before it is.
        result.send(()).unwrap();
        let early = tokio::time::timeout(Duration::from_millis(5), outgoing.released()).await;
        assert!(early.is_err(), "released before the first write was stored");
        journal.open(0);
        assert_eq!(names(&outgoing.released().await), ["r1"]);
        assert_eq!(outgoing.released_through(), 1, "the first group's sequence");
        assert_eq!(names(&outgoing.released().await), ["r2"]);
        assert_eq!(outgoing.released_through(), 1, "a result takes no sequence");
        // Room again, and its time: the gathered records go as one message, a line each.
        tokio::time::sleep_until(outgoing.commit_due().expect("waits for time")).await;
        outgoing.commit(journal.store());
        assert_eq!(journal.groups(), ["a", "b\nc"]);
        journal.open(1);
        assert_eq!(names(&outgoing.released().await), ["r3"]);
        assert_eq!(outgoing.released_through(), 2);
        assert!(outgoing.is_clear());
    }

    #[tokio::test]
    async fn what_waits_for_the_writes_started_waits_for_them_and_not_for_later_ones() {
        let (mut outgoing, journal) = (Outgoing::default(), Journal::default());
        tokio::time::timeout(Duration::from_millis(20), outgoing.after_writes())
            .await
            .expect("no write: nothing to wait for");
        let (first, write) = gate();
        outgoing.write(write, journal.store());
        let after_first = outgoing.after_writes();
        let (_second, write) = gate();
        outgoing.write(write, journal.store());
        let mut after_first = tokio::spawn(after_first);
        let early = tokio::time::timeout(Duration::from_millis(10), &mut after_first).await;
        assert!(early.is_err(), "done before the first write was stored");
        first.send(()).unwrap();
        outgoing.released().await;
        tokio::time::timeout(Duration::from_secs(5), after_first)
            .await
            .expect("done once the first write is stored, the second still in flight")
            .unwrap();
    }

    #[tokio::test]
    async fn an_empty_outbox_never_releases() {
        let mut outgoing = Outgoing::default();
        let waited = tokio::time::timeout(Duration::from_millis(20), outgoing.released()).await;
        assert!(waited.is_err());
    }

    #[test]
    fn records_are_joined_a_line_each() {
        let parts = |texts: &[&'static str]| {
            let records = texts
                .iter()
                .map(|t| bytes::Bytes::from_static(t.as_bytes()));
            lines(records.collect())
        };
        assert_eq!(parts(&["a"]), "a");
        assert_eq!(parts(&["a", "bc", "d"]), "a\nbc\nd");
    }
}
