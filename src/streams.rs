//! Ember's streams and buckets in JetStream: made when missing, used as they are when they
//! exist. An operator's settings are never overwritten: a stream that exists must have the
//! settings Ember relies on (its subjects, how it discards, ...), and one that does not is
//! refused, naming each setting and the value Ember needs. Its limits and replicas are the
//! operator's: they are kept, and where they differ from what Ember's flags ask, a warning says
//! so once.

use crate::driver::jetstream::until_answered;
use async_nats::jetstream::{self, stream};
use std::time::Duration;
use tracing::warn;

/// A setting of a stream that Ember relies on, beside its subjects, its retention by limits,
/// its file storage and its taking writes, which every stream of Ember's needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Stores under other subjects (the events stream).
    SubjectTransform,
    /// Drops its oldest messages when full, or refuses new ones.
    Discard,
    /// Keeps at most so many messages per subject (a key-value bucket's history).
    MaxPerSubject,
    /// Lets a message replace a subject's others (key-value and object stores).
    Rollup,
    /// Answers direct gets (key-value and object stores).
    Direct,
    /// Remembers message ids at least this long, for de-duplication.
    DuplicateWindow,
    /// Drops nothing by count or size: only the snapshots' purges and `max_age` remove
    /// records (the journal).
    Unbounded,
    /// May be purged by the driver.
    Purge,
}

/// What every stream of Ember's needs, before its own [`Need`]s.
fn common(wanted: &stream::Config, has: &stream::Config) -> Vec<String> {
    let mut misfits = Vec::new();
    let mut theirs = has.subjects.clone();
    let mut ours = wanted.subjects.clone();
    theirs.sort();
    ours.sort();
    if theirs != ours {
        misfits.push(format!("subjects are {theirs:?}; needs {ours:?}"));
    }
    if has.retention != stream::RetentionPolicy::Limits {
        misfits.push(format!("retention is {:?}; needs Limits", has.retention));
    }
    if has.storage != stream::StorageType::File {
        misfits.push(format!("storage is {:?}; needs File", has.storage));
    }
    if has.mirror.is_some() || has.sealed {
        misfits.push("it is a mirror or sealed; needs to take writes".into());
    }
    misfits
}

/// Why `has` does not meet `need` as `wanted` has it, if it does not.
fn misfit(need: Need, wanted: &stream::Config, has: &stream::Config) -> Option<String> {
    let differs = |what: &str, theirs: String, ours: String| {
        (theirs != ours).then(|| format!("{what} is {theirs}; needs {ours}"))
    };
    match need {
        Need::SubjectTransform => differs(
            "subject_transform",
            transform(&has.subject_transform),
            transform(&wanted.subject_transform),
        ),
        Need::Discard => differs(
            "discard",
            format!("{:?}", has.discard),
            format!("{:?}", wanted.discard),
        ),
        Need::MaxPerSubject => differs(
            "max_msgs_per_subject",
            has.max_messages_per_subject.to_string(),
            wanted.max_messages_per_subject.to_string(),
        ),
        Need::Rollup => (!has.allow_rollup).then(|| "allow_rollup is false; needs true".into()),
        Need::Direct => (!has.allow_direct).then(|| "allow_direct is false; needs true".into()),
        Need::DuplicateWindow => (has.duplicate_window < wanted.duplicate_window).then(|| {
            format!(
                "duplicate_window is {:?}; needs at least {:?}",
                has.duplicate_window, wanted.duplicate_window
            )
        }),
        Need::Unbounded => (has.max_messages > 0 || has.max_bytes > 0).then(|| {
            format!(
                "max_msgs is {} and max_bytes {}; needs neither",
                limit(has.max_messages),
                limit(has.max_bytes)
            )
        }),
        Need::Purge => has
            .deny_purge
            .then(|| "deny_purge is true; needs false".into()),
    }
}

fn transform(transform: &Option<stream::SubjectTransform>) -> String {
    match transform {
        Some(t) => format!("{} -> {}", t.source, t.destination),
        None => "none".into(),
    }
}

/// What differs between the limits and replicas `wanted` asks and those `has` keeps.
fn kept(wanted: &stream::Config, has: &stream::Config, needs: &[Need]) -> Vec<String> {
    let mut kept = Vec::new();
    if has.max_age != wanted.max_age {
        kept.push(format!(
            "max_age {} (asked {})",
            age(has.max_age),
            age(wanted.max_age)
        ));
    }
    if !needs.contains(&Need::Unbounded) && limit(has.max_bytes) != limit(wanted.max_bytes) {
        kept.push(format!(
            "max_bytes {} (asked {})",
            limit(has.max_bytes),
            limit(wanted.max_bytes)
        ));
    }
    if has.num_replicas.max(1) != wanted.num_replicas.max(1) {
        kept.push(format!(
            "{} replicas (asked {})",
            has.num_replicas.max(1),
            wanted.num_replicas.max(1)
        ));
    }
    kept
}

/// A count or size limit: none at 0 or -1.
fn limit(n: i64) -> String {
    if n > 0 {
        n.to_string()
    } else {
        "none".into()
    }
}

fn age(age: Duration) -> String {
    if age.is_zero() {
        "none".into()
    } else {
        format!("{age:?}")
    }
}

/// Why a stream that exists cannot be used, each setting with the value Ember needs; empty if
/// it can.
pub fn misfits(wanted: &stream::Config, has: &stream::Config, needs: &[Need]) -> Vec<String> {
    let mut misfits = common(wanted, has);
    misfits.extend(needs.iter().filter_map(|need| misfit(*need, wanted, has)));
    misfits
}

/// The refusal of stream `name`, whose settings do not fit.
pub fn refusal(name: &str, misfits: &[String]) -> String {
    format!(
        "stream {name} exists with settings Ember cannot use: {}. Change them (`nats stream \
         edit {name}`), or remove the stream and Ember makes it",
        misfits.join("; ")
    )
}

/// The configuration of the stream `wanted` names if it exists and meets `needs` (with a
/// warning for each limit it keeps that `wanted` would set otherwise); `None` if there is no
/// such stream; the refusal (see [`refusal`]) if it does not fit or JetStream does not say.
pub async fn existing(
    context: &jetstream::Context,
    wanted: &stream::Config,
    needs: &[Need],
) -> Result<Option<stream::Config>, String> {
    let name = &wanted.name;
    let found = until_answered(name, || context.get_stream(name)).await;
    let has = match found {
        Ok(stream) => stream.cached_info().config.clone(),
        Err(error) if error.to_string().contains("stream not found") => return Ok(None),
        Err(error) => return Err(format!("stream {name}: {error}")),
    };
    let misfits = misfits(wanted, &has, needs);
    if !misfits.is_empty() {
        return Err(refusal(name, &misfits));
    }
    let kept = kept(wanted, &has, needs);
    if !kept.is_empty() {
        warn!(
            stream = %name,
            kept = %kept.join(", "),
            "the stream exists: used as it is, with its own limits and replicas"
        );
    }
    Ok(Some(has))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal() -> stream::Config {
        stream::Config {
            name: "J".into(),
            subjects: vec!["a.journal".into()],
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(30),
            ..Default::default()
        }
    }

    #[test]
    fn a_stream_with_what_ember_needs_fits_whatever_else_it_has() {
        let wanted = journal();
        let mut has = journal();
        has.description = Some("made by the operators".into());
        has.max_age = Duration::from_secs(86_400);
        has.num_replicas = 3;
        has.duplicate_window = Duration::from_secs(120);
        let needs = [Need::DuplicateWindow, Need::Unbounded, Need::Purge];
        assert_eq!(misfits(&wanted, &has, &needs), Vec::<String>::new());
        assert_eq!(
            kept(&wanted, &has, &needs),
            ["max_age 86400s (asked none)", "3 replicas (asked 1)"]
        );
    }

    #[test]
    fn each_setting_that_does_not_fit_is_named_with_what_ember_needs() {
        let wanted = stream::Config {
            subject_transform: Some(stream::SubjectTransform {
                source: "a.history.>".into(),
                destination: "a.events.>".into(),
            }),
            discard: stream::DiscardPolicy::Old,
            ..journal()
        };
        let has = stream::Config {
            subjects: vec!["a.other".into()],
            storage: stream::StorageType::Memory,
            discard: stream::DiscardPolicy::New,
            duplicate_window: Duration::from_secs(1),
            max_bytes: 1 << 20,
            deny_purge: true,
            retention: stream::RetentionPolicy::WorkQueue,
            ..journal()
        };
        let needs = [
            Need::SubjectTransform,
            Need::Discard,
            Need::DuplicateWindow,
            Need::Unbounded,
            Need::Purge,
        ];
        let found = misfits(&wanted, &has, &needs);
        let expected = [
            "subjects are [\"a.other\"]; needs [\"a.journal\"]",
            "retention is WorkQueue; needs Limits",
            "storage is Memory; needs File",
            "subject_transform is none; needs a.history.> -> a.events.>",
            "discard is New; needs Old",
            "duplicate_window is 1s; needs at least 30s",
            "max_msgs is none and max_bytes 1048576; needs neither",
            "deny_purge is true; needs false",
        ];
        assert_eq!(found, expected);
        let refused = refusal("J", &found);
        assert!(refused.starts_with("stream J exists with settings Ember cannot use: subjects"));
        assert!(refused.contains("nats stream edit J"), "{refused}");
    }
}
