//! What the driver sends, held behind journal writes. A step's journal records are stored
//! first; everything after a record that is not yet stored (this step's answer, events and
//! messages, and those of later steps) waits, in order, and leaves when the write is
//! acknowledged. Writes are pipelined: the actor keeps handling messages while they are in
//! flight, and a slow write delays only what follows it.

use super::core::Effect;
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use std::collections::VecDeque;

/// One thing to send.
pub enum Output {
    /// The answer to a request: (reply subject, payload).
    Reply(async_nats::Subject, bytes::Bytes),
    /// An event or an executor's message.
    Effect(Effect),
    /// A page of results to read from the results bucket (`indices`) before it is sent.
    Results {
        reply: async_nats::Subject,
        page: crate::protocol::ResultsPage,
        indices: Vec<u32>,
    },
}

enum Held {
    /// Where a journal write sits in the order.
    Write,
    Output(Output),
}

/// Outputs waiting for the journal writes before them.
#[derive(Default)]
pub struct Outbox {
    held: VecDeque<Held>,
    writes: FuturesOrdered<BoxFuture<'static, ()>>,
}

impl Outbox {
    /// Whether no write is in flight, so an output may leave at once.
    pub fn is_clear(&self) -> bool {
        self.writes.is_empty()
    }

    /// Queues a journal write; every output queued after it waits for it.
    pub fn write(&mut self, write: BoxFuture<'static, ()>) {
        self.held.push_back(Held::Write);
        self.writes.push_back(write);
    }

    /// Queues an output behind the writes in flight.
    pub fn hold(&mut self, output: Output) {
        self.held.push_back(Held::Output(output));
    }

    /// Waits for the oldest write to be stored and returns the outputs it released, in
    /// order. Never completes while no write is in flight. Cancel-safe.
    pub async fn released(&mut self) -> Vec<Output> {
        if self.writes.next().await.is_none() {
            return std::future::pending().await;
        }
        debug_assert!(matches!(self.held.front(), Some(Held::Write)));
        self.held.pop_front();
        let mut released = Vec::new();
        while let Some(Held::Output(_)) = self.held.front() {
            if let Some(Held::Output(output)) = self.held.pop_front() {
                released.push(output);
            }
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Event, JobState};
    use std::time::Duration;
    use tokio::sync::oneshot;

    fn reply(n: u8) -> Output {
        Output::Reply(format!("r{n}").into(), bytes::Bytes::new())
    }

    fn names(outputs: &[Output]) -> Vec<String> {
        outputs
            .iter()
            .map(|o| match o {
                Output::Reply(subject, _) => subject.to_string(),
                Output::Effect(_) => "effect".into(),
                Output::Results { .. } => "results".into(),
            })
            .collect()
    }

    fn gate() -> (oneshot::Sender<()>, BoxFuture<'static, ()>) {
        let (open, opened) = oneshot::channel();
        (open, Box::pin(async move { opened.await.unwrap() }))
    }

    #[tokio::test]
    async fn outputs_leave_in_order_as_the_writes_before_them_are_stored() {
        let mut outbox = Outbox::default();
        let (first, write) = gate();
        outbox.write(write);
        outbox.hold(reply(1));
        let (second, write) = gate();
        outbox.write(write);
        outbox.hold(reply(2));
        outbox.hold(Output::Effect(Effect::Publish(Event::JobEnd {
            time_ms: 0,
            job_id: 1,
            state: JobState::Succeeded,
            succeeded: 1,
            failed: 0,
            killed: 0,
            reason: None,
        })));
        // The second write is stored first: nothing may leave before the first is.
        second.send(()).unwrap();
        let early = tokio::time::timeout(Duration::from_millis(50), outbox.released()).await;
        assert!(early.is_err(), "released before the first write was stored");
        first.send(()).unwrap();
        assert_eq!(names(&outbox.released().await), ["r1"]);
        assert_eq!(names(&outbox.released().await), ["r2", "effect"]);
        assert!(outbox.is_clear());
    }

    #[tokio::test]
    async fn an_empty_outbox_never_releases() {
        let mut outbox = Outbox::default();
        let waited = tokio::time::timeout(Duration::from_millis(20), outbox.released()).await;
        assert!(waited.is_err());
    }
}
