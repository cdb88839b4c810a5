//! Converting an existing dedup table into partitions, online: the table becomes the
//! `_legacy` partition as it is, without a rewrite, a copy or a scan under a lock that
//! stops inserts.
//!
//! 1. A `bucket` column with a constant default (no rewrite): every existing row, and any
//!    inserted until the switch, is in the legacy bucket.
//! 2. The constraints the partition needs, added `NOT VALID` and validated while inserts
//!    go on; the unique index on `(consumer, event_id, bucket)` built concurrently.
//! 3. The switch, one short transaction under a lock timeout: the table is renamed to
//!    `<table>_legacy`, the partitioned table takes its name, and the legacy table is
//!    attached with no scan (its constraints prove it fits).
//!
//! From then on nothing inserts into the legacy partition and every insert checks it for
//! its id: a duplicate of an event applied before the switch is still absorbed. It is
//! cleaned by DELETE like before and dropped whole once no consumer keeps it.

use sqlx::AssertSqlSafe;
use tracing::info;

use super::{bucket_fn, execute, layout, parent_sql, relation, Layout, LEGACY_BUCKET};
use crate::error::Result;
use crate::inbox::InboxAdmin;

impl InboxAdmin {
    /// Makes this inbox's dedup table partitioned by event id time, online (see the
    /// book's "Partitions" chapter): inserts go on during the conversion, but for one short
    /// transaction at its end that waits at most 5 s for its lock (an error then: run it
    /// again). Returns `false` when the table was partitioned already. Every consumer of
    /// the table must run this version of the library before: an older one cannot insert
    /// into the partitioned table (its inserts fail, and are retried, until it is
    /// upgraded). A conversion stopped half-way is taken up again by running it again.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) if a step fails, for example its lock
    /// timeout; [`Error::InboxNotMigrated`](crate::Error::InboxNotMigrated) before
    /// migration 6.
    pub async fn partition_table(&self) -> Result<bool> {
        let names = &self.names;
        if layout(&self.pool, names).await? == Layout::Partitioned {
            return Ok(false);
        }
        // Migration 6's tables and function, and the table itself, are there.
        for table in [relation(names, "_partitioning"), names.inbox.clone()] {
            let found: Option<String> =
                sqlx::query_scalar("SELECT to_regclass($1)::text").bind(&table).fetch_one(&self.pool).await?;
            if found.is_none() {
                return Err(crate::Error::InboxNotMigrated { table });
            }
        }
        let inbox = &names.inbox;
        // A connection of its own, closed at the end: its session settings and lock never
        // reach the pool.
        let mut conn =
            <sqlx::PgConnection as sqlx::Connection>::connect_with(&self.pool.connect_options()).await?;
        let got: bool = sqlx::query_scalar(
            "SELECT pg_try_advisory_lock(hashtextextended('outbox inbox convert ' || $1, 0))",
        )
        .bind(inbox)
        .fetch_one(&mut conn)
        .await?;
        if !got {
            return Err(crate::Error::Conflict(format!("another conversion of {inbox} is running")));
        }
        let converted = self.convert(&mut conn).await;
        let _ = sqlx::Connection::close(conn).await;
        if !converted? {
            // Another conversion finished first.
            return Ok(false);
        }
        // The spans of now and ahead, created while the default partition is still empty.
        let mut report = super::maintain::PartitionReport::default();
        super::maintain::create_ahead(&self.pool, names, &mut report).await?;
        info!(table = %inbox, stage = "partitions", "the dedup table is partitioned; its rows are in the legacy partition");
        Ok(true)
    }

    /// The conversion's steps, on `conn`; each can be run again. `false` when the table
    /// was partitioned already.
    async fn convert(&self, conn: &mut sqlx::PgConnection) -> Result<bool> {
        let names = &self.names;
        if layout(&mut *conn, names).await? == Layout::Partitioned {
            return Ok(false);
        }
        let (schema, table, inbox) = (&names.schema, &names.table, &names.inbox);
        let bucket = bucket_fn(names);
        let constraint = |name: &str| {
            format!(
                "SELECT convalidated FROM pg_constraint WHERE conrelid = '{inbox}'::regclass AND conname = '{table}{name}'"
            )
        };
        // The brief locks wait at most 5 s (inserts would queue behind them), then fail.
        execute(conn, "SET lock_timeout = '5s'".to_owned()).await?;
        execute(
            conn,
            format!(
                "ALTER TABLE {inbox} ADD COLUMN IF NOT EXISTS bucket bigint NOT NULL DEFAULT {LEGACY_BUCKET}"
            ),
        )
        .await?;
        for (name, check) in [
            ("_legacy_bucket", format!("bucket = {LEGACY_BUCKET}")),
            ("_bucket_check", format!("bucket = {LEGACY_BUCKET} OR bucket = {bucket}(event_id)")),
        ] {
            let valid: Option<bool> =
                sqlx::query_scalar(AssertSqlSafe(constraint(name))).fetch_optional(&mut *conn).await?;
            if valid.is_none() {
                execute(
                    conn,
                    format!("ALTER TABLE {inbox} ADD CONSTRAINT \"{table}{name}\" CHECK ({check}) NOT VALID"),
                )
                .await?;
            }
            if valid != Some(true) {
                execute(conn, format!("ALTER TABLE {inbox} VALIDATE CONSTRAINT \"{table}{name}\"")).await?;
            }
        }
        // The concurrent build waits for every older transaction in the database, however
        // long: no lock timeout. An index a stopped build left invalid is built again.
        execute(conn, "SET lock_timeout = 0".to_owned()).await?;
        let key_valid: Option<bool> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('\"{schema}\".\"{table}_legacy_key\"')"
        )))
        .fetch_optional(&mut *conn)
        .await?;
        if key_valid == Some(false) {
            execute(conn, format!("DROP INDEX CONCURRENTLY \"{schema}\".\"{table}_legacy_key\"")).await?;
        }
        if key_valid != Some(true) {
            execute(
                conn,
                format!(
                    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS \"{table}_legacy_key\" \
                     ON {inbox} (consumer, event_id, bucket)"
                ),
            )
            .await?;
        }
        let legacy = relation(names, "_legacy");
        let switch = format!(
            "BEGIN; \
             SET LOCAL lock_timeout = '5s'; \
             LOCK TABLE {inbox} IN ACCESS EXCLUSIVE MODE; \
             ALTER TABLE {inbox} ADD CONSTRAINT \"{table}_legacy_key\" UNIQUE USING INDEX \"{table}_legacy_key\"; \
             ALTER TABLE {inbox} RENAME CONSTRAINT \"{table}_pkey\" TO \"{table}_legacy_pkey\"; \
             ALTER TABLE {inbox} RENAME TO \"{table}_legacy\"; \
             ALTER INDEX \"{schema}\".\"{table}_applied_at\" RENAME TO \"{table}_legacy_at\"; \
             {parent}; \
             {access}; \
             ALTER TABLE {inbox} ATTACH PARTITION {legacy} FOR VALUES FROM (MINVALUE) TO ({LEGACY_BUCKET} + 1); \
             COMMIT;",
            parent = parent_sql(names, false),
            access = crate::table::access_sql(&legacy, inbox),
        );
        if let Err(error) = execute(conn, switch).await {
            let _ = execute(conn, "ROLLBACK".to_owned()).await;
            return Err(error);
        }
        Ok(true)
    }
}
