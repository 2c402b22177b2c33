//! The one error type of the data module.

use std::path::{Path, PathBuf};

/// Everything that can go wrong while reading text, tokenizing it or packing it into windows.
///
/// Each message is one line that names the file, line or number involved, so a user can act
/// on it without a backtrace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// The data or tokenizer path does not exist.
    #[error("{path}: no such file or directory")]
    NotFound {
        /// The path that was asked for.
        path: PathBuf,
    },
    /// A file or directory exists but could not be read.
    #[error("cannot read {path}: {error}")]
    Unreadable {
        /// The file or directory.
        path: PathBuf,
        /// What the operating system said.
        error: std::io::Error,
    },
    /// A text file is not valid UTF-8.
    #[error("{path}: not valid UTF-8 (first bad byte at offset {offset})")]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
    /// A file given explicitly has an extension the reader does not know.
    #[error(
        "{path}: unsupported file type (expected a .txt, .jsonl, .jsonl.gz, .jsonl.zst or \
         .parquet file, or a directory)"
    )]
    UnsupportedFile {
        /// The file.
        path: PathBuf,
    },
    /// A line of a `.jsonl` file is not a JSON object with a string field named by the text
    /// column (`text` unless configured).
    #[error("{path}:{line}: {reason}")]
    BadJsonLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the line.
        reason: String,
    },
    /// A Parquet shard cannot be read as documents: it is corrupt or truncated, has no such
    /// column, or the column does not hold one string per row.
    #[error("{path}: Parquet column {column:?}: {reason}")]
    BadParquet {
        /// The shard.
        path: PathBuf,
        /// The text column that was asked for.
        column: String,
        /// What is wrong (one line).
        reason: String,
    },
    /// A text column was configured for a source that has no columns (the synthetic corpus),
    /// or the name is empty.
    #[error("text column {column:?}: {reason}")]
    BadTextColumn {
        /// The column as given.
        column: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The source yielded no documents at all.
    #[error(
        "no documents found in {source_name} (a directory is searched for .txt, .jsonl, \
         .jsonl.gz, .jsonl.zst and .parquet files)"
    )]
    NoDocuments {
        /// The source, as described by [`crate::data::TextSource::describe`].
        source_name: String,
    },
    /// The documents hold too few tokens for one training window plus one evaluation window.
    #[error(
        "{source_name}: found {found} tokens but need at least {needed} \
         (one training and one evaluation window of seq_len + 1 = {window} tokens each)"
    )]
    TooFewTokens {
        /// The source.
        source_name: String,
        /// Tokens found after packing.
        found: usize,
        /// Tokens needed.
        needed: usize,
        /// Window length, `seq_len + 1`.
        window: usize,
    },
    /// The sequence length is zero.
    #[error("seq_len must be at least 1")]
    ZeroSeqLen,
    /// A data specification string could not be parsed.
    #[error("bad data spec {spec:?}: {reason}")]
    BadSpec {
        /// The string as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Remote shards were handed to a reader that only reads local files.
    #[error(
        "{url}: remote data must be copied to a local folder before it is read, and this \
         command does not fetch it (pass a local folder)"
    )]
    NotFetched {
        /// The URL.
        url: String,
    },
    /// A `tokenizer.json` file could not be parsed.
    #[error("{path}: not a valid tokenizer.json: {reason}")]
    BadTokenizerFile {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// A trained tokenizer could not be written.
    #[error("cannot write tokenizer to {path}: {reason}")]
    TokenizerSave {
        /// The output path.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The HF tokenizer failed to encode, decode or train.
    #[error("tokenizer failed: {reason}")]
    Tokenizer {
        /// The tokenizer library's message.
        reason: String,
    },
    /// A token id is not in the tokenizer's vocabulary.
    #[error("token id {id} out of range for a vocabulary of {vocab_size}")]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// A BPE vocabulary was requested that cannot hold the 256 byte symbols plus end-of-text.
    #[error("vocabulary size {requested} is too small: a byte-level BPE needs at least {min}")]
    VocabTooSmall {
        /// The requested size.
        requested: usize,
        /// The smallest size accepted.
        min: usize,
    },
    /// A prepared token directory (`iota data prepare`) cannot be used: its manifest does not
    /// parse or a token shard is missing or of the wrong size.
    #[error("{path}: {reason}")]
    BadPrepared {
        /// The manifest or token shard at fault.
        path: PathBuf,
        /// What is wrong (one line).
        reason: String,
    },
    /// A prepared token directory was tokenized with another tokenizer than the run's.
    #[error(
        "{path}: these token shards were prepared with tokenizer {prepared} but this run uses \
         {given}; pass the tokenizer they were prepared with, or prepare the data again"
    )]
    PreparedTokenizerMismatch {
        /// The manifest.
        path: PathBuf,
        /// The fingerprint the manifest names.
        prepared: String,
        /// The run's tokenizer's fingerprint.
        given: String,
    },
    /// An output file or directory could not be written.
    #[error("cannot write {path}: {error}")]
    Unwritable {
        /// The file or directory.
        path: PathBuf,
        /// What the operating system said.
        error: std::io::Error,
    },
}

impl DataError {
    /// An I/O error on `path`: [`DataError::NotFound`] when it does not exist, else
    /// [`DataError::Unreadable`].
    pub(crate) fn io(path: &Path, error: std::io::Error) -> Self {
        if error.kind() == std::io::ErrorKind::NotFound {
            Self::NotFound {
                path: path.to_path_buf(),
            }
        } else {
            Self::Unreadable {
                path: path.to_path_buf(),
                error,
            }
        }
    }
}
