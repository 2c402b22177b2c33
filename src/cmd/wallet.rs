//! `iota wallet new|import|list|show`: hotkeys in the Bittensor wallet layout
//! (`<wallets>/<wallet>/hotkeys/<hotkey>`, see [`crate::wallet::files`]), so wallets made by
//! `btcli` work here and the other way round. `iota wallet check` decrypts a wallet's coldkey
//! (btcli's `$NACL` format, see [`crate::wallet::encrypted`]) and confirms it matches
//! `coldkeypub.txt`; it writes nothing.
//!
//! [`WalletArgs`] is the `--wallet/--hotkey/--wallets-dir` triple every command that takes a
//! wallet flattens in.

use std::env::VarError;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use zeroize::Zeroizing;

use crate::wallet::files::{parse_coldkey, read_public_file, read_secret_file};
use crate::wallet::{Hotkey, KeyfileFormat, Ss58Address, WalletDir};

/// Wallet and hotkey name when none is given anywhere (btcli's convention).
pub const DEFAULT_NAME: &str = "default";

/// `--wallet NAME --hotkey NAME --wallets-dir DIR`, each also from an `IOTA_*` variable.
#[derive(Debug, Clone, Default, Args)]
pub struct WalletArgs {
    /// Wallet name (a directory under the wallets directory; default `default`).
    #[arg(long, env = "IOTA_WALLET", value_name = "NAME")]
    pub wallet: Option<String>,
    /// Hotkey name inside the wallet (default `default`).
    #[arg(long, env = "IOTA_HOTKEY", value_name = "NAME")]
    pub hotkey: Option<String>,
    /// Wallets directory (default ~/.bittensor/wallets, where btcli keeps them).
    #[arg(long, env = "IOTA_WALLETS_DIR", value_name = "DIR")]
    pub wallets_dir: Option<PathBuf>,
}

/// A hotkey named in full: where its file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalletRef {
    /// Wallet name.
    pub wallet: String,
    /// Hotkey name.
    pub hotkey: String,
    /// The wallets directory.
    pub dir: WalletDir,
}

impl WalletArgs {
    /// Fills what is unset from `fallback` (a lower-priority source).
    pub fn or(self, fallback: WalletArgs) -> WalletArgs {
        WalletArgs {
            wallet: self.wallet.or(fallback.wallet),
            hotkey: self.hotkey.or(fallback.hotkey),
            wallets_dir: self.wallets_dir.or(fallback.wallets_dir),
        }
    }

    /// The hotkey these arguments name, with the defaults applied.
    ///
    /// # Errors
    /// No `--wallets-dir` and no `HOME`.
    pub fn resolve(&self) -> anyhow::Result<WalletRef> {
        let dir = match &self.wallets_dir {
            Some(dir) => WalletDir::new(dir),
            None => WalletDir::default_location()?,
        };
        Ok(WalletRef {
            wallet: self.wallet.clone().unwrap_or_else(|| DEFAULT_NAME.into()),
            hotkey: self.hotkey.clone().unwrap_or_else(|| DEFAULT_NAME.into()),
            dir,
        })
    }
}

impl WalletRef {
    /// Loads the hotkey; a missing file says how to make one.
    ///
    /// # Errors
    /// The file is missing, unreadable or invalid.
    pub fn load(&self) -> anyhow::Result<Hotkey> {
        let path = self.dir.hotkey_path(&self.wallet, &self.hotkey)?;
        if !path.exists() {
            bail!(
                "hotkey {}/{} not found at {}: create it with `iota wallet new --wallet {} --hotkey {}{}` (or import one with `iota wallet import`)",
                self.wallet,
                self.hotkey,
                path.display(),
                self.wallet,
                self.hotkey,
                self.dir_flag()
            );
        }
        self.dir
            .load_hotkey(&self.wallet, &self.hotkey)
            .with_context(|| format!("loading hotkey {}/{}", self.wallet, self.hotkey))
    }

    /// ` --wallets-dir DIR` when the directory is not the default one, else "".
    pub fn dir_flag(&self) -> String {
        match WalletDir::default_location() {
            Ok(default) if default == self.dir => String::new(),
            _ => format!(" --wallets-dir {}", self.dir.root().display()),
        }
    }
}

/// Arguments of `iota wallet`.
#[derive(Debug, Args)]
pub struct WalletCmdArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: WalletAction,
}

/// `iota wallet` subcommands.
#[derive(Debug, Subcommand)]
pub enum WalletAction {
    /// Create a hotkey from a fresh 12-word mnemonic; the mnemonic is shown this once.
    New {
        /// Which hotkey.
        #[command(flatten)]
        wallet: WalletArgs,
        /// Replace an existing hotkey of that name (its old key is lost).
        #[arg(long)]
        overwrite: bool,
    },
    /// Import a hotkey from its mnemonic (or `0x` seed): prompted without echo on a terminal,
    /// else read from --mnemonic-file or standard input. Never pass it as an argument.
    Import {
        /// Which hotkey.
        #[command(flatten)]
        wallet: WalletArgs,
        /// Read the mnemonic from this file (`-`: standard input).
        #[arg(long, value_name = "FILE")]
        mnemonic_file: Option<PathBuf>,
        /// Replace an existing hotkey of that name.
        #[arg(long)]
        overwrite: bool,
    },
    /// List every wallet and hotkey with its SS58 address.
    List {
        /// Wallets directory (default ~/.bittensor/wallets).
        #[arg(long, env = "IOTA_WALLETS_DIR", value_name = "DIR")]
        wallets_dir: Option<PathBuf>,
    },
    /// Print a hotkey's SS58 address (alone on stdout, for scripts).
    Show {
        /// Which hotkey.
        #[command(flatten)]
        wallet: WalletArgs,
    },
    /// Decrypt the wallet's coldkey and confirm it matches coldkeypub.txt; print its SS58
    /// address (alone on stdout). The password comes from --password-env, else a hidden prompt
    /// on a terminal; it is never an argument. Writes nothing.
    Check {
        /// Wallet name (a directory under the wallets directory; default `default`).
        #[arg(long, env = "IOTA_WALLET", value_name = "NAME")]
        wallet: Option<String>,
        /// Wallets directory (default ~/.bittensor/wallets, where btcli keeps them).
        #[arg(long, env = "IOTA_WALLETS_DIR", value_name = "DIR")]
        wallets_dir: Option<PathBuf>,
        /// Read the coldkey's password from the environment variable of this name (the name,
        /// not the password).
        #[arg(long, value_name = "VAR")]
        password_env: Option<String>,
    },
}

/// Runs `iota wallet ...`.
///
/// # Errors
/// Bad names, an existing hotkey without --overwrite, an invalid mnemonic, unreadable files.
pub fn run(args: WalletCmdArgs) -> anyhow::Result<()> {
    match args.action {
        WalletAction::New { wallet, overwrite } => {
            let w = wallet.resolve()?;
            refuse_existing(&w, overwrite)?;
            let key = w
                .dir
                .create_hotkey(&w.wallet, &w.hotkey, overwrite)
                .with_context(|| format!("creating hotkey {}/{}", w.wallet, w.hotkey))?;
            let path = w.dir.hotkey_path(&w.wallet, &w.hotkey)?;
            println!(
                "created hotkey {}/{} in {} (mode 0600)",
                w.wallet,
                w.hotkey,
                path.display()
            );
            println!("address: {}", key.address());
            if let Some(phrase) = key.phrase() {
                println!(
                    "mnemonic (shown only this once; write it down and keep it secret, it is the key):"
                );
                println!("    {phrase}");
            }
            Ok(())
        }
        WalletAction::Import {
            wallet,
            mnemonic_file,
            overwrite,
        } => {
            let w = wallet.resolve()?;
            let path = refuse_existing(&w, overwrite)?;
            let secret = read_secret(mnemonic_file.as_ref())?;
            let key = key_from_secret(&secret)?;
            w.dir
                .save_hotkey(&w.wallet, &w.hotkey, &key, overwrite)
                .with_context(|| format!("saving hotkey {}/{}", w.wallet, w.hotkey))?;
            println!(
                "imported hotkey {}/{} into {} (mode 0600)",
                w.wallet,
                w.hotkey,
                path.display()
            );
            println!("address: {}", key.address());
            Ok(())
        }
        WalletAction::List { wallets_dir } => {
            let w = WalletArgs {
                wallets_dir,
                ..WalletArgs::default()
            }
            .resolve()?;
            let pairs = w.dir.list()?;
            if pairs.is_empty() {
                println!(
                    "no hotkeys in {}: create one with `iota wallet new`",
                    w.dir.root().display()
                );
                return Ok(());
            }
            println!("{:<16} {:<16} address", "wallet", "hotkey");
            for (wallet, hotkey) in pairs {
                let address = match w.dir.load_hotkey_address(&wallet, &hotkey) {
                    Ok(a) => a.to_string(),
                    Err(e) => format!("unreadable: {e}"),
                };
                println!("{wallet:<16} {hotkey:<16} {address}");
            }
            Ok(())
        }
        WalletAction::Show { wallet } => {
            let w = wallet.resolve()?;
            let path = w.dir.hotkey_path(&w.wallet, &w.hotkey)?;
            if !path.exists() {
                // Loading says how to create it.
                w.load()?;
            }
            let address = w
                .dir
                .load_hotkey_address(&w.wallet, &w.hotkey)
                .with_context(|| format!("reading hotkey {}/{}", w.wallet, w.hotkey))?;
            println!("{address}");
            Ok(())
        }
        WalletAction::Check {
            wallet,
            wallets_dir,
            password_env,
        } => {
            let w = WalletArgs {
                wallet,
                wallets_dir,
                hotkey: None,
            }
            .resolve()?;
            check_coldkey(&w, password_env.as_deref())
        }
    }
}

/// `iota wallet check`: decrypts the coldkey of `w.wallet` (asking for the password only when
/// it is encrypted), checks it against `coldkeypub.txt`, prints the address. Reads only.
fn check_coldkey(w: &WalletRef, password_env: Option<&str>) -> anyhow::Result<()> {
    let key = open_coldkey(w, password_env)?;
    eprintln!(
        "coldkey {} opens and matches {}",
        w.dir.coldkey_path(&w.wallet)?.display(),
        w.dir.coldkeypub_path(&w.wallet)?.display()
    );
    println!("{}", key.address());
    Ok(())
}

/// The address in `coldkeypub.txt` of wallet `w.wallet` (no password needed).
///
/// # Errors
/// The file is missing or unreadable.
pub fn coldkey_address(w: &WalletRef) -> anyhow::Result<Ss58Address> {
    let pub_path = w.dir.coldkeypub_path(&w.wallet)?;
    if !pub_path.exists() {
        bail!(
            "{} is missing: the wallet {} has no coldkey here (btcli writes coldkeypub.txt beside the coldkey; `btcli wallet regen-coldkeypub` restores it)",
            pub_path.display(),
            w.wallet
        );
    }
    Ok(read_public_file(&pub_path)?)
}

/// Decrypts the coldkey of wallet `w.wallet` (asking for the password only when it is
/// encrypted: from the variable named `password_env`, else a hidden prompt on a terminal) and
/// checks it against `coldkeypub.txt`. Reads only; the password is never stored or logged.
///
/// # Errors
/// A missing coldkey or public file, a wrong password, a coldkey that does not match.
pub fn open_coldkey(w: &WalletRef, password_env: Option<&str>) -> anyhow::Result<Hotkey> {
    let path = w.dir.coldkey_path(&w.wallet)?;
    if !path.exists() {
        bail!(
            "coldkey of wallet {} not found at {}: create it with `btcli wallet new-coldkey` (or restore it with `btcli wallet regen-coldkey`)",
            w.wallet,
            path.display()
        );
    }
    let data = read_secret_file(&path)?;
    let password = match KeyfileFormat::of(&data) {
        KeyfileFormat::Nacl => Some(coldkey_password(password_env, &w.wallet, &path)?),
        _ => None,
    };
    let key = parse_coldkey(&data, &path, password.as_ref().map(|p| p.as_bytes()))?;
    let pub_path = w.dir.coldkeypub_path(&w.wallet)?;
    if !pub_path.exists() {
        bail!(
            "{} is missing, so the coldkey (address {}) cannot be confirmed: btcli writes it beside the coldkey",
            pub_path.display(),
            key.address()
        );
    }
    let public = read_public_file(&pub_path)?;
    if public != *key.address() {
        bail!(
            "coldkey {} does not match {}: the coldkey's address is {}, the public file says {}",
            path.display(),
            pub_path.display(),
            key.address(),
            public
        );
    }
    Ok(key)
}

/// The coldkey's password: from the environment variable named `env_var`, else a hidden
/// prompt on a terminal, else an error saying to pass --password-env.
fn coldkey_password(
    env_var: Option<&str>,
    wallet: &str,
    path: &Path,
) -> anyhow::Result<Zeroizing<String>> {
    if let Some(var) = env_var {
        return match std::env::var(var) {
            Ok(password) => Ok(Zeroizing::new(password)),
            Err(VarError::NotPresent) => {
                bail!("--password-env {var}: the environment variable {var} is not set")
            }
            Err(VarError::NotUnicode(_)) => {
                bail!("--password-env {var}: the value of {var} is not UTF-8")
            }
        };
    }
    if std::io::stdin().is_terminal() {
        let password = dialoguer::Password::new()
            .with_prompt(format!("Password for coldkey {wallet} (input hidden)"))
            .allow_empty_password(true)
            .interact()
            .context("reading the coldkey password")?;
        return Ok(Zeroizing::new(password));
    }
    bail!(
        "coldkey {} is encrypted and there is no terminal to ask for its password: pass --password-env VAR, with the password in the environment variable VAR",
        path.display()
    )
}

/// The hotkey's path; an error if it exists and `overwrite` is false.
fn refuse_existing(w: &WalletRef, overwrite: bool) -> anyhow::Result<PathBuf> {
    let path = w.dir.hotkey_path(&w.wallet, &w.hotkey)?;
    if path.exists() && !overwrite {
        bail!(
            "hotkey {}/{} already exists at {}: pick another --hotkey, or pass --overwrite to replace it (its key is then lost)",
            w.wallet,
            w.hotkey,
            path.display()
        );
    }
    Ok(path)
}

/// The mnemonic from `file` (`-`: stdin), else a hidden prompt on a terminal, else stdin.
fn read_secret(file: Option<&PathBuf>) -> anyhow::Result<Zeroizing<String>> {
    let from_stdin = || -> anyhow::Result<Zeroizing<String>> {
        let mut text = Zeroizing::new(String::new());
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the mnemonic from standard input")?;
        Ok(text)
    };
    match file {
        Some(path) if path.as_os_str() == "-" => from_stdin(),
        Some(path) => Ok(Zeroizing::new(std::fs::read_to_string(path).with_context(
            || format!("reading the mnemonic from {}", path.display()),
        )?)),
        None if std::io::stdin().is_terminal() => {
            let text = dialoguer::Password::new()
                .with_prompt("Mnemonic (12-24 words, input hidden)")
                .interact()
                .context("reading the mnemonic")?;
            Ok(Zeroizing::new(text))
        }
        None => from_stdin(),
    }
}

/// A hotkey from a mnemonic (words separated by any whitespace) or a `0x` 32-byte seed.
///
/// # Errors
/// Empty input, an invalid mnemonic (bad word or checksum) or seed.
pub fn key_from_secret(secret: &str) -> anyhow::Result<Hotkey> {
    let text = secret.trim();
    if text.is_empty() {
        bail!("no mnemonic given (expected 12-24 words or a 0x seed)");
    }
    if let Some(hex_seed) = text.strip_prefix("0x") {
        let mut seed = Zeroizing::new([0u8; 32]);
        hex::decode_to_slice(hex_seed, seed.as_mut())
            .map_err(|_| anyhow::anyhow!("the seed is not 32 bytes of hex after 0x"))?;
        return Hotkey::from_seed(seed.as_ref()).context("invalid seed");
    }
    let words = Zeroizing::new(text.split_whitespace().collect::<Vec<_>>().join(" "));
    Hotkey::from_phrase(&words).context("invalid mnemonic")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wallet::DEV_PHRASE;

    #[test]
    fn secrets_are_normalised_and_checked() {
        let spaced = format!("  {}\n", DEV_PHRASE.replace(' ', "   "));
        let a = key_from_secret(&spaced).unwrap();
        assert_eq!(
            a.address(),
            Hotkey::from_phrase(DEV_PHRASE).unwrap().address()
        );
        assert!(key_from_secret("").is_err());
        assert!(key_from_secret("bottom drive obey").is_err());
        assert!(key_from_secret("0x1234").is_err());
        let seed = format!("0x{}", "11".repeat(32));
        assert!(key_from_secret(&seed).is_ok());
    }

    #[test]
    fn flags_win_over_fallbacks_and_defaults_fill_the_rest() {
        let flags = WalletArgs {
            wallet: Some("w".into()),
            ..WalletArgs::default()
        };
        let fallback = WalletArgs {
            wallet: Some("ignored".into()),
            hotkey: Some("h".into()),
            wallets_dir: Some("/tmp/x".into()),
        };
        let r = flags.or(fallback).resolve().unwrap();
        assert_eq!((r.wallet.as_str(), r.hotkey.as_str()), ("w", "h"));
        assert_eq!(r.dir.root(), std::path::Path::new("/tmp/x"));
        let r = WalletArgs {
            wallets_dir: Some("/tmp/y".into()),
            ..WalletArgs::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(
            (r.wallet.as_str(), r.hotkey.as_str()),
            ("default", "default")
        );
    }
}
