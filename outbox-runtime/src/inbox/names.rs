//! The inbox's table names, and the text it stores as a reason.

use crate::error::{Error, Result};
use crate::table::validate_identifier;

/// Quoted names of the inbox's tables.
#[derive(Debug, Clone)]
pub(crate) struct InboxNames {
    pub(crate) schema: String,
    pub(crate) table: String,
    pub(crate) inbox: String,
    pub(crate) parked: String,
    pub(crate) aggregates: String,
    /// Operators' actions by filter.
    pub(crate) audit: String,
    /// Per consumer, topic and Kafka partition: deliveries absorbed as duplicates.
    pub(crate) progress: String,
}

impl InboxNames {
    pub(crate) fn new(schema: &str, table: &str) -> Result<Self> {
        validate_identifier("schema name", schema)?;
        validate_identifier("table name", table)?;
        let q = |suffix: &str| format!("\"{schema}\".\"{table}{suffix}\"");
        Ok(InboxNames {
            schema: schema.to_owned(),
            table: table.to_owned(),
            inbox: q(""),
            parked: q("_parked"),
            aggregates: q("_aggregates"),
            audit: q("_audit"),
            progress: q("_progress"),
        })
    }

    /// The inbox's error for a missing table of its own: [`Error::InboxNotMigrated`]
    /// naming it; any other error as it is.
    pub(crate) fn not_migrated(&self, error: Error) -> Error {
        let suffixes = ["", "_parked", "_aggregates", "_audit", "_consumers", "_partitioning", "_progress"];
        match crate::table::missing_table(&error, &self.schema, &self.table, &suffixes) {
            Some(table) => Error::InboxNotMigrated { table },
            None => error,
        }
    }
}

/// The longest reason stored, in bytes.
const MAX_REASON_BYTES: usize = 4096;

/// `reason` as storable text: NUL replaced, at most [`MAX_REASON_BYTES`].
pub(crate) fn storable_reason(reason: &str) -> String {
    let mut s = reason.replace('\0', "\u{fffd}");
    if s.len() > MAX_REASON_BYTES {
        let mut end = MAX_REASON_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}
