//! The one error type of the data module.

use std::path::PathBuf;

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
    #[error("{path}: unsupported file type (expected a .txt or .jsonl file, or a directory)")]
    UnsupportedFile {
        /// The file.
        path: PathBuf,
    },
    /// A line of a `.jsonl` file is not a JSON object with a string field `text`.
    #[error("{path}:{line}: {reason}")]
    BadJsonLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the line.
        reason: String,
    },
    /// The source yielded no documents at all.
    #[error(
        "no documents found in {source_name} (a directory is searched for .txt and .jsonl files)"
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
}
