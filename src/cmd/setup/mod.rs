//! `iota setup`: one command instead of the reference's setup.sh and hand-edited `.env`.
//!
//! Asks (on a terminal, with dialoguer) or takes from flags (`--yes`): the role, the hotkey
//! (existing, new, or imported from its mnemonic), the orchestrator and the device for a
//! miner or validator; the run name, model preset, data directory, address and storage
//! (local directory, or S3 with a live write/read/delete check) for an orchestrator. Then it
//! writes the settings (`~/.config/iota/<role>.yaml`, mode 0600) and prints the exact command
//! to start. Without a terminal and without `--yes` it refuses, naming the flags to pass.
//!
//! - [`checks`]: the live checks (orchestrator, storage) and device detection.
//! - [`prompts`]: the interactive questions.

pub mod checks;
pub mod prompts;

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::json;

use super::profile::{NodeProfile, Role, default_path, normalize_url, write_private};
use super::wallet::{WalletArgs, WalletRef, key_from_secret};
use crate::model::backend::DeviceKind;
use crate::orchestrator::{RunConfig, TlsFiles};
use crate::storage::StorageConfig;

/// Arguments of `iota setup`.
#[derive(Debug, Clone, Default, Args)]
pub struct SetupArgs {
    /// Role of this machine.
    #[arg(long, value_enum)]
    pub role: Option<Role>,
    /// The hotkey (created when it does not exist, unless --mnemonic-file imports it).
    #[command(flatten)]
    pub wallet: WalletArgs,
    /// Import the hotkey from the mnemonic in this file (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    pub mnemonic_file: Option<PathBuf>,
    /// Orchestrator URL (miner, validator).
    #[arg(long, env = "IOTA_ORCHESTRATOR", value_name = "URL")]
    pub orchestrator: Option<String>,
    /// Compute device (miner, validator): cpu, cuda, wgpu (default: the best detected).
    #[arg(long)]
    pub device: Option<DeviceKind>,
    /// Compute threads (miner; default all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Forwards in flight to ask for (miner; default 4).
    #[arg(long)]
    pub max_in_flight: Option<usize>,
    /// Run name (orchestrator).
    #[arg(long, value_name = "NAME")]
    pub run: Option<String>,
    /// Model preset (orchestrator): tiny, small, 1b, 8b, 15b.
    #[arg(long)]
    pub preset: Option<String>,
    /// Directory for the run's state and local objects (orchestrator).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Address the orchestrator listens on (default 127.0.0.1:8700).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Base URL miners use to reach the orchestrator (default http://LISTEN, or https://LISTEN
    /// with --tls-cert).
    #[arg(long, value_name = "URL")]
    pub public_url: Option<String>,
    /// The orchestrator's TLS certificate chain, PEM (with --tls-key): serve HTTPS.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, PEM.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP on a non-loopback --listen (only behind a TLS reverse proxy).
    #[arg(long, conflicts_with = "tls_cert")]
    pub insecure_http: bool,
    /// Object storage (orchestrator): `s3://bucket/prefix`, or a directory (default:
    /// DATA_DIR/objects).
    #[arg(long, value_name = "URL")]
    pub storage_url: Option<String>,
    /// S3 endpoint, e.g. https://ACCOUNT.r2.cloudflarestorage.com (default: AWS).
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// S3 region (default us-east-1).
    #[arg(long)]
    pub s3_region: Option<String>,
    /// S3 access key id.
    #[arg(long, env = "IOTA_S3_ACCESS_KEY_ID", value_name = "ID")]
    pub s3_access_key_id: Option<String>,
    /// S3 secret access key (prefer the variable: arguments are visible to other users).
    #[arg(
        long,
        env = "IOTA_S3_SECRET_ACCESS_KEY",
        hide_env_values = true,
        value_name = "SECRET"
    )]
    pub s3_secret_access_key: Option<String>,
    /// Skip the live orchestrator and storage checks.
    #[arg(long)]
    pub skip_check: bool,
    /// Where to write the settings (default ~/.config/iota/<role>.yaml).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Do not ask: take every answer from the flags and defaults (for scripts).
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// How the hotkey is obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HotkeySource {
    /// It exists already.
    Existing,
    /// Create it from a fresh mnemonic.
    Create,
    /// Import it from this mnemonic (or `0x` seed).
    Import(zeroize::Zeroizing<String>),
}

/// Everything setup decided, before anything is written.
// One plan per setup run: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Plan {
    /// A miner or validator.
    Node {
        /// The hotkey.
        wallet: WalletRef,
        /// How to get it.
        source: HotkeySource,
        /// The settings to write.
        profile: NodeProfile,
    },
    /// An orchestrator.
    Orchestrator {
        /// The run config (validated).
        config: Box<RunConfig>,
        /// Its YAML text.
        yaml: String,
    },
}

/// The flags to pass when there is no terminal to ask on.
const SCRIPT_FLAGS: &str = "--yes with --role miner|validator --wallet NAME --hotkey NAME [--wallets-dir DIR] [--mnemonic-file FILE] --orchestrator URL [--ca-file FILE] [--device D] [--out FILE], or --role orchestrator --run NAME --preset P --data-dir DIR [--listen ADDR] [--public-url URL] [--tls-cert FILE --tls-key FILE | --insecure-http] [--storage-url s3://BUCKET/PREFIX --s3-endpoint URL --s3-region R, keys in IOTA_S3_ACCESS_KEY_ID / IOTA_S3_SECRET_ACCESS_KEY]";

/// Runs `iota setup`.
///
/// # Errors
/// No terminal and no `--yes`; bad answers; a failed live check; files that cannot be written.
pub fn run(args: SetupArgs) -> anyhow::Result<()> {
    let interactive = !args.yes;
    if interactive && !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        bail!("iota setup asks questions and needs a terminal; from a script, pass {SCRIPT_FLAGS}");
    }
    let (plan, out) = if interactive {
        prompts::ask(&args)?
    } else {
        let plan = plan_from_flags(&args)?;
        let out = out_path(&args, &plan)?;
        (plan, out)
    };
    // Interactive answers were checked as they were given; a failed storage check writes
    // nothing.
    if !interactive && !args.skip_check {
        check_plan(&plan)?;
    }
    apply(&plan, &out)?;
    print_next_steps(&plan, &out, args.out.is_none())
}

/// The settings path: `--out`, else the role's default.
fn out_path(args: &SetupArgs, plan: &Plan) -> anyhow::Result<PathBuf> {
    match &args.out {
        Some(path) => Ok(path.clone()),
        None => default_path(plan.role()),
    }
}

impl Plan {
    /// A miner's or validator's plan; threads and in-flight limit come from the flags.
    pub fn node(
        role: Role,
        wallet: WalletRef,
        source: HotkeySource,
        orchestrator: String,
        device: DeviceKind,
        args: &SetupArgs,
    ) -> Plan {
        Plan::Node {
            profile: NodeProfile {
                role,
                wallet: Some(wallet.wallet.clone()),
                hotkey: Some(wallet.hotkey.clone()),
                wallets_dir: Some(wallet.dir.root().to_path_buf()),
                orchestrator: Some(orchestrator),
                device: Some(device),
                threads: args.threads,
                max_in_flight: args.max_in_flight,
                // `--ca-file` (global) is in force already: keep it for `iota mine`.
                ca_file: crate::storage::trust::ca_file()
                    .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())),
            },
            wallet,
            source,
        }
    }

    /// The role planned.
    pub fn role(&self) -> Role {
        match self {
            Plan::Node { profile, .. } => profile.role,
            Plan::Orchestrator { .. } => Role::Orchestrator,
        }
    }
}

/// The plan from flags and defaults alone (`--yes`).
///
/// # Errors
/// A missing required flag (named), or an invalid value.
pub fn plan_from_flags(args: &SetupArgs) -> anyhow::Result<Plan> {
    let role = args.role.unwrap_or_default();
    if role == Role::Orchestrator {
        let data_dir = match &args.data_dir {
            Some(dir) => dir.clone(),
            None => bail!("--role orchestrator --yes needs --data-dir DIR (state and objects)"),
        };
        let storage = storage_from_flags(args, &data_dir);
        return orchestrator_plan(
            args.run.as_deref().unwrap_or("my-run"),
            args.preset.as_deref().unwrap_or("tiny"),
            &data_dir,
            &Serving::from_flags(args),
            storage,
        );
    }
    let wallet = args.wallet.resolve()?;
    let exists = wallet
        .dir
        .hotkey_path(&wallet.wallet, &wallet.hotkey)?
        .exists();
    let source = match (&args.mnemonic_file, exists) {
        (Some(_), true) => bail!(
            "hotkey {}/{} exists already; drop --mnemonic-file to use it, or pick another --hotkey",
            wallet.wallet,
            wallet.hotkey
        ),
        (Some(file), false) => HotkeySource::Import(read_mnemonic_file(file)?),
        (None, true) => HotkeySource::Existing,
        (None, false) => HotkeySource::Create,
    };
    let Some(orchestrator) = &args.orchestrator else {
        bail!("--yes needs --orchestrator URL for a {}", role.name());
    };
    let device = match args.device {
        Some(d) => d,
        None => checks::device_choices().0[0].kind,
    };
    Ok(Plan::node(
        role,
        wallet,
        source,
        normalize_url(orchestrator),
        device,
        args,
    ))
}

fn read_mnemonic_file(file: &PathBuf) -> anyhow::Result<zeroize::Zeroizing<String>> {
    let text = if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("reading the mnemonic from standard input")?;
        text
    } else {
        std::fs::read_to_string(file)
            .with_context(|| format!("reading the mnemonic from {}", file.display()))?
    };
    let text = zeroize::Zeroizing::new(text);
    // Fail now, before anything is written.
    key_from_secret(&text)?;
    Ok(text)
}

/// The storage the flags describe (a local directory under `data_dir` by default).
fn storage_from_flags(args: &SetupArgs, data_dir: &std::path::Path) -> StorageConfig {
    match &args.storage_url {
        Some(url) if url.starts_with("s3://") => StorageConfig {
            url: url.clone(),
            endpoint: args.s3_endpoint.clone(),
            region: Some(args.s3_region.clone().unwrap_or_else(|| "us-east-1".into())),
            access_key_id: args.s3_access_key_id.clone(),
            secret_access_key: args.s3_secret_access_key.clone(),
        },
        Some(dir) => StorageConfig::local(dir.clone()),
        None => StorageConfig::local(data_dir.join("objects").display().to_string()),
    }
}

/// Where and how an orchestrator serves: setup's answers about the address and TLS.
#[derive(Debug, Clone, Default)]
pub struct Serving {
    /// Address to listen on (default 127.0.0.1:8700).
    pub listen: Option<SocketAddr>,
    /// The public URL (default http(s)://LISTEN).
    pub public_url: Option<String>,
    /// Certificate and key for HTTPS.
    pub tls: Option<TlsFiles>,
    /// Plain HTTP on a non-loopback address (a TLS reverse proxy in front).
    pub insecure_http: bool,
}

impl Serving {
    /// The answers the flags give.
    pub fn from_flags(args: &SetupArgs) -> Serving {
        let tls = match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: absolute(cert),
                key: absolute(key),
            }),
            _ => None,
        };
        Serving {
            listen: args.listen,
            public_url: args.public_url.clone(),
            tls,
            insecure_http: args.insecure_http,
        }
    }
}

/// `path` made absolute against the current directory (the orchestrator may start elsewhere).
pub fn absolute(path: &std::path::Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// An orchestrator plan: a run config built from the answers and validated.
///
/// # Errors
/// An invalid run name, preset or address (the run config's own message), including plain
/// HTTP on a public address without `insecure_http`.
pub fn orchestrator_plan(
    run: &str,
    preset: &str,
    data_dir: &std::path::Path,
    serving: &Serving,
    storage: StorageConfig,
) -> anyhow::Result<Plan> {
    let listen = serving
        .listen
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8700)));
    let scheme = if serving.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let public_url = serving
        .public_url
        .as_deref()
        .map(normalize_url)
        .unwrap_or_else(|| format!("{scheme}://{listen}"));
    let storage_value = serde_json::to_value(&storage).context("encoding the storage")?;
    let mut value = json!({
        "run": run,
        "model": { "preset": preset },
        "data": { "source": "synthetic" },
        "storage": storage_value,
        "listen": listen.to_string(),
        "public_url": public_url,
        "data_dir": data_dir,
    });
    if let Some(tls) = &serving.tls {
        value["tls"] = serde_json::to_value(tls).context("encoding the TLS files")?;
    }
    if serving.insecure_http {
        value["insecure_http"] = json!(true);
    }
    let yaml = format!(
        "# iota orchestrator run config, written by `iota setup` (mode 0600: it may hold storage keys).\n# Every key is described in docs/configuration.md.\n{}",
        serde_norway::to_string(&value).context("writing the run config")?
    );
    let config = RunConfig::from_yaml(&yaml).context("the answers do not make a valid run")?;
    Ok(Plan::Orchestrator {
        config: Box::new(config),
        yaml,
    })
}

/// Creates or imports the hotkey, then writes the settings file.
fn apply(plan: &Plan, out: &std::path::Path) -> anyhow::Result<()> {
    match plan {
        Plan::Node {
            wallet,
            source,
            profile,
        } => {
            match source {
                HotkeySource::Existing => {
                    wallet.load()?;
                }
                HotkeySource::Create => {
                    let key = wallet
                        .dir
                        .create_hotkey(&wallet.wallet, &wallet.hotkey, false)
                        .with_context(|| {
                            format!("creating hotkey {}/{}", wallet.wallet, wallet.hotkey)
                        })?;
                    println!(
                        "created hotkey {}/{}: {}",
                        wallet.wallet,
                        wallet.hotkey,
                        key.address()
                    );
                    if let Some(phrase) = key.phrase() {
                        println!(
                            "mnemonic (shown only this once; write it down and keep it secret, it is the key):"
                        );
                        println!("    {phrase}");
                    }
                }
                HotkeySource::Import(secret) => {
                    let key = key_from_secret(secret)?;
                    wallet
                        .dir
                        .save_hotkey(&wallet.wallet, &wallet.hotkey, &key, false)
                        .with_context(|| {
                            format!("saving hotkey {}/{}", wallet.wallet, wallet.hotkey)
                        })?;
                    println!(
                        "imported hotkey {}/{}: {}",
                        wallet.wallet,
                        wallet.hotkey,
                        key.address()
                    );
                }
            }
            profile.save(out)
        }
        Plan::Orchestrator { yaml, .. } => write_private(out, yaml.as_bytes()),
    }
}

/// The live checks of a `--yes` run: a storage that fails is an error; an orchestrator that
/// does not answer only a warning (miners may be set up before it starts).
fn check_plan(plan: &Plan) -> anyhow::Result<()> {
    match plan {
        Plan::Node { profile, .. } => {
            if let Some(url) = &profile.orchestrator {
                match checks::check_orchestrator(url) {
                    Ok(line) => println!("orchestrator {url}: {line}"),
                    // A miner may be set up before the orchestrator starts.
                    Err(e) => eprintln!("iota setup: warning: {e:#} (writing the settings anyway)"),
                }
            }
            Ok(())
        }
        Plan::Orchestrator { config, .. } => {
            if let Some(tls) = &config.tls {
                let line = checks::check_tls(tls, &config.public_url).context(
                    "the TLS check failed (fix --tls-cert / --tls-key and run setup again, or pass --skip-check)",
                )?;
                println!("tls: {line}");
            }
            checks::check_storage(&config.storage).context(
                "the storage check failed (fix the storage flags and run setup again, or pass --skip-check)",
            )?;
            println!(
                "storage {}: write, read and delete work",
                config.storage.url
            );
            Ok(())
        }
    }
}

fn print_next_steps(plan: &Plan, out: &std::path::Path, default_out: bool) -> anyhow::Result<()> {
    println!("wrote {} (mode 0600)", out.display());
    let config_flag = if default_out {
        String::new()
    } else {
        format!(" --config {}", out.display())
    };
    match plan {
        Plan::Node { profile, .. } => match profile.role {
            Role::Validator => println!("start validating with: iota validate{config_flag}"),
            _ => println!("start mining with: iota mine{config_flag}"),
        },
        Plan::Orchestrator { config, .. } => {
            println!(
                "start the orchestrator with: iota orchestrate --config {}",
                out.display()
            );
            println!(
                "miners join with: iota setup --role miner --orchestrator {}; dashboard at {}/",
                config.public_url, config.public_url
            );
            if config.tls.is_some() {
                println!(
                    "if a private CA signed the certificate, miners and validators add --ca-file CA.pem (docs/operators-tls.md)"
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_examples_are_valid_run_configs() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for name in ["orchestrator-s3.yaml", "s3.yaml", "local.yaml"] {
            let path = root.join("examples").join(name);
            RunConfig::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }

    #[test]
    fn flags_make_a_valid_orchestrator_config() {
        let args = SetupArgs {
            role: Some(Role::Orchestrator),
            run: Some("flag-run".into()),
            data_dir: Some("/var/lib/iota/x".into()),
            storage_url: Some("s3://bucket/prefix".into()),
            s3_endpoint: Some("http://127.0.0.1:9000".into()),
            yes: true,
            ..SetupArgs::default()
        };
        let Plan::Orchestrator { config, .. } = plan_from_flags(&args).unwrap() else {
            panic!("an orchestrator plan");
        };
        assert_eq!(config.run, "flag-run");
        assert_eq!(config.storage.url, "s3://bucket/prefix");
        assert_eq!(config.storage.region.as_deref(), Some("us-east-1"));
        assert_eq!(config.public_url, "http://127.0.0.1:8700");
        let bad = SetupArgs {
            run: Some("bad/name".into()),
            ..args.clone()
        };
        assert!(plan_from_flags(&bad).is_err());
        // A public address needs a certificate, or an explicit insecure_http.
        let public = SetupArgs {
            listen: Some("0.0.0.0:8700".parse().unwrap()),
            ..args.clone()
        };
        let err = format!("{:#}", plan_from_flags(&public).unwrap_err());
        assert!(
            err.contains("`listen`") && err.contains("insecure_http"),
            "{err}"
        );
        let proxied = SetupArgs {
            insecure_http: true,
            ..public.clone()
        };
        let Plan::Orchestrator { config, yaml } = plan_from_flags(&proxied).unwrap() else {
            panic!("an orchestrator plan");
        };
        assert!(
            config.insecure_http && yaml.contains("insecure_http: true"),
            "{yaml}"
        );
        let tls = SetupArgs {
            tls_cert: Some("fullchain.pem".into()),
            tls_key: Some("privkey.pem".into()),
            public_url: Some("https://o.example:8700".into()),
            ..public
        };
        let Plan::Orchestrator { config, .. } = plan_from_flags(&tls).unwrap() else {
            panic!("an orchestrator plan");
        };
        let files = config.tls.as_ref().unwrap();
        assert!(files.cert.is_absolute() && files.cert.ends_with("fullchain.pem"));
        assert_eq!(config.public_url, "https://o.example:8700");
    }
}
