//! The layout ARCHITECTURE.md promises, checked: the crate's top-level modules import one
//! another without a cycle, as do the modules of each folder (the `outbox` binary's too),
//! and no source file in the workspace grows past about 500 lines unless it is generated
//! or listed below as still to split.

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

/// The module path of `file` under its crate root `root` (`a/b.rs` and `a/b/mod.rs` are
/// `[a, b]`; the root's `lib.rs` or `main.rs` is `[]`).
fn module_path(root: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(root).expect("under the root");
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("a file");
    let stem = last.trim_end_matches(".rs");
    if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
        parts.push(stem.to_owned());
    }
    parts
}

/// The paths `code` names after `prefix` (`super::` or `crate::`), as segments, with
/// `{a::b, c}` groups spread: `super::{pages::Params, live}` is `[pages, Params]` and
/// `[live]`. Leading `super::`s after the first are counted in the first segment as
/// `super`.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    fn ident(s: &str) -> &str {
        let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
        &s[..end]
    }
    /// The items of a path starting at `s`, each a list of segments.
    fn parse(s: &str, out: &mut Vec<Vec<String>>, base: Vec<String>) {
        let s = s.trim_start();
        if let Some(group) = s.strip_prefix('{') {
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        parse(&group[start..i], out, base);
                        return;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        parse(&group[start..i], out, base.clone());
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let name = ident(s);
        if name.is_empty() {
            if !base.is_empty() {
                out.push(base);
            }
            return;
        }
        let mut path = base;
        path.push(name.to_owned());
        match s[name.len()..].strip_prefix("::") {
            Some(rest) => parse(rest, out, path),
            None => out.push(path),
        }
    }
    let mut out = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        // `super::super::x` is seen once, from its first `super::`.
        if prefix == "super::" && code[..at].ends_with("super::") {
            continue;
        }
        let mut rest = &code[at + prefix.len()..];
        let mut base = Vec::new();
        while let Some(next) = rest.strip_prefix("super::") {
            base.push("super".to_owned());
            rest = next;
        }
        parse(rest, &mut out, base);
    }
    out
}

/// `path` as seen from `module` (`super::` paths resolved), from the crate root.
fn resolve(module: &[String], prefix: &str, path: &[String]) -> Option<Vec<String>> {
    if prefix == "crate::" {
        return Some(path.to_vec());
    }
    // `super::` from `[a, b]` is `[a]`; each further `super` one more up.
    let ups = 1 + path.iter().take_while(|s| *s == "super").count();
    let base = module.get(..module.len().checked_sub(ups)?)?;
    Some(base.iter().cloned().chain(path.iter().skip(ups - 1).cloned()).collect())
}

#[test]
fn each_folders_modules_import_each_other_without_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // Each crate root (the library's, the binary's) and its files.
    let roots = [src.clone(), src.join("bin/outbox")];
    let mut cycles = Vec::new();
    let mut folders_seen = 0;
    for root in &roots {
        let mut files = Vec::new();
        rust_files(root, &mut files);
        if *root == src {
            files.retain(|f| !f.starts_with(src.join("bin")));
        }
        // Folder (module path) -> edges between its children, with the files behind them.
        let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        let mut because: BTreeMap<(Vec<String>, String, String), BTreeSet<String>> = BTreeMap::new();
        let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_path(root, f)).collect();
        for file in &files {
            let stem = file.file_stem().map_or(String::new(), |s| s.to_string_lossy().into_owned());
            if stem == "tests" || stem.ends_with("_tests") {
                continue;
            }
            let module = module_path(root, file);
            let code = code(&std::fs::read_to_string(file).expect("read"));
            for prefix in ["super::", "crate::"] {
                for path in paths_after(&code, prefix) {
                    let Some(target) = resolve(&module, prefix, &path) else { continue };
                    // The deepest folder both sit in, and the child of it each is in.
                    let shared = module.iter().zip(&target).take_while(|(a, b)| a == b).count();
                    let (Some(from), Some(to)) = (module.get(shared), target.get(shared)) else { continue };
                    let folder = module[..shared].to_vec();
                    let mut sibling = folder.clone();
                    sibling.push(to.clone());
                    // Only a module of the folder (not an item its mod.rs defines or re-exports).
                    if !modules.contains(&sibling) {
                        continue;
                    }
                    graphs
                        .entry(folder.clone())
                        .or_default()
                        .entry(from.clone())
                        .or_default()
                        .insert(to.clone());
                    because
                        .entry((folder, from.clone(), to.clone()))
                        .or_default()
                        .insert(file.strip_prefix(&src).expect("under src").display().to_string());
                }
            }
        }
        folders_seen += graphs.len();
        for (folder, graph) in &graphs {
            let mut done = BTreeSet::new();
            for node in graph.keys() {
                if let Some(cycle) = visit(node, graph, &mut Vec::new(), &mut done) {
                    let edges: Vec<String> = cycle
                        .windows(2)
                        .map(|w| {
                            let files = &because[&(folder.clone(), w[0].clone(), w[1].clone())];
                            format!("{} -> {} ({files:?})", w[0], w[1])
                        })
                        .collect();
                    cycles.push(format!("in {}/{}: {}", root.display(), folder.join("/"), edges.join(", ")));
                    break;
                }
            }
        }
    }
    assert!(folders_seen > 10, "the scan found the folders' imports: {folders_seen}");
    assert!(cycles.is_empty(), "import cycles inside folders:\n  {}", cycles.join("\n  "));
}

/// The scan's parser, on the forms the sources use.
#[test]
fn paths_are_read_from_use_lists_and_super_chains() {
    let code = "use super::{pages::{Params, X}, live};\nlet a = super::super::store::names::N;\nuse crate::inbox::{store, worker::W};";
    assert_eq!(
        paths_after(code, "super::"),
        [vec!["pages", "Params"], vec!["pages", "X"], vec!["live"], vec!["super", "store", "names", "N"]]
    );
    assert_eq!(paths_after(code, "crate::"), [vec!["inbox", "store"], vec!["inbox", "worker", "W"]]);
    let module: Vec<String> = ["inbox", "store", "batch"].map(String::from).to_vec();
    let path: Vec<String> = ["super", "spans"].map(String::from).to_vec();
    assert_eq!(resolve(&module, "super::", &path), Some(["inbox", "spans"].map(String::from).to_vec()));
}
