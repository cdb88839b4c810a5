//! Your project's own `cargo xtask` for event contracts (feature `xtask`).
//!
//! The same `schema generate | check | compat` and `typegen` commands, flags, messages and
//! exit codes as this repository's `cargo xtask`, which is built on this module. In a
//! workspace member named `xtask` (with `outbox-runtime` as a dependency, features
//! `["xtask"]`, and the crate that defines your events):
//!
//! ```no_run
//! use my_events as _; // link the crate whose events `#[derive(OutboxEvent)]` registers
//! fn main() -> std::process::ExitCode {
//!     outbox_runtime::xtask::main()
//! }
//! # mod my_events {}
//! ```
//!
//! and the alias in `.cargo/config.toml`:
//!
//! ```toml
//! [alias]
//! xtask = "run --package xtask --"
//! ```
//!
//! Then `cargo xtask schema generate` writes `schemas/<event_type>/v<N>.json` at the root
//! of the workspace, `cargo xtask schema check` is the CI step, and
//! `cargo xtask typegen --out consumer/src/events.rs` writes consumer types.
//!
//! `schema generate | check | compat` judge with serde semantics unless `--semantics
//! json-schema` (with `--policy strict|lenient`) or [`Xtask::semantics`] says otherwise:
//! see [`Semantics`] and the book's "Schema registries" chapter.
//!
//! Exit codes: 0 when all is well; 1 when the schemas and the code disagree (an
//! incompatible change, a missing or stale file) or, for `compat`, when the schemas are
//! incompatible; 2 on bad input: a file that is not a schema, or no registered events at
//! all (the events crate is not linked), or not the events `--expect-events` /
//! `--expect-type` pin.
//!
//! A binary with more commands of its own embeds [`Command`] with `#[command(flatten)]`
//! and hands it to [`Xtask::run`].

use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub use clap;
use clap::{Args, Parser, Subcommand};

use crate::registry::{self, EventDescriptor};
use crate::schema::{self, CheckOptions, Judge, Mode, Policy, Semantics};
use crate::typegen::{write_or_check, Status};

mod commands;
#[cfg(feature = "schema-registry")]
mod push;
#[cfg(feature = "schema-registry")]
pub use push::PushArgs;

/// The contract commands: `schema ...` and `typegen`.
#[derive(Debug, Subcommand)]
#[non_exhaustive]
pub enum Command {
    /// Event JSON Schemas: generate, check, compare.
    #[command(subcommand)]
    Schema(SchemaCommand),
    /// Generates consumer types from the committed schemas (or checks them with --check).
    Typegen(TypegenArgs),
    /// Writes the AsyncAPI 3.0 document of the registered events (or checks it with --check).
    Asyncapi(AsyncApiArgs),
}

/// `asyncapi [--schemas DIR] [--out FILE] [--check] [--title T] [--version V]`.
#[derive(Debug, clap::Args)]
#[non_exhaustive]
pub struct AsyncApiArgs {
    /// The committed schemas (default: `schemas` at the workspace root).
    #[arg(long)]
    pub schemas: Option<PathBuf>,
    /// The document (default: `asyncapi.json` at the workspace root).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Only check: exit 1 when the committed document is stale.
    #[arg(long)]
    pub check: bool,
    /// `info.title` (default: `Xtask::asyncapi_title`, else "Outbox events").
    #[arg(long)]
    pub title: Option<String>,
    /// `info.version`, the contract's version (default: 1.0.0).
    #[arg(long, default_value = "1.0.0")]
    pub version: String,
}

/// `schema generate | check | compat`.
#[derive(Debug, Subcommand)]
#[non_exhaustive]
pub enum SchemaCommand {
    /// Writes schemas/<event_type>/v<schema_version>.json for every registered event.
    Generate {
        /// The schemas directory (default: `schemas` at the workspace root).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Overwrite committed files even with a schema that is not FULL compatible.
        #[arg(long)]
        force: bool,
        /// How a committed file's change is judged.
        #[command(flatten)]
        judge: JudgeArgs,
    },
    /// Fails (exit 1) when the committed schemas do not match the code; exit 2 on a bad
    /// file, or when no events (or not the expected ones) are registered.
    Check {
        /// The schemas directory (default: `schemas` at the workspace root).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Exit 2 unless exactly N distinct event types are registered (all versions of
        /// one event type count once).
        #[arg(long, value_name = "N")]
        expect_events: Option<usize>,
        /// Exit 2 unless this event type is registered (repeat it to pin several).
        #[arg(long = "expect-type", value_name = "EVENT_TYPE")]
        expect_types: Vec<String>,
        /// How a committed file's change is judged.
        #[command(flatten)]
        judge: JudgeArgs,
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
        /// How the two schemas are judged.
        #[command(flatten)]
        judge: JudgeArgs,
    },
    /// Registers every committed schema version in a schema registry (Confluent's REST
    /// API), in order; a second push registers nothing.
    #[cfg(feature = "schema-registry")]
    Push(PushArgs),
}

/// `--semantics serde|json-schema --policy strict|lenient`: what compatible means (see
/// [`Semantics`] and [`Policy`]). Unset, they are the project's ([`Xtask::semantics`],
/// [`Xtask::policy`]), else serde semantics.
#[derive(Debug, Clone, Default, Args)]
#[non_exhaustive]
pub struct JudgeArgs {
    /// serde: what the Rust types write and read (the default, for generated schemas);
    /// json-schema: every value the old schema accepts, the new one accepts (what a schema
    /// registry judges; for schemas written by hand or by other tools).
    #[arg(long, value_name = "serde|json-schema", value_parser = parse_semantics)]
    pub semantics: Option<Semantics>,
    /// With json-schema semantics, the schema registry policy the verdict predicts: strict
    /// (Confluent's default STRICT) or lenient (its LENIENT: open content models are read
    /// as if they held only the properties they declare).
    #[arg(long, value_name = "strict|lenient", value_parser = parse_policy)]
    pub policy: Option<Policy>,
}

/// `typegen [--schemas DIR] [--out FILE] [--check]`.
#[derive(Debug, Args)]
#[non_exhaustive]
pub struct TypegenArgs {
    /// The committed schemas (default: `schemas` at the workspace root).
    #[arg(long)]
    pub schemas: Option<PathBuf>,
    /// The generated Rust file (required unless the xtask sets a default).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Only check: exit 1 when the file is stale.
    #[arg(long)]
    pub check: bool,
}

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Event contracts: JSON Schemas and consumer types", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    s.parse::<Mode>().map_err(|e| e.to_string())
}

fn parse_semantics(s: &str) -> Result<Semantics, String> {
    s.parse()
}

fn parse_policy(s: &str) -> Result<Policy, String> {
    s.parse()
}

/// Runs the contract commands on the process's arguments, with the defaults of
/// [`Xtask::new`].
pub fn main() -> ExitCode {
    Xtask::new().main()
}

/// The contract commands with a project's defaults.
#[derive(Debug, Clone, Default)]
pub struct Xtask {
    root: Option<PathBuf>,
    typegen_out: Option<PathBuf>,
    schema_base: Option<String>,
    asyncapi_title: Option<String>,
    semantics: Option<Semantics>,
    policy: Option<Policy>,
}

/// `info.title` of the AsyncAPI document unless [`Xtask::asyncapi_title`] or `--title`
/// says otherwise.
pub const DEFAULT_ASYNCAPI_TITLE: &str = "Outbox events";

impl Xtask {
    /// Defaults: the root is the Cargo workspace around the running xtask (see
    /// [`Xtask::root`]), schemas live in `<root>/schemas`, and `typegen` needs `--out`.
    pub fn new() -> Self {
        Xtask::default()
    }

    /// The project root, under which `schemas/` lives. Default: the nearest directory,
    /// at or above the xtask package (`CARGO_MANIFEST_DIR`, which `cargo run` sets; the
    /// current directory when it is not set), whose `Cargo.toml` has a `[workspace]`
    /// table; failing that, that starting directory itself.
    pub fn root(mut self, dir: impl Into<PathBuf>) -> Self {
        self.root = Some(dir.into());
        self
    }

    /// The file `typegen` writes when `--out` is not given, relative to the root unless
    /// absolute.
    pub fn typegen_out(mut self, file: impl Into<PathBuf>) -> Self {
        self.typegen_out = Some(file.into());
        self
    }

    /// The base of the committed schemas' `$id`s, which must be the relays' `dataschema`
    /// base (`RelayConfig::dataschema_base`) for `dataschema` to name the committed file.
    /// Default: [`schema::DEFAULT_SCHEMA_BASE`].
    pub fn schema_base(mut self, base: impl Into<String>) -> Self {
        self.schema_base = Some(base.into());
        self
    }

    /// `info.title` of the AsyncAPI document, e.g. the service's name (default:
    /// [`DEFAULT_ASYNCAPI_TITLE`]; `--title` overrides it). It is part of the document, so
    /// `asyncapi --check` must see the same title that wrote it: set it here rather than
    /// on the command line.
    pub fn asyncapi_title(mut self, title: impl Into<String>) -> Self {
        self.asyncapi_title = Some(title.into());
        self
    }

    /// What compatible means for `schema generate | check | compat` unless `--semantics`
    /// says otherwise (default: [`Semantics::Serde`]). A project whose schemas are also
    /// registered in a schema registry sets [`Semantics::JsonSchema`], so that a change
    /// the registry would refuse fails `schema check` first.
    pub fn semantics(mut self, semantics: Semantics) -> Self {
        self.semantics = Some(semantics);
        self
    }

    /// The registry policy JSON Schema semantics predict unless `--policy` says otherwise
    /// (default: [`Policy::Strict`], the registry's own default). Serde semantics have no
    /// policy; it is ignored with them.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The judge of a command: its flags, else the project's defaults. `--policy` with serde
    /// semantics is refused: it would be silently ignored.
    fn judge(&self, args: &JudgeArgs) -> Result<Judge, String> {
        let semantics = args.semantics.or(self.semantics).unwrap_or_default();
        if semantics == Semantics::Serde {
            if let Some(policy) = args.policy {
                return Err(format!(
                    "--policy {policy} predicts a schema registry's verdict, which judges JSON Schema \
                     instance semantics: add --semantics json-schema (serde semantics have no policy)"
                ));
            }
        }
        Ok(Judge::new(semantics, args.policy.or(self.policy).unwrap_or_default()))
    }

    fn base(&self) -> &str {
        self.schema_base.as_deref().unwrap_or(schema::DEFAULT_SCHEMA_BASE)
    }

    /// Parses the process's arguments and runs the command; prints clap's usage (exit 2)
    /// on bad arguments.
    pub fn main(&self) -> ExitCode {
        let cli = Cli::parse();
        self.run(cli.command)
    }

    /// Runs one command on the registered events ([`registry::events`]).
    pub fn run(&self, command: Command) -> ExitCode {
        self.run_on(command, &registry::events())
    }

    /// Runs one command on the given events instead of the registered ones.
    pub fn run_on(&self, command: Command, events: &[&EventDescriptor]) -> ExitCode {
        let judged = |args: &JudgeArgs| {
            self.judge(args).map_err(|e| {
                eprintln!("error: {e}");
                ExitCode::from(2)
            })
        };
        match command {
            Command::Schema(SchemaCommand::Generate { dir, force, judge }) => match judged(&judge) {
                Ok(judge) => commands::generate(&self.schemas(dir), events, force, self.base(), judge),
                Err(code) => code,
            },
            Command::Schema(SchemaCommand::Check { dir, expect_events, expect_types, judge }) => {
                match judged(&judge) {
                    Ok(judge) => {
                        let options = CheckOptions::new()
                            .expect_events(expect_events)
                            .expect_types(expect_types)
                            .schema_base(self.base())
                            .judge(judge);
                        commands::check(&self.schemas(dir), events, &options)
                    }
                    Err(code) => code,
                }
            }
            Command::Schema(SchemaCommand::Compat { old, new, mode, judge }) => match judged(&judge) {
                Ok(judge) => commands::compat(&old, &new, mode, judge),
                Err(code) => code,
            },
            #[cfg(feature = "schema-registry")]
            Command::Schema(SchemaCommand::Push(args)) => {
                let judge =
                    Judge::new(Semantics::JsonSchema, args.policy.or(self.policy).unwrap_or_default());
                push::push(&self.schemas(args.dir.clone()), &args, judge)
            }
            Command::Typegen(args) => self.typegen(args),
            Command::Asyncapi(args) => self.asyncapi(args, events),
        }
    }

    fn project_root(&self) -> PathBuf {
        if let Some(root) = &self.root {
            return root.clone();
        }
        let start = std::env::var_os("CARGO_MANIFEST_DIR")
            .map(PathBuf::from)
            .or_else(|| std::env::current_dir().ok())
            .unwrap_or_else(|| PathBuf::from("."));
        workspace_root(&start).unwrap_or(start)
    }

    fn schemas(&self, dir: Option<PathBuf>) -> PathBuf {
        dir.unwrap_or_else(|| self.project_root().join("schemas"))
    }

    fn asyncapi(&self, args: AsyncApiArgs, events: &[&EventDescriptor]) -> ExitCode {
        let root = self.project_root();
        let schemas = args.schemas.unwrap_or_else(|| root.join("schemas"));
        let out = args.out.unwrap_or_else(|| root.join("asyncapi.json"));
        // Never from the checkout's directory name: a clone elsewhere would find its
        // committed document stale.
        let title = args
            .title
            .or_else(|| self.asyncapi_title.clone())
            .unwrap_or_else(|| DEFAULT_ASYNCAPI_TITLE.to_owned());
        let info = crate::asyncapi::AsyncApiInfo {
            title,
            version: args.version,
            schema_base: self.base().to_owned(),
        };
        let text = match crate::asyncapi::render(events, &schemas, &info) {
            Ok(text) => text,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
        let committed = std::fs::read_to_string(&out).ok();
        if committed.as_deref() == Some(text.as_str()) {
            println!("{} is up to date", out.display());
            return ExitCode::SUCCESS;
        }
        if args.check {
            eprintln!(
                "error: {} is {}; run `cargo xtask asyncapi` and commit it",
                out.display(),
                if committed.is_some() { "stale" } else { "missing" }
            );
            return ExitCode::from(1);
        }
        match std::fs::write(&out, text) {
            Ok(()) => {
                println!("wrote {}", out.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {}: {e}", out.display());
                ExitCode::from(2)
            }
        }
    }

    fn typegen(&self, args: TypegenArgs) -> ExitCode {
        let root = self.project_root();
        let schemas = args.schemas.unwrap_or_else(|| root.join("schemas"));
        let Some(out) = args.out.or_else(|| self.typegen_out.as_ref().map(|out| root.join(out))) else {
            eprintln!(
                "error: typegen needs --out FILE: the Rust file to write the consumer types to \
                 (or set it once in your xtask: `Xtask::new().typegen_out(\"consumer/src/events.rs\")`)"
            );
            return ExitCode::from(2);
        };
        match write_or_check(&schemas, &out, args.check) {
            Ok(Status::UpToDate) => {
                println!("{} is up to date", out.display());
                ExitCode::SUCCESS
            }
            Ok(Status::Written) => {
                println!("wrote {}", out.display());
                ExitCode::SUCCESS
            }
            Ok(Status::Stale { hint }) => {
                eprintln!("error: {hint}");
                ExitCode::from(1)
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        }
    }
}

/// The nearest directory at or above `start` whose `Cargo.toml` declares `[workspace]`.
fn workspace_root(start: &Path) -> Option<PathBuf> {
    start.ancestors().find_map(|dir| {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
        // `[workspace]`, perhaps with a comment after it; `[workspace.dependencies]` and
        // the like only appear beside it.
        manifest
            .lines()
            .any(|line| {
                line.trim_start()
                    .strip_prefix("[workspace]")
                    .is_some_and(|rest| rest.trim_start().is_empty() || rest.trim_start().starts_with('#'))
            })
            .then(|| dir.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_root_is_the_nearest_manifest_with_a_workspace_table() {
        let dir = tempfile::tempdir().expect("tempdir");
        let member = dir.path().join("xtask");
        std::fs::create_dir_all(member.join("src")).expect("mkdir");
        std::fs::write(dir.path().join("Cargo.toml"), "[workspace]\nmembers = [\"xtask\"]\n").expect("write");
        std::fs::write(member.join("Cargo.toml"), "[package]\nname = \"xtask\"\n").expect("write");
        assert_eq!(workspace_root(&member.join("src")).as_deref(), Some(dir.path()));
        assert_eq!(workspace_root(&member), Some(dir.path().to_owned()));
        // `[workspace.dependencies]` alone does not make a root; a commented table does.
        std::fs::write(member.join("Cargo.toml"), "[workspace.dependencies]\n").expect("write");
        assert_eq!(workspace_root(&member), Some(dir.path().to_owned()));
        std::fs::write(member.join("Cargo.toml"), "  [workspace] # the root\n").expect("write");
        assert_eq!(workspace_root(&member.join("src")), Some(member.clone()));
    }

    #[test]
    fn flags_override_the_project_defaults_and_a_policy_needs_json_schema_semantics() {
        let args = |semantics, policy| JudgeArgs { semantics, policy };
        let plain = Xtask::new();
        assert_eq!(plain.judge(&args(None, None)), Ok(Judge::default()));
        assert!(plain.judge(&args(None, Some(Policy::Lenient))).is_err());
        let registry = Xtask::new().semantics(Semantics::JsonSchema).policy(Policy::Lenient);
        assert_eq!(registry.judge(&args(None, None)), Ok(Judge::new(Semantics::JsonSchema, Policy::Lenient)));
        assert_eq!(
            registry.judge(&args(None, Some(Policy::Strict))),
            Ok(Judge::new(Semantics::JsonSchema, Policy::Strict))
        );
        // A project policy with serde semantics for one command is not an error: it is
        // the flag that would be silently ignored.
        assert_eq!(
            registry.judge(&args(Some(Semantics::Serde), None)).map(|j| j.semantics),
            Ok(Semantics::Serde)
        );
    }
}
