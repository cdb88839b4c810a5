//! An adversarial run of the inbox: a seeded generator of records nobody planned for
//! (random bytes in keys, values, header names and values; valid and broken CloudEvents;
//! empty, null and huge values; NUL inside JSON strings; duplicate and colliding ids; stale
//! versions; handlers that fail transiently, for good, or panic), interleaved with valid
//! events over several partitions, consumed by the inbox against real PostgreSQL.
//!
//! The generator also says what the inbox must do with each record (it models the holds per
//! topic and key, dedup by event id and version tracking per aggregate), and the verdict
//! compares that with what the inbox recorded: every record exactly one outcome, every
//! valid event applied once, committed offsets at the end of every partition, `run()`
//! returning after cancel. `tests/tests/inbox_fuzz.rs` runs it bounded; `cargo xtask fuzz
//! inbox --records N --seed S` runs it long.
//!
//! In parts: `generator` (the records and the model), `run` (producing and consuming them)
//! and `verdict` (the checks).

use outbox_runtime::inbox::InboxStats;
use serde::{Deserialize, Serialize};

use crate::raw::RawRecord;

mod generator;
mod run;
mod verdict;

pub use run::run;
pub use verdict::{Verdict, VERDICT_PREFIX};

const CREDIT: &str = "fuzz.credit";
const AUDIT: &str = "fuzz.audit";
const MAX_ATTEMPTS: u32 = 3;

/// The event the valid records carry. `mode` tells the handler how to behave.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Credit {
    account: String,
    amount: i64,
    #[serde(default)]
    mode: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    filler: String,
}

/// What the inbox must do with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Expected {
    /// Its effect applied once.
    Applied,
    /// Absorbed: its event id was recorded before.
    Duplicate,
    /// Absorbed: its aggregate version is not newer.
    Stale,
    /// Parked with a reason.
    Parked,
    /// Held behind a parked record of its key.
    Held,
    /// Of a type the consumer ignores.
    Ignored,
}

/// One generated record and what must become of it.
#[derive(Debug, Clone)]
struct Planned {
    record: RawRecord,
    offset: i64,
    expected: Expected,
    /// For reports: which kind of record the generator made.
    kind: &'static str,
}

/// Outcomes the inbox counted, of every kind.
fn total(s: &InboxStats) -> u64 {
    s.applied() + s.duplicates() + s.stale() + s.parked() + s.held() + s.ignored()
}
