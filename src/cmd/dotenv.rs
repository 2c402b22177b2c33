//! Reading the Python reference's `.env` files as a migration aid: the keys a miner of the
//! reference set by hand (`wallet_name`, `wallet_hotkey`, `ORCHESTRATOR_HOST`, ...) become
//! iota settings, and the keys iota has no use for are listed, not silently dropped.
//!
//! # Format
//! ```text
//! # comment
//! wallet_name="my_wallet"          -> wallet
//! wallet_hotkey=my_hotkey          -> hotkey        (MINER_WALLET / MINER_HOTKEY too)
//! ORCHESTRATOR_SCHEME=https        -> orchestrator = SCHEME://HOST:PORT
//! ORCHESTRATOR_HOST=example.org       (scheme defaults to https for port 443, else http)
//! ORCHESTRATOR_PORT=443
//! DEVICE=cuda                      -> device        (mps -> wgpu)
//! export KEY=value                 (an `export ` prefix is allowed)
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};

use crate::model::backend::DeviceKind;

/// The settings a reference `.env` can give (the lowest layer of a node's profile).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnvSettings {
    /// Wallet name.
    pub wallet: Option<String>,
    /// Hotkey name.
    pub hotkey: Option<String>,
    /// Base URL of the orchestrator.
    pub orchestrator: Option<String>,
    /// Compute backend.
    pub device: Option<DeviceKind>,
}

/// A parsed `.env`: the settings it gives, and what was used and ignored.
#[derive(Debug, Clone, Default)]
pub struct DotEnv {
    /// Settings taken from it.
    pub settings: EnvSettings,
    /// Keys that became settings.
    pub used: Vec<String>,
    /// Keys iota does not use (reported to the user).
    pub ignored: Vec<String>,
}

impl DotEnv {
    /// Reads and parses a file.
    ///
    /// # Errors
    /// Unreadable file, a line that is not `KEY=VALUE`, a bad DEVICE or port.
    pub fn load(path: &Path) -> anyhow::Result<DotEnv> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        DotEnv::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// Parses the text of a `.env`.
    ///
    /// # Errors
    /// As [`DotEnv::load`].
    pub fn parse(text: &str) -> anyhow::Result<DotEnv> {
        let vars = parse_lines(text)?;
        let mut env = DotEnv::default();
        let mut take = |keys: &[&str]| -> Option<String> {
            keys.iter().find_map(|k| {
                vars.get(*k).filter(|v| !v.is_empty()).map(|v| {
                    env.used.push((*k).to_string());
                    v.clone()
                })
            })
        };
        let wallet = take(&["wallet_name", "MINER_WALLET"]);
        let hotkey = take(&["wallet_hotkey", "MINER_HOTKEY"]);
        let host = take(&["ORCHESTRATOR_HOST"]);
        let port = take(&["ORCHESTRATOR_PORT"]);
        let scheme = take(&["ORCHESTRATOR_SCHEME"]);
        let device = take(&["DEVICE"]);
        env.settings.wallet = wallet;
        env.settings.hotkey = hotkey;
        if let Some(host) = host {
            let port = match port {
                Some(p) => Some(
                    p.parse::<u16>()
                        .map_err(|_| anyhow::anyhow!("ORCHESTRATOR_PORT {p:?} is not a port"))?,
                ),
                None => None,
            };
            let scheme = scheme.unwrap_or_else(|| {
                if port == Some(443) {
                    "https".into()
                } else {
                    "http".into()
                }
            });
            let host = host.trim_end_matches('/');
            env.settings.orchestrator = Some(match port {
                Some(port) => format!("{scheme}://{host}:{port}"),
                None => format!("{scheme}://{host}"),
            });
        }
        if let Some(device) = device {
            env.settings.device = Some(match device.to_ascii_lowercase().as_str() {
                "mps" | "metal" => DeviceKind::Wgpu,
                other => other
                    .parse()
                    .map_err(|e: String| anyhow::anyhow!("DEVICE: {e}"))?,
            });
        }
        env.ignored = vars
            .keys()
            .filter(|k| !env.used.contains(k))
            .cloned()
            .collect();
        Ok(env)
    }

    /// One line for the user: which keys were used and which ignored.
    pub fn describe(&self, path: &Path) -> String {
        let mut line = format!(
            "reference .env {}: used {}",
            path.display(),
            if self.used.is_empty() {
                "nothing".to_string()
            } else {
                self.used.join(", ")
            }
        );
        if !self.ignored.is_empty() {
            line.push_str(&format!("; not used by iota: {}", self.ignored.join(", ")));
        }
        line
    }
}

/// `KEY=VALUE` lines; blank lines and `#` comments skipped; quotes removed.
fn parse_lines(text: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut vars = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else {
            bail!("line {}: expected KEY=VALUE, got {line:?}", n + 1);
        };
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            bail!("line {}: {key:?} is not a variable name", n + 1);
        }
        let value = value.trim();
        let value = match value.chars().next() {
            Some(q @ ('"' | '\'')) => match value[1..].find(q) {
                Some(end) => value[1..1 + end].to_string(),
                None => bail!("line {}: unterminated quote in {key}", n + 1),
            },
            // An unquoted value ends at ` #` (a trailing comment).
            _ => value
                .split(" #")
                .next()
                .unwrap_or_default()
                .trim()
                .to_string(),
        };
        vars.insert(key.to_string(), value);
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of the reference's `miner-example.env`.
    const REFERENCE: &str = r#"
wallet_name="my_wallet" # change me
wallet_hotkey=my_hotkey
netuid=9
network="finney"
MOCK=False
BITTENSOR=True
HF_TOKEN="hf_secret"
export ORCHESTRATOR_HOST=orchestrator.example
ORCHESTRATOR_PORT=443
ORCHESTRATOR_SCHEME=https
"#;

    #[test]
    fn reference_keys_become_settings_and_the_rest_is_listed() {
        let env = DotEnv::parse(REFERENCE).unwrap();
        assert_eq!(env.settings.wallet.as_deref(), Some("my_wallet"));
        assert_eq!(env.settings.hotkey.as_deref(), Some("my_hotkey"));
        assert_eq!(
            env.settings.orchestrator.as_deref(),
            Some("https://orchestrator.example:443")
        );
        for k in ["netuid", "network", "MOCK", "BITTENSOR", "HF_TOKEN"] {
            assert!(env.ignored.contains(&k.to_string()), "{k}");
        }
        let line = env.describe(Path::new(".env"));
        assert!(line.contains("not used by iota") && !line.contains("hf_secret"));
    }

    #[test]
    fn current_reference_keys_and_defaults() {
        let env = DotEnv::parse(
            "MINER_WALLET=w\nMINER_HOTKEY=h\nORCHESTRATOR_HOST=1.2.3.4\nDEVICE=mps\n",
        )
        .unwrap();
        assert_eq!(env.settings.wallet.as_deref(), Some("w"));
        assert_eq!(env.settings.orchestrator.as_deref(), Some("http://1.2.3.4"));
        assert_eq!(env.settings.device, Some(DeviceKind::Wgpu));
    }

    #[test]
    fn bad_lines_are_errors_naming_the_line() {
        let err = DotEnv::parse("wallet_name=w\nthis is not a pair\n").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        assert!(DotEnv::parse("X=\"open\n").is_err());
        assert!(DotEnv::parse("ORCHESTRATOR_HOST=h\nORCHESTRATOR_PORT=http\n").is_err());
        assert!(DotEnv::parse("DEVICE=tpu\n").is_err());
    }
}
