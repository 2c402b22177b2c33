//! Text sources: where documents come from. Local files and directories live here (this file
//! lists them and dispatches each to its reader: `jsonl.rs` for `.jsonl`, `.jsonl.gz` and
//! `.jsonl.zst`, `parquet.rs` for `.parquet`); the synthetic corpus is in `synthetic.rs`.
//! Remote shards are copied to a local folder (`crate::mirror`) and read from there.

use std::path::{Path, PathBuf};

use super::DataError;
use super::jsonl::{Compression, JsonLines};
use super::parquet::ParquetRows;

/// The field of a `.jsonl` record, and the column of a `.parquet` row, that holds a
/// document's text unless another is configured.
pub const DEFAULT_TEXT_COLUMN: &str = "text";

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

/// Local files: one supported file, or a directory searched recursively for them.
///
/// # Format
/// - `.txt`: the whole file is one document (UTF-8).
/// - `.jsonl`, `.jsonl.gz`, `.jsonl.zst`: one JSON object per line, its string field named by
///   the text column (`text` unless [`LocalFiles::with_text_column`] says otherwise) is one
///   document; blank lines are skipped; any other line is an error naming the file and line.
///   Compressed files are decompressed as they are read (gzip members or zstd frames that
///   follow each other are read as one stream).
/// - `.parquet`: one document per row, from the text column, which must hold strings (Parquet
///   `BYTE_ARRAY` annotated `STRING`/`UTF8`, not repeated); null values are skipped. Shards
///   are read row group by row group, a batch of rows at a time.
/// - A directory: every such file below it, sorted by path (byte order) so the order does not
///   depend on the file system; documents come in that order, then in line or row order;
///   other files are ignored, and symbolic links to directories are not followed (they could
///   loop).
#[derive(Clone, Debug)]
pub struct LocalFiles {
    /// The paths as given (for messages), one unless several sources were named.
    roots: Vec<PathBuf>,
    /// The files to read, in order.
    files: Vec<PathBuf>,
    /// The JSON field / Parquet column holding the text.
    text_column: String,
}

/// How one file is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileKind {
    /// `.txt`: one document.
    Text,
    /// `.jsonl`, maybe compressed.
    JsonLines(Compression),
    /// `.parquet`.
    Parquet,
}

impl FileKind {
    /// The name endings read, and how.
    const ENDINGS: [(&'static str, Self); 5] = [
        (".txt", Self::Text),
        (".jsonl", Self::JsonLines(Compression::None)),
        (".jsonl.gz", Self::JsonLines(Compression::Gzip)),
        (".jsonl.zst", Self::JsonLines(Compression::Zstd)),
        (".parquet", Self::Parquet),
    ];

    /// The kind for a path's name, if it is one we read (a name that is only the ending, such
    /// as `.txt`, is a hidden file without an extension and is not read).
    fn of(path: &Path) -> Option<Self> {
        let name = path.file_name()?.as_encoded_bytes();
        Self::ENDINGS
            .iter()
            .find(|(ending, _)| name.len() > ending.len() && name.ends_with(ending.as_bytes()))
            .map(|(_, kind)| *kind)
    }
}

impl LocalFiles {
    /// Lists the files under `path` (or the file itself); the text column is
    /// [`DEFAULT_TEXT_COLUMN`].
    ///
    /// # Errors
    /// [`DataError::NotFound`] for a missing path, [`DataError::Unreadable`] for a directory
    /// that cannot be listed, [`DataError::UnsupportedFile`] for an explicit file of a type
    /// not read, [`DataError::NoDocuments`] for a directory without such files.
    pub fn open(path: &Path) -> Result<Self, DataError> {
        let metadata = std::fs::metadata(path).map_err(|error| DataError::io(path, error))?;
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
            roots: vec![path.to_path_buf()],
            files,
            text_column: DEFAULT_TEXT_COLUMN.to_owned(),
        })
    }

    /// The files of several paths, one path after the other in the order given (each one's
    /// files in its own path order, as [`Self::open`] lists them).
    ///
    /// # Errors
    /// As [`Self::open`], for the first path that fails (the error names it);
    /// [`DataError::NoDocuments`] for no path at all.
    pub fn open_all(paths: &[PathBuf]) -> Result<Self, DataError> {
        let mut all = Self {
            roots: Vec::new(),
            files: Vec::new(),
            text_column: DEFAULT_TEXT_COLUMN.to_owned(),
        };
        for path in paths {
            let one = Self::open(path)?;
            all.roots.extend(one.roots);
            all.files.extend(one.files);
        }
        if all.files.is_empty() {
            return Err(DataError::NoDocuments {
                source_name: "no source".to_owned(),
            });
        }
        Ok(all)
    }

    /// Reads the text from `column` (a `.jsonl` field, a `.parquet` column) instead of
    /// [`DEFAULT_TEXT_COLUMN`].
    #[must_use]
    pub fn with_text_column(mut self, column: &str) -> Self {
        column.clone_into(&mut self.text_column);
        self
    }

    /// The files that will be read, in reading order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The path the files were listed from, as given (the first, for several).
    pub fn root(&self) -> &Path {
        &self.roots[0]
    }

    /// The name of `path`, one of the files, for manifests and fingerprints: relative to the
    /// path it was listed from (its file name when that path is the file itself), after that
    /// path's position and a colon when several were named (`1:more/002.parquet`).
    pub fn name_of(&self, path: &Path) -> String {
        let found = self
            .roots
            .iter()
            .enumerate()
            .find_map(|(i, root)| Some((i, path.strip_prefix(root).ok()?)));
        let rel = found
            .map(|(_, rel)| rel)
            .filter(|rel| !rel.as_os_str().is_empty())
            .or_else(|| path.file_name().map(Path::new))
            .unwrap_or(path);
        let rel = rel.to_string_lossy();
        match found {
            Some((i, _)) if self.roots.len() > 1 => format!("{i}:{rel}"),
            _ => rel.into_owned(),
        }
    }

    /// The `.jsonl` field / `.parquet` column read.
    pub fn text_column(&self) -> &str {
        &self.text_column
    }
}

impl TextSource for LocalFiles {
    fn describe(&self) -> String {
        let roots: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
        let (root, files) = (roots.join(" + "), self.files.len());
        if self.text_column == DEFAULT_TEXT_COLUMN {
            format!("{root} ({files} files)")
        } else {
            format!("{root} ({files} files, text column {:?})", self.text_column)
        }
    }

    fn documents(&self) -> Documents<'_> {
        Box::new(
            self.files
                .iter()
                .flat_map(|path| file_documents(path, &self.text_column)),
        )
    }
}

/// Appends every file of a kind we read below `dir` to `out`, recursing into subdirectories.
fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), DataError> {
    let entries = std::fs::read_dir(dir).map_err(|error| DataError::io(dir, error))?;
    for entry in entries {
        let entry = entry.map_err(|error| DataError::io(dir, error))?;
        let path = entry.path();
        let file_type = entry
            .file_type()
            .map_err(|error| DataError::io(&path, error))?;
        if file_type.is_dir() {
            collect_files(&path, out)?;
        } else if FileKind::of(&path).is_some() && !path_is_dir_link(&path, file_type) {
            out.push(path);
        }
    }
    Ok(())
}

/// Whether a file called `name` is one that [`LocalFiles`] reads (`.txt`, `.jsonl`,
/// `.jsonl.gz`, `.jsonl.zst`, `.parquet`).
pub fn is_data_file(name: &str) -> bool {
    FileKind::of(Path::new(name)).is_some()
}

/// Whether a symbolic link points at a directory (those are skipped).
fn path_is_dir_link(path: &Path, file_type: std::fs::FileType) -> bool {
    file_type.is_symlink() && path.is_dir()
}

/// The documents of one file, by its kind; `column` names the text field or column.
fn file_documents(path: &Path, column: &str) -> Documents<'static> {
    match FileKind::of(path) {
        Some(FileKind::JsonLines(compression)) => {
            match JsonLines::open(path, compression, column) {
                Ok(lines) => Box::new(lines),
                Err(e) => Box::new(std::iter::once(Err(e))),
            }
        }
        Some(FileKind::Parquet) => Box::new(ParquetRows::new(path, column)),
        Some(FileKind::Text) | None => Box::new(std::iter::once(read_text(path))),
    }
}

/// A whole `.txt` file as one document.
fn read_text(path: &Path) -> Result<String, DataError> {
    let bytes = std::fs::read(path).map_err(|error| DataError::io(path, error))?;
    String::from_utf8(bytes).map_err(|e| DataError::NotUtf8 {
        path: path.to_path_buf(),
        offset: e.utf8_error().valid_up_to(),
    })
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
    fn file_kinds_come_from_the_name_ending() {
        let kind = |name: &str| FileKind::of(Path::new(name));
        assert_eq!(kind("a/b.txt"), Some(FileKind::Text));
        assert_eq!(
            kind("x.jsonl"),
            Some(FileKind::JsonLines(Compression::None))
        );
        assert_eq!(
            kind("x.y.jsonl.gz"),
            Some(FileKind::JsonLines(Compression::Gzip))
        );
        assert_eq!(
            kind("x.jsonl.zst"),
            Some(FileKind::JsonLines(Compression::Zstd))
        );
        assert_eq!(
            kind("train-00001-of-00099.parquet"),
            Some(FileKind::Parquet)
        );
        for other in [
            ".txt", ".parquet", "x.txt.gz", "x.gz", "x.zst", "x.json", "parquet",
        ] {
            assert_eq!(kind(other), None, "{other}");
        }
    }

    #[test]
    fn jsonl_text_column_renames_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        std::fs::write(
            &path,
            "{\"body\": \"one\", \"text\": 1}\r\n{\"body\": \"two\"}",
        )
        .unwrap();
        let source = LocalFiles::open(&path).unwrap().with_text_column("body");
        assert_eq!(all_docs(&source).unwrap(), vec!["one", "two"]);
        assert!(source.describe().contains("text column \"body\""));
        let err = all_docs(&LocalFiles::open(&path).unwrap()).unwrap_err();
        assert!(
            err.to_string().contains("field \"text\" is not a string"),
            "{err}"
        );
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
