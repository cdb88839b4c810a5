//! `schema generate | check | compat`: what they print and their exit codes.

use std::path::Path;
use std::process::ExitCode;

use crate::registry::EventDescriptor;
use crate::schema::{
    self, CheckOptions, Dialect, FileStatus, GenerateError, Judge, Mode, SchemaDoc, Semantics,
};

pub(super) fn generate(
    dir: &Path,
    events: &[&EventDescriptor],
    force: bool,
    base: &str,
    judge: Judge,
) -> ExitCode {
    match schema::generate_judged(dir, events, force, base, judge) {
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

pub(super) fn check(dir: &Path, events: &[&EventDescriptor], options: &CheckOptions) -> ExitCode {
    let report = schema::check_with(dir, events, options);
    if report.is_ok() {
        println!("{report}");
        return ExitCode::SUCCESS;
    }
    eprintln!("{report}");
    if report.is_bad_input() {
        ExitCode::from(2)
    } else {
        ExitCode::from(1)
    }
}

/// How a verdict line names its judge: nothing for the default serde semantics (the line
/// as it always was), else the semantics and the policy.
fn judged_by(judge: Judge) -> String {
    match judge.semantics {
        Semantics::Serde => String::new(),
        semantics => format!(" [{semantics} semantics, {} policy]", judge.policy),
    }
}

pub(super) fn compat(old: &Path, new: &Path, mode: Mode, judge: Judge) -> ExitCode {
    // A schema without `$schema` is draft-07 to registries; serde semantics reads what
    // schemars writes, 2020-12.
    let default = match judge.semantics {
        Semantics::JsonSchema => Dialect::Draft7,
        _ => Dialect::Draft2020,
    };
    let docs = SchemaDoc::from_file_in(old, default)
        .and_then(|o| SchemaDoc::from_file_in(new, default).map(|n| (o, n)));
    let (old_doc, new_doc) = match docs {
        Ok(docs) => docs,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    let report = schema::compare_with(&old_doc, &new_doc, mode, judge);
    let by = judged_by(judge);
    if report.is_compatible() {
        println!("compatible ({mode}): {} -> {}{by}", old.display(), new.display());
        return ExitCode::SUCCESS;
    }
    println!(
        "incompatible ({mode}): {} -> {}: {} problem(s){by}",
        old.display(),
        new.display(),
        report.incompatibilities.len()
    );
    for inc in &report.incompatibilities {
        println!("  {inc}");
    }
    ExitCode::from(1)
}
