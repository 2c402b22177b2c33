//! `iota model info`: parameter counts per section and the bytes each sample sends across
//! every section boundary, for any preset (no weights are allocated).

use clap::{Args, Subcommand};

use crate::codec::{WireDtype, encoded_len};
use crate::model::ModelConfig;
use crate::model::config::PRESETS;

/// Arguments of `iota model`.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// What to show.
    #[command(subcommand)]
    pub command: ModelCommand,
}

/// Subcommands of `iota model`.
#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Parameters per section and bytes per sample across each boundary.
    Info {
        /// Preset to describe (default: every preset).
        #[arg(long, value_name = "NAME")]
        preset: Option<String>,
        /// Tokens per sample (default: the preset's max_seq_len).
        #[arg(long, value_name = "L")]
        seq_len: Option<usize>,
    },
}

/// Runs `iota model`.
///
/// # Errors
/// An unknown preset.
pub fn run(args: ModelArgs) -> anyhow::Result<()> {
    match args.command {
        ModelCommand::Info { preset, seq_len } => {
            let names: Vec<String> = match preset {
                Some(p) => vec![p],
                None => PRESETS.iter().map(|p| p.to_string()).collect(),
            };
            for name in names {
                let cfg = ModelConfig::preset(&name)?;
                print!("{}", describe(&cfg, seq_len.unwrap_or(cfg.max_seq_len)));
            }
            Ok(())
        }
    }
}

/// Human-readable parameter count.
pub fn human_count(n: usize) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

/// Human-readable byte count.
pub fn human_bytes(n: usize) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.2} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.2} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// Bytes one sample of `seq_len` tokens sends across one boundary in one direction, as
/// (full width f32, full width bf16, boundary width bf16, boundary width int8).
pub fn boundary_bytes(cfg: &ModelConfig, seq_len: usize) -> [usize; 4] {
    let full = [1, seq_len, cfg.d_model];
    let narrow = [1, seq_len, cfg.boundary_width()];
    [
        encoded_len(&full, WireDtype::F32),
        encoded_len(&full, WireDtype::Bf16),
        encoded_len(&narrow, WireDtype::Bf16),
        encoded_len(&narrow, WireDtype::Int8),
    ]
}

/// The `model info` table for one config.
pub fn describe(cfg: &ModelConfig, seq_len: usize) -> String {
    let mut out = format!(
        "{}: {} parameters, d_model {}, {} blocks, {} heads ({} kv), d_ff {}, vocab {}, boundary width {} ({}x)\n",
        cfg.name,
        human_count(cfg.total_params()),
        cfg.d_model,
        cfg.n_layers,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.d_ff,
        cfg.vocab_size,
        cfg.boundary_width(),
        cfg.d_model / cfg.boundary_width(),
    );
    out.push_str("  section  blocks    params     f32 weights\n");
    for i in 0..cfg.n_sections() {
        let [a, b] = cfg.sections[i];
        let n = cfg.section_params(i).unwrap_or(0);
        out.push_str(&format!(
            "  {i:<7}  {:<8}  {:<9}  {}\n",
            format!("{a}..{b}"),
            human_count(n),
            human_bytes(n * 4)
        ));
    }
    let [f32_full, bf16_full, bf16_b, int8_b] = boundary_bytes(cfg, seq_len);
    out.push_str(&format!(
        "  per sample of {seq_len} tokens, per boundary, per direction (the backward sends the same):\n    full f32 {}  full bf16 {}  bottleneck bf16 {} ({:.0}x less than f32)  bottleneck int8 {} ({:.0}x)\n",
        human_bytes(f32_full),
        human_bytes(bf16_full),
        human_bytes(bf16_b),
        f32_full as f64 / bf16_b as f64,
        human_bytes(int8_b),
        f32_full as f64 / int8_b as f64,
    ));
    if cfg.reembed {
        out.push_str(&format!(
            "  re-embeds the token ids after every boundary: a {} x {} table per later section ({} parameters each), ids {} byte(s) per token\n",
            cfg.vocab_size,
            cfg.d_model,
            human_count(cfg.vocab_size * cfg.d_model),
            crate::codec::token_ids::width(cfg.vocab_size),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_covers_every_preset() {
        for name in PRESETS {
            let cfg = ModelConfig::preset(name).unwrap();
            let text = describe(&cfg, cfg.max_seq_len);
            let reembed = usize::from(cfg.reembed);
            assert_eq!(
                text.lines().count(),
                2 + cfg.n_sections() + 2 + reembed,
                "{text}"
            );
            assert_eq!(text.contains("re-embeds"), cfg.reembed, "{text}");
        }
        let cfg = ModelConfig::preset("15b").unwrap();
        let [f32_full, _, bf16_b, _] = boundary_bytes(&cfg, 2048);
        // 64x narrower and half the bytes per value: about 128x fewer bytes.
        let ratio = f32_full as f64 / bf16_b as f64;
        assert!((120.0..=128.0).contains(&ratio), "{ratio}");
    }
}
