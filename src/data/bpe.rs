//! Offline training of a byte-level BPE tokenizer (GPT-2 style) with the `tokenizers` crate.

use std::collections::HashSet;
use std::path::Path;

use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper};

use super::source::{Documents, TextSource};
use super::{DataError, Tokenizer};

/// The end-of-text token every trained tokenizer carries; packing separates documents with it.
pub const END_OF_TEXT_TOKEN: &str = "<|endoftext|>";

/// Smallest vocabulary accepted: the 256 byte symbols plus [`END_OF_TEXT_TOKEN`].
pub const MIN_BPE_VOCAB: usize = 257;

/// Trains a byte-level BPE on the documents of `source` and writes it to `out` as a
/// `tokenizer.json` any Hugging Face tokenizer library can load.
///
/// The vocabulary always holds all 256 byte symbols (so any text encodes, nothing maps to an
/// unknown token) and [`END_OF_TEXT_TOKEN`]; merges fill the rest. The result has exactly
/// `vocab_size` entries unless the corpus runs out of pairs to merge first, in which case it has
/// fewer: it never exceeds `vocab_size`. Text is split GPT-2 style (the `ByteLevel`
/// pre-tokenizer, no prefix space added, so decoding gives back exactly the input).
///
/// # Errors
/// [`DataError::VocabTooSmall`] below [`MIN_BPE_VOCAB`], any error of the source,
/// [`DataError::NoDocuments`] for an empty source, [`DataError::Tokenizer`] when training fails
/// and [`DataError::TokenizerSave`] when `out` cannot be written.
pub fn train_bpe(
    source: &dyn TextSource,
    vocab_size: usize,
    out: &Path,
) -> Result<Tokenizer, DataError> {
    if vocab_size < MIN_BPE_VOCAB {
        return Err(DataError::VocabTooSmall {
            requested: vocab_size,
            min: MIN_BPE_VOCAB,
        });
    }
    let byte_level = ByteLevel::default().add_prefix_space(false);
    let alphabet: HashSet<char> = ByteLevel::alphabet().into_iter().collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab_size)
        .min_frequency(0)
        .special_tokens(vec![AddedToken::from(END_OF_TEXT_TOKEN, true)])
        .initial_alphabet(alphabet)
        .build()
        .into();
    let mut hf = tokenizers::Tokenizer::new(BPE::default());
    hf.with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(byte_level)));
    hf.with_decoder(Some(DecoderWrapper::ByteLevel(byte_level)));

    let mut failure = None;
    let mut count = 0usize;
    let documents = StopAtError {
        documents: source.documents(),
        failure: &mut failure,
        count: &mut count,
    };
    let trained = hf.train(&mut trainer, documents).map(|_| ());
    if let Some(error) = failure {
        return Err(error);
    }
    if count == 0 {
        return Err(DataError::NoDocuments {
            source_name: source.describe(),
        });
    }
    trained.map_err(|e| DataError::Tokenizer {
        reason: e.to_string(),
    })?;
    hf.save(out, true).map_err(|e| DataError::TokenizerSave {
        path: out.to_path_buf(),
        reason: e.to_string(),
    })?;
    Tokenizer::from_hf(hf)
}

/// Yields the documents of a source until the first error, which it stores: the `tokenizers`
/// trainer takes plain strings, so errors travel beside the stream.
struct StopAtError<'a> {
    documents: Documents<'a>,
    failure: &'a mut Option<DataError>,
    count: &'a mut usize,
}

impl Iterator for StopAtError<'_> {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        if self.failure.is_some() {
            return None;
        }
        match self.documents.next()? {
            Ok(document) => {
                *self.count += 1;
                Some(document)
            }
            Err(error) => {
                *self.failure = Some(error);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::source::LocalFiles;

    const CORPUS: &str = "The quick brown fox jumps over the lazy dog. \
        The lazy dog sleeps while the quick fox runs around the farm. \
        Foxes and dogs are not always friends, but these two are.\n";

    fn corpus_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), CORPUS.repeat(20)).unwrap();
        let jsonl: String = (0..20)
            .map(|i| format!("{{\"text\": \"document {i}: the fox and the dog\"}}\n"))
            .collect();
        std::fs::write(dir.path().join("b.jsonl"), jsonl).unwrap();
        dir
    }

    #[test]
    fn trains_requested_vocab_and_round_trips() {
        let dir = corpus_dir();
        let source = LocalFiles::open(dir.path()).unwrap();
        let out = dir.path().join("tokenizer.json");
        let tokenizer = train_bpe(&source, 300, &out).unwrap();
        assert_eq!(tokenizer.vocab_size(), 300);
        assert!(!tokenizer.is_byte());
        assert_eq!(
            tokenizer.end_of_text(),
            Some(0),
            "special tokens come first"
        );

        // Merges compress the training text below one token per byte.
        let ids = tokenizer.encode(CORPUS).unwrap();
        assert!(ids.len() * 2 < CORPUS.len(), "{} ids", ids.len());
        assert_eq!(tokenizer.decode(&ids).unwrap(), CORPUS);
        // Unseen and non-ASCII text still round-trips through the byte alphabet.
        let other = "  Zebra ünïcødé 🦀\n\ttabs";
        let ids = tokenizer.encode(other).unwrap();
        assert_eq!(tokenizer.decode(&ids).unwrap(), other);
        assert!(matches!(
            tokenizer.decode(&[300]),
            Err(DataError::TokenOutOfRange { id: 300, .. })
        ));

        // The saved file loads back to the same tokenizer.
        let loaded = Tokenizer::from_file(&out).unwrap();
        assert_eq!(loaded.fingerprint(), tokenizer.fingerprint());
        assert!(loaded.fingerprint().starts_with("hf-"));
        assert_eq!(loaded.fingerprint().len(), 3 + 16);
        assert_eq!(
            loaded.encode(CORPUS).unwrap(),
            tokenizer.encode(CORPUS).unwrap()
        );
        assert_eq!(loaded.end_of_text(), Some(0));
    }

    #[test]
    fn packing_with_a_trained_bpe_separates_documents_with_endoftext() {
        let dir = corpus_dir();
        let source = LocalFiles::open(dir.path()).unwrap();
        let tokenizer = train_bpe(&source, 300, &dir.path().join("t.json")).unwrap();
        let eot = tokenizer.end_of_text().unwrap();
        let tokens = crate::data::pack_documents(&source, &tokenizer).unwrap();
        let docs: Vec<String> = source.documents().map(Result::unwrap).collect();
        assert_eq!(docs.len(), 21);
        let pieces: Vec<&[u32]> = tokens.split(|&t| t == eot).collect();
        assert_eq!(pieces.len(), docs.len());
        for (piece, doc) in pieces.iter().zip(&docs) {
            assert_eq!(&tokenizer.decode(piece).unwrap(), doc);
        }
        // The end-of-text token decodes to its text, kept as a special token.
        assert_eq!(tokenizer.decode(&[eot]).unwrap(), END_OF_TEXT_TOKEN);
    }

    #[test]
    fn vocab_is_capped_when_corpus_runs_out_of_merges() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tiny.txt"), "ab ab ab").unwrap();
        let source = LocalFiles::open(dir.path()).unwrap();
        let tokenizer = train_bpe(&source, 1000, &dir.path().join("t.json")).unwrap();
        assert!(tokenizer.vocab_size() >= MIN_BPE_VOCAB);
        assert!(tokenizer.vocab_size() < 1000, "{}", tokenizer.vocab_size());
    }

    #[test]
    fn rejects_small_vocab_bad_sources_and_unwritable_output() {
        let dir = corpus_dir();
        let source = LocalFiles::open(dir.path()).unwrap();
        assert!(matches!(
            train_bpe(&source, 256, &dir.path().join("t.json")),
            Err(DataError::VocabTooSmall {
                requested: 256,
                min: 257
            })
        ));
        let unwritable = dir.path().join("no/such/dir/t.json");
        assert!(matches!(
            train_bpe(&source, 300, &unwritable),
            Err(DataError::TokenizerSave { .. })
        ));
        std::fs::write(dir.path().join("c.jsonl"), "not json\n").unwrap();
        let source = LocalFiles::open(dir.path()).unwrap();
        assert!(matches!(
            train_bpe(&source, 300, &dir.path().join("t.json")),
            Err(DataError::BadJsonLine { line: 1, .. })
        ));
    }
}
