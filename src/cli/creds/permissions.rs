//! What each role of `ember creds` may publish and subscribe to: the permissions that bind an
//! executor to its own id, keep the journal, results and lease the driver's, and let listeners
//! only read.

use super::Role;
use crate::driver::advisories::DISCONNECT_ADVISORIES;
use crate::ids::ExecutorId;
use crate::subjects::Subjects;

/// A user's permissions, as nats-server reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    pub publish_allow: Vec<String>,
    pub publish_deny: Vec<String>,
    pub subscribe_allow: Vec<String>,
    pub subscribe_deny: Vec<String>,
    /// May publish to the reply subject of a request it received (once, for a while).
    pub allow_responses: bool,
}

impl Role {
    /// The permissions of this role in `subjects`' cluster. `executors` are the cluster's
    /// executor ids: a client may read replies in any inbox but theirs.
    pub fn permissions(&self, subjects: &Subjects, executors: &[ExecutorId]) -> Permissions {
        let p = subjects.prefix();
        match self {
            Role::Driver => Permissions {
                publish_allow: [
                    vec![
                        format!("{p}.executor.*"),
                        subjects.executors(),
                        subjects.events_all(),
                        subjects.tenant_events_all(),
                        subjects.history_all(),
                    ],
                    journal_rights(subjects),
                    object_rights(subjects, true),
                ]
                .concat(),
                // Replies to its JetStream requests (stream setup, replay, write acks), the
                // discovery requests of its NATS service, and the servers' disconnect
                // advisories where the account imports them (its own account's alone).
                subscribe_allow: vec![
                    format!("{p}.driver.>"),
                    "_INBOX.>".into(),
                    "$SRV.>".into(),
                    DISCONNECT_ADVISORIES.into(),
                ],
                allow_responses: true,
                ..Permissions::default()
            },
            Role::Executor(id) => Permissions {
                // Its requests to the driver, and the object store: the inputs of its tasks to
                // read, their outputs and results too large for one message to put.
                publish_allow: [
                    vec![format!("{p}.driver.*.{id}")],
                    object_rights(subjects, false),
                ]
                .concat(),
                subscribe_allow: vec![
                    subjects.executor_inbox(id),
                    subjects.executors(),
                    executor_replies(id),
                ],
                ..Permissions::default()
            },
            Role::Client => Permissions {
                // The api, finding the drivers by their NATS service, and the event history.
                publish_allow: [
                    vec![
                        subjects.api(),
                        format!("$SRV.*.{}", crate::driver::discovery::NAME),
                        format!("$SRV.*.{}.>", crate::driver::discovery::NAME),
                    ],
                    history_rights(subjects),
                    object_rights(subjects, false),
                ]
                .concat(),
                subscribe_allow: vec!["_INBOX.>".into(), subjects.events_all()],
                subscribe_deny: executors.iter().map(executor_replies).collect(),
                ..Permissions::default()
            },
            Role::Listener => Permissions {
                // Nothing but reading the event history; its answers come to an inbox of
                // its own.
                publish_allow: history_rights(subjects),
                subscribe_allow: vec![
                    subjects.events_all(),
                    format!("{}.>", Subjects::LISTENER_INBOX),
                ],
                ..Permissions::default()
            },
            // What crosses a leaf link is what the leaf server's own users may do, each
            // held to its role there.
            Role::Leaf(_) => Permissions::default(),
            // Its account imports the api and its own events and holds nothing else; the
            // replies to its requests come back through the import to its inbox.
            Role::Tenant(_) => Permissions {
                publish_allow: vec![subjects.api()],
                subscribe_allow: vec!["_INBOX.>".into(), subjects.events_all()],
                ..Permissions::default()
            },
        }
    }
}

/// What the driver publishes to keep its journal, results and lease: the journal subject, the
/// JetStream API calls on its own stream alone (set it up, read it back with an ordered
/// consumer, purge what a snapshot replaces), and the keys and streams of its results bucket
/// and its leader lease. No other role may write the journal, the results or the lease, or
/// touch their streams.
fn journal_rights(subjects: &Subjects) -> Vec<String> {
    let stream = subjects.journal_stream();
    let mut rights = vec![subjects.journal(), "$JS.API.INFO".into()];
    // The events stream: the driver makes it; its events are published on the event subjects.
    for call in ["STREAM.CREATE", "STREAM.UPDATE", "STREAM.INFO"] {
        rights.push(format!("$JS.API.{call}.{}", subjects.events_stream()));
    }
    for call in [
        "STREAM.CREATE",
        "STREAM.UPDATE",
        "STREAM.INFO",
        "STREAM.PURGE",
        "CONSUMER.CREATE",
    ] {
        rights.push(format!("$JS.API.{call}.{stream}"));
    }
    for call in [
        "CONSUMER.CREATE",
        "CONSUMER.MSG.NEXT",
        "CONSUMER.INFO",
        "CONSUMER.DELETE",
    ] {
        rights.push(format!("$JS.API.{call}.{stream}.>"));
    }
    // The results bucket, its pinned results and the leader lease: key-value buckets, each a
    // stream KV_<bucket>; the pinned results' stream is purged of a forgotten job's.
    rights.push(format!(
        "$JS.API.STREAM.PURGE.KV_{}",
        subjects.pinned_bucket()
    ));
    for bucket in [
        subjects.results_bucket(),
        subjects.pinned_bucket(),
        subjects.leader_bucket(),
    ] {
        rights.push(format!("$KV.{bucket}.>"));
        for call in [
            "STREAM.CREATE",
            "STREAM.UPDATE",
            "STREAM.INFO",
            "STREAM.MSG.GET",
        ] {
            rights.push(format!("$JS.API.{call}.KV_{bucket}"));
        }
        rights.push(format!("$JS.API.DIRECT.GET.KV_{bucket}.>"));
    }
    rights
}

/// What using the object store takes (`objects::Objects`): putting chunks and metadata, and
/// reading them back (stream info, direct gets, ordered consumers and their flow control);
/// with `manage`, the driver's part: making the store and purging it, which no other role may.
fn object_rights(subjects: &Subjects, manage: bool) -> Vec<String> {
    let bucket = subjects.objects_bucket();
    let stream = format!("OBJ_{bucket}");
    let mut rights = vec![
        format!("$O.{bucket}.>"),
        format!("$JS.API.STREAM.INFO.{stream}"),
        format!("$JS.API.STREAM.MSG.GET.{stream}"),
        format!("$JS.API.DIRECT.GET.{stream}"),
        format!("$JS.API.DIRECT.GET.{stream}.>"),
        format!("$JS.API.CONSUMER.CREATE.{stream}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}.>"),
        format!("$JS.API.CONSUMER.DELETE.{stream}.>"),
        format!("$JS.API.CONSUMER.INFO.{stream}.>"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.>"),
        format!("$JS.FC.{stream}.>"),
    ];
    if !manage {
        // The driver has it already, for its journal.
        rights.push("$JS.API.INFO".into());
    }
    if manage {
        for call in ["STREAM.CREATE", "STREAM.UPDATE", "STREAM.PURGE"] {
            rights.push(format!("$JS.API.{call}.{stream}"));
        }
    }
    rights
}

/// What reading the event history takes: making ordered consumers of the events stream (and
/// deleting them, as an ordered consumer does with the one it replaces when it resumes),
/// pulling from them and acknowledging; nothing of the stream itself, which stays the driver's.
fn history_rights(subjects: &Subjects) -> Vec<String> {
    let stream = subjects.events_stream();
    vec![
        format!("$JS.API.CONSUMER.CREATE.{stream}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}.>"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.>"),
        format!("$JS.API.CONSUMER.DELETE.{stream}.>"),
        format!("$JS.ACK.{stream}.>"),
    ]
}

/// `_INBOX.<id>.>`: where the driver's answers to executor `id` arrive.
fn executor_replies(id: &ExecutorId) -> String {
    format!("{}.>", Subjects::executor_reply_prefix(id))
}
