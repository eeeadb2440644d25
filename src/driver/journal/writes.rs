//! The journal's writes: each leader's in turn, fenced by the stream's last sequence, and every
//! one sent again until JetStream acknowledges it (unanswered, at once when a later write
//! finds it missing, and on a refusal that may pass).

use super::{Journal, Turns, TURN_DELAY};
use crate::driver::jetstream::server_code;
use crate::metrics::JournalWrites;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, ErrorCode};
use futures::future::BoxFuture;
use std::future::IntoFuture;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// How often the journal is read short of this leader's mark or of a write it stored, a pause
/// apart, before the leader believes it (see [`store_after`]): a stale answer lasts as long as
/// a stream leader cut off from the others takes to learn of its successor once the partition
/// heals.
const SHORT_READS: u32 = 5;
const SHORT_READ_PAUSE: Duration = Duration::from_millis(500);

/// The longest a failed store waits before it tries again.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

/// How long a write waits for its acknowledgement before it is sent again (with its message
/// id, so stored once). A stream whose leader was lost or parted drops the writes sent to it
/// without an answer, and when no later write comes to find them missing (the next launches
/// wait on them) nothing but this brings them to the new leader: every answer and event
/// behind them waits that long after JetStream has elected one. A write is acknowledged in
/// milliseconds by a stream that has a leader; one sent again that was stored after all is
/// answered as a duplicate.
pub(super) const ACK_PATIENCE: Duration = Duration::from_secs(1);

/// How long a write must have waited for its acknowledgement before it is sent again at once
/// when a later write finds it missing from the stream, rather than at its timeout. A stream
/// whose leader changed (a NATS node lost or parted) drops the writes sent to the old one
/// without an answer; each would otherwise wait out its whole timeout in turn, and what waits
/// on them (answers, events, the next launches) with it.
const HURRY_AFTER: Duration = Duration::from_millis(250);

/// Publishes `payload` on `subject` into JetStream, trying again until the server
/// acknowledges it: what waits behind it must not leave before it is stored. The write runs
/// as a task of its own, started at once (writes started in turn are sent in turn), rather
/// than when the returned future is first polled. One unanswered within [`ACK_PATIENCE`] is
/// sent again (with no message id, a write stored twice stores the same value twice). Its
/// time and retries are counted in `writes`, if given.
pub fn store(
    context: jetstream::Context,
    subject: String,
    payload: bytes::Bytes,
    writes: Option<JournalWrites>,
) -> BoxFuture<'static, ()> {
    started(store_until_stored(context, subject, payload, writes))
}

/// Runs `write` as a task of its own, once polled here first: its first send is then queued on
/// the connection in the caller's turn, and leaves in the same write to the socket as what the
/// caller sends in that turn (a launch, an answer), rather than in a write of its own once the
/// task runs. The poll here wakes nothing when the write can go on: the task's first poll,
/// which always comes, registers the task's waker wherever the write waits.
pub(super) fn started(
    write: impl std::future::Future<Output = ()> + Send + 'static,
) -> BoxFuture<'static, ()> {
    let mut write = Box::pin(write);
    let mut here = std::task::Context::from_waker(futures::task::noop_waker_ref());
    let first = std::panic::AssertUnwindSafe(|| write.as_mut().poll(&mut here));
    match std::panic::catch_unwind(first) {
        Ok(std::task::Poll::Pending) => joined(tokio::spawn(write)),
        Ok(std::task::Poll::Ready(())) => Box::pin(std::future::ready(())),
        Err(_) => {
            // As `joined` takes a panic in the task: a defect, logged; the caller goes on.
            tracing::error!("a JetStream write panicked before it was stored");
            Box::pin(std::future::ready(()))
        }
    }
}

/// Waits for a write's task.
pub(super) fn joined(write: tokio::task::JoinHandle<()>) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        if let Err(error) = write.await {
            // Only a panic gets here (the task is never cancelled): a defect, logged as one;
            // what waits on the write goes on rather than waiting for ever.
            tracing::error!(%error, "a JetStream write's task ended without storing it");
        }
    })
}

/// Stores `payload` once the journal's last sequence is `expected`, trying again until it is
/// stored. A refusal because the journal is past `expected` means another driver wrote it:
/// this one no longer leads, and gives the write up. What waited on it is not sent, as
/// nothing is once the leadership is lost (the shell's sends check it). A write whose
/// leadership is lost while it waits for the one before it gives up too: left waiting, it
/// would land after the records of this driver's next leadership (or a successor's), out of
/// its place. And one whose predecessor the server acknowledged, but no longer holds (a server
/// that lost acknowledged writes in an OS crash), stands the driver down: the journal it
/// leads from is not the one it wrote.
pub(super) async fn store_after(
    journal: Journal,
    turns: Arc<Turns>,
    expected: u64,
    payload: bytes::Bytes,
) {
    let id = format!("{}.{}", turns.guard.epoch(), expected + 1);
    let mut retry = Retry::new(Some(journal.writes.clone()));
    let mut short_reads = 0;
    loop {
        // Each send, the first and every one again, waits while the lease has lapsed: a
        // write sent then could land after a successor's mark, and depose the successor.
        if !turns.guard.current().await {
            return;
        }
        let publish = PublishMessage::build()
            .payload(payload.clone())
            .message_id(&id)
            .expected_last_sequence(expected);
        let sent = journal
            .context
            .send_publish(journal.subject.clone(), publish)
            .await;
        let stored = match sent {
            Ok(ack) => match acknowledged_or_hurried(ack, &turns.behind).await {
                Answer::Acknowledged(stored) => stored.map(drop),
                Answer::Hurried => {
                    retry.hurried();
                    continue;
                }
                Answer::None => {
                    retry.unanswered();
                    continue;
                }
            },
            Err(e) => Err(e),
        };
        let error = match stored {
            Ok(()) => {
                turns.stored.fetch_max(expected + 1, SeqCst);
                return retry.stored();
            }
            Err(error) => error,
        };
        if server_code(&error) == Some(ErrorCode::STREAM_DUPLICATE_MESSAGE_CONFLICT) {
            // An earlier send of it (one given up unanswered) is being stored now: sent again
            // soon, it is answered as a duplicate once it is. Not paused longer each time: the
            // writes after it wait in turn, and after a stream's election they are many.
            retry.in_process();
            tokio::time::sleep(TURN_DELAY).await;
            continue;
        }
        if error.kind() == PublishErrorKind::WrongLastSequence {
            if !turns.guard.current().await {
                return;
            }
            let last = journal.last_sequence().await;
            // Shorter than this leader's own mark, or than a write it stored. A server that led
            // the stream before a partition healed answers as its leader, from its own short
            // copy, until it learns of its successor: the stream is asked again before the
            // leadership is given up for it.
            let short = last.as_ref().is_ok_and(|&last| {
                last < turns.mark || (last < expected && turns.stored.load(SeqCst) >= expected)
            });
            if short && short_reads < SHORT_READS {
                short_reads += 1;
                tokio::time::sleep(SHORT_READ_PAUSE).await;
                continue;
            }
            match last {
                Ok(last) if last > expected => {
                    turns
                        .guard
                        .depose("another driver wrote the journal after this one");
                    return;
                }
                Ok(last) if last < turns.mark => {
                    // What this leader read is gone: it starts again from what is left.
                    turns
                        .guard
                        .depose("the journal was deleted or purged under this driver");
                    return;
                }
                Ok(last) if last < expected && turns.stored.load(SeqCst) >= expected => {
                    turns.guard.depose(&format!(
                        "the journal lost records it had acknowledged (its last is {last}, \
                         {expected} was stored): was its server restarted without them?"
                    ));
                    return;
                }
                // The write before this one is not stored yet: it goes first, sent again
                // at once if it has long waited for an answer the stream would have given.
                _ => {
                    turns.behind.notify_waiters();
                    tokio::time::sleep(TURN_DELAY).await
                }
            }
            continue;
        }
        // Tried again at the loop's top, which gives it up once the leadership is lost.
        retry.failed(&error).await;
    }
}

/// What a JetStream write's acknowledgement brings.
type Acknowledged = Result<
    async_nats::jetstream::publish::PublishAck,
    async_nats::jetstream::context::PublishError,
>;

/// What became of a write sent: its acknowledgement, or why it is to be sent again.
enum Answer {
    Acknowledged(Acknowledged),
    /// A later write found it missing from the stream (see [`HURRY_AFTER`]).
    Hurried,
    /// No answer within [`ACK_PATIENCE`].
    None,
}

/// The acknowledgement `ack` brings; or, for the write to be sent again (with its message id,
/// so that it is stored once if the first one was stored after all), that `behind` was told
/// once the write had waited [`HURRY_AFTER`] for it, or that [`ACK_PATIENCE`] passed.
async fn acknowledged_or_hurried(
    ack: async_nats::jetstream::context::PublishAckFuture,
    behind: &tokio::sync::Notify,
) -> Answer {
    let sent = tokio::time::Instant::now();
    let hurry_from = sent + HURRY_AFTER;
    let ack = ack.into_future();
    tokio::pin!(ack);
    let patience = tokio::time::sleep_until(sent + ACK_PATIENCE);
    tokio::pin!(patience);
    loop {
        tokio::select! {
            stored = &mut ack => return Answer::Acknowledged(stored),
            // Told too soon, the answer may still be on its way: the later writes tell again
            // each time they find this one missing.
            () = behind.notified() => if tokio::time::Instant::now() >= hurry_from {
                return Answer::Hurried;
            },
            () = &mut patience => return Answer::None,
        }
    }
}

async fn store_until_stored(
    context: jetstream::Context,
    subject: String,
    payload: bytes::Bytes,
    writes: Option<JournalWrites>,
) {
    let mut retry = Retry::new(writes);
    loop {
        let stored = match context.publish(subject.clone(), payload.clone()).await {
            Ok(ack) => match tokio::time::timeout(ACK_PATIENCE, ack.into_future()).await {
                Ok(stored) => stored.map(drop).map_err(|e| e.to_string()),
                // Sent again: a write to a stream whose leader was lost gets no answer.
                Err(_) => {
                    retry.unanswered();
                    continue;
                }
            },
            Err(e) => Err(e.to_string()),
        };
        match stored {
            Ok(()) => return retry.stored(),
            Err(error) => retry.failed(&error).await,
        }
    }
}

/// The tries of one write: how many so far, since when, and the pause before the next.
pub(super) struct Retry {
    delay: Duration,
    first: std::time::Instant,
    attempts: u32,
    /// Where the write's time and retries are counted, if anywhere.
    writes: Option<JournalWrites>,
}

impl Retry {
    pub(super) fn new(writes: Option<JournalWrites>) -> Self {
        Self {
            delay: Duration::from_millis(50),
            first: std::time::Instant::now(),
            attempts: 0,
            writes,
        }
    }

    pub(super) fn stored(&self) {
        if let Some(writes) = &self.writes {
            writes.stored(self.first.elapsed());
        }
        if self.attempts > 0 {
            info!(attempts = self.attempts + 1, after = ?self.first.elapsed(), "JetStream write stored");
        }
    }

    /// Counts a try that did not store the write.
    fn count(&mut self) {
        self.attempts += 1;
        if let Some(writes) = &self.writes {
            writes.retried();
        }
    }

    /// Counts a write sent again at once: a later write found it missing (see
    /// [`HURRY_AFTER`]).
    pub(super) fn hurried(&mut self) {
        self.count();
        if self.attempts == 1 {
            info!(
                waited = ?self.first.elapsed(),
                "a JetStream write is unanswered while a later one found the stream; sending it \
                 again"
            );
        }
    }

    /// Counts a write sent again because an earlier send of it is being stored.
    pub(super) fn in_process(&mut self) {
        self.count();
    }

    /// Counts a write sent again because it went unanswered for [`ACK_PATIENCE`]; warns at
    /// the first time, and every tenth after it while JetStream stays silent.
    pub(super) fn unanswered(&mut self) {
        self.count();
        if self.attempts % 10 == 1 {
            warn!(
                attempts = self.attempts,
                failing_for = ?self.first.elapsed(),
                "JetStream write unanswered within {ACK_PATIENCE:?}; sending it again, and the \
                 answers and events that follow it wait until it is stored (is JetStream up?)"
            );
        }
    }

    /// Logs the failure and waits before the next try, twice as long each time up to
    /// `MAX_RETRY_DELAY`.
    pub(super) async fn failed(&mut self, error: &(dyn std::fmt::Display + Sync)) {
        self.count();
        warn!(
            %error,
            attempts = self.attempts,
            failing_for = ?self.first.elapsed(),
            retry_in = ?self.delay,
            "JetStream write failed; the answers and events that follow it wait until \
             it is stored (is JetStream up?)"
        );
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(MAX_RETRY_DELAY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use tokio::sync::oneshot;

    #[tokio::test]
    async fn a_write_started_takes_its_first_step_before_the_caller_yields_and_ends_in_its_task() {
        let (sent, stored) = (Arc::new(AtomicBool::new(false)), oneshot::channel::<()>());
        let (store, acknowledged) = stored;
        let step = sent.clone();
        let write = started(async move {
            step.store(true, SeqCst);
            acknowledged.await.expect("acknowledged");
        });
        // Taken in the caller's turn: no await has let another task run yet.
        assert!(sent.load(SeqCst), "the first step waited for the task");
        store.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), write)
            .await
            .expect("the write ends once acknowledged");
    }

    #[tokio::test]
    async fn a_write_that_panics_at_its_first_step_leaves_the_caller_going() {
        let write = started(async { panic!("a defect in a write") });
        tokio::time::timeout(Duration::from_millis(100), write)
            .await
            .expect("given up at once, not waited for");
    }

    #[tokio::test]
    async fn a_write_done_at_its_first_step_is_done_at_once() {
        let write = started(async {});
        tokio::time::timeout(Duration::from_millis(100), write)
            .await
            .expect("done at once");
    }
}
