//! The cluster's object store: data that tasks read and make, kept beside the tasks rather than
//! inside their messages. It lives in JetStream's Object Store (`EMBER_<cluster>_OBJECTS`),
//! each object named by the SHA-256 of its content ([`ObjectRef`]): the same bytes are stored
//! once, and whoever reads an object checks the bytes against its name.
//!
//! Clients and executors write and read objects themselves ([`Objects`]); no object's bytes
//! pass through the driver. A put checks before it writes: content already stored sends no
//! chunk, and an object's name is never written twice (the metadata is written only if none
//! is there, so two writers racing with the same bytes leave one object).

pub mod cache;
pub mod host;
mod store;

pub use store::{ObjectStat, Objects, ObjectsError, Put, Usage, CHUNK_BYTES};

use serde::{Deserialize, Serialize};

/// How long an object outlives its put and the last kept job that used it, unless told
/// otherwise.
pub const DEFAULT_OBJECTS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// How many bytes the object store holds unless told otherwise: no limit of its own.
pub const DEFAULT_OBJECTS_MAX_BYTES: u64 = 0;
use sha2::{Digest, Sha256};

/// A reference to an object: the SHA-256 of its content, as 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ObjectRef(String);

impl ObjectRef {
    /// The reference of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self::from_digest(Sha256::digest(bytes).into())
    }

    /// The reference of a SHA-256 digest.
    pub fn from_digest(digest: [u8; 32]) -> Self {
        use std::fmt::Write;
        let mut hex = String::with_capacity(64);
        for byte in digest {
            let _ = write!(hex, "{byte:02x}");
        }
        Self(hex)
    }

    /// Reads a reference: 64 hex digits (upper case is read as lower).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "`{}` is not an object reference: one is the SHA-256 of the object's content, \
                 64 hex digits, as `ember put` prints",
                crate::text::clip(text, 80)
            ));
        }
        Ok(Self(text.to_ascii_lowercase()))
    }

    /// The 64 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 digits, for tables.
    pub fn short(&self) -> &str {
        &self.0[..12]
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for ObjectRef {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        Self::parse(&text)
    }
}

impl From<ObjectRef> for String {
    fn from(object: ObjectRef) -> String {
        object.0
    }
}

impl std::str::FromStr for ObjectRef {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        Self::parse(text)
    }
}

/// Checks a path a task names inside its directory (an input's name, an output pattern):
/// relative, with no `..`, no empty part and at most 1,024 bytes, so that nothing a task
/// names lies outside its directory.
pub fn check_task_path(what: &str, path: &str) -> Result<(), String> {
    let shown = crate::text::clip(path, 80);
    let escapes = path.starts_with('/') || path.split('/').any(|part| part == "..");
    if escapes {
        return Err(format!(
            "{what} {shown:?} escapes the task's directory: name a path inside it, with no \
             leading / and no .."
        ));
    }
    if path.is_empty()
        || path.len() > 1024
        || path.split('/').any(|p| p.is_empty() || p == ".")
        || path.contains('\0')
    {
        return Err(format!(
            "{what} {shown:?} is not a path inside the task's directory (parts joined by /, \
             none empty or `.`, at most 1,024 bytes)"
        ));
    }
    Ok(())
}

/// SHA-256 over bytes that come in pieces, for what is too large to hold at once.
#[derive(Default, Clone)]
pub struct Hasher(Sha256);

impl Hasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> ObjectRef {
        ObjectRef::from_digest(self.0.finalize().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_is_the_sha256_of_the_content() {
        let empty = ObjectRef::of(b"");
        assert_eq!(
            empty.as_str(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let mut hasher = Hasher::default();
        hasher.update(b"ab");
        hasher.update(b"c");
        assert_eq!(hasher.finish(), ObjectRef::of(b"abc"));
        assert_eq!(
            ObjectRef::of(b"abc").as_str(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_reference_reads_back_and_refuses_what_is_not_one() {
        let object = ObjectRef::of(b"abc");
        assert_eq!(ObjectRef::parse(&object.to_string()), Ok(object.clone()));
        assert_eq!(
            ObjectRef::parse(&object.as_str().to_ascii_uppercase()),
            Ok(object.clone())
        );
        let json = serde_json::to_string(&object).unwrap();
        assert_eq!(serde_json::from_str::<ObjectRef>(&json).unwrap(), object);
        for bad in [
            "",
            "abc",
            &"g".repeat(64),
            &"a".repeat(65),
            "../../etc/passwd",
        ] {
            let error = ObjectRef::parse(bad).unwrap_err();
            assert!(error.contains("not an object reference"), "{error}");
        }
        assert!(serde_json::from_str::<ObjectRef>("\"xyz\"").is_err());
    }
}
