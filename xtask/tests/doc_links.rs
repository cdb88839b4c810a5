//! Every relative link in the repository's Markdown (the README, the book in `docs/src`, the
//! design notes) resolves to a file inside the repository: a user's checkout has nothing
//! outside it (the design once linked to a folder beside the repository). A link's
//! `#fragment` into a Markdown file names one of its headings or `<a id>` anchors, as
//! GitHub and mdBook derive them: the README's sections moved into the book's chapters.

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

/// The targets of `[text](target)` links, each with its `#fragment` if it has one.
fn links(text: &str) -> Vec<(String, Option<String>)> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let link = rest[..end].trim();
        let (target, fragment) = match link.split_once('#') {
            Some((target, fragment)) => (target, Some(fragment.to_owned())),
            None => (link, None),
        };
        if !link.contains("://") && !link.starts_with("mailto:") && !link.is_empty() {
            found.push((target.to_owned(), fragment));
        }
        rest = &rest[end..];
    }
    found
}

/// The anchors of a Markdown text: its headings as GitHub and mdBook slug them (lowercase;
/// letters, digits, `-` and `_` kept, spaces to `-`, the rest dropped) and its `<a id="..">`.
fn anchors(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        if let Some(heading) = line.strip_prefix('#') {
            let heading = heading.trim_start_matches('#');
            if heading.starts_with(' ') {
                let slug: String = heading
                    .trim()
                    .to_lowercase()
                    .chars()
                    .filter_map(|c| match c {
                        ' ' => Some('-'),
                        c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                        _ => None,
                    })
                    .collect();
                out.push(slug);
            }
        }
        let mut rest = line;
        while let Some(at) = rest.find("<a id=\"") {
            rest = &rest[at + 7..];
            if let Some(end) = rest.find('"') {
                out.push(rest[..end].to_owned());
            }
        }
    }
    out
}

#[test]
fn every_relative_markdown_link_resolves_inside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("root");
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(files.iter().any(|f| f.ends_with("README.md")), "found the README: {files:?}");
    let mut broken = Vec::new();
    let mut checked = 0;
    let mut fragments = 0;
    for file in &files {
        let text = fs::read_to_string(file).expect("read");
        for (target, fragment) in links(&text) {
            checked += 1;
            let resolved =
                if target.is_empty() { file.clone() } else { file.parent().expect("parent").join(&target) };
            match resolved.canonicalize() {
                Ok(path) if path.starts_with(&root) => {
                    let Some(fragment) = fragment else { continue };
                    if path.extension().is_some_and(|x| x == "md") {
                        fragments += 1;
                        let target_text = fs::read_to_string(&path).expect("read");
                        if !anchors(&target_text).contains(&fragment) {
                            broken.push(format!(
                                "{}: #{fragment} is no heading or anchor of {}",
                                file.display(),
                                path.display()
                            ));
                        }
                    }
                }
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
    assert!(fragments >= 10, "only {fragments} #fragments checked: the scan is broken");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
