//! Tokenizers: the built-in byte tokenizer and any Hugging Face `tokenizer.json`.

use std::path::Path;

use super::DataError;

/// Tokens tried, in order, as the end-of-text marker of a Hugging Face tokenizer.
const END_OF_TEXT_CANDIDATES: [&str; 4] = ["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"];

/// Number of ids of the byte tokenizer: one per byte value.
pub const BYTE_VOCAB_SIZE: usize = 256;

/// End-of-text id of the byte tokenizer: byte 0 (NUL).
///
/// NUL never occurs in ordinary text, so it marks a document boundary without ambiguity and
/// costs a single token; `\n\n` would be one more token and collide with paragraph breaks.
pub const BYTE_END_OF_TEXT: u32 = 0;

/// A tokenizer: text to token ids and back.
///
/// Either the built-in byte tokenizer (ids are the UTF-8 bytes, vocabulary 256, the default
/// because it needs no file and keeps the synthetic corpus's entropy floor exact) or a Hugging
/// Face tokenizer loaded from a `tokenizer.json`. Cloning an HF tokenizer copies its tables;
/// `Debug` prints only the fingerprint and sizes, not the vocabulary.
#[derive(Clone)]
pub struct Tokenizer {
    /// Which tokenizer this is.
    kind: Kind,
    /// Cached [`Tokenizer::fingerprint`]: hashing a large vocabulary on every call would be wasteful.
    fingerprint: String,
    /// Cached [`Tokenizer::end_of_text`].
    end_of_text: Option<u32>,
    /// Cached [`Tokenizer::vocab_size`].
    vocab_size: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("fingerprint", &self.fingerprint)
            .field("vocab_size", &self.vocab_size)
            .field("end_of_text", &self.end_of_text)
            .finish()
    }
}

/// The two kinds of tokenizer.
#[derive(Clone)]
enum Kind {
    Byte,
    Hf(Box<tokenizers::Tokenizer>),
}

impl Tokenizer {
    /// The built-in byte tokenizer: ids are bytes, vocabulary 256, end-of-text is byte 0.
    pub fn byte() -> Self {
        Self {
            kind: Kind::Byte,
            fingerprint: "byte".to_owned(),
            end_of_text: Some(BYTE_END_OF_TEXT),
            vocab_size: BYTE_VOCAB_SIZE,
        }
    }

    /// Loads a Hugging Face `tokenizer.json`.
    ///
    /// # Errors
    /// [`DataError::NotFound`] when the file is missing, [`DataError::Unreadable`] when it cannot
    /// be read, [`DataError::BadTokenizerFile`] when it does not parse.
    pub fn from_file(path: &Path) -> Result<Self, DataError> {
        let bytes = std::fs::read(path).map_err(|error| DataError::io(path, error))?;
        let hf =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| DataError::BadTokenizerFile {
                path: path.to_path_buf(),
                reason: one_line(&e.to_string()),
            })?;
        Self::from_hf(hf)
    }

    /// Wraps an in-memory Hugging Face tokenizer. Any truncation or padding configured in it is
    /// switched off: packing needs every token of every document, unpadded.
    ///
    /// # Errors
    /// [`DataError::Tokenizer`] when it cannot be reconfigured or serialized (needed for its
    /// fingerprint).
    pub fn from_hf(mut hf: tokenizers::Tokenizer) -> Result<Self, DataError> {
        hf.with_truncation(None).map_err(|e| DataError::Tokenizer {
            reason: one_line(&e.to_string()),
        })?;
        hf.with_padding(None);
        let json = hf.to_string(false).map_err(|e| DataError::Tokenizer {
            reason: one_line(&e.to_string()),
        })?;
        let hash = blake3::hash(json.as_bytes()).to_hex();
        let fingerprint = format!("hf-{}", &hash.as_str()[..16]);
        let end_of_text = END_OF_TEXT_CANDIDATES
            .iter()
            .find_map(|token| hf.token_to_id(token));
        let vocab_size = hf.get_vocab_size(true);
        Ok(Self {
            kind: Kind::Hf(Box::new(hf)),
            fingerprint,
            end_of_text,
            vocab_size,
        })
    }

    /// The byte tokenizer for `None`, else the `tokenizer.json` at the path.
    ///
    /// # Errors
    /// As [`Tokenizer::from_file`].
    pub fn load(path: Option<&Path>) -> Result<Self, DataError> {
        match path {
            None => Ok(Self::byte()),
            Some(path) => Self::from_file(path),
        }
    }

    /// Whether this is the built-in byte tokenizer.
    pub fn is_byte(&self) -> bool {
        matches!(self.kind, Kind::Byte)
    }

    /// Encodes text to ids, without adding any special tokens (no BOS/EOS: packing adds the
    /// end-of-text separators itself).
    ///
    /// # Errors
    /// [`DataError::Tokenizer`] when the HF tokenizer fails; the byte tokenizer never fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        match &self.kind {
            Kind::Byte => Ok(text.bytes().map(u32::from).collect()),
            Kind::Hf(hf) => {
                let encoding = hf
                    .encode_fast(text, false)
                    .map_err(|e| DataError::Tokenizer {
                        reason: one_line(&e.to_string()),
                    })?;
                Ok(encoding.get_ids().to_vec())
            }
        }
    }

    /// Encodes several texts, in parallel for an HF tokenizer; the same ids as
    /// [`Tokenizer::encode`] on each, in order.
    ///
    /// # Errors
    /// As [`Tokenizer::encode`].
    pub fn encode_batch(&self, texts: &[String]) -> Result<Vec<Vec<u32>>, DataError> {
        match &self.kind {
            Kind::Byte => texts.iter().map(|text| self.encode(text)).collect(),
            Kind::Hf(hf) => {
                let inputs: Vec<&str> = texts.iter().map(String::as_str).collect();
                let encodings =
                    hf.encode_batch_fast(inputs, false)
                        .map_err(|e| DataError::Tokenizer {
                            reason: one_line(&e.to_string()),
                        })?;
                Ok(encodings.iter().map(|e| e.get_ids().to_vec()).collect())
            }
        }
    }

    /// Decodes ids to text. Byte sequences that are not valid UTF-8 (a model may well produce
    /// them) become U+FFFD rather than an error.
    ///
    /// # Errors
    /// [`DataError::TokenOutOfRange`] for an id outside the vocabulary, [`DataError::Tokenizer`]
    /// when the HF decoder fails.
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(DataError::TokenOutOfRange {
                id,
                vocab_size: self.vocab_size,
            });
        }
        match &self.kind {
            Kind::Byte => {
                // In range was checked above, so every id fits a byte.
                let bytes: Vec<u8> = ids.iter().map(|&id| id as u8).collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Kind::Hf(hf) => hf.decode(ids, false).map_err(|e| DataError::Tokenizer {
                reason: one_line(&e.to_string()),
            }),
        }
    }

    /// Number of token ids, added and special tokens included: the model's vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// A short stable identifier stored in checkpoints and compared between parties: `byte`,
    /// or `hf-` and the first 16 hex digits of the BLAKE3 hash of the tokenizer's compact JSON
    /// (so reformatting a `tokenizer.json` does not change it).
    pub fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }

    /// The id that separates documents: byte 0 for the byte tokenizer; for an HF tokenizer the
    /// first of `<|endoftext|>`, `<|end_of_text|>`, `</s>`, `<eos>` in its vocabulary, if any.
    pub fn end_of_text(&self) -> Option<u32> {
        self.end_of_text
    }

    /// This tokenizer as a Hugging Face `tokenizer.json` that gives the same ids for every
    /// text: an HF tokenizer as loaded (truncation and padding off) without its
    /// post-processor, since iota adds no special tokens around a text; the byte tokenizer
    /// as a byte-level BPE without merges whose 256 tokens have the ids of their bytes.
    ///
    /// # Errors
    /// [`DataError::Tokenizer`] when the tokenizer cannot be serialized.
    pub fn hf_json(&self) -> Result<String, DataError> {
        let failed = |e: tokenizers::Error| DataError::Tokenizer {
            reason: one_line(&e.to_string()),
        };
        let mut hf = match &self.kind {
            Kind::Hf(hf) => hf.as_ref().clone(),
            Kind::Byte => {
                tokenizers::Tokenizer::from_bytes(byte_level_json().to_string()).map_err(failed)?
            }
        };
        hf.with_post_processor(None::<tokenizers::PostProcessorWrapper>);
        hf.to_string(true).map_err(failed)
    }

    /// Whether the Hugging Face form of this tokenizer ([`Self::hf_json`]) drops a
    /// post-processor the loaded `tokenizer.json` had (tokens it would add around a text).
    pub fn drops_post_processor(&self) -> bool {
        match &self.kind {
            Kind::Hf(hf) => hf.get_post_processor().is_some(),
            Kind::Byte => false,
        }
    }
}

/// The character the byte-level pre-tokenizer (GPT-2's) stands for `byte`: printable
/// Latin-1 characters stand for themselves, every other byte for a character from U+0100 on,
/// in byte order.
fn byte_char(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(byte) {
        return char::from(byte);
    }
    let shifted = (0..byte).filter(|&b| !printable(b)).count() as u32;
    char::from_u32(256 + shifted).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// The byte tokenizer as a Hugging Face `tokenizer.json`: a byte-level BPE without merges
/// whose token for byte `b` has id `b`, the text kept whole (no regex split: with no merges it
/// would change nothing) and decoded back byte for byte.
fn byte_level_json() -> serde_json::Value {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..=255u8)
        .map(|b| (byte_char(b).to_string(), serde_json::Value::from(b)))
        .collect();
    let byte_level = serde_json::json!({
        "type": "ByteLevel",
        "add_prefix_space": false,
        "trim_offsets": false,
        "use_regex": false
    });
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": []
        }
    })
}

/// Collapses a multi-line library message into one line.
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_round_trip_includes_non_ascii() {
        let tokenizer = Tokenizer::byte();
        let text = "héllo, wörld: 日本語 🦀\n";
        let ids = tokenizer.encode(text).unwrap();
        assert_eq!(ids.len(), text.len(), "one id per UTF-8 byte");
        assert_eq!(&ids[..2], &[104, 0xC3]);
        assert_eq!(tokenizer.decode(&ids).unwrap(), text);
    }

    #[test]
    fn byte_tokenizer_constants() {
        let tokenizer = Tokenizer::load(None).unwrap();
        assert!(tokenizer.is_byte());
        assert_eq!(tokenizer.vocab_size(), 256);
        assert_eq!(tokenizer.end_of_text(), Some(0));
        assert_eq!(tokenizer.fingerprint(), "byte");
        assert_eq!(
            format!("{tokenizer:?}"),
            "Tokenizer { fingerprint: \"byte\", vocab_size: 256, end_of_text: Some(0) }"
        );
    }

    #[test]
    fn byte_decode_rejects_out_of_range_and_tolerates_bad_utf8() {
        let tokenizer = Tokenizer::byte();
        let err = tokenizer.decode(&[65, 256]).unwrap_err();
        assert!(matches!(
            err,
            DataError::TokenOutOfRange {
                id: 256,
                vocab_size: 256
            }
        ));
        assert_eq!(tokenizer.decode(&[65, 0xFF]).unwrap(), "A\u{FFFD}");
    }

    #[test]
    fn the_hf_form_of_the_byte_tokenizer_gives_the_same_ids_and_text() {
        let byte = Tokenizer::byte();
        let json = byte.hf_json().unwrap();
        let hf = Tokenizer::from_hf(tokenizers::Tokenizer::from_bytes(json).unwrap()).unwrap();
        assert_eq!(hf.vocab_size(), 256);
        let every_char: String = (0..=0x2FFu32).filter_map(char::from_u32).collect();
        for text in [
            "the quick brown fox\n\n  jumps ",
            "héllo, wörld: 日本語 🦀\0end\r\n\t",
            "Ā ĉ Ġ Ċ",
            every_char.as_str(),
        ] {
            let ids = byte.encode(text).unwrap();
            assert_eq!(hf.encode(text).unwrap(), ids, "{text:?}");
            assert_eq!(hf.decode(&ids).unwrap(), text);
        }
        // A split character decodes to U+FFFD in both.
        assert_eq!(
            hf.decode(&[65, 0xC3]).unwrap(),
            byte.decode(&[65, 0xC3]).unwrap()
        );
        assert!(!byte.drops_post_processor());
    }

    #[test]
    fn missing_and_bad_tokenizer_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.json");
        assert!(matches!(
            Tokenizer::from_file(&missing),
            Err(DataError::NotFound { .. })
        ));
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{ not json").unwrap();
        let err = Tokenizer::from_file(&bad).unwrap_err();
        assert!(matches!(err, DataError::BadTokenizerFile { .. }));
        assert!(!err.to_string().contains('\n'));
    }
}
