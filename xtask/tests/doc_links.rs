//! Every relative link in the repository's Markdown resolves to a file inside the
//! repository: a user's checkout has nothing outside it (the design once linked to a
//! folder beside the repository).

use std::fs;
use std::path::{Path, PathBuf};

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "node_modules" {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The targets of `[text](target)` links, without a `#fragment`.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or_default().trim();
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            found.push(target.to_owned());
        }
        rest = &rest[end..];
    }
    found
}

#[test]
fn every_relative_markdown_link_resolves_inside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("root");
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(files.iter().any(|f| f.ends_with("README.md")), "found the README: {files:?}");
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = fs::read_to_string(file).expect("read");
        for target in links(&text) {
            checked += 1;
            let resolved = file.parent().expect("parent").join(&target);
            match resolved.canonicalize() {
                Ok(path) if path.starts_with(&root) => {}
                Ok(path) => broken.push(format!(
                    "{}: {target} is outside the repository ({})",
                    file.display(),
                    path.display()
                )),
                Err(_) => broken.push(format!("{}: {target} does not exist", file.display())),
            }
        }
    }
    assert!(checked >= 5, "only {checked} links checked: the scan is broken");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
