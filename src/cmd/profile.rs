//! The settings of a miner or validator: command-line flags and `IOTA_*` variables, the
//! file `iota setup` writes (`~/.config/iota/<role>.yaml`), and a reference-format `.env`
//! (migration aid), merged in that order of priority.
//!
//! # Format
//! ```yaml
//! # ~/.config/iota/miner.yaml, written by `iota setup`
//! role: miner
//! wallet: default
//! hotkey: default
//! wallets_dir: /home/me/.bittensor/wallets
//! orchestrator: https://orchestrator.example:8700
//! device: cuda
//! threads: null        # compute threads (null: all cores)
//! max_in_flight: 4     # forwards awaiting their backward
//! ca_file: null        # PEM CA certificate of a private run's HTTPS orchestrator
//! ```
//! Every key is optional; unknown keys are errors naming the key.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use super::dotenv::{DotEnv, EnvSettings};
use super::wallet::{WalletArgs, WalletRef};
use crate::model::backend::DeviceKind;

/// What a machine does in the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Serves a section of the model.
    #[default]
    Miner,
    /// Checks miners' work and scores them.
    Validator,
    /// Runs a training run.
    Orchestrator,
}

impl Role {
    /// Lower-case name (`miner`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Miner => "miner",
            Self::Validator => "validator",
            Self::Orchestrator => "orchestrator",
        }
    }
}

/// A miner's or validator's settings file (see the module's `# Format`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeProfile {
    /// Role the file was written for.
    #[serde(default)]
    pub role: Role,
    /// Wallet name.
    #[serde(default)]
    pub wallet: Option<String>,
    /// Hotkey name.
    #[serde(default)]
    pub hotkey: Option<String>,
    /// Wallets directory.
    #[serde(default)]
    pub wallets_dir: Option<PathBuf>,
    /// Base URL of the orchestrator.
    #[serde(default)]
    pub orchestrator: Option<String>,
    /// Compute backend.
    #[serde(default)]
    pub device: Option<DeviceKind>,
    /// Compute threads.
    #[serde(default)]
    pub threads: Option<usize>,
    /// Forwards in flight to ask for.
    #[serde(default)]
    pub max_in_flight: Option<usize>,
    /// A CA certificate (PEM) to trust beside the system's roots: a private run's
    /// orchestrator certificate is signed by it (the global `--ca-file` flag wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
}

impl From<EnvSettings> for NodeProfile {
    fn from(env: EnvSettings) -> NodeProfile {
        NodeProfile {
            wallet: env.wallet,
            hotkey: env.hotkey,
            orchestrator: env.orchestrator,
            device: env.device,
            ..NodeProfile::default()
        }
    }
}

impl NodeProfile {
    /// Fills every unset field from `fallback`.
    pub fn or(self, fallback: NodeProfile) -> NodeProfile {
        NodeProfile {
            role: self.role,
            wallet: self.wallet.or(fallback.wallet),
            hotkey: self.hotkey.or(fallback.hotkey),
            wallets_dir: self.wallets_dir.or(fallback.wallets_dir),
            orchestrator: self.orchestrator.or(fallback.orchestrator),
            device: self.device.or(fallback.device),
            threads: self.threads.or(fallback.threads),
            max_in_flight: self.max_in_flight.or(fallback.max_in_flight),
            ca_file: self.ca_file.or(fallback.ca_file),
        }
    }

    /// The wallet fields.
    pub fn wallet_args(&self) -> WalletArgs {
        WalletArgs {
            wallet: self.wallet.clone(),
            hotkey: self.hotkey.clone(),
            wallets_dir: self.wallets_dir.clone(),
        }
    }

    /// Reads a settings file.
    ///
    /// # Errors
    /// Unreadable file, bad YAML, unknown keys (named).
    pub fn load(path: &Path) -> anyhow::Result<NodeProfile> {
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_norway::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// Writes the file (creating its directory) with a header comment.
    ///
    /// # Errors
    /// The directory or file cannot be written.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let yaml = serde_norway::to_string(self).context("encoding the settings")?;
        let text = format!(
            "# iota {} settings, written by `iota setup`; flags and IOTA_* variables override them.\n{yaml}",
            self.role.name()
        );
        write_private(path, text.as_bytes())
    }
}

/// Writes `bytes` to `path` with mode 0600 (it may name keys), creating the directory.
///
/// # Errors
/// The directory or file cannot be written.
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(0o600))
            .with_context(|| format!("restricting {} to mode 0600", path.display()))?;
    }
    file.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))
}

/// iota's config directory: `$XDG_CONFIG_HOME/iota`, else `~/.config/iota`.
///
/// # Errors
/// Neither `XDG_CONFIG_HOME` nor `HOME` is set.
pub fn config_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_CONFIG_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("iota"));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".config").join("iota")),
        None => bail!("cannot locate ~/.config/iota: HOME is not set (pass --config FILE)"),
    }
}

/// Where `iota setup` writes the settings of `role` by default.
///
/// # Errors
/// As [`config_dir`].
pub fn default_path(role: Role) -> anyhow::Result<PathBuf> {
    Ok(config_dir()?.join(format!("{}.yaml", role.name())))
}

/// A base URL with a scheme: `host:port` becomes `http://host:port`; trailing `/` removed.
pub fn normalize_url(url: &str) -> String {
    let url = url.trim().trim_end_matches('/');
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

/// Flags shared by the commands that act as a miner or validator: the wallet, the
/// orchestrator, the device, and where to find settings not given as flags.
#[derive(Debug, Clone, Default, Args)]
pub struct NodeArgs {
    /// Which hotkey.
    #[command(flatten)]
    pub wallet: WalletArgs,
    /// Base URL of the orchestrator, e.g. http://127.0.0.1:8700.
    #[arg(long, env = "IOTA_ORCHESTRATOR", value_name = "URL")]
    pub orchestrator: Option<String>,
    /// Settings file written by `iota setup` (default: ~/.config/iota/<role>.yaml if present).
    #[arg(long, env = "IOTA_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A `.env` in the Python reference's format (wallet_name, wallet_hotkey,
    /// ORCHESTRATOR_HOST, ...), read as a migration aid (default: ./.env if present).
    #[arg(long, env = "DOTENV_PATH", value_name = "FILE")]
    pub env_file: Option<PathBuf>,
    /// Backend: cpu, cuda, wgpu or flex (default cpu).
    #[arg(long, env = "IOTA_DEVICE")]
    pub device: Option<DeviceKind>,
}

/// Settings merged from every source, and which files they came from.
#[derive(Debug, Clone)]
pub struct Layered {
    /// The merged settings.
    pub profile: NodeProfile,
    /// One line per file read, for the user.
    pub sources: Vec<String>,
}

impl Layered {
    /// The hotkey to use.
    ///
    /// # Errors
    /// No wallets directory and no `HOME`.
    pub fn wallet(&self) -> anyhow::Result<WalletRef> {
        self.profile.wallet_args().resolve()
    }

    /// Trusts the settings' `ca_file`, unless `--ca-file` / `IOTA_CA_FILE` already named one
    /// (the flag wins over the file).
    ///
    /// # Errors
    /// The file cannot be read or holds no PEM certificate.
    pub fn trust_ca_file(&self) -> anyhow::Result<()> {
        if let (Some(path), None) = (&self.profile.ca_file, crate::storage::trust::ca_file()) {
            crate::storage::trust::trust_ca_file(path)
                .context("the settings' `ca_file` (pass --ca-file to override it)")?;
        }
        Ok(())
    }

    /// The orchestrator URL, or an error saying where to give one.
    ///
    /// # Errors
    /// None was given anywhere.
    pub fn orchestrator(&self) -> anyhow::Result<String> {
        match &self.profile.orchestrator {
            Some(url) => Ok(normalize_url(url)),
            None => bail!(
                "no orchestrator given: pass --orchestrator URL, set IOTA_ORCHESTRATOR, or run `iota setup` once"
            ),
        }
    }
}

impl NodeArgs {
    /// Flags over the settings file of `role` over the `.env`.
    ///
    /// # Errors
    /// A named file that is missing or malformed (a default file that is absent is skipped).
    pub fn layered(&self, role: Role) -> anyhow::Result<Layered> {
        let mut sources = Vec::new();
        let flags = NodeProfile {
            role,
            wallet: self.wallet.wallet.clone(),
            hotkey: self.wallet.hotkey.clone(),
            wallets_dir: self.wallet.wallets_dir.clone(),
            orchestrator: self.orchestrator.clone(),
            device: self.device,
            threads: None,
            max_in_flight: None,
            // The global `--ca-file` flag is applied by `cmd::run` before this.
            ca_file: None,
        };
        let config_path = match &self.config {
            Some(path) => Some(path.clone()),
            None => default_path(role).ok().filter(|p| p.is_file()),
        };
        let file = match config_path {
            Some(path) => {
                let profile = NodeProfile::load(&path)?;
                sources.push(format!("settings from {}", path.display()));
                profile
            }
            None => NodeProfile::default(),
        };
        let env_path = match &self.env_file {
            Some(path) => Some(path.clone()),
            None => Some(PathBuf::from(".env")).filter(|p| p.is_file()),
        };
        let dotenv = match env_path {
            Some(path) => {
                let env = DotEnv::load(&path)?;
                sources.push(env.describe(&path));
                NodeProfile::from(env.settings)
            }
            None => NodeProfile::default(),
        };
        Ok(Layered {
            profile: flags.or(file).or(dotenv),
            sources,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_refuse_unknown_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/miner.yaml");
        let profile = NodeProfile {
            role: Role::Miner,
            wallet: Some("w".into()),
            hotkey: Some("h".into()),
            orchestrator: Some("http://o:1".into()),
            device: Some(DeviceKind::Cuda),
            threads: Some(3),
            ..NodeProfile::default()
        };
        profile.save(&path).unwrap();
        assert_eq!(NodeProfile::load(&path).unwrap(), profile);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        fs::write(&path, "wallet: w\nwalet: typo\n").unwrap();
        let err = format!("{:#}", NodeProfile::load(&path).unwrap_err());
        assert!(err.contains("walet"), "{err}");
    }

    #[test]
    fn flags_override_the_file_which_overrides_the_env_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("miner.yaml");
        NodeProfile {
            wallet: Some("from-file".into()),
            hotkey: Some("file-hotkey".into()),
            orchestrator: Some("http://file:1".into()),
            ..NodeProfile::default()
        }
        .save(&config)
        .unwrap();
        let env = dir.path().join(".env");
        fs::write(
            &env,
            "wallet_name=from-env\nwallet_hotkey=env-hotkey\nDEVICE=cuda\n",
        )
        .unwrap();
        let args = NodeArgs {
            wallet: WalletArgs {
                wallet: Some("from-flag".into()),
                ..WalletArgs::default()
            },
            config: Some(config),
            env_file: Some(env),
            ..NodeArgs::default()
        };
        let layered = args.layered(Role::Miner).unwrap();
        let p = &layered.profile;
        assert_eq!(p.wallet.as_deref(), Some("from-flag"));
        assert_eq!(p.hotkey.as_deref(), Some("file-hotkey"));
        assert_eq!(p.device, Some(DeviceKind::Cuda));
        assert_eq!(layered.orchestrator().unwrap(), "http://file:1");
        assert_eq!(layered.sources.len(), 2);
    }

    #[test]
    fn missing_orchestrator_says_where_to_give_one() {
        let layered = Layered {
            profile: NodeProfile::default(),
            sources: vec![],
        };
        let err = layered.orchestrator().unwrap_err().to_string();
        assert!(
            err.contains("--orchestrator") && err.contains("iota setup"),
            "{err}"
        );
        assert_eq!(normalize_url("1.2.3.4:8700/"), "http://1.2.3.4:8700");
        assert_eq!(normalize_url("https://x"), "https://x");
    }
}
