//! Every NATS subject Ember uses, built from one cluster prefix.
//!
//! `<p>` is `ember.<cluster>`. Subjects that an executor publishes end in its id, so NATS
//! permissions can bind an executor's credentials to that id; the driver subscribes with a `*`
//! in that place and reads the id back with [`Subjects::executor_id_of`].

use crate::ids::{validate_token, ExecutorId};

/// The subjects of one cluster. Cheap to clone; build it once and pass it around.
#[derive(Debug, Clone)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    /// Subjects for `cluster`, which must be one subject token (`[A-Za-z0-9_-]`, at most 64).
    pub fn new(cluster: &str) -> Result<Self, String> {
        validate_token("cluster name", cluster)?;
        Ok(Self {
            prefix: format!("ember.{cluster}"),
        })
    }

    /// The inbox prefix `ember events` connects with, so that a listener's credentials need
    /// no inbox but this one (`listener` is no executor's id under `ember creds`).
    pub const LISTENER_INBOX: &'static str = "_INBOX.listener";

    /// `ember.<cluster>`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Where executor `id` sends `RegisterExecutor`.
    pub fn register(&self, id: &ExecutorId) -> String {
        self.join(".driver.register.", id.as_str())
    }

    /// What the driver subscribes to for registrations.
    pub fn register_all(&self) -> String {
        format!("{}.driver.register.*", self.prefix)
    }

    /// Where executor `id` sends its batches of status updates.
    pub fn status(&self, id: &ExecutorId) -> String {
        self.join(".driver.status.", id.as_str())
    }

    /// What the driver subscribes to for status updates.
    pub fn status_all(&self) -> String {
        format!("{}.driver.status.*", self.prefix)
    }

    /// Where executor `id` sends heartbeats.
    pub fn heartbeat(&self, id: &ExecutorId) -> String {
        self.join(".driver.heartbeat.", id.as_str())
    }

    /// What the driver subscribes to for heartbeats.
    pub fn heartbeat_all(&self) -> String {
        format!("{}.driver.heartbeat.*", self.prefix)
    }

    /// Where executor `id` asks for the results of jobs its tasks read (`GetResults`).
    pub fn results(&self, id: &ExecutorId) -> String {
        self.join(".driver.results.", id.as_str())
    }

    /// What the driver subscribes to for executors' reads of results.
    pub fn results_all(&self) -> String {
        format!("{}.driver.results.*", self.prefix)
    }

    /// The driver's API for clients: jobs and queries.
    pub fn api(&self) -> String {
        format!("{}.driver.api", self.prefix)
    }

    /// Executor `id`'s inbox: the driver sends it tasks and orders here.
    pub fn executor_inbox(&self, id: &ExecutorId) -> String {
        self.join(".executor.", id.as_str())
    }

    /// Where a driver that starts to lead says so to every executor
    /// ([`crate::protocol::ExecutorMessage::Leading`]): `<p>.executors`.
    pub fn executors(&self) -> String {
        format!("{}.executors", self.prefix)
    }

    /// The listener-bus subject of one event kind, such as `executor.added`.
    pub fn event(&self, kind: &str) -> String {
        self.join(".events.", kind)
    }

    /// Every event of the cluster.
    pub fn events_all(&self) -> String {
        format!("{}.events.>", self.prefix)
    }

    /// Where the driver tells tenant `account` the events of its own jobs:
    /// `<p>.tenant.<account>.events.<kind>`. The cluster's account exports each tenant's
    /// subjects to that tenant's account alone, which imports them as the plain
    /// [`Subjects::event`] subjects, so a tenant listens as the cluster's listeners do.
    pub fn tenant_event(&self, account: &str, kind: &str) -> String {
        format!("{}.tenant.{account}.events.{kind}", self.prefix)
    }

    /// Every event told to tenant `account` (see [`Subjects::tenant_event`]).
    pub fn tenant_events(&self, account: &str) -> String {
        format!("{}.tenant.{account}.events.>", self.prefix)
    }

    /// Every event told to any tenant: what the driver may publish for them.
    pub fn tenant_events_all(&self) -> String {
        format!("{}.tenant.*.events.>", self.prefix)
    }

    /// Whether `text` may stand as one token of a subject: not empty, and without the
    /// separator, the wildcards or white space.
    pub fn is_token(text: &str) -> bool {
        !text.is_empty()
            && !text
                .chars()
                .any(|c| matches!(c, '.' | '*' | '>') || c.is_whitespace() || c.is_control())
    }

    /// Where the driver stores the events in their history: `<p>.history.<kind>`, beside the
    /// plain [`Subjects::event`] the listeners hear them on. The events stream captures these
    /// and keeps each under its plain subject (`<p>.events.<kind>`), so a message sent here
    /// again after a lost acknowledgement is stored once and never reaches a plain listener.
    pub fn history(&self, kind: &str) -> String {
        self.join(".history.", kind)
    }

    /// Every subject of the event history.
    pub fn history_all(&self) -> String {
        format!("{}.history.>", self.prefix)
    }

    /// Where the driver appends its journal (a JetStream stream holds it).
    pub fn journal(&self) -> String {
        format!("{}.journal", self.prefix)
    }

    /// The name of the JetStream key-value bucket that holds task results:
    /// `EMBER_<cluster>_RESULTS`, its keys `<job_id>.<index>`.
    pub fn results_bucket(&self) -> String {
        let cluster = self.prefix.trim_start_matches("ember.");
        format!("EMBER_{cluster}_RESULTS")
    }

    /// The name of the key-value bucket that holds the results tasks read (pinned results):
    /// `EMBER_<cluster>_PINNED`, its keys `<job_id>.<index>` as the results bucket's.
    pub fn pinned_bucket(&self) -> String {
        let cluster = self.prefix.trim_start_matches("ember.");
        format!("EMBER_{cluster}_PINNED")
    }

    /// The name of the JetStream object store that holds the cluster's objects:
    /// `EMBER_<cluster>_OBJECTS` (its stream `OBJ_EMBER_<cluster>_OBJECTS`).
    pub fn objects_bucket(&self) -> String {
        let cluster = self.prefix.trim_start_matches("ember.");
        format!("EMBER_{cluster}_OBJECTS")
    }

    /// The key-value bucket that holds the drivers' leader lease: `EMBER_<cluster>_LEADER`.
    pub fn leader_bucket(&self) -> String {
        let cluster = self.prefix.trim_start_matches("ember.");
        format!("EMBER_{cluster}_LEADER")
    }

    /// The name of the JetStream stream that holds the journal: `EMBER_<cluster>_JOURNAL`
    /// (stream names may not contain dots).
    pub fn journal_stream(&self) -> String {
        let cluster = self.prefix.trim_start_matches("ember.");
        format!("EMBER_{cluster}_JOURNAL")
    }

    /// The name of the JetStream stream that holds the event history: `EMBER_<cluster>_EVENTS`,
    /// capturing [`Subjects::history_all`].
    pub fn events_stream(&self) -> String {
        let cluster = self.prefix.trim_start_matches("ember.");
        format!("EMBER_{cluster}_EVENTS")
    }

    /// The inbox prefix an executor connects with, so replies to it stay under its own id.
    pub fn executor_reply_prefix(id: &ExecutorId) -> String {
        format!("_INBOX.{id}")
    }

    /// Who owns the reply subject `reply`: `<owner>` of `_INBOX.<owner>.<rest>`, the token an
    /// inbox prefix (`_INBOX.<id>`, as executors set it) puts before a connection's own inbox
    /// names. The one reading of reply subjects the driver and the client share.
    pub fn inbox_owner(reply: &str) -> Option<&str> {
        let (owner, _) = reply.strip_prefix("_INBOX.")?.split_once('.')?;
        Some(owner)
    }

    /// The executor whose inbox prefix `inbox` (a reply subject a connection makes, such as
    /// `_INBOX.exec-1.<nuid>`) lies under, if it has an executor's shape: `_INBOX.<id>.<last>`
    /// with `<id>` an executor id (and not the listener's). A connection's own inboxes are
    /// `_INBOX.<nuid>` with the default prefix, which has no executor.
    pub fn executor_of_inbox(inbox: &str) -> Option<ExecutorId> {
        let owner = Self::inbox_owner(inbox)?;
        let last = &inbox["_INBOX.".len() + owner.len() + 1..];
        if last.contains('.') || format!("_INBOX.{owner}") == Self::LISTENER_INBOX {
            return None;
        }
        ExecutorId::parse(owner).ok()
    }

    /// Whether `reply` lies under executor `id`'s own inbox prefix. NATS does not check where a
    /// requester points its reply, so the driver does before it answers.
    pub fn reply_is_owned_by(reply: &str, id: &str) -> bool {
        Self::inbox_owner(reply) == Some(id)
    }

    /// `<p><middle><last>`, put together without the formatting machinery: the driver builds
    /// one of these for every message it sends to an executor's inbox.
    fn join(&self, middle: &str, last: &str) -> String {
        let mut subject = String::with_capacity(self.prefix.len() + middle.len() + last.len());
        subject.push_str(&self.prefix);
        subject.push_str(middle);
        subject.push_str(last);
        subject
    }

    /// The last token of a `<p>.driver.<kind>.<id>` subject: the id the sender claims.
    pub fn executor_id_of(subject: &str) -> &str {
        subject.rsplit('.').next().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_the_documented_shape() {
        let s = Subjects::new("prod").unwrap();
        let id = ExecutorId::parse("exec-1").unwrap();
        assert_eq!(s.register(&id), "ember.prod.driver.register.exec-1");
        assert_eq!(s.register_all(), "ember.prod.driver.register.*");
        assert_eq!(s.status(&id), "ember.prod.driver.status.exec-1");
        assert_eq!(s.heartbeat(&id), "ember.prod.driver.heartbeat.exec-1");
        assert_eq!(s.results(&id), "ember.prod.driver.results.exec-1");
        assert_eq!(s.results_all(), "ember.prod.driver.results.*");
        assert_eq!(s.api(), "ember.prod.driver.api");
        assert_eq!(s.executor_inbox(&id), "ember.prod.executor.exec-1");
        assert_eq!(s.executors(), "ember.prod.executors");
        assert_eq!(
            s.event("executor.added"),
            "ember.prod.events.executor.added"
        );
        assert_eq!(s.events_all(), "ember.prod.events.>");
        assert_eq!(
            s.tenant_event("EMBER_prod_TENANT_a", "job.end"),
            "ember.prod.tenant.EMBER_prod_TENANT_a.events.job.end"
        );
        assert_eq!(
            s.tenant_events("EMBER_prod_TENANT_a"),
            "ember.prod.tenant.EMBER_prod_TENANT_a.events.>"
        );
        assert_eq!(s.tenant_events_all(), "ember.prod.tenant.*.events.>");
        assert!(Subjects::is_token("EMBER_prod_TENANT_a"));
        for bad in ["", "a.b", "a*", ">", "a b", "a\tb"] {
            assert!(!Subjects::is_token(bad), "{bad:?}");
        }
        assert_eq!(s.history("job.end"), "ember.prod.history.job.end");
        assert_eq!(s.history_all(), "ember.prod.history.>");
        assert_eq!(s.journal(), "ember.prod.journal");
        assert_eq!(s.journal_stream(), "EMBER_prod_JOURNAL");
        assert_eq!(s.events_stream(), "EMBER_prod_EVENTS");
        assert_eq!(
            Subjects::executor_id_of("ember.prod.driver.register.exec-1"),
            "exec-1"
        );
    }

    #[test]
    fn cluster_names_must_be_one_token() {
        assert!(Subjects::new("a.b").is_err());
        assert!(Subjects::new("").is_err());
        assert!(Subjects::new("*").is_err());
    }

    #[test]
    fn reply_ownership_needs_the_exact_id_token() {
        assert!(Subjects::reply_is_owned_by("_INBOX.e1.abc.1", "e1"));
        assert!(!Subjects::reply_is_owned_by("_INBOX.e10.abc", "e1"));
        assert!(!Subjects::reply_is_owned_by("_INBOX.e1", "e1"));
        assert!(!Subjects::reply_is_owned_by(
            "ember.default.executor.e1",
            "e1"
        ));
        assert_eq!(Subjects::inbox_owner("_INBOX.e1.abc.1"), Some("e1"));
        assert_eq!(Subjects::inbox_owner("_INBOX.abc"), None);
        assert_eq!(Subjects::inbox_owner("_MINE.e1.abc"), None);
    }

    #[test]
    fn an_inbox_has_an_executor_s_shape_only_under_a_prefix_of_one_id() {
        let owner = |inbox| Subjects::executor_of_inbox(inbox).map(|id| id.to_string());
        assert_eq!(owner("_INBOX.exec-1.Xy3"), Some("exec-1".into()));
        // The default prefix: `_INBOX.<nuid>`.
        assert_eq!(owner("_INBOX.Xy3"), None);
        assert_eq!(owner("_INBOX.listener.Xy3"), None);
        assert_eq!(owner("_INBOX.app.api.Xy3"), None);
        assert_eq!(owner("_MINE.exec-1.Xy3"), None);
    }
}
