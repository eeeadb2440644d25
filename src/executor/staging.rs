//! A command's objects: its inputs fetched (once per executor, through the cache) and linked
//! into its working directory, read-only, before it starts; the files its output patterns
//! match put into the store after it ends, their references added to its result.

use super::command::run_command;
use super::tasks::{TaskContext, TaskResult};
use crate::objects::cache::{Cache, Held};
use crate::objects::{ObjectRef, Objects};
use crate::protocol::TaskSpec;
use crate::subjects::Subjects;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tokio::sync::OnceCell;

/// What an executor needs to give tasks their objects: the store and the cache, each opened
/// when a task first needs it (the driver that makes the store may start after the executor,
/// and an executor that runs no task with objects makes no directory), and where commands
/// without a directory of their own get one.
pub struct ObjectAccess {
    context: async_nats::jetstream::Context,
    /// The connection, and where this executor reads the results of other jobs.
    client: async_nats::Client,
    results: String,
    subjects: Subjects,
    store: OnceCell<Objects>,
    cache: std::sync::OnceLock<Cache>,
    /// The executor's own directory: `objects/` holds the cache, `tasks/` the directories
    /// of attempts.
    data_dir: PathBuf,
    cache_bytes: u64,
    host: crate::objects::host::HostSetting,
    /// What this executor has done with the objects: shared with its metrics.
    pub counts: crate::objects::cache::CacheCounts,
}

impl ObjectAccess {
    pub fn new(
        client: async_nats::Client,
        subjects: Subjects,
        executor: &crate::ids::ExecutorId,
        data_dir: PathBuf,
        cache_bytes: u64,
        host: crate::objects::host::HostSetting,
        counts: crate::objects::cache::CacheCounts,
    ) -> Self {
        Self {
            counts,
            results: subjects.results(executor),
            context: async_nats::jetstream::new(client.clone()),
            client,
            subjects,
            store: OnceCell::new(),
            cache: std::sync::OnceLock::new(),
            data_dir,
            cache_bytes,
            host,
        }
    }

    /// The cache, opened (and its directory made) on first use.
    pub fn cache(&self) -> Result<&Cache, String> {
        if let Some(cache) = self.cache.get() {
            return Ok(cache);
        }
        let dir = self.data_dir.join("objects");
        let cache = Cache::open(dir.clone(), self.cache_bytes, self.counts.clone())
            .map_err(|e| format!("could not open the object cache in {}: {e}", dir.display()))?;
        Ok(self.cache.get_or_init(|| cache))
    }

    /// Where the results of other jobs are asked for, and over which connection.
    pub fn results_route(&self) -> (&async_nats::Client, &str) {
        (&self.client, &self.results)
    }

    /// The cluster's object store.
    pub async fn store(&self) -> Result<&Objects, String> {
        self.store
            .get_or_try_init(|| async {
                let store = Objects::open(&self.context, &self.subjects).await?;
                Ok::<_, crate::objects::ObjectsError>(store.with_host(&self.host, &self.subjects))
            })
            .await
            .map_err(|e| e.to_string())
    }

    /// Each of `objects` on disk, fetched at once, held until the holds are dropped; the
    /// first failure if any cannot be.
    pub async fn hold_all(&self, objects: &[&ObjectRef]) -> Result<Vec<Held>, String> {
        let held = futures::future::join_all(objects.iter().map(|o| self.hold(o))).await;
        held.into_iter().collect()
    }

    /// `object` on disk, held until the hold is dropped.
    pub async fn hold(&self, object: &ObjectRef) -> Result<Held, String> {
        let store = self.store().await?;
        self.cache()?
            .hold(store, object)
            .await
            .map_err(|e| format!("could not fetch object {object}: {e}"))
    }
}

/// The objects a python task names, on disk for its worker: the files of its function and
/// args when they come as objects, and of the values their pickles refer to, as the worker
/// reads them (`function_path`, `args_path`, `objects`), and the results of the jobs it reads
/// (`results`); and the holds that keep the files there until the call ends.
pub(crate) async fn fetch_pickles(
    access: Option<&ObjectAccess>,
    spec: &TaskSpec,
) -> Result<(Value, Vec<Held>), String> {
    let TaskSpec::Python {
        function_object,
        args_object,
        upstream,
        ..
    } = spec
    else {
        return Ok((Value::Null, Vec::new()));
    };
    let named: Vec<_> = spec.objects().collect();
    if named.is_empty() && upstream.is_empty() {
        return Ok((Value::Null, Vec::new()));
    }
    let Some(access) = access else {
        return Err("this executor cannot reach the object store".into());
    };
    // The upstream results and the objects, fetched at once.
    let results = async {
        match upstream.is_empty() {
            true => Ok(None),
            false => super::upstream::read_results(access, upstream)
                .await
                .map(Some),
        }
    };
    let (results, held) = futures::join!(results, access.hold_all(&named));
    let (results, held) = (results?, held?);
    let path_of = |object: &ObjectRef| {
        let at = named.iter().position(|n| *n == object)?;
        Some(held[at].path().to_string_lossy().into_owned())
    };
    let mut files = serde_json::json!({
        "objects": named
            .iter()
            .map(|o| (o.to_string(), serde_json::json!(path_of(o))))
            .collect::<serde_json::Map<_, _>>(),
    });
    if let Some(object) = function_object {
        files["function_path"] = serde_json::json!(path_of(object));
    }
    if let Some(object) = args_object {
        files["args_path"] = serde_json::json!(path_of(object));
    }
    if let Some(results) = results {
        files["results"] = results;
    }
    Ok((files, held))
}

/// A command's working directory with its inputs in place.
pub(crate) struct Staged {
    pub dir: Option<PathBuf>,
    /// Made for this attempt, and removed with it.
    own: Option<PathBuf>,
    /// The inputs' objects, kept in the cache while the command runs, each with its size
    /// and modification time when placed.
    held: Vec<(ObjectRef, Held, Option<Stamp>)>,
}

/// A file's size and modification time.
type Stamp = (u64, std::time::SystemTime);

impl Staged {
    /// The inputs whose files changed while the command ran: it wrote to them despite their
    /// mode (as root may), and so to the cache's copy, which a hard link shares.
    fn spoiled(&self) -> Vec<ObjectRef> {
        let now = |held: &Held| {
            let meta = std::fs::metadata(held.path()).ok()?;
            Some((meta.len(), meta.modified().ok()?))
        };
        self.held
            .iter()
            .filter(|(_, held, placed)| now(held) != *placed)
            .map(|(object, _, _)| object.clone())
            .collect()
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(own) = &self.own {
            let _ = std::fs::remove_dir_all(own);
        }
    }
}

/// Runs a command with its objects: inputs in place before it starts, outputs stored once it
/// has succeeded and named in its result. A command that names no object runs as it is.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_staged(
    access: Option<&ObjectAccess>,
    context: &TaskContext,
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
    timeout: Option<std::time::Duration>,
    inputs: &BTreeMap<String, ObjectRef>,
    outputs: &[String],
) -> (TaskResult, Option<Value>) {
    if inputs.is_empty() && outputs.is_empty() {
        return run_command(context, argv, env, cwd, timeout).await;
    }
    let Some(access) = access else {
        return (
            Err("this executor cannot reach the object store".into()),
            None,
        );
    };
    let attempt = format!("{}-{}", context.task_id, context.attempt);
    let staged = match stage(access, &attempt, inputs, !outputs.is_empty(), cwd).await {
        Ok(staged) => staged,
        Err(error) => return (Err(error), None),
    };
    let dir = staged
        .dir
        .clone()
        .expect("a directory for a command with objects");
    let (outcome, detail) = run_command(context, argv, env, dir.to_str(), timeout).await;
    for object in staged.spoiled() {
        tracing::warn!(%object, task = context.task_id, "a task wrote to its input; the \
                       executor fetches it again for the next task");
        if let Ok(cache) = access.cache() {
            cache.forget(&object);
        }
    }
    let mut result = match outcome {
        Ok(result) if !outputs.is_empty() => result,
        other => return (other, detail),
    };
    match collect(access, &dir, outputs).await {
        Ok(found) => {
            result["outputs"] = serde_json::json!(found);
            (Ok(result), None)
        }
        Err(error) => (Err(error), Some(result)),
    }
}

/// Fetches `inputs` and links each into the command's directory under its name: `cwd` if it
/// has one, else a directory of the attempt's own (made only when it has inputs or outputs).
pub(crate) async fn stage(
    access: &ObjectAccess,
    attempt: &str,
    inputs: &BTreeMap<String, ObjectRef>,
    has_outputs: bool,
    cwd: Option<&str>,
) -> Result<Staged, String> {
    let (dir, own) = match cwd {
        Some(cwd) => (Some(PathBuf::from(cwd)), None),
        None if inputs.is_empty() && !has_outputs => (None, None),
        None => {
            let own = access.data_dir.join("tasks").join(attempt);
            let _ = std::fs::remove_dir_all(&own);
            std::fs::create_dir_all(&own).map_err(|e| {
                format!("could not make the task's directory {}: {e}", own.display())
            })?;
            (Some(own.clone()), Some(own))
        }
    };
    let mut staged = Staged {
        dir,
        own,
        held: Vec::with_capacity(inputs.len()),
    };
    let objects: Vec<_> = inputs.values().collect();
    let held = access.hold_all(&objects).await?;
    for ((name, object), held) in inputs.iter().zip(held) {
        let dir = staged
            .dir
            .as_ref()
            .expect("a directory when there are inputs");
        place(held.path(), &dir.join(name))?;
        let meta = std::fs::metadata(held.path()).ok();
        let placed = meta.and_then(|m| Some((m.len(), m.modified().ok()?)));
        staged.held.push((object.clone(), held, placed));
    }
    Ok(staged)
}

/// Puts `from` (a cached object) at `to`, read-only: a hard link, or a copy where a link
/// cannot be made (another file system).
fn place(from: &Path, to: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = to.display();
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("could not make {}: {e}", parent.display()))?;
    }
    let _ = std::fs::set_permissions(from, std::fs::Permissions::from_mode(0o444));
    match std::fs::remove_file(to) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("could not replace {shown}: {e}")),
    }
    crate::objects::host::link_or_copy(from, to)
        .map_err(|e| format!("could not place input {shown}: {e}"))
}

/// Puts every regular file under `dir` that one of `patterns` matches (paths relative to
/// `dir`, `*` and `?` within one part of a path) into the store: each one's reference by its
/// relative path.
pub(crate) async fn collect(
    access: &ObjectAccess,
    dir: &Path,
    patterns: &[String],
) -> Result<BTreeMap<String, ObjectRef>, String> {
    let mut found = BTreeMap::new();
    for file in files_under(dir) {
        let relative = file.strip_prefix(dir).unwrap_or(&file);
        let Some(relative) = relative.to_str() else {
            continue;
        };
        if patterns.iter().any(|p| matches_path(p, relative)) {
            found.insert(relative.to_string(), file.clone());
        }
    }
    let store = access.store().await?;
    let mut outputs = BTreeMap::new();
    for (name, file) in found {
        let put = store
            .put_file(&file)
            .await
            .map_err(|e| format!("could not store output {name}: {e}"))?;
        access.counts.put(put.size, put.sent);
        outputs.insert(name, put.object);
    }
    Ok(outputs)
}

/// Every regular file under `dir`, not following links to directories.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    files
}

/// Whether `path` (parts split by `/`) matches `pattern`, part for part, where `*` stands for
/// any run of characters and `?` for one, within a part.
pub(crate) fn matches_path(pattern: &str, path: &str) -> bool {
    let (pattern, path): (Vec<&str>, Vec<&str>) =
        (pattern.split('/').collect(), path.split('/').collect());
    pattern.len() == path.len()
        && pattern
            .iter()
            .zip(&path)
            .all(|(p, s)| matches_part(p.as_bytes(), s.as_bytes()))
}

fn matches_part(pattern: &[u8], text: &[u8]) -> bool {
    match (pattern.first(), text.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            matches_part(&pattern[1..], text)
                || (!text.is_empty() && matches_part(pattern, &text[1..]))
        }
        (Some(b'?'), Some(_)) => matches_part(&pattern[1..], &text[1..]),
        (Some(p), Some(t)) if p == t => matches_part(&pattern[1..], &text[1..]),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::matches_path;

    #[test]
    fn a_pattern_matches_part_for_part() {
        assert!(matches_path("out/*.json", "out/a.json"));
        assert!(matches_path("out/*.json", "out/.json"));
        assert!(!matches_path("out/*.json", "out/sub/a.json"));
        assert!(!matches_path("out/*.json", "a.json"));
        assert!(matches_path("*", "result.csv"));
        assert!(matches_path("r?sult.*", "result.csv"));
        assert!(!matches_path("r?sult.*", "rsult.csv"));
        assert!(matches_path("*/*", "a/b"));
        assert!(matches_path("model.bin", "model.bin"));
        assert!(!matches_path("model.bin", "model.bin2"));
    }
}
