//! Where the outbox lives: validated schema and table names, and the names derived from them.

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::error::{Error, Result};

/// A statement built from validated identifiers only (values are always bound).
pub(crate) fn sql(statement: String) -> SqlStr {
    AssertSqlSafe(statement).into_sql_str()
}

/// Accepts `[a-z_][a-z0-9_]*`, at most 48 bytes, so that derived names (`<table>_leases`,
/// index names) stay within PostgreSQL's 63-byte limit. Names are also always quoted.
pub(crate) fn validate_identifier(what: &'static str, value: &str) -> Result<()> {
    let mut chars = value.chars();
    let ok = matches!(chars.next(), Some('a'..='z' | '_'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        && value.len() <= 48;
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidIdentifier { what, value: value.to_owned() })
    }
}

/// Quoted, schema-qualified names of the outbox's objects.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    pub(crate) schema: String,
    pub(crate) table: String,
    /// `"schema"."table"`
    pub(crate) outbox: String,
    /// `"schema"."table_leases"`
    pub(crate) leases: String,
    /// `"schema"."table_relays"`
    pub(crate) relays: String,
    /// `"schema"."table_cleaned"`: what cleanup and purge deleted, counted.
    pub(crate) cleaned: String,
    /// The NOTIFY channel: `schema.table`.
    pub(crate) channel: String,
}

impl Names {
    pub(crate) fn new(schema: &str, table: &str) -> Result<Self> {
        validate_identifier("schema name", schema)?;
        validate_identifier("table name", table)?;
        Ok(Names {
            schema: schema.to_owned(),
            table: table.to_owned(),
            outbox: format!("\"{schema}\".\"{table}\""),
            leases: format!("\"{schema}\".\"{table}_leases\""),
            relays: format!("\"{schema}\".\"{table}_relays\""),
            cleaned: format!("\"{schema}\".\"{table}_cleaned\""),
            channel: format!("{schema}.{table}"),
        })
    }

    /// `"schema"."<table>_<suffix>"`, for migration bookkeeping and the like.
    pub(crate) fn sibling(&self, suffix: &str) -> String {
        format!("\"{}\".\"{}_{suffix}\"", self.schema, self.table)
    }

    /// An index name: `<table>_<suffix>` (unqualified, as CREATE INDEX wants).
    pub(crate) fn index(&self, suffix: &str) -> String {
        format!("\"{}_{suffix}\"", self.table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked_before_any_sql_is_built() {
        for good in ["outbox", "_o", "billing_outbox_2"] {
            assert!(validate_identifier("table name", good).is_ok(), "{good}");
        }
        for bad in ["", "Outbox", "2outbox", "out-box", "outbox\"; drop table x; --", "a".repeat(49).as_str()]
        {
            let err = validate_identifier("table name", bad).expect_err(bad);
            assert!(err.to_string().starts_with("invalid table name"), "{err}");
        }
        let names = Names::new("ops", "events").expect("valid");
        assert_eq!(names.outbox, "\"ops\".\"events\"");
        assert_eq!(names.leases, "\"ops\".\"events_leases\"");
        assert_eq!(names.channel, "ops.events");
    }
}
