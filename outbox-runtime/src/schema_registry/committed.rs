//! The committed schema files and the subject each is registered under.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{subject_name, RegistryError};
use crate::schema::{self, CheckReport, SchemaDoc};

/// One committed schema file and its subject.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CommittedSchema {
    /// The file.
    pub path: PathBuf,
    /// Its event type.
    pub event_type: String,
    /// Its schema version.
    pub version: u32,
    /// The file as committed: what is registered and looked up, byte for byte.
    pub text: String,
    /// The subject `template` names for it.
    pub subject: String,
}

/// The schemas committed in `dir` (`<event_type>/v<N>.json`, as `cargo xtask schema
/// generate` writes them), in order (event type, then version), each with the subject
/// `template` names ([`subject_name`]): what `cargo xtask schema push` registers and
/// [`SchemaIds::resolve`](super::SchemaIds::resolve) looks up. An error
/// ([`RegistryError::Config`]) names the file or the template.
pub fn committed_schemas(dir: &Path, template: &str) -> Result<Vec<CommittedSchema>, RegistryError> {
    committed(dir, template).map_err(|reason| RegistryError::Config { setting: "schema directory", reason })
}

fn committed(dir: &Path, template: &str) -> Result<Vec<CommittedSchema>, String> {
    let mut report = CheckReport::default();
    let committed = schema::committed_versions(dir, &mut report);
    if !report.problems.is_empty() {
        return Err(report.to_string().trim_end().trim_start_matches("error: ").to_owned());
    }
    if committed.is_empty() {
        return Err(format!("{}: no committed schemas (<event_type>/v<N>.json)", dir.display()));
    }
    let mut files = Vec::new();
    for (event_type, versions) in committed {
        for version in versions {
            let path = schema::schema_path(dir, &event_type, version);
            let doc = SchemaDoc::from_file(&path).map_err(|e| e.to_string())?;
            let meta = doc.root().get("x-outbox");
            let text_of = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
            let topic = text_of(meta.and_then(|m| m.get("topic")));
            let title = text_of(doc.root().get("title"));
            let need = |placeholder: &str, value: &Option<String>, what: &str| {
                if template.contains(placeholder) && value.is_none() {
                    Err(format!(
                        "{}: the subject template {template:?} needs {what}, which this file lacks",
                        path.display()
                    ))
                } else {
                    Ok(())
                }
            };
            need("{topic}", &topic, "x-outbox.topic")?;
            need("{title}", &title, "a title")?;
            let subject = subject_name(
                template,
                topic.as_deref().unwrap_or(""),
                title.as_deref().unwrap_or(""),
                &event_type,
                version,
            )?;
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
            files.push(CommittedSchema { path, event_type: event_type.clone(), version, text, subject });
        }
    }
    Ok(files)
}
