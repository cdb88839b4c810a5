//! The append statements, prepared once per outbox (as `relay/claim.rs` prepares the
//! relay's): the INSERT (and NOTIFY) of one event with scalar parameters, and of a batch
//! from one array per column; each one statement, one round trip, taking the aggregates'
//! advisory locks first.

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::table::Names;

/// The two insert statements of one outbox table.
#[derive(Debug)]
pub(crate) struct InsertStatements {
    /// One event: scalar parameters, no arrays to build and unnest.
    pub(crate) one: SqlStr,
    /// A batch: one array per column.
    pub(crate) batch: SqlStr,
    /// The check of caller-given event ids against the whole table (migration 11).
    pub(crate) check_ids: SqlStr,
}

impl InsertStatements {
    pub(crate) fn new(names: &Names, notify: bool, lock_aggregates: bool) -> Self {
        InsertStatements {
            one: AssertSqlSafe(insert_one_sql(names, notify, lock_aggregates)).into_sql_str(),
            batch: AssertSqlSafe(insert_sql(names, notify, lock_aggregates)).into_sql_str(),
            check_ids: AssertSqlSafe(format!(
                "SELECT \"{}\".\"{}_check_event_ids\"($1::uuid[])",
                names.schema, names.table
            ))
            .into_sql_str(),
        }
    }
}

/// The advisory lock key of an aggregate, as SQL over the aggregate type and id
/// expressions: one expression for both statements, so that single and batch appends to
/// one aggregate take the same lock.
fn lock_key(names: &Names, aggregate_type: &str, aggregate_id: &str) -> String {
    format!(
        "hashtextextended('outbox:' || '{table}:' || {aggregate_type} || ':' || {aggregate_id}, 0)",
        table = names.outbox.replace('\'', "")
    )
}

/// The shape both inserts share: the locks' CTE, the insert of `rows` (a `SELECT` of the
/// nine event columns), the row count and the NOTIFY, in one statement.
fn insert_statement(names: &Names, notify: bool, lock: &str, rows: &str) -> String {
    let notify = if notify { "pg_notify($10, '')" } else { "NULL" };
    format!(
        "WITH {lock}inserted AS ( \
           INSERT INTO {outbox} (event_id, aggregate_type, aggregate_id, aggregate_version, \
                                 event_type, schema_version, topic, payload, headers) \
           {rows} \
           RETURNING 1) \
         SELECT (SELECT count(*) FROM inserted), {notify}",
        outbox = names.outbox
    )
}

/// One event's insert, with scalar parameters: the aggregate's lock first (the `locked`
/// row feeds the insert), then the row.
fn insert_one_sql(names: &Names, notify: bool, lock_aggregates: bool) -> String {
    let (lock, from) = if lock_aggregates {
        let key = lock_key(names, "$2::text", "$3::text");
        (format!("locked AS (SELECT pg_advisory_xact_lock({key}) AS l), "), " FROM locked")
    } else {
        (String::new(), "")
    };
    let rows = format!(
        "SELECT $1::uuid, $2::text, $3::text, $4::bigint, $5::text, $6::int, $7::text, $8::text::json, \
                $9::text::jsonb{from}"
    );
    insert_statement(names, notify, &lock, &rows)
}

/// A batch's insert, from one array per column.
fn insert_sql(names: &Names, notify: bool, lock_aggregates: bool) -> String {
    // The aggregates' locks, in one order (sorted keys), before any row is inserted: the
    // scalar subquery in the INSERT's WHERE is evaluated first, once.
    let (lock, after_lock) = if lock_aggregates {
        (
            format!(
                "locked AS ( \
                   SELECT count(pg_advisory_xact_lock(k)) AS n FROM ( \
                     SELECT DISTINCT {key} AS k \
                     FROM unnest($2::text[], $3::text[]) AS a(at, ai) ORDER BY 1) keys), ",
                key = lock_key(names, "a.at", "a.ai")
            ),
            "WHERE (SELECT n FROM locked) >= 0",
        )
    } else {
        (String::new(), "")
    };
    let rows = format!(
        "SELECT e, at, ai, av, et, sv, t, p::json, h::jsonb \
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::int[], \
                     $7::text[], $8::text[], $9::text[]) AS u(e, at, ai, av, et, sv, t, p, h) \
         {after_lock}"
    );
    insert_statement(names, notify, &lock, &rows)
}
