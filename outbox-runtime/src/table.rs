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

/// The relation an `undefined_table` error (SQLSTATE 42P01) names, as PostgreSQL spells it
/// in `relation "schema.table" does not exist` (or `"table"` when unqualified).
pub(crate) fn undefined_relation(error: &Error) -> Option<&str> {
    let Error::Database(e) = error else { return None };
    let db = e.as_database_error()?;
    if db.code().as_deref() != Some("42P01") {
        return None;
    }
    db.message().split('"').nth(1)
}

/// The quoted `"schema"."<table><suffix>"` of the first suffix whose table `error` says
/// does not exist, if it is one of these (and not, say, a table a user's trigger reads).
pub(crate) fn missing_table(error: &Error, schema: &str, table: &str, suffixes: &[&str]) -> Option<String> {
    let relation = undefined_relation(error)?;
    suffixes.iter().find_map(|suffix| {
        let name = format!("{table}{suffix}");
        (relation == format!("{schema}.{name}") || relation == name)
            .then(|| format!("\"{schema}\".\"{name}\""))
    })
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
    /// `"schema"."table_audit"`: operators' actions by filter.
    pub(crate) audit: String,
    /// `"schema"."table_topics"`: topics the relays found missing, and since when.
    pub(crate) topics: String,
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
            audit: format!("\"{schema}\".\"{table}_audit\""),
            topics: format!("\"{schema}\".\"{table}_topics\""),
            channel: format!("{schema}.{table}"),
        })
    }

    /// `"schema"."<table>_<suffix>"`, for migration bookkeeping and the like.
    pub(crate) fn sibling(&self, suffix: &str) -> String {
        format!("\"{}\".\"{}_{suffix}\"", self.schema, self.table)
    }

    /// The outbox's error for a missing table of its own: [`Error::NotMigrated`] naming it;
    /// any other error as it is.
    pub(crate) fn not_migrated(&self, error: Error) -> Error {
        match missing_table(
            &error,
            &self.schema,
            &self.table,
            &["", "_leases", "_relays", "_cleaned", "_audit", "_topics"],
        ) {
            Some(table) => Error::NotMigrated { table },
            None => error,
        }
    }

    /// An index name: `<table>_<suffix>` (unqualified, as CREATE INDEX wants).
    pub(crate) fn index(&self, suffix: &str) -> String {
        format!("\"{}_{suffix}\"", self.table)
    }
}

/// Gives `to` the owner and the privileges of `from` (both quoted relation names): the
/// roles that wrote the table before it was replaced (made partitioned) still can.
pub(crate) fn access_sql(from: &str, to: &str) -> String {
    format!(
        "DO $access$ DECLARE g record; BEGIN \
           EXECUTE format('ALTER TABLE %s OWNER TO %I', '{to}', \
             (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = '{from}'::regclass)); \
           FOR g IN SELECT a.privilege_type, a.grantee, a.is_grantable \
                    FROM pg_class c, aclexplode(c.relacl) a \
                    WHERE c.oid = '{from}'::regclass AND a.grantee <> c.relowner LOOP \
             EXECUTE format('GRANT %s ON %s TO %s%s', g.privilege_type, '{to}', \
               CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(g.grantee)) END, \
               CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END); \
           END LOOP; \
         END $access$"
    )
}

/// Whether `schema.table` is a partitioned table, from the catalog (`false` when it is a
/// plain one or does not exist): the outbox's and the inbox's dedup table's layout.
pub(crate) async fn is_partitioned(db: impl sqlx::PgExecutor<'_>, schema: &str, table: &str) -> Result<bool> {
    let relkind: Option<String> = sqlx::query_scalar(
        "SELECT c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = $2",
    )
    .bind(schema)
    .bind(table)
    .fetch_optional(db)
    .await?;
    Ok(relkind.as_deref() == Some("p"))
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
