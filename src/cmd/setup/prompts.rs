//! The interactive questions of `iota setup` (dialoguer, on the terminal's stderr). Every
//! answer defaults to the matching flag, so `iota setup --orchestrator URL` only confirms it.
//! Secrets (mnemonics, S3 keys) are read without echo.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use dialoguer::theme::ColorfulTheme;
use dialoguer::{Confirm, Input, Password, Select};
use zeroize::Zeroizing;

use super::checks::{check_orchestrator, check_storage, check_tls, device_choices};
use super::{HotkeySource, Plan, Serving, SetupArgs, absolute, orchestrator_plan};
use crate::cmd::profile::{Role, config_dir, default_path, normalize_url};
use crate::cmd::wallet::{DEFAULT_NAME, WalletRef, key_from_secret};
use crate::model::config::PRESETS;
use crate::orchestrator::TlsFiles;
use crate::storage::StorageConfig;

fn theme() -> ColorfulTheme {
    ColorfulTheme::default()
}

/// Asks every question; returns the plan and where to write it.
///
/// # Errors
/// The terminal goes away (Ctrl-C, Esc) or an answer is unusable.
pub fn ask(args: &SetupArgs) -> anyhow::Result<(Plan, PathBuf)> {
    let roles = [Role::Miner, Role::Validator, Role::Orchestrator];
    let default_role = roles
        .iter()
        .position(|r| Some(*r) == args.role)
        .unwrap_or(0);
    let role = roles[Select::with_theme(&theme())
        .with_prompt("Role of this machine")
        .items([
            "miner: train a section of the model",
            "validator: check miners' work",
            "orchestrator: run a training run",
        ])
        .default(default_role)
        .interact()
        .context("asking the role")?];
    let plan = if role == Role::Orchestrator {
        ask_orchestrator(args)?
    } else {
        ask_node(args, role)?
    };
    let default_out = match &args.out {
        Some(path) => path.clone(),
        None => default_path(role)?,
    };
    let out: String = Input::with_theme(&theme())
        .with_prompt("Write the settings to")
        .default(default_out.display().to_string())
        .interact_text()
        .context("asking where to write")?;
    let out = PathBuf::from(out);
    if out.exists()
        && !Confirm::with_theme(&theme())
            .with_prompt(format!("{} exists. Replace it?", out.display()))
            .default(true)
            .interact()
            .context("asking to replace")?
    {
        anyhow::bail!("left {} unchanged", out.display());
    }
    Ok((plan, out))
}

fn ask_node(args: &SetupArgs, role: Role) -> anyhow::Result<Plan> {
    let defaults = args.wallet.resolve()?;
    let existing = defaults.dir.list().unwrap_or_default();
    let mut items = vec![
        "create a new hotkey".to_string(),
        "import a hotkey from its mnemonic".to_string(),
    ];
    for (w, h) in &existing {
        let address = defaults
            .dir
            .load_hotkey_address(w, h)
            .map(|a| a.to_string())
            .unwrap_or_else(|e| format!("unreadable: {e}"));
        items.push(format!("use {w}/{h} ({address})"));
    }
    let named = existing
        .iter()
        .position(|(w, h)| *w == defaults.wallet && *h == defaults.hotkey);
    let default_item = match (named, existing.is_empty()) {
        (Some(i), _) => i + 2,
        (None, false) => 2,
        (None, true) => 0,
    };
    let choice = Select::with_theme(&theme())
        .with_prompt(format!(
            "Hotkey (wallets in {})",
            defaults.dir.root().display()
        ))
        .items(&items)
        .default(default_item)
        .interact()
        .context("asking for the hotkey")?;
    let (wallet, source) = if choice >= 2 {
        let (w, h) = &existing[choice - 2];
        (
            WalletRef {
                wallet: w.clone(),
                hotkey: h.clone(),
                dir: defaults.dir.clone(),
            },
            HotkeySource::Existing,
        )
    } else {
        let wallet = ask_new_names(&defaults)?;
        let source = if choice == 0 {
            HotkeySource::Create
        } else {
            loop {
                let secret = Zeroizing::new(
                    Password::with_theme(&theme())
                        .with_prompt("Mnemonic (12-24 words, input hidden)")
                        .interact()
                        .context("asking for the mnemonic")?,
                );
                match key_from_secret(&secret) {
                    Ok(key) => {
                        eprintln!("  hotkey address: {}", key.address());
                        break HotkeySource::Import(secret);
                    }
                    Err(e) => eprintln!("  {e:#}; try again"),
                }
            }
        };
        (wallet, source)
    };
    let orchestrator = loop {
        let url_theme = theme();
        let mut input = Input::<String>::with_theme(&url_theme).with_prompt("Orchestrator URL");
        if let Some(url) = &args.orchestrator {
            input = input.default(url.clone());
        }
        let url = normalize_url(&input.interact_text().context("asking for the URL")?);
        match check_orchestrator(&url) {
            Ok(line) => {
                eprintln!("  reached it: {line}");
                break url;
            }
            Err(e) => {
                eprintln!("  {e:#}");
                if Confirm::with_theme(&theme())
                    .with_prompt("Keep this URL anyway (the orchestrator may not be up yet)?")
                    .default(false)
                    .interact()
                    .context("asking to keep the URL")?
                {
                    break url;
                }
            }
        }
    };
    let (choices, note) = device_choices();
    if let Some(note) = note {
        eprintln!("  note: {note}");
    }
    let default_device = choices
        .iter()
        .position(|c| Some(c.kind) == args.device)
        .unwrap_or(0);
    let labels: Vec<&str> = choices.iter().map(|c| c.label.as_str()).collect();
    let device = choices[Select::with_theme(&theme())
        .with_prompt("Compute device")
        .items(&labels)
        .default(default_device)
        .interact()
        .context("asking for the device")?]
    .kind;
    Ok(Plan::node(role, wallet, source, orchestrator, device, args))
}

/// Wallet and hotkey names for a new hotkey, refusing ones that exist.
fn ask_new_names(defaults: &WalletRef) -> anyhow::Result<WalletRef> {
    loop {
        let wallet: String = Input::with_theme(&theme())
            .with_prompt("Wallet name")
            .default(defaults.wallet.clone())
            .interact_text()
            .context("asking for the wallet name")?;
        let hotkey: String = Input::with_theme(&theme())
            .with_prompt("Hotkey name")
            .default(if defaults.hotkey.is_empty() {
                DEFAULT_NAME.to_string()
            } else {
                defaults.hotkey.clone()
            })
            .interact_text()
            .context("asking for the hotkey name")?;
        match defaults.dir.hotkey_path(&wallet, &hotkey) {
            Ok(path) if path.exists() => {
                eprintln!("  {wallet}/{hotkey} exists already; choose another name");
            }
            Ok(_) => {
                return Ok(WalletRef {
                    wallet,
                    hotkey,
                    dir: defaults.dir.clone(),
                });
            }
            Err(e) => eprintln!("  {e}"),
        }
    }
}

fn ask_orchestrator(args: &SetupArgs) -> anyhow::Result<Plan> {
    let run: String = Input::with_theme(&theme())
        .with_prompt("Run name")
        .default(args.run.clone().unwrap_or_else(|| "my-run".into()))
        .interact_text()
        .context("asking for the run name")?;
    let default_preset = PRESETS
        .iter()
        .position(|p| Some(*p) == args.preset.as_deref())
        .unwrap_or(0);
    let preset = PRESETS[Select::with_theme(&theme())
        .with_prompt("Model preset (`iota model info` describes them)")
        .items(PRESETS)
        .default(default_preset)
        .interact()
        .context("asking for the preset")?];
    let default_dir = match &args.data_dir {
        Some(dir) => dir.clone(),
        None => data_home()?.join(&run),
    };
    let data_dir = PathBuf::from(
        Input::<String>::with_theme(&theme())
            .with_prompt("Data directory (state, local objects)")
            .default(default_dir.display().to_string())
            .interact_text()
            .context("asking for the data directory")?,
    );
    let listen: SocketAddr = Input::with_theme(&theme())
        .with_prompt("Listen address")
        .default(
            args.listen
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8700))),
        )
        .interact_text()
        .context("asking for the listen address")?;
    let (serving, public_url) = ask_serving(args, listen)?;
    let mut previous = None;
    loop {
        let storage = ask_storage(args, &data_dir, previous.as_ref())?;
        match check_storage(&storage) {
            Ok(()) => {
                eprintln!("  storage {}: write, read and delete work", storage.url);
                let serving = Serving {
                    public_url: Some(public_url.clone()),
                    ..serving.clone()
                };
                return orchestrator_plan(&run, preset, &data_dir, &serving, storage);
            }
            Err(e) => {
                eprintln!("  storage check failed: {e:#}");
                let again = Select::with_theme(&theme())
                    .with_prompt("What now?")
                    .items(["enter the storage settings again", "abort"])
                    .default(0)
                    .interact()
                    .context("asking what to do")?;
                if again == 1 {
                    anyhow::bail!("setup aborted: the storage did not work ({e:#})");
                }
                previous = Some(storage);
            }
        }
    }
}

/// Asks how the orchestrator serves (HTTPS from certificate files, or plain HTTP) and its
/// public URL; a certificate is checked live and asked for again until it works.
fn ask_serving(args: &SetupArgs, listen: SocketAddr) -> anyhow::Result<(Serving, String)> {
    let kind = Select::with_theme(&theme())
        .with_prompt("Transport (miners' upload tokens cross it)")
        .items([
            "HTTPS with my certificate and key (PEM files, e.g. certbot's fullchain.pem and privkey.pem)",
            "plain HTTP (loopback only, or behind a TLS reverse proxy such as Caddy or nginx)",
        ])
        .default(usize::from(args.tls_cert.is_none() && listen.ip().is_loopback()))
        .interact()
        .context("asking for the transport")?;
    let scheme = if kind == 0 { "https" } else { "http" };
    let public_url = normalize_url(
        &Input::<String>::with_theme(&theme())
            .with_prompt("Public URL miners use")
            .default(
                args.public_url
                    .clone()
                    .unwrap_or_else(|| format!("{scheme}://{listen}")),
            )
            .interact_text()
            .context("asking for the public URL")?,
    );
    if kind == 1 {
        let insecure_http = !listen.ip().is_loopback()
            && Confirm::with_theme(&theme())
                .with_prompt(format!(
                    "{listen} is reachable from other machines: serve plain HTTP there anyway (`insecure_http: true`, only behind a TLS proxy)?"
                ))
                .default(false)
                .interact()
                .context("asking about plain HTTP")?;
        if !listen.ip().is_loopback() && !insecure_http {
            anyhow::bail!(
                "plain HTTP on {listen} refused: run setup again with a certificate, or listen on 127.0.0.1 behind a TLS proxy"
            );
        }
        let serving = Serving {
            listen: Some(listen),
            insecure_http,
            ..Serving::default()
        };
        return Ok((serving, public_url));
    }
    let path = |prompt: &str, default: Option<&PathBuf>| -> anyhow::Result<PathBuf> {
        let path_theme = theme();
        let mut input = Input::<String>::with_theme(&path_theme).with_prompt(prompt);
        if let Some(d) = default {
            input = input.default(d.display().to_string());
        }
        let answer = input
            .interact_text()
            .with_context(|| format!("asking for {prompt}"))?;
        Ok(absolute(std::path::Path::new(answer.trim())))
    };
    let (mut cert_default, mut key_default) = (args.tls_cert.clone(), args.tls_key.clone());
    loop {
        let files = TlsFiles {
            cert: path("Certificate chain (PEM)", cert_default.as_ref())?,
            key: path("Private key (PEM)", key_default.as_ref())?,
        };
        match check_tls(&files, &public_url) {
            Ok(line) => {
                eprintln!("  {line}");
                let serving = Serving {
                    listen: Some(listen),
                    tls: Some(files),
                    ..Serving::default()
                };
                return Ok((serving, public_url));
            }
            Err(e) => {
                eprintln!("  TLS check failed: {e:#}");
                if !Confirm::with_theme(&theme())
                    .with_prompt("Enter the certificate and key again?")
                    .default(true)
                    .interact()
                    .context("asking to try again")?
                {
                    anyhow::bail!("setup aborted: the certificate did not work ({e:#})");
                }
                cert_default = Some(files.cert);
                key_default = Some(files.key);
            }
        }
    }
}

/// Asks for the storage; defaults come from `previous` answers (a second try), else flags.
fn ask_storage(
    args: &SetupArgs,
    data_dir: &std::path::Path,
    previous: Option<&StorageConfig>,
) -> anyhow::Result<StorageConfig> {
    let prev = |f: fn(&StorageConfig) -> Option<String>| previous.and_then(f);
    let s3_default = prev(|p| Some(p.url.clone()))
        .or_else(|| args.storage_url.clone())
        .is_some_and(|u| u.starts_with("s3://"));
    let kind = Select::with_theme(&theme())
        .with_prompt("Object storage (activations, weights, checkpoints)")
        .items([
            "local directory (one machine, or miners reach it through the orchestrator)",
            "S3-compatible bucket (AWS S3, Cloudflare R2, MinIO)",
        ])
        .default(usize::from(s3_default))
        .interact()
        .context("asking for the storage")?;
    if kind == 0 {
        let dir: String = Input::with_theme(&theme())
            .with_prompt("Objects directory")
            .default(data_dir.join("objects").display().to_string())
            .interact_text()
            .context("asking for the directory")?;
        return Ok(StorageConfig::local(dir));
    }
    let text = |prompt: &str, default: Option<String>| -> anyhow::Result<String> {
        let text_theme = theme();
        let mut input = Input::<String>::with_theme(&text_theme).with_prompt(prompt);
        if let Some(d) = default {
            input = input.default(d);
        }
        input
            .interact_text()
            .with_context(|| format!("asking for {prompt}"))
    };
    let endpoint = text(
        "S3 endpoint URL",
        Some(
            prev(|p| p.endpoint.clone())
                .or_else(|| args.s3_endpoint.clone())
                .unwrap_or_else(|| "https://s3.amazonaws.com".into()),
        ),
    )?;
    let region = text(
        "Region",
        Some(
            prev(|p| p.region.clone())
                .or_else(|| args.s3_region.clone())
                .unwrap_or_else(|| "us-east-1".into()),
        ),
    )?;
    let url = text(
        "Bucket and prefix (s3://BUCKET/PREFIX)",
        prev(|p| Some(p.url.clone()))
            .filter(|u| u.starts_with("s3://"))
            .or_else(|| args.storage_url.clone().filter(|_| s3_default)),
    )?;
    let url = if url.starts_with("s3://") {
        url
    } else {
        format!("s3://{url}")
    };
    let access_key_id = text(
        "Access key id",
        prev(|p| p.access_key_id.clone()).or_else(|| args.s3_access_key_id.clone()),
    )?;
    let secret = match &args.s3_secret_access_key {
        Some(s) if !s.is_empty() => {
            eprintln!("  secret access key: from IOTA_S3_SECRET_ACCESS_KEY");
            s.clone()
        }
        _ => Password::with_theme(&theme())
            .with_prompt("Secret access key (input hidden)")
            .interact()
            .context("asking for the secret key")?,
    };
    Ok(StorageConfig {
        url,
        endpoint: Some(endpoint),
        region: Some(region),
        access_key_id: Some(access_key_id),
        secret_access_key: Some(secret),
    })
}

/// `$XDG_DATA_HOME/iota`, else `~/.local/share/iota` (next to the config directory).
fn data_home() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("iota"));
    }
    let config = config_dir()?;
    Ok(config
        .parent()
        .and_then(|p| p.parent())
        .map(|home| home.join(".local/share/iota"))
        .unwrap_or_else(|| PathBuf::from("iota-data")))
}
