//! The driver's side of the object store. A submission that names objects is taken only once
//! each of them is there: the check reads the store off the actor's loop; the submission comes
//! back to the loop with its verdict, and is answered there as any request is: taken by the
//! core if its objects are all there, else refused with an answer that says which is missing,
//! changing nothing.
//!
//! The leader also sweeps the store: an object no kept job has referred to for
//! `--objects-max-age`, and put at least that long ago, is deleted, and so are the chunks of a
//! put that died (chunks no metadata points at, seen unchanged by two sweeps, the last written
//! at least that long ago). The clock of "no kept job refers to it" starts when this leader first
//! sees it so, so a new leader deletes later than the last would have, never sooner. Only the
//! leader deletes, and it stops as soon as it no longer leads.

use super::core::{Answer, Core};
use super::lease::Guard;
use crate::metrics::ObjectGauges;
use crate::objects::{ObjectRef, Objects};
use crate::protocol::{ApiReply, ApiRequest};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// How long an object a submission named is spared by sweeps and `DeleteObject`: the time
/// between the check that found it and the core's taking the job, with room to spare.
const NAMED_LATELY: Duration = Duration::from_secs(60);

/// Objects named by submissions lately, and when.
type Named = Arc<Mutex<HashMap<ObjectRef, Instant>>>;

/// A submission whose objects were looked for, back for the loop to answer.
pub(super) struct Checked {
    request: ApiRequest,
    reply: async_nats::service::Request,
    /// Why it is refused, if it is.
    refused: Option<String>,
}

/// What checks submissions' objects: the store, and where checked submissions go.
pub(super) struct Checks {
    objects: Option<Objects>,
    checked: mpsc::UnboundedSender<Checked>,
    named: Named,
}

impl Checks {
    /// Checks against `objects` (none: the driver has no store), and the receiver of what
    /// was checked.
    pub(super) fn new(objects: Option<Objects>) -> (Self, mpsc::UnboundedReceiver<Checked>) {
        let (checked, receiver) = mpsc::unbounded_channel();
        let named = Named::default();
        (
            Self {
                objects,
                checked,
                named,
            },
            receiver,
        )
    }

    /// The store, if the driver has one.
    pub(super) fn store(&self) -> Option<&Objects> {
        self.objects.as_ref()
    }

    /// Whether a submission named `object` lately.
    pub(super) fn named_lately(&self, object: &ObjectRef) -> bool {
        lately(&self.named, object)
    }

    /// Starts the leader's sweeps of the store, if there is one; they end with the returned
    /// [`Sweeper`], or when `guard` says this driver no longer leads.
    pub(super) fn sweeper(
        &self,
        max_age: Duration,
        guard: Option<Guard>,
        gauges: ObjectGauges,
        web: Option<crate::web::Link>,
    ) -> Option<Sweeper> {
        let store = self.objects.clone()?;
        let (sweeps, receiver) = mpsc::channel(1);
        let sweep = Sweep {
            store,
            max_age,
            guard,
            gauges,
            web,
            named: self.named.clone(),
            unused_since: HashMap::new(),
            orphans: HashMap::new(),
        };
        tokio::spawn(sweep.run(receiver));
        Some(Sweeper { sweeps })
    }
}

fn lately(named: &Named, object: &ObjectRef) -> bool {
    let named = named.lock().unwrap_or_else(|e| e.into_inner());
    named
        .get(object)
        .is_some_and(|at| at.elapsed() < NAMED_LATELY)
}

/// The objects a request names, if it is a submission that names any.
fn named(request: &ApiRequest) -> BTreeSet<ObjectRef> {
    match request {
        ApiRequest::SubmitJob(job) => job
            .tasks
            .iter()
            .flat_map(|spec| spec.objects())
            .cloned()
            .collect(),
        _ => BTreeSet::new(),
    }
}

impl Checks {
    /// Gives `request` back if it names no object, to be answered now; else looks for its
    /// objects off the loop, and it comes back through the receiver [`Checks::new`] gave.
    pub(super) fn check(
        &self,
        request: ApiRequest,
        reply: async_nats::service::Request,
    ) -> Option<(ApiRequest, async_nats::service::Request)> {
        let objects = named(&request);
        if objects.is_empty() {
            return Some((request, reply));
        }
        {
            let now = Instant::now();
            let mut lately = self.named.lock().unwrap_or_else(|e| e.into_inner());
            lately.retain(|_, at| now.duration_since(*at) < NAMED_LATELY);
            lately.extend(objects.iter().map(|o| (o.clone(), now)));
        }
        let (store, checked) = (self.objects.clone(), self.checked.clone());
        tokio::spawn(async move {
            let refused = match store {
                None => Some(NO_STORE.to_string()),
                Some(store) => match missing(&store, &objects).await {
                    Ok(None) => None,
                    Ok(Some(object)) => Some(format!("object {object} not found: put it again")),
                    Err(error) => Some(format!(
                        "could not look for the job's objects in the store ({error}); nothing \
                         was submitted"
                    )),
                },
            };
            let _ = checked.send(Checked {
                request,
                reply,
                refused,
            });
        });
        None
    }
}

impl Checked {
    /// The answer: the core's, as to any request, if the objects were all there; else the
    /// refusal. And where it goes.
    pub(super) fn answer(self, core: &mut Core) -> (Answer, async_nats::service::Request) {
        let answer = match self.refused {
            None => core.answer(self.request, crate::now_ms()),
            Some(message) => Answer::Reply(ApiReply::Error { message }),
        };
        (answer, self.reply)
    }
}

/// Why a submission that names objects is refused by a driver without a store.
pub(super) const NO_STORE: &str =
    "this cluster has no object store: its driver runs without a journal \
                        (--journal off, or a server without JetStream), and tasks that name \
                        objects need one";

/// The first of `objects` the store does not hold, if any.
async fn missing(
    store: &Objects,
    objects: &BTreeSet<ObjectRef>,
) -> Result<Option<ObjectRef>, crate::objects::ObjectsError> {
    let stats = futures::future::join_all(objects.iter().map(|o| store.stat(o))).await;
    for (object, stat) in objects.iter().zip(stats) {
        if stat?.is_none() {
            return Ok(Some(object.clone()));
        }
    }
    Ok(None)
}

/// How often the leader sweeps a store whose objects are kept `max_age`.
pub(super) fn sweep_interval(max_age: Duration) -> Duration {
    (max_age / 4).clamp(Duration::from_secs(1), Duration::from_secs(300))
}

/// Where the actor hands the leader's sweeps the objects its kept jobs refer to.
pub(super) struct Sweeper {
    sweeps: mpsc::Sender<BTreeSet<ObjectRef>>,
}

impl Sweeper {
    /// Sweeps the store, sparing `kept`; skipped while the last sweep still runs.
    pub(super) fn sweep(&self, kept: BTreeSet<ObjectRef>) {
        let _ = self.sweeps.try_send(kept);
    }
}

/// The state of the leader's sweeps.
struct Sweep {
    store: Objects,
    max_age: Duration,
    guard: Option<Guard>,
    gauges: ObjectGauges,
    /// The driver's page, told what each sweep found.
    web: Option<crate::web::Link>,
    named: Named,
    /// Since when each object has been seen with no kept job referring to it.
    unused_since: HashMap<ObjectRef, Instant>,
    /// The orphan chunks the last sweep saw: subject -> when the last was written (ms).
    orphans: HashMap<String, u64>,
}

impl Sweep {
    async fn run(mut self, mut sweeps: mpsc::Receiver<BTreeSet<ObjectRef>>) {
        while let Some(kept) = sweeps.recv().await {
            if !self.leads() {
                return;
            }
            if let Err(error) = self.once(&kept).await {
                warn!(%error, "could not sweep the object store; trying again at the next sweep");
            }
        }
    }

    fn leads(&self) -> bool {
        self.guard.as_ref().map_or(true, Guard::is_current)
    }

    async fn once(
        &mut self,
        kept: &BTreeSet<ObjectRef>,
    ) -> Result<(), crate::objects::ObjectsError> {
        let listed = self.store.list().await?;
        let (now, now_ms) = (Instant::now(), crate::now_ms());
        let age_ms = self.max_age.as_millis() as u64;
        let bytes: u64 = listed.iter().map(|o| o.size).sum();
        self.gauges.objects.set(listed.len() as i64);
        self.gauges.bytes.set(bytes.min(i64::MAX as u64) as i64);
        if let Some(web) = &self.web {
            web.store(crate::web::StoreFigures {
                objects: listed.len() as u64,
                bytes,
                at_ms: now_ms,
            });
        }
        let present: BTreeSet<&ObjectRef> = listed.iter().map(|o| &o.object).collect();
        self.unused_since
            .retain(|o, _| present.contains(o) && !kept.contains(o));
        for stat in &listed {
            let object = &stat.object;
            if kept.contains(object) || lately(&self.named, object) {
                self.unused_since.remove(object);
                continue;
            }
            let since = *self.unused_since.entry(object.clone()).or_insert(now);
            let put_long_ago = stat
                .put_ms
                .map_or(true, |put| now_ms.saturating_sub(put) >= age_ms);
            if now.duration_since(since) < self.max_age || !put_long_ago {
                continue;
            }
            if !self.leads() {
                return Ok(());
            }
            if self.store.delete(object).await? {
                info!(%object, size = stat.size, "deleted an object no kept job used");
                self.gauges.deleted.inc();
            }
            self.unused_since.remove(object);
        }
        let orphans: HashMap<String, u64> = self.store.orphan_chunks().await?.into_iter().collect();
        for (subject, last_ms) in &orphans {
            // Seen unchanged by the last sweep too: not a put whose metadata was on its way.
            let unchanged = self.orphans.get(subject) == Some(last_ms);
            if !unchanged || now_ms.saturating_sub(*last_ms) < age_ms || !self.leads() {
                continue;
            }
            self.store.purge_orphan(subject).await?;
            info!(subject, "purged the chunks of a put that did not finish");
            self.gauges.deleted.inc();
        }
        self.orphans = orphans;
        Ok(())
    }
}
