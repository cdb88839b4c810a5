//! `cargo xtask schema generate | check | compat`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use outbox_runtime::registry;
use outbox_runtime::schema::{self, FileStatus, GenerateError, Mode, Problem, SchemaDoc};

#[derive(Subcommand)]
pub(crate) enum SchemaCommand {
    /// Writes schemas/<event_type>/v<schema_version>.json for every registered event.
    Generate {
        /// The schemas directory [default: <workspace>/schemas].
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Overwrite committed files even with a schema that is not FULL compatible.
        #[arg(long)]
        force: bool,
    },
    /// Fails (exit 1) when the committed schemas do not match the code; exit 2 on a bad file.
    Check {
        /// The schemas directory [default: <workspace>/schemas].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Exit 0 when NEW is compatible with OLD in MODE, 1 when not, 2 on bad input.
    Compat {
        /// The old schema file.
        old: PathBuf,
        /// The new schema file.
        new: PathBuf,
        /// backward: new reads old; forward: old reads new; full: both.
        #[arg(long, default_value = "full", value_parser = parse_mode)]
        mode: Mode,
    },
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    s.parse::<Mode>().map_err(|e| e.to_string())
}

fn dir_or_default(dir: Option<PathBuf>) -> PathBuf {
    dir.unwrap_or_else(|| crate::project_root().join("schemas"))
}

pub(crate) fn run(cmd: SchemaCommand) -> ExitCode {
    match cmd {
        SchemaCommand::Generate { dir, force } => generate(dir_or_default(dir), force),
        SchemaCommand::Check { dir } => check(dir_or_default(dir)),
        SchemaCommand::Compat { old, new, mode } => compat(&old, &new, mode),
    }
}

fn generate(dir: PathBuf, force: bool) -> ExitCode {
    let events = registry::events();
    match schema::generate(&dir, &events, force) {
        Ok(done) => {
            let (mut created, mut updated, mut unchanged) = (0, 0, 0);
            for status in &done {
                match status {
                    FileStatus::Created(path) => {
                        created += 1;
                        println!("created   {}", path.display());
                    }
                    FileStatus::Updated(path) => {
                        updated += 1;
                        println!("updated   {}", path.display());
                    }
                    FileStatus::Unchanged(_) => unchanged += 1,
                    _ => {}
                }
            }
            println!(
                "{} event schema(s): {created} created, {updated} updated, {unchanged} unchanged",
                done.len()
            );
            ExitCode::SUCCESS
        }
        Err(GenerateError::Refused(report)) => {
            eprintln!("{report}");
            eprintln!("nothing was written (use --force to overwrite anyway)");
            ExitCode::from(1)
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}

fn check(dir: PathBuf) -> ExitCode {
    let report = schema::check(&dir, &registry::events());
    if report.is_ok() {
        println!("{report}");
        return ExitCode::SUCCESS;
    }
    eprintln!("{report}");
    if report.problems.iter().any(|p| matches!(p, Problem::BadFile(_))) {
        ExitCode::from(2)
    } else {
        ExitCode::from(1)
    }
}

fn compat(old: &std::path::Path, new: &std::path::Path, mode: Mode) -> ExitCode {
    let docs = SchemaDoc::from_file(old).and_then(|o| SchemaDoc::from_file(new).map(|n| (o, n)));
    let (old_doc, new_doc) = match docs {
        Ok(docs) => docs,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    let report = schema::compare(&old_doc, &new_doc, mode);
    if report.is_compatible() {
        println!("compatible ({mode}): {} -> {}", old.display(), new.display());
        return ExitCode::SUCCESS;
    }
    println!(
        "incompatible ({mode}): {} -> {}: {} problem(s)",
        old.display(),
        new.display(),
        report.incompatibilities.len()
    );
    for inc in &report.incompatibilities {
        println!("  {inc}");
    }
    ExitCode::from(1)
}
