//! Text sources: where documents come from. Local `.txt`/`.jsonl` files and directories live
//! here; the synthetic corpus is in `synthetic.rs`. Object-store readers will implement the
//! same trait.

use std::path::{Path, PathBuf};

use super::DataError;

/// A boxed stream of documents, each a `Result` so a bad file stops the stream with a clear error.
pub type Documents<'a> = Box<dyn Iterator<Item = Result<String, DataError>> + Send + 'a>;

/// A source of text documents, read in a fixed order.
///
/// The order must be deterministic: every party packs the documents into the same token
/// stream and so derives the same sample windows.
pub trait TextSource: Send + Sync {
    /// One line naming the source, for logs and error messages.
    fn describe(&self) -> String;

    /// The documents, in order. Reading may be lazy; an error ends the useful stream.
    fn documents(&self) -> Documents<'_>;
}

/// Local files: one `.txt` or `.jsonl` file, or a directory searched recursively for them.
///
/// # Format
/// - `.txt`: the whole file is one document (UTF-8).
/// - `.jsonl`: one JSON object per line, its string field `text` is one document; blank lines
///   are skipped; any other line is an error naming the file and line.
/// - A directory: every `.txt`/`.jsonl` file below it, sorted by path (byte order) so the
///   order does not depend on the file system; other files are ignored, and symbolic links to
///   directories are not followed (they could loop).
#[derive(Clone, Debug)]
pub struct LocalFiles {
    /// The path as given (for messages).
    root: PathBuf,
    /// The files to read, in order.
    files: Vec<PathBuf>,
}

/// How one file is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileKind {
    Text,
    JsonLines,
}

impl FileKind {
    /// The kind for a path's extension, if it is one we read.
    fn of(path: &Path) -> Option<Self> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("txt") => Some(Self::Text),
            Some("jsonl") => Some(Self::JsonLines),
            _ => None,
        }
    }
}

impl LocalFiles {
    /// Lists the files under `path` (or the file itself).
    ///
    /// # Errors
    /// [`DataError::NotFound`] for a missing path, [`DataError::Unreadable`] for a directory
    /// that cannot be listed, [`DataError::UnsupportedFile`] for an explicit file that is not
    /// `.txt`/`.jsonl`, [`DataError::NoDocuments`] for a directory without such files.
    pub fn open(path: &Path) -> Result<Self, DataError> {
        let metadata = std::fs::metadata(path).map_err(|error| io_error(path, error))?;
        let files = if metadata.is_dir() {
            let mut files = Vec::new();
            collect_files(path, &mut files)?;
            files.sort();
            if files.is_empty() {
                return Err(DataError::NoDocuments {
                    source_name: path.display().to_string(),
                });
            }
            files
        } else if FileKind::of(path).is_some() {
            vec![path.to_path_buf()]
        } else {
            return Err(DataError::UnsupportedFile {
                path: path.to_path_buf(),
            });
        };
        Ok(Self {
            root: path.to_path_buf(),
            files,
        })
    }

    /// The files that will be read, in reading order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }
}

impl TextSource for LocalFiles {
    fn describe(&self) -> String {
        format!("{} ({} files)", self.root.display(), self.files.len())
    }

    fn documents(&self) -> Documents<'_> {
        Box::new(
            self.files
                .iter()
                .flat_map(|path| match read_file_documents(path) {
                    Ok(docs) => docs,
                    Err(e) => vec![Err(e)],
                }),
        )
    }
}

/// Appends every `.txt`/`.jsonl` file below `dir` to `out`, recursing into subdirectories.
fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), DataError> {
    let entries = std::fs::read_dir(dir).map_err(|error| io_error(dir, error))?;
    for entry in entries {
        let entry = entry.map_err(|error| io_error(dir, error))?;
        let path = entry.path();
        let file_type = entry.file_type().map_err(|error| io_error(&path, error))?;
        if file_type.is_dir() {
            collect_files(&path, out)?;
        } else if FileKind::of(&path).is_some() && !path_is_dir_link(&path, file_type) {
            out.push(path);
        }
    }
    Ok(())
}

/// Whether a symbolic link points at a directory (those are skipped).
fn path_is_dir_link(path: &Path, file_type: std::fs::FileType) -> bool {
    file_type.is_symlink() && path.is_dir()
}

/// Reads one file into its documents. A `.jsonl` file yields one entry per non-blank line,
/// and stops at the first bad line (which is the last entry, an error).
fn read_file_documents(path: &Path) -> Result<Vec<Result<String, DataError>>, DataError> {
    let bytes = std::fs::read(path).map_err(|error| io_error(path, error))?;
    let text = String::from_utf8(bytes).map_err(|e| DataError::NotUtf8 {
        path: path.to_path_buf(),
        offset: e.utf8_error().valid_up_to(),
    })?;
    match FileKind::of(path) {
        Some(FileKind::Text) | None => Ok(vec![Ok(text)]),
        Some(FileKind::JsonLines) => {
            let mut docs = Vec::new();
            for (index, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let doc = parse_jsonl_line(line).map_err(|reason| DataError::BadJsonLine {
                    path: path.to_path_buf(),
                    line: index + 1,
                    reason,
                });
                let failed = doc.is_err();
                docs.push(doc);
                if failed {
                    break;
                }
            }
            Ok(docs)
        }
    }
}

/// The `text` field of one JSON-lines record, or why there is none.
fn parse_jsonl_line(line: &str) -> Result<String, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let serde_json::Value::Object(mut object) = value else {
        return Err("expected a JSON object with a string field \"text\"".to_owned());
    };
    match object.remove("text") {
        Some(serde_json::Value::String(text)) => Ok(text),
        Some(_) => Err("field \"text\" is not a string".to_owned()),
        None => Err("no field \"text\"".to_owned()),
    }
}

/// Maps an I/O error on `path` to [`DataError::NotFound`] or [`DataError::Unreadable`].
pub(crate) fn io_error(path: &Path, error: std::io::Error) -> DataError {
    if error.kind() == std::io::ErrorKind::NotFound {
        DataError::NotFound {
            path: path.to_path_buf(),
        }
    } else {
        DataError::Unreadable {
            path: path.to_path_buf(),
            error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_docs(source: &dyn TextSource) -> Result<Vec<String>, DataError> {
        source.documents().collect()
    }

    #[test]
    fn txt_file_is_one_document() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        std::fs::write(&path, "line one\nline two\n").unwrap();
        let source = LocalFiles::open(&path).unwrap();
        assert_eq!(all_docs(&source).unwrap(), vec!["line one\nline two\n"]);
    }

    #[test]
    fn jsonl_reads_text_fields_and_skips_blank_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        std::fs::write(
            &path,
            "{\"text\": \"first\", \"id\": 1}\n\n{\"text\": \"sécond\\nline\"}\n",
        )
        .unwrap();
        let source = LocalFiles::open(&path).unwrap();
        assert_eq!(all_docs(&source).unwrap(), vec!["first", "sécond\nline"]);
    }

    #[test]
    fn malformed_jsonl_lines_name_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            (
                "{\"text\": \"ok\"}\n{\"txt\": \"x\"}\n",
                2,
                "no field \"text\"",
            ),
            ("{\"text\": 3}\n", 1, "not a string"),
            (
                "{\"text\": \"ok\"}\n\n[1, 2]\n",
                3,
                "expected a JSON object",
            ),
            ("{\"text\": \"ok\"}\n{broken\n", 2, "invalid JSON"),
        ];
        for (i, (content, line, needle)) in cases.into_iter().enumerate() {
            let path = dir.path().join(format!("bad{i}.jsonl"));
            std::fs::write(&path, content).unwrap();
            let source = LocalFiles::open(&path).unwrap();
            let err = all_docs(&source).unwrap_err();
            let message = err.to_string();
            assert!(
                matches!(&err, DataError::BadJsonLine { line: l, .. } if *l == line),
                "{message}"
            );
            assert!(
                message.contains(&format!("bad{i}.jsonl:{line}:")),
                "{message}"
            );
            assert!(message.contains(needle), "{message}");
            assert!(!message.contains('\n'));
        }
    }

    #[test]
    fn directory_is_read_recursively_in_path_order() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("b/inner")).unwrap();
        std::fs::create_dir_all(root.join("a")).unwrap();
        // Written out of order on purpose.
        std::fs::write(root.join("z.txt"), "Z").unwrap();
        std::fs::write(
            root.join("b/inner/y.jsonl"),
            "{\"text\":\"Y1\"}\n{\"text\":\"Y2\"}",
        )
        .unwrap();
        std::fs::write(root.join("a/x.txt"), "X").unwrap();
        std::fs::write(root.join("b/2.txt"), "B2").unwrap();
        std::fs::write(root.join("b/10.txt"), "B10").unwrap();
        std::fs::write(root.join("README.md"), "ignored").unwrap();
        let source = LocalFiles::open(root).unwrap();
        assert_eq!(source.files().len(), 5);
        // Byte order of paths: "10.txt" < "2.txt" < "inner".
        assert_eq!(
            all_docs(&source).unwrap(),
            vec!["X", "B10", "B2", "Y1", "Y2", "Z"]
        );
        assert!(source.describe().contains("5 files"));
    }

    #[test]
    fn missing_unsupported_empty_and_non_utf8_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            LocalFiles::open(&dir.path().join("missing")),
            Err(DataError::NotFound { .. })
        ));
        let md = dir.path().join("notes.md");
        std::fs::write(&md, "x").unwrap();
        assert!(matches!(
            LocalFiles::open(&md),
            Err(DataError::UnsupportedFile { .. })
        ));
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(matches!(
            LocalFiles::open(&empty),
            Err(DataError::NoDocuments { .. })
        ));
        let latin1 = dir.path().join("latin1.txt");
        std::fs::write(&latin1, b"ab\xE9").unwrap();
        let source = LocalFiles::open(&latin1).unwrap();
        assert!(matches!(
            all_docs(&source),
            Err(DataError::NotUtf8 { offset: 2, .. })
        ));
    }
}
