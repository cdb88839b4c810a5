//! JSON Schemas of events: generation, the committed-schema check, and compatibility.
//!
//! Users commit `schemas/<event_type>/v<schema_version>.json` for every registered event
//! ([`generate`]) and fail CI when the code no longer matches them in an incompatible way
//! ([`check`]). [`compare`] judges two schemas as writer and reader (see [`compat`]).
//! `outbox_runtime::xtask` (feature `xtask`) is the command line over these functions, for
//! this repository's `cargo xtask schema ...` and for yours.

pub mod compat;
mod document;
mod keywords;
mod repo;

pub use compat::{compare, compare_transitive, Direction, Incompatibility, Mode, Report, Rule};
pub use document::{InputError, SchemaDoc};
pub use repo::{
    check, check_with, document, generate, render, schema_path, CheckOptions, CheckReport, FileStatus,
    GenerateError, Problem,
};

#[cfg(test)]
mod serde_tests;
