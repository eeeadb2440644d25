//! Identifiers that travel on the wire, validated where they enter.
//!
//! An executor id becomes a subject token, so it is held to what a token may be: `[A-Za-z0-9_-]`,
//! 1 to 64 characters. Anything else is refused with a message that says which rule it broke.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// The longest id (or cluster name) Ember accepts, in bytes.
pub const MAX_ID_LEN: usize = 64;

/// Checks that `value` can stand as one NATS subject token; `what` names it in the error.
pub fn validate_token(what: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if value.len() > MAX_ID_LEN {
        return Err(format!(
            "{what} is {} bytes long; the limit is {MAX_ID_LEN}",
            value.len()
        ));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(format!(
            "{what} {value:?} contains {bad:?}; only A-Z, a-z, 0-9, '_' and '-' are allowed"
        ));
    }
    Ok(())
}

/// An executor's id: one subject token, given by the operator or a generated UUID. Shared, not
/// copied: the driver stores it with every attempt it launches, and compares two copies of one
/// id without reading them.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "String")]
pub struct ExecutorId(Arc<str>);

impl PartialEq for ExecutorId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Eq for ExecutorId {}

impl PartialOrd for ExecutorId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ExecutorId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            return std::cmp::Ordering::Equal;
        }
        self.0.cmp(&other.0)
    }
}

impl std::hash::Hash for ExecutorId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl ExecutorId {
    /// Parses and validates an id.
    pub fn parse(value: impl Into<String>) -> Result<Self, String> {
        let value = value.into();
        validate_token("executor id", &value)?;
        Ok(Self(value.into()))
    }

    /// A fresh id: a v4 UUID.
    pub fn generate() -> Self {
        Self(uuid::Uuid::new_v4().to_string().into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Serialize for ExecutorId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl TryFrom<String> for ExecutorId {
    type Error = String;
    fn try_from(value: String) -> Result<Self, String> {
        Self::parse(value)
    }
}

impl From<ExecutorId> for String {
    fn from(id: ExecutorId) -> String {
        id.0.to_string()
    }
}

impl fmt::Display for ExecutorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Made once per executor process. It tells a retry of the same process (its reply was lost)
/// from a second process that claims an id already taken.
pub type InstanceId = uuid::Uuid;

/// A job's id, unique within one driver.
pub type JobId = u64;

/// A task's id, unique within one driver across all jobs (as Spark's `taskId`).
pub type TaskId = u64;

/// Checks that `host_port` reads as `host:port` with a non-empty host and a port number.
pub fn validate_host_port(host_port: &str) -> Result<(), String> {
    let bad = || format!("host_port {host_port:?} is not host:port (e.g. \"worker-3:7078\")");
    let (host, port) = host_port.rsplit_once(':').ok_or_else(bad)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || host.len() > 255 || host.chars().any(|c| c.is_whitespace()) {
        return Err(bad());
    }
    port.parse::<u16>().map_err(|_| bad())?;
    Ok(())
}

/// The host part of `host:port` (without brackets for IPv6).
pub fn host_of(host_port: &str) -> &str {
    let host = host_port.rsplit_once(':').map_or(host_port, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// `host:port` of `host` (as [`host_of`] reads it) and `port`: an IPv6 host in brackets.
pub fn join_host_port(host: &str, port: &str) -> String {
    match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_one_subject_token() {
        assert!(ExecutorId::parse("exec_1-A").is_ok());
        for bad in ["", "a.b", "a*", ">", "a b", "é", &"x".repeat(65)] {
            assert!(ExecutorId::parse(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(ExecutorId::parse("x".repeat(64)).is_ok());
        assert!(ExecutorId::parse(ExecutorId::generate().to_string()).is_ok());
    }

    #[test]
    fn copies_and_separate_parses_of_an_id_compare_alike() {
        use std::cmp::Ordering;
        use std::hash::BuildHasher;
        let a = ExecutorId::parse("exec-a").unwrap();
        let parsed_again = ExecutorId::parse("exec-a").unwrap();
        let b = ExecutorId::parse("exec-b").unwrap();
        let hasher = std::collections::hash_map::RandomState::new();
        for same in [a.clone(), parsed_again] {
            assert_eq!(a, same);
            assert_eq!(a.cmp(&same), Ordering::Equal);
            assert_eq!(hasher.hash_one(&a), hasher.hash_one(&same));
        }
        assert_ne!(a, b);
        assert_eq!(a.cmp(&b), Ordering::Less);
        assert_eq!(b.cmp(&a.clone()), Ordering::Greater);
    }

    #[test]
    fn host_port_needs_a_host_and_a_port() {
        for ok in ["h:1", "worker-3.local:7078", "[::1]:80", "10.0.0.1:0"] {
            assert!(validate_host_port(ok).is_ok(), "{ok}");
        }
        for bad in ["h", ":80", "h:", "h:99999", "h:x", "a b:1"] {
            assert!(validate_host_port(bad).is_err(), "{bad}");
        }
    }
}
