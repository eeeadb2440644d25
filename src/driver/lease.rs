//! Leadership among a cluster's drivers: a lease on one key of a JetStream key-value bucket of
//! the cluster (`EMBER_<cluster>_LEADER`, key `leader`). Any number of drivers may run; the
//! one whose compare-and-set on the key succeeded leads, and the key's revision at that write
//! is its epoch. The others stand by, reading the key, and take it once its holder has not
//! renewed it for the lease it declared.
//!
//! Done as KV-lease users learned to do it:
//! - leadership is decided by the write that succeeded, never by a read (a read may be stale);
//! - the leader renews on a timer of its own, every renewal a compare-and-set on the revision
//!   it last wrote, and counts its lease from the moment it *sent* the renewal, so that it
//!   expires in its own eyes before any standby, which counts from when it *saw* the renewal,
//!   may take over;
//! - a leader that cannot renew in time stops sending at once ([`Guard::is_current`]), however
//!   slow NATS is, because a successor may already lead. Its lease has *lapsed*, not been lost:
//!   it goes on trying the compare-and-set on the revision it last wrote, and sends again only
//!   once that succeeds, which proves that no other driver wrote the key meanwhile, so none led.
//!   Whatever it was to send waits ([`Guard::current`]); nothing is dropped. Only a key found
//!   written by another driver (or a server refusing the renewal, or a fenced journal write
//!   refused) ends the leadership; a lost connection lapses it at once. A lease bucket whose
//!   stream is electing a new leader (a NATS node lost) so costs its leader a pause, not a
//!   new leadership replayed from the journal;
//! - a leader that stops releases the key by a compare-and-set, never a delete, so a key it no
//!   longer holds is left alone.
//!
//! When to read the key, take it, renew it and stop is decided by [`lease_clock`](super::lease_clock),
//! on the clock this passes in; the simulator runs the same decisions on virtual time.

use super::advisories::{closed_by_client, next_advisory, Closing, Gone, DISCONNECT_ADVISORIES};
use super::lease_clock::{ask_patience, poll_interval, Hold, Key, Watch};
use crate::connect::connection_of;
use crate::protocol::ConnectionId;
use crate::subjects::Subjects;
use async_nats::jetstream::{self, kv};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{info, warn};
use uuid::Uuid;

mod renewal;
use renewal::hold;

/// The key of the lease in the bucket.
const KEY: &str = "leader";

/// How long a lease lasts unless told otherwise.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(3);

/// What the key holds: who leads, for how long a renewal lasts, and whether it let go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    /// The leading driver's instance id: the `driver_instance` executors register with.
    pub driver_instance: Uuid,
    /// Where it runs, for the log and for `ember status`.
    pub host: String,
    pub pid: u32,
    /// How long each renewal lasts, in milliseconds: a standby waits this long (and a little
    /// more) after the last renewal it saw.
    pub lease_ms: u64,
    /// Set by a leader that stopped: a standby need not wait.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
    /// The NATS connection the leader wrote this through: a standby that hears from the
    /// server that it closed need not wait out the lease (see [`super::advisories`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<ConnectionId>,
    /// The run of the driver this leadership belongs to (one [`run`](super::run), kept
    /// through each time it stands by and leads again): a driver that stood down itself (its
    /// connection was lost) takes its own run's key at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_run: Option<Uuid>,
}

impl Holder {
    fn me(driver_instance: Uuid, driver_run: Uuid, lease: Duration) -> Self {
        Self {
            driver_instance,
            host: nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_default(),
            pid: std::process::id(),
            lease_ms: lease.as_millis().min(u128::from(u64::MAX)) as u64,
            released: false,
            connection: None,
            driver_run: Some(driver_run),
        }
    }

    /// This holder, naming the connection `client` speaks through now.
    fn through(&self, client: &async_nats::Client) -> Self {
        Self {
            connection: connection_of(client),
            ..self.clone()
        }
    }

    fn encode(&self) -> bytes::Bytes {
        serde_json::to_vec(self)
            .expect("a holder always encodes")
            .into()
    }

    /// What `value` says, or `None` for a value this driver cannot read: a standby treats
    /// such a key as held for its own `--lease`, never as free.
    fn decode(value: &[u8]) -> Option<Self> {
        serde_json::from_slice(value).ok()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("could not open the lease bucket {bucket}: {message}")]
    Bucket { bucket: String, message: String },
}

/// The lease bucket of one cluster.
#[derive(Clone)]
pub struct Lease {
    store: kv::Store,
    lease: Duration,
    client: async_nats::Client,
    /// Counts the losses of the driver's connection, if they are watched.
    connection_lost: Option<tokio::sync::watch::Receiver<u64>>,
}

impl Lease {
    /// Opens the cluster's lease bucket, creating it if needed. With `connection_lost`, a
    /// leadership ends at the first loss of the driver's connection after it was taken.
    pub async fn open(
        context: &jetstream::Context,
        subjects: &Subjects,
        lease: Duration,
        replicas: usize,
        connection_lost: Option<tokio::sync::watch::Receiver<u64>>,
    ) -> Result<Self, LeaseError> {
        let bucket = subjects.leader_bucket();
        let failed = |message: String| LeaseError::Bucket {
            bucket: bucket.clone(),
            message,
        };
        let store = match context.get_key_value(&bucket).await {
            Ok(store) => store,
            Err(_) => super::jetstream::until_answered(&bucket, || {
                context.create_key_value(kv::Config {
                    bucket: bucket.clone(),
                    history: 1,
                    storage: jetstream::stream::StorageType::File,
                    num_replicas: replicas,
                    ..Default::default()
                })
            })
            .await
            .map_err(|e| failed(e.to_string()))?,
        };
        Ok(Self {
            store,
            lease,
            client: context.client(),
            connection_lost,
        })
    }

    /// Waits until this driver leads, as `driver_instance`, and returns its tenure, renewed
    /// from then on by a task of its own until it is lost or released.
    ///
    /// `unled` says, while it is so, why no driver can lead: the key is free or its holder's
    /// lease has lapsed, and the server refuses this driver's write of it (a full store, say),
    /// so it refuses every other driver's too.
    ///
    /// With `disconnect_grace`, it also listens to the servers' disconnect advisories: a
    /// holder whose connection closed (and that has not written the key through another since
    /// the grace) is taken over at once, by a compare-and-set on the revision it wrote.
    pub async fn acquire(
        &self,
        driver_instance: Uuid,
        driver_run: Uuid,
        unled: &tokio::sync::watch::Sender<Option<String>>,
        disconnect_grace: Option<Duration>,
    ) -> Tenure {
        let me = Holder::me(driver_instance, driver_run, self.lease);
        let (mut waiting_for, mut watch) = (None, Watch::default());
        let mut advisories = match disconnect_grace {
            Some(_) => self.client.subscribe(DISCONNECT_ADVISORIES).await.ok(),
            None => None,
        };
        let mut closing = Closing::new(disconnect_grace.unwrap_or_default());
        let mut gone = Gone::default();
        loop {
            let me = me.through(&self.client);
            // Losses counted from before the write: one that comes before the leadership
            // starts still ends it.
            let mut lost = self.connection_lost.clone();
            if let Some(lost) = lost.as_mut() {
                lost.mark_unchanged();
            }
            let taken = self.try_take(&me, &mut watch, &gone).await;
            let refused = match &taken {
                Taken::Refused(reason) => Some(reason.clone()),
                _ => None,
            };
            unled.send_if_modified(|now| {
                let changed = now.is_some() != refused.is_some();
                if changed {
                    *now = refused;
                }
                changed
            });
            match taken {
                Taken::Now(revision, sent) => {
                    info!(epoch = revision, lease = ?self.lease, "leading the cluster's drivers");
                    return Tenure::start(self.clone(), me, revision, sent, lost);
                }
                Taken::HeldBy(holder) => {
                    if waiting_for.as_ref() != Some(&holder) {
                        info!(
                            leader = %holder.driver_instance,
                            host = %holder.host,
                            pid = holder.pid,
                            "standing by: another driver leads"
                        );
                        waiting_for = Some(holder);
                    }
                }
                Taken::Refused(_) | Taken::Unknown => {}
            }
            let poll = tokio::time::sleep(poll_interval(self.lease));
            tokio::pin!(poll);
            loop {
                tokio::select! {
                    _ = &mut poll => break,
                    Some(advisory) = next_advisory(&mut advisories) => {
                        if let Some(closed) = closed_by_client(&advisory.payload) {
                            closing.push(closed);
                        }
                    }
                    closed = closing.next() => {
                        gone.add(closed.connection);
                        break;
                    }
                }
            }
        }
    }

    /// One look at the key, and a compare-and-set on it if it is free or, in `watch`'s eyes,
    /// lapsed.
    async fn try_take(&self, me: &Holder, watch: &mut Watch<Instant>, gone: &Gone) -> Taken {
        let patience = ask_patience(self.lease);
        let entry = match tokio::time::timeout(patience, self.store.entry(KEY)).await {
            Ok(Ok(entry)) => entry,
            Ok(Err(error)) => {
                warn!(%error, "could not read the lease; trying again");
                return Taken::Unknown;
            }
            Err(_) => {
                warn!(?patience, "the lease was not read in time; trying again");
                return Taken::Unknown;
            }
        };
        let sent = Instant::now();
        // A write that lost a race is no news; any other failure is the server refusing it.
        let created = |written: Result<u64, kv::CreateError>| {
            written.map_err(|e| {
                (e.kind() != kv::CreateErrorKind::AlreadyExists).then(|| e.to_string())
            })
        };
        let create = || async {
            match tokio::time::timeout(patience, self.store.create(KEY, me.encode())).await {
                Ok(written) => created(written),
                Err(_) => Err(None),
            }
        };
        let written = match entry {
            // Never written, or deleted by hand: free.
            None => create().await,
            Some(entry) if entry.operation != kv::Operation::Put => create().await,
            Some(entry) => {
                let holder = Holder::decode(&entry.value);
                let key = match &holder {
                    Some(h) if h.released => Key::Free,
                    // Its own write, stored though its answer was lost: taken again by a
                    // compare-and-set on that revision, whose sending it can count from.
                    Some(h) if h.driver_instance == me.driver_instance => Key::Free,
                    // A leadership of this driver's run, which it gave up itself before it
                    // started again: nothing of it sends any more.
                    Some(h) if h.driver_run.is_some() && h.driver_run == me.driver_run => Key::Free,
                    // Its holder's connection closed, its server said: this revision is the
                    // dead leader's last, and the compare-and-set takes only that one.
                    Some(h) if h.connection.as_ref().is_some_and(|c| gone.has(c)) => {
                        info!(leader = %h.driver_instance, "the leader's NATS connection closed");
                        Key::Free
                    }
                    _ => Key::Held {
                        revision: entry.revision,
                        lease: holder
                            .as_ref()
                            .map_or(self.lease, |h| Duration::from_millis(h.lease_ms)),
                    },
                };
                if !watch.may_take(key, Instant::now()) {
                    return match holder {
                        Some(holder) => Taken::HeldBy(holder),
                        None => Taken::Unknown,
                    };
                }
                let update = self.store.update(KEY, me.encode(), entry.revision);
                match tokio::time::timeout(patience, update).await {
                    Ok(written) => written.map_err(|e| {
                        (e.kind() != kv::UpdateErrorKind::WrongLastRevision).then(|| e.to_string())
                    }),
                    Err(_) => Err(None),
                }
            }
        };
        match written {
            Ok(revision) => Taken::Now(revision, sent),
            Err(Some(reason)) => Taken::Refused(reason),
            Err(None) => Taken::Unknown,
        }
    }
}

enum Taken {
    /// This driver's write succeeded at this revision, sent at that instant.
    Now(u64, Instant),
    HeldBy(Holder),
    /// The key is free or lapsed, and the server refused to write it, saying this.
    Refused(String),
    /// The key could not be read, the write lost a race, or went unanswered: look again.
    Unknown,
}

/// One leadership: its epoch, until when it holds, and whether it was lost.
pub struct Tenure {
    guard: Guard,
    renewing: tokio::task::JoinHandle<()>,
    lease: Lease,
    me: Holder,
}

struct Shared {
    epoch: u64,
    /// The revision of this driver's last write of the key, and until when it may send: the
    /// renewing task writes it, whatever sends reads it.
    hold: Mutex<Hold<Instant>>,
    lost: AtomicBool,
    /// Set once the driver is told to stop: what waits for a lapsed lease waits no more.
    stopping: AtomicBool,
    /// Told when the leadership is lost, renewed after a lapse, or told to stop.
    changed: Notify,
    /// Tells the renewing task to renew at once (the lease lapsed before its time).
    renew_now: Notify,
    /// Set when the driver's connection is lost, until a renewal names another: the key
    /// names the lost one, from which a standby may take it.
    disconnected: AtomicBool,
}

impl Shared {
    fn lose(&self, why: &str) {
        if !self.lost.swap(true, SeqCst) {
            warn!(
                epoch = self.epoch,
                why, "no longer leading: sending nothing more"
            );
        }
        self.changed.notify_waiters();
    }

    /// Ends the lease now in this driver's eyes, for `why`: it sends nothing more until a
    /// renewal of the revision it holds succeeds, which it tries at once.
    fn lapse(&self, why: &str) {
        if !self.lost.load(SeqCst) {
            warn!(epoch = self.epoch, why, "the lease lapses now");
        }
        self.change(|hold| hold.lapse(Instant::now()));
        self.renew_now.notify_one();
    }

    fn hold(&self) -> Hold<Instant> {
        *self.hold.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn change<T>(&self, change: impl FnOnce(&mut Hold<Instant>) -> T) -> T {
        change(&mut self.hold.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Tenure {
    fn start(
        lease: Lease,
        me: Holder,
        revision: u64,
        sent: Instant,
        connection_lost: Option<tokio::sync::watch::Receiver<u64>>,
    ) -> Self {
        let shared = Arc::new(Shared {
            epoch: revision,
            hold: Mutex::new(Hold::taken(lease.lease, revision, sent)),
            lost: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            changed: Notify::new(),
            renew_now: Notify::new(),
            disconnected: AtomicBool::new(false),
        });
        let renewing = tokio::spawn(hold(
            lease.clone(),
            me.clone(),
            shared.clone(),
            connection_lost,
        ));
        Self {
            guard: Guard(shared),
            renewing,
            lease,
            me,
        }
    }

    /// The epoch of this leadership: the lease key's revision when it was taken.
    pub fn epoch(&self) -> u64 {
        self.guard.epoch()
    }

    /// What says whether this leadership still holds, for whatever sends (clone it for a
    /// task of its own).
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// Gives the lease up, so that a standby takes over at once: a compare-and-set on the
    /// revision this driver last wrote, which fails harmlessly if it no longer holds it.
    pub async fn release(self) {
        self.renewing.abort();
        self.guard.0.lose("released");
        let released = Holder {
            released: true,
            ..self.me.clone()
        };
        let revision = self.guard.0.hold().revision();
        let released = self.lease.store.update(KEY, released.encode(), revision);
        match tokio::time::timeout(self.lease.lease, released).await {
            Ok(Ok(_)) => info!(epoch = self.epoch(), "lease released"),
            Ok(Err(error)) => info!(%error, "lease not released (another driver holds it)"),
            Err(_) => warn!("lease not released in time; a standby takes over when it lapses"),
        }
    }
}

impl Drop for Tenure {
    fn drop(&mut self) {
        self.renewing.abort();
    }
}

/// Whether a leadership still holds; cheap to clone and to ask.
#[derive(Clone)]
pub struct Guard(Arc<Shared>);

impl Guard {
    /// Whether this driver may send now: it has not lost its leadership, and its lease has not
    /// run out in its own eyes (lapsed) since its last renewal.
    pub fn is_current(&self) -> bool {
        !self.0.lost.load(SeqCst) && self.0.hold().is_current(Instant::now())
    }

    /// Whether this driver may send, waiting while its lease has lapsed: true once it is
    /// current (at once, mostly), false once the leadership is lost, or at once if the lease
    /// has lapsed and the driver was told to stop. What was to be sent waits here, so that a
    /// leader whose lapse ends in a renewal goes on having dropped nothing.
    pub async fn current(&self) -> bool {
        once_decided(&self.0.changed, || self.decided()).await
    }

    /// Whether this driver may send, if that is decided now: not while the lease has lapsed,
    /// unless the driver is stopping.
    fn decided(&self) -> Option<bool> {
        if self.0.lost.load(SeqCst) {
            Some(false)
        } else if self.is_current() {
            Some(true)
        } else if self.0.stopping.load(SeqCst) {
            Some(false)
        } else {
            None
        }
    }

    /// Marks the leadership lost, for a write refused because another driver wrote first.
    pub fn depose(&self, why: &str) {
        self.0.lose(why);
    }

    /// The driver is stopping: nothing waits for a lapsed lease any more ([`Guard::current`]
    /// answers at once), so that a stop is never held up by a lease store that does not answer.
    pub fn stopping(&self) {
        self.0.stopping.store(true, SeqCst);
        self.0.changed.notify_waiters();
    }

    pub fn epoch(&self) -> u64 {
        self.0.epoch
    }

    /// Completes once the leadership is lost (a lapse is not a loss: see [`Guard::current`]).
    pub async fn lost(&self) {
        once_decided(&self.0.changed, || self.0.lost.load(SeqCst).then_some(())).await
    }
}

/// What `decided` gives once it gives anything, asked again each time `changed` is told.
pub(super) async fn once_decided<T>(changed: &Notify, decided: impl Fn() -> Option<T>) -> T {
    loop {
        if let Some(done) = decided() {
            return done;
        }
        // Asked again once the wait is registered, so that no change is missed between.
        let notified = changed.notified();
        if let Some(done) = decided() {
            return done;
        }
        notified.await;
    }
}
