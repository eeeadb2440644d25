//! Objects shared by the processes of one host. A put leaves a copy of the object in the host's
//! directory, and an executor fetching an object looks there first: on the host where it was
//! put, or where another executor fetched it, an object is linked into the executor's cache
//! rather than sent through the server again. What is not there is fetched from the store as
//! on any other host.
//!
//! The directory is trusted as an executor's own cache is: a file in it named by a reference
//! was checked against that name by whoever renamed it into place. So it must be private: made
//! with mode 0700, and not used (with a warning, every object then fetched) if it is owned by
//! another user or writable by others. Writers keep it under its bound, the oldest files
//! going first; a file removed while an executor holds it is still the executor's, through its
//! own link or copy.

use super::ObjectRef;
use std::path::{Path, PathBuf};

/// The variable that says where the host's objects are, or `off` for no sharing.
pub const HOST_OBJECTS_ENV: &str = "EMBER_HOST_OBJECTS";

/// How many bytes the host's directory keeps before its oldest files go.
pub const DEFAULT_HOST_BYTES: u64 = 4 << 30;

/// How old a file being written is when it is taken for one whose writer died.
const STALE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Where the objects of a host are shared, if they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostSetting {
    /// `<temp dir>/ember-<cluster>-objects`.
    Default,
    Off,
    Dir(PathBuf),
}

impl HostSetting {
    /// Reads `off`, or a directory.
    pub fn parse(text: &str) -> Self {
        match text.trim() {
            "off" | "" => Self::Off,
            dir => Self::Dir(PathBuf::from(dir)),
        }
    }

    /// As [`HOST_OBJECTS_ENV`] says, or the default.
    pub fn from_env() -> Self {
        match std::env::var(HOST_OBJECTS_ENV) {
            Ok(text) => Self::parse(&text),
            Err(_) => Self::Default,
        }
    }

    /// The directory for the cluster whose subjects start with `prefix`, if sharing is on and
    /// the directory can be used safely (a warning says why not otherwise).
    pub fn open(&self, prefix: &str) -> Option<HostObjects> {
        let dir = match self {
            Self::Off => return None,
            Self::Dir(dir) => dir.clone(),
            Self::Default => default_dir(prefix),
        };
        match HostObjects::open(dir.clone(), DEFAULT_HOST_BYTES) {
            Ok(host) => Some(host),
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "objects are not shared on this \
                               host; each is fetched from the store");
                None
            }
        }
    }
}

/// The host's directory of the cluster whose subjects start with `prefix`, unless told:
/// `<temp dir>/ember-<cluster>-objects`.
pub fn default_dir(prefix: &str) -> PathBuf {
    let cluster = prefix.trim_start_matches("ember.");
    std::env::temp_dir().join(format!("ember-{cluster}-objects"))
}

/// One host's directory of objects.
#[derive(Debug, Clone)]
pub struct HostObjects {
    dir: PathBuf,
    max_bytes: u64,
}

impl HostObjects {
    /// The directory `dir`, kept under `max_bytes`, made (mode 0700) when first written.
    /// Refused if it is there and is not a directory of this user's that only this user may
    /// write.
    pub fn open(dir: PathBuf, max_bytes: u64) -> std::io::Result<Self> {
        let host = Self { dir, max_bytes };
        match std::fs::symlink_metadata(&host.dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(host),
            Err(e) => Err(e),
            Ok(meta) => host.check(&meta).map(|()| host),
        }
    }

    fn check(&self, meta: &std::fs::Metadata) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let uid = nix::unistd::getuid().as_raw();
        if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
            return Err(std::io::Error::other(format!(
                "{} is not a directory of user {uid} that only it may write",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// Makes the directory if it is missing, checking it as [`HostObjects::open`] does.
    fn make(&self) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
        {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        self.check(&std::fs::symlink_metadata(&self.dir)?)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, object: &ObjectRef) -> PathBuf {
        self.dir.join(object.as_str())
    }

    /// A fresh name beside the objects for a file being written, the directory made if it
    /// is missing.
    pub fn partial(&self) -> std::io::Result<PathBuf> {
        self.make()?;
        let id = uuid::Uuid::new_v4().simple();
        Ok(self.dir.join(format!(".part-{id}")))
    }

    /// Writes `bytes` to a fresh file beside the objects, before their reference is known:
    /// [`HostObjects::settle`] names it.
    pub fn write_unnamed(&self, bytes: &[u8]) -> std::io::Result<PathBuf> {
        let partial = self.partial()?;
        match write_read_only(&partial, bytes) {
            Ok(()) => Ok(partial),
            Err(error) => {
                let _ = std::fs::remove_file(&partial);
                Err(error)
            }
        }
    }

    /// Leaves `bytes`, whose reference is `object`, for the other processes of the host.
    pub fn leave(&self, object: &ObjectRef, bytes: &[u8]) -> std::io::Result<()> {
        if self.path(object).exists() {
            return Ok(());
        }
        self.settle(object, &self.write_unnamed(bytes)?)
    }

    /// Moves `partial`, a file beside the objects whose bytes were checked to be `object`'s,
    /// into place (removing it if it cannot be).
    pub fn settle(&self, object: &ObjectRef, partial: &Path) -> std::io::Result<()> {
        if let Err(error) = std::fs::rename(partial, self.path(object)) {
            let _ = std::fs::remove_file(partial);
            return Err(error);
        }
        self.trim();
        Ok(())
    }

    /// Leaves the file at `from` (an executor's checked copy of `object`) by a second link to
    /// it, or not at all where a link cannot be made: nothing is copied for this.
    pub fn leave_link(&self, object: &ObjectRef, from: &Path) {
        let Ok(partial) = self.partial() else {
            return;
        };
        if std::fs::hard_link(from, &partial).is_ok() {
            let _ = self.settle(object, &partial);
        }
    }

    /// Puts `object` at `to` if the host has it ([`link_or_copy`], into a file beside `to`
    /// renamed into place): its size, or none if the host has no such object.
    pub fn take(&self, object: &ObjectRef, to: &Path) -> std::io::Result<Option<u64>> {
        let partial = to.with_extension(format!("take-{}", uuid::Uuid::new_v4().simple()));
        let taken = link_or_copy(&self.path(object), &partial).and_then(|()| {
            let size = std::fs::metadata(&partial)?.len();
            std::fs::rename(&partial, to).map(|()| size)
        });
        match taken {
            Ok(size) => Ok(Some(size)),
            Err(error) => {
                let _ = std::fs::remove_file(&partial);
                match error.kind() {
                    // Not there, or removed since: fetched from the store instead.
                    std::io::ErrorKind::NotFound => Ok(None),
                    _ => Err(error),
                }
            }
        }
    }

    /// Removes the oldest objects while the directory holds more than its bound.
    fn trim(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut files = Vec::new();
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            let Ok(modified) = meta.modified() else {
                continue;
            };
            let name = entry.file_name();
            let name = name.to_str().unwrap_or("");
            if ObjectRef::parse(name).is_ok() {
                files.push((modified, meta.len(), entry.path()));
            } else if name.starts_with(".part-") && modified.elapsed().unwrap_or_default() > STALE {
                // A write whose process died.
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let mut used: u64 = files.iter().map(|(_, size, _)| size).sum();
        files.sort();
        for (_, size, path) in files {
            if used <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                used -= size;
            }
        }
    }
}

/// Puts the file `from` at `to` (which must not exist), read-only: a hard link, or a copy where
/// a link cannot be made (another file system).
pub fn link_or_copy(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to)?;
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o444))?;
    }
    Ok(())
}

/// Runs `work` on a thread that may block, started at once: its outcome, a panic included as
/// an error.
pub(crate) fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> impl std::future::Future<Output = std::io::Result<T>> {
    let handle = tokio::task::spawn_blocking(work);
    async move { handle.await.map_err(std::io::Error::other)? }
}

/// Writes `bytes` to a new file at `path`, readable and not writable.
pub fn write_read_only(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(path)?;
    file.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> PathBuf {
        std::env::temp_dir().join(format!("ember-host-{}", uuid::Uuid::new_v4().simple()))
    }

    #[test]
    fn what_one_process_leaves_another_takes_and_the_oldest_goes_past_the_bound() {
        let dir = scratch();
        let host = HostObjects::open(dir.join("objects"), 10).expect("opens");
        let (a, b) = (b"0123456".as_slice(), b"abcdefg".as_slice());
        let (ra, rb) = (ObjectRef::of(a), ObjectRef::of(b));
        host.leave(&ra, a).expect("left");
        host.leave(&ra, a).expect("left again: nothing changes");
        let to = dir.join("taken");
        assert_eq!(host.take(&ra, &to).unwrap(), Some(a.len() as u64));
        assert_eq!(std::fs::read(&to).unwrap(), a);
        assert_eq!(host.take(&rb, &dir.join("none")).unwrap(), None);
        // Past 10 bytes the older of the two goes; what was taken stays the taker's.
        std::thread::sleep(std::time::Duration::from_millis(20));
        host.leave(&rb, b).expect("left");
        assert_eq!(host.take(&ra, &dir.join("gone")).unwrap(), None);
        assert_eq!(std::fs::read(&to).unwrap(), a);
        let names: Vec<_> = std::fs::read_dir(host.dir()).unwrap().collect();
        assert_eq!(names.len(), 1, "no partial file is left: {names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_others_may_write_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = HostObjects::open(dir.clone(), 10).unwrap_err();
        let missing = HostObjects::open(dir.join("later"), 10).expect("made when written");
        assert!(!missing.dir().exists());
        assert!(error.to_string().contains("only it may write"), "{error}");
        assert_eq!(
            HostSetting::Dir(dir.clone()).open("ember.x").map(|h| h.dir),
            None
        );
        assert_eq!(HostSetting::parse("off"), HostSetting::Off);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
