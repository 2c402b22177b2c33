//! JSON-lines files, plain or compressed (`.jsonl`, `.jsonl.gz`, `.jsonl.zst`), streamed one
//! line at a time: each non-blank line is a JSON object whose string field (the text column,
//! `text` unless configured) is one document.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use super::DataError;

/// How a JSON-lines file is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Compression {
    /// Plain text.
    None,
    /// gzip; concatenated members are read one after the other, as `gzip -d` does.
    Gzip,
    /// Zstandard; concatenated frames are read one after the other, as `zstd -d` does.
    Zstd,
}

/// Opens `path` as a buffered stream of decompressed bytes.
fn open(path: &Path, compression: Compression) -> Result<Box<dyn BufRead + Send>, DataError> {
    let file = File::open(path).map_err(|error| DataError::io(path, error))?;
    let reader: Box<dyn Read + Send> = match compression {
        Compression::None => Box::new(file),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(BufReader::new(file))),
        Compression::Zstd => {
            Box::new(zstd::stream::read::Decoder::new(file).map_err(|e| DataError::io(path, e))?)
        }
    };
    Ok(Box::new(BufReader::new(reader)))
}

/// The documents of one JSON-lines file, read lazily. The first error (an unreadable or
/// corrupt file, a line that is not UTF-8 or not an object with the field) ends the stream.
pub(super) struct JsonLines {
    /// The file (for messages).
    path: PathBuf,
    /// The field holding the text.
    field: String,
    /// The decompressed bytes.
    reader: Box<dyn BufRead + Send>,
    /// 1-based number of the last line read.
    line: usize,
    /// Decompressed bytes before the next line.
    offset: usize,
    /// The current line's bytes.
    buffer: Vec<u8>,
    /// An error was reported, or the file ended.
    done: bool,
}

impl JsonLines {
    /// Opens the file at `path`; `field` names the text field.
    ///
    /// # Errors
    /// [`DataError::NotFound`] or [`DataError::Unreadable`] when the file cannot be opened (or
    /// a zstd decoder not made).
    pub(super) fn open(
        path: &Path,
        compression: Compression,
        field: &str,
    ) -> Result<Self, DataError> {
        Ok(Self {
            path: path.to_path_buf(),
            field: field.to_owned(),
            reader: open(path, compression)?,
            line: 0,
            offset: 0,
            buffer: Vec::new(),
            done: false,
        })
    }

    /// Reads the next non-blank line's document; `None` at the end of the file.
    fn next_document(&mut self) -> Option<Result<String, DataError>> {
        loop {
            self.buffer.clear();
            let read = match self.reader.read_until(b'\n', &mut self.buffer) {
                Ok(0) => return None,
                Ok(read) => read,
                Err(error) => return Some(Err(DataError::io(&self.path, error))),
            };
            let start = self.offset;
            self.offset += read;
            self.line += 1;
            let bytes = self.buffer.strip_suffix(b"\n").unwrap_or(&self.buffer);
            let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
            let line = match std::str::from_utf8(bytes) {
                Ok(line) => line,
                Err(e) => {
                    return Some(Err(DataError::NotUtf8 {
                        path: self.path.clone(),
                        offset: start + e.valid_up_to(),
                    }));
                }
            };
            if line.trim().is_empty() {
                continue;
            }
            return Some(
                parse_line(line, &self.field).map_err(|reason| DataError::BadJsonLine {
                    path: self.path.clone(),
                    line: self.line,
                    reason,
                }),
            );
        }
    }
}

impl Iterator for JsonLines {
    type Item = Result<String, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.next_document();
        self.done = !matches!(next, Some(Ok(_)));
        next
    }
}

/// The string field `field` of one JSON-lines record, or why there is none.
fn parse_line(line: &str, field: &str) -> Result<String, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let serde_json::Value::Object(mut object) = value else {
        return Err(format!(
            "expected a JSON object with a string field {field:?}"
        ));
    };
    match object.remove(field) {
        Some(serde_json::Value::String(text)) => Ok(text),
        Some(_) => Err(format!("field {field:?} is not a string")),
        None => Err(format!("no field {field:?}")),
    }
}
