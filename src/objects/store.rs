//! Writing and reading objects in JetStream's Object Store. The layout is the Object Store's
//! own (chunks on `$O.<bucket>.C.<nuid>`, metadata on `$O.<bucket>.M.<name in base64>`), so any
//! NATS client can read what Ember stores; the writes are Ember's, because the stock `put`
//! uploads even what is already there, replaces an object of the same name, and waits for
//! each chunk's acknowledgement before it sends the next.

use super::host::{blocking, HostObjects, HostSetting};
use super::{Hasher, ObjectRef};
use crate::streams::Need;
use crate::subjects::Subjects;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::object_store::ObjectStore;
use async_nats::jetstream::stream::{self, DirectGetErrorKind, DiscardPolicy, StorageType};
use async_nats::jetstream::{self, context::PublishAckFuture};
use base64::Engine;
use bytes::Bytes;
use std::collections::VecDeque;
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod retention;

/// The size of an object's chunks, as the Object Store's own default.
pub const CHUNK_BYTES: usize = 128 * 1024;

/// How many chunks a put has sent whose acknowledgements it has not read yet.
const CHUNKS_IN_FLIGHT: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum ObjectsError {
    #[error("the object store {bucket} does not exist: a driver with a journal makes it when it starts (is one running on this cluster, with JetStream?)")]
    NoStore { bucket: String },
    #[error("object {0} not found: put it again")]
    NotFound(ObjectRef),
    #[error("the object store is full: it holds at most {limit} bytes (the driver's --objects-max-bytes); delete objects no job needs, or raise the limit")]
    Full { limit: u64 },
    #[error("the content of {path} changed while it was put: its SHA-256 was {before} when read first and {after} when sent")]
    Changed {
        path: String,
        before: ObjectRef,
        after: ObjectRef,
    },
    #[error("object {expected} read back as {got}: its stored bytes do not match its name")]
    Corrupt { expected: ObjectRef, got: ObjectRef },
    #[error("{0}")]
    Io(String),
    #[error("the object store said: {0}")]
    Store(String),
}

impl ObjectsError {
    fn store(error: impl std::fmt::Display) -> Self {
        let text = error.to_string();
        if text.contains("no responders") || text.contains("stream not found") {
            return Self::Store(format!(
                "{text} (is JetStream on, and does this user may use the object store?)"
            ));
        }
        Self::Store(text)
    }

    fn io(what: &str, error: impl std::fmt::Display) -> Self {
        Self::Io(format!("{what}: {error}"))
    }
}

/// What a put did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Put {
    pub object: ObjectRef,
    pub size: u64,
    /// Whether its bytes were sent: false when the store held them already.
    pub sent: bool,
}

/// One object as the store describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ObjectStat {
    pub object: ObjectRef,
    pub size: u64,
    pub chunks: u64,
    /// When it was put, in ms since the Unix epoch, if the metadata says.
    pub put_ms: Option<u64>,
}

/// How much a store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// The bytes of its stream: chunks and metadata.
    pub bytes: u64,
    /// Its limit (`--objects-max-bytes`), if it has one.
    pub max_bytes: Option<u64>,
}

/// The object store of one cluster.
#[derive(Clone)]
pub struct Objects {
    context: jetstream::Context,
    store: ObjectStore,
    stream: String,
    bucket: String,
    /// The store's byte limit, if it has one.
    limit: Option<u64>,
    /// The bytes of each chunk it puts: [`CHUNK_BYTES`], or less on a server whose messages
    /// cannot hold that much.
    chunk_bytes: usize,
    /// Where the processes of this host share objects, if they do.
    host: Option<HostObjects>,
}

impl Objects {
    /// Creates the store, or uses the one that exists if it fits (see [`crate::streams`]), as
    /// the driver does when it starts.
    /// `max_bytes` 0 sets no limit of the store's own.
    pub async fn create(
        context: &jetstream::Context,
        subjects: &Subjects,
        max_bytes: u64,
        replicas: usize,
    ) -> Result<Self, ObjectsError> {
        let bucket = subjects.objects_bucket();
        let config = stream::Config {
            name: format!("OBJ_{bucket}"),
            subjects: vec![format!("$O.{bucket}.C.>"), format!("$O.{bucket}.M.>")],
            max_bytes: match max_bytes {
                0 => -1,
                n => i64::try_from(n).unwrap_or(i64::MAX),
            },
            discard: DiscardPolicy::New,
            allow_rollup: true,
            allow_direct: true,
            storage: StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        };
        // Puts are refused once the store is full; metadata replaces metadata by rollup.
        let needs = [Need::Discard, Need::Rollup, Need::Direct, Need::Purge];
        let found = crate::streams::existing(context, &config, &needs).await;
        if found.map_err(ObjectsError::Store)?.is_none() {
            context
                .create_or_update_stream(config)
                .await
                .map_err(ObjectsError::store)?;
        }
        Self::open(context, subjects).await
    }

    /// Opens the store the driver made.
    pub async fn open(
        context: &jetstream::Context,
        subjects: &Subjects,
    ) -> Result<Self, ObjectsError> {
        let bucket = subjects.objects_bucket();
        let stream = format!("OBJ_{bucket}");
        let mut handle = match context.get_stream(&stream).await {
            Ok(handle) => handle,
            Err(error) if error.to_string().contains("not found") => {
                return Err(ObjectsError::NoStore { bucket })
            }
            Err(error) => return Err(ObjectsError::store(error)),
        };
        let info = handle.info().await.map_err(ObjectsError::store)?;
        let limit = u64::try_from(info.config.max_bytes).ok();
        let store = context
            .get_object_store(&bucket)
            .await
            .map_err(ObjectsError::store)?;
        let max_payload = context.client().server_info().max_payload;
        let chunk_bytes = CHUNK_BYTES.min(
            max_payload
                .saturating_sub(crate::PAYLOAD_HEADROOM)
                .max(1024),
        );
        Ok(Self {
            context: context.clone(),
            store,
            stream,
            bucket,
            limit,
            chunk_bytes,
            host: HostSetting::from_env().open(subjects.prefix()),
        })
    }

    /// Shares objects with the other processes of this host as `setting` says, rather than as
    /// the environment does.
    pub fn with_host(mut self, setting: &HostSetting, subjects: &Subjects) -> Self {
        self.host = setting.open(subjects.prefix());
        self
    }

    /// How much the store holds now.
    pub async fn usage(&self) -> Result<Usage, ObjectsError> {
        let mut stream = self
            .context
            .get_stream(&self.stream)
            .await
            .map_err(ObjectsError::store)?;
        let info = stream.info().await.map_err(ObjectsError::store)?;
        Ok(Usage {
            bytes: info.state.bytes,
            max_bytes: self.limit,
        })
    }

    /// The store's name: `EMBER_<cluster>_OBJECTS`.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// Stores `bytes`, unless the store holds them already.
    /// A copy is left on this host for its executors, written while the bytes are named.
    pub async fn put_bytes(&self, bytes: Bytes) -> Result<Put, ObjectsError> {
        let hashed = bytes.clone();
        let naming = blocking(move || Ok(ObjectRef::of(&hashed)));
        let leaving = self.host.clone().map(|host| {
            let bytes = bytes.clone();
            blocking(move || host.write_unnamed(&bytes).map(|partial| (host, partial)))
        });
        let object = naming
            .await
            .map_err(|e| ObjectsError::io("could not name what is put", e))?;
        if let Some(leaving) = leaving {
            let named = object.clone();
            let left = async move {
                let (host, partial) = leaving.await?;
                blocking(move || host.settle(&named, &partial)).await
            };
            if let Err(error) = left.await {
                tracing::warn!(%error, %object, "an object put was not left on this host");
            }
        }
        let size = bytes.len() as u64;
        let sent = match self.stat(&object).await? {
            Some(_) => false,
            None => {
                // Bytes do not change: what is sent is what was named.
                let n = self.chunk_bytes;
                let chunks = (0..bytes.len().div_ceil(n))
                    .map(|i| Ok(bytes.slice(i * n..((i + 1) * n).min(bytes.len()))));
                self.upload(&object, size, futures::stream::iter(chunks), false)
                    .await?
                    .0
            }
        };
        Ok(Put { object, size, sent })
    }

    /// Stores the file at `path`, unless the store holds its content already: it is read
    /// once to name it and once more to send it, and if it changed in between, nothing is
    /// stored.
    pub async fn put_file(&self, path: &Path) -> Result<Put, ObjectsError> {
        let shown = path.display().to_string();
        let (object, size) = hash_file(path).await?;
        if self.stat(&object).await?.is_some() {
            return Ok(Put {
                object,
                size,
                sent: false,
            });
        }
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| ObjectsError::io(&format!("could not open {shown}"), e))?;
        // What is sent is left on this host too, kept only if it is what was named.
        let copy = self.host.as_ref().and_then(|host| {
            let partial = host.partial().ok()?;
            let file = std::fs::File::create_new(&partial).ok()?;
            Some((host.clone(), partial, file))
        });
        let mut sink = copy.as_ref().map(|(_, _, file)| file);
        use futures::StreamExt;
        let n = self.chunk_bytes;
        let chunks = futures::stream::unfold(file, move |mut file| async move {
            let mut buffer = bytes::BytesMut::with_capacity(n);
            while buffer.len() < n {
                match file.read_buf(&mut buffer).await {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(error) => return Some((Err(error), file)),
                }
            }
            (!buffer.is_empty()).then(|| (Ok(buffer.freeze()), file))
        })
        .inspect(move |chunk| {
            use std::io::Write;
            if let (Some(file), Ok(chunk)) = (&mut sink, chunk) {
                if file.write_all(chunk).is_err() {
                    sink = None;
                }
            }
        });
        let uploaded = self.upload(&object, size, chunks, true).await;
        if let Some((host, partial, file)) = copy {
            let whole = matches!(&uploaded, Ok((_, sent_as)) if *sent_as == object)
                && file.metadata().is_ok_and(|m| m.len() == size)
                && file.set_permissions(read_only()).is_ok();
            let named = object.clone();
            let _ = blocking(move || match whole {
                true => host.settle(&named, &partial),
                false => std::fs::remove_file(&partial),
            })
            .await;
        }
        let (sent, sent_as) = uploaded?;
        if sent_as != object {
            return Err(ObjectsError::Changed {
                path: shown,
                before: object,
                after: sent_as,
            });
        }
        Ok(Put { object, size, sent })
    }

    /// Sends the chunks of `object` under a fresh id, then its metadata, if no metadata for
    /// that name is there by then: whether it stored them (false when another writer's
    /// metadata came first), and the reference of what was sent (`object` itself unless
    /// `check`, for bytes that cannot change). Chunks it sent but did not make part of an
    /// object are purged, or left for the driver's sweep if that fails.
    async fn upload(
        &self,
        object: &ObjectRef,
        size: u64,
        chunks: impl futures::Stream<Item = std::io::Result<Bytes>>,
        check: bool,
    ) -> Result<(bool, ObjectRef), ObjectsError> {
        let nuid = uuid::Uuid::new_v4().simple().to_string();
        let chunk_subject = format!("$O.{}.C.{nuid}", self.bucket);
        let sent = self
            .send_chunks(&chunk_subject, chunks, check.then(Hasher::default))
            .await
            .map(|(count, hash)| (count, hash.unwrap_or_else(|| object.clone())));
        let (count, sent_as) = match sent {
            Ok(sent) => sent,
            Err(error) => {
                self.purge_chunks(&chunk_subject).await;
                return Err(error);
            }
        };
        if sent_as != *object {
            self.purge_chunks(&chunk_subject).await;
            return Ok((false, sent_as));
        }
        match self.write_metadata(object, &nuid, size, count).await {
            Ok(written) => {
                if !written {
                    self.purge_chunks(&chunk_subject).await;
                }
                Ok((written, sent_as))
            }
            Err(error) => {
                self.purge_chunks(&chunk_subject).await;
                Err(error)
            }
        }
    }

    /// Publishes `chunks` on `subject`, with up to [`CHUNKS_IN_FLIGHT`] acknowledgements
    /// outstanding: how many, and the reference of their bytes if given a `hasher`.
    async fn send_chunks(
        &self,
        subject: &str,
        chunks: impl futures::Stream<Item = std::io::Result<Bytes>>,
        mut hasher: Option<Hasher>,
    ) -> Result<(u64, Option<ObjectRef>), ObjectsError> {
        use futures::StreamExt;
        let mut chunks = std::pin::pin!(chunks);
        let mut acks: VecDeque<PublishAckFuture> = VecDeque::new();
        let mut count = 0u64;
        let mut outcome = Ok(());
        while let Some(chunk) = chunks.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) => {
                    outcome = Err(ObjectsError::io("could not read what is put", e));
                    break;
                }
            };
            if let Some(hasher) = &mut hasher {
                hasher.update(&chunk);
            }
            count += 1;
            match self.context.publish(subject.to_string(), chunk).await {
                Ok(ack) => acks.push_back(ack),
                Err(e) => {
                    outcome = Err(self.publish_error(e));
                    break;
                }
            }
            if acks.len() >= CHUNKS_IN_FLIGHT {
                let ack = acks.pop_front().expect("not empty");
                if let Err(e) = ack.await {
                    outcome = Err(self.publish_error(e));
                    break;
                }
            }
        }
        // Every publish settles before an error is returned: a chunk stored after the
        // caller's purge (into room the purge made) would outlive it.
        for ack in acks {
            let settled = ack.await;
            if let Err(e) = settled {
                if outcome.is_ok() {
                    outcome = Err(self.publish_error(e));
                }
            }
        }
        outcome.map(|()| (count, hasher.map(Hasher::finish)))
    }

    /// Writes the metadata of `object`, whose chunks are under `nuid`, if the name has none
    /// yet (or only a deletion's): whether it did.
    async fn write_metadata(
        &self,
        object: &ObjectRef,
        nuid: &str,
        size: u64,
        chunks: u64,
    ) -> Result<bool, ObjectsError> {
        let subject = self.meta_subject(object);
        let last = match self.read_metadata(object).await? {
            Some((meta, _)) if !meta.deleted => return Ok(false),
            Some((_, sequence)) => sequence,
            None => 0,
        };
        let meta = serde_json::json!({
            "name": object.as_str(),
            "bucket": self.bucket,
            "nuid": nuid,
            "size": size,
            "chunks": chunks,
            "mtime": humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string(),
            "digest": format!("SHA-256={}", base64::engine::general_purpose::URL_SAFE.encode(digest_bytes(object))),
            "options": {"max_chunk_size": self.chunk_bytes},
        });
        let publish = PublishMessage::build()
            .payload(Bytes::from(meta.to_string()))
            .header("Nats-Rollup", "sub")
            .expected_last_subject_sequence(last);
        let stored = match self.context.send_publish(subject, publish).await {
            Ok(ack) => ack.await,
            Err(error) => Err(error),
        };
        match stored {
            Ok(_) => Ok(true),
            Err(error) if error.kind() == PublishErrorKind::WrongLastSequence => Ok(false),
            Err(error) => Err(self.publish_error(error)),
        }
    }

    /// The metadata stored for `object`, and its sequence in the stream.
    async fn read_metadata(
        &self,
        object: &ObjectRef,
    ) -> Result<Option<(Metadata, u64)>, ObjectsError> {
        let stream = self
            .context
            .get_stream_no_info(&self.stream)
            .await
            .map_err(ObjectsError::store)?;
        match stream
            .direct_get_last_for_subject(self.meta_subject(object))
            .await
        {
            Ok(message) => {
                let meta = serde_json::from_slice(&message.payload).map_err(|e| {
                    ObjectsError::Store(format!("the metadata of {object} is not readable: {e}"))
                })?;
                Ok(Some((meta, message.sequence)))
            }
            Err(error) if error.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(error) => Err(ObjectsError::store(error)),
        }
    }

    /// `object` as the store describes it, or none if it does not hold it.
    pub async fn stat(&self, object: &ObjectRef) -> Result<Option<ObjectStat>, ObjectsError> {
        Ok(match self.read_metadata(object).await? {
            Some((meta, _)) if !meta.deleted => Some(meta.stat(object.clone())),
            _ => None,
        })
    }

    /// Reads `object` whole, checking its bytes against its name.
    pub async fn get_bytes(&self, object: &ObjectRef) -> Result<Vec<u8>, ObjectsError> {
        let mut reader = self.reader(object).await?;
        let mut bytes = Vec::new();
        reader
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| ObjectsError::io(&format!("could not read object {object}"), e))?;
        check(object, ObjectRef::of(&bytes))?;
        Ok(bytes)
    }

    /// Writes `object` to `path`: into a file beside it first, checking the bytes against the
    /// name as they come, then renamed into place, so `path` never holds a part or a wrong
    /// object. Returns its size.
    pub async fn fetch_to(&self, object: &ObjectRef, path: &Path) -> Result<u64, ObjectsError> {
        let partial = path.with_extension(format!("part-{}", uuid::Uuid::new_v4().simple()));
        let fetched = self.fetch_into(object, &partial).await;
        let renamed = match fetched {
            Ok(size) => tokio::fs::rename(&partial, path)
                .await
                .map(|()| size)
                .map_err(|e| ObjectsError::io(&format!("could not write {}", path.display()), e)),
            Err(error) => Err(error),
        };
        if renamed.is_err() {
            let _ = tokio::fs::remove_file(&partial).await;
        }
        renamed
    }

    /// As [`Objects::fetch_to`], but from this host's shared objects if they have it (then
    /// without checking it again: see [`super::host`]); and a fetched object is shared there.
    /// Its size, and whether it came from the host.
    pub async fn take_or_fetch(
        &self,
        object: &ObjectRef,
        path: &Path,
    ) -> Result<(u64, bool), ObjectsError> {
        if let Some(host) = self.host.clone() {
            let (found, to) = (object.clone(), path.to_path_buf());
            match blocking(move || host.take(&found, &to)).await {
                Ok(Some(size)) => return Ok((size, true)),
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, %object, "could not take an object from \
                                             this host's; fetching it"),
            }
        }
        let size = self.fetch_to(object, path).await?;
        if let Some(host) = self.host.clone() {
            let (object, from) = (object.clone(), path.to_path_buf());
            let _ = blocking(move || {
                host.leave_link(&object, &from);
                Ok(())
            })
            .await;
        }
        Ok((size, false))
    }

    async fn fetch_into(&self, object: &ObjectRef, path: &Path) -> Result<u64, ObjectsError> {
        let mut reader = self.reader(object).await?;
        let shown = path.display().to_string();
        let mut file = tokio::fs::File::create(path)
            .await
            .map_err(|e| ObjectsError::io(&format!("could not create {shown}"), e))?;
        let (mut hasher, mut size) = (Hasher::default(), 0u64);
        let mut buffer = vec![0u8; CHUNK_BYTES];
        loop {
            let n = reader
                .read(&mut buffer)
                .await
                .map_err(|e| ObjectsError::io(&format!("could not read object {object}"), e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
            size += n as u64;
            file.write_all(&buffer[..n])
                .await
                .map_err(|e| ObjectsError::io(&format!("could not write {shown}"), e))?;
        }
        file.flush()
            .await
            .map_err(|e| ObjectsError::io(&format!("could not write {shown}"), e))?;
        check(object, hasher.finish())?;
        Ok(size)
    }

    async fn reader(
        &self,
        object: &ObjectRef,
    ) -> Result<async_nats::jetstream::object_store::Object, ObjectsError> {
        use async_nats::jetstream::object_store::GetErrorKind;
        match self.store.get(object.as_str()).await {
            Ok(reader) => Ok(reader),
            Err(error) if error.kind() == GetErrorKind::NotFound => {
                Err(ObjectsError::NotFound(object.clone()))
            }
            Err(error) => Err(ObjectsError::store(error)),
        }
    }

    fn meta_subject(&self, object: &ObjectRef) -> String {
        let name = base64::engine::general_purpose::URL_SAFE.encode(object.as_str());
        format!("$O.{}.M.{name}", self.bucket)
    }

    async fn purge_chunks(&self, subject: &str) {
        let Ok(stream) = self.context.get_stream_no_info(&self.stream).await else {
            return;
        };
        if let Err(error) = stream.purge().filter(subject).await {
            tracing::warn!(%error, subject, "could not purge the chunks of an object not \
                           stored; the driver's sweep deletes them");
        }
    }

    fn publish_error(&self, error: impl std::fmt::Display) -> ObjectsError {
        let text = error.to_string();
        match self.limit {
            Some(limit) if text.contains("maximum bytes") => ObjectsError::Full { limit },
            _ => ObjectsError::store(text),
        }
    }
}

/// An object's metadata, as much of it as Ember reads.
#[derive(Debug, serde::Deserialize)]
struct Metadata {
    #[serde(default)]
    size: u64,
    #[serde(default)]
    chunks: u64,
    #[serde(default)]
    mtime: Option<String>,
    #[serde(default)]
    deleted: bool,
}

impl Metadata {
    fn stat(&self, object: ObjectRef) -> ObjectStat {
        let put_ms = self.mtime.as_deref().and_then(|t| {
            let time = humantime::parse_rfc3339_weak(t).ok()?;
            let since = time.duration_since(std::time::UNIX_EPOCH).ok()?;
            Some(since.as_millis() as u64)
        });
        ObjectStat {
            object,
            size: self.size,
            chunks: self.chunks,
            put_ms,
        }
    }
}

/// Readable by all, writable by none.
fn read_only() -> std::fs::Permissions {
    use std::os::unix::fs::PermissionsExt;
    std::fs::Permissions::from_mode(0o444)
}

/// The reference of the file at `path`, and its size.
async fn hash_file(path: &Path) -> Result<(ObjectRef, u64), ObjectsError> {
    let shown = path.display().to_string();
    let mut file = tokio::fs::File::open(path)
        .await
        .map_err(|e| ObjectsError::io(&format!("could not open {shown}"), e))?;
    let (mut hasher, mut size) = (Hasher::default(), 0u64);
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buffer)
            .await
            .map_err(|e| ObjectsError::io(&format!("could not read {shown}"), e))?;
        if n == 0 {
            return Ok((hasher.finish(), size));
        }
        hasher.update(&buffer[..n]);
        size += n as u64;
    }
}

fn check(expected: &ObjectRef, got: ObjectRef) -> Result<(), ObjectsError> {
    if got != *expected {
        return Err(ObjectsError::Corrupt {
            expected: expected.clone(),
            got,
        });
    }
    Ok(())
}

/// The 32 bytes a reference spells in hex.
fn digest_bytes(object: &ObjectRef) -> [u8; 32] {
    let hex = object.as_str().as_bytes();
    let digit = |b: u8| (b as char).to_digit(16).unwrap_or(0) as u8;
    std::array::from_fn(|i| digit(hex[2 * i]) << 4 | digit(hex[2 * i + 1]))
}
