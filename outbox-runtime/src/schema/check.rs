//! `schema check`: the committed schemas against the registered events: every event has
//! its file, every change is compatible or a new version, no version disappears or goes
//! down, no two types claim one (event_type, version).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::compat::Judge;
use super::document::InputError;
use super::problem::{duplicates, judge_difference, CheckReport, Problem};
use super::repo::{render_with, schema_path, DEFAULT_SCHEMA_BASE};
use crate::registry::EventDescriptor;

/// What [`check_with`] requires beyond the committed files matching the code.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct CheckOptions {
    expect_events: Option<usize>,
    expect_types: Vec<String>,
    schema_base: Option<String>,
    judge: Judge,
}

impl CheckOptions {
    /// Nothing pinned: any non-empty set of registered events is checked.
    pub fn new() -> Self {
        CheckOptions::default()
    }

    /// Exactly this many event types (distinct `event_type`s) must be registered.
    pub fn expect_events(mut self, count: impl Into<Option<usize>>) -> Self {
        self.expect_events = count.into();
        self
    }

    /// The base of the files' `$id`s (see [`schema_uri`](super::schema_uri)). Default:
    /// [`DEFAULT_SCHEMA_BASE`](super::DEFAULT_SCHEMA_BASE).
    #[must_use]
    pub fn schema_base(mut self, base: impl Into<String>) -> Self {
        self.schema_base = Some(base.into());
        self
    }

    /// How a committed file and the code's schema of the same version are compared
    /// (default: serde semantics). With [`Semantics::JsonSchema`](super::Semantics) and a
    /// [`Policy`](super::Policy), a change a schema registry would refuse is refused here.
    #[must_use]
    pub fn judge(mut self, judge: Judge) -> Self {
        self.judge = judge;
        self
    }

    /// Each of these event types must be registered.
    pub fn expect_types<S: Into<String>>(mut self, types: impl IntoIterator<Item = S>) -> Self {
        self.expect_types = types.into_iter().map(Into::into).collect();
        self
    }
}

/// The committed versions under `dir`, by event type; files that do not fit the layout
/// are reported.
pub(crate) fn committed_versions(dir: &Path, report: &mut CheckReport) -> BTreeMap<String, BTreeSet<u32>> {
    let mut found: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    entries.sort();
    for type_dir in entries {
        if !type_dir.is_dir() {
            if type_dir.extension().is_some_and(|e| e == "json") {
                report.problems.push(Problem::UnexpectedFile(type_dir));
            }
            continue;
        }
        let Some(event_type) = type_dir.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        let Ok(files) = std::fs::read_dir(&type_dir) else { continue };
        for file in files.filter_map(Result::ok).map(|e| e.path()) {
            if file.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let version = file
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.strip_prefix('v'))
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|n| *n > 0);
            match version {
                Some(v) => {
                    found.entry(event_type.clone()).or_default().insert(v);
                }
                None => report.problems.push(Problem::UnexpectedFile(file)),
            }
        }
    }
    found
}

/// Checks the committed schemas under `dir` against `events` (usually
/// [`crate::registry::events`]). No events at all is a problem ([`Problem::NoEvents`]):
/// it means the crate defining them is not linked, and the check would prove nothing.
pub fn check(dir: &Path, events: &[&EventDescriptor]) -> CheckReport {
    check_with(dir, events, &CheckOptions::new())
}

/// [`check`], also requiring the registered events to be the ones `options` pins.
pub fn check_with(dir: &Path, events: &[&EventDescriptor], options: &CheckOptions) -> CheckReport {
    let mut report = CheckReport::default();
    if events.is_empty() {
        report.problems.push(Problem::NoEvents);
        return report;
    }
    let types: BTreeSet<&str> = events.iter().map(|e| e.event_type).collect();
    let missing: Vec<String> =
        options.expect_types.iter().filter(|t| !types.contains(t.as_str())).cloned().collect();
    if options.expect_events.is_some_and(|n| n != types.len()) || !missing.is_empty() {
        report.problems.push(Problem::Unexpected {
            expected_count: options.expect_events,
            registered: types.len(),
            missing,
        });
    }
    report.problems.extend(duplicates(events));
    let committed = committed_versions(dir, &mut report);

    let mut code: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    for event in events {
        code.entry(event.event_type).or_default().insert(event.schema_version);
        report.checked += 1;
        let path = schema_path(dir, event.event_type, event.schema_version);
        match std::fs::read_to_string(&path) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                report.problems.push(Problem::Missing { rust_type: event.rust_type.to_owned(), path });
            }
            Err(error) => report.problems.push(Problem::BadFile(InputError::Unreadable {
                source_name: path.display().to_string(),
                error,
            })),
            Ok(text) => {
                let generated =
                    render_with(event, options.schema_base.as_deref().unwrap_or(DEFAULT_SCHEMA_BASE));
                if text != generated {
                    report.problems.extend(judge_difference(event, &path, &text, &generated, options.judge));
                }
            }
        }
    }

    for (event_type, code_versions) in &code {
        let files = committed.get(*event_type).cloned().unwrap_or_default();
        let code_max = code_versions.iter().max().copied().unwrap_or(0);
        let file_max = files.iter().max().copied().unwrap_or(0);
        if file_max > code_max {
            report.problems.push(Problem::VersionWentDown {
                event_type: (*event_type).to_owned(),
                code: code_max,
                committed: file_max,
            });
        }
        for version in 1..=code_max.max(file_max) {
            if !files.contains(&version) && !code_versions.contains(&version) {
                report.problems.push(Problem::Deleted {
                    event_type: (*event_type).to_owned(),
                    version,
                    path: schema_path(dir, event_type, version),
                });
            }
        }
    }
    for (event_type, versions) in &committed {
        if !code.contains_key(event_type.as_str()) {
            report.notes.push(format!(
                "{}: committed schemas {} of event type {event_type}, which no registered type produces any more; they are kept for consumers",
                dir.join(event_type).display(),
                versions.iter().map(|v| format!("v{v}")).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    report
}
