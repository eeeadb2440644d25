//! Who may be answered: the checks a request passes before the core sees it, and the count of
//! those that did not. NATS does not check where a requester points its reply, so the driver
//! answers an executor only in that executor's own inbox, and a client anywhere but an
//! executor's inbox or Ember's own subjects.

use super::discovery::ApiCounts;
use crate::ids::ExecutorId;
use crate::metrics::DriverMetrics;
use crate::subjects::Subjects;
use async_nats::{Message, Subject};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tracing::{debug, warn};

/// Why a request was refused before the core saw it.
#[derive(Clone, Copy)]
pub(super) enum Refusal {
    NoReply,
    ForeignReply,
    Undecodable,
}

/// The checks, and the requests refused or dropped before the core saw them, counted; the
/// counts go to the log (one line when they change, at most once per revive tick) rather than a
/// line per message, which a flood could turn into a flood of log lines.
pub(super) struct Admission {
    no_reply: AtomicU64,
    foreign_reply: AtomicU64,
    undecodable: AtomicU64,
    reported: AtomicU64,
    /// Whether an api request from an executor's inbox has been logged at warn (the first is).
    executor_inbox_said: AtomicBool,
    /// What the api endpoint counts for `$SRV.STATS`.
    api_counts: Arc<ApiCounts>,
    metrics: Arc<DriverMetrics>,
}

impl Admission {
    pub(super) fn new(api_counts: Arc<ApiCounts>, metrics: Arc<DriverMetrics>) -> Self {
        Self {
            no_reply: AtomicU64::new(0),
            foreign_reply: AtomicU64::new(0),
            undecodable: AtomicU64::new(0),
            reported: AtomicU64::new(0),
            executor_inbox_said: AtomicBool::new(false),
            api_counts,
            metrics,
        }
    }

    /// Counts a request refused for `why`, for the log and the metrics.
    pub(super) fn refuse(&self, why: Refusal) {
        let (counter, reason) = match why {
            Refusal::NoReply => (&self.no_reply, "no_reply"),
            Refusal::ForeignReply => (&self.foreign_reply, "foreign_reply"),
            Refusal::Undecodable => (&self.undecodable, "undecodable"),
        };
        counter.fetch_add(1, Relaxed);
        self.metrics.refused(reason);
    }

    /// Counts an api request answered with an error, for `$SRV.STATS`.
    pub(super) fn api_error(&self) {
        self.api_counts.errors.fetch_add(1, Relaxed);
    }

    /// Logs the counts if they changed since the last report.
    pub(super) fn report(&self) {
        let (no_reply, foreign, undecodable) = (
            self.no_reply.load(Relaxed),
            self.foreign_reply.load(Relaxed),
            self.undecodable.load(Relaxed),
        );
        let total = no_reply + foreign + undecodable;
        if total != self.reported.swap(total, Relaxed) {
            warn!(
                no_reply,
                foreign_reply = foreign,
                undecodable,
                "requests refused so far"
            );
        }
    }

    /// The reply subject of a request on an executor's subject, if it is that executor's own.
    /// A request that would have the driver answer into someone else's inbox gets no answer.
    pub(super) fn executor_reply(&self, message: &Message, claimed: &str) -> Option<Subject> {
        let Some(reply) = &message.reply else {
            debug!(subject = %message.subject, "request without a reply subject dropped");
            self.refuse(Refusal::NoReply);
            return None;
        };
        if !Subjects::reply_is_owned_by(reply, claimed) {
            debug!(subject = %message.subject, reply = %reply, "reply subject outside the sender's inbox; refused");
            self.refuse(Refusal::ForeignReply);
            return None;
        }
        Some(reply.clone())
    }

    /// Whether an api request may be answered where it asks: anywhere but under a registered
    /// executor's inbox (`registered` says which are) and Ember's own subjects.
    pub(super) fn api_reply(
        &self,
        message: &Message,
        registered: impl Fn(&ExecutorId) -> bool,
    ) -> bool {
        let Some(reply) = &message.reply else {
            debug!("api message without a reply subject dropped");
            self.refuse(Refusal::NoReply);
            self.api_counts.no_reply.fetch_add(1, Relaxed);
            return false;
        };
        let Err(why) = api_reply_allowed(reply, registered) else {
            return true;
        };
        match &why {
            // Most likely a program that uses its executor's connection for the api too: said
            // once, plainly, since that program waits for an answer that never comes.
            ForeignApiReply::ExecutorInbox(executor)
                if !self.executor_inbox_said.swap(true, Relaxed) =>
            {
                warn!(
                    %executor,
                    reply = %reply,
                    "api request dropped without an answer: its reply lies under executor \
                     {executor}'s inbox, where the driver answers no api request (a program \
                     running an executor opens a second connection, with client credentials, \
                     for the api); later ones are counted as foreign_reply"
                )
            }
            _ => debug!(reply = %reply, why = why.why(), "api request refused"),
        }
        self.refuse(Refusal::ForeignReply);
        self.api_counts.foreign_reply.fetch_add(1, Relaxed);
        false
    }
}

/// Why an api request's reply subject was refused.
enum ForeignApiReply {
    /// The reply subject is one of Ember's own.
    Ember,
    /// The reply subject lies under this registered executor's inbox.
    ExecutorInbox(ExecutorId),
}

impl ForeignApiReply {
    fn why(&self) -> &'static str {
        match self {
            ForeignApiReply::Ember => "the reply subject is one of Ember's",
            ForeignApiReply::ExecutorInbox(_) => {
                "the reply subject is under a registered executor's inbox"
            }
        }
    }
}

/// An api answer may go to any inbox but an executor's, and never into Ember's own subjects:
/// NATS lets a requester point the reply anywhere the driver may publish, such as an
/// executor's inbox.
fn api_reply_allowed(
    reply: &str,
    registered: impl Fn(&ExecutorId) -> bool,
) -> Result<(), ForeignApiReply> {
    if reply.starts_with("ember.") {
        return Err(ForeignApiReply::Ember);
    }
    let owner = Subjects::inbox_owner(reply)
        .and_then(|token| ExecutorId::parse(token).ok())
        .filter(|id| registered(id));
    match owner {
        Some(id) => Err(ForeignApiReply::ExecutorInbox(id)),
        None => Ok(()),
    }
}
