//! Object keys that are safe by construction.
//!
//! Every object iota stores lives under one layout, versioned by run and epoch:
//!
//! ```text
//! runs/{run}/activations/{epoch}/{sample}/{section}/{forward|backward}
//! runs/{run}/activations/{epoch}/{sample}/{section}/{forward|backward}/{assignment}/{upload|accepted}
//! runs/{run}/weights/{section}/{epoch}/{hotkey}/{parameters|optimizer}
//! runs/{run}/merged/{section}/{epoch}/{partition}/{hotkey}/{parameters|optimizer}
//! runs/{run}/checkpoints/{epoch}/{section}/{parameters|optimizer}
//! ```
//!
//! An [`ObjectKey`] can only be built from [`KeyPart`]s, and a `KeyPart` can only hold a plain
//! path component: 1 to [`MAX_PART_LEN`] bytes of ASCII letters, digits, `-`, `_` and `.`, and
//! never `.` or `..`. So no key can escape its run's directory on a local disk, and no key needs
//! percent-encoding in an S3 URL (which would make presigned URLs fragile). Numbers (epochs,
//! sections, sample ids, partitions) are written in decimal.
//!
//! Activations are grouped by epoch first, so that a whole epoch's activations can be
//! garbage-collected with one prefix ([`RunKeys::activations_epoch`]).

use std::fmt;

use thiserror::Error;

/// The longest component a key may hold, in bytes. Long enough for an SS58 hotkey (48 bytes)
/// or a run name, short enough that a key stays far below S3's 1024-byte limit.
pub const MAX_PART_LEN: usize = 128;

/// Why a string was refused as a key component.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The component was the empty string (it would collapse `a//b` into `a/b`).
    #[error("key component is empty")]
    Empty,
    /// The component was `.` or `..`, which name a directory rather than an object.
    #[error("key component {part:?} is a relative path segment")]
    DotSegment {
        /// The refused component.
        part: String,
    },
    /// The component holds `/` or `\`, so it would be more than one component.
    #[error("key component {part:?} contains a path separator")]
    Separator {
        /// The refused component.
        part: String,
    },
    /// The component holds a control character (newline, NUL, ...).
    #[error("key component {part:?} contains a control character")]
    ControlChar {
        /// The refused component.
        part: String,
    },
    /// The component holds a character outside `[A-Za-z0-9._-]`.
    #[error(
        "key component {part:?} contains {ch:?}; only ASCII letters, digits, '-', '_' and '.' are allowed"
    )]
    DisallowedChar {
        /// The refused component.
        part: String,
        /// The first character that is not allowed.
        ch: char,
    },
    /// The component is longer than [`MAX_PART_LEN`] bytes.
    #[error("key component is {len} bytes long; the limit is {max}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit, [`MAX_PART_LEN`].
        max: usize,
    },
    /// A key string had no component at all.
    #[error("key has no components")]
    NoParts,
}

/// One validated path component of an [`ObjectKey`].
///
/// The only way to get one is [`KeyPart::new`] (or a number, through [`From`]), which checks
/// the rules described in the module documentation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyPart(String);

impl KeyPart {
    /// Validates `part` as one plain path component.
    ///
    /// # Errors
    /// [`KeyError`] naming the first rule `part` breaks: empty, `.`/`..`, a separator, a control
    /// character, any other character outside `[A-Za-z0-9._-]`, or over [`MAX_PART_LEN`] bytes.
    pub fn new(part: &str) -> Result<Self, KeyError> {
        if part.is_empty() {
            return Err(KeyError::Empty);
        }
        if part.len() > MAX_PART_LEN {
            return Err(KeyError::TooLong {
                len: part.len(),
                max: MAX_PART_LEN,
            });
        }
        if part == "." || part == ".." {
            return Err(KeyError::DotSegment {
                part: part.to_owned(),
            });
        }
        for ch in part.chars() {
            if ch == '/' || ch == '\\' {
                return Err(KeyError::Separator {
                    part: part.to_owned(),
                });
            }
            if ch.is_control() {
                return Err(KeyError::ControlChar {
                    part: part.to_owned(),
                });
            }
            if !(ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.')) {
                return Err(KeyError::DisallowedChar {
                    part: part.to_owned(),
                    ch,
                });
            }
        }
        Ok(Self(part.to_owned()))
    }

    /// The component as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<u64> for KeyPart {
    /// A decimal number is always a valid component.
    fn from(n: u64) -> Self {
        Self(n.to_string())
    }
}

impl From<u32> for KeyPart {
    /// A decimal number is always a valid component.
    fn from(n: u32) -> Self {
        Self(n.to_string())
    }
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A `/`-separated object key made of validated [`KeyPart`]s. It never starts or ends with `/`
/// and never holds an empty, `.` or `..` component.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey(String);

impl ObjectKey {
    /// Joins `parts` into a key.
    ///
    /// # Errors
    /// [`KeyError::NoParts`] when `parts` is empty.
    pub fn from_parts(parts: &[KeyPart]) -> Result<Self, KeyError> {
        let (first, rest) = parts.split_first().ok_or(KeyError::NoParts)?;
        let mut key = first.0.clone();
        for part in rest {
            key.push('/');
            key.push_str(&part.0);
        }
        Ok(Self(key))
    }

    /// Parses a `/`-separated key that came from outside (a listing, a request), validating
    /// every component.
    ///
    /// # Errors
    /// [`KeyError`] for the first bad component; a leading, trailing or doubled `/` shows up as
    /// [`KeyError::Empty`].
    pub fn parse(key: &str) -> Result<Self, KeyError> {
        let parts = key
            .split('/')
            .map(KeyPart::new)
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_parts(&parts)
    }

    /// This key with one more component appended (`self/part`).
    pub fn join(&self, part: &KeyPart) -> Self {
        Self(format!("{}/{}", self.0, part.0))
    }

    /// The key as text, components separated by `/`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `prefix` is this key or a whole-component prefix of it (`a/b` is a prefix of
    /// `a/b/c` but not of `a/bc`).
    pub fn starts_with(&self, prefix: &ObjectKey) -> bool {
        match self.0.strip_prefix(&prefix.0) {
            Some(rest) => rest.is_empty() || rest.starts_with('/'),
            None => false,
        }
    }

    /// The rest of this key after `prefix`, or `None` when `prefix` is not a whole-component
    /// prefix of it or equals it.
    pub fn strip_prefix(&self, prefix: &ObjectKey) -> Option<ObjectKey> {
        let rest = self.0.strip_prefix(&prefix.0)?.strip_prefix('/')?;
        Some(Self(rest.to_owned()))
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which way an activation travels through the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// A section's output on the way to the next section.
    Forward,
    /// The gradient with respect to a section's input, on the way back to the previous one.
    Backward,
}

impl Direction {
    fn part(self) -> KeyPart {
        KeyPart(
            match self {
                Self::Forward => "forward",
                Self::Backward => "backward",
            }
            .to_owned(),
        )
    }
}

/// The two copies of one attempt's output ([`RunKeys::activation_attempt`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptCopy {
    /// Where the miner uploads (it holds a PUT URL for it until its deadline).
    Upload,
    /// The orchestrator's immutable copy of an accepted upload: what everyone reads.
    Accepted,
}

impl AttemptCopy {
    /// The key component.
    pub fn name(self) -> &'static str {
        match self {
            Self::Upload => "upload",
            Self::Accepted => "accepted",
        }
    }
}

/// Which half of a section's state a weights object holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatePart {
    /// The flat parameters.
    Parameters,
    /// The optimizer state (moments), merged alongside the parameters.
    Optimizer,
    /// Parameters and moments in one flat vector ([`crate::merge::FlatLayout`]).
    Flat,
    /// The outer optimizer's momentum (DiLoCo-style outer step).
    OuterMomentum,
    /// A checkpoint as its merged partitions in the run's `dct` merge format: the change from
    /// the previous checkpoint, which the section's miners already hold.
    Delta,
}

impl StatePart {
    fn part(self) -> KeyPart {
        KeyPart(
            match self {
                Self::Parameters => "parameters",
                Self::Optimizer => "optimizer",
                Self::Flat => "flat",
                Self::OuterMomentum => "outer-momentum",
                Self::Delta => "delta",
            }
            .to_owned(),
        )
    }
}

/// Builds every key of one run. Holding a validated run name and a validated hotkey type means
/// the typed constructors below cannot fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunKeys {
    run: KeyPart,
}

impl RunKeys {
    /// Keys for the run named `run`.
    ///
    /// # Errors
    /// [`KeyError`] when `run` is not a plain path component.
    pub fn new(run: &str) -> Result<Self, KeyError> {
        Ok(Self {
            run: KeyPart::new(run)?,
        })
    }

    /// `runs/{run}`: everything of this run.
    pub fn root(&self) -> ObjectKey {
        ObjectKey(format!("runs/{}", self.run))
    }

    fn area(&self, area: &str) -> ObjectKey {
        ObjectKey(format!("runs/{}/{area}", self.run))
    }

    fn build(&self, area: &str, parts: &[&KeyPart]) -> ObjectKey {
        let mut key = self.area(area).0;
        for part in parts {
            key.push('/');
            key.push_str(&part.0);
        }
        ObjectKey(key)
    }

    /// `runs/{run}/activations/{epoch}`: every activation of one epoch (the unit of
    /// garbage collection).
    pub fn activations_epoch(&self, epoch: u64) -> ObjectKey {
        self.build("activations", &[&epoch.into()])
    }

    /// `runs/{run}/activations/{epoch}/{sample}/{section}/{forward|backward}`: the activation
    /// that `section` produced for `sample` (forward: its output; backward: the gradient with
    /// respect to its input).
    pub fn activation(
        &self,
        epoch: u64,
        sample: u64,
        section: u32,
        direction: Direction,
    ) -> ObjectKey {
        self.build(
            "activations",
            &[
                &epoch.into(),
                &sample.into(),
                &section.into(),
                &direction.part(),
            ],
        )
    }

    /// `runs/{run}/activations/{epoch}/{sample}/{section}.{direction}.{assignment}.{upload|accepted}`:
    /// one attempt's output. The miner that holds `assignment` uploads to `upload`; once the
    /// result is accepted the orchestrator copies it to `accepted`, a key nobody was ever given
    /// an upload URL for, so what was accepted cannot be overwritten afterwards and a stale
    /// URL of another attempt can only ever write its own `upload`.
    ///
    /// The attempt is one key component rather than four: on a local directory store every
    /// component is a directory, and creating ~16 directories per sample cost the orchestrator
    /// more CPU than its database (`perf` under `iota bench orchestrator`). Every attempt of a
    /// sample now sits in the sample's one directory.
    pub fn activation_attempt(
        &self,
        epoch: u64,
        sample: u64,
        section: u32,
        direction: Direction,
        assignment: u64,
        copy: AttemptCopy,
    ) -> ObjectKey {
        let name = format!(
            "{section}.{}.{assignment}.{}",
            direction.part().as_str(),
            copy.name()
        );
        self.activations_epoch(epoch)
            .join(&sample.into())
            .join(&KeyPart(name))
    }

    /// `runs/{run}/weights/{section}/{epoch}`: every miner's upload of one section for one
    /// merge.
    pub fn weights_epoch(&self, section: u32, epoch: u64) -> ObjectKey {
        self.build("weights", &[&section.into(), &epoch.into()])
    }

    /// `runs/{run}/weights/{section}/{epoch}/{hotkey}/{parameters|optimizer}`: one miner's
    /// upload of its section state before a merge.
    pub fn weights(&self, section: u32, epoch: u64, hotkey: &Hotkey, part: StatePart) -> ObjectKey {
        self.build(
            "weights",
            &[&section.into(), &epoch.into(), &hotkey.0, &part.part()],
        )
    }

    /// `runs/{run}/merged/{section}/{epoch}`: every merger's copy of every partition of one
    /// merge.
    pub fn merged_epoch(&self, section: u32, epoch: u64) -> ObjectKey {
        self.build("merged", &[&section.into(), &epoch.into()])
    }

    /// `runs/{run}/merged/{section}/{epoch}/{partition}`: every merger's copy of one partition.
    pub fn merged_partition(&self, section: u32, epoch: u64, partition: u32) -> ObjectKey {
        self.build(
            "merged",
            &[&section.into(), &epoch.into(), &partition.into()],
        )
    }

    /// `runs/{run}/merged/{section}/{epoch}/{partition}/{hotkey}/{parameters|optimizer}`: the
    /// merge result one assigned miner computed for one partition. Each of the `r` mergers of a
    /// partition has its own key, so their copies can be compared.
    pub fn merged(
        &self,
        section: u32,
        epoch: u64,
        partition: u32,
        hotkey: &Hotkey,
        part: StatePart,
    ) -> ObjectKey {
        self.build(
            "merged",
            &[
                &section.into(),
                &epoch.into(),
                &partition.into(),
                &hotkey.0,
                &part.part(),
            ],
        )
    }

    /// `runs/{run}/checkpoints/{epoch}/{section}`: everything of one section's checkpoint
    /// (its state and outer momentum), the unit of its garbage collection.
    pub fn checkpoint_section(&self, epoch: u64, section: u32) -> ObjectKey {
        self.build("checkpoints", &[&epoch.into(), &section.into()])
    }

    /// `runs/{run}/checkpoints/{epoch}/{section}/{parameters|optimizer}`: a section's global
    /// state after the merge of `epoch`.
    pub fn checkpoint(&self, epoch: u64, section: u32, part: StatePart) -> ObjectKey {
        self.build(
            "checkpoints",
            &[&epoch.into(), &section.into(), &part.part()],
        )
    }
}

/// A miner's hotkey (an SS58 address) as it appears in keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Hotkey(KeyPart);

impl Hotkey {
    /// Validates `ss58` as a key component. The address itself is not decoded here (the wallet
    /// module does that); this only guarantees it is safe in a path.
    ///
    /// # Errors
    /// [`KeyError`] when `ss58` is not a plain path component.
    pub fn new(ss58: &str) -> Result<Self, KeyError> {
        Ok(Self(KeyPart::new(ss58)?))
    }

    /// The address as text.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: &str = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY";

    #[test]
    fn typed_keys_follow_the_layout() {
        let keys = RunKeys::new("run-1").unwrap();
        let alice = Hotkey::new(ALICE).unwrap();
        assert_eq!(keys.root().as_str(), "runs/run-1");
        assert_eq!(
            keys.activation(3, 12345, 1, Direction::Forward).as_str(),
            "runs/run-1/activations/3/12345/1/forward"
        );
        assert_eq!(
            keys.activation(3, 7, 2, Direction::Backward).as_str(),
            "runs/run-1/activations/3/7/2/backward"
        );
        assert_eq!(
            keys.activations_epoch(3).as_str(),
            "runs/run-1/activations/3"
        );
        assert_eq!(
            keys.activation_attempt(3, 7, 2, Direction::Backward, 41, AttemptCopy::Accepted)
                .as_str(),
            "runs/run-1/activations/3/7/2.backward.41.accepted"
        );
        assert!(
            keys.activation_attempt(3, 7, 0, Direction::Forward, 9, AttemptCopy::Upload)
                .starts_with(&keys.activations_epoch(3))
        );
        assert_eq!(
            keys.weights(2, 5, &alice, StatePart::Parameters).as_str(),
            format!("runs/run-1/weights/2/5/{ALICE}/parameters")
        );
        assert_eq!(keys.weights_epoch(2, 5).as_str(), "runs/run-1/weights/2/5");
        assert_eq!(
            keys.merged(0, 9, 4, &alice, StatePart::Optimizer).as_str(),
            format!("runs/run-1/merged/0/9/4/{ALICE}/optimizer")
        );
        assert_eq!(
            keys.merged_partition(0, 9, 4).as_str(),
            "runs/run-1/merged/0/9/4"
        );
        assert_eq!(
            keys.checkpoint(10, 1, StatePart::Parameters).as_str(),
            "runs/run-1/checkpoints/10/1/parameters"
        );
        assert!(
            keys.activation(3, 1, 0, Direction::Forward)
                .starts_with(&keys.activations_epoch(3))
        );
        assert!(
            !keys
                .activation(31, 1, 0, Direction::Forward)
                .starts_with(&keys.activations_epoch(3))
        );
    }

    #[test]
    fn bad_components_are_rejected_with_the_reason() {
        assert_eq!(KeyPart::new(""), Err(KeyError::Empty));
        assert_eq!(
            KeyPart::new(".."),
            Err(KeyError::DotSegment { part: "..".into() })
        );
        assert_eq!(
            KeyPart::new("."),
            Err(KeyError::DotSegment { part: ".".into() })
        );
        assert_eq!(
            KeyPart::new("a/b"),
            Err(KeyError::Separator { part: "a/b".into() })
        );
        assert_eq!(
            KeyPart::new("a\\b"),
            Err(KeyError::Separator {
                part: "a\\b".into()
            })
        );
        assert_eq!(
            KeyPart::new("a\nb"),
            Err(KeyError::ControlChar {
                part: "a\nb".into()
            })
        );
        assert_eq!(
            KeyPart::new("a\0"),
            Err(KeyError::ControlChar { part: "a\0".into() })
        );
        assert_eq!(
            KeyPart::new("a b"),
            Err(KeyError::DisallowedChar {
                part: "a b".into(),
                ch: ' '
            })
        );
        assert_eq!(
            KeyPart::new("é"),
            Err(KeyError::DisallowedChar {
                part: "é".into(),
                ch: 'é'
            })
        );
        assert_eq!(
            KeyPart::new(&"x".repeat(128)).map(|p| p.as_str().len()),
            Ok(128)
        );
        assert_eq!(
            KeyPart::new(&"x".repeat(129)),
            Err(KeyError::TooLong { len: 129, max: 128 })
        );
        // Dots inside a name are fine: only the whole-component `.` and `..` are special.
        assert_eq!(KeyPart::new("..a").map(|p| p.to_string()), Ok("..a".into()));
        assert!(RunKeys::new("../etc").is_err());
        assert!(Hotkey::new("x/../../y").is_err());
    }

    #[test]
    fn parse_validates_every_component() {
        assert_eq!(
            ObjectKey::parse("runs/a/weights").map(|k| k.to_string()),
            Ok("runs/a/weights".into())
        );
        assert_eq!(ObjectKey::parse("/runs"), Err(KeyError::Empty));
        assert_eq!(ObjectKey::parse("runs/"), Err(KeyError::Empty));
        assert_eq!(ObjectKey::parse("runs//a"), Err(KeyError::Empty));
        assert_eq!(ObjectKey::parse(""), Err(KeyError::Empty));
        assert_eq!(
            ObjectKey::parse("runs/../a"),
            Err(KeyError::DotSegment { part: "..".into() })
        );
        assert_eq!(ObjectKey::from_parts(&[]), Err(KeyError::NoParts));
    }

    #[test]
    fn prefixes_match_whole_components() {
        let key = ObjectKey::parse("a/bc/d").unwrap();
        let a_b = ObjectKey::parse("a/b").unwrap();
        let a_bc = ObjectKey::parse("a/bc").unwrap();
        assert!(!key.starts_with(&a_b));
        assert!(key.starts_with(&a_bc));
        assert!(key.starts_with(&key));
        assert_eq!(
            key.strip_prefix(&a_bc).map(|k| k.to_string()),
            Some("d".into())
        );
        assert_eq!(key.strip_prefix(&a_b), None);
        assert_eq!(key.strip_prefix(&key), None);
        assert_eq!(a_bc.join(&KeyPart::new("e").unwrap()).as_str(), "a/bc/e");
    }
}
