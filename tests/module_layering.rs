//! The crate's module graph: dependencies point down (`cmd` -> roles -> shared compute ->
//! protocol -> core), the roles (orchestrator, miner, validator) never import each other, and
//! no two sibling modules depend on each other, directly or through others. Read from the
//! sources: every `crate::` and `super::` path outside comments and unit-test modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {dir:?}: {e}"));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a source file (`src/a/b.rs` and `src/a/b/mod.rs` are `a::b`).
fn module_of(root: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(root).expect("a file under src");
    let mut parts: Module = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The source without line comments (doc links are not dependencies) and without the
/// `#[cfg(test)]` modules that close a file.
fn code_of(text: &str) -> String {
    let body = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    body.lines()
        .map(|line| match line.find("//") {
            // `://` is a URL inside a string literal, not a comment.
            Some(at) if !line[..at].ends_with(':') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `crate::`/`super::` paths used in `code`, as written.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start) {
            let begin = from + at;
            from = begin + start.len();
            let boundary = begin == 0
                || !(bytes[begin - 1].is_ascii_alphanumeric() || bytes[begin - 1] == b'_');
            if !boundary {
                continue;
            }
            let mut end = begin;
            while end < bytes.len()
                && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_' || bytes[end] == b':')
            {
                end += 1;
            }
            out.push(
                code[begin..end]
                    .split("::")
                    .filter(|p| !p.is_empty())
                    .map(str::to_owned)
                    .collect(),
            );
        }
    }
    out
}

/// The longest known module a path written in `current` names.
fn resolve(current: &Module, path: &[String], known: &BTreeSet<Module>) -> Option<Module> {
    let mut base: Module = Vec::new();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => rest = &rest[1..],
        Some("super") => {
            base = current.clone();
            while rest.first().is_some_and(|p| p == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    let full: Module = base.into_iter().chain(rest.iter().cloned()).collect();
    (1..=full.len())
        .rev()
        .map(|n| full[..n].to_vec())
        .find(|m| known.contains(m))
}

/// Edges between modules: `a` uses something of `b`.
fn module_graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let modules: BTreeMap<Module, PathBuf> = files
        .iter()
        .map(|f| (module_of(&root, f), f.clone()))
        .collect();
    let known: BTreeSet<Module> = modules.keys().cloned().collect();
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, file) in &modules {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {file:?}: {e}"));
        for path in paths_in(&code_of(&text)) {
            if let Some(target) = resolve(module, &path, &known) {
                // A module's use of its own parent or its own items is not an edge.
                if !module.starts_with(&target) && !target.starts_with(module) {
                    edges.entry(module.clone()).or_default().insert(target);
                }
            }
        }
    }
    edges
}

/// The two children of the deepest common parent of `a` and `b` on their paths.
fn siblings(a: &Module, b: &Module) -> Option<(Module, Module)> {
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    (common < a.len() && common < b.len()).then(|| (a[..=common].to_vec(), b[..=common].to_vec()))
}

/// A cycle through `start` in `graph`, if there is one.
fn cycle_from(graph: &BTreeMap<Module, BTreeSet<Module>>, start: &Module) -> Option<Vec<Module>> {
    let mut stack = vec![(start.clone(), vec![start.clone()])];
    let mut seen = BTreeSet::new();
    while let Some((node, trail)) = stack.pop() {
        for next in graph.get(&node).into_iter().flatten() {
            if next == start {
                return Some(trail.clone());
            }
            if seen.insert(next.clone()) {
                let mut t = trail.clone();
                t.push(next.clone());
                stack.push((next.clone(), t));
            }
        }
    }
    None
}

#[test]
fn no_module_depends_on_a_sibling_that_depends_back() {
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (a, targets) in module_graph() {
        for b in targets {
            if let Some((sa, sb)) = siblings(&a, &b) {
                graph.entry(sa).or_default().insert(sb);
            }
        }
    }
    assert!(
        graph.len() > 20,
        "the scan found too few module edges ({}); is it reading src/?",
        graph.len()
    );
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|m| cycle_from(&graph, m))
        .map(|c| {
            c.iter()
                .map(|m| m.join("::"))
                .collect::<Vec<_>>()
                .join(" -> ")
        })
        .collect();
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn dependencies_point_down_from_commands_to_the_core() {
    // Higher layers may use lower ones only. The roles share one layer, so a role importing
    // another role (validator -> miner, say) fails here: what two roles both need belongs on
    // the shared ground below them (`compute`).
    let layer = |m: &str| match m {
        "cmd" => 6,
        "orchestrator" | "miner" | "validator" => 5,
        "compute" | "infer" => 4,
        "api" | "mirror" | "chain" => 3,
        "merge" | "model" | "storage" | "data" => 2,
        "wallet" => 1,
        "codec" => 0,
        other => panic!("module {other} has no layer in this test: give it one"),
    };
    let mut wrong = Vec::new();
    for (a, targets) in module_graph() {
        for b in targets {
            let (Some(top_a), Some(top_b)) = (a.first(), b.first()) else {
                continue;
            };
            if top_a != top_b && layer(top_a) <= layer(top_b) {
                wrong.push(format!("{} -> {}", a.join("::"), b.join("::")));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "dependencies pointing up or sideways:\n{}",
        wrong.join("\n")
    );
}
