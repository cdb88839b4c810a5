//! The book as a user meets it: the getting-started chapter's workspace written outside this
//! repository and its commands run there, every shell line of the book run by a test or by
//! CI, and the table of contents holding every chapter. (The Rust blocks of the other
//! chapters are doctests of this crate: `lib.rs`.)

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The chapters (`docs/src/*.md` but the table of contents), by file name, and the README.
fn pages() -> Vec<(String, String)> {
    let mut pages: Vec<(String, String)> = fs::read_dir(here().join("src"))
        .expect("docs/src")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md") && !p.ends_with("SUMMARY.md"))
        .map(|p| (p.file_name().expect("name").to_string_lossy().into_owned(), read(&p)))
        .collect();
    pages.sort();
    pages.push(("README.md".to_owned(), read(&here().join("../README.md"))));
    pages
}

/// A fenced block: its info string (`sh run`, `rust file=a/b.rs`) and its lines.
struct Block {
    info: String,
    body: Vec<String>,
}

fn fenced(page: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = page.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```") else { continue };
        let body = lines.by_ref().take_while(|l| !l.starts_with("```")).map(str::to_owned).collect();
        out.push(Block { info: info.trim().to_owned(), body });
    }
    out
}

/// A shell line without its comment; `None` for a blank or comment line.
fn command(line: &str) -> Option<&str> {
    let command = line.split_once(" #").map_or(line, |(c, _)| c).trim();
    (!command.is_empty() && !command.starts_with('#')).then_some(command)
}

/// Every line of every `sh` block in the book and the README is run: by the getting-started
/// test (its `sh run` blocks, in order, in the chapter's workspace) or by CI (`.ci/run`
/// runs it as written). A command a reader is shown with placeholders is a `text` block.
#[test]
fn every_shell_line_of_the_book_is_run_by_a_test_or_by_ci() {
    let ci = read(&here().join("../.ci/run"));
    let ci_lines: Vec<&str> = ci.lines().map(str::trim).filter(|l| !l.starts_with('#')).collect();
    let getting_started = read(&here().join("src/getting-started.md"));
    let run: Vec<String> = fenced(&getting_started)
        .into_iter()
        .filter(|b| b.info == "sh run")
        .flat_map(|b| b.body.into_iter().filter_map(|l| command(&l).map(str::to_owned)))
        .collect();
    assert!(run.len() >= 10, "getting started runs its commands: {run:?}");
    let (mut checked, mut unrun) = (0, Vec::new());
    for (page, text) in pages() {
        for block in fenced(&text) {
            let language = block.info.split_whitespace().next().unwrap_or_default();
            if ["bash", "shell", "console", "zsh"].contains(&language) {
                unrun.push(format!(
                    "{page}: a ```{} block: write shell as ```sh (run) or ```text",
                    block.info
                ));
                continue;
            }
            if language != "sh" {
                continue;
            }
            if block.info == "sh run" && page != "getting-started.md" {
                unrun.push(format!(
                    "{page}: `sh run` blocks are getting started's (they run in its workspace)"
                ));
            }
            for line in &block.body {
                let Some(command) = command(line) else { continue };
                checked += 1;
                let by_test = run.iter().any(|r| r == command);
                let by_ci = ci_lines.iter().any(|l| {
                    l.find(command).is_some_and(|at| {
                        let after = &l[at + command.len()..];
                        (at == 0 || l[..at].ends_with(' ')) && (after.is_empty() || after.starts_with(' '))
                    })
                });
                if !by_test && !by_ci {
                    unrun.push(format!(
                        "{page}: `{command}` is run neither by getting started nor by .ci/run"
                    ));
                }
            }
        }
    }
    assert!(checked >= 20, "only {checked} shell lines found: the scan is broken");
    assert!(unrun.is_empty(), "{}", unrun.join("\n"));
}

/// The table of contents lists every chapter, and every entry exists.
#[test]
fn the_table_of_contents_holds_every_chapter() {
    let summary = read(&here().join("src/SUMMARY.md"));
    let listed: Vec<&str> = summary.split("](").skip(1).filter_map(|rest| rest.split(')').next()).collect();
    let chapters: Vec<String> =
        pages().into_iter().map(|(name, _)| name).filter(|name| name != "README.md").collect();
    assert!(chapters.len() >= 15, "{chapters:?}");
    for chapter in &chapters {
        assert!(listed.contains(&chapter.as_str()), "SUMMARY.md does not list {chapter}");
    }
    for entry in &listed {
        assert!(chapters.iter().any(|c| c == entry), "SUMMARY.md lists {entry}, which is not in docs/src");
    }
}

/// Getting started, executed: every block of the chapter that names a file
/// (```` ```toml file=events/Cargo.toml ````) is written into a fresh workspace outside
/// this repository, `outbox-runtime`'s `version = "0.1"` becoming a path to this checkout,
/// and every line of its ```` ```sh run ```` blocks is run there, in order: schemas,
/// consumer types, the service's harness test against PostgreSQL and an embedded Kafka,
/// the consumer process built, the CI checks and the `outbox` command's first runs.
#[test]
fn getting_started_builds_tests_and_checks_a_workspace_outside_this_repository() {
    let here = here();
    let chapter = read(&here.join("src/getting-started.md"));
    for block in fenced(&chapter) {
        assert!(
            !block.info.starts_with("rust") || block.info.contains("file="),
            "a Rust block of getting started names its file, or nothing compiles it: ```{}",
            block.info
        );
    }
    let runtime = here.join("../outbox-runtime").canonicalize().expect("outbox-runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("shop");
    let (files, commands) = blocks(&chapter);
    assert!(
        files.len() >= 10,
        "the chapter names its files: {:?}",
        files.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    assert!(commands.len() >= 5, "and its commands: {commands:?}");
    for (path, body) in &files {
        let body = body.replace(
            "outbox-runtime = { version = \"0.1\"",
            &format!("outbox-runtime = {{ path = \"{}\"", runtime.display()),
        );
        write(&root.join(path), &body);
    }
    fs::copy(here.join("../Cargo.lock"), root.join("Cargo.lock")).expect("copy Cargo.lock");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| here.join("../target"))
        // Not the other test's: both build a package `xtask`, and run it, in parallel.
        .join("user-project-book");
    // Its own database: `outbox migrate` and `status` must start from nothing.
    let database = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(outbox_tests::db::fresh_databases(["outbox_book_workspace"]))
        .expect("a fresh database")[0]
        .clone();
    let bin = dir.path().join("cargo-root");
    let mut background = Vec::new();
    for line in &commands {
        let (command, comment) = line.split_once(" #").unwrap_or((line.as_str(), ""));
        let command = command.trim();
        let mut words: Vec<String> = command.split_whitespace().map(str::to_owned).collect();
        let spawn = words.last().is_some_and(|w| w == "&");
        if spawn {
            words.pop();
        }
        // `exit N: TEXT ...` in the comment: that exit code, and TEXT in what it prints.
        let (code, said) = match comment.trim().strip_prefix("exit ") {
            Some(rest) => {
                let (code, said) = rest.split_once(':').unwrap_or((rest, ""));
                (code.trim().parse::<i32>().expect("exit code"), said.trim().trim_end_matches("...").trim())
            }
            None => (0, ""),
        };
        assert!(!words.is_empty(), "an empty command in the chapter: {line:?}");
        if words.get(..2) == Some(&["cargo".to_owned(), "install".to_owned()][..]) {
            // The published crate, stood in for by this checkout (debug: it is only run here).
            assert_eq!(words[2], "outbox-runtime", "{command}");
            assert!(words.iter().any(|w| w == "--locked"), "installs what Cargo.lock names: {command}");
            words.splice(2..3, ["--path".to_owned(), runtime.display().to_string()]);
            words.extend(["--debug", "--root"].map(str::to_owned));
            words.push(bin.display().to_string());
        }
        let program = match words[0].as_str() {
            "cargo" => std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()),
            "outbox" => bin.join("bin/outbox").display().to_string(),
            other => panic!("the chapter's commands are cargo's and outbox's: {other}"),
        };
        let mut child = Command::new(program);
        child
            .args(&words[1..])
            .current_dir(&root)
            .env("CARGO_TARGET_DIR", &target)
            .env("CARGO_NET_OFFLINE", "true")
            .env("DATABASE_URL", &database)
            .env_remove("CARGO_MANIFEST_DIR")
            .env_remove("RUSTFLAGS");
        if spawn {
            background.push((command.to_owned(), child.stdout(Stdio::piped()).spawn().expect("starts")));
            continue;
        }
        let out = child.output().expect("runs");
        eprintln!("book workspace: `{command}`: {}", out.status);
        assert_eq!(out.status.code(), Some(code), "`{command}` in the chapter's workspace:\n{}", text(&out));
        assert!(text(&out).contains(said), "`{command}` says {said:?}:\n{}", text(&out));
        if command.starts_with("cargo test") {
            let said = text(&out);
            assert!(said.contains("test an_issued_invoice_reaches_the_ledger_once ... ok"), "{said}");
        }
    }
    // The background ones (the dev broker) came up, and stop on SIGTERM.
    for (command, mut child) in background {
        let addr = root.join("broker.addr");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !addr.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(child.try_wait().expect("wait").is_none(), "`{command}` still runs");
        let bootstrap = fs::read_to_string(&addr).expect("the broker wrote its address");
        let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
        assert!(killed.success());
        let out = child.wait_with_output().expect("wait");
        assert_eq!(out.status.code(), Some(0), "`{command}` stops on SIGTERM");
        assert!(text(&out).contains(&format!("export KAFKA_BROKERS={bootstrap}")), "{}", text(&out));
    }
    assert!(root.join("schemas/invoice.issued/v1.json").is_file());
    let types = fs::read_to_string(root.join("consumer/src/events.rs")).expect("generated types");
    assert!(types.contains("pub struct InvoiceIssuedV1"), "{types}");
}

/// The blocks of the chapter that name a file, and the lines of its `sh run` blocks (with
/// their comments, which may say `exit N: what it prints`).
fn blocks(chapter: &str) -> (Vec<(String, String)>, Vec<String>) {
    let (mut files, mut commands) = (Vec::new(), Vec::new());
    for block in fenced(chapter) {
        if let Some(path) = block.info.split_whitespace().find_map(|w| w.strip_prefix("file=")) {
            files.push((path.to_owned(), block.body.join("\n") + "\n"));
        } else if block.info == "sh run" {
            commands.extend(block.body.iter().filter(|l| command(l).is_some()).map(|l| l.trim().to_owned()));
        }
    }
    (files, commands)
}

fn write(path: &Path, body: &str) {
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, body).expect("write");
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}
