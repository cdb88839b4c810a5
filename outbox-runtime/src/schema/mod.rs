//! JSON Schemas of events: generation, the committed-schema check, and compatibility.
//!
//! Users commit `schemas/<event_type>/v<schema_version>.json` for every registered event
//! ([`generate`]) and fail CI when the code no longer matches them in an incompatible way
//! ([`check`]). [`compare`] judges two schemas as writer and reader (see [`compat`]).
//! `outbox_runtime::xtask` (feature `xtask`) is the command line over these functions, for
//! this repository's `cargo xtask schema ...` and for yours.

mod check;
pub mod compat;
mod dialect;
mod document;
mod keywords;
mod problem;
mod repo;
mod uri;

#[cfg(feature = "schema-registry")]
pub(crate) use check::committed_versions;
pub use check::{check, check_with, CheckOptions};
pub use compat::{
    compare, compare_transitive, compare_transitive_with, compare_with, Direction, Incompatibility, Judge,
    Level, Mode, Policy, Report, Rule, Semantics,
};
pub use dialect::Dialect;
pub use document::{InputError, SchemaDoc};
pub use problem::{CheckReport, Problem};
#[cfg(feature = "xtask")]
pub(crate) use repo::generate_judged;
pub(crate) use repo::sorted as sorted_value;
pub use repo::{
    document, document_with, generate, generate_with, render, render_with, schema_path, schema_uri,
    FileStatus, GenerateError, DEFAULT_SCHEMA_BASE,
};

#[cfg(test)]
mod dialect_tests;
#[cfg(test)]
mod serde_enum_tests;
#[cfg(test)]
mod serde_tests;
