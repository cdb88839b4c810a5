//! JSON Schemas of events: generation, the committed-schema check, and compatibility.
//!
//! Users commit `schemas/<event_type>/v<schema_version>.json` for every registered event
//! ([`generate`]) and fail CI when the code no longer matches them in an incompatible way
//! ([`check`]). [`compare`] judges two schemas as writer and reader (see [`compat`]).
//! `cargo xtask schema ...` in this repository is a thin command line over these functions;
//! a user's own xtask can call them the same way.

pub mod compat;
mod document;
mod repo;

pub use compat::{compare, compare_transitive, Direction, Incompatibility, Mode, Report, Rule};
pub use document::{InputError, SchemaDoc};
pub use repo::{
    check, document, generate, render, schema_path, CheckReport, FileStatus, GenerateError, Problem,
};
