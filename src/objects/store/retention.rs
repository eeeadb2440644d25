//! What the leader's sweep asks of the store: every object with its age, the chunks no
//! object's metadata points at (a put that died), and deleting either.

use super::{ObjectStat, Objects, ObjectsError};
use crate::objects::ObjectRef;

impl Objects {
    /// Every object the store holds, by name.
    pub async fn list(&self) -> Result<Vec<ObjectStat>, ObjectsError> {
        use futures::StreamExt;
        let mut listed = self.store.list().await.map_err(ObjectsError::store)?;
        let mut stats = Vec::new();
        while let Some(info) = listed.next().await {
            let info = info.map_err(ObjectsError::store)?;
            let Ok(object) = ObjectRef::parse(&info.name) else {
                continue;
            };
            stats.push(ObjectStat {
                object,
                size: info.size as u64,
                chunks: info.chunks as u64,
                put_ms: info
                    .modified
                    .map(|t| (t.unix_timestamp_nanos() / 1_000_000).max(0) as u64),
            });
        }
        stats.sort_by(|a, b| a.object.cmp(&b.object));
        Ok(stats)
    }

    /// Chunks no object's metadata points at (a put that died, or one still under way), each
    /// as its subject and when its last chunk was written, in ms since the Unix epoch.
    pub async fn orphan_chunks(&self) -> Result<Vec<(String, u64)>, ObjectsError> {
        use futures::{StreamExt, TryStreamExt};
        let mut listed = self.store.list().await.map_err(ObjectsError::store)?;
        let mut in_use = std::collections::HashSet::new();
        while let Some(info) = listed.next().await {
            in_use.insert(info.map_err(ObjectsError::store)?.nuid);
        }
        let stream = self
            .context
            .get_stream_no_info(&self.stream)
            .await
            .map_err(ObjectsError::store)?;
        let prefix = format!("$O.{}.C.", self.bucket);
        let subjects: Vec<(String, usize)> = stream
            .info_with_subjects(format!("{prefix}>"))
            .await
            .map_err(ObjectsError::store)?
            .try_collect()
            .await
            .map_err(ObjectsError::store)?;
        let mut orphans = Vec::new();
        for (subject, _) in subjects {
            let nuid = subject.strip_prefix(&prefix).unwrap_or_default();
            if in_use.contains(nuid) {
                continue;
            }
            // Written since the list above: a put under way, whose metadata comes next.
            let Ok(last) = stream.get_last_raw_message_by_subject(&subject).await else {
                continue;
            };
            let ms = (last.time.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
            orphans.push((subject, ms));
        }
        Ok(orphans)
    }

    /// Purges the orphan chunks under `subject` (one of [`Objects::orphan_chunks`]).
    pub async fn purge_orphan(&self, subject: &str) -> Result<(), ObjectsError> {
        let stream = self
            .context
            .get_stream_no_info(&self.stream)
            .await
            .map_err(ObjectsError::store)?;
        stream
            .purge()
            .filter(subject)
            .await
            .map(drop)
            .map_err(ObjectsError::store)
    }

    /// Deletes `object` (its metadata marked deleted, its chunks purged): whether it was
    /// there. Only the driver's user may purge, in a locked-down cluster.
    pub async fn delete(&self, object: &ObjectRef) -> Result<bool, ObjectsError> {
        use async_nats::jetstream::object_store::DeleteErrorKind;
        // A name whose metadata says deleted is written deleted again without a complaint.
        if self.stat(object).await?.is_none() {
            return Ok(false);
        }
        match self.store.delete(object.as_str()).await {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == DeleteErrorKind::NotFound => Ok(false),
            Err(error) => Err(ObjectsError::store(error)),
        }
    }
}
