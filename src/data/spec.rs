//! `DataSpec`: which data a run trains on, as written on a command line or in a config.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use super::DataError;
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
///   or a directory of them ([`LocalFiles`]).
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
        }
    }

    /// Opens the source the spec names.
    ///
    /// # Errors
    /// As [`LocalFiles::open`] for a path; [`DataError::NotFetched`] for remote shards (copy
    /// them to a local folder first); the synthetic source never fails.
    pub fn open(&self) -> Result<Box<dyn TextSource>, DataError> {
        match self {
            Self::Synthetic { seed, chars } => Ok(Box::new(SyntheticSource::new(*seed, *chars))),
            Self::Path { path, text_column } => Ok(Box::new(
                LocalFiles::open(path)?.with_text_column(text_column),
            )),
            Self::Remote { url, .. } => Err(DataError::NotFetched { url: url.clone() }),
        }
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
        }
    }
}

impl serde::Serialize for DataSpec {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DataSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
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
