//! The dedup table in partitions, so that expired event ids leave by dropping a whole
//! partition instead of deleting rows ([invariant 16](crate::guarantees#i16)).
//!
//! The table is range-partitioned on `bucket`, a function of the event id alone
//! (`<table>_bucket(event_id)`, checked by a constraint): the millisecond timestamp a
//! UUIDv7 starts with, `-1` for any other id. The unique key is
//! `(consumer, event_id, bucket)`; since the bucket follows from the id, it is unique on
//! `(consumer, event_id)` across every partition, for as long as the row is kept. A
//! redelivered event always lands in the partition its first delivery did.
//!
//! - `<table>_pYYMMDD_HHMMSS`: one per span of time (a day by default,
//!   `<table>_partitioning`), created ahead by every consumer's maintenance round, and
//!   dropped whole once each consumer with rows in it is past its dedup retention for
//!   every one of them (`<table>_consumers` holds each consumer's retention).
//! - `<table>_foreign`: ids that are not UUIDv7 (other producers), cleaned by DELETE.
//! - `<table>_default`: v7 ids of a span with no partition (an old event replayed after its
//!   span was dropped, a clock far ahead), cleaned by DELETE; rows of a span whose
//!   partition is created later are moved into it.
//! - `<table>_legacy`: always there, checked by every insert (bucket -2): the table as it
//!   was before [`InboxAdmin::partition_table`] made it a partition, until it is dropped
//!   like the others and made again empty; empty on a new install, so that the check reads
//!   an index of its own, never the default partition.

use std::time::Duration;

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgPool};

use super::names::InboxNames;
use crate::error::Result;

mod convert;
pub(crate) mod maintain;

pub use self::maintain::{KeptPartition, PartitionReport};

/// The bucket of the rows that were in the table before it was partitioned.
pub(crate) const LEGACY_BUCKET: i64 = -2;

/// How the dedup table is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Layout {
    /// One table, cleaned by DELETE.
    Plain,
    /// Partitions by event id time, dropped whole past retention.
    Partitioned,
}

/// The dedup table's layout, from the catalog.
pub(crate) async fn layout(db: impl sqlx::PgExecutor<'_>, names: &InboxNames) -> Result<Layout> {
    let partitioned = crate::table::is_partitioned(db, &names.schema, &names.table).await?;
    Ok(if partitioned { Layout::Partitioned } else { Layout::Plain })
}

/// Whether an insert's error says the dedup table changed under it, so that the same
/// insert passes when tried again: no `bucket` given to a table partitioned since (the
/// store then inserts with it, [`Store::saw`](super::store::Store::saw)), or a row routed
/// to the default partition while a partition for its span was being attached. Retried,
/// never parked.
pub(crate) fn layout_changed(error: &sqlx::Error) -> bool {
    let Some(pg) =
        error.as_database_error().and_then(|d| d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>())
    else {
        return false;
    };
    match pg.code() {
        "23502" => pg.column() == Some("bucket"),
        // A partition constraint names no constraint; a check constraint would.
        "23514" => pg.table().is_some_and(|t| t.ends_with("_default")) && pg.constraint().is_none(),
        _ => false,
    }
}

/// `"schema"."<table><suffix>"`.
pub(crate) fn relation(names: &InboxNames, suffix: &str) -> String {
    format!("\"{}\".\"{}{suffix}\"", names.schema, names.table)
}

/// The bucket function's qualified name.
pub(crate) fn bucket_fn(names: &InboxNames) -> String {
    relation(names, "_bucket")
}

/// What an insert into the dedup table adds for `layout`: a column list tail, the value
/// tail for the event id expression `event_id`, and a condition (true when plain) that
/// leaves out ids the legacy partition holds (nothing inserts there, so a probe at insert
/// is enough).
pub(crate) fn dedup_insert(
    names: &InboxNames,
    layout: Layout,
    consumer: &str,
    event_id: &str,
) -> [String; 3] {
    match layout {
        Layout::Plain => [String::new(), String::new(), "true".to_owned()],
        Layout::Partitioned => [
            ", bucket".to_owned(),
            format!(", {}({event_id})", bucket_fn(names)),
            format!(
                "NOT EXISTS (SELECT 1 FROM {inbox} l WHERE l.bucket = {LEGACY_BUCKET} AND l.consumer = {consumer} \
                 AND l.event_id = {event_id})",
                inbox = names.inbox
            ),
        ],
    }
}

/// A condition on the dedup table's rows of `event_id` that leaves the planner one
/// partition to read (nothing for the plain layout).
pub(crate) fn dedup_match(names: &InboxNames, layout: Layout, event_id: &str) -> String {
    match layout {
        Layout::Plain => String::new(),
        Layout::Partitioned => format!(" AND bucket = {}({event_id})", bucket_fn(names)),
    }
}

/// Migration 6: the bucket function, each consumer's retention, the partitions' span; and
/// an empty dedup table (a new install) made partitioned at once.
pub(crate) fn migration_sql(names: &InboxNames) -> String {
    let InboxNames { schema, table, inbox, .. } = names;
    let bucket = bucket_fn(names);
    let replaced = relation(names, "_replaced");
    let access = crate::table::access_sql(&replaced, inbox);
    let consumers = relation(names, "_consumers");
    let partitioning = relation(names, "_partitioning");
    let parent = parent_sql(names, true);
    format!(
        r#"
-- The partition key of an event id: the Unix time in milliseconds a UUIDv7 starts with
-- (RFC 9562: version 7, variant 10), -1 for any other id.
CREATE FUNCTION {bucket}(event_id uuid) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
    AS $$ SELECT CASE WHEN substr(event_id::text, 15, 1) = '7' AND substr(event_id::text, 20, 1) IN ('8', '9', 'a', 'b')
                      THEN ('x' || substr(replace(event_id::text, '-', ''), 1, 12))::bit(48)::bigint
                      ELSE -1 END $$;
-- Each consumer's dedup retention (NULL: for ever), written by its maintenance rounds: a
-- partition goes only once every consumer with rows in it is past its own retention.
CREATE TABLE {consumers} (
    consumer        text PRIMARY KEY,
    dedup_retention interval,
    seen_at         timestamptz NOT NULL DEFAULT now()
);
-- How much time one partition spans, and how many spans are created ahead.
CREATE TABLE {partitioning} (
    only_row     boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    span_seconds bigint NOT NULL DEFAULT 86400 CHECK (span_seconds > 0),
    ahead        integer NOT NULL DEFAULT 3 CHECK (ahead BETWEEN 1 AND 1000)
);
INSERT INTO {partitioning} DEFAULT VALUES;
-- A new install (an empty table) starts partitioned; an existing one stays as it is until
-- an operator converts it (`outbox inbox partition`), online.
-- The new table keeps the old one's owner and privileges.
DO $convert$ BEGIN
    LOCK TABLE {inbox} IN ACCESS EXCLUSIVE MODE;
    IF NOT EXISTS (SELECT 1 FROM {inbox}) THEN
        ALTER TABLE {inbox} RENAME TO "{table}_replaced";
        ALTER INDEX "{schema}"."{table}_applied_at" RENAME TO "{table}_replaced_at";
        {parent}
        {access};
        DROP TABLE {replaced};
    END IF;
END $convert$;
"#
    )
}

/// The partitioned dedup table, its index, and its foreign and default partitions; with
/// `legacy`, an empty legacy partition too (a conversion attaches the old table there).
/// There always is one, so that the inserts' probe of the legacy bucket reads an index of
/// it, never the default partition.
pub(crate) fn parent_sql(names: &InboxNames, legacy: bool) -> String {
    let InboxNames { table, inbox, .. } = names;
    let bucket = bucket_fn(names);
    let foreign = relation(names, "_foreign");
    let default = relation(names, "_default");
    format!(
        r#"CREATE TABLE {inbox} (
            consumer          text NOT NULL,
            event_id          uuid NOT NULL,
            event_type        text NOT NULL,
            schema_version    integer NOT NULL,
            aggregate_type    text,
            aggregate_id      text,
            aggregate_version bigint,
            topic             text NOT NULL,
            kafka_partition   integer NOT NULL,
            kafka_offset      bigint NOT NULL,
            outcome           text NOT NULL DEFAULT 'applied'
                              CONSTRAINT "{table}_outcome_check" CHECK (outcome IN ('applied', 'stale', 'discarded')),
            applied_at        timestamptz NOT NULL DEFAULT now(),
            ce_id             text,
            ce_source         text,
            bucket            bigint NOT NULL
                              CONSTRAINT "{table}_bucket_check" CHECK (bucket = {LEGACY_BUCKET} OR bucket = {bucket}(event_id)),
            CONSTRAINT "{table}_key" UNIQUE (consumer, event_id, bucket)
        ) PARTITION BY RANGE (bucket);
        CREATE INDEX "{table}_applied_at" ON {inbox} (consumer, applied_at);
        CREATE TABLE {foreign} PARTITION OF {inbox} FOR VALUES FROM (-1) TO (0);
        CREATE TABLE {default} PARTITION OF {inbox} DEFAULT;{legacy}"#,
        legacy = if legacy { legacy_sql(names) } else { String::new() },
    )
}

/// An empty legacy partition.
pub(crate) fn legacy_sql(names: &InboxNames) -> String {
    format!(
        "\n        CREATE TABLE {} PARTITION OF {} FOR VALUES FROM (MINVALUE) TO ({LEGACY_BUCKET} + 1);",
        relation(names, "_legacy"),
        names.inbox
    )
}

/// The partitions cleaned by DELETE rather than dropped: those that exist of legacy,
/// foreign and default.
pub(crate) async fn deleted_from(pool: &PgPool, names: &InboxNames) -> Result<Vec<String>> {
    let found: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = ANY($2) ORDER BY 1",
    )
    .bind(&names.schema)
    .bind(["_legacy", "_foreign", "_default"].map(|s| format!("{}{s}", names.table)))
    .fetch_all(pool)
    .await?;
    Ok(found.into_iter().map(|name| format!("\"{}\".\"{name}\"", names.schema)).collect())
}

/// A duration as a PostgreSQL interval literal's milliseconds.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Runs `sql` without checking it, for DDL built from validated names.
pub(crate) async fn execute(conn: &mut sqlx::PgConnection, sql: String) -> Result<()> {
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(conn).await?;
    Ok(())
}
