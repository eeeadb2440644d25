//! The leader's side of the lease: the task that renews it, lapses it when the driver's
//! connection is lost, and tells a lapse that ends in a renewal from one that ends in a loss
//! (see the [parent module](super) for why a lapse is not a loss).

use super::{Holder, Lease, Shared, KEY};
use crate::driver::jetstream::server_code;
use crate::driver::lease_clock::ask_patience;
use async_nats::jetstream::{kv, ErrorCode};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

/// How long a renewal of a lapsed lease waits for its answer before it is sent again: one
/// sent before the connection came back, or to a stream still electing its leader, goes
/// unanswered, and the leader sends nothing meanwhile.
const LAPSED_PATIENCE: Duration = Duration::from_secs(1);

/// How often a leader whose connection was lost looks whether it is connected again.
const RECONNECT_POLL: Duration = Duration::from_millis(20);

/// Renews the lease until it is lost. A loss of the driver's connection lapses it at once: a
/// standby that hears from the server that the connection closed may take the key within
/// `--disconnect-grace`, well before the lease would run out, so the leader stops sending
/// rather than race it, and goes on only if its renewal of the same revision succeeds.
pub(super) async fn hold(
    lease: Lease,
    me: Holder,
    shared: Arc<Shared>,
    connection_lost: Option<tokio::sync::watch::Receiver<u64>>,
) {
    let renewing = renew(lease, me, shared.clone());
    tokio::pin!(renewing);
    let Some(mut lost) = connection_lost else {
        return renewing.await;
    };
    loop {
        tokio::select! {
            _ = &mut renewing => return,
            changed = lost.changed() => match changed {
                Ok(()) => {
                    shared.disconnected.store(true, SeqCst);
                    shared.lapse("its NATS connection was lost: a standby may take the lease");
                }
                // Nothing counts the losses any more: the lease alone decides.
                Err(_) => return renewing.await,
            },
        }
    }
}

/// Renews the lease until it is lost: a compare-and-set every third of the lease, each counted
/// from when it was sent. One unanswered by the time the lease runs out leaves it lapsed, and
/// the compare-and-set on the same revision is tried again, each try waiting a third of the
/// lease (at most [`LAPSED_PATIENCE`]), until it succeeds (the leadership goes on) or the key
/// is found written by another driver (it is lost).
async fn renew(lease: Lease, me: Holder, shared: Arc<Shared>) {
    let mut next = shared.hold().first_renewal(Instant::now());
    let mut lapsed_since = None;
    // The connection the key names, as this driver last wrote it.
    let mut named = me.connection.clone();
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = shared.renew_now.notified() => {}
        }
        if shared.lost.load(SeqCst) {
            return;
        }
        // Each renewal names the connection it goes through, which a reconnect changes. After
        // a loss, only one through a new connection may renew: one naming the lost
        // connection (not connected again yet) would leave the key for a standby to take.
        let through = me.through(&lease.client);
        if shared.disconnected.load(SeqCst) && through.connection == named {
            next = Instant::now() + RECONNECT_POLL;
            continue;
        }
        let value = through.encode();
        let (sent, hold) = (Instant::now(), shared.hold());
        let deadline = match hold.is_current(sent) {
            true => hold.valid_until(),
            false => {
                if lapsed_since.is_none() {
                    warn!(
                        epoch = shared.epoch,
                        "the lease has lapsed: sending nothing until a renewal of it succeeds, \
                         or until another driver is found to hold it"
                    );
                    lapsed_since = Some(sent);
                }
                sent + ask_patience(lease.lease).min(LAPSED_PATIENCE)
            }
        };
        let update = lease.store.update(KEY, value.clone(), hold.revision());
        let answered = tokio::select! {
            answered = tokio::time::timeout_at(deadline, update) => answered,
            // Lapsed meanwhile (its connection lost): the answer may never come, and a
            // renewal sent before counts for nothing anyway.
            () = shared.renew_now.notified() => {
                next = Instant::now();
                continue;
            }
        };
        match answered {
            Ok(Ok(revision)) => {
                next = shared.change(|hold| hold.renewed(revision, sent));
                // Not renewed if the connection was lost again after it was sent.
                let renewed = shared.hold().is_current(Instant::now());
                if named != through.connection {
                    named = through.connection;
                    if renewed {
                        shared.disconnected.store(false, SeqCst);
                    }
                }
                if let Some(since) = lapsed_since.take_if(|_| renewed) {
                    info!(
                        epoch = shared.epoch,
                        lapsed = ?since.elapsed(),
                        "lease renewed after it lapsed: no other driver took it; leading on"
                    );
                    shared.changed.notify_waiters();
                }
            }
            Ok(Err(error)) if wrong_revision(&error) => {
                // Either another driver wrote the key, or this driver's own last renewal was
                // stored though its answer was lost. Only the key's holder can tell.
                match lease.store.entry(KEY).await {
                    Ok(Some(entry))
                        if Holder::decode(&entry.value)
                            .is_some_and(|h| h.driver_instance == me.driver_instance) =>
                    {
                        // Its own write: go on from that revision.
                        let now = Instant::now();
                        next = shared.change(|hold| hold.found_own(entry.revision, now));
                    }
                    Ok(_) => {
                        shared.lose("another driver took the lease");
                        return;
                    }
                    Err(_) => next = hold.retry(Instant::now()),
                }
            }
            // A server that answers with a refusal (its store full, say) refuses every
            // driver's write, and a leader that waits for it answers nothing: once the lease
            // has lapsed it stands by, where it answers that no driver can lead, and why.
            Ok(Err(error)) if lapsed_since.is_some() && refused_by_server(&error) => {
                shared.lose(&format!("the server refuses to renew the lease: {error}"));
                return;
            }
            Ok(Err(error)) => {
                warn!(%error, "could not renew the lease; trying again");
                next = hold.retry(Instant::now());
            }
            // Unanswered: the lease has now lapsed, if it had not; the same compare-and-set
            // goes again at once.
            Err(_) => next = Instant::now(),
        }
    }
}

/// Whether a write of the key was answered by the server with a refusal, rather than left
/// unanswered (no stream leader to take it, or no connection): the server said no. A write
/// turned away because another of the same key is still in process (one sent before a lapse,
/// which a new stream leader has yet to decide) is not a refusal: it passes.
fn refused_by_server(error: &kv::UpdateError) -> bool {
    use async_nats::jetstream::context::{PublishError, PublishErrorKind};
    let answered = std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<PublishError>())
        .is_some_and(|error| error.kind() == PublishErrorKind::Other);
    answered && server_code(error) != Some(ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT)
}

/// Whether a compare-and-set of the key was refused because the key is past the revision it
/// expected: async-nats says so in the error's kind, or, on some paths, only in the server's
/// error code beneath it.
fn wrong_revision(error: &kv::UpdateError) -> bool {
    error.kind() == kv::UpdateErrorKind::WrongLastRevision
        || server_code(error) == Some(ErrorCode::STREAM_WRONG_LAST_SEQUENCE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream::context::{PublishError, PublishErrorKind};

    /// A refusal of the server as async-nats wraps it: `kind`, over a publish error of
    /// `publish`, over the server's error of `code`.
    fn refusal(kind: kv::UpdateErrorKind, publish: PublishErrorKind, code: u64) -> kv::UpdateError {
        let server: async_nats::jetstream::Error = serde_json::from_value(serde_json::json!({
            "code": 400, "err_code": code, "description": "refused"
        }))
        .expect("a server error");
        kv::UpdateError::with_source(kind, PublishError::with_source(publish, server))
    }

    #[test]
    fn a_key_past_its_revision_is_told_from_a_refusal_and_from_no_answer() {
        use kv::UpdateErrorKind::{Other, WrongLastRevision};
        let moved = refusal(
            WrongLastRevision,
            PublishErrorKind::WrongLastSequence,
            10071,
        );
        assert!(wrong_revision(&moved));
        // The same refusal, wrapped as another kind on its way.
        let wrapped = refusal(Other, PublishErrorKind::Other, 10071);
        assert!(wrong_revision(&wrapped));
        let full = refusal(Other, PublishErrorKind::Other, 10023);
        assert!(!wrong_revision(&full));
        assert!(
            refused_by_server(&full),
            "insufficient resources: the server said no"
        );
        // Turned away while an earlier write of the key is still in process: it passes.
        let in_process = refusal(Other, PublishErrorKind::Other, 10164);
        assert!(!wrong_revision(&in_process));
        assert!(
            !refused_by_server(&in_process),
            "a write of the same key in process is no refusal"
        );
        let unanswered = kv::UpdateError::with_source(
            Other,
            PublishError::new(PublishErrorKind::StreamNotFound),
        );
        assert!(!wrong_revision(&unanswered));
        assert!(
            !refused_by_server(&unanswered),
            "no responders: no stream leader answered"
        );
    }
}
