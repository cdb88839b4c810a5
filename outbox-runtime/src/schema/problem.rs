//! What a check of the committed schemas can find wrong ([`Problem`]) and its report
//! ([`CheckReport`]); shared by `schema generate` (which refuses what `check` would) and
//! `schema check`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::compat::{compare_with, Incompatibility, Judge, Mode};
use super::document::{InputError, SchemaDoc};
use crate::registry::EventDescriptor;

/// One thing wrong with the committed schemas.
#[derive(Debug)]
#[non_exhaustive]
pub enum Problem {
    /// A registered event has no committed schema file.
    Missing {
        /// The event's Rust type.
        rust_type: String,
        /// The file that should exist.
        path: PathBuf,
    },
    /// The committed file differs from the code's schema, but FULL compatibly.
    Stale {
        /// The event's Rust type.
        rust_type: String,
        /// The committed file.
        path: PathBuf,
    },
    /// The committed file differs from the code's schema incompatibly, at the same version.
    Incompatible {
        /// The event's Rust type.
        rust_type: String,
        /// The event type.
        event_type: String,
        /// The version both claim.
        version: u32,
        /// The committed file.
        path: PathBuf,
        /// Every incompatibility, in both directions.
        incompatibilities: Vec<Incompatibility>,
    },
    /// A version's file is gone while the event type still exists.
    Deleted {
        /// The event type.
        event_type: String,
        /// The version whose file is gone.
        version: u32,
        /// The file that should exist.
        path: PathBuf,
    },
    /// The code's newest version is lower than the newest committed one.
    VersionWentDown {
        /// The event type.
        event_type: String,
        /// The newest version in the code.
        code: u32,
        /// The newest committed version.
        committed: u32,
    },
    /// Two Rust types claim the same (event_type, schema_version).
    Duplicate {
        /// The event type.
        event_type: String,
        /// The version.
        version: u32,
        /// The types that claim it.
        rust_types: Vec<String>,
    },
    /// A committed file cannot be read as a schema.
    BadFile(InputError),
    /// A `.json` file whose place does not follow `<event_type>/v<N>.json`.
    UnexpectedFile(PathBuf),
    /// No event is registered at all: the crate that defines the events is not linked
    /// into the binary that checks them, so there would be nothing to check.
    NoEvents,
    /// The registered events are not the ones [`CheckOptions`](super::CheckOptions) pins.
    Unexpected {
        /// How many event types [`CheckOptions::expect_events`](super::CheckOptions::expect_events) asks for, if it does.
        expected_count: Option<usize>,
        /// How many event types are registered.
        registered: usize,
        /// Event types [`CheckOptions::expect_types`](super::CheckOptions::expect_types) names that no registered type has.
        missing: Vec<String>,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Missing { rust_type, path } => write!(
                f,
                "{}: no committed schema for {rust_type}; run `cargo xtask schema generate` and commit the file",
                path.display()
            ),
            Problem::Stale { rust_type, path } => write!(
                f,
                "{}: differs from the schema of {rust_type}, compatibly (FULL); regenerate and commit: `cargo xtask schema generate`",
                path.display()
            ),
            Problem::Incompatible { rust_type, event_type, version, path, incompatibilities } => {
                write!(
                    f,
                    "{}: {event_type} v{version} ({rust_type}) changed incompatibly without a version bump; bump schema_version and keep the old file (a same-version change must be FULL compatible):",
                    path.display()
                )?;
                for inc in incompatibilities {
                    write!(f, "\n    {event_type} v{version} {inc}")?;
                }
                Ok(())
            }
            Problem::Deleted { event_type, version, path } => write!(
                f,
                "{}: the schema of {event_type} v{version} was deleted while event type {event_type} still exists; restore it (every version stays committed while events of it may exist; versions start at 1)",
                path.display()
            ),
            Problem::VersionWentDown { event_type, code, committed } => write!(
                f,
                "{event_type}: the schema version went down: the code's newest is v{code}, but v{committed} is committed; versions only go up"
            ),
            Problem::Duplicate { event_type, version, rust_types } => write!(
                f,
                "{event_type} v{version} is claimed by {} types: {}; each (event_type, schema_version) belongs to one type",
                rust_types.len(),
                rust_types.join(", ")
            ),
            Problem::BadFile(err) => write!(f, "{err}"),
            Problem::NoEvents => write!(
                f,
                "no events are registered, so there is nothing to check: link the crate that defines them into this binary \
                 (`use my_events as _;` in the xtask's main.rs, with the crate in its [dependencies]); \
                 a check of zero events would pass whatever the schemas say"
            ),
            Problem::Unexpected { expected_count, registered, missing } => {
                write!(f, "{registered} event type(s) are registered")?;
                if let Some(n) = expected_count {
                    write!(f, ", {n} expected (--expect-events)")?;
                }
                if !missing.is_empty() {
                    write!(f, "; not registered: {} (--expect-type)", missing.join(", "))?;
                }
                write!(f, "; is every crate that defines events linked into this binary?")
            }
            Problem::UnexpectedFile(path) => write!(
                f,
                "{}: unexpected file; committed schemas live at <event_type>/v<schema_version>.json",
                path.display()
            ),
        }
    }
}

/// The outcome of [`check`](super::check).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct CheckReport {
    /// What fails the check.
    pub problems: Vec<Problem>,
    /// What is worth knowing but fails nothing.
    pub notes: Vec<String>,
    /// How many (event_type, version) pairs were checked.
    pub checked: usize,
}

impl CheckReport {
    /// No problem was found.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// Whether a problem is in the input rather than in the schemas: a file that is not a
    /// schema, or no (or not the expected) events to check. `cargo xtask schema check`
    /// exits 2 then, and 1 for the other problems.
    pub fn is_bad_input(&self) -> bool {
        self.problems
            .iter()
            .any(|p| matches!(p, Problem::BadFile(_) | Problem::NoEvents | Problem::Unexpected { .. }))
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for problem in &self.problems {
            writeln!(f, "error: {problem}")?;
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        if self.is_ok() {
            write!(f, "schemas ok: {} event schema(s) match the committed files", self.checked)
        } else {
            write!(f, "schema check failed: {} problem(s)", self.problems.len())
        }
    }
}

pub(super) fn duplicates(events: &[&EventDescriptor]) -> Vec<Problem> {
    let mut claims: BTreeMap<(&str, u32), Vec<String>> = BTreeMap::new();
    for e in events {
        claims.entry((e.event_type, e.schema_version)).or_default().push(e.rust_type.to_owned());
    }
    claims
        .into_iter()
        .filter(|(_, types)| types.len() > 1)
        .map(|((event_type, version), rust_types)| Problem::Duplicate {
            event_type: event_type.to_owned(),
            version,
            rust_types,
        })
        .collect()
}

/// Judges a committed text that differs from the generated one.
pub(super) fn judge_difference(
    event: &EventDescriptor,
    path: &Path,
    committed: &str,
    generated: &str,
    judge: Judge,
) -> Option<Problem> {
    let name = path.display().to_string();
    let old = match SchemaDoc::from_str(&name, committed) {
        Ok(doc) => doc,
        Err(err) => return Some(Problem::BadFile(err)),
    };
    let new = match SchemaDoc::from_str(&format!("{} (from code)", event.rust_type), generated) {
        Ok(doc) => doc,
        Err(err) => return Some(Problem::BadFile(err)),
    };
    let report = compare_with(&old, &new, Mode::Full, judge);
    Some(if report.is_compatible() {
        Problem::Stale { rust_type: event.rust_type.to_owned(), path: path.to_owned() }
    } else {
        Problem::Incompatible {
            rust_type: event.rust_type.to_owned(),
            event_type: event.event_type.to_owned(),
            version: event.schema_version,
            path: path.to_owned(),
            incompatibilities: report.incompatibilities,
        }
    })
}
