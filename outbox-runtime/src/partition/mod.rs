//! The outbox table in partitions by id range, so that published events leave by dropping
//! a whole partition instead of deleting rows ([invariant 10](crate::guarantees#i10)).
//!
//! The table is range-partitioned on `id`, its primary key, which stays unique across the
//! table as before: every statement that finds rows by id (marks, operators' actions)
//! reads one partition. Partition `k` holds ids `[k << 40, (k + 1) << 40)`:
//!
//! - `<table>_pNNNNNN`: the current partition and the ones created ahead. A maintenance
//!   round moves appends on to the next one once the current one's first row is older
//!   than the span (a day by default, `<table>_partitioning`) by setting the id sequence
//!   to its first id: ids only grow, so the order of appends is kept.
//! - `<table>_legacy`: the table as it was before [`Ops::partition_table`](crate::ops::Ops::partition_table) made it a
//!   partition, ids below the first partition's; cleaned by DELETE like a plain table.
//! - `<table>_default`: ids past every partition (the sequence outran maintenance, which
//!   would take 2^40 appends); cleaned by DELETE.
//!
//! A partition is dropped, its rows counted into `<table>_cleaned` first, once every row
//! in it is done (published or discarded), its newest row was appended more than the
//! cleanup's retention ago and none was published within it. One that still holds a pending or failed row is kept, and
//! said so (a log line and the `outbox_partitions_overdue` gauge).
//!
//! Event ids are unique within a partition (a unique index on each); an append that gives
//! its own event id ([`AppendOptions::event_id`](crate::AppendOptions::event_id)) is
//! checked against the whole table under a lock of that id, so a duplicate is refused for
//! as long as the first event is kept, whichever partition holds it.

use sqlx::{AssertSqlSafe, PgConnection};

use crate::error::Result;
use crate::table::Names;

pub(crate) mod convert;
pub(crate) mod maintain;

pub use self::maintain::{KeptPartition, PartitionReport};

/// Ids per partition, as a shift: partition `k` holds `[k << 40, (k + 1) << 40)`.
pub(crate) const SPAN_BITS: u32 = 40;

/// The partitions' maintenance lock of the outbox named `$1`, waited for: the deletions
/// of cleanup and purge take it per batch, so that a partition's rows are never counted into
/// the cleaned tally twice (once deleted, once dropped). Rounds try it
/// ([`maintain`]'s `locked`), never wait.
pub(crate) const MAINTENANCE_LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended('outbox partitions ' || $1, 0))";

/// Whether the outbox table is partitioned, from the catalog.
pub(crate) async fn is_partitioned(db: impl sqlx::PgExecutor<'_>, names: &Names) -> Result<bool> {
    crate::table::is_partitioned(db, &names.schema, &names.table).await
}

/// `"schema"."<table><suffix>"`.
pub(crate) fn relation(names: &Names, suffix: &str) -> String {
    format!("\"{}\".\"{}{suffix}\"", names.schema, names.table)
}

/// The unqualified name of partition `k`.
pub(crate) fn partition_name(names: &Names, k: i64) -> String {
    format!("{}_p{k:06}", names.table)
}

/// The function an append with caller-given event ids calls first (migration 11): the
/// ids' locks, then a look at the whole table, so that a duplicate in another partition
/// is refused like one in the same (SQLSTATE 23505). Under REPEATABLE READ or SERIALIZABLE,
/// an id whose lock was held by another transaction is a serialization failure (40001):
/// that transaction's row may be invisible to this snapshot.
pub(crate) fn check_event_ids_sql(names: &Names) -> String {
    let outbox = &names.outbox;
    let function = relation(names, "_check_event_ids");
    let constraint = format!("{}_event_id_key", names.table);
    format!(
        r#"
-- Called by an append that gives its own event ids, before its insert: refuses one that the
-- table holds already, in whichever partition, as the unique index of a plain table does.
-- As the table's owner: a role that may only insert into the outbox can call it.
CREATE FUNCTION {function}(ids uuid[]) RETURNS void LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $check$
DECLARE
    id uuid;
    dup uuid;
BEGIN
    FOR id IN SELECT DISTINCT u FROM unnest(ids) AS u ORDER BY 1 LOOP
        IF NOT pg_try_advisory_xact_lock(hashtextextended('outbox event id ' || '{key}:' || id::text, 0)) THEN
            PERFORM pg_advisory_xact_lock(hashtextextended('outbox event id ' || '{key}:' || id::text, 0));
            IF current_setting('transaction_isolation') <> 'read committed' THEN
                RAISE EXCEPTION 'could not serialize access due to a concurrent append of event id %', id
                    USING ERRCODE = 'serialization_failure';
            END IF;
        END IF;
    END LOOP;
    SELECT o.event_id INTO dup FROM {outbox} o WHERE o.event_id = ANY(ids) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "{constraint}"'
            USING ERRCODE = 'unique_violation', DETAIL = format('Key (event_id)=(%s) already exists.', dup),
                  CONSTRAINT = '{constraint}', TABLE = '{table}', SCHEMA = '{schema}';
    END IF;
END $check$;
-- How long the current partition takes appends, and how many partitions wait ahead (for a
-- partitioned outbox, see `outbox partition`).
CREATE TABLE {partitioning} (
    only_row     boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    span_seconds bigint NOT NULL DEFAULT 86400 CHECK (span_seconds > 0),
    ahead        integer NOT NULL DEFAULT 2 CHECK (ahead BETWEEN 1 AND 100)
);
INSERT INTO {partitioning} DEFAULT VALUES;
"#,
        key = names.outbox.replace('\'', ""),
        table = names.table,
        schema = names.schema,
        partitioning = relation(names, "_partitioning"),
    )
}

/// Runs `sql` (several statements) on `conn`.
pub(crate) async fn execute(conn: &mut PgConnection, sql: String) -> Result<()> {
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(conn).await?;
    Ok(())
}
