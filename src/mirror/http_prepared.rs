//! A prepared token directory (`iota data prepare`'s output) served over HTTP(S): the URL names
//! the directory (`https://host/prefix/`) or its manifest (`.../iota-tokens.json`).
//!
//! A web server cannot list a folder, so the manifest is the listing: it is read first, then
//! the token shards it names are copied beside it (a shard already copied at the size its
//! token count gives is not downloaded again), and the manifest is written last. When anything
//! changed, the copy is checked against the manifest ([`verify_prepared`]: every shard's size,
//! the token count and the stream's BLAKE3 hash) before it is read; until then it has no
//! manifest, and a copy that fails the check is removed whole, so the next run downloads it
//! again.

use std::path::{Component, Path};

use super::{MirrorError, download, local_size, remove_unlisted, save};
use crate::data::{MANIFEST_FILE, Manifest, verify_prepared};

/// Most bytes of a manifest read (a manifest lists one line per shard: far less).
const MANIFEST_LIMIT: usize = 64 << 20;

/// Copies the prepared directory at `base` (the directory's URL, its path ending in `/`) into
/// `dir`; `url` is the URL as given, for messages. (shards, downloaded, bytes).
///
/// # Errors
/// [`MirrorError::Http`] when the manifest cannot be fetched (a 404: no prepared directory
/// there), [`MirrorError::BadPrepared`] for a manifest that does not parse, names a file
/// outside the directory or fails its check once copied, and the errors of a download.
pub(super) async fn copy(
    client: &reqwest::Client,
    url: &str,
    base: &url::Url,
    dir: &Path,
) -> Result<(usize, usize, u64), MirrorError> {
    let bad = |reason: String| MirrorError::BadPrepared {
        url: url.to_owned(),
        reason,
    };
    let manifest_url = child(base, MANIFEST_FILE);
    let text = manifest_bytes(client, url, &manifest_url).await?;
    let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| {
        bad(format!(
            "{MANIFEST_FILE} is not a prepared-token manifest: {e}"
        ))
    })?;
    let mut wanted = vec![dir.join(MANIFEST_FILE)];
    for shard in &manifest.shards {
        if !is_plain_relative(&shard.file) {
            return Err(bad(format!(
                "{MANIFEST_FILE} names token shard {:?}, which is not a path inside the directory",
                shard.file
            )));
        }
        wanted.push(dir.join(&shard.file));
    }
    remove_unlisted(dir, &wanted)?;
    let manifest_path = &wanted[0];
    let width = manifest.dtype.bytes() as u64;
    let missing: Vec<usize> = (0..manifest.shards.len())
        .filter(|&i| local_size(&wanted[i + 1]) != Some(manifest.shards[i].tokens * width))
        .collect();
    let same_manifest = std::fs::read(manifest_path).ok().as_deref() == Some(&text[..]);
    if same_manifest && missing.is_empty() {
        return Ok((manifest.shards.len(), 0, 0));
    }
    // Until the copy is whole and checked, it has no manifest (so it is never read as one).
    let _ = std::fs::remove_file(manifest_path);
    let mut bytes = 0;
    for &i in &missing {
        let shard_url = child(base, &manifest.shards[i].file);
        bytes += download(client, &shard_url, &wanted[i + 1]).await?;
    }
    save(manifest_path, &text)?;
    if let Err(e) = verify_prepared(dir) {
        for path in &wanted {
            let _ = std::fs::remove_file(path);
        }
        return Err(bad(e.to_string()));
    }
    Ok((manifest.shards.len(), missing.len(), bytes))
}

/// The URL of the directory a prepared-directory URL names: `url` itself with its path ending
/// in `/`, or the folder of a URL naming the manifest.
pub(super) fn directory_of(url: &url::Url) -> url::Url {
    let mut base = url.clone();
    if let Ok(mut segments) = base.path_segments_mut() {
        segments.pop_if_empty();
    }
    let names_manifest = base
        .path_segments()
        .and_then(|mut s| s.next_back())
        .is_some_and(|last| last == MANIFEST_FILE);
    if let Ok(mut segments) = base.path_segments_mut() {
        if names_manifest {
            segments.pop();
        }
        segments.push("");
    }
    base
}

/// `name` (a relative path of `/`-separated parts) under the directory URL `base`, each part
/// percent-encoded as a path segment.
fn child(base: &url::Url, name: &str) -> url::Url {
    let mut url = base.clone();
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.pop_if_empty().extend(name.split('/'));
    }
    url
}

/// Whether `name` is a relative path of plain names only (no `..`, no root, no `.`), so a
/// manifest cannot make a shard land outside the copy's folder.
fn is_plain_relative(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('\\')
        && Path::new(name)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
        && Path::new(name).components().count() == name.split('/').count()
}

/// The manifest's bytes at `url`, at most [`MANIFEST_LIMIT`]; `given` is the URL as given.
///
/// # Errors
/// [`MirrorError::BadUrl`] naming `given` when there is no manifest (404): the URL names
/// neither a shard nor a prepared directory; [`MirrorError::Http`] for other failures.
async fn manifest_bytes(
    client: &reqwest::Client,
    given: &str,
    url: &url::Url,
) -> Result<Vec<u8>, MirrorError> {
    let http = |source| MirrorError::Http {
        url: url.to_string(),
        source,
    };
    let response = client.get(url.clone()).send().await.map_err(http)?;
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        return Err(MirrorError::BadUrl {
            url: given.to_owned(),
            reason: format!(
                "names neither a .txt, .jsonl, .jsonl.gz, .jsonl.zst or .parquet file nor a \
                 prepared directory ({url}: 404 Not Found)"
            ),
        });
    }
    let mut response = response.error_for_status().map_err(http)?;
    let mut text = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(http)? {
        text.extend_from_slice(&chunk);
        if text.len() > MANIFEST_LIMIT {
            return Err(MirrorError::Download {
                url: url.to_string(),
                reason: format!("larger than {MANIFEST_LIMIT} bytes, not a manifest"),
            });
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_urls_and_shard_names() {
        let dir = |s: &str| directory_of(&url::Url::parse(s).unwrap()).to_string();
        assert_eq!(dir("https://h/p/tokens"), "https://h/p/tokens/");
        assert_eq!(dir("https://h/p/tokens/"), "https://h/p/tokens/");
        assert_eq!(
            dir(&format!("https://h/p/tokens/{MANIFEST_FILE}")),
            "https://h/p/tokens/"
        );
        assert_eq!(dir("https://h"), "https://h/");
        let base = url::Url::parse("https://h/p/").unwrap();
        assert_eq!(child(&base, "00001.bin").as_str(), "https://h/p/00001.bin");
        assert_eq!(
            child(&base, "a/b c.bin").as_str(),
            "https://h/p/a/b%20c.bin"
        );
        assert_eq!(child(&base, "http:x").as_str(), "https://h/p/http:x");
        for good in ["00000.bin", "sub/00001.bin"] {
            assert!(is_plain_relative(good), "{good}");
        }
        for bad in ["", "../x.bin", "/etc/x", "a/../b", "./a", "a//b", "a\\b"] {
            assert!(!is_plain_relative(bad), "{bad}");
        }
    }
}
