//! `DataSpec`: which data a run trains on, as written on a command line or in a config.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use super::DataError;
use super::prepared::is_prepared;
use super::source::{DEFAULT_TEXT_COLUMN, LocalFiles, TextSource};
use super::synthetic::SyntheticSource;

/// Symbols the synthetic corpus generates when the spec does not say: 3 MB of text, generated
/// in well under a second.
pub const DEFAULT_SYNTHETIC_CHARS: usize = 3_000_000;

/// Which data to read.
///
/// # Format
/// - `synthetic`, `synthetic:SEED` or `synthetic:SEED:CHARS`: the built-in Markov corpus
///   (seed 0 and [`DEFAULT_SYNTHETIC_CHARS`] unless given);
/// - `s3://bucket/prefix`, `https://host/path` or `http://host/path`: remote shards
///   ([`DataSpec::Remote`]), which a command copies to a local folder before reading them
///   (`crate::mirror`);
/// - anything else: a path to a `.txt`, `.jsonl`, `.jsonl.gz`, `.jsonl.zst` or `.parquet` file
///   or a directory of them ([`LocalFiles`]);
/// - several of the last three, separated by commas (`shards/,s3://bucket/more`): read one
///   after the other in the order written ([`DataSpec::Several`]). The synthetic corpus
///   cannot be one of them, and a path holding a comma cannot be named this way.
///
/// [`Display`](fmt::Display) writes the same form back, and serde uses it too. The text
/// column of a path (the `.jsonl` field or `.parquet` column holding the text) is not part of
/// that form: a config key or flag sets it ([`DataSpec::with_text_column`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataSpec {
    /// The built-in synthetic corpus.
    Synthetic {
        /// Seed of the Markov table and the text.
        seed: u64,
        /// Number of characters (= byte tokens) generated.
        chars: usize,
    },
    /// Local files.
    Path {
        /// A file or a directory.
        path: PathBuf,
        /// The `.jsonl` field and `.parquet` column that holds a document's text
        /// ([`DEFAULT_TEXT_COLUMN`] unless set).
        text_column: String,
    },
    /// Shards somewhere else: every supported file under an S3 prefix, or one file at an
    /// HTTP(S) URL. They are read from a local copy ([`DataSpec::Path`] of the folder the
    /// copy is in), never directly: [`DataSpec::open`] refuses this variant.
    Remote {
        /// The URL as given.
        url: String,
        /// As for [`DataSpec::Path`].
        text_column: String,
    },
    /// Several paths or remote sources, read one after the other in this order (each one's
    /// files in its own path order), as one source.
    Several {
        /// The sources, each a [`DataSpec::Path`] or [`DataSpec::Remote`]; at least two.
        parts: Vec<DataSpec>,
    },
}

/// URL schemes read as [`DataSpec::Remote`].
const REMOTE_SCHEMES: [&str; 3] = ["s3://", "https://", "http://"];

impl Default for DataSpec {
    fn default() -> Self {
        Self::Synthetic {
            seed: 0,
            chars: DEFAULT_SYNTHETIC_CHARS,
        }
    }
}

impl DataSpec {
    /// Local files at `path`, text in [`DEFAULT_TEXT_COLUMN`].
    pub fn path(path: impl Into<PathBuf>) -> Self {
        Self::Path {
            path: path.into(),
            text_column: DEFAULT_TEXT_COLUMN.to_owned(),
        }
    }

    /// Reads the text of `.jsonl` and `.parquet` files from `column` when one is given (a
    /// config's `text_column`, a `--text-column` flag); `None` keeps the spec as it is.
    ///
    /// # Errors
    /// [`DataError::BadTextColumn`] for an empty name, or any column with the synthetic
    /// corpus (it has none; a column there is a mistake in the config, not a no-op).
    pub fn with_text_column(self, column: Option<&str>) -> Result<Self, DataError> {
        let Some(column) = column else {
            return Ok(self);
        };
        let bad = |reason: &str| DataError::BadTextColumn {
            column: column.to_owned(),
            reason: reason.to_owned(),
        };
        if column.is_empty() {
            return Err(bad("empty"));
        }
        match self {
            Self::Synthetic { .. } => Err(bad(
                "the synthetic corpus has no columns (a text column applies to .jsonl and \
                 .parquet files)",
            )),
            Self::Path { path, .. } => Ok(Self::Path {
                path,
                text_column: column.to_owned(),
            }),
            Self::Remote { url, .. } => Ok(Self::Remote {
                url,
                text_column: column.to_owned(),
            }),
            Self::Several { parts } => Ok(Self::Several {
                parts: parts
                    .into_iter()
                    .map(|part| part.with_text_column(Some(column)))
                    .collect::<Result<_, _>>()?,
            }),
        }
    }

    /// Whether any of the spec is remote (to be copied to a local folder before reading).
    pub fn is_remote(&self) -> bool {
        match self {
            Self::Remote { .. } => true,
            Self::Several { parts } => parts.iter().any(Self::is_remote),
            Self::Synthetic { .. } | Self::Path { .. } => false,
        }
    }

    /// The local files of a path or of several paths, with their text column; `None` for the
    /// synthetic corpus.
    ///
    /// # Errors
    /// As [`LocalFiles::open`] for each path (naming it); [`DataError::NotFetched`] for a
    /// remote source; [`DataError::BadSpec`] for a prepared directory among several sources
    /// (a prepared directory is read whole, on its own).
    pub fn local_files(&self) -> Result<Option<LocalFiles>, DataError> {
        let (paths, column) = match self {
            Self::Synthetic { .. } => return Ok(None),
            Self::Remote { url, .. } => return Err(DataError::NotFetched { url: url.clone() }),
            Self::Path { path, text_column } => (vec![path.clone()], text_column),
            Self::Several { parts } => {
                let mut paths = Vec::new();
                for part in parts {
                    match part {
                        Self::Path { path, .. } if is_prepared(path) => {
                            return Err(DataError::BadSpec {
                                spec: path.display().to_string(),
                                reason: "a prepared directory is read on its own, not with \
                                         other sources (prepare them together instead)"
                                    .to_owned(),
                            });
                        }
                        Self::Path { path, .. } => paths.push(path.clone()),
                        other => return other.local_files(),
                    }
                }
                let column = match &parts[..] {
                    [Self::Path { text_column, .. }, ..] => text_column.clone(),
                    _ => DEFAULT_TEXT_COLUMN.to_owned(),
                };
                return Ok(Some(
                    LocalFiles::open_all(&paths)?.with_text_column(&column),
                ));
            }
        };
        Ok(Some(LocalFiles::open(&paths[0])?.with_text_column(column)))
    }

    /// Opens the source the spec names.
    ///
    /// # Errors
    /// As [`Self::local_files`]; the synthetic source never fails.
    pub fn open(&self) -> Result<Box<dyn TextSource>, DataError> {
        if let Self::Synthetic { seed, chars } = self {
            return Ok(Box::new(SyntheticSource::new(*seed, *chars)));
        }
        match self.local_files()? {
            Some(files) => Ok(Box::new(files)),
            // Only the synthetic corpus has no files.
            None => Err(DataError::NoDocuments {
                source_name: self.to_string(),
            }),
        }
    }
}

/// Parses one source of a comma-separated list `whole`.
fn parse_part(part: &str, whole: &str) -> Result<DataSpec, DataError> {
    let part = part.trim();
    if part.is_empty() {
        return Err(DataError::BadSpec {
            spec: whole.to_owned(),
            reason: "an empty source between commas".to_owned(),
        });
    }
    match part.parse()? {
        DataSpec::Synthetic { .. } => Err(DataError::BadSpec {
            spec: part.to_owned(),
            reason: "the synthetic corpus cannot be read with other sources".to_owned(),
        }),
        spec => Ok(spec),
    }
}

impl FromStr for DataSpec {
    type Err = DataError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| DataError::BadSpec {
            spec: s.to_owned(),
            reason: reason.to_owned(),
        };
        if s.is_empty() {
            return Err(bad("empty"));
        }
        if s.contains(',') {
            let parts = s
                .split(',')
                .map(|part| parse_part(part, s))
                .collect::<Result<_, _>>()?;
            return Ok(Self::Several { parts });
        }
        if let Some(scheme) = REMOTE_SCHEMES.iter().find(|scheme| s.starts_with(*scheme)) {
            if s.len() == scheme.len() {
                return Err(bad("no bucket or host after the scheme"));
            }
            return Ok(Self::Remote {
                url: s.to_owned(),
                text_column: DEFAULT_TEXT_COLUMN.to_owned(),
            });
        }
        let Some(rest) = s.strip_prefix("synthetic") else {
            return Ok(Self::path(s));
        };
        let mut spec = Self::default();
        if rest.is_empty() {
            return Ok(spec);
        }
        let Some(args) = rest.strip_prefix(':') else {
            // e.g. a file called "synthetic.txt".
            return Ok(Self::path(s));
        };
        let mut parts = args.split(':');
        if let (Self::Synthetic { seed, chars }, Some(first)) = (&mut spec, parts.next()) {
            *seed = first
                .parse()
                .map_err(|_| bad("the seed after `synthetic:` must be an unsigned integer"))?;
            if let Some(second) = parts.next() {
                *chars = second
                    .parse()
                    .map_err(|_| bad("the character count must be an unsigned integer"))?;
            }
        }
        if parts.next().is_some() {
            return Err(bad(
                "expected synthetic, synthetic:SEED or synthetic:SEED:CHARS",
            ));
        }
        Ok(spec)
    }
}

impl fmt::Display for DataSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Synthetic { seed, chars } => write!(f, "synthetic:{seed}:{chars}"),
            Self::Path { path, .. } => write!(f, "{}", path.display()),
            Self::Remote { url, .. } => f.write_str(url),
            Self::Several { parts } => {
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{part}")?;
                }
                Ok(())
            }
        }
    }
}

impl serde::Serialize for DataSpec {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DataSpec {
    /// A string ([`FromStr`]), or a list of strings read as one comma-separated string.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        let s = match OneOrMany::deserialize(deserializer)? {
            OneOrMany::One(s) => s,
            OneOrMany::Many(parts) => parts.join(","),
        };
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_synthetic_forms_and_paths() {
        assert_eq!(
            "synthetic".parse::<DataSpec>().unwrap(),
            DataSpec::Synthetic {
                seed: 0,
                chars: DEFAULT_SYNTHETIC_CHARS
            }
        );
        assert_eq!(
            "synthetic:5".parse::<DataSpec>().unwrap(),
            DataSpec::Synthetic {
                seed: 5,
                chars: DEFAULT_SYNTHETIC_CHARS
            }
        );
        assert_eq!(
            "synthetic:5:1000".parse::<DataSpec>().unwrap(),
            DataSpec::Synthetic {
                seed: 5,
                chars: 1000
            }
        );
        assert_eq!(
            "data/shakespeare".parse::<DataSpec>().unwrap(),
            DataSpec::path("data/shakespeare")
        );
        assert_eq!(
            "synthetic.txt".parse::<DataSpec>().unwrap(),
            DataSpec::path("synthetic.txt")
        );
    }

    #[test]
    fn rejects_malformed_synthetic_specs() {
        for bad in [
            "",
            "synthetic:x",
            "synthetic:1:y",
            "synthetic:1:2:3",
            "synthetic:-1",
            "s3://",
            "https://",
        ] {
            let err = bad.parse::<DataSpec>().unwrap_err();
            assert!(matches!(err, DataError::BadSpec { .. }), "{bad}");
        }
    }

    #[test]
    fn display_and_serde_round_trip() {
        for spec in [
            DataSpec::Synthetic { seed: 9, chars: 77 },
            DataSpec::path("/tmp/corpus"),
            DataSpec::Remote {
                url: "s3://bucket/fineweb/sample".into(),
                text_column: DEFAULT_TEXT_COLUMN.into(),
            },
        ] {
            assert_eq!(spec.to_string().parse::<DataSpec>().unwrap(), spec);
            let json = serde_json::to_string(&spec).unwrap();
            assert_eq!(serde_json::from_str::<DataSpec>(&json).unwrap(), spec);
        }
        assert_eq!(DataSpec::default().to_string(), "synthetic:0:3000000");
    }

    #[test]
    fn several_sources_parse_in_order_and_refuse_bad_parts_by_name() {
        let spec: DataSpec = "a/shards, s3://bucket/more ,https://host/x.parquet"
            .parse()
            .unwrap();
        let DataSpec::Several { parts } = &spec else {
            panic!("{spec:?}")
        };
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0], DataSpec::path("a/shards"));
        assert!(matches!(&parts[1], DataSpec::Remote { url, .. } if url == "s3://bucket/more"));
        assert!(spec.is_remote() && !DataSpec::path("x").is_remote());
        assert_eq!(
            spec.to_string(),
            "a/shards,s3://bucket/more,https://host/x.parquet"
        );
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<DataSpec>(&json).unwrap(), spec);
        // A YAML list is the same sources.
        let listed: DataSpec =
            serde_norway::from_str("[a/shards, s3://bucket/more, https://host/x.parquet]").unwrap();
        assert_eq!(listed, spec);
        let column = spec.clone().with_text_column(Some("body")).unwrap();
        let DataSpec::Several { parts } = &column else {
            panic!()
        };
        assert!(parts.iter().all(|p| matches!(p,
            DataSpec::Path { text_column, .. } | DataSpec::Remote { text_column, .. }
                if text_column == "body")));
        for (bad, named) in [
            ("a,,b", "a,,b"),
            ("a,", "a,"),
            ("a,synthetic:3", "synthetic:3"),
            ("a,s3://", "s3://"),
        ] {
            let err = bad.parse::<DataSpec>().unwrap_err();
            assert!(
                matches!(&err, DataError::BadSpec { spec, .. } if spec == named),
                "{bad}: {err}"
            );
            assert!(!err.to_string().contains('\n'));
        }
    }

    #[test]
    fn several_paths_read_one_after_the_other_and_name_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        for (rel, text) in [("b/1.txt", "B1"), ("b/2.txt", "B2"), ("a/1.txt", "A1")] {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let spec: DataSpec = format!("{},{}", b.display(), a.display()).parse().unwrap();
        let docs: Vec<String> = spec
            .open()
            .unwrap()
            .documents()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(docs, ["B1", "B2", "A1"]);
        let files = spec.local_files().unwrap().unwrap();
        assert_eq!(files.name_of(&a.join("1.txt")), "1:1.txt");
        assert_eq!(files.name_of(&b.join("2.txt")), "0:2.txt");
        assert!(files.describe().contains(" + "), "{}", files.describe());

        let missing = dir.path().join("nowhere");
        let spec: DataSpec = format!("{},{}", a.display(), missing.display())
            .parse()
            .unwrap();
        let err = spec.open().err().unwrap().to_string();
        assert!(err.contains("nowhere") && !err.contains('\n'), "{err}");
        let remote: DataSpec = format!("{},s3://bucket/x", a.display()).parse().unwrap();
        let err = remote.open().err().unwrap();
        assert!(matches!(err, DataError::NotFetched { .. }), "{err}");
    }

    #[test]
    fn text_column_is_set_apart_from_the_string_form() {
        let spec = DataSpec::path("shards")
            .with_text_column(Some("content"))
            .unwrap();
        assert_eq!(
            spec,
            DataSpec::Path {
                path: PathBuf::from("shards"),
                text_column: "content".to_owned()
            }
        );
        assert_eq!(spec.to_string(), "shards");
        assert_eq!(
            DataSpec::path("x").with_text_column(None).unwrap(),
            DataSpec::path("x")
        );
        for (spec, column) in [(DataSpec::default(), "content"), (DataSpec::path("x"), "")] {
            let err = spec.with_text_column(Some(column)).unwrap_err();
            assert!(matches!(err, DataError::BadTextColumn { .. }), "{err}");
        }
    }
}
