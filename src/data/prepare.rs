//! `prepare`: tokenizes local files once into the token shards of a prepared directory
//! (layout in `prepared.rs`), one shard per source file, files in parallel.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use rayon::prelude::*;

use super::pack::pack_into;
use super::prepared::{FORMAT, MANIFEST_FILE, Manifest, ShardEntry, TokenDtype, hash_stream};
use super::source::{LocalFiles, TextSource};
use super::{DataError, Tokenizer};

/// Tokens buffered before they are written out.
const WRITE_TOKENS: usize = 1 << 20;

/// Tokenizes every file of `source` with `tokenizer` into token shards under `out` (created
/// if missing) and writes the manifest last, so a directory with a manifest is complete.
/// Files are tokenized on `threads` threads (all cores for 0); `done` is called once per
/// finished file with the file's shard entry.
///
/// # Errors
/// [`DataError::Unwritable`] when `out` cannot be made or written, or is a non-empty
/// directory that is not a prepared one (it is not overwritten); any error reading or
/// tokenizing a file (naming it); [`DataError::NoDocuments`] when no file holds a document;
/// [`DataError::Tokenizer`] when the thread pool cannot start.
pub fn prepare(
    source: &LocalFiles,
    tokenizer: &Tokenizer,
    out: &Path,
    threads: usize,
    done: &(dyn Fn(&ShardEntry) + Sync),
) -> Result<Manifest, DataError> {
    make_out_dir(out)?;
    let dtype = TokenDtype::for_vocab(tokenizer.vocab_size());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| DataError::Tokenizer {
            reason: format!("cannot start {threads} threads: {e}"),
        })?;
    let files = source.files();
    let shards: Vec<ShardEntry> = pool.install(|| {
        files
            .par_iter()
            .enumerate()
            .map(|(i, path)| {
                let entry = prepare_file(source, path, i, tokenizer, dtype, out)?;
                done(&entry);
                Ok(entry)
            })
            .collect::<Result<_, DataError>>()
    })?;
    let documents = shards.iter().map(|s| s.documents).sum();
    if documents == 0 {
        return Err(DataError::NoDocuments {
            source_name: source.describe(),
        });
    }
    let end_of_text = tokenizer.end_of_text();
    let (tokens, stream_hash) = hash_stream(out, &shards, dtype, end_of_text)?;
    let manifest = Manifest {
        format: FORMAT.to_owned(),
        tokenizer: tokenizer.fingerprint(),
        vocab_size: tokenizer.vocab_size(),
        end_of_text,
        dtype,
        source: source.describe(),
        text_column: source.text_column().to_owned(),
        tokens,
        documents,
        stream_hash,
        shards,
    };
    manifest.write(out)?;
    Ok(manifest)
}

/// Creates `out`, or accepts it when empty or already prepared (its old manifest is removed
/// first, so an interrupted run never leaves a manifest naming half-written shards).
fn make_out_dir(out: &Path) -> Result<(), DataError> {
    let unwritable = |error| DataError::Unwritable {
        path: out.to_path_buf(),
        error,
    };
    std::fs::create_dir_all(out).map_err(unwritable)?;
    let manifest = out.join(MANIFEST_FILE);
    if manifest.is_file() {
        return std::fs::remove_file(&manifest).map_err(|error| DataError::Unwritable {
            path: manifest,
            error,
        });
    }
    let mut entries = std::fs::read_dir(out).map_err(unwritable)?;
    if entries.next().is_some() {
        return Err(unwritable(std::io::Error::other(
            "the directory is not empty and holds no prepared tokens (choose an empty or new one)",
        )));
    }
    Ok(())
}

/// Tokenizes one file into shard `index`.
fn prepare_file(
    source: &LocalFiles,
    path: &Path,
    index: usize,
    tokenizer: &Tokenizer,
    dtype: TokenDtype,
    out: &Path,
) -> Result<ShardEntry, DataError> {
    let file_name = format!("{index:05}.bin");
    let shard_path = out.join(&file_name);
    let unwritable = |error| DataError::Unwritable {
        path: shard_path.clone(),
        error,
    };
    let mut writer = BufWriter::new(File::create(&shard_path).map_err(unwritable)?);
    let one = LocalFiles::open(path)?.with_text_column(source.text_column());
    let (mut pending, mut bytes, mut tokens) = (Vec::new(), Vec::new(), 0u64);
    let mut flush = |pending: &mut Vec<u32>| -> Result<(), DataError> {
        bytes.clear();
        dtype.extend_bytes(pending, &mut bytes);
        tokens += pending.len() as u64;
        pending.clear();
        writer.write_all(&bytes).map_err(unwritable)
    };
    let documents = pack_into(&one, tokenizer, |ids| {
        pending.extend_from_slice(ids);
        if pending.len() >= WRITE_TOKENS {
            flush(&mut pending)?;
        }
        Ok(())
    })?;
    flush(&mut pending)?;
    writer
        .into_inner()
        .map_err(|e| unwritable(e.into_error()))?
        .sync_all()
        .map_err(unwritable)?;
    Ok(ShardEntry {
        file: file_name,
        source: source.name_of(path),
        tokens,
        documents: documents as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::pack_documents;
    use crate::data::prepared::PreparedTokens;
    use crate::data::stream_hash::hash_tokens;

    #[test]
    fn prepared_stream_equals_the_packed_raw_stream() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir(src.path().join("sub")).unwrap();
        std::fs::write(src.path().join("a.txt"), "first file").unwrap();
        std::fs::write(src.path().join("b.txt"), "").unwrap();
        std::fs::write(
            src.path().join("sub/c.jsonl"),
            "{\"text\":\"x\"}\n{\"text\":\"\"}\n{\"text\":\"yz\"}\n",
        )
        .unwrap();
        let source = LocalFiles::open(src.path()).unwrap();
        let raw = pack_documents(&source, &Tokenizer::byte()).unwrap();
        for threads in [1, 3] {
            let out = tempfile::tempdir().unwrap();
            let seen = std::sync::Mutex::new(0);
            let manifest = prepare(&source, &Tokenizer::byte(), out.path(), threads, &|_| {
                *seen.lock().unwrap() += 1;
            })
            .unwrap();
            assert_eq!(*seen.lock().unwrap(), 3);
            assert_eq!(manifest.documents, 3);
            assert_eq!(manifest.shards[1].tokens, 0);
            assert_eq!(manifest.shards[2].source, "sub/c.jsonl");
            assert_eq!(manifest.stream_hash, hash_tokens(&raw));
            let tokens = PreparedTokens::open(out.path(), &Tokenizer::byte()).unwrap();
            assert_eq!(tokens.read(0, tokens.len()), raw);
            // A second run into the same directory replaces it.
            prepare(&source, &Tokenizer::byte(), out.path(), threads, &|_| {}).unwrap();
        }
    }

    #[test]
    fn refuses_a_foreign_directory_and_empty_sources() {
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("a.txt"), "").unwrap();
        let source = LocalFiles::open(src.path()).unwrap();
        let out = tempfile::tempdir().unwrap();
        let err = prepare(&source, &Tokenizer::byte(), out.path(), 1, &|_| {}).unwrap_err();
        assert!(matches!(err, DataError::NoDocuments { .. }), "{err}");
        std::fs::write(out.path().join("notes.md"), "mine").unwrap();
        let err = prepare(&source, &Tokenizer::byte(), out.path(), 1, &|_| {}).unwrap_err();
        assert!(err.to_string().contains("not empty"), "{err}");
    }
}
