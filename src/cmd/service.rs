//! `iota service install`: a systemd user unit that keeps a miner (or a validator, or an
//! orchestrator) running and restarts it on failure; the replacement for the reference's pm2 configs.
//!
//! # Format
//! ```text
//! ~/.config/systemd/user/iota-<role>.service
//! [Service] ExecStart=<this iota> mine|validate|orchestrate --config <settings> ... --log-format json
//!           Restart=on-failure, RestartSec=10
//! [Install] WantedBy=default.target
//! ```

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use super::profile::{Role, default_path, write_private};

/// Arguments of `iota service`.
#[derive(Debug, Args)]
pub struct ServiceArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: ServiceAction,
}

/// `iota service` subcommands.
#[derive(Debug, Subcommand)]
pub enum ServiceAction {
    /// Write (or print) a systemd user unit for a role.
    Install {
        /// `miner`, `validator` or `orchestrator`.
        #[arg(long, value_enum, default_value = "miner")]
        role: Role,
        /// Settings the service runs with (default ~/.config/iota/<role>.yaml, from `iota setup`).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Print the unit instead of writing it.
        #[arg(long)]
        print: bool,
    },
}

/// Runs `iota service ...`.
///
/// # Errors
/// Missing settings, a unit that cannot be written.
pub fn run(args: ServiceArgs) -> anyhow::Result<()> {
    let ServiceAction::Install {
        role,
        config,
        print,
    } = args.action;
    let config = match config {
        Some(path) => path,
        None => default_path(role)?,
    };
    if !config.is_file() {
        bail!(
            "no settings at {}: run `iota setup --role {}` first (or pass --config FILE)",
            config.display(),
            role.name()
        );
    }
    let config = config
        .canonicalize()
        .with_context(|| format!("resolving {}", config.display()))?;
    let exe = std::env::current_exe().context("locating the iota binary")?;
    let unit = unit(role, &exe, &config);
    if print {
        print!("{unit}");
        return Ok(());
    }
    let name = format!("iota-{}", role.name());
    let path = unit_dir()?.join(format!("{name}.service"));
    write_private(&path, unit.as_bytes())?;
    println!("wrote {}", path.display());
    println!(
        "start it now and at every boot:  systemctl --user daemon-reload && systemctl --user enable --now {name}"
    );
    println!("follow its log:                  journalctl --user -u {name} -f");
    println!("keep it running after logout:    loginctl enable-linger $USER");
    Ok(())
}

/// The unit text for `role`, running `exe` with the settings `config`.
pub fn unit(role: Role, exe: &std::path::Path, config: &std::path::Path) -> String {
    let command = match role {
        Role::Miner => format!(
            "{} mine --config {} --quiet --log-format json",
            quoted(exe),
            quoted(config)
        ),
        Role::Orchestrator => format!(
            "{} orchestrate --config {} --log-format json",
            quoted(exe),
            quoted(config)
        ),
        Role::Validator => format!(
            "{} validate --config {} --quiet --log-format json",
            quoted(exe),
            quoted(config)
        ),
    };
    format!(
        "# Written by `iota service install --role {role}`.\n\
         [Unit]\n\
         Description=iota {role}\n\
         After=network-online.target\n\
         Wants=network-online.target\n\
         \n\
         [Service]\n\
         Type=simple\n\
         ExecStart={command}\n\
         Restart=on-failure\n\
         RestartSec=10\n\
         Environment=RUST_LOG=info\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n",
        role = role.name()
    )
}

/// A path for `ExecStart`: quoted when it holds spaces.
fn quoted(path: &std::path::Path) -> String {
    let text = path.display().to_string();
    if text.contains(char::is_whitespace) {
        format!("\"{text}\"")
    } else {
        text
    }
}

/// `$XDG_CONFIG_HOME/systemd/user`, else `~/.config/systemd/user`.
fn unit_dir() -> anyhow::Result<PathBuf> {
    let iota = super::profile::config_dir()?;
    let base = iota
        .parent()
        .context("the config directory has no parent")?;
    Ok(base.join("systemd").join("user"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn miner_unit_restarts_on_failure_with_the_settings() {
        let text = unit(
            Role::Miner,
            Path::new("/opt/iota/bin/iota"),
            Path::new("/h/m.yaml"),
        );
        assert!(text.contains(
            "ExecStart=/opt/iota/bin/iota mine --config /h/m.yaml --quiet --log-format json"
        ));
        assert!(text.contains("Restart=on-failure"));
        assert!(text.contains("WantedBy=default.target"));
        let spaced = unit(Role::Orchestrator, Path::new("/a b/iota"), Path::new("/c"));
        assert!(spaced.contains("ExecStart=\"/a b/iota\" orchestrate --config /c"));
        let validator = unit(Role::Validator, Path::new("/x"), Path::new("/y"));
        assert!(validator.contains("ExecStart=/x validate --config /y --quiet"));
    }
}
