//! The shell around the core: it sends what the core decides, in order, and only once the
//! journal has stored what must be stored first (see the outbox); it publishes events, stores
//! results and snapshots, and answers from the results bucket off the actor's loop.

use super::admission::Admission;
use super::coalesce::TaskEvents;
use super::core::{BucketRead, Core, Effect};
use super::history::{History, Stamp, Stamps};
use super::journal::Journal;
use super::lease::{Guard, Tenure};
use super::outbox::{Addressed, Output, ReplyTo, ServiceError};
use super::outgoing::Outgoing;
use super::results::ResultsBucket;
use super::snapshots::{Encoded, Schedule, Stored};
use crate::metrics::DriverMetrics;
use crate::protocol::{encode, fit, ApiReply, Batch, Event, JournalRecord};
use crate::subjects::Subjects;
use crate::{now_ms, PAYLOAD_HEADROOM};
use async_nats::{Client, Subject};
use futures::future::BoxFuture;
use serde::Serialize;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

/// How long a stopping driver waits for its last journal writes.
pub(super) const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// What storing a snapshot came to.
pub(super) type Snapshotted = Result<Stored, String>;

/// The thin NATS layer around the core: decoding, reply checks, sending.
pub(super) struct Shell {
    /// This driver's leadership, with a journal: nothing is sent once it is lost.
    pub(super) tenure: Option<Tenure>,
    /// What everything sent carries: the leadership's epoch.
    pub(super) headers: Option<async_nats::HeaderMap>,
    pub(super) client: Client,
    pub(super) subjects: Subjects,
    /// The server's max_payload: the largest message anyone can send us.
    pub(super) limit: usize,
    pub(super) task_events: TaskEvents,
    /// Who may be answered, and the count of requests that may not.
    pub(super) admission: Admission,
    pub(super) metrics: Arc<DriverMetrics>,
    /// Ended jobs whose end is stored, whose waiting jobs the core is to settle next.
    pub(super) releases: Vec<(crate::ids::JobId, crate::protocol::JobState, Option<String>)>,
    /// The live web page's link, with `--http`.
    pub(super) web: Option<crate::web::Link>,
    /// Where the core's journal records are stored, if anywhere.
    pub(super) journal: Option<Journal>,
    /// When the journal is next snapshotted, with a journal.
    pub(super) schedule: Option<Schedule>,
    /// Where results are stored, with a journal.
    pub(super) results: Option<ResultsBucket>,
    /// What looks for the objects a submission names, in the store a journal comes with.
    pub(super) checks: super::objects::Checks,
    /// The leader's sweeps of the object store, if there is one.
    pub(super) sweeper: Option<super::objects::Sweeper>,
    /// What stores the events in the cluster's events stream, with a journal.
    pub(super) history: Option<History>,
    /// Where the events handed to `history` stand against the journal.
    pub(super) stamps: Stamps,
    /// Whether a revive tick came since the last look at the snapshot's age.
    pub(super) ticked: bool,
    /// The core's offer rounds already counted in the metrics.
    pub(super) offer_rounds: u64,
}

impl Shell {
    /// This driver leads: the log, the metrics and the web page say so. Returns the web
    /// page's queries, which the actor answers while it leads.
    pub(super) fn leading(&self, core: &Core) -> Option<crate::web::Queries> {
        info!(cluster = self.subjects.prefix(), "driver ready");
        let epoch = self.tenure.as_ref().map_or(0, Tenure::epoch);
        self.metrics.leader.set(1);
        self.metrics.epoch.set(epoch as i64);
        self.metrics.set_core(core.gauges());
        self.web.as_ref().and_then(|web| {
            web.leading(epoch, core.driver_instance());
            web.queries()
        })
    }

    /// Tells every executor that this driver now leads: one registered with another driver
    /// registers again at once, rather than after its next request to that one goes
    /// unanswered (a status batch waits 5 s for its answer).
    pub(super) async fn announce(&self, driver_instance: crate::ids::InstanceId) {
        let leading = crate::protocol::ExecutorMessage::Leading { driver_instance };
        let subject = self.subjects.executors().into();
        self.publish(subject, crate::protocol::encode(&leading))
            .await;
    }

    /// Answers a scrape of the metrics with the core's gauges as they are now.
    pub(super) fn on_scrape(
        &self,
        core: &Core,
        scrape: crate::metrics::ScrapeRequest,
    ) -> Option<Output> {
        self.metrics.answer(scrape, core.gauges());
        None
    }

    /// The revive timer: the core offers free cores and looks for silent executors; the
    /// refusals are logged if they changed; the snapshot's age is looked at.
    pub(super) fn on_revive(&mut self, core: &mut Core) -> Option<Output> {
        core.tick(now_ms());
        self.admission.report();
        self.ticked = true;
        None
    }

    /// Sends what the journal's last acknowledgement released, the outbox's writes stored
    /// `through` that one.
    pub(super) async fn send_released(&mut self, released: Vec<Output>, through: u64) {
        self.send_all(released).await;
        self.stamps.released(through);
    }

    /// What follows every step of the loop: the step's answer and the core's effects are sent
    /// or held, the offer rounds counted, the journal's group committed when it may be, and a
    /// snapshot started if one is due (its write is returned, for the loop to await).
    pub(super) async fn after_step(
        &mut self,
        core: &mut Core,
        outbox: &mut Outgoing,
        reply: Option<Output>,
    ) -> Option<BoxFuture<'static, Snapshotted>> {
        self.emit(outbox, reply, core.take_effects()).await;
        // Jobs whose end is stored: what waits on them starts (which may end more jobs).
        while !self.releases.is_empty() {
            let now = now_ms();
            for (job_id, state, reason) in std::mem::take(&mut self.releases) {
                core.release(job_id, state, reason, now);
            }
            self.emit(outbox, None, core.take_effects()).await;
        }
        self.count_offer_rounds(core);
        self.commit(outbox, false);
        self.snapshot_if_due(core)
    }

    /// This driver no longer leads: the metrics and the web page say so.
    pub(super) fn stood_down(&self) {
        self.metrics.stood_down();
        if let Some(web) = &self.web {
            web.standing_by();
        }
    }

    /// Counts the offer rounds the core made since the last count.
    pub(super) fn count_offer_rounds(&mut self, core: &Core) {
        let rounds = core.offer_rounds();
        if rounds > self.offer_rounds {
            self.metrics.offer_rounds.inc_by(rounds - self.offer_rounds);
            self.offer_rounds = rounds;
        }
    }

    /// Counts what an event says was launched or ended.
    pub(super) fn count(&self, event: &Event) {
        match event {
            Event::TaskStart { executors, .. } => {
                let launched: usize = executors.iter().map(|e| e.tasks.len()).sum();
                self.metrics.tasks_launched.inc_by(launched as u64);
            }
            Event::TaskEnd { .. } => {
                for (_, end) in event.ended() {
                    self.metrics.ended(end.state);
                }
            }
            _ => {}
        }
    }

    /// Fills `read`'s page from the results bucket and answers with it, off the actor's loop:
    /// the reads take round trips, and need nothing of the core.
    pub(super) fn answer_with_results(&self, reply: ReplyTo, read: BucketRead) {
        if let Some(read) = self.read_results(read) {
            self.answer_off_loop(reply, read);
        }
    }

    /// The answer `read` makes once its results are read from the results bucket, if there
    /// is one; cut to fit one message.
    fn read_results(
        &self,
        read: BucketRead,
    ) -> Option<impl Future<Output = ApiReply> + Send + 'static> {
        let results = self.results.clone()?;
        let max_bytes = self.limit - PAYLOAD_HEADROOM;
        Some(async move { results.fill(read, max_bytes).await })
    }

    /// [`Shell::answer_with_results`] for an executor's read, answered on its reply subject.
    pub(super) fn answer_executor_with_results(&self, reply: Subject, read: BucketRead) {
        let Some(read) = self.read_results(read) else {
            return;
        };
        let (client, guard, headers) = (
            self.client.clone(),
            self.guard().cloned(),
            self.headers.clone(),
        );
        tokio::spawn(async move {
            let payload = encode(&read.await);
            send(&client, guard.as_ref(), headers.as_ref(), reply, payload).await;
        });
    }

    /// Sends what `reply` comes to, from a task of its own.
    pub(super) fn answer_off_loop(
        &self,
        to: ReplyTo,
        reply: impl Future<Output = ApiReply> + Send + 'static,
    ) {
        let (guard, headers) = (self.guard().cloned(), self.headers.clone());
        tokio::spawn(async move {
            let reply = reply.await;
            let error = ServiceError::of(&reply);
            answer(guard.as_ref(), headers.as_ref(), to, encode(&reply), error).await;
        });
    }

    /// Whether this driver still leads, when it has a lease.
    pub(super) fn guard(&self) -> Option<&Guard> {
        self.tenure.as_ref().map(Tenure::guard)
    }

    /// Sends what one step produced: its journal records join the group gathering for the
    /// journal, its results go to the bucket, and its answer and effects leave in order, or
    /// wait behind the writes before them (see the outbox for what need not wait).
    pub(super) async fn emit(
        &mut self,
        outbox: &mut Outgoing,
        reply: Option<Output>,
        effects: Vec<Effect>,
    ) {
        let (writes, effects): (Vec<_>, Vec<_>) = effects.into_iter().partition(Effect::is_write);
        for effect in writes {
            match effect {
                Effect::Journal(record) => self.write(outbox, record),
                Effect::StoreResult {
                    job_id,
                    index,
                    result,
                    pinned,
                } => {
                    if let (Some(results), Some(journal)) = (&self.results, &self.journal) {
                        let put = results.put(job_id, index, encode(&result), pinned);
                        outbox.write(put, |group| journal.store(group));
                    }
                }
                // Both read or delete what the writes before them stored, so they start once
                // those are done; nothing waits for them but reads of the job's results.
                Effect::PinResults { job_id, indices } => {
                    if let Some(results) = &self.results {
                        tokio::spawn(results.pin(job_id, indices, outbox.after_writes()));
                    }
                }
                Effect::UnpinResults { job_id } => {
                    if let Some(results) = &self.results {
                        let (after, unpin) = (outbox.after_writes(), results.unpin(job_id));
                        tokio::spawn(async move {
                            after.await;
                            unpin.await;
                        });
                    }
                }
                _ => {}
            }
        }
        // A client's answer follows the step's effects, held or not: its job's events
        // (`JobStart` beside `JobAccepted`) are then handed to the history writer before
        // anything wakes the connection, and their stored copies leave in the same write to
        // the socket as the events and the answer rather than in one of their own. An
        // executor's answer keeps its place before the messages the step sends it.
        let (first, last) = match reply {
            Some(answer) if !answer.to_executor() => (None, Some(answer)),
            reply => (reply, None),
        };
        for output in first
            .into_iter()
            .chain(effects.into_iter().map(Output::Effect))
            .chain(last)
        {
            // Counted as the core decides, so a scrape's counters and gauges agree even while
            // the events wait for the journal.
            if let Output::Effect(Effect::Publish(event)) = &output {
                self.count(event);
            }
            if let Some(output) = outbox.send_or_hold(output) {
                self.send(output).await;
            }
        }
    }

    /// Adds `record` to the group gathering for the journal, in parts that each fit in one
    /// message.
    pub(super) fn write(&mut self, outbox: &mut Outgoing, record: JournalRecord) {
        let Some(journal) = &self.journal else {
            return;
        };
        let max_bytes = self.limit - PAYLOAD_HEADROOM;
        // Task ends may wait a little for company; what a client waits for goes at once.
        let urgent = super::outbox::urgent(&record);
        for part in fit(record, max_bytes, "journal") {
            if let Some(schedule) = self.schedule.as_mut() {
                schedule.wrote(part.len());
            }
            outbox.record(part, urgent, max_bytes, |group| journal.store(group));
        }
    }

    /// Writes the group gathering for the journal if no write is in flight before it, or
    /// at once if `now`.
    pub(super) fn commit(&self, outbox: &mut Outgoing, now: bool) {
        let Some(journal) = &self.journal else {
            return;
        };
        let store = |group| journal.store(group);
        if now {
            outbox.seal(store);
        } else {
            outbox.commit(store);
        }
    }

    pub(super) async fn send_all(&mut self, outputs: Vec<Output>) {
        for output in outputs {
            self.send(output).await;
        }
    }

    pub(super) async fn send(&mut self, output: Output) {
        match output {
            Output::Reply(to, payload, error) => {
                let (guard, headers) = (self.guard(), self.headers.as_ref());
                answer(guard, headers, to, payload, error).await
            }
            Output::ExecutorReply(reply, payload) => self.publish(reply, payload).await,
            Output::Effect(Effect::Publish(event)) => {
                if let Some(event) = self.task_events.absorb(event) {
                    // Any other event follows the task events before it.
                    self.flush_task_events().await;
                    self.publish_event(event, self.stamps.now()).await;
                } else {
                    self.stamps.waits();
                    if self.task_events.is_full() {
                        self.flush_task_events().await;
                    }
                }
            }
            Output::Effect(Effect::PublishToTenant { tenant, event }) => {
                // As the driver makes them: a tenant's events are not merged as the
                // listeners' task events are, and not kept in the history.
                let subject = self.subjects.tenant_event(&tenant, event.kind()).into();
                self.publish_batch(subject, event).await;
            }
            Output::Effect(Effect::Send { to, message }) => {
                let subject = self.subjects.executor_inbox(&to).into();
                self.publish_batch(subject, message).await;
            }
            Output::Results { reply, read } => self.answer_with_results(reply, read),
            Output::Effect(Effect::Release {
                job_id,
                state,
                reason,
            }) => self.releases.push((job_id, state, reason)),
            // `emit` hands writes to the journal and the bucket; none reaches here.
            Output::Effect(
                Effect::Journal(_)
                | Effect::StoreResult { .. }
                | Effect::PinResults { .. }
                | Effect::UnpinResults { .. },
            ) => {}
        }
    }

    /// Sends what waits for the last journal writes (for up to `DRAIN_TIMEOUT`), and the
    /// task events that wait for company.
    pub(super) async fn drain(&mut self, outbox: &mut Outgoing) {
        self.commit(outbox, true);
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while !outbox.is_clear() {
                let released = outbox.released().await;
                self.send_released(released, outbox.released_through())
                    .await;
            }
        })
        .await;
        if drained.is_err() {
            warn!("journal writes still unacknowledged at shutdown; what waits on them is dropped");
        }
        self.flush_task_events().await;
    }

    pub(super) async fn flush_task_events(&mut self) {
        let stamp = self.stamps.of_waiting();
        for event in self.task_events.take() {
            self.publish_event(event, stamp).await;
        }
    }

    /// Publishes an event on its plain subject and, with a journal while this driver leads,
    /// hands it to the events stream's writer to store under its history subject.
    pub(super) async fn publish_event(&self, event: Event, stamp: Stamp) {
        let current = may_send(self.guard()).await;
        if let (Some(web), true) = (&self.web, current) {
            web.published(&event);
        }
        let subject: Subject = self.subjects.event(event.kind()).into();
        let Some(history) = self.history.as_ref().filter(|_| current) else {
            return self.publish_batch(subject, event).await;
        };
        let stored: Subject = self.subjects.history(event.kind()).into();
        for payload in self.fit(event, &subject) {
            // Handed to the writer first, so that the writer's task is woken before the
            // connection's: it queues its publish before the connection writes what this turn
            // sent, and both leave in one write to the socket. On the wire the plain event,
            // queued now, still comes first.
            history
                .publish(stored.clone(), payload.clone(), stamp)
                .await;
            self.publish(subject.clone(), payload).await;
        }
    }

    /// Publishes a batch, cut in halves until each part fits in one message.
    pub(super) async fn publish_batch<T: Batch + Serialize>(&self, subject: Subject, message: T) {
        for payload in self.fit(message, &subject) {
            self.publish(subject.clone(), payload).await;
        }
    }

    fn fit<T: Batch + Serialize>(&self, message: T, subject: &str) -> Vec<bytes::Bytes> {
        fit(message, self.limit - PAYLOAD_HEADROOM, subject)
    }

    /// Takes a snapshot if one is due, and returns the write that stores it.
    pub(super) fn snapshot_if_due(
        &mut self,
        core: &Core,
    ) -> Option<BoxFuture<'static, Snapshotted>> {
        let (journal, schedule) = (self.journal.as_ref()?, self.schedule.as_mut()?);
        // The clock only when the journal has grown enough, or once a revive tick (for the
        // snapshot's age): not on every step of the hot loop.
        if !schedule.grown_enough() && !std::mem::take(&mut self.ticked) {
            return None;
        }
        let now = tokio::time::Instant::now();
        if !schedule.due(now) {
            return None;
        }
        schedule.started(now);
        // Encoded as the core hands the records over, so they are never all held at once.
        let mut encoded = Encoded::new(self.limit - PAYLOAD_HEADROOM);
        let ids = core.snapshot_each(|record| encoded.add(record));
        let id = uuid::Uuid::new_v4();
        let parts = encoded.pack(id, now_ms(), ids);
        debug!(snapshot = %id, parts = parts.len(), "snapshot taken");
        Some(journal.start_snapshot(parts))
    }

    pub(super) fn snapshot_stored(&mut self, stored: Snapshotted) {
        let now = tokio::time::Instant::now();
        match &stored {
            Ok(s) => info!(
                parts = s.parts,
                bytes = s.bytes,
                purged = s.purged,
                "snapshot stored; the journal before it purged"
            ),
            Err(error) => warn!(%error, "snapshot not stored; the journal keeps what it had"),
        }
        if let Some(schedule) = self.schedule.as_mut() {
            schedule.finished(stored.as_ref().ok(), now);
        }
    }

    pub(super) async fn publish(&self, subject: Subject, payload: bytes::Bytes) {
        send(
            &self.client,
            self.guard(),
            self.headers.as_ref(),
            subject,
            payload,
        )
        .await
    }
}

/// Whether this driver may send: it leads (waiting while its lease has lapsed, see
/// [`Guard::current`]), or runs alone without a journal (and so without a lease).
async fn may_send(guard: Option<&Guard>) -> bool {
    match guard {
        Some(guard) => guard.current().await,
        None => true,
    }
}

/// Sends a client's answer as [`send`] does, through the service endpoint it came from, with
/// the service error headers of a refusal.
async fn answer(
    guard: Option<&Guard>,
    headers: Option<&async_nats::HeaderMap>,
    to: ReplyTo,
    payload: bytes::Bytes,
    error: Option<ServiceError>,
) {
    if !may_send(guard).await {
        return;
    }
    let mut headers = headers.cloned().unwrap_or_default();
    if let Some(error) = error {
        error.add_to(&mut headers);
    }
    if let Err(error) = to.respond_with_headers(Ok(payload), headers).await {
        warn!(%error, "could not answer an api request");
    }
}

/// Sends one message with the leadership's epoch, if this driver may still send: it leads, or
/// runs alone without a journal (and so without a lease).
async fn send(
    client: &Client,
    guard: Option<&Guard>,
    headers: Option<&async_nats::HeaderMap>,
    subject: Subject,
    payload: bytes::Bytes,
) {
    if !may_send(guard).await {
        return;
    }
    let sent = match headers {
        Some(headers) => {
            client
                .publish_with_headers(subject, headers.clone(), payload)
                .await
        }
        None => client.publish(subject, payload).await,
    };
    if let Err(error) = sent {
        warn!(%error, "could not publish");
    }
}
