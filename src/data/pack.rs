//! Packing: documents tokenized and joined into one token stream.

use super::source::TextSource;
use super::{DataError, Tokenizer};

/// Most documents encoded in one batch.
const BATCH_DOCUMENTS: usize = 256;

/// Text bytes after which a batch is encoded even if it has fewer documents.
const BATCH_BYTES: usize = 16 << 20;

/// Tokenizes every document of `source` and concatenates them, with the tokenizer's
/// end-of-text id *between* consecutive documents (none before the first or after the last,
/// and none at all when the tokenizer has no such token). Documents that encode to no tokens
/// are skipped, so they never produce doubled separators.
///
/// A single-document source therefore packs to exactly its own tokens, which keeps the
/// synthetic corpus's entropy floor exact.
///
/// # Errors
/// Any error of the source or the tokenizer; [`DataError::NoDocuments`] when no document
/// yields a token.
pub fn pack_documents(
    source: &dyn TextSource,
    tokenizer: &Tokenizer,
) -> Result<Vec<u32>, DataError> {
    let mut tokens = Vec::new();
    let documents = pack_into(source, tokenizer, |ids| {
        tokens.extend_from_slice(ids);
        Ok(())
    })?;
    if documents == 0 {
        return Err(DataError::NoDocuments {
            source_name: source.describe(),
        });
    }
    tracing::debug!(documents, tokens = tokens.len(), source = %source.describe(), "packed documents");
    Ok(tokens)
}

/// The packing of [`pack_documents`], streamed: hands `emit` the packed tokens in order, a
/// piece at a time (separators included), and returns the number of documents, which may be
/// 0 (then nothing was emitted).
///
/// # Errors
/// Any error of the source, the tokenizer or `emit`.
pub(crate) fn pack_into(
    source: &dyn TextSource,
    tokenizer: &Tokenizer,
    mut emit: impl FnMut(&[u32]) -> Result<(), DataError>,
) -> Result<usize, DataError> {
    let separator = tokenizer.end_of_text();
    let mut documents = 0usize;
    let mut append = |batch: &[String]| -> Result<(), DataError> {
        for ids in tokenizer.encode_batch(batch)? {
            if ids.is_empty() {
                continue;
            }
            if let (Some(separator), true) = (separator, documents > 0) {
                emit(&[separator])?;
            }
            emit(&ids)?;
            documents += 1;
        }
        Ok(())
    };
    // Documents are encoded in batches (in parallel for HF tokenizers) and appended in order.
    let mut batch = Vec::new();
    let mut batch_bytes = 0usize;
    for document in source.documents() {
        let document = document?;
        batch_bytes += document.len();
        batch.push(document);
        if batch.len() >= BATCH_DOCUMENTS || batch_bytes >= BATCH_BYTES {
            append(&batch)?;
            batch.clear();
            batch_bytes = 0;
        }
    }
    append(&batch)?;
    Ok(documents)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::source::Documents;

    /// An in-memory source for tests.
    struct Docs(Vec<&'static str>);

    impl TextSource for Docs {
        fn describe(&self) -> String {
            "test docs".to_owned()
        }
        fn documents(&self) -> Documents<'_> {
            Box::new(self.0.iter().map(|d| Ok((*d).to_owned())))
        }
    }

    #[test]
    fn byte_documents_are_separated_by_nul() {
        let tokens = pack_documents(&Docs(vec!["ab", "", "c"]), &Tokenizer::byte()).unwrap();
        assert_eq!(tokens, vec![97, 98, 0, 99]);
        let single = pack_documents(&Docs(vec!["xyz"]), &Tokenizer::byte()).unwrap();
        assert_eq!(single, vec![120, 121, 122]);
    }

    /// Many small documents, so packing crosses batch boundaries.
    struct Numbered(usize);

    impl TextSource for Numbered {
        fn describe(&self) -> String {
            "numbered".to_owned()
        }
        fn documents(&self) -> Documents<'_> {
            Box::new((0..self.0).map(|i| Ok(format!("d{i}"))))
        }
    }

    #[test]
    fn batches_keep_document_order() {
        let n = 2 * BATCH_DOCUMENTS + 3;
        let tokens = pack_documents(&Numbered(n), &Tokenizer::byte()).unwrap();
        let text = Tokenizer::byte().decode(&tokens).unwrap();
        let docs: Vec<&str> = text.split('\0').collect();
        assert_eq!(docs.len(), n);
        for (i, doc) in docs.iter().enumerate() {
            assert_eq!(*doc, format!("d{i}"));
        }
    }

    #[test]
    fn empty_sources_are_errors() {
        for docs in [vec![], vec!["", ""]] {
            let err = pack_documents(&Docs(docs), &Tokenizer::byte()).unwrap_err();
            assert!(matches!(err, DataError::NoDocuments { .. }));
            assert!(err.to_string().contains("test docs"));
        }
    }
}
