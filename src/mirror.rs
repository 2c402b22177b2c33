//! Copies remote data shards into a local folder, so that every reader reads local files; and
//! a run's newest checkpoint out of its bucket ([`fetch_checkpoint`]), for `iota generate`,
//! `iota eval` and `iota export`.
//!
//! A [`DataSpec::Remote`] names either
//! - `s3://bucket/prefix`: every `.txt`, `.jsonl`, `.jsonl.gz`, `.jsonl.zst` and `.parquet`
//!   object under the prefix, read through the project's object store ([`Storage`]; the
//!   endpoint and credentials as for a run's `storage`), or one such object named whole; or
//! - `https://host/path/name.parquet` (or `http://`, for servers on a private network): one
//!   shard, through the same HTTPS client as every other request of this process (with the
//!   CA file of `--ca-file`, if any); or `https://host/prefix/` (any URL not naming a shard):
//!   a prepared directory served there (`http_prepared.rs`).
//!
//! A prefix holding [`MANIFEST_FILE`] at its top is a prepared directory (`iota data
//! prepare`'s output): its manifest and the token shards it names are copied, nothing else,
//! and the copy is checked against the manifest (sizes, counts, the stream's hash) before it
//! is read as prepared tokens (whose tokenizer the reader then checks).
//!
//! [`fetch`] copies them to `CACHE/{hash of the URL}/`, under their key relative to the
//! prefix, and returns a [`DataSpec::Path`] of that folder with the same text column. A shard
//! already there with the size the server reports is not downloaded again; a file of that
//! folder the listing no longer holds is removed, so the folder always mirrors the listing.
//! Every party that lists the same prefix gets the same files and so, through
//! [`crate::data::LocalFiles`]' path order, the same documents in the same order and the same
//! sample ids. Shards are streamed to disk in pieces ([`PIECE`] bytes), never held whole.

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::data::{DataSpec, MANIFEST_FILE, Manifest, is_data_file, verify_prepared};
use crate::storage::trust::client_builder;
use crate::storage::{ObjectKey, Storage, StorageConfig, StorageError};

mod http_prepared;

/// The name of a section's parameters in a checkpoint (`{epoch}/{section}/flat`).
const FLAT: &str = "flat";

/// Bytes asked for at a time while copying an object from a bucket.
pub const PIECE: u64 = 16 << 20;

/// Why remote shards could not be copied. Each message is one line naming the URL or file.
#[derive(Debug, Error)]
pub enum MirrorError {
    /// The URL cannot be used as it is.
    #[error("{url}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The bucket could not be opened or listed.
    #[error("listing {url}: {source}")]
    List {
        /// The URL as given.
        url: String,
        /// What the store said.
        source: Box<StorageError>,
    },
    /// A prepared directory (one holding [`MANIFEST_FILE`]) that is incomplete or fails its
    /// manifest's checks once copied.
    #[error("{url}: {reason}")]
    BadPrepared {
        /// The URL as given.
        url: String,
        /// What is wrong (one line, naming the file).
        reason: String,
    },
    /// Nothing under the prefix is a shard iota reads.
    #[error("{url}: no .txt, .jsonl, .jsonl.gz, .jsonl.zst or .parquet shard under this prefix")]
    NoShards {
        /// The URL as given.
        url: String,
    },
    /// No epoch under the prefix has every section's checkpoint.
    #[error(
        "{url}: no complete checkpoint here (every one of the model's {sections} sections' \
         EPOCH/SECTION/flat); pass the run's `runs/RUN/checkpoints` prefix"
    )]
    NoCheckpoint {
        /// The prefix as given.
        url: String,
        /// Sections the model has.
        sections: usize,
    },
    /// A shard could not be downloaded.
    #[error("downloading {url}: {reason}")]
    Download {
        /// The shard's URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The HTTP(S) request failed: no connection, a refused certificate, an error status.
    #[error("downloading {url}")]
    Http {
        /// The shard's URL.
        url: String,
        /// What the client said (its chain names the cause).
        source: reqwest::Error,
    },
    /// The local copy could not be written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The local file or folder.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
}

/// Where commands other than the orchestrator keep their copies: `$IOTA_DATA_CACHE`, else
/// `$XDG_CACHE_HOME/iota`, else `~/.cache/iota`, else `.iota-cache`. Shards go under its
/// `shards/`, checkpoints under its `checkpoints/`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("IOTA_DATA_CACHE") {
        return PathBuf::from(dir);
    }
    let home = |var| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    match (home("XDG_CACHE_HOME"), home("HOME")) {
        (Some(cache), _) => cache.join("iota"),
        (None, Some(home)) => home.join(".cache").join("iota"),
        (None, None) => PathBuf::from(".iota-cache"),
    }
}

/// Copies the shards of a remote `spec` under `cache` (see the module documentation) and
/// returns the local copy, a [`DataSpec::Path`]; of [`DataSpec::Several`], each remote part,
/// in order (a part's error names its URL); any other spec comes back as it is.
/// `run_storage`, a run's own `storage` settings, supplies the endpoint, region and keys of an
/// `s3://` URL when it is S3 itself; what it leaves unset comes from the AWS environment
/// variables.
///
/// # Errors
/// [`MirrorError`] naming the URL or file; nothing is left half-written (a download goes to a
/// `.partial` file first).
pub async fn fetch(
    spec: &DataSpec,
    cache: &Path,
    run_storage: Option<&StorageConfig>,
) -> Result<DataSpec, MirrorError> {
    let DataSpec::Several { parts } = spec else {
        return fetch_one(spec, cache, run_storage).await;
    };
    let mut local = Vec::with_capacity(parts.len());
    for part in parts {
        local.push(fetch_one(part, cache, run_storage).await?);
    }
    Ok(DataSpec::Several { parts: local })
}

/// [`fetch`] of one source (not [`DataSpec::Several`]).
async fn fetch_one(
    spec: &DataSpec,
    cache: &Path,
    run_storage: Option<&StorageConfig>,
) -> Result<DataSpec, MirrorError> {
    let DataSpec::Remote { url, text_column } = spec else {
        return Ok(spec.clone());
    };
    let dir = copy_dir(cache, url);
    let (shards, downloaded, bytes) = if url.starts_with("s3://") {
        from_bucket(url, &dir, run_storage).await?
    } else {
        from_http(url, &dir).await?
    };
    tracing::info!(%url, dir = %dir.display(), shards, downloaded, bytes, "remote data copied");
    Ok(DataSpec::Path {
        path: dir,
        text_column: text_column.clone(),
    })
}

/// [`fetch`] for a command without an async runtime of its own, into
/// [`default_cache_dir`]`/shards`, with the AWS environment variables for a bucket.
///
/// # Errors
/// As [`fetch`]; [`MirrorError::Io`] when the runtime cannot start.
pub fn fetch_to_cache(spec: &DataSpec) -> Result<DataSpec, MirrorError> {
    if !spec.is_remote() {
        return Ok(spec.clone());
    }
    let cache = default_cache_dir().join("shards");
    current_thread(&cache)?.block_on(fetch(spec, &cache, None))
}

/// The folder under `cache` that holds the copy of what `url` names.
fn copy_dir(cache: &Path, url: &str) -> PathBuf {
    cache.join(&blake3::hash(url.as_bytes()).to_hex()[..16])
}

/// Opens the bucket `url` names, with the endpoint and keys of `run_storage` where that is
/// S3 (see [`fetch`]).
fn open_bucket(url: &str, run_storage: Option<&StorageConfig>) -> Result<Storage, MirrorError> {
    let mut config = run_storage
        .filter(|storage| storage.url.starts_with("s3://"))
        .cloned()
        .unwrap_or_default();
    config.url = url.to_owned();
    Storage::open(&config).map_err(|source| MirrorError::List {
        url: url.to_owned(),
        source: Box::new(source),
    })
}

/// Copies every shard under an `s3://` URL: (shards, downloaded, bytes).
async fn from_bucket(
    url: &str,
    dir: &Path,
    run_storage: Option<&StorageConfig>,
) -> Result<(usize, usize, u64), MirrorError> {
    let listed = |source| MirrorError::List {
        url: url.to_owned(),
        source: Box::new(source),
    };
    let mut store = open_bucket(url, run_storage)?;
    let listing = store.list(None).await.map_err(listed)?;
    if listing.iter().any(|o| o.key.as_str() == MANIFEST_FILE) {
        let sizes = listing.into_iter().map(|o| (o.key, o.size)).collect();
        return prepared_from_bucket(&store, url, sizes, dir).await;
    }
    let mut objects: Vec<(ObjectKey, u64)> = listing
        .into_iter()
        .filter(|o| is_data_file(o.key.as_str().rsplit('/').next().unwrap_or_default()))
        .map(|o| (o.key, o.size))
        .collect();
    if objects.is_empty() {
        // The URL may name one object rather than a prefix.
        let trimmed = url.trim_end_matches('/');
        if let Some((parent, name)) = trimmed.rsplit_once('/')
            && is_data_file(name)
            && parent.len() > "s3://".len()
            && let Ok(key) = ObjectKey::parse(name)
        {
            let parent_store = open_bucket(parent, run_storage)?;
            match parent_store.head(&key).await {
                Ok(size) => {
                    objects.push((key, size));
                    store = parent_store;
                }
                Err(StorageError::NotFound { .. }) => {}
                Err(e) => return Err(listed(e)),
            }
        }
    }
    if objects.is_empty() {
        return Err(MirrorError::NoShards {
            url: url.to_owned(),
        });
    }
    let (downloaded, bytes) = copy_objects(&store, url, &objects, dir).await?;
    Ok((objects.len(), downloaded, bytes))
}

/// Copies the prepared directory at an `s3://` URL, whose objects are `listed` (key and size):
/// its manifest and the token shards the manifest names, nothing else; then checks the copy
/// ([`verify_prepared`]: sizes, counts and the stream's hash) when anything was downloaded.
/// A copy that fails the check loses its manifest, so the next fetch downloads and checks it
/// again. (shards, downloaded, bytes).
async fn prepared_from_bucket(
    store: &Storage,
    url: &str,
    listed: Vec<(ObjectKey, u64)>,
    dir: &Path,
) -> Result<(usize, usize, u64), MirrorError> {
    let bad = |reason: String| MirrorError::BadPrepared {
        url: url.to_owned(),
        reason,
    };
    let sizes: std::collections::HashMap<String, (ObjectKey, u64)> = listed
        .into_iter()
        .map(|(key, size)| (key.as_str().to_owned(), (key, size)))
        .collect();
    let manifest_object = sizes
        .get(MANIFEST_FILE)
        .cloned()
        .ok_or_else(|| bad(format!("no {MANIFEST_FILE} under this prefix")))?;
    let text = store
        .get(&manifest_object.0)
        .await
        .map_err(|e| bad(format!("reading {MANIFEST_FILE}: {e}")))?;
    let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| {
        bad(format!(
            "{MANIFEST_FILE} is not a prepared-token manifest: {e}"
        ))
    })?;
    let mut objects = vec![manifest_object];
    for shard in &manifest.shards {
        let object = sizes.get(&shard.file).ok_or_else(|| {
            bad(format!(
                "{MANIFEST_FILE} names token shard {}, which is not under this prefix",
                shard.file
            ))
        })?;
        objects.push(object.clone());
    }
    let (downloaded, bytes) = copy_objects(store, url, &objects, dir).await?;
    if downloaded > 0
        && let Err(e) = verify_prepared(dir)
    {
        let _ = std::fs::remove_file(dir.join(MANIFEST_FILE));
        return Err(bad(e.to_string()));
    }
    Ok((manifest.shards.len(), downloaded, bytes))
}

/// Copies `objects` (key and size) of `store`, whose URL is `url`, to `dir` under their keys,
/// skipping those already there with the same size and removing every other file of `dir`:
/// (downloaded, bytes).
async fn copy_objects(
    store: &Storage,
    url: &str,
    objects: &[(ObjectKey, u64)],
    dir: &Path,
) -> Result<(usize, u64), MirrorError> {
    let wanted: Vec<PathBuf> = objects
        .iter()
        .map(|(key, _)| dir.join(key.as_str()))
        .collect();
    remove_unlisted(dir, &wanted)?;
    let (mut downloaded, mut bytes) = (0, 0);
    for ((key, size), path) in objects.iter().zip(&wanted) {
        if local_size(path) == Some(*size) {
            continue;
        }
        let object_url = format!("{}/{}", url.trim_end_matches('/'), key.as_str());
        let partial = partial_of(path)?;
        let mut file = create(&partial)?;
        let mut at = 0;
        while at < *size {
            let end = (at + PIECE).min(*size);
            let piece = store
                .get_range(key, at..end)
                .await
                .map_err(|e| MirrorError::Download {
                    url: object_url.clone(),
                    reason: e.to_string(),
                })?;
            write(&mut file, &partial, &piece)?;
            at = end;
        }
        finish(file, &partial, path)?;
        downloaded += 1;
        bytes += size;
        tracing::info!(object = %object_url, size, "downloaded");
    }
    Ok((downloaded, bytes))
}

/// Copies the newest complete epoch of a run's section checkpoints from `url` (the run's
/// `checkpoints` prefix, `s3://bucket/.../runs/RUN/checkpoints`; endpoint and keys as for
/// [`fetch`]) into `cache`, as `{epoch}/{section}/flat` for each of the model's `sections`,
/// and returns the folder they are in. Complete: every section's `flat` of that epoch is there (a merge
/// writes them one by one). Older epochs are not copied, and removed from an earlier copy.
///
/// # Errors
/// [`MirrorError::List`] when the bucket cannot be opened or listed,
/// [`MirrorError::NoCheckpoint`] when no epoch is complete, otherwise as [`fetch`].
pub async fn fetch_checkpoint(
    url: &str,
    run_storage: Option<&StorageConfig>,
    sections: usize,
    cache: &Path,
) -> Result<PathBuf, MirrorError> {
    let url = url.trim_end_matches('/').to_owned();
    let listed = |source| MirrorError::List {
        url: url.clone(),
        source: Box::new(source),
    };
    let store = open_bucket(&url, run_storage)?;
    let mut by_epoch: std::collections::BTreeMap<u64, Vec<Option<(ObjectKey, u64)>>> =
        std::collections::BTreeMap::new();
    for object in store.list(None).await.map_err(listed)? {
        let parts: Vec<&str> = object.key.as_str().split('/').collect();
        let [epoch, section, FLAT] = parts[..] else {
            continue;
        };
        let (Ok(epoch), Ok(section)) = (epoch.parse::<u64>(), section.parse::<usize>()) else {
            continue;
        };
        if section < sections {
            by_epoch
                .entry(epoch)
                .or_insert_with(|| vec![None; sections])[section] = Some((object.key, object.size));
        }
    }
    let Some((epoch, objects)) = by_epoch
        .into_iter()
        .rev()
        .find_map(|(epoch, found)| Some((epoch, found.into_iter().collect::<Option<Vec<_>>>()?)))
    else {
        return Err(MirrorError::NoCheckpoint { url, sections });
    };
    let dir = copy_dir(cache, &url);
    let (downloaded, bytes) = copy_objects(&store, &url, &objects, &dir).await?;
    tracing::info!(%url, epoch, dir = %dir.display(), downloaded, bytes, "checkpoint copied");
    Ok(dir)
}

/// [`fetch_checkpoint`] for a command without an async runtime of its own, into
/// [`default_cache_dir`]`/checkpoints`.
///
/// # Errors
/// As [`fetch_checkpoint`]; [`MirrorError::Io`] when the runtime cannot start.
pub fn fetch_checkpoint_to_cache(
    url: &str,
    run_storage: Option<&StorageConfig>,
    sections: usize,
) -> Result<PathBuf, MirrorError> {
    let cache = default_cache_dir().join("checkpoints");
    current_thread(&cache)?.block_on(fetch_checkpoint(url, run_storage, sections, &cache))
}

/// A runtime for the blocking entry points.
fn current_thread(cache: &Path) -> Result<tokio::runtime::Runtime, MirrorError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| MirrorError::Io {
            path: cache.to_path_buf(),
            source,
        })
}

/// Copies what an `http(s)://` URL names: the one shard whose name ends it, or else the
/// prepared directory there (`http_prepared.rs`). (shards, downloaded, bytes).
async fn from_http(url: &str, dir: &Path) -> Result<(usize, usize, u64), MirrorError> {
    let parsed = url::Url::parse(url).map_err(|e| MirrorError::BadUrl {
        url: url.to_owned(),
        reason: e.to_string(),
    })?;
    let http = |source| MirrorError::Http {
        url: url.to_owned(),
        source,
    };
    let client = client_builder().build().map_err(http)?;
    let name = parsed
        .path_segments()
        .and_then(|mut s| s.next_back())
        .filter(|name| is_data_file(name))
        .map(str::to_owned);
    let Some(name) = name else {
        let base = http_prepared::directory_of(&parsed);
        return http_prepared::copy(&client, url, &base, dir).await;
    };
    let path = dir.join(&name);
    remove_unlisted(dir, std::slice::from_ref(&path))?;
    let response = client
        .get(parsed)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(http)?;
    let size = response.content_length();
    if size.is_some() && local_size(&path) == size {
        return Ok((1, 0, 0));
    }
    let bytes = save_body(response, url, &path).await?;
    Ok((1, 1, bytes))
}

/// Downloads `url` to `path` (through a `.partial` file): the bytes written.
///
/// # Errors
/// [`MirrorError::Http`] for a failed request or an error status, else as [`save_body`].
async fn download(
    client: &reqwest::Client,
    url: &url::Url,
    path: &Path,
) -> Result<u64, MirrorError> {
    let response = client
        .get(url.clone())
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|source| MirrorError::Http {
            url: url.to_string(),
            source,
        })?;
    save_body(response, url.as_str(), path).await
}

/// Streams the body of `response` (from `url`) to `path`: written to a `.partial` file, flushed
/// and renamed into place. The bytes written.
///
/// # Errors
/// [`MirrorError::Http`] when the body breaks off, [`MirrorError::Download`] when it is not
/// the length the server announced, [`MirrorError::Io`] when the file cannot be written.
async fn save_body(
    mut response: reqwest::Response,
    url: &str,
    path: &Path,
) -> Result<u64, MirrorError> {
    let partial = partial_of(path)?;
    let mut file = create(&partial)?;
    let size = response.content_length();
    let mut bytes = 0u64;
    while let Some(chunk) = response.chunk().await.map_err(|source| MirrorError::Http {
        url: url.to_owned(),
        source,
    })? {
        write(&mut file, &partial, &chunk)?;
        bytes += chunk.len() as u64;
    }
    if let Some(size) = size
        && size != bytes
    {
        return Err(MirrorError::Download {
            url: url.to_owned(),
            reason: format!("the server announced {size} bytes and sent {bytes}"),
        });
    }
    finish(file, &partial, path)?;
    tracing::info!(%url, size = bytes, "downloaded");
    Ok(bytes)
}

/// Writes `bytes` to `path` through a `.partial` file, flushed and renamed into place.
fn save(path: &Path, bytes: &[u8]) -> Result<(), MirrorError> {
    let partial = partial_of(path)?;
    let mut file = create(&partial)?;
    write(&mut file, &partial, bytes)?;
    finish(file, &partial, path)
}

/// The size of the file at `path`, if it is one.
fn local_size(path: &Path) -> Option<u64> {
    std::fs::metadata(path)
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.len())
}

/// `path` with `.partial` appended, its folder created.
fn partial_of(path: &Path) -> Result<PathBuf, MirrorError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| MirrorError::Io {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    Ok(PathBuf::from(name))
}

fn create(path: &Path) -> Result<std::fs::File, MirrorError> {
    std::fs::File::create(path).map_err(|source| MirrorError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn write(file: &mut std::fs::File, path: &Path, bytes: &[u8]) -> Result<(), MirrorError> {
    use std::io::Write;
    file.write_all(bytes).map_err(|source| MirrorError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Flushes the `.partial` file to disk and renames it into place.
fn finish(file: std::fs::File, partial: &Path, path: &Path) -> Result<(), MirrorError> {
    let io = |source| MirrorError::Io {
        path: partial.to_path_buf(),
        source,
    };
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(partial, path).map_err(io)
}

/// Removes every file under `dir` that is not in `wanted` (shards no longer listed, and
/// `.partial` files of interrupted downloads), so the folder holds exactly the listing.
fn remove_unlisted(dir: &Path, wanted: &[PathBuf]) -> Result<(), MirrorError> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        let entries = match std::fs::read_dir(&folder) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(MirrorError::Io {
                    path: folder,
                    source,
                });
            }
        };
        for entry in entries {
            let entry = entry.map_err(|source| MirrorError::Io {
                path: folder.clone(),
                source,
            })?;
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if !wanted.contains(&path) {
                std::fs::remove_file(&path).map_err(|source| MirrorError::Io {
                    path: path.clone(),
                    source,
                })?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_specs_come_back_as_they_are() {
        let cache = tempfile::tempdir().unwrap();
        let runtime = current_thread(cache.path()).unwrap();
        for spec in [DataSpec::default(), DataSpec::path("some/folder")] {
            let fetched = runtime.block_on(fetch(&spec, cache.path(), None)).unwrap();
            assert_eq!(fetched, spec);
            // Nothing was downloaded.
            assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 0);
        }
    }

    #[test]
    fn an_http_url_that_does_not_parse_is_refused_by_name() {
        let cache = tempfile::tempdir().unwrap();
        let spec: DataSpec = "https://exa mple/shards/".parse().unwrap();
        let err = current_thread(cache.path())
            .unwrap()
            .block_on(fetch(&spec, cache.path(), None))
            .unwrap_err();
        assert!(matches!(err, MirrorError::BadUrl { .. }), "{err}");
        assert!(err.to_string().contains("exa mple"), "{err}");
    }

    #[test]
    fn files_the_listing_no_longer_holds_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let keep = dir.path().join("a/keep.jsonl");
        let stale = dir.path().join("a/old.parquet");
        let partial = dir.path().join("b.txt.partial");
        for path in [&keep, &stale, &partial] {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"x").unwrap();
        }
        remove_unlisted(dir.path(), std::slice::from_ref(&keep)).unwrap();
        assert!(keep.exists());
        assert!(!stale.exists() && !partial.exists());
        // A folder that does not exist yet holds nothing to remove.
        remove_unlisted(&dir.path().join("none"), &[]).unwrap();
    }
}
