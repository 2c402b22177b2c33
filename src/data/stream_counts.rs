//! The token counts of a streamed source's blocks, saved in a small file so that a restarted
//! reader (the orchestrator) finds sample `n` without tokenizing every block before it again.
//!
//! # Format
//! One JSON object, written to a `.tmp` file, flushed to disk and renamed into place:
//! ```text
//! {"format": "iota-stream-counts-v1",
//!  "tokenizer": "<fingerprint>", "text_column": "text", "block_shards": 4,
//!  "listing": "<BLAKE3 of every file's name, size and modification time>",
//!  "block0": "<BLAKE3 of block 0's tokens>",
//!  "counts": [12345, null, ...],          // tokens of each block, null until counted
//!  "check": "<BLAKE3 of everything above>"}
//! ```
//! A block's token count depends on its files, the tokenizer, the text column and
//! `block_shards` (not on `seq_len` or the seed, which only cut and order the windows), so
//! those are what a file must match ([`CountsKey`]). A file that does not parse, fails its
//! check, or was written for another source is ignored with its reason, and the blocks are
//! counted again: never read as counts of this source.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use super::source::LocalFiles;
use super::stream_hash::hash_tokens;
use super::{DataError, Tokenizer};

/// The `format` of a count file.
const FORMAT: &str = "iota-stream-counts-v1";

/// What the saved counts of a streamed source came to, when a reader asked for them
/// ([`crate::data::Dataset::keep_stream_counts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SavedCounts {
    /// The dataset is not streamed (its whole stream is known): nothing is saved.
    NotStreamed,
    /// No count file yet: the blocks are counted as they are read, and saved.
    Missing,
    /// The file's counts were taken: `known` blocks of `blocks` need no tokenizing to be
    /// located.
    Loaded {
        /// Blocks whose count the file held.
        known: usize,
        /// Blocks of the source.
        blocks: usize,
    },
    /// The file was not used; the blocks are counted again (and the file rewritten).
    Ignored {
        /// Why, in one line.
        reason: String,
    },
}

/// What a source's block counts depend on: a count file is used only when it was written
/// for the same key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CountsKey {
    /// The tokenizer's fingerprint.
    tokenizer: String,
    /// The `.jsonl` field / `.parquet` column read.
    text_column: String,
    /// Files per block.
    block_shards: usize,
    /// BLAKE3 of the listing: each file's name, size and modification time.
    listing: String,
    /// BLAKE3 of block 0's tokens.
    block0: String,
    /// Blocks of the source.
    blocks: usize,
}

impl CountsKey {
    /// The key of `source` cut in blocks of `block_shards` files, tokenized by `tokenizer`,
    /// whose block 0 holds `block0`.
    ///
    /// # Errors
    /// [`DataError::Unreadable`] for a file whose metadata cannot be read.
    pub(crate) fn of(
        source: &LocalFiles,
        tokenizer: &Tokenizer,
        block_shards: usize,
        block0: &[u32],
    ) -> Result<Self, DataError> {
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"iota.stream.listing.v1");
        for path in source.files() {
            let metadata = std::fs::metadata(path).map_err(|error| DataError::io(path, error))?;
            // A file system without modification times gives 0: the names and sizes remain.
            let modified = metadata
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            hasher.update(source.name_of(path).as_bytes());
            hasher.update(&[0]);
            hasher.update(&metadata.len().to_le_bytes());
            hasher.update(&modified.to_le_bytes());
        }
        let block_shards = block_shards.max(1);
        Ok(Self {
            tokenizer: tokenizer.fingerprint(),
            text_column: source.text_column().to_owned(),
            block_shards,
            listing: hasher.finalize().to_hex().to_string(),
            block0: hash_tokens(block0),
            blocks: source.files().len().div_ceil(block_shards),
        })
    }
}

/// A count file as stored.
#[derive(serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct CountFile {
    /// [`FORMAT`].
    format: String,
    /// As [`CountsKey`].
    tokenizer: String,
    /// As [`CountsKey`].
    text_column: String,
    /// As [`CountsKey`].
    block_shards: usize,
    /// As [`CountsKey`].
    listing: String,
    /// As [`CountsKey`].
    block0: String,
    /// Tokens of each block, `None` until counted.
    counts: Vec<Option<u64>>,
    /// BLAKE3 of the fields above ([`CountFile::checksum`]).
    check: String,
}

impl CountFile {
    /// The file for `key` holding `counts`.
    fn new(key: &CountsKey, counts: &[Option<u64>]) -> Self {
        let mut file = Self {
            format: FORMAT.to_owned(),
            tokenizer: key.tokenizer.clone(),
            text_column: key.text_column.clone(),
            block_shards: key.block_shards,
            listing: key.listing.clone(),
            block0: key.block0.clone(),
            counts: counts.to_vec(),
            check: String::new(),
        };
        file.check = file.checksum();
        file
    }

    /// BLAKE3 over every field but `check`, each length-prefixed.
    fn checksum(&self) -> String {
        let mut hasher = blake3::Hasher::new();
        let fields = [
            &self.format,
            &self.tokenizer,
            &self.text_column,
            &self.listing,
            &self.block0,
        ];
        for field in fields {
            hasher.update(&(field.len() as u64).to_le_bytes());
            hasher.update(field.as_bytes());
        }
        hasher.update(&(self.block_shards as u64).to_le_bytes());
        for count in &self.counts {
            hasher.update(&count.map_or(u64::MAX, |c| c).to_le_bytes());
        }
        hasher.finalize().to_hex().to_string()
    }

    /// Why this file's counts are not `key`'s, if they are not.
    fn mismatch(&self, key: &CountsKey) -> Option<String> {
        if self.format != FORMAT {
            return Some(format!("format {:?}, expected {FORMAT:?}", self.format));
        }
        if self.check != self.checksum() {
            return Some("its checksum does not match its content (damaged or edited)".into());
        }
        if self.tokenizer != key.tokenizer {
            return Some(format!(
                "written for tokenizer {}, this source is read with {}",
                self.tokenizer, key.tokenizer
            ));
        }
        if self.text_column != key.text_column {
            return Some(format!(
                "written for text column {:?}, this source reads {:?}",
                self.text_column, key.text_column
            ));
        }
        if self.block_shards != key.block_shards {
            return Some(format!(
                "written for blocks of {} files, this source's blocks have {}",
                self.block_shards, key.block_shards
            ));
        }
        if self.listing != key.listing {
            return Some(
                "written for other files (names, sizes or modification times differ)".into(),
            );
        }
        if self.block0 != key.block0 {
            return Some("written for other tokens in block 0".into());
        }
        if self.counts.len() != key.blocks {
            return Some(format!(
                "holds {} blocks, this source has {}",
                self.counts.len(),
                key.blocks
            ));
        }
        None
    }
}

/// Reads the counts saved at `path` for `key`: `Ok(None)` when there is no file,
/// `Err(reason)` (one line) when there is one that is not `key`'s.
pub(crate) fn read(path: &Path, key: &CountsKey) -> Result<Option<Vec<Option<u64>>>, String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let file: CountFile = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not a count file: {e}", path.display()))?;
    match file.mismatch(key) {
        Some(reason) => Err(format!("{}: {reason}", path.display())),
        None => Ok(Some(file.counts)),
    }
}

/// Writes `counts` for `key` to `path` atomically: a `.tmp` file beside it, flushed to disk,
/// then renamed over it (a reader sees the old file or the new one, never a part).
///
/// # Errors
/// The I/O error, with the file it concerns.
pub(crate) fn write(path: &Path, key: &CountsKey, counts: &[Option<u64>]) -> Result<(), String> {
    use std::io::Write;
    let bytes = serde_json::to_vec(&CountFile::new(key, counts))
        .map_err(|e| format!("encoding {}: {e}", path.display()))?;
    let tmp = tmp_of(path);
    let mut file = std::fs::File::create(&tmp).map_err(at(&tmp))?;
    file.write_all(&bytes).map_err(at(&tmp))?;
    file.sync_all().map_err(at(&tmp))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(at(path))
}

/// Turns an I/O error on `path` into one line naming it.
fn at(path: &Path) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{}: {e}", path.display())
}

/// `path` with `.tmp` appended.
fn tmp_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(dir: &Path, block_shards: usize) -> CountsKey {
        let source = LocalFiles::open(dir).unwrap();
        CountsKey::of(&source, &Tokenizer::byte(), block_shards, &[1, 2, 3]).unwrap()
    }

    #[test]
    fn counts_round_trip_and_other_keys_or_damage_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a.txt", "b.txt", "c.txt"] {
            std::fs::write(dir.path().join(name), name).unwrap();
        }
        let file = tempfile::tempdir().unwrap();
        let path = file.path().join("counts.json");
        let k1 = key(dir.path(), 1);
        assert_eq!(read(&path, &k1), Ok(None));
        let counts = [Some(10), None, Some(7)];
        write(&path, &k1, &counts).unwrap();
        assert_eq!(read(&path, &k1), Ok(Some(counts.to_vec())));
        assert!(!tmp_of(&path).exists());

        let refused = |key: &CountsKey, needle: &str| {
            let reason = read(&path, key).unwrap_err();
            assert!(
                reason.contains(needle) && !reason.contains('\n'),
                "{reason}"
            );
        };
        refused(&key(dir.path(), 2), "blocks of 1 files");
        let mut other = k1.clone();
        other.block0 = hash_tokens(&[1, 2]);
        refused(&other, "block 0");
        // A file rewritten at the same size is another listing (its modification time).
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(dir.path().join("b.txt"), "B.txt").unwrap();
        refused(&key(dir.path(), 1), "other files");

        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("[10,", "[11,")).unwrap();
        refused(&k1, "checksum");
        std::fs::write(&path, &text[..text.len() / 2]).unwrap();
        refused(&k1, "not a count file");
    }
}
