//! Prepared token shards: the on-disk layout `iota data prepare` writes, and the reader that
//! serves token ranges from it without tokenizing anything.
//!
//! # Layout
//! A prepared directory holds [`MANIFEST_FILE`] (JSON, [`Manifest`]) and one token shard per
//! source file, `00000.bin`, `00001.bin`, ...: a flat array of little-endian `u16` ids when the
//! tokenizer's vocabulary fits (at most 65,536 ids), else `u32`, with no header (the layout
//! nanoGPT-style loaders read with `numpy.memmap`). A shard holds the documents of its source
//! file, in order, with the tokenizer's end-of-text id between consecutive documents.
//!
//! # The stream
//! The packed stream is the shards in manifest order with one end-of-text id between
//! consecutive non-empty shards (none when the tokenizer has no such id). That is exactly
//! the stream [`crate::data::pack_documents`] makes from the raw files, so windows, held-out
//! split and sample ids are the same either way. The manifest's `stream_hash` is the stream's
//! content hash, the one [`crate::data::Dataset`] fingerprints a raw source by.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::stream_hash::StreamHasher;
use super::{DataError, Tokenizer};

/// Tokens read at a time when a prepared stream is hashed.
const READ_TOKENS: usize = 1 << 20;

/// The manifest's file name inside a prepared directory.
pub const MANIFEST_FILE: &str = "iota-tokens.json";

/// The manifest's `format` value this version writes and reads.
pub const FORMAT: &str = "iota-tokens-v1";

/// Width of the ids in the token shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtype {
    /// Little-endian `u16`: vocabularies of at most 65,536 ids.
    U16,
    /// Little-endian `u32`.
    U32,
}

impl TokenDtype {
    /// The narrowest width that holds every id of a `vocab_size` vocabulary.
    pub fn for_vocab(vocab_size: usize) -> Self {
        if vocab_size <= 1 << 16 {
            Self::U16
        } else {
            Self::U32
        }
    }

    /// Bytes per token.
    pub fn bytes(self) -> usize {
        match self {
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }

    /// Appends `ids` to `out` in this width, little-endian. Ids must fit (the vocabulary
    /// chose the width).
    pub(crate) fn extend_bytes(self, ids: &[u32], out: &mut Vec<u8>) {
        match self {
            Self::U16 => out.extend(ids.iter().flat_map(|&t| (t as u16).to_le_bytes())),
            Self::U32 => out.extend(ids.iter().flat_map(|&t| t.to_le_bytes())),
        }
    }

    /// Appends the ids stored in `bytes` (whole tokens of this width) to `out`.
    pub(crate) fn extend_ids(self, bytes: &[u8], out: &mut Vec<u32>) {
        match self {
            Self::U16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]]))),
            ),
            Self::U32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
        }
    }
}

/// One token shard of a prepared directory.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardEntry {
    /// The token file, relative to the directory.
    pub file: String,
    /// The source file it was tokenized from, relative to the source root.
    pub source: String,
    /// Tokens in the file (its length in bytes over the dtype's width).
    pub tokens: u64,
    /// Documents (non-empty after tokenizing) in the file.
    pub documents: u64,
}

/// What a prepared directory holds: the tokenizer, the width and the shards.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// Fingerprint of the tokenizer ([`Tokenizer::fingerprint`]).
    pub tokenizer: String,
    /// Its vocabulary size.
    pub vocab_size: usize,
    /// Its end-of-text id, the separator between documents and between non-empty shards.
    pub end_of_text: Option<u32>,
    /// Width of the ids.
    pub dtype: TokenDtype,
    /// The source as described when it was read, for logs.
    pub source: String,
    /// The `.jsonl` field / `.parquet` column the text came from.
    pub text_column: String,
    /// Tokens of the packed stream, separators between shards included.
    pub tokens: u64,
    /// Documents in all shards.
    pub documents: u64,
    /// Content hash of the packed stream (BLAKE3 of its tokens as little-endian `u32`).
    pub stream_hash: String,
    /// The shards, in stream order.
    pub shards: Vec<ShardEntry>,
}

impl Manifest {
    /// Reads and checks the manifest of the prepared directory `dir`.
    ///
    /// # Errors
    /// [`DataError::NotFound`] / [`DataError::Unreadable`] for the file,
    /// [`DataError::BadPrepared`] when it does not parse, is of another format, or its counts
    /// do not add up.
    pub fn read(dir: &Path) -> Result<Self, DataError> {
        let path = dir.join(MANIFEST_FILE);
        let bad = |reason: String| DataError::BadPrepared {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read(&path).map_err(|error| DataError::io(&path, error))?;
        let manifest: Self = serde_json::from_slice(&text)
            .map_err(|e| bad(format!("not a prepared-token manifest: {e}")))?;
        if manifest.format != FORMAT {
            return Err(bad(format!(
                "format {:?}, but this iota reads {FORMAT:?}",
                manifest.format
            )));
        }
        let separators = manifest.shards.iter().filter(|s| s.tokens > 0).count() as u64;
        let separators = if manifest.end_of_text.is_some() {
            separators.saturating_sub(1)
        } else {
            0
        };
        let sum: u64 = manifest.shards.iter().map(|s| s.tokens).sum();
        if sum + separators != manifest.tokens {
            return Err(bad(format!(
                "the shards hold {sum} tokens and {separators} separators, but the manifest \
                 says {} in all",
                manifest.tokens
            )));
        }
        Ok(manifest)
    }

    /// Writes the manifest to `dir`.
    ///
    /// # Errors
    /// [`DataError::Unwritable`].
    pub fn write(&self, dir: &Path) -> Result<(), DataError> {
        let path = dir.join(MANIFEST_FILE);
        let json = serde_json::to_vec_pretty(self).map_err(|e| DataError::Unwritable {
            path: path.clone(),
            error: std::io::Error::other(e),
        })?;
        std::fs::write(&path, json).map_err(|error| DataError::Unwritable { path, error })
    }
}

/// Checks a prepared directory against its manifest without a tokenizer: the manifest's
/// counts, every shard's size, and the content hash of the stream (every token is read once).
/// For a copy that came over a network (`crate::mirror`), before it is used.
///
/// # Errors
/// As [`Manifest::read`]; [`DataError::BadPrepared`] naming a missing or wrongly sized shard,
/// or the manifest when the tokens do not hash to its `stream_hash`.
pub fn verify_prepared(dir: &Path) -> Result<Manifest, DataError> {
    let manifest = Manifest::read(dir)?;
    for shard in &manifest.shards {
        open_shard(&dir.join(&shard.file), shard, manifest.dtype)?;
    }
    let (tokens, hash) = hash_stream(dir, &manifest.shards, manifest.dtype, manifest.end_of_text)?;
    if tokens != manifest.tokens || hash != manifest.stream_hash {
        return Err(DataError::BadPrepared {
            path: dir.join(MANIFEST_FILE),
            reason: format!(
                "the shards hold {tokens} tokens hashing to {hash}, but the manifest says {} \
                 hashing to {}: a shard was changed or damaged; prepare the data again",
                manifest.tokens, manifest.stream_hash
            ),
        });
    }
    Ok(manifest)
}

/// Opens token shard `shard` at `path` and checks that its size is the manifest's count.
fn open_shard(path: &Path, shard: &ShardEntry, dtype: TokenDtype) -> Result<File, DataError> {
    let file = File::open(path).map_err(|error| DataError::io(path, error))?;
    let len = file
        .metadata()
        .map_err(|error| DataError::io(path, error))?
        .len();
    let width = dtype.bytes() as u64;
    if len != shard.tokens * width {
        return Err(DataError::BadPrepared {
            path: path.to_path_buf(),
            reason: format!(
                "holds {len} bytes but the manifest says {} {dtype:?} tokens ({} bytes): \
                 truncated or overwritten; prepare the data again",
                shard.tokens,
                shard.tokens * width
            ),
        });
    }
    Ok(file)
}

/// Whether `path` is a prepared directory (holds [`MANIFEST_FILE`]).
pub fn is_prepared(path: &Path) -> bool {
    path.join(MANIFEST_FILE).is_file()
}

/// A piece of the packed stream: a separator or a mapped shard.
enum Piece {
    /// One end-of-text id between two non-empty shards.
    Separator(u32),
    /// A shard's tokens.
    Shard(Mmap),
}

/// The packed token stream of a prepared directory, read in place (memory-mapped).
pub struct PreparedTokens {
    /// The directory.
    dir: PathBuf,
    /// Its manifest.
    manifest: Manifest,
    /// The stream's pieces, in order.
    pieces: Vec<Piece>,
    /// Stream offset of each piece's first token; one more entry for the end.
    starts: Vec<u64>,
}

impl PreparedTokens {
    /// Opens the prepared directory `dir` for a run that uses `tokenizer`: reads the manifest,
    /// checks the tokenizer and every shard's size, and maps the shards.
    ///
    /// # Errors
    /// As [`Manifest::read`]; [`DataError::PreparedTokenizerMismatch`] for another tokenizer;
    /// [`DataError::BadPrepared`] naming a shard that is missing or whose size is not the
    /// manifest's token count (a truncated or overwritten file).
    pub fn open(dir: &Path, tokenizer: &Tokenizer) -> Result<Self, DataError> {
        if !dir.is_dir() {
            return Err(DataError::NotFound {
                path: dir.to_path_buf(),
            });
        }
        let manifest = Manifest::read(dir)?;
        if manifest.tokenizer != tokenizer.fingerprint() {
            return Err(DataError::PreparedTokenizerMismatch {
                path: dir.join(MANIFEST_FILE),
                prepared: manifest.tokenizer.clone(),
                given: tokenizer.fingerprint(),
            });
        }
        let (mut pieces, mut starts, mut at) = (Vec::new(), Vec::new(), 0u64);
        for shard in &manifest.shards {
            let path = dir.join(&shard.file);
            let file = open_shard(&path, shard, manifest.dtype)?;
            if shard.tokens == 0 {
                continue;
            }
            if let (Some(eot), false) = (manifest.end_of_text, pieces.is_empty()) {
                pieces.push(Piece::Separator(eot));
                starts.push(at);
                at += 1;
            }
            // SAFETY: the map is read-only and the file is not written by iota while mapped; a
            // file truncated by someone else meanwhile would fault, as with any mapped file.
            let map = unsafe { Mmap::map(&file) }.map_err(|error| DataError::io(&path, error))?;
            pieces.push(Piece::Shard(map));
            starts.push(at);
            at += shard.tokens;
        }
        starts.push(at);
        Ok(Self {
            dir: dir.to_path_buf(),
            manifest,
            pieces,
            starts,
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Tokens in the packed stream.
    pub fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0) as usize
    }

    /// Whether the stream is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One line for logs: the directory, its shard count and tokenizer.
    pub fn describe(&self) -> String {
        format!(
            "{} (prepared: {} shards of {:?} tokens from {})",
            self.dir.display(),
            self.manifest.shards.len(),
            self.manifest.dtype,
            self.manifest.source
        )
    }

    /// The `len` tokens from stream offset `start`.
    ///
    /// # Panics
    /// If the range is not inside the stream (a caller bug: windows are cut inside
    /// [`Self::len`]).
    pub fn read(&self, start: usize, len: usize) -> Vec<u32> {
        let end = start + len;
        assert!(end <= self.len(), "tokens {start}..{end} of {}", self.len());
        let mut out = Vec::with_capacity(len);
        // The piece holding `start`: the last whose first token is at or before it.
        let mut piece = self.starts.partition_point(|&s| s as usize <= start) - 1;
        let mut at = start;
        while at < end {
            let piece_start = self.starts[piece] as usize;
            let piece_end = (self.starts[piece + 1] as usize).min(end);
            match &self.pieces[piece] {
                Piece::Separator(eot) => out.push(*eot),
                Piece::Shard(map) => {
                    let width = self.manifest.dtype.bytes();
                    let bytes = &map[(at - piece_start) * width..(piece_end - piece_start) * width];
                    self.manifest.dtype.extend_ids(bytes, &mut out);
                }
            }
            at = piece_end;
            piece += 1;
        }
        out
    }
}

/// Reads the written shards back in stream order: the stream's length and content hash.
pub(super) fn hash_stream(
    out: &Path,
    shards: &[ShardEntry],
    dtype: TokenDtype,
    end_of_text: Option<u32>,
) -> Result<(u64, String), DataError> {
    let mut hasher = StreamHasher::new();
    let (mut total, mut any) = (0u64, false);
    let mut buf = vec![0u8; READ_TOKENS * dtype.bytes()];
    let mut ids = Vec::with_capacity(READ_TOKENS);
    for shard in shards.iter().filter(|s| s.tokens > 0) {
        if let (Some(eot), true) = (end_of_text, any) {
            hasher.update(&[eot]);
            total += 1;
        }
        any = true;
        let path = out.join(&shard.file);
        let mut file = File::open(&path).map_err(|error| DataError::io(&path, error))?;
        loop {
            let n = read_full(&mut file, &mut buf).map_err(|error| DataError::io(&path, error))?;
            if n == 0 {
                break;
            }
            ids.clear();
            dtype.extend_ids(&buf[..n], &mut ids);
            hasher.update(&ids);
            total += ids.len() as u64;
        }
    }
    Ok((total, hasher.finish()))
}

/// Reads until `buf` is full or the file ends; the bytes read.
fn read_full(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a prepared directory by hand: shards of the given ids, u16.
    fn write_dir(dir: &Path, shards: &[&[u32]], eot: Option<u32>) -> Manifest {
        let mut entries = Vec::new();
        for (i, ids) in shards.iter().enumerate() {
            let mut bytes = Vec::new();
            TokenDtype::U16.extend_bytes(ids, &mut bytes);
            let file = format!("{i:05}.bin");
            std::fs::write(dir.join(&file), bytes).unwrap();
            entries.push(ShardEntry {
                file,
                source: format!("s{i}.txt"),
                tokens: ids.len() as u64,
                documents: u64::from(!ids.is_empty()),
            });
        }
        let non_empty = shards.iter().filter(|s| !s.is_empty()).count() as u64;
        let tokens = entries.iter().map(|e| e.tokens).sum::<u64>()
            + if eot.is_some() {
                non_empty.saturating_sub(1)
            } else {
                0
            };
        let manifest = Manifest {
            format: FORMAT.to_owned(),
            tokenizer: "byte".to_owned(),
            vocab_size: 256,
            end_of_text: eot,
            dtype: TokenDtype::U16,
            source: "hand".to_owned(),
            text_column: "text".to_owned(),
            tokens,
            documents: non_empty,
            stream_hash: String::new(),
            shards: entries,
        };
        manifest.write(dir).unwrap();
        manifest
    }

    #[test]
    fn reads_ranges_across_shards_and_separators() {
        let dir = tempfile::tempdir().unwrap();
        write_dir(dir.path(), &[&[1, 2, 3], &[], &[4, 5], &[6]], Some(0));
        let tokens = PreparedTokens::open(dir.path(), &Tokenizer::byte()).unwrap();
        let all = [1, 2, 3, 0, 4, 5, 0, 6];
        assert_eq!(tokens.len(), all.len());
        for start in 0..all.len() {
            for len in 0..=all.len() - start {
                assert_eq!(
                    tokens.read(start, len),
                    all[start..start + len],
                    "{start}+{len}"
                );
            }
        }
        assert!(tokens.describe().contains("4 shards"));
    }

    #[test]
    fn without_end_of_text_shards_are_joined_directly() {
        let dir = tempfile::tempdir().unwrap();
        write_dir(dir.path(), &[&[7], &[8, 9]], None);
        let tokens = PreparedTokens::open(dir.path(), &Tokenizer::byte()).unwrap();
        assert_eq!(tokens.read(0, 3), vec![7, 8, 9]);
    }

    #[test]
    fn widths_follow_the_vocabulary() {
        assert_eq!(TokenDtype::for_vocab(256), TokenDtype::U16);
        assert_eq!(TokenDtype::for_vocab(65_536), TokenDtype::U16);
        assert_eq!(TokenDtype::for_vocab(65_537), TokenDtype::U32);
        assert_eq!(TokenDtype::for_vocab(128_256), TokenDtype::U32);
        let mut out = Vec::new();
        TokenDtype::U32.extend_bytes(&[0x0102_0304], &mut out);
        assert_eq!(out, [4, 3, 2, 1]);
    }

    #[test]
    fn bad_manifests_and_shards_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut manifest = write_dir(dir.path(), &[&[1, 2, 3], &[4]], Some(0));
        std::fs::write(dir.path().join("00001.bin"), [4u8]).unwrap();
        let err = PreparedTokens::open(dir.path(), &Tokenizer::byte())
            .err()
            .unwrap();
        let message = err.to_string();
        assert!(
            message.contains("00001.bin") && message.contains("truncated"),
            "{message}"
        );

        manifest.tokens += 1;
        manifest.write(dir.path()).unwrap();
        let err = Manifest::read(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains(MANIFEST_FILE) && err.contains("4 tokens and 1"),
            "{err}"
        );

        std::fs::write(dir.path().join(MANIFEST_FILE), "{").unwrap();
        let err = Manifest::read(dir.path()).unwrap_err().to_string();
        assert!(err.contains(MANIFEST_FILE) && !err.contains('\n'), "{err}");
    }
}
