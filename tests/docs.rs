//! Docs that cannot rot: the README and docs/ against the binary and the code.
//!
//! - Every subcommand and flag that `iota --help` prints (recursively, every subcommand's
//!   `--help`) is named in the README or docs/, and every flag and subcommand that the
//!   command reference (docs/cli.md) and the README name exists.
//! - Every `examples/*.yaml` parses as its config type.
//! - Every key of the config types is in docs/configuration.md, and every key named in the
//!   first column of its tables exists. The keys come from the code itself: every config type
//!   refuses unknown keys and its error names the keys it accepts, so the test asks each level
//!   with a key that cannot exist and reads the answer.
//! - Every relative link in README.md and docs/*.md resolves to a file, and its `#anchor` to a
//!   heading of that file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use iota::cmd::profile::NodeProfile;
use iota::cmd::train::TrainFile;
use iota::model::ModelConfig;
use iota::orchestrator::RunConfig;

/// A key no config type has, used to make each level name the keys it accepts.
const PROBE: &str = "no_such_key_probe";

/// Flags of other programs that the docs quote (`systemctl --user enable --now`, `cargo run
/// --release`, `cargo build --features cuda`) and clap's own `--help`.
const FOREIGN_FLAGS: [&str; 5] = ["--help", "--user", "--now", "--release", "--features"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// README.md and every docs/*.md, by path.
fn doc_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let docs = root().join("docs");
    let mut md: Vec<PathBuf> = std::fs::read_dir(&docs)
        .unwrap_or_else(|e| panic!("reading {}: {e}", docs.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    md.sort();
    files.extend(md);
    files
}

fn all_docs() -> String {
    doc_files()
        .iter()
        .map(|f| read(f))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `word` occurs in `text` with no identifier or flag character on either side.
fn has_word(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

/// The text of every `code span` in `text` (fenced blocks excluded).
fn code_spans(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in outside_fences(text) {
        let parts: Vec<&str> = line.split('`').collect();
        out.extend(parts.iter().skip(1).step_by(2).map(|s| s.to_string()));
    }
    out
}

/// The lines of `text` outside ``` fenced blocks.
fn outside_fences(text: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push(line);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The command line

/// `iota <path> --help`.
fn help(path: &[String]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_iota"))
        .args(path)
        .arg("--help")
        .output()
        .expect("running iota --help");
    assert!(out.status.success(), "iota {path:?} --help failed");
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The subcommands a help text lists (without `help`).
fn subcommands_in(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut listing = false;
    for line in help.lines() {
        if line.starts_with("Commands:") {
            listing = true;
        } else if listing {
            match line
                .strip_prefix("  ")
                .and_then(|l| l.split_whitespace().next())
            {
                Some(name) if !line.starts_with("   ") && name != "help" => {
                    out.push(name.to_string());
                }
                Some(_) if !line.starts_with("   ") => {}
                _ if line.trim().is_empty() => listing = false,
                _ => {}
            }
        }
    }
    out
}

/// The long flags a help text lists: option lines start with `  -x, --flag` or `      --flag`.
fn flags_in(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|line| {
            let option = line.trim_start();
            let indent = line.len() - option.len();
            if !(indent == 2 || indent == 6) || !option.starts_with('-') {
                return None;
            }
            let long = match option.split_once(", ") {
                Some((short, long)) if short.len() == 2 => long,
                _ => option,
            };
            let name: String = long
                .strip_prefix("--")?
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            (!name.is_empty() && name != "help" && name != "version").then(|| format!("--{name}"))
        })
        .collect()
}

/// Every subcommand path (`[]` is `iota` itself) with the flags its help lists.
fn cli_tree() -> BTreeMap<Vec<String>, BTreeSet<String>> {
    let mut tree = BTreeMap::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let text = help(&path);
        for sub in subcommands_in(&text) {
            let mut next = path.clone();
            next.push(sub);
            todo.push(next);
        }
        tree.insert(path, flags_in(&text));
    }
    tree
}

#[test]
fn every_subcommand_and_flag_of_the_binary_is_documented() {
    let tree = cli_tree();
    assert!(
        tree.len() > 20,
        "too few subcommands found ({}): is the help format still parsed?",
        tree.len()
    );
    let docs = all_docs();
    let mut missing = Vec::new();
    for (path, flags) in &tree {
        let name = std::iter::once("iota".to_string())
            .chain(path.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        if !path.is_empty() && !docs.contains(&name) {
            missing.push(format!("subcommand `{name}`"));
        }
        for flag in flags {
            if !has_word(&docs, flag) {
                missing.push(format!("`{name} {flag}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not in README.md or docs/ (add them to docs/cli.md):\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_documented_flag_and_subcommand_exists() {
    let tree = cli_tree();
    let flags: BTreeSet<String> = tree.values().flatten().cloned().collect();
    let top: BTreeSet<&str> = tree
        .keys()
        .filter(|p| p.len() == 1)
        .map(|p| p[0].as_str())
        .collect();
    let parents: BTreeSet<&str> = tree
        .keys()
        .filter(|p| p.len() == 2)
        .map(|p| p[0].as_str())
        .collect();
    let mut unknown = Vec::new();
    for file in ["docs/cli.md", "README.md"] {
        let text = read(&root().join(file));
        for span in code_spans(&text) {
            // `iota <command> [<subcommand>] ...`: both exist.
            let Some(rest) = span.strip_prefix("iota ") else {
                continue;
            };
            let mut words = rest.split_whitespace();
            let first = words.next().unwrap_or("");
            // Flags and placeholders (`iota <command> --help`) name no subcommand.
            if first.is_empty() || first.starts_with(['-', '<', '[']) {
                continue;
            }
            if !top.contains(first) {
                unknown.push(format!("{file}: subcommand `iota {first}`"));
            } else if parents.contains(first) {
                let second = words.next().unwrap_or("");
                if !second.starts_with(|c: char| c.is_ascii_lowercase()) {
                    continue;
                }
                for name in second.split(['|', '\\']).filter(|n| !n.is_empty()) {
                    if !tree.contains_key(&vec![first.to_string(), name.to_string()]) {
                        unknown.push(format!("{file}: subcommand `iota {first} {name}`"));
                    }
                }
            }
        }
        for line in outside_fences(&text) {
            for (at, _) in line.match_indices("--") {
                let before = line[..at].chars().next_back();
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-') {
                    continue;
                }
                let name: String = line[at + 2..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
                    continue;
                }
                let flag = format!("--{name}");
                if !flags.contains(&flag) && !FOREIGN_FLAGS.contains(&flag.as_str()) {
                    unknown.push(format!("{file}: flag `{flag}`"));
                }
            }
        }
    }
    unknown.sort();
    unknown.dedup();
    assert!(
        unknown.is_empty(),
        "documented but not in any `iota ... --help`:\n{}",
        unknown.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Examples and configuration keys

/// Parses a `iota train` config file the way `iota train` does, model included.
fn load_train_config(path: &Path) -> Result<(), String> {
    let file = TrainFile::load(path).map_err(|e| format!("{e:#}"))?;
    let model = file
        .model
        .unwrap_or_else(|| serde_json::Value::Object(Default::default()));
    ModelConfig::from_value(&model, "small").map_err(|e| e.to_string())?;
    Ok(())
}

#[test]
fn every_example_config_parses_as_its_type() {
    let dir = root().join("examples");
    let mut checked = 0;
    let mut failed = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("reading examples/") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|x| x != "yaml") {
            continue;
        }
        let top: serde_norway::Value =
            serde_norway::from_str(&read(&path)).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        // An orchestrator run config names its run; a `iota train` config never does.
        let result = if top.get("run").is_some() {
            RunConfig::load(&path)
                .map(|_| ())
                .map_err(|e| e.to_string())
        } else {
            load_train_config(&path)
        };
        if let Err(e) = result {
            failed.push(format!("{}: {e}", path.display()));
        }
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} example configs found");
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The keys an "unknown field `PROBE`" error says are expected, or `None` for another error.
fn expected_keys(error: &str) -> Option<Vec<String>> {
    let at = error.find(&format!("unknown field `{PROBE}`"))?;
    let rest = &error[at..];
    let list = rest.split_once("expected")?.1;
    let list = list.split(" at line").next().unwrap_or(list);
    Some(
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect(),
    )
}

/// A YAML document that sets `{PROBE: 1}` at `path` (as a list element where `in_list`).
fn probe_yaml(prefix: &str, path: &[String], in_list: bool) -> String {
    let mut value = format!("{{{PROBE}: 1}}");
    if in_list {
        value = format!("[{value}]");
    }
    for key in path.iter().rev() {
        value = format!("{{{key}: {value}}}");
    }
    let inner = value
        .strip_prefix('{')
        .and_then(|v| v.strip_suffix('}'))
        .unwrap_or(&value)
        .to_string();
    format!("{prefix}{inner}\n")
}

/// Every key path below `path`, found by asking `parse` with a probe key at each level.
fn keys_below(
    parse: &dyn Fn(&str) -> Result<(), String>,
    prefix: &str,
    path: Vec<String>,
    out: &mut BTreeSet<Vec<String>>,
) {
    for in_list in [false, true] {
        let yaml = probe_yaml(prefix, &path, in_list);
        let Err(error) = parse(&yaml) else { continue };
        if let Some(keys) = expected_keys(&error) {
            for key in keys {
                let mut next = path.clone();
                next.push(key);
                if out.insert(next.clone()) && next.len() < 6 {
                    keys_below(parse, prefix, next, out);
                }
            }
            return;
        }
    }
}

/// Every key of every config file iota reads, as paths.
fn config_keys() -> BTreeSet<Vec<String>> {
    let mut keys = BTreeSet::new();
    let run = |yaml: &str| {
        RunConfig::from_yaml(yaml)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    keys_below(&run, "run: docs\n", Vec::new(), &mut keys);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("train.yaml");
    let train = |yaml: &str| {
        std::fs::write(&file, yaml).map_err(|e| e.to_string())?;
        load_train_config(&file)
    };
    keys_below(&train, "", Vec::new(), &mut keys);
    let profile = |yaml: &str| {
        serde_norway::from_str::<NodeProfile>(yaml)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    keys_below(&profile, "", Vec::new(), &mut keys);
    // `model.preset` is read before the model's fields are (`ModelConfig::from_value`), so the
    // model's error does not name it.
    keys.insert(vec!["model".to_string(), "preset".to_string()]);
    keys
}

/// The key names in the first column of the tables of configuration.md whose header's first
/// cell is `key` or `field` (placeholders such as `<field>` left out).
fn documented_keys(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_key_table = false;
    for line in outside_fences(text) {
        if !line.starts_with('|') {
            in_key_table = false;
            continue;
        }
        let first = line.split('|').nth(1).unwrap_or("").trim();
        if matches!(first, "key" | "field") {
            in_key_table = true;
            continue;
        }
        if !in_key_table || first.starts_with("---") {
            continue;
        }
        for span in first.split('`').skip(1).step_by(2) {
            let mut span = span.to_string();
            while let (Some(a), Some(b)) = (span.find('<'), span.find('>')) {
                if b < a {
                    break;
                }
                span.replace_range(a..=b, "");
            }
            out.extend(
                span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| !w.is_empty())
                    .map(str::to_string),
            );
        }
    }
    out
}

#[test]
fn every_config_key_is_in_the_reference_and_back() {
    let keys = config_keys();
    assert!(
        keys.len() > 60,
        "only {} config keys found: do the config types still name the keys they accept?",
        keys.len()
    );
    let reference = read(&root().join("docs/configuration.md"));
    let spans = code_spans(&reference).join("\n");
    let missing: BTreeSet<String> = keys
        .iter()
        .filter(|path| !path.iter().all(|k| has_word(&spans, k)))
        .map(|path| path.join("."))
        .collect();
    assert!(
        missing.is_empty(),
        "config keys not in docs/configuration.md:\n{}",
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
    let names: BTreeSet<&str> = keys.iter().flatten().map(String::as_str).collect();
    let unknown: Vec<String> = documented_keys(&reference)
        .into_iter()
        .filter(|k| !names.contains(k.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "keys in docs/configuration.md's tables that no config type has:\n{}",
        unknown.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Links

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens.
fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of every heading of a markdown file (repeats get `-1`, `-2`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in outside_fences(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let anchor = anchor_of(&line[hashes..]);
            let n = seen.entry(anchor.clone()).or_default();
            out.insert(if *n == 0 {
                anchor.clone()
            } else {
                format!("{anchor}-{n}")
            });
            *n += 1;
        }
    }
    out
}

/// The targets of the `[text](target)` links of `text`, outside code.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in outside_fences(text) {
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in doc_files() {
        let text = read(&file);
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().expect("a parent directory").join(path)
            };
            if !dest.exists() {
                broken.push(format!("{}: {target} (no such file)", file.display()));
                continue;
            }
            let is_md = dest.extension().is_some_and(|x| x == "md");
            if !anchor.is_empty() && is_md && !anchors(&read(&dest)).contains(anchor) {
                broken.push(format!("{}: {target} (no such heading)", file.display()));
            }
        }
    }
    assert!(checked > 20, "only {checked} relative links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
