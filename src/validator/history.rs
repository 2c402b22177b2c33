//! The validator's own record: one JSON file per finished window (`window-{epoch}.json`) in
//! its state directory, written atomically. A restarted validator reads them back, publishes
//! exactly what it published before and carries on from the next epoch (the objects of old
//! epochs may be gone by then, so a window is never recomputed).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::window::WindowResult;

/// Why the record could not be read or written.
#[derive(Debug, Error)]
pub enum HistoryError {
    /// A file or the directory.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A window file that does not parse (the message names it).
    #[error("{path} is not a window record: {reason}")]
    Malformed {
        /// The path.
        path: PathBuf,
        /// The parser's complaint.
        reason: String,
    },
}

/// The windows validated so far.
#[derive(Debug)]
pub struct History {
    dir: PathBuf,
    windows: BTreeMap<u64, WindowResult>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HistoryError + '_ {
    move |source| HistoryError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl History {
    /// Opens (creating) `dir` and reads every window file in it.
    ///
    /// # Errors
    /// [`HistoryError`]; a malformed file is an error, never silently skipped.
    pub fn open(dir: &Path) -> Result<Self, HistoryError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let mut windows = BTreeMap::new();
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let path = entry.map_err(io(dir))?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if !(name.starts_with("window-") && name.ends_with(".json")) {
                continue;
            }
            let text = std::fs::read_to_string(&path).map_err(io(&path))?;
            let w: WindowResult =
                serde_json::from_str(&text).map_err(|e| HistoryError::Malformed {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            windows.insert(w.epoch, w);
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            windows,
        })
    }

    /// Records a window (replacing one of the same epoch).
    ///
    /// # Errors
    /// [`HistoryError::Io`].
    pub fn save(&mut self, w: WindowResult) -> Result<(), HistoryError> {
        let path = self.dir.join(format!("window-{}.json", w.epoch));
        let tmp = self.dir.join(format!(".window-{}.json.tmp", w.epoch));
        let text = serde_json::to_string_pretty(&w).map_err(|e| HistoryError::Malformed {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        std::fs::write(&tmp, text).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        self.windows.insert(w.epoch, w);
        Ok(())
    }

    /// The newest window.
    pub fn latest(&self) -> Option<&WindowResult> {
        self.windows.values().next_back()
    }

    /// The epoch after the newest window.
    pub fn next_epoch(&self) -> Option<u64> {
        self.windows.keys().next_back().map(|e| e + 1)
    }

    /// The miners flagged in the `windows` windows before `epoch`, with the epoch of each one's
    /// latest flag (probation; see `validation.probation_windows`).
    pub fn probation(&self, epoch: u64, windows: u64) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for w in self
            .windows
            .range(epoch.saturating_sub(windows)..epoch)
            .map(|(_, w)| w)
        {
            for hotkey in w.flagged() {
                out.insert(hotkey.to_string(), w.epoch);
            }
        }
        out
    }

    /// Every window, oldest first.
    pub fn windows(&self) -> impl Iterator<Item = &WindowResult> {
        self.windows.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(epoch: u64) -> WindowResult {
        WindowResult {
            epoch,
            tracked: vec!["m".into()],
            miners: vec![],
            burn: 1.0,
            notes: vec![format!("epoch {epoch}")],
            replays: vec![],
        }
    }

    #[test]
    fn windows_survive_reopening_and_garbage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut h = History::open(dir.path()).unwrap();
            assert_eq!(h.next_epoch(), None);
            h.save(window(0)).unwrap();
            h.save(window(1)).unwrap();
        }
        let h = History::open(dir.path()).unwrap();
        assert_eq!(h.next_epoch(), Some(2));
        assert_eq!(h.latest(), Some(&window(1)));
        assert_eq!(h.windows().count(), 2);
        assert!(h.probation(2, 10).is_empty(), "nobody flagged");
        std::fs::write(dir.path().join("window-7.json"), "{not json").unwrap();
        let err = History::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("window-7.json"), "{err}");
    }
}
