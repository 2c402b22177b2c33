//! Bittensor's wallet layout on disk, read and written so that wallets made by `btcli` work in
//! iota unchanged and the other way round.
//!
//! # Format
//!
//! ```text
//! <wallets>/<wallet>/hotkeys/<hotkey>         secret keyfile, unencrypted JSON, mode 0600
//! <wallets>/<wallet>/hotkeys/<hotkey>pub.txt  public keyfile, JSON, mode 0644
//! <wallets>/<wallet>/coldkey                  secret keyfile, normally encrypted ($NACL)
//! <wallets>/<wallet>/coldkeypub.txt           public keyfile of the coldkey
//!
//! secret keyfile:
//! { "accountId":    "0x<32-byte public key hex>",
//!   "publicKey":    "0x<32-byte public key hex>",
//!   "privateKey":   "0x<64-byte schnorrkel SecretKey::to_bytes() hex>",
//!   "secretPhrase": "<mnemonic>" or null,
//!   "secretSeed":   "0x<32-byte mini secret hex>" or null,
//!   "ss58Address":  "<SS58, prefix 42>" }
//!
//! public keyfile: only accountId, publicKey and ss58Address (what btcli writes there).
//! ```
//!
//! `<wallets>` defaults to `$HOME/.bittensor/wallets`. On reading, fields may be absent or
//! null; every field present must agree with the key, which is taken from `privateKey`, or
//! else `secretSeed`, or else `secretPhrase`. Encrypted hotkey files are refused with a clear
//! error; a coldkey in btcli's `$NACL` format is decrypted with its password (see
//! [`super::encrypted`] and [`parse_coldkey`]), and its older encrypted formats are refused.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use zeroize::{Zeroize, Zeroizing};

use super::encrypted::{self, DecryptError, KeyfileFormat};
use super::keys::{Hotkey, KeyError, strip_0x};
use super::ss58::Ss58Address;

/// Why a wallet file could not be read or written. Every variant names the file.
#[derive(Debug, Error)]
pub enum WalletFileError {
    /// Reading, writing or creating the file or its directory failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The file is not a JSON object of keyfile fields.
    #[error("{}: not a valid keyfile: {reason}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// The keyfile is encrypted, which iota does not read (hotkeys are normally plain).
    #[error("{}: keyfile is encrypted; iota reads only unencrypted hotkey files", path.display())]
    Encrypted {
        /// The file.
        path: PathBuf,
    },
    /// The password does not open the `$NACL` coldkey (or the file is damaged, which looks
    /// the same).
    #[error("wrong password for coldkey {}", path.display())]
    WrongPassword {
        /// The file.
        path: PathBuf,
    },
    /// The coldkey is `$NACL`-encrypted and no password was given.
    #[error("{}: coldkey is encrypted and needs its password", path.display())]
    PasswordNeeded {
        /// The file.
        path: PathBuf,
    },
    /// The coldkey is in one of btcli's older encrypted formats, which iota does not read.
    #[error(
        "{}: coldkey is encrypted as {format}, which iota does not read: let btcli re-encrypt it \
         to $NACL (bittensor-wallet's Keyfile.check_and_update_encryption), or regenerate it \
         from its mnemonic with `btcli wallet regen-coldkey`",
        path.display()
    )]
    UnsupportedEncryption {
        /// The file.
        path: PathBuf,
        /// The format's name, e.g. "Ansible vault ($ANSIBLE_VAULT)".
        format: &'static str,
    },
    /// The `$NACL` data is malformed (e.g. truncated).
    #[error("{}: damaged coldkey: {reason}", path.display())]
    BadEncryption {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The keyfile holds no private key, seed or phrase.
    #[error("{}: keyfile has no privateKey, secretSeed or secretPhrase", path.display())]
    NoSecret {
        /// The file.
        path: PathBuf,
    },
    /// A field cannot be decoded or disagrees with the key.
    #[error("{}: field {field} {problem}", path.display())]
    BadField {
        /// The file.
        path: PathBuf,
        /// The JSON field name.
        field: &'static str,
        /// What is wrong, e.g. "does not match the private key".
        problem: String,
    },
    /// Creating a hotkey whose file exists, without `overwrite`.
    #[error("{}: hotkey already exists (pass overwrite to replace it)", path.display())]
    AlreadyExists {
        /// The existing file.
        path: PathBuf,
    },
    /// A wallet or hotkey name that is not a single plain file name.
    #[error("invalid {what} name {name:?}: use a plain name without '/', '\\' or '..'")]
    InvalidName {
        /// "wallet" or "hotkey".
        what: &'static str,
        /// The name given.
        name: String,
    },
    /// `$HOME` is unset, so the default wallets directory is unknown.
    #[error("cannot locate ~/.bittensor/wallets: HOME is not set (pass the wallets directory)")]
    NoHome,
    /// Generating a new key failed.
    #[error("generating a hotkey: {0}")]
    Key(#[from] KeyError),
}

/// The JSON fields of a Bittensor keyfile as read: all optional, `null` or absent alike.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyfileFields {
    #[serde(default)]
    account_id: Option<String>,
    #[serde(default)]
    public_key: Option<String>,
    #[serde(default)]
    private_key: Option<String>,
    #[serde(default)]
    secret_phrase: Option<String>,
    #[serde(default)]
    secret_seed: Option<String>,
    #[serde(default)]
    ss58_address: Option<String>,
}

impl Drop for KeyfileFields {
    fn drop(&mut self) {
        self.private_key.zeroize();
        self.secret_phrase.zeroize();
        self.secret_seed.zeroize();
    }
}

/// The secret keyfile as written: every field, `null` where the phrase or seed is unknown.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SecretKeyfile<'a> {
    account_id: &'a str,
    public_key: &'a str,
    private_key: &'a str,
    secret_phrase: Option<&'a str>,
    secret_seed: Option<&'a str>,
    ss58_address: &'a str,
}

/// The public keyfile as written: the public fields only, as btcli writes `<hotkey>pub.txt`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PublicKeyfile<'a> {
    account_id: &'a str,
    public_key: &'a str,
    ss58_address: &'a str,
}

/// The secret keyfile JSON for `key` (see the module's `# Format`).
fn secret_json(key: &Hotkey) -> Result<Zeroizing<String>, serde_json::Error> {
    let public = format!("0x{}", hex::encode(key.public_key()));
    let private = Zeroizing::new(format!(
        "0x{}",
        hex::encode(key.secret_key_bytes().as_ref())
    ));
    let seed = key
        .seed()
        .map(|s| Zeroizing::new(format!("0x{}", hex::encode(s))));
    let address = key.address().to_string();
    serde_json::to_string_pretty(&SecretKeyfile {
        account_id: &public,
        public_key: &public,
        private_key: &private,
        secret_phrase: key.phrase(),
        secret_seed: seed.as_deref().map(String::as_str),
        ss58_address: &address,
    })
    .map(Zeroizing::new)
}

/// The public keyfile JSON (`<hotkey>pub.txt`) for `address`.
fn public_json(address: &Ss58Address) -> Result<String, serde_json::Error> {
    let public = format!("0x{}", hex::encode(address.public_key()));
    serde_json::to_string_pretty(&PublicKeyfile {
        account_id: &public,
        public_key: &public,
        ss58_address: address.as_str(),
    })
}

fn bad(path: &Path, field: &'static str, problem: impl Into<String>) -> WalletFileError {
    WalletFileError::BadField {
        path: path.to_path_buf(),
        field,
        problem: problem.into(),
    }
}

fn parse_json(text: &[u8], path: &Path) -> Result<KeyfileFields, WalletFileError> {
    if KeyfileFormat::of(text).is_encrypted() {
        return Err(WalletFileError::Encrypted {
            path: path.to_path_buf(),
        });
    }
    serde_json::from_slice(text).map_err(|e| WalletFileError::Json {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Checks that the public fields present agree with `public_key`.
fn check_public_fields(
    json: &KeyfileFields,
    public_key: &[u8; 32],
    path: &Path,
) -> Result<(), WalletFileError> {
    for (field, value) in [
        ("accountId", &json.account_id),
        ("publicKey", &json.public_key),
    ] {
        if let Some(value) = value {
            let decoded =
                hex::decode(strip_0x(value.trim())).map_err(|_| bad(path, field, "is not hex"))?;
            if decoded != public_key {
                return Err(bad(path, field, "does not match the private key"));
            }
        }
    }
    if let Some(text) = &json.ss58_address {
        let address: Ss58Address = text
            .trim()
            .parse()
            .map_err(|e| bad(path, "ss58Address", format!("is invalid: {e}")))?;
        if address.public_key() != public_key {
            return Err(bad(path, "ss58Address", "does not match the private key"));
        }
    }
    Ok(())
}

/// Parses a secret keyfile and checks that all its fields agree.
///
/// # Errors
/// [`WalletFileError::Encrypted`], [`WalletFileError::Json`], [`WalletFileError::NoSecret`] or
/// [`WalletFileError::BadField`] (naming the field), each naming `path`.
pub fn parse_hotkey_json(text: &[u8], path: &Path) -> Result<Hotkey, WalletFileError> {
    let json = parse_json(text, path)?;
    let from_private = match &json.private_key {
        Some(hex_text) => {
            let bytes = Zeroizing::new(
                hex::decode(strip_0x(hex_text.trim()))
                    .map_err(|_| bad(path, "privateKey", "is not hex"))?,
            );
            Some(
                Hotkey::from_secret_key_bytes(&bytes)
                    .map_err(|e| bad(path, "privateKey", format!("is not a valid key: {e}")))?,
            )
        }
        None => None,
    };
    let from_seed = match &json.secret_seed {
        Some(hex_text) => {
            let bytes = Zeroizing::new(
                hex::decode(strip_0x(hex_text.trim()))
                    .map_err(|_| bad(path, "secretSeed", "is not hex"))?,
            );
            Some(
                Hotkey::from_seed(&bytes)
                    .map_err(|e| bad(path, "secretSeed", format!("is invalid: {e}")))?,
            )
        }
        None => None,
    };
    let from_phrase = match &json.secret_phrase {
        Some(phrase) => Some(
            Hotkey::from_phrase(phrase)
                .map_err(|e| bad(path, "secretPhrase", format!("is invalid: {e}")))?,
        ),
        None => None,
    };

    // The key that signs is the private key when present; the others must agree with it.
    let mut candidates = [
        ("privateKey", from_private),
        ("secretSeed", from_seed),
        ("secretPhrase", from_phrase),
    ]
    .into_iter()
    .filter_map(|(field, key)| key.map(|k| (field, k)));
    let Some((_, key)) = candidates.next() else {
        return Err(WalletFileError::NoSecret {
            path: path.to_path_buf(),
        });
    };
    let mut phrase_key = None;
    let mut seed_key = None;
    for (field, other) in candidates {
        if other.public_key() != key.public_key() {
            let basis = if json.private_key.is_some() {
                "the private key"
            } else {
                "the secret seed"
            };
            return Err(bad(path, field, format!("does not match {basis}")));
        }
        match field {
            "secretPhrase" => phrase_key = Some(other),
            _ => seed_key = Some(other),
        }
    }
    check_public_fields(&json, &key.public_key(), path)?;
    // Keep the most complete form, so that saving the key again loses nothing.
    Ok(phrase_key.or(seed_key).unwrap_or(key))
}

/// Parses a coldkey file's bytes: a `$NACL` file is decrypted with `password` and then read
/// as [`parse_hotkey_json`] reads a plain one; a plain (unencrypted) coldkey needs no password.
///
/// The key derivation of a `$NACL` file costs 512 MiB and a few seconds, even for a wrong
/// password. Nothing is written.
///
/// # Errors
/// [`WalletFileError::PasswordNeeded`] (encrypted, `password` is `None`),
/// [`WalletFileError::WrongPassword`], [`WalletFileError::UnsupportedEncryption`] (btcli's
/// older formats), [`WalletFileError::BadEncryption`] (truncated), or as [`parse_hotkey_json`].
pub fn parse_coldkey(
    data: &[u8],
    path: &Path,
    password: Option<&[u8]>,
) -> Result<Hotkey, WalletFileError> {
    match KeyfileFormat::of(data) {
        KeyfileFormat::Plain => parse_hotkey_json(data, path),
        KeyfileFormat::Nacl => {
            let password = password.ok_or_else(|| WalletFileError::PasswordNeeded {
                path: path.to_path_buf(),
            })?;
            let plain = encrypted::decrypt_nacl(data, password).map_err(|e| match e {
                DecryptError::WrongPassword => WalletFileError::WrongPassword {
                    path: path.to_path_buf(),
                },
                other => WalletFileError::BadEncryption {
                    path: path.to_path_buf(),
                    reason: other.to_string(),
                },
            })?;
            parse_hotkey_json(&plain, path)
        }
        format => Err(WalletFileError::UnsupportedEncryption {
            path: path.to_path_buf(),
            format: format.name(),
        }),
    }
}

/// Reads a secret keyfile's bytes into memory that is wiped when dropped.
///
/// # Errors
/// [`WalletFileError::Io`], naming the file.
pub fn read_secret_file(path: &Path) -> Result<Zeroizing<Vec<u8>>, WalletFileError> {
    fs::read(path)
        .map(Zeroizing::new)
        .map_err(|source| WalletFileError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// Reads a secret hotkey file (see [`parse_hotkey_json`]).
///
/// # Errors
/// [`WalletFileError::Io`] if it cannot be read, otherwise as [`parse_hotkey_json`].
pub fn read_hotkey_file(path: &Path) -> Result<Hotkey, WalletFileError> {
    parse_hotkey_json(&read_secret_file(path)?, path)
}

/// Reads a public keyfile (`<hotkey>pub.txt`, or a secret keyfile) for its address.
///
/// # Errors
/// [`WalletFileError::Io`], [`WalletFileError::Json`], [`WalletFileError::Encrypted`], or
/// [`WalletFileError::BadField`] if the public fields are missing, invalid or disagree.
pub fn read_public_file(path: &Path) -> Result<Ss58Address, WalletFileError> {
    let text = fs::read(path).map_err(|source| WalletFileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let json = parse_json(&text, path)?;
    let public_key = if let Some(text) = &json.ss58_address {
        *text
            .trim()
            .parse::<Ss58Address>()
            .map_err(|e| bad(path, "ss58Address", format!("is invalid: {e}")))?
            .public_key()
    } else if let Some(text) = json.public_key.as_ref().or(json.account_id.as_ref()) {
        let mut key = [0u8; 32];
        hex::decode_to_slice(strip_0x(text.trim()), &mut key)
            .map_err(|_| bad(path, "publicKey", "is not 32 bytes of hex"))?;
        key
    } else {
        return Err(bad(
            path,
            "ss58Address",
            "is missing (no public field at all)",
        ));
    };
    check_public_fields(&json, &public_key, path)?;
    Ok(Ss58Address::from_public_key(public_key))
}

/// A Bittensor wallets directory (`~/.bittensor/wallets` by default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalletDir {
    /// The directory holding one subdirectory per wallet.
    root: PathBuf,
}

fn check_name(what: &'static str, name: &str) -> Result<(), WalletFileError> {
    let plain = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && name.trim() == name;
    if plain {
        Ok(())
    } else {
        Err(WalletFileError::InvalidName {
            what,
            name: name.to_string(),
        })
    }
}

impl WalletDir {
    /// Wallets under `root`.
    pub fn new(root: impl Into<PathBuf>) -> WalletDir {
        WalletDir { root: root.into() }
    }

    /// `$HOME/.bittensor/wallets`, btcli's default.
    ///
    /// # Errors
    /// [`WalletFileError::NoHome`] if `HOME` is unset or empty.
    pub fn default_location() -> Result<WalletDir, WalletFileError> {
        match std::env::var_os("HOME") {
            Some(home) if !home.is_empty() => Ok(WalletDir::new(
                PathBuf::from(home).join(".bittensor").join("wallets"),
            )),
            _ => Err(WalletFileError::NoHome),
        }
    }

    /// The wallets directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/<wallet>/coldkey`, the secret coldkey file.
    ///
    /// # Errors
    /// [`WalletFileError::InvalidName`] unless `wallet` is a plain file name.
    pub fn coldkey_path(&self, wallet: &str) -> Result<PathBuf, WalletFileError> {
        check_name("wallet", wallet)?;
        Ok(self.root.join(wallet).join("coldkey"))
    }

    /// `<root>/<wallet>/coldkeypub.txt`, the coldkey's public file.
    ///
    /// # Errors
    /// [`WalletFileError::InvalidName`] unless `wallet` is a plain file name.
    pub fn coldkeypub_path(&self, wallet: &str) -> Result<PathBuf, WalletFileError> {
        check_name("wallet", wallet)?;
        Ok(self.root.join(wallet).join("coldkeypub.txt"))
    }

    /// `<root>/<wallet>/hotkeys/<hotkey>`.
    ///
    /// # Errors
    /// [`WalletFileError::InvalidName`] unless both names are plain file names.
    pub fn hotkey_path(&self, wallet: &str, hotkey: &str) -> Result<PathBuf, WalletFileError> {
        check_name("wallet", wallet)?;
        check_name("hotkey", hotkey)?;
        Ok(self.root.join(wallet).join("hotkeys").join(hotkey))
    }

    /// `<root>/<wallet>/hotkeys/<hotkey>pub.txt`.
    ///
    /// # Errors
    /// [`WalletFileError::InvalidName`] unless both names are plain file names.
    pub fn hotkey_pub_path(&self, wallet: &str, hotkey: &str) -> Result<PathBuf, WalletFileError> {
        check_name("wallet", wallet)?;
        check_name("hotkey", hotkey)?;
        Ok(self
            .root
            .join(wallet)
            .join("hotkeys")
            .join(format!("{hotkey}pub.txt")))
    }

    /// Loads and checks a hotkey (see [`parse_hotkey_json`]).
    ///
    /// # Errors
    /// Any [`WalletFileError`], naming the file.
    pub fn load_hotkey(&self, wallet: &str, hotkey: &str) -> Result<Hotkey, WalletFileError> {
        read_hotkey_file(&self.hotkey_path(wallet, hotkey)?)
    }

    /// The address of a hotkey from its public file, or from the secret file if there is no
    /// public one (older btcli versions wrote none).
    ///
    /// # Errors
    /// Any [`WalletFileError`], naming the file.
    pub fn load_hotkey_address(
        &self,
        wallet: &str,
        hotkey: &str,
    ) -> Result<Ss58Address, WalletFileError> {
        let pub_path = self.hotkey_pub_path(wallet, hotkey)?;
        if pub_path.exists() {
            read_public_file(&pub_path)
        } else {
            read_public_file(&self.hotkey_path(wallet, hotkey)?)
        }
    }

    /// Writes `key` as hotkey `hotkey` of `wallet`: the secret file (mode 0600) and its
    /// `pub.txt`, creating directories as needed. Returns the secret file's path.
    ///
    /// Each file is written to a temporary name and renamed into place, so a crash never
    /// leaves a half-written key.
    ///
    /// # Errors
    /// [`WalletFileError::AlreadyExists`] if the hotkey exists and `overwrite` is false,
    /// [`WalletFileError::InvalidName`], or [`WalletFileError::Io`].
    pub fn save_hotkey(
        &self,
        wallet: &str,
        hotkey: &str,
        key: &Hotkey,
        overwrite: bool,
    ) -> Result<PathBuf, WalletFileError> {
        let path = self.hotkey_path(wallet, hotkey)?;
        let pub_path = self.hotkey_pub_path(wallet, hotkey)?;
        if !overwrite && path.exists() {
            return Err(WalletFileError::AlreadyExists { path });
        }
        let dir = path.parent().unwrap_or(&self.root);
        fs::create_dir_all(dir).map_err(|source| WalletFileError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let json_err = |path: &Path, e: serde_json::Error| WalletFileError::Json {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let secret = secret_json(key).map_err(|e| json_err(&path, e))?;
        let public = public_json(key.address()).map_err(|e| json_err(&pub_path, e))?;
        write_atomically(&path, secret.as_bytes(), 0o600)?;
        write_atomically(&pub_path, public.as_bytes(), 0o644)?;
        Ok(path)
    }

    /// Every `(wallet, hotkey)` pair with a secret hotkey file under the root, sorted by
    /// name. Public files (`*pub.txt`), hidden and temporary files are skipped; a missing
    /// root is an empty list.
    ///
    /// # Errors
    /// [`WalletFileError::Io`] if the root or a wallet directory exists but cannot be read.
    pub fn list(&self) -> Result<Vec<(String, String)>, WalletFileError> {
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| WalletFileError::Io { path, source }
        };
        let names = |dir: &Path| -> Result<Vec<(String, bool)>, WalletFileError> {
            let mut out = Vec::new();
            for entry in fs::read_dir(dir).map_err(io_err(dir))? {
                let entry = entry.map_err(io_err(dir))?;
                let Ok(name) = entry.file_name().into_string() else {
                    continue;
                };
                let is_dir = entry.file_type().map_err(io_err(&entry.path()))?.is_dir();
                if !name.starts_with('.') {
                    out.push((name, is_dir));
                }
            }
            out.sort();
            Ok(out)
        };
        if !self.root.is_dir() {
            return Ok(Vec::new());
        }
        let mut pairs = Vec::new();
        for (wallet, is_dir) in names(&self.root)? {
            let hotkeys = self.root.join(&wallet).join("hotkeys");
            if !is_dir || !hotkeys.is_dir() {
                continue;
            }
            for (hotkey, is_dir) in names(&hotkeys)? {
                if !is_dir && !hotkey.ends_with("pub.txt") {
                    pairs.push((wallet.clone(), hotkey));
                }
            }
        }
        Ok(pairs)
    }

    /// Generates a new hotkey from a fresh 12-word mnemonic and saves it (see
    /// [`WalletDir::save_hotkey`]). The phrase is in the secret file; show it to the user once.
    ///
    /// # Errors
    /// As [`WalletDir::save_hotkey`], or [`WalletFileError::Key`] if the OS RNG fails.
    pub fn create_hotkey(
        &self,
        wallet: &str,
        hotkey: &str,
        overwrite: bool,
    ) -> Result<Hotkey, WalletFileError> {
        // Check before generating, so a refusal costs nothing.
        let path = self.hotkey_path(wallet, hotkey)?;
        if !overwrite && path.exists() {
            return Err(WalletFileError::AlreadyExists { path });
        }
        let key = Hotkey::generate()?;
        self.save_hotkey(wallet, hotkey, &key, overwrite)?;
        Ok(key)
    }
}

/// Writes `bytes` to a fresh temporary file beside `path` with `mode`, then renames it over
/// `path`.
fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), WalletFileError> {
    let io_err = |source| WalletFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.tmp{}", std::process::id()));
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let result = (|| {
        let mut file = options.open(&tmp)?;
        // The mode is only applied on creation: enforce it if a stale temp file existed.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(fs::Permissions::from_mode(mode))?;
        }
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(io_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wallet::keys::DEV_PHRASE;

    const DEV_ADDRESS: &str = "5DfhGyQdFobKM8NsWvEeAKk5EQQgYe9AydgJ7rMB6E1EqRzV";

    #[test]
    fn list_finds_hotkeys_and_skips_public_files() {
        let dir = tempfile::tempdir().unwrap();
        let wallets = WalletDir::new(dir.path().join("wallets"));
        assert!(
            wallets.list().unwrap().is_empty(),
            "a missing root is empty"
        );
        let key = Hotkey::from_phrase(DEV_PHRASE).unwrap();
        wallets.save_hotkey("b", "h2", &key, false).unwrap();
        wallets.save_hotkey("b", "h1", &key, false).unwrap();
        wallets.save_hotkey("a", "x", &key, false).unwrap();
        fs::create_dir_all(dir.path().join("wallets/empty")).unwrap();
        fs::write(dir.path().join("wallets/a/coldkeypub.txt"), "{}").unwrap();
        assert_eq!(
            wallets.list().unwrap(),
            vec![
                ("a".to_string(), "x".to_string()),
                ("b".to_string(), "h1".to_string()),
                ("b".to_string(), "h2".to_string())
            ]
        );
    }

    #[test]
    fn write_then_read_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let wallets = WalletDir::new(dir.path());
        let key = Hotkey::from_phrase(DEV_PHRASE).unwrap();
        let path = wallets
            .save_hotkey("miner", "default", &key, false)
            .unwrap();
        assert_eq!(path, dir.path().join("miner/hotkeys/default"));

        let loaded = wallets.load_hotkey("miner", "default").unwrap();
        assert_eq!(loaded.address().as_str(), DEV_ADDRESS);
        assert_eq!(loaded.phrase(), Some(DEV_PHRASE));
        assert_eq!(loaded.seed(), key.seed());
        assert_eq!(*loaded.secret_key_bytes(), *key.secret_key_bytes());
        assert_eq!(
            wallets
                .load_hotkey_address("miner", "default")
                .unwrap()
                .as_str(),
            DEV_ADDRESS
        );

        // The public file holds exactly the public fields.
        let pub_text = fs::read_to_string(dir.path().join("miner/hotkeys/defaultpub.txt")).unwrap();
        let pub_json: serde_json::Value = serde_json::from_str(&pub_text).unwrap();
        let mut keys: Vec<&str> = pub_json
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, ["accountId", "publicKey", "ss58Address"]);

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
    }

    #[test]
    fn derived_key_is_written_with_null_phrase() {
        let dir = tempfile::tempdir().unwrap();
        let wallets = WalletDir::new(dir.path());
        let alice = Hotkey::from_uri("//Alice").unwrap();
        let path = wallets.save_hotkey("w", "alice", &alice, false).unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert!(json["secretPhrase"].is_null());
        assert_eq!(json["secretSeed"].as_str().unwrap().len(), 66);
        assert_eq!(json["privateKey"].as_str().unwrap().len(), 130);
        assert_eq!(
            json["ss58Address"],
            "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"
        );
        let loaded = wallets.load_hotkey("w", "alice").unwrap();
        assert_eq!(loaded.address(), alice.address());
    }

    #[test]
    fn refuses_to_overwrite_unless_asked() {
        let dir = tempfile::tempdir().unwrap();
        let wallets = WalletDir::new(dir.path());
        let first = wallets.create_hotkey("w", "h", false).unwrap();
        assert!(matches!(
            wallets.create_hotkey("w", "h", false),
            Err(WalletFileError::AlreadyExists { .. })
        ));
        assert_eq!(
            wallets.load_hotkey("w", "h").unwrap().address(),
            first.address()
        );
        let second = wallets.create_hotkey("w", "h", true).unwrap();
        assert_ne!(second.address(), first.address());
        assert_eq!(
            wallets.load_hotkey("w", "h").unwrap().address(),
            second.address()
        );
        assert_eq!(
            wallets.load_hotkey("w", "h").unwrap().phrase(),
            second.phrase()
        );
    }

    /// A keyfile as btcli writes it, typed by hand from the dev phrase's known values.
    fn btcli_json(private_key_hex: &str, seed_hex: &str) -> String {
        format!(
            r#"{{"accountId": "0x46ebddef8cd9bb167dc30878d7113b7e168e6f0646beffd77d69d39bad76b47a",
"publicKey": "0x46ebddef8cd9bb167dc30878d7113b7e168e6f0646beffd77d69d39bad76b47a",
"privateKey": "0x{private_key_hex}",
"secretPhrase": "{DEV_PHRASE}",
"secretSeed": "0x{seed_hex}",
"ss58Address": "{DEV_ADDRESS}"}}"#
        )
    }

    fn dev_secret_hex() -> (String, String) {
        let key = Hotkey::from_phrase(DEV_PHRASE).unwrap();
        (
            hex::encode(key.secret_key_bytes().as_ref()),
            hex::encode(key.seed().unwrap()),
        )
    }

    #[test]
    fn btcli_keyfile_loads() {
        let (private_key, seed) = dev_secret_hex();
        // Substrate's documented mini secret of the development phrase.
        assert_eq!(
            seed,
            "fac7959dbfe72f052e5a0c3c8d6530f202b02fd8f9f5ca3580ec8deb7797479e"
        );
        let path = Path::new("hotkeys/default");
        let key = parse_hotkey_json(btcli_json(&private_key, &seed).as_bytes(), path).unwrap();
        assert_eq!(key.address().as_str(), DEV_ADDRESS);
        assert_eq!(key.phrase(), Some(DEV_PHRASE));

        // Only a phrase, with nulls elsewhere, as older tools write.
        let minimal = format!(
            r#"{{"secretPhrase": "{DEV_PHRASE}", "privateKey": null, "secretSeed": null}}"#
        );
        let key = parse_hotkey_json(minimal.as_bytes(), path).unwrap();
        assert_eq!(key.address().as_str(), DEV_ADDRESS);
    }

    #[test]
    fn mismatched_and_malformed_files_name_the_problem() {
        let (private_key, seed) = dev_secret_hex();
        let path = Path::new("/wallets/w/hotkeys/h");
        let alice = Hotkey::from_uri("//Alice").unwrap();
        let alice_private = hex::encode(alice.secret_key_bytes().as_ref());

        // A private key from another key than the phrase's.
        let err =
            parse_hotkey_json(btcli_json(&alice_private, &seed).as_bytes(), path).unwrap_err();
        assert!(
            matches!(
                err,
                WalletFileError::BadField {
                    field: "secretSeed",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("/wallets/w/hotkeys/h"), "{err}");

        // A public key that is not the private key's.
        let text = btcli_json(&private_key, &seed).replacen("0x46eb", "0x46ec", 1);
        let err = parse_hotkey_json(text.as_bytes(), path).unwrap_err();
        assert!(
            matches!(
                err,
                WalletFileError::BadField {
                    field: "accountId",
                    ..
                }
            ),
            "{err}"
        );

        // A wrong address.
        let text = btcli_json(&private_key, &seed).replace(
            DEV_ADDRESS,
            "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY",
        );
        let err = parse_hotkey_json(text.as_bytes(), path).unwrap_err();
        assert!(
            matches!(
                err,
                WalletFileError::BadField {
                    field: "ss58Address",
                    ..
                }
            ),
            "{err}"
        );

        let err = parse_hotkey_json(b"{\"privateKey\": \"0xzz\"}", path).unwrap_err();
        assert!(
            matches!(
                err,
                WalletFileError::BadField {
                    field: "privateKey",
                    ..
                }
            ),
            "{err}"
        );
        let err = parse_hotkey_json(b"{not json", path).unwrap_err();
        assert!(matches!(err, WalletFileError::Json { .. }), "{err}");
        let err = parse_hotkey_json(b"[1, 2]", path).unwrap_err();
        assert!(matches!(err, WalletFileError::Json { .. }), "{err}");
        let err = parse_hotkey_json(b"{\"ss58Address\": null}", path).unwrap_err();
        assert!(matches!(err, WalletFileError::NoSecret { .. }), "{err}");
        let err = parse_hotkey_json(b"$NACL\x01\x02", path).unwrap_err();
        assert!(matches!(err, WalletFileError::Encrypted { .. }), "{err}");
    }

    #[test]
    fn coldkeys_plain_or_refused_before_any_key_derivation() {
        let (private_key, seed) = dev_secret_hex();
        let path = Path::new("/wallets/w/coldkey");
        // An unencrypted coldkey (btcli --no-use-password) reads like a hotkey, password or not.
        let plain = btcli_json(&private_key, &seed);
        for password in [None, Some(&b"ignored"[..])] {
            let key = parse_coldkey(plain.as_bytes(), path, password).unwrap();
            assert_eq!(key.address().as_str(), DEV_ADDRESS);
        }
        let nacl = [&b"$NACL"[..], &[0u8; 24 + 16 + 10]].concat();
        let err = parse_coldkey(&nacl, path, None).unwrap_err();
        assert!(
            matches!(err, WalletFileError::PasswordNeeded { .. }),
            "{err}"
        );
        let err = parse_coldkey(&nacl[..30], path, Some(b"pw")).unwrap_err();
        assert!(
            matches!(err, WalletFileError::BadEncryption { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("truncated"), "{err}");
        for (data, format) in [
            (&b"$ANSIBLE_VAULT;1.1;AES256\n3633"[..], "Ansible vault"),
            (&b"gAAAAABkxyz"[..], "Fernet"),
        ] {
            let err = parse_coldkey(data, path, Some(b"pw")).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(err, WalletFileError::UnsupportedEncryption { .. }),
                "{text}"
            );
            assert!(text.contains(format) && text.contains("btcli"), "{text}");
            assert!(text.contains("/wallets/w/coldkey") && !text.contains('\n'));
        }
        let wallets = WalletDir::new("/wallets");
        assert_eq!(wallets.coldkey_path("w").unwrap(), path);
        assert_eq!(
            wallets.coldkeypub_path("w").unwrap(),
            Path::new("/wallets/w/coldkeypub.txt")
        );
        assert!(wallets.coldkey_path("../x").is_err());
    }

    #[test]
    fn missing_file_and_bad_names_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let wallets = WalletDir::new(dir.path());
        let err = wallets.load_hotkey("nope", "default").unwrap_err();
        assert!(matches!(err, WalletFileError::Io { .. }));
        assert!(err.to_string().contains("nope/hotkeys/default"), "{err}");
        for name in ["", "..", "a/b", "a\\b", " x"] {
            assert!(
                matches!(
                    wallets.hotkey_path("w", name),
                    Err(WalletFileError::InvalidName { what: "hotkey", .. })
                ),
                "{name:?}"
            );
        }
        assert!(matches!(
            wallets.hotkey_path("..", "h"),
            Err(WalletFileError::InvalidName { what: "wallet", .. })
        ));
    }

    #[test]
    fn default_location_is_under_home() {
        // Only checks the shape of the path: HOME is whatever the test runner has.
        if let Ok(wallets) = WalletDir::default_location() {
            assert!(wallets.root().ends_with(".bittensor/wallets"));
        }
    }
}
