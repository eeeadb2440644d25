//! An executor's objects on disk: each fetched once, however many tasks read it, kept by
//! hash in a directory of its own and bounded in bytes, the least recently used going first,
//! never one a running task holds.

use super::{ObjectRef, Objects, ObjectsError};
use prometheus_client::metrics::counter::Counter;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::sync::OnceCell;

/// How many bytes an executor's cache keeps unless told otherwise.
pub const DEFAULT_CACHE_BYTES: u64 = 4 << 30;

/// What an executor has done with the cluster's objects, its cache's fetches and its puts, for
/// its metrics and heartbeats (each counter shared with the metrics).
#[derive(Debug, Default, Clone)]
pub struct CacheCounts {
    /// Objects fetched from the store, and their bytes.
    pub fetches: Counter,
    pub fetched_bytes: Counter,
    /// Objects taken from this host's shared directory rather than fetched, and their bytes.
    pub host_takes: Counter,
    pub host_taken_bytes: Counter,
    /// Holds served by an object already on disk or being fetched, and holds that started a
    /// fetch.
    pub hits: Counter,
    pub misses: Counter,
    /// Objects the executor put (outputs, large results), and the bytes it sent for them.
    pub puts: Counter,
    pub put_bytes: Counter,
}

impl CacheCounts {
    /// Counts a put of `size` bytes, `sent` unless the store held them already.
    pub fn put(&self, size: u64, sent: bool) {
        self.puts.inc();
        if sent {
            self.put_bytes.inc_by(size);
        }
    }

    /// The counts now, as a heartbeat carries them.
    pub fn now(&self) -> crate::protocol::ObjectCounts {
        crate::protocol::ObjectCounts {
            fetches: self.fetches.get(),
            fetched_bytes: self.fetched_bytes.get(),
            host_takes: self.host_takes.get(),
            host_taken_bytes: self.host_taken_bytes.get(),
            cache_hits: self.hits.get(),
            cache_misses: self.misses.get(),
            puts: self.puts.get(),
            put_bytes: self.put_bytes.get(),
        }
    }
}

/// One object the cache has or is fetching.
struct Slot {
    /// Its size once fetched, or why it could not be; set once, by the one fetch.
    fetched: OnceCell<Result<u64, String>>,
    /// How many holds are out on it: never evicted while any is.
    holders: AtomicU64,
    /// When it was last held (a counter of holds).
    last_used: AtomicU64,
}

pub struct Cache {
    dir: PathBuf,
    max_bytes: u64,
    slots: Mutex<HashMap<ObjectRef, Arc<Slot>>>,
    clock: AtomicU64,
    pub counts: CacheCounts,
}

/// An object on disk that a task reads: it stays until the hold is dropped.
pub struct Held {
    path: PathBuf,
    slot: Arc<Slot>,
}

impl Held {
    /// The object's file, to read only.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.slot.holders.fetch_sub(1, Relaxed);
    }
}

impl Cache {
    /// A cache in `dir` (made if missing) of at most `max_bytes`. Objects a previous run left
    /// there are kept (each was checked against its name before it got it); anything else in
    /// it (a fetch cut short) is removed.
    pub fn open(dir: PathBuf, max_bytes: u64, counts: CacheCounts) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let mut slots = HashMap::new();
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let object = name.to_str().and_then(|n| ObjectRef::parse(n).ok());
            let meta = entry.metadata()?;
            match object {
                Some(object) if meta.is_file() && name.to_str() == Some(object.as_str()) => {
                    let fetched = OnceCell::new_with(Some(Ok(meta.len())));
                    let slot = Slot {
                        fetched,
                        holders: AtomicU64::new(0),
                        last_used: AtomicU64::new(0),
                    };
                    slots.insert(object, Arc::new(slot));
                }
                _ if meta.is_dir() => std::fs::remove_dir_all(entry.path())?,
                _ => std::fs::remove_file(entry.path())?,
            }
        }
        Ok(Self {
            dir,
            max_bytes,
            slots: Mutex::new(slots),
            clock: AtomicU64::new(1),
            counts,
        })
    }

    /// The directory it keeps objects in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `object` on disk, fetched from `objects` unless it is there already or being fetched
    /// (then this waits for that one fetch). A fetch that fails is not remembered: the next
    /// hold tries again.
    pub async fn hold(&self, objects: &Objects, object: &ObjectRef) -> Result<Held, ObjectsError> {
        let slot = {
            let mut slots = self.slots.lock().expect("cache lock");
            let slot = slots.entry(object.clone()).or_insert_with(|| {
                Arc::new(Slot {
                    fetched: OnceCell::new(),
                    holders: AtomicU64::new(0),
                    last_used: AtomicU64::new(0),
                })
            });
            slot.holders.fetch_add(1, Relaxed);
            slot.last_used
                .store(self.clock.fetch_add(1, Relaxed), Relaxed);
            slot.clone()
        };
        let path = self.dir.join(object.as_str());
        let held = Held { path, slot };
        let mut fetched_here = false;
        let fetched = held
            .slot
            .fetched
            .get_or_init(|| async {
                fetched_here = true;
                let (size, from_host) = objects
                    .take_or_fetch(object, &held.path)
                    .await
                    .map_err(|e| e.to_string())?;
                let (count, bytes) = match from_host {
                    false => (&self.counts.fetches, &self.counts.fetched_bytes),
                    true => (&self.counts.host_takes, &self.counts.host_taken_bytes),
                };
                count.inc();
                bytes.inc_by(size);
                Ok(size)
            })
            .await
            .clone();
        match fetched_here {
            false => self.counts.hits.inc(),
            true => self.counts.misses.inc(),
        };
        match fetched {
            Ok(_) => {
                if fetched_here {
                    self.evict();
                }
                Ok(held)
            }
            Err(error) => {
                let mut slots = self.slots.lock().expect("cache lock");
                if slots
                    .get(object)
                    .is_some_and(|s| Arc::ptr_eq(s, &held.slot))
                {
                    slots.remove(object);
                }
                Err(ObjectsError::Io(error))
            }
        }
    }

    /// Keeps `data`, which the caller has just put in the store as `object`, as if it had
    /// been fetched: a task on this executor that reads it (a call reading this one's result)
    /// finds it here. Nothing changes if the cache has it already.
    pub fn keep(&self, object: &ObjectRef, data: &[u8]) -> std::io::Result<()> {
        if self.slots.lock().expect("cache lock").contains_key(object) {
            return Ok(());
        }
        let path = self.dir.join(object.as_str());
        let partial = self.dir.join(format!(
            "{}.keep-{}",
            object.as_str(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::write(&partial, data)?;
        std::fs::rename(&partial, &path)?;
        let slot = Slot {
            fetched: OnceCell::new_with(Some(Ok(data.len() as u64))),
            holders: AtomicU64::new(0),
            last_used: AtomicU64::new(self.clock.fetch_add(1, Relaxed)),
        };
        self.slots
            .lock()
            .expect("cache lock")
            .entry(object.clone())
            .or_insert_with(|| Arc::new(slot));
        self.evict();
        Ok(())
    }

    /// Drops `object` from the cache (its file removed; a task that holds it keeps its own
    /// link): the next hold fetches it again. For a file that changed on disk.
    pub fn forget(&self, object: &ObjectRef) {
        let mut slots = self.slots.lock().expect("cache lock");
        if slots.remove(object).is_some() {
            let _ = std::fs::remove_file(self.dir.join(object.as_str()));
        }
    }

    /// The bytes of the objects on disk.
    pub fn bytes(&self) -> u64 {
        let slots = self.slots.lock().expect("cache lock");
        slots.values().filter_map(|s| size_of(s)).sum()
    }

    /// Removes the least recently held objects no one holds while the cache is over its
    /// bound.
    fn evict(&self) {
        let mut slots = self.slots.lock().expect("cache lock");
        let mut used: u64 = slots.values().filter_map(|s| size_of(s)).sum();
        while used > self.max_bytes {
            let victim = slots
                .iter()
                .filter(|(_, s)| s.holders.load(Relaxed) == 0 && size_of(s).is_some())
                .min_by_key(|(_, s)| s.last_used.load(Relaxed))
                .map(|(object, s)| (object.clone(), size_of(s).unwrap_or(0)));
            let Some((object, size)) = victim else {
                break;
            };
            slots.remove(&object);
            let _ = std::fs::remove_file(self.dir.join(object.as_str()));
            used -= size;
        }
    }
}

/// A slot's size once it is fetched.
fn size_of(slot: &Slot) -> Option<u64> {
    slot.fetched.get().and_then(|r| r.as_ref().ok()).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_object_is_on_disk_once_and_found_by_a_new_cache() {
        let dir = std::env::temp_dir().join(format!("ember-cache-{}", uuid::Uuid::new_v4()));
        let cache = Cache::open(dir.clone(), 1 << 20, CacheCounts::default()).expect("opens");
        let data = b"a result stored as an object";
        let object = ObjectRef::of(data);
        cache.keep(&object, data).expect("kept");
        cache
            .keep(&object, data)
            .expect("kept again: nothing changes");
        assert_eq!(cache.bytes(), data.len() as u64);
        assert_eq!(std::fs::read(dir.join(object.as_str())).unwrap(), data);
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(names.len(), 1, "no partial file is left: {names:?}");
        // The next run of the executor finds it, as it finds what it fetched.
        drop(cache);
        let again = Cache::open(dir.clone(), 1 << 20, CacheCounts::default()).expect("opens");
        assert_eq!(again.bytes(), data.len() as u64);
        // Past the bound, an object no one holds goes.
        let big = vec![7u8; 2 << 20];
        let big_ref = ObjectRef::of(&big);
        again.keep(&big_ref, &big).expect("kept");
        assert!(again.bytes() <= 1 << 20, "{}", again.bytes());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
