//! `schema push --registry URL`: every committed version registered in a schema registry,
//! in order, with our verdict printed beside the registry's.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use crate::schema::{compare_with, Dialect, Judge, Level, Policy, SchemaDoc};
use crate::schema_registry::{committed_schemas, Client, Lookup, RegistryError, TOPIC_RECORD_SUBJECT};

/// `schema push --registry URL [--subject TEMPLATE] [--compatibility LEVEL] [--policy P] [--dry-run]`.
#[derive(Debug, Clone, Args)]
#[non_exhaustive]
pub struct PushArgs {
    /// The registry, `http(s)://HOST[:PORT][/PATH]`. Credentials come from
    /// OUTBOX_SCHEMA_REGISTRY_USER and OUTBOX_SCHEMA_REGISTRY_PASSWORD, never the URL.
    #[arg(long, env = "OUTBOX_SCHEMA_REGISTRY_URL")]
    pub registry: String,
    /// The schemas directory (default: `schemas` at the workspace root).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The subject of each file: `{topic}`, `{title}`, `{event_type}` and `{version}`
    /// replaced. The default is Confluent's TopicRecordNameStrategy (the record name of a
    /// JSON Schema is its title); `{topic}-value` is its TopicNameStrategy.
    #[arg(long, default_value = TOPIC_RECORD_SUBJECT)]
    pub subject: String,
    /// The compatibility level set on a subject before its first registration (a subject
    /// that exists keeps its own).
    #[arg(long, default_value = "FULL", value_parser = Level::NAMES)]
    pub compatibility: String,
    /// The compatibility policy set with it (strict, the registry's default, or lenient),
    /// and the one our verdict predicts.
    #[arg(long, value_name = "strict|lenient", value_parser = |s: &str| s.parse::<Policy>())]
    pub policy: Option<Policy>,
    /// Look up and check only: register nothing, configure nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// One committed file to push.
struct Item {
    path: PathBuf,
    text: String,
    subject: String,
    label: String,
}

/// What one file came to.
enum Outcome {
    Already,
    Registered,
    Refused,
}

pub(super) fn push(dir: &Path, args: &PushArgs, judge: Judge) -> ExitCode {
    let items = match plan(dir, &args.subject) {
        Ok(items) => items,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let client = match Client::from_env(&args.registry) {
        Ok(client) => client,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let (mut already, mut registered, mut refused) = (0, 0, 0);
    for item in &items {
        match push_one(&client, item, args, judge) {
            Ok(Outcome::Already) => already += 1,
            Ok(Outcome::Registered) => registered += 1,
            Ok(Outcome::Refused) => refused += 1,
            // Refused at lookup or at the compatibility check (an invalid schema, say):
            // the registry answered as documented, and said no.
            Err(e) if e.is_refusal() => {
                eprintln!("error: {}: {}: {e}", item.path.display(), item.label);
                refused += 1;
            }
            Err(e) => {
                eprintln!("error: {}: {e}", item.path.display());
                eprintln!("schema push stopped: the registry did not answer as its API documents");
                return ExitCode::from(3);
            }
        }
    }
    let verb = if args.dry_run { "would register" } else { "registered" };
    println!(
        "schema push to {}: {} file(s): {registered} {verb}, {already} already registered, {refused} refused",
        client.url(),
        items.len()
    );
    if refused > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The committed files in order (event type, then version), each with its subject.
fn plan(dir: &Path, template: &str) -> Result<Vec<Item>, String> {
    Ok(committed_schemas(dir, template)
        .map_err(|e| match e {
            RegistryError::Config { reason, .. } => reason,
            other => other.to_string(),
        })?
        .into_iter()
        .map(|f| Item {
            label: format!("{} v{}", f.event_type, f.version),
            path: f.path,
            text: f.text,
            subject: f.subject,
        })
        .collect())
}

fn push_one(client: &Client, item: &Item, args: &PushArgs, judge: Judge) -> Result<Outcome, RegistryError> {
    let Item { subject, label, .. } = item;
    match client.lookup(subject, &item.text)? {
        Lookup::Registered(r) => {
            println!(
                "{label}: already registered in subject {subject:?} as id {} (version {})",
                r.id, r.version
            );
            Ok(Outcome::Already)
        }
        Lookup::NoSubject => {
            if args.dry_run {
                println!(
                    "{label}: would create subject {subject:?} ({}{}) and register it",
                    args.compatibility,
                    args.policy.map(|p| format!(", {} policy", p)).unwrap_or_default()
                );
                return Ok(Outcome::Registered);
            }
            client.set_compatibility(subject, &args.compatibility, args.policy)?;
            register(client, item)
        }
        Lookup::NotInSubject => {
            let level = client.compatibility(subject)?;
            let ours = our_verdict(client, item, &level, judge)?;
            let theirs = client.check_latest(subject, &item.text)?;
            println!("{label}: subject {subject:?} ({level}) holds other versions");
            println!("  our verdict ({judge_name}): {ours}", judge_name = describe(judge));
            if theirs.is_compatible {
                println!("  the registry's verdict: compatible");
            } else {
                println!("  the registry's verdict: incompatible");
                for m in &theirs.messages {
                    println!("    {m}");
                }
            }
            if args.dry_run {
                println!("  would register it");
                return Ok(if theirs.is_compatible { Outcome::Registered } else { Outcome::Refused });
            }
            register(client, item)
        }
    }
}

fn register(client: &Client, item: &Item) -> Result<Outcome, RegistryError> {
    match client.register(&item.subject, &item.text) {
        Ok(id) => {
            println!("{}: registered in subject {:?} as id {id}", item.label, item.subject);
            Ok(Outcome::Registered)
        }
        Err(e) if e.is_refusal() => {
            eprintln!("error: {}: {}: {e}", item.path.display(), item.label);
            Ok(Outcome::Refused)
        }
        Err(e) => Err(e),
    }
}

fn describe(judge: Judge) -> String {
    format!("{} semantics, {} policy", judge.semantics, judge.policy)
}

/// Our verdict on the file against the subject's latest version under its level.
fn our_verdict(client: &Client, item: &Item, level: &str, judge: Judge) -> Result<String, RegistryError> {
    let Some(mode) = Level::from_name(level).and_then(|l| l.mode) else {
        return Ok(format!("not judged (level {level})"));
    };
    let latest = client.latest(&item.subject)?;
    let name = format!("{} version {}", item.subject, latest.version);
    // The registry reads a schema without `$schema` as draft-07; so do we, here.
    let old = match SchemaDoc::from_str_in(&name, &latest.schema, Dialect::Draft7) {
        Ok(doc) => doc,
        Err(e) => return Ok(format!("not judged: {e}")),
    };
    let new = match SchemaDoc::from_str_in(&item.path.display().to_string(), &item.text, Dialect::Draft7) {
        Ok(doc) => doc,
        Err(e) => return Ok(format!("not judged: {e}")),
    };
    let report = compare_with(&old, &new, mode, judge);
    if report.is_compatible() {
        return Ok(format!("compatible ({mode}) with version {}", latest.version));
    }
    let mut out = format!("incompatible ({mode}) with version {}", latest.version);
    for inc in &report.incompatibilities {
        out.push_str(&format!("\n    {inc}"));
    }
    Ok(out)
}
