//! [`Storage`]: the one object store interface the rest of iota uses.
//!
//! It wraps an `object_store` backend (local directory, memory or S3-compatible bucket, see
//! [`StorageConfig`]) and adds what iota needs on top: keys that are safe by construction
//! ([`ObjectKey`]), a key prefix, multipart uploads for large payloads, a BLAKE3 hash of every
//! payload, and presigned URLs so that miners need no bucket credentials.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::signer::Signer;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use url::Url;

use super::key::ObjectKey;
use super::recent::RecentWrites;
use super::store_config::{self, BackendKind, StorageConfig};
use super::store_error::{StorageError, StorageResult};
use super::traffic::{self, TrafficDir};
use crate::codec::payload_hash;

/// Payloads larger than this are uploaded in parts by default (8 MiB).
pub const DEFAULT_MULTIPART_THRESHOLD: usize = 8 * 1024 * 1024;
/// Default size of one multipart part (8 MiB).
pub const DEFAULT_PART_SIZE: usize = 8 * 1024 * 1024;
/// S3's smallest allowed part (all but the last), 5 MiB.
pub const S3_MIN_PART_SIZE: usize = 5 * 1024 * 1024;
/// S3's largest number of parts in one upload.
pub const S3_MAX_PARTS: usize = 10_000;
/// The longest validity of a presigned URL S3 accepts: 7 days.
pub const MAX_PRESIGN_EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);
/// Parts of one multipart upload in flight at once.
const PART_CONCURRENCY: usize = 4;

/// The HTTP method a presigned URL allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresignMethod {
    /// Download the object (ranges allowed).
    Get,
    /// Upload the object with one `PUT` of the whole body.
    Put,
}

/// One object found by [`Storage::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Its key, relative to the store's prefix.
    pub key: ObjectKey,
    /// Its size in bytes.
    pub size: u64,
}

/// An object store holding one deployment's objects, all under an optional key prefix.
///
/// Cheap to clone (the backend is shared). All methods take keys relative to the prefix.
#[derive(Clone)]
pub struct Storage {
    store: Arc<dyn ObjectStore>,
    /// Present only for backends that can presign (S3).
    signer: Option<Arc<dyn Signer>>,
    prefix: Option<ObjectKey>,
    kind: BackendKind,
    multipart_threshold: usize,
    part_size: usize,
    /// What this handle stored recently, read back from memory (see [`RecentWrites`]).
    recent: Option<Arc<RecentWrites>>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("store", &self.store.to_string())
            .field("prefix", &self.prefix)
            .field("kind", &self.kind)
            .field("multipart_threshold", &self.multipart_threshold)
            .field("part_size", &self.part_size)
            .field("recent_writes", &self.recent.as_ref().map(|r| r.held()))
            .finish()
    }
}

impl Storage {
    /// Opens the store described by `config` (see [`StorageConfig`] for the URL forms). Local
    /// directories are created if missing; nothing is sent to an S3 server yet.
    ///
    /// # Errors
    /// [`StorageError::BadUrl`] for an unusable URL or S3 setting, [`StorageError::BadKey`] for
    /// an S3 prefix that is not made of plain path components, [`StorageError::Io`] when the
    /// local directory cannot be created.
    pub fn open(config: &StorageConfig) -> StorageResult<Self> {
        let opened = store_config::open(config)?;
        let signer = opened.s3.map(|s3| s3 as Arc<dyn Signer>);
        Ok(Self {
            store: opened.store,
            signer,
            prefix: opened.prefix,
            kind: opened.kind,
            multipart_threshold: DEFAULT_MULTIPART_THRESHOLD,
            part_size: DEFAULT_PART_SIZE,
            recent: None,
        })
    }

    /// An empty in-process store (tests, and components that want a throwaway store).
    pub fn in_memory() -> Self {
        Self::from_store(
            Arc::new(object_store::memory::InMemory::new()),
            None,
            BackendKind::Memory,
        )
    }

    /// Wraps an existing backend, with keys under `prefix`. It cannot presign.
    pub fn from_store(
        store: Arc<dyn ObjectStore>,
        prefix: Option<ObjectKey>,
        kind: BackendKind,
    ) -> Self {
        Self {
            store,
            signer: None,
            prefix,
            kind,
            multipart_threshold: DEFAULT_MULTIPART_THRESHOLD,
            part_size: DEFAULT_PART_SIZE,
            recent: None,
        }
    }

    /// Keeps what this handle (and its clones) store in memory, up to `budget` bytes, and
    /// reads it back from there ([`RecentWrites`]). For a store that only this process
    /// writes under the keys it stores itself, as the orchestrator's.
    pub fn with_recent_writes(mut self, budget: usize) -> Self {
        self.recent = Some(Arc::new(RecentWrites::new(budget)));
        self
    }

    /// Drops the in-memory copy of the object under `key`, if this handle keeps one; the
    /// object stays in the store. For an object nobody is expected to read back soon.
    pub fn forget_recent(&self, key: &ObjectKey) {
        self.forget(&self.path(key));
    }

    /// Drops the in-memory copies of every object under `prefix` (whole key components: `a/1`
    /// does not cover `a/10`); the objects stay in the store.
    pub fn forget_recent_under(&self, prefix: &ObjectKey) {
        if let Some(recent) = &self.recent {
            let mut path = self.path(prefix).as_ref().to_string();
            path.push('/');
            recent.forget_under(&path);
        }
    }

    /// The object under `path` if this handle stored it recently.
    fn recent(&self, path: &Path) -> Option<Bytes> {
        self.recent.as_ref()?.get(path.as_ref())
    }

    /// Sets when [`Storage::put`] switches to a multipart upload (payloads strictly larger
    /// than `threshold` bytes) and the size of each part but the last.
    ///
    /// # Errors
    /// [`StorageError::InvalidConfig`] when `part_size` is 0, or below S3's 5 MiB minimum on
    /// an S3 backend.
    pub fn with_multipart(mut self, threshold: usize, part_size: usize) -> StorageResult<Self> {
        if part_size == 0 {
            return Err(StorageError::InvalidConfig {
                reason: "multipart part size must be positive".into(),
            });
        }
        if self.kind == BackendKind::S3 && part_size < S3_MIN_PART_SIZE {
            return Err(StorageError::InvalidConfig {
                reason: format!(
                    "multipart part size {part_size} is below S3's minimum of {S3_MIN_PART_SIZE} bytes"
                ),
            });
        }
        self.multipart_threshold = threshold;
        self.part_size = part_size;
        Ok(self)
    }

    /// The kind of backend.
    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    /// The key prefix every key is stored under, if any.
    pub fn prefix(&self) -> Option<&ObjectKey> {
        self.prefix.as_ref()
    }

    /// The backend's path of `key`: `prefix/key`.
    fn path(&self, key: &ObjectKey) -> Path {
        match &self.prefix {
            Some(prefix) => {
                Path::from_iter(prefix.as_str().split('/').chain(key.as_str().split('/')))
            }
            None => Path::from_iter(key.as_str().split('/')),
        }
    }

    /// Stores `bytes` under `key`, replacing any object there, and returns the payload's BLAKE3
    /// hash (lowercase hex). Payloads above the multipart threshold go up in parts, at most
    /// 4 in flight; a failed multipart upload is aborted so no parts are left behind. The
    /// object appears whole or not at all.
    ///
    /// # Errors
    /// [`StorageError::InvalidConfig`] when the payload would need more than
    /// [`S3_MAX_PARTS`] parts; [`StorageError::AccessDenied`] or [`StorageError::Backend`] when
    /// the backend fails (after its own retries).
    pub async fn put(&self, key: &ObjectKey, bytes: Bytes) -> StorageResult<String> {
        let hash = payload_hash(&bytes);
        let path = self.path(key);
        let backend_err = |e| StorageError::from_backend(key.as_str(), e);
        let whole = bytes.clone();
        let stored = |path: &Path| {
            if let Some(recent) = &self.recent {
                recent.stored(path.as_ref(), whole.clone());
            }
        };
        if bytes.len() <= self.multipart_threshold {
            let len = bytes.len() as u64;
            let put = self.store.put(&path, PutPayload::from(bytes)).await;
            if let Err(e) = put {
                self.forget(&path);
                return Err(backend_err(e));
            }
            stored(&path);
            traffic::global().record_key(key.as_str(), TrafficDir::Up, len);
            return Ok(hash);
        }
        // Whatever is under the key while the parts go up is not what was cached.
        self.forget(&path);

        let parts = bytes.len().div_ceil(self.part_size);
        if parts > S3_MAX_PARTS {
            return Err(StorageError::InvalidConfig {
                reason: format!(
                    "{} bytes in parts of {} would need {parts} parts; the limit is {S3_MAX_PARTS}",
                    bytes.len(),
                    self.part_size
                ),
            });
        }
        let upload = self.store.put_multipart(&path).await.map_err(backend_err)?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, self.part_size);
        let len = bytes.len() as u64;
        let mut rest = bytes;
        while !rest.is_empty() {
            if let Err(e) = writer.wait_for_capacity(PART_CONCURRENCY).await {
                // The upload already failed; aborting is best effort and its own error would
                // hide the cause.
                let _ = writer.abort().await;
                return Err(backend_err(e));
            }
            let take = rest.len().min(self.part_size);
            writer.put(rest.split_to(take));
        }
        // `finish` aborts the upload itself when a part or the completion fails.
        writer.finish().await.map_err(backend_err)?;
        stored(&path);
        traffic::global().record_key(key.as_str(), TrafficDir::Up, len);
        Ok(hash)
    }

    /// Drops `path` from the recent writes (it changed in a way they do not hold).
    fn forget(&self, path: &Path) {
        forget(self.recent.as_deref(), path);
    }

    /// A writer that stores an object under `key` from consecutive chunks, so a large object
    /// (a merged section) never has to be held in memory whole. Nothing is visible under `key`
    /// before [`ObjectWriter::finish`].
    pub fn writer(&self, key: &ObjectKey) -> ObjectWriter {
        ObjectWriter {
            store: self.store.clone(),
            path: self.path(key),
            key: key.clone(),
            threshold: self.multipart_threshold,
            part_size: self.part_size,
            buffer: Vec::new(),
            multipart: None,
            written: 0,
            recent: self.recent.clone(),
        }
    }

    /// The whole object under `key`.
    ///
    /// # Errors
    /// [`StorageError::NotFound`] when there is none; [`StorageError::AccessDenied`] or
    /// [`StorageError::Backend`] when the backend fails.
    pub async fn get(&self, key: &ObjectKey) -> StorageResult<Bytes> {
        let backend_err = |e| StorageError::from_backend(key.as_str(), e);
        let path = self.path(key);
        // Read from memory or not, these are the store's bytes: the traffic counters count
        // them alike.
        let bytes = match self.recent(&path) {
            Some(bytes) => bytes,
            None => {
                let result = self.store.get(&path).await.map_err(backend_err)?;
                result.bytes().await.map_err(backend_err)?
            }
        };
        traffic::global().record_key(key.as_str(), TrafficDir::Down, bytes.len() as u64);
        Ok(bytes)
    }

    /// The whole object under `key`, checked against the BLAKE3 hash its producer reported
    /// (hex, either case).
    ///
    /// # Errors
    /// [`StorageError::HashMismatch`] when the bytes do not hash to `expected_hash`; otherwise
    /// as [`Storage::get`].
    pub async fn get_verified(&self, key: &ObjectKey, expected_hash: &str) -> StorageResult<Bytes> {
        let bytes = self.get(key).await?;
        let got = payload_hash(&bytes);
        if !got.eq_ignore_ascii_case(expected_hash) {
            return Err(StorageError::HashMismatch {
                key: key.to_string(),
                expected: expected_hash.to_owned(),
                got,
            });
        }
        Ok(bytes)
    }

    /// The whole object under `key`, which must be exactly `len` bytes: its size is asked first
    /// (HEAD), so an object of any other size is refused without reading a byte of it, and the
    /// read itself asks for `len` bytes only (an object replaced in between cannot make it
    /// read more).
    ///
    /// # Errors
    /// [`StorageError::LengthMismatch`] when the object is not `len` bytes; otherwise as
    /// [`Storage::get_range`].
    pub async fn get_exact(&self, key: &ObjectKey, len: u64) -> StorageResult<Bytes> {
        let size = self.head(key).await?;
        if size != len {
            return Err(StorageError::LengthMismatch {
                key: key.to_string(),
                expected: len,
                got: size,
            });
        }
        self.get_range(key, 0..len).await
    }

    /// Bytes `range.start..range.end` of the object under `key`. An empty range returns no
    /// bytes without asking the backend.
    ///
    /// # Errors
    /// [`StorageError::InvalidRange`] when `range.end < range.start`; a range reaching past
    /// the end of the object fails with [`StorageError::LengthMismatch`] or, where the backend
    /// itself refuses it, [`StorageError::Backend`]; otherwise as [`Storage::get`].
    pub async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> StorageResult<Bytes> {
        if range.end < range.start {
            return Err(StorageError::InvalidRange {
                key: key.to_string(),
                start: range.start,
                end: range.end,
            });
        }
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let expected = range.end - range.start;
        let path = self.path(key);
        let held = self
            .recent(&path)
            .filter(|b| range.end <= b.len() as u64)
            .map(|b| b.slice(range.start as usize..range.end as usize));
        let bytes = match held {
            Some(bytes) => bytes,
            None => self
                .store
                .get_range(&path, range)
                .await
                .map_err(|e| StorageError::from_backend(key.as_str(), e))?,
        };
        if bytes.len() as u64 != expected {
            return Err(StorageError::LengthMismatch {
                key: key.to_string(),
                expected,
                got: bytes.len() as u64,
            });
        }
        traffic::global().record_key(key.as_str(), TrafficDir::Down, expected);
        Ok(bytes)
    }

    /// Copies the object under `from` to `to` inside the store (S3: a server-side copy; a local
    /// directory: a hard link renamed into place), replacing any object at `to`. The copy is a
    /// snapshot: writing `from` again later does not change it.
    ///
    /// # Errors
    /// [`StorageError::NotFound`] when there is nothing under `from`; otherwise as
    /// [`Storage::get`].
    pub async fn copy(&self, from: &ObjectKey, to: &ObjectKey) -> StorageResult<()> {
        let (from_path, to_path) = (self.path(from), self.path(to));
        let copied = self
            .store
            .copy(&from_path, &to_path)
            .await
            .map_err(|e| StorageError::from_backend(from.as_str(), e));
        if let Some(recent) = &self.recent {
            match (&copied, recent.get(from_path.as_ref())) {
                (Ok(()), Some(bytes)) => recent.stored(to_path.as_ref(), bytes),
                _ => recent.forget(to_path.as_ref()),
            }
        }
        copied
    }

    /// The size in bytes of the object under `key`.
    ///
    /// # Errors
    /// As [`Storage::get`].
    pub async fn head(&self, key: &ObjectKey) -> StorageResult<u64> {
        let path = self.path(key);
        if let Some(bytes) = self.recent(&path) {
            return Ok(bytes.len() as u64);
        }
        let meta = self
            .store
            .head(&path)
            .await
            .map_err(|e| StorageError::from_backend(key.as_str(), e))?;
        Ok(meta.size)
    }

    /// Whether an object exists under `key`.
    ///
    /// # Errors
    /// [`StorageError::AccessDenied`] or [`StorageError::Backend`] when the backend fails
    /// (a missing object is `Ok(false)`).
    pub async fn exists(&self, key: &ObjectKey) -> StorageResult<bool> {
        match self.head(key).await {
            Ok(_) => Ok(true),
            Err(StorageError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every object whose key starts with the whole components of `prefix` (all objects when
    /// `None`), sorted by key. Objects whose names are not valid [`ObjectKey`]s (put there by
    /// something other than iota) are skipped with a warning rather than failing the listing.
    ///
    /// # Errors
    /// [`StorageError::AccessDenied`] or [`StorageError::Backend`] when the backend fails.
    pub async fn list(&self, prefix: Option<&ObjectKey>) -> StorageResult<Vec<ObjectInfo>> {
        let label = prefix.map_or_else(String::new, ObjectKey::to_string);
        let path = match (prefix, &self.prefix) {
            (Some(key), _) => Some(self.path(key)),
            (None, Some(root)) => Some(Path::from_iter(root.as_str().split('/'))),
            (None, None) => None,
        };
        let metas: Vec<_> = self
            .store
            .list(path.as_ref())
            .try_collect()
            .await
            .map_err(|e| StorageError::from_backend(&label, e))?;
        let mut found = Vec::with_capacity(metas.len());
        for meta in metas {
            let location = meta.location.as_ref();
            let key = match ObjectKey::parse(location) {
                Ok(full) => match &self.prefix {
                    Some(root) => full.strip_prefix(root),
                    None => Some(full),
                },
                Err(e) => {
                    tracing::warn!(%location, error = %e, "skipping object with a foreign name");
                    None
                }
            };
            if let Some(key) = key {
                found.push(ObjectInfo {
                    key,
                    size: meta.size,
                });
            }
        }
        found.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(found)
    }

    /// Deletes the object under `key`. Deleting a missing object succeeds, as on S3, so that
    /// garbage collection can be retried safely.
    ///
    /// # Errors
    /// [`StorageError::AccessDenied`] or [`StorageError::Backend`] when the backend fails.
    pub async fn delete(&self, key: &ObjectKey) -> StorageResult<()> {
        let path = self.path(key);
        // Forgotten first: a failed delete may have removed the object all the same.
        self.forget(&path);
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(StorageError::from_backend(key.as_str(), e)),
        }
    }

    /// Deletes every object under `prefix` (e.g. one epoch's activations) and returns how
    /// many there were.
    ///
    /// # Errors
    /// As [`Storage::list`] and [`Storage::delete`]; objects deleted before a failure stay
    /// deleted, so a retry finishes the job.
    pub async fn delete_prefix(&self, prefix: &ObjectKey) -> StorageResult<usize> {
        let objects = self.list(Some(prefix)).await?;
        for object in &objects {
            self.delete(&object.key).await?;
        }
        Ok(objects.len())
    }

    /// A URL that lets its holder `GET` or `PUT` the object under `key` without credentials,
    /// for `expires` (S3 backends). `None` on local and memory backends, whose objects the
    /// orchestrator serves itself. A presigned `GET` accepts `Range` headers.
    ///
    /// # Errors
    /// [`StorageError::InvalidConfig`] when `expires` is zero or longer than
    /// [`MAX_PRESIGN_EXPIRY`]; [`StorageError::Backend`] when signing fails (e.g. no
    /// credentials configured).
    pub async fn presign(
        &self,
        method: PresignMethod,
        key: &ObjectKey,
        expires: Duration,
    ) -> StorageResult<Option<Url>> {
        if expires.is_zero() || expires > MAX_PRESIGN_EXPIRY {
            return Err(StorageError::InvalidConfig {
                reason: format!(
                    "presigned URL expiry {expires:?} must be within 1s..={MAX_PRESIGN_EXPIRY:?}"
                ),
            });
        }
        let Some(signer) = &self.signer else {
            return Ok(None);
        };
        let method = match method {
            PresignMethod::Get => object_store::signer::Method::GET,
            PresignMethod::Put => object_store::signer::Method::PUT,
        };
        let url = signer
            .signed_url(method, &self.path(key), expires)
            .await
            .map_err(|e| StorageError::from_backend(key.as_str(), e))?;
        Ok(Some(url))
    }
}

/// Drops `path` from `recent`, where there is one (the object changed in a way it does not
/// hold).
fn forget(recent: Option<&RecentWrites>, path: &Path) {
    if let Some(recent) = recent {
        recent.forget(path.as_ref());
    }
}

/// Writes one object from consecutive chunks ([`Storage::writer`]): small objects go up in one
/// request at [`ObjectWriter::finish`], larger ones as a multipart upload (aborted on error).
pub struct ObjectWriter {
    store: Arc<dyn ObjectStore>,
    path: Path,
    key: ObjectKey,
    threshold: usize,
    part_size: usize,
    buffer: Vec<u8>,
    multipart: Option<WriteMultipart>,
    written: u64,
    /// The store's recent writes, told about the object once it is complete.
    recent: Option<Arc<RecentWrites>>,
}

impl std::fmt::Debug for ObjectWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectWriter")
            .field("key", &self.key)
            .field("written", &self.written)
            .finish_non_exhaustive()
    }
}

impl ObjectWriter {
    /// Makes room for `additional` more bytes ahead of the writes (at most what is held before
    /// a multipart upload takes over), so a body of known length is not copied again each
    /// time the buffer grows.
    pub fn reserve(&mut self, additional: usize) {
        if self.multipart.is_none() {
            let room = self
                .threshold
                .saturating_add(1)
                .saturating_sub(self.buffer.len());
            self.buffer.reserve(additional.min(room));
        }
    }

    /// Appends `chunk`.
    ///
    /// # Errors
    /// [`StorageError::AccessDenied`] or [`StorageError::Backend`] when a part fails (the
    /// upload is aborted then).
    pub async fn write(&mut self, chunk: &[u8]) -> StorageResult<()> {
        self.written += chunk.len() as u64;
        self.buffer.extend_from_slice(chunk);
        if self.multipart.is_none() && self.buffer.len() > self.threshold {
            let upload = self
                .store
                .put_multipart(&self.path)
                .await
                .map_err(|e| StorageError::from_backend(self.key.as_str(), e))?;
            self.multipart = Some(WriteMultipart::new_with_chunk_size(upload, self.part_size));
        }
        if let Some(writer) = self.multipart.as_mut() {
            if let Err(e) = writer.wait_for_capacity(PART_CONCURRENCY).await {
                if let Some(writer) = self.multipart.take() {
                    let _ = writer.abort().await;
                }
                return Err(StorageError::from_backend(self.key.as_str(), e));
            }
            writer.put(Bytes::from(std::mem::take(&mut self.buffer)));
        }
        Ok(())
    }

    /// Gives the object up: nothing appears under the key, and a multipart upload already
    /// begun is aborted (best effort: its error is only logged).
    pub async fn abort(self) {
        if let Some(writer) = self.multipart
            && let Err(e) = writer.abort().await
        {
            tracing::warn!(key = %self.key, "aborting an upload: {e}");
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.written
    }

    /// True before anything was written.
    pub fn is_empty(&self) -> bool {
        self.written == 0
    }

    /// Completes the object; returns its size. (It hashes nothing: a writer that needs the
    /// object's hash hashes the chunks it writes, and the `/blob` endpoint, which has no use
    /// for one, spends no CPU on it; whoever reads an upload checks it against its own pin.)
    ///
    /// # Errors
    /// As [`Self::write`].
    pub async fn finish(self) -> StorageResult<u64> {
        let backend_err = |e| StorageError::from_backend(self.key.as_str(), e);
        match self.multipart {
            Some(writer) => {
                // Written in parts that were not kept: what the cache held is stale.
                forget(self.recent.as_deref(), &self.path);
                writer.finish().await.map_err(backend_err)?;
            }
            None => {
                let bytes = Bytes::from(self.buffer);
                let put = self
                    .store
                    .put(&self.path, PutPayload::from(bytes.clone()))
                    .await;
                match (put, &self.recent) {
                    (Ok(_), Some(recent)) => recent.stored(self.path.as_ref(), bytes),
                    (Ok(_), None) => {}
                    (Err(e), _) => {
                        forget(self.recent.as_deref(), &self.path);
                        return Err(backend_err(e));
                    }
                }
            }
        }
        traffic::global().record_key(self.key.as_str(), TrafficDir::Up, self.written);
        Ok(self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::key::{Direction, Hotkey, RunKeys, StatePart};

    fn local() -> (tempfile::TempDir, Storage) {
        let dir = tempfile::tempdir().unwrap();
        let storage =
            Storage::open(&StorageConfig::local(dir.path().display().to_string())).unwrap();
        (dir, storage)
    }

    fn key(s: &str) -> ObjectKey {
        ObjectKey::parse(s).unwrap()
    }

    /// A store with recent writes kept reads back exactly what the directory holds after
    /// every kind of write, and forgets what is deleted or replaced in parts.
    #[tokio::test]
    async fn recent_writes_read_back_what_the_directory_holds() {
        let (dir, plain) = local();
        let cached = Storage::open(&StorageConfig::local(dir.path().display().to_string()))
            .unwrap()
            .with_multipart(64, 16)
            .unwrap()
            .with_recent_writes(1 << 20);
        let same = |k: &'static str| {
            let (plain, cached) = (plain.clone(), cached.clone());
            async move {
                let k = key(k);
                let want = plain.get(&k).await.unwrap();
                assert_eq!(cached.get(&k).await.unwrap(), want, "{k}");
                assert_eq!(cached.head(&k).await.unwrap(), want.len() as u64, "{k}");
                assert_eq!(
                    cached.get_range(&k, 2..5).await.unwrap(),
                    want.slice(2..5),
                    "{k}"
                );
                want
            }
        };
        cached
            .put(&key("a/put"), Bytes::from_static(b"0123456789"))
            .await
            .unwrap();
        assert_eq!(&same("a/put").await[..], b"0123456789");
        let mut w = cached.writer(&key("a/written"));
        w.write(b"abcdef").await.unwrap();
        w.finish().await.unwrap();
        assert_eq!(&same("a/written").await[..], b"abcdef");
        cached.copy(&key("a/put"), &key("a/copy")).await.unwrap();
        assert_eq!(&same("a/copy").await[..], b"0123456789");
        // Replaced by a writer: the new content, not the cached one.
        let mut w = cached.writer(&key("a/put"));
        w.write(b"XYZXYZ").await.unwrap();
        w.finish().await.unwrap();
        assert_eq!(&same("a/put").await[..], b"XYZXYZ");
        // Replaced in parts (over the 64-byte threshold), which are not kept.
        let big: Vec<u8> = (0..200u8).collect();
        let mut w = cached.writer(&key("a/put"));
        w.write(&big).await.unwrap();
        w.finish().await.unwrap();
        assert_eq!(&same("a/put").await[..], &big[..]);
        // A range past the end is refused as the backend refuses it.
        assert!(cached.get_range(&key("a/written"), 0..7).await.is_err());
        // Deleted: gone for both.
        cached.delete_prefix(&key("a")).await.unwrap();
        for k in ["a/put", "a/written", "a/copy"] {
            assert!(matches!(
                cached.get(&key(k)).await,
                Err(StorageError::NotFound { .. })
            ));
        }
    }

    /// 0, 1, ..., 250, 0, 1, ...: a payload whose every byte is predictable.
    fn pattern(len: usize) -> Bytes {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    #[tokio::test]
    async fn put_get_head_exists_delete_round_trip() {
        let (_dir, storage) = local();
        let k = RunKeys::new("r")
            .unwrap()
            .activation(1, 2, 0, Direction::Forward);
        let payload = Bytes::from_static(b"hello activations");

        assert!(!storage.exists(&k).await.unwrap());
        let hash = storage.put(&k, payload.clone()).await.unwrap();
        // BLAKE3 of the payload, as computed by the reference implementation itself.
        assert_eq!(
            hash,
            blake3::hash(b"hello activations").to_hex().to_string()
        );
        assert_eq!(hash.len(), 64);

        assert_eq!(storage.get(&k).await.unwrap(), payload);
        assert_eq!(storage.head(&k).await.unwrap(), 17);
        assert!(storage.exists(&k).await.unwrap());

        storage.delete(&k).await.unwrap();
        assert!(!storage.exists(&k).await.unwrap());
        // Deleting again is not an error.
        storage.delete(&k).await.unwrap();
        assert!(matches!(
            storage.get(&k).await,
            Err(StorageError::NotFound { key }) if key == k.as_str()
        ));
        assert!(matches!(
            storage.head(&k).await,
            Err(StorageError::NotFound { .. })
        ));
    }

    #[tokio::test]
    async fn objects_land_in_the_directory_under_their_key() {
        let (dir, storage) = local();
        storage
            .put(
                &key("runs/r/checkpoints/1/0/parameters"),
                Bytes::from_static(b"abc"),
            )
            .await
            .unwrap();
        let on_disk = std::fs::read(dir.path().join("runs/r/checkpoints/1/0/parameters")).unwrap();
        assert_eq!(on_disk, b"abc");
    }

    #[tokio::test]
    async fn ranges_are_exact_and_checked() {
        let (_dir, storage) = local();
        let k = key("runs/r/weights/0/1/h/parameters");
        storage.put(&k, pattern(1000)).await.unwrap();

        let got = storage.get_range(&k, 10..20).await.unwrap();
        assert_eq!(got.as_ref(), &[10, 11, 12, 13, 14, 15, 16, 17, 18, 19]);
        // Bytes 995..1000 are 995 % 251 = 242 .. 246.
        let tail = storage.get_range(&k, 995..1000).await.unwrap();
        assert_eq!(tail.as_ref(), &[242, 243, 244, 245, 246]);
        assert!(storage.get_range(&k, 7..7).await.unwrap().is_empty());

        #[allow(clippy::reversed_empty_ranges)]
        let reversed = storage.get_range(&k, 20..10).await;
        assert!(matches!(
            reversed,
            Err(StorageError::InvalidRange {
                start: 20,
                end: 10,
                ..
            })
        ));
        assert!(storage.get_range(&k, 990..1010).await.is_err());
        assert!(storage.get_range(&k, 2000..2010).await.is_err());
    }

    #[tokio::test]
    async fn writer_streams_small_and_multipart_objects() {
        let (_dir, storage) = local();
        let storage = storage.with_multipart(1000, 300).unwrap();
        for (name, size) in [("small", 700usize), ("large", 2500)] {
            let k = key(&format!("runs/r/checkpoints/1/0/{name}"));
            let payload = pattern(size);
            let mut writer = storage.writer(&k);
            for chunk in payload.chunks(137) {
                writer.write(chunk).await.unwrap();
            }
            assert_eq!(writer.len(), size as u64);
            assert!(!storage.exists(&k).await.unwrap(), "visible before finish");
            assert_eq!(writer.finish().await.unwrap(), size as u64);
            assert_eq!(storage.get(&k).await.unwrap(), payload);
        }
    }

    #[tokio::test]
    async fn multipart_upload_reassembles_the_payload() {
        let (dir, storage) = local();
        let storage = storage.with_multipart(1000, 300).unwrap();
        let k = key("runs/r/merged/0/1/2/h/parameters");
        // 2500 bytes in parts of 300: 8 full parts and one of 100.
        let payload = pattern(2500);
        let hash = storage.put(&k, payload.clone()).await.unwrap();
        assert_eq!(hash, payload_hash(&payload));
        assert_eq!(storage.get(&k).await.unwrap(), payload);
        assert_eq!(storage.head(&k).await.unwrap(), 2500);
        assert_eq!(
            storage.get_range(&k, 299..302).await.unwrap().as_ref(),
            &[299 % 251, 300 % 251, 301 % 251].map(|b| b as u8)
        );
        // Exactly at the threshold still takes the single-request path.
        let small = key("runs/r/small");
        storage.put(&small, pattern(1000)).await.unwrap();
        assert_eq!(storage.get(&small).await.unwrap(), pattern(1000));
        // No staging files are left beside the objects.
        let listed = storage.list(None).await.unwrap();
        assert_eq!(listed.len(), 2, "{listed:?}");
        let mut files = 0;
        for entry in walk(dir.path()) {
            files += 1;
            assert!(!entry.contains('#'), "leftover staging file {entry}");
        }
        assert_eq!(files, 2);
    }

    fn walk(dir: &std::path::Path) -> Vec<String> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path.display().to_string());
            }
        }
        out
    }

    #[test]
    fn multipart_settings_are_validated() {
        assert!(matches!(
            Storage::in_memory().with_multipart(10, 0),
            Err(StorageError::InvalidConfig { .. })
        ));
        let s3 = Storage::from_store(
            Arc::new(object_store::memory::InMemory::new()),
            None,
            BackendKind::S3,
        );
        assert!(matches!(
            s3.clone().with_multipart(10, 1024),
            Err(StorageError::InvalidConfig { .. })
        ));
        assert!(s3.with_multipart(10, S3_MIN_PART_SIZE).is_ok());
    }

    #[tokio::test]
    async fn verified_get_rejects_a_wrong_hash() {
        let storage = Storage::in_memory();
        let k = key("runs/r/activations/0/1/0/forward");
        let hash = storage
            .put(&k, Bytes::from_static(b"payload"))
            .await
            .unwrap();
        assert_eq!(
            storage.get_verified(&k, &hash).await.unwrap().as_ref(),
            b"payload"
        );
        assert!(
            storage
                .get_verified(&k, &hash.to_ascii_uppercase())
                .await
                .is_ok()
        );

        let wrong = payload_hash(b"something else");
        match storage.get_verified(&k, &wrong).await {
            Err(StorageError::HashMismatch { key, expected, got }) => {
                assert_eq!(key, k.as_str());
                assert_eq!(expected, wrong);
                assert_eq!(got, hash);
            }
            other => panic!("expected HashMismatch, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn list_and_delete_prefix_respect_components() {
        let (_dir, storage) = local();
        let keys = RunKeys::new("r").unwrap();
        let alice = Hotkey::new("alice").unwrap();
        let bob = Hotkey::new("bob").unwrap();
        let a = keys.weights(1, 5, &alice, StatePart::Parameters);
        let b = keys.weights(1, 5, &bob, StatePart::Parameters);
        let other_epoch = keys.weights(1, 50, &alice, StatePart::Parameters);
        storage.put(&a, pattern(3)).await.unwrap();
        storage.put(&b, pattern(4)).await.unwrap();
        storage.put(&other_epoch, pattern(5)).await.unwrap();

        let listed = storage.list(Some(&keys.weights_epoch(1, 5))).await.unwrap();
        assert_eq!(
            listed,
            vec![
                ObjectInfo {
                    key: a.clone(),
                    size: 3
                },
                ObjectInfo {
                    key: b.clone(),
                    size: 4
                },
            ]
        );
        assert_eq!(storage.list(None).await.unwrap().len(), 3);
        assert!(
            storage
                .list(Some(&key("runs/nothing-here")))
                .await
                .unwrap()
                .is_empty()
        );

        assert_eq!(
            storage
                .delete_prefix(&keys.weights_epoch(1, 5))
                .await
                .unwrap(),
            2
        );
        assert!(!storage.exists(&a).await.unwrap());
        assert!(!storage.exists(&b).await.unwrap());
        assert!(storage.exists(&other_epoch).await.unwrap());
    }

    #[tokio::test]
    async fn prefix_is_applied_and_stripped() {
        let inner: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let storage = Storage::from_store(inner.clone(), Some(key("team/a")), BackendKind::Memory);
        let k = key("runs/r/x");
        storage.put(&k, Bytes::from_static(b"1")).await.unwrap();
        // Something outside the prefix must not show up.
        inner
            .put(
                &Path::from("team/b/runs/r/y"),
                PutPayload::from_static(b"2"),
            )
            .await
            .unwrap();
        // An object with a name iota would never write is skipped, not fatal.
        inner
            .put(
                &Path::from("team/a/runs/has space"),
                PutPayload::from_static(b"3"),
            )
            .await
            .unwrap();

        let raw = inner.get(&Path::from("team/a/runs/r/x")).await.unwrap();
        assert_eq!(raw.bytes().await.unwrap().as_ref(), b"1");
        let listed = storage.list(None).await.unwrap();
        assert_eq!(
            listed,
            vec![ObjectInfo {
                key: k.clone(),
                size: 1
            }]
        );
        assert_eq!(storage.list(Some(&key("runs"))).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn presign_is_none_locally_and_checks_expiry() {
        let (_dir, storage) = local();
        let k = key("runs/r/x");
        assert_eq!(
            storage
                .presign(PresignMethod::Get, &k, Duration::from_secs(60))
                .await
                .unwrap(),
            None
        );
        assert!(matches!(
            storage
                .presign(PresignMethod::Put, &k, Duration::ZERO)
                .await,
            Err(StorageError::InvalidConfig { .. })
        ));
        assert!(matches!(
            storage
                .presign(
                    PresignMethod::Put,
                    &k,
                    MAX_PRESIGN_EXPIRY + Duration::from_secs(1)
                )
                .await,
            Err(StorageError::InvalidConfig { .. })
        ));
    }

    #[tokio::test]
    async fn presign_on_s3_signs_the_prefixed_path_offline() {
        // Signing is local computation: no server is contacted.
        let storage = Storage::open(&StorageConfig {
            url: "s3://bucket/pre".into(),
            endpoint: Some("http://127.0.0.1:9".into()),
            region: Some("us-east-1".into()),
            access_key_id: Some("AKID".into()),
            secret_access_key: Some("SECRET".into()),
        })
        .unwrap();
        let url = storage
            .presign(
                PresignMethod::Put,
                &key("runs/r/x"),
                Duration::from_secs(300),
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(url.path(), "/bucket/pre/runs/r/x");
        let query = url.query().unwrap_or_default();
        assert!(query.contains("X-Amz-Expires=300"), "{query}");
        assert!(query.contains("X-Amz-Signature="), "{query}");
        assert!(query.contains("AKID"), "{query}");
        assert!(!query.contains("SECRET"), "{query}");
    }
}
