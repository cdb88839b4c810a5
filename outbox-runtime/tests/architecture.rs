//! The layout ARCHITECTURE.md promises, checked: the crate's top-level modules import one
//! another without a cycle, and no source file in the workspace grows past about 500
//! lines unless it is generated or listed below as still to split.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest a hand-written source file may be.
const MAX_LINES: usize = 500;

/// Generated files (by `cargo xtask typegen`), exempt from the limit.
const GENERATED: &[&str] = &["xtask/tests/fixtures/generated.rs", "examples/src/consumer_types.rs"];

/// Files still over the limit, each to be split along its seams (issue 15). The test
/// fails when one of them is split (remove it here) as well as when another file grows.
const STILL_TO_SPLIT: &[&str] = &[];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_owned()
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if name != "target" && name != ".git" && name != "node_modules" {
                rust_files(&path, found);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The top-level module a `crate::` path names, for the crate root's re-exports too.
fn module_of(segment: &str) -> Option<&str> {
    Some(match segment {
        "Error" | "Result" => "error",
        "OutboxEvent" => "event",
        "Outbox" | "OutboxConfig" | "Capacity" => "outbox",
        "NewEvent" | "AppendOptions" | "append" | "RESERVED_HEADER_BYTES" => "append",
        s if s.starts_with(|c: char| c.is_ascii_lowercase()) => s,
        _ => return None,
    })
}

/// The code of a file without comments and without its test module (which comes last).
fn code(text: &str) -> String {
    let mut kept = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed == "#[cfg(test)]" && lines.peek().is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            // `mod tests;` (a file of its own, skipped by name) or `mod tests {`: the rest.
            if lines.peek().is_some_and(|next| next.trim_end().ends_with('{')) {
                break;
            }
            continue;
        }
        if !trimmed.starts_with("//") {
            kept.push(line);
        }
    }
    kept.join("\n")
}

#[test]
fn the_runtimes_modules_import_each_other_without_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut because: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        let stem = parts.last().map_or("", |p| p.trim_end_matches(".rs"));
        if parts[0] == "bin" || parts[0] == "lib.rs" || stem == "tests" || stem.ends_with("_tests") {
            continue;
        }
        let top = parts[0].trim_end_matches(".rs").to_owned();
        let code = code(&std::fs::read_to_string(file).expect("read"));
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let segment: String =
                rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let Some(module) = module_of(&segment) else { continue };
            if module != top {
                graph.entry(top.clone()).or_default().insert(module.to_owned());
                because
                    .entry((top.clone(), module.to_owned()))
                    .or_default()
                    .insert(relative.display().to_string());
            }
        }
    }
    assert!(graph.len() > 10, "the scan found the modules: {graph:?}");
    assert!(graph["relay"].contains("outbox"), "the scan sees real imports: {graph:?}");

    // Depth-first search for a back edge; the cycle is printed with the files behind it.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, &graph, &mut Vec::new(), &mut done) {
            let edges: Vec<String> = cycle
                .windows(2)
                .map(|w| format!("{} -> {} ({:?})", w[0], w[1], because[&(w[0].clone(), w[1].clone())]))
                .collect();
            panic!("import cycle between modules:\n  {}", edges.join("\n  "));
        }
    }
}

#[test]
fn no_hand_written_source_file_grows_past_the_limit() {
    let root = workspace();
    let mut files = Vec::new();
    for dir in ["outbox-macros", "outbox-runtime", "examples", "tests", "xtask"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "the scan found the sources: {}", files.len());
    let mut over = BTreeSet::new();
    for file in &files {
        let relative = file.strip_prefix(&root).expect("under root").to_string_lossy().replace('\\', "/");
        // trybuild's cases and their expected output are inputs, not sources.
        if relative.contains("/tests/ui/") || GENERATED.contains(&relative.as_str()) {
            continue;
        }
        let lines = std::fs::read_to_string(file).expect("read").lines().count();
        if lines > MAX_LINES {
            over.insert(relative);
        }
    }
    let listed: BTreeSet<String> = STILL_TO_SPLIT.iter().map(|s| (*s).to_owned()).collect();
    let grown: Vec<&String> = over.difference(&listed).collect();
    let split: Vec<&String> = listed.difference(&over).collect();
    assert!(grown.is_empty(), "over {MAX_LINES} lines: split them along their seams: {grown:?}");
    assert!(split.is_empty(), "now within {MAX_LINES} lines: remove from STILL_TO_SPLIT: {split:?}");
}
