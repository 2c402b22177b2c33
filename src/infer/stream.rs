//! [`TextStream`]: turns generated token ids into text as they come. A token may end in the
//! middle of a character (the byte tokenizer's multi-byte UTF-8), so text that still ends in
//! an incomplete character is held back until the next token completes it, or until the end.

use super::InferError;
use crate::data::Tokenizer;

/// Generated ids and the part of their text already handed out.
#[derive(Debug)]
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<u32>,
    /// Bytes of the decoded text already returned.
    emitted: usize,
}

impl<'a> TextStream<'a> {
    /// An empty stream decoding with `tokenizer`.
    pub fn new(tokenizer: &'a Tokenizer) -> Self {
        Self {
            tokenizer,
            ids: Vec::new(),
            emitted: 0,
        }
    }

    /// Adds one id and returns the text that became printable (maybe empty).
    ///
    /// # Errors
    /// An id the tokenizer cannot decode.
    pub fn push(&mut self, id: u32) -> Result<String, InferError> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids)?;
        // U+FFFD at the end may be a character whose last bytes are still to come.
        let stable = text.trim_end_matches('\u{FFFD}');
        Ok(self.take(stable))
    }

    /// The text not yet returned, incomplete characters included (as U+FFFD).
    ///
    /// # Errors
    /// An id the tokenizer cannot decode.
    pub fn finish(&mut self) -> Result<String, InferError> {
        let text = self.tokenizer.decode(&self.ids)?;
        Ok(self.take(&text))
    }

    fn take(&mut self, text: &str) -> String {
        if text.len() <= self.emitted || !text.is_char_boundary(self.emitted) {
            return String::new();
        }
        let new = text[self.emitted..].to_string();
        self.emitted = text.len();
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_over_tokens_comes_out_whole() {
        let tok = Tokenizer::byte();
        let mut s = TextStream::new(&tok);
        let bytes = "aé€".as_bytes();
        let out: Vec<String> = bytes
            .iter()
            .map(|&b| s.push(u32::from(b)).unwrap())
            .collect();
        assert_eq!(out, ["a", "", "é", "", "", "€"]);
        assert_eq!(s.finish().unwrap(), "");
    }

    #[test]
    fn an_unfinished_character_is_flushed_at_the_end() {
        let tok = Tokenizer::byte();
        let mut s = TextStream::new(&tok);
        assert_eq!(s.push(u32::from(b'x')).unwrap(), "x");
        assert_eq!(s.push(0xE2).unwrap(), "");
        assert_eq!(s.finish().unwrap(), "\u{FFFD}");
    }
}
