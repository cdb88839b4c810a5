//! Converting an existing outbox table into partitions, online: the table becomes the
//! `_legacy` partition as it is, without a rewrite, a copy or a scan under a lock that
//! stops appends.
//!
//! 1. A check constraint `id < X`, where `X` is the first id of a partition two spans past
//!    the sequence (2^40 ids of margin: appends go on meanwhile), added `NOT VALID` and
//!    validated while appends go on.
//! 2. The switch, one short transaction under a lock timeout: the table and its indexes
//!    are renamed (`<table>_legacy`), the partitioned table takes its name with the same
//!    columns, identity (restarting at `X`), constraints, indexes, owner and privileges,
//!    and the legacy table is attached as `[MINVALUE, X)` with no scan (its constraint
//!    proves it fits, and its indexes are taken as the partitioned ones'). The first
//!    partitions and the default one are created empty.

use sqlx::{Connection as _, PgConnection};
use tracing::{info, warn};

use super::{execute, is_partitioned, partition_name, relation, SPAN_BITS};
use crate::error::{Error, Result};
use crate::table::Names;

/// [`Ops::partition_table`](crate::ops::Ops::partition_table).
pub(crate) async fn partition_table(pool: &sqlx::PgPool, names: &Names) -> Result<bool> {
    if is_partitioned(pool, names).await? {
        return Ok(false);
    }
    for (table, migration) in [(relation(names, "_partitioning"), 11), (relation(names, "_failed"), 12)] {
        let found: Option<String> =
            sqlx::query_scalar("SELECT to_regclass($1)::text").bind(&table).fetch_one(pool).await?;
        if found.is_none() {
            return Err(Error::MigrationsBehind {
                table: names.outbox.clone(),
                missing: format!("no {table}, of migration {migration}"),
            });
        }
    }
    let publications: Vec<String> = sqlx::query_scalar(
        "SELECT pubname::text FROM pg_publication_tables WHERE schemaname = $1 AND tablename = $2 ORDER BY 1",
    )
    .bind(&names.schema)
    .bind(&names.table)
    .fetch_all(pool)
    .await?;
    if !publications.is_empty() {
        return Err(Error::Config(format!(
            "{} is in publication {}, which would not carry the inserts into the new partitions: stop the \
             change-data-capture relay, drop its slot and publication (`outbox cdc drop`), convert, then set them \
             up again (`outbox cdc setup` hands the events appended meanwhile to the table path)",
            names.outbox,
            publications.join(", ")
        )));
    }
    // An index a failed concurrent build left invalid would be built again, under the
    // switch's lock, when the legacy table is attached: rebuilt first, it is taken as it is.
    let invalid: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE i.indrelid = $1::regclass AND NOT i.indisvalid ORDER BY 1",
    )
    .bind(&names.outbox)
    .fetch_all(pool)
    .await?;
    if !invalid.is_empty() {
        return Err(Error::Config(format!(
            "index {} of {} is invalid (a concurrent build failed): rebuild it with REINDEX INDEX CONCURRENTLY \
             (`outbox migrate` names the statement) before partitioning",
            invalid.join(", "),
            names.outbox
        )));
    }
    // A connection of its own, closed at the end: its session settings and lock never
    // reach the pool.
    let mut conn = PgConnection::connect_with(&pool.connect_options()).await?;
    let got: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended('outbox convert ' || $1, 0))")
            .bind(&names.outbox)
            .fetch_one(&mut conn)
            .await?;
    if !got {
        return Err(Error::Conflict(format!("{} is being partitioned by another session", names.outbox)));
    }
    let result = convert(&mut conn, names).await;
    let _ = conn.close().await;
    result.map(|()| true)
}

/// The highest id the table's sequence gave out, 0 if none.
async fn last_id(conn: &mut PgConnection, outbox: &str) -> Result<i64> {
    let last: Option<i64> =
        sqlx::query_scalar("SELECT pg_sequence_last_value(pg_get_serial_sequence($1, 'id')::regclass)")
            .bind(outbox)
            .fetch_one(conn)
            .await?;
    Ok(last.unwrap_or(0))
}

async fn convert(conn: &mut PgConnection, names: &Names) -> Result<()> {
    let (outbox, table, schema) = (&names.outbox, &names.table, &names.schema);
    let legacy = relation(names, "_legacy");
    let range = format!("\"{table}_legacy_range\"");
    let first = (last_id(conn, outbox).await? >> SPAN_BITS) + 2;
    let bound = first << SPAN_BITS;
    // 1. The range constraint, checked while appends go on.
    execute(
        conn,
        format!(
            "SET lock_timeout = '5s'; \
             ALTER TABLE {outbox} DROP CONSTRAINT IF EXISTS {range}; \
             ALTER TABLE {outbox} ADD CONSTRAINT {range} CHECK (id < {bound}) NOT VALID; \
             ALTER TABLE {outbox} VALIDATE CONSTRAINT {range}"
        ),
    )
    .await?;
    // 2. The switch.
    let mut tx = conn.begin().await?;
    execute(&mut tx, format!("SET LOCAL lock_timeout = '5s'; LOCK TABLE {outbox} IN ACCESS EXCLUSIVE MODE"))
        .await?;
    if last_id(&mut tx, outbox).await? >= bound {
        return Err(Error::Conflict(format!("{outbox} took 2^40 ids during its conversion; run it again")));
    }
    // Its indexes, by definition, before they are renamed: the partitioned table gets the
    // same ones, so that attaching takes the legacy table's as its partition's. Unique
    // ones other than the primary key are per partition (event ids: see `check_event_ids`).
    let indexes: Vec<(String, String, bool, bool)> = sqlx::query_as(
        "SELECT c.relname::text, pg_get_indexdef(i.indexrelid), i.indisunique, i.indisprimary \
         FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE i.indrelid = $1::regclass ORDER BY c.relname",
    )
    .bind(outbox)
    .fetch_all(&mut *tx)
    .await?;
    let mut steps = Vec::new();
    for (n, (name, _, _, _)) in indexes.iter().enumerate() {
        steps.push(format!("ALTER INDEX \"{schema}\".\"{name}\" RENAME TO \"{table}_li{n}\""));
    }
    steps.push(format!("ALTER TABLE {outbox} RENAME TO \"{table}_legacy\""));
    steps.push(format!(
        "CREATE TABLE {outbox} (LIKE {legacy} INCLUDING ALL EXCLUDING INDEXES) PARTITION BY RANGE (id)"
    ));
    steps.push(format!("ALTER TABLE {outbox} DROP CONSTRAINT {range}"));
    steps.push(format!("ALTER TABLE {outbox} ALTER COLUMN id RESTART WITH {bound}"));
    steps.push(format!("ALTER TABLE {outbox} ADD CONSTRAINT \"{table}_pkey\" PRIMARY KEY (id)"));
    for (name, definition, unique, primary) in &indexes {
        if !unique {
            steps.push(definition.clone());
        } else if !primary && name != &format!("{table}_event_id_key") {
            // A unique index of the user's: it cannot span partitions without the key.
            warn!(table = %outbox, index = %name, stage = "partitions",
                  "a unique index of the outbox stays on its legacy partition only: a partitioned table's unique \
                   indexes must hold the partition key (id)");
        }
    }
    // PostgreSQL 17 refuses to attach a table with an identity column of its own; the
    // partitioned table's identity gives the ids from here on.
    steps.push(format!("ALTER TABLE {legacy} ALTER COLUMN id DROP IDENTITY"));
    steps.push(format!(
        "ALTER TABLE {outbox} ATTACH PARTITION {legacy} FOR VALUES FROM (MINVALUE) TO ({bound})"
    ));
    let default = relation(names, "_default");
    steps.push(format!("CREATE TABLE {default} PARTITION OF {outbox} DEFAULT"));
    steps.push(format!("CREATE UNIQUE INDEX \"{table}_default_event_id\" ON {default} (event_id)"));
    // The owner and privileges first: the partitions take theirs from the partitioned table.
    steps.push(crate::table::access_sql(&legacy, outbox));
    steps.push(crate::table::access_sql(&legacy, &default));
    for k in first..first + 3 {
        steps.push(create_partition_sql(names, k));
    }
    for step in steps {
        execute(&mut tx, step).await?;
    }
    tx.commit().await?;
    info!(table = %outbox, first_id = bound, stage = "partitions",
          "the outbox table is partitioned; its rows so far are in the legacy partition");
    Ok(())
}

/// Migration 13: a new install's outbox table starts partitioned, partition 0 current
/// (ids from 1) and two ahead, with no legacy partition. Only a table that is empty, never
/// gave out an id, is in no publication and has no trigger, rule or view on it and no
/// unique index of the user's: anything else is an existing install, left as it is until
/// an operator converts it online ([`partition_table`]).
pub(crate) fn new_install_sql(names: &Names) -> String {
    let (outbox, table, schema) = (&names.outbox, &names.table, &names.schema);
    let replaced = relation(names, "_replaced");
    let default = relation(names, "_default");
    let partitions: Vec<String> = (0..3).map(|k| create_partition_sql(names, k)).collect();
    format!(
        r#"
-- A new install's outbox (an empty table that never took an append) becomes partitioned by
-- id range; an existing one stays as it is until an operator converts it (`outbox partition`).
DO $convert$
DECLARE
    ix record;
    defs text[] := '{{}}';
    def text;
    n integer := 0;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = '{outbox}'::regclass) <> 'r' THEN
        RETURN;
    END IF;
    LOCK TABLE {outbox} IN ACCESS EXCLUSIVE MODE;
    IF EXISTS (SELECT 1 FROM {outbox})
       OR pg_sequence_last_value(pg_get_serial_sequence('{outbox}', 'id')::regclass) IS NOT NULL
       OR EXISTS (SELECT 1 FROM pg_publication_tables WHERE schemaname = '{schema}' AND tablename = '{table}')
       OR EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = '{outbox}'::regclass AND NOT tgisinternal)
       OR EXISTS (SELECT 1 FROM pg_rewrite r JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
                  WHERE d.refobjid = '{outbox}'::regclass)
       OR EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                  WHERE i.indrelid = '{outbox}'::regclass AND i.indisunique
                    AND c.relname NOT IN ('{table}_pkey', '{table}_event_id_key')) THEN
        RAISE NOTICE 'the outbox table % is an existing install: left as it is (convert it with `outbox partition`)', '{outbox}';
        RETURN;
    END IF;
    FOR ix IN SELECT c.relname::text AS name, pg_get_indexdef(i.indexrelid) AS def, i.indisunique AS uniq
              FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
              WHERE i.indrelid = '{outbox}'::regclass ORDER BY c.relname LOOP
        IF NOT ix.uniq THEN
            defs := defs || ix.def;
        END IF;
        EXECUTE format('ALTER INDEX %I.%I RENAME TO %I', '{schema}', ix.name, '{table}_ri' || n);
        n := n + 1;
    END LOOP;
    ALTER TABLE {outbox} RENAME TO "{table}_replaced";
    CREATE TABLE {outbox} (LIKE {replaced} INCLUDING ALL EXCLUDING INDEXES) PARTITION BY RANGE (id);
    ALTER TABLE {outbox} ADD CONSTRAINT "{table}_pkey" PRIMARY KEY (id);
    FOREACH def IN ARRAY defs LOOP
        EXECUTE def;
    END LOOP;
    {access_outbox};
    CREATE TABLE {default} PARTITION OF {outbox} DEFAULT;
    CREATE UNIQUE INDEX "{table}_default_event_id" ON {default} (event_id);
    {access_default};
    {partitions};
    DROP TABLE {replaced};
END $convert$;
"#,
        access_outbox = crate::table::access_sql(&replaced, outbox),
        access_default = crate::table::access_sql(&replaced, &default),
        partitions = partitions.join(";\n    "),
    )
}

/// Partition `k`, empty, with its unique index of event ids.
pub(crate) fn create_partition_sql(names: &Names, k: i64) -> String {
    let name = partition_name(names, k);
    let part = format!("\"{}\".\"{name}\"", names.schema);
    format!(
        "CREATE TABLE {part} PARTITION OF {outbox} FOR VALUES FROM ({lo}) TO ({hi}); \
         CREATE UNIQUE INDEX \"{name}_event_id\" ON {part} (event_id); {access}",
        outbox = names.outbox,
        access = crate::table::access_sql(&names.outbox, &part),
        lo = k << SPAN_BITS,
        hi = (k + 1).checked_mul(1 << SPAN_BITS).map_or_else(|| "MAXVALUE".to_owned(), |hi| hi.to_string()),
    )
}
