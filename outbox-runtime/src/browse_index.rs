//! Building browse indexes without blocking writes, on a plain or a partitioned table: the
//! outbox's ([`Ops::create_browse_indexes`](crate::ops::Ops::create_browse_indexes)) and the
//! inbox's dedup table's
//! ([`InboxAdmin::create_browse_indexes`](crate::inbox::InboxAdmin::create_browse_indexes)).

use sqlx::{AssertSqlSafe, PgPool};
use tracing::info;

use crate::error::{Error, Result};

/// A table to index: its schema, its bare name (the indexes are `<name>_<suffix>`), and
/// its quoted `"schema"."name"`.
pub(crate) struct Indexed<'a> {
    pub(crate) schema: &'a str,
    pub(crate) name: &'a str,
    pub(crate) qualified: &'a str,
}

/// An index: its suffix, a short suffix for each partition's own, its definition (the
/// part after `ON table`).
pub(crate) type IndexSpec = (&'static str, &'static str, &'static str);

/// The indexes of `indexes` that `table` lacks or has invalid (their names).
pub(crate) async fn missing(
    pool: &PgPool,
    table: &Indexed<'_>,
    indexes: &[IndexSpec],
) -> Result<Vec<String>> {
    let wanted: Vec<String> =
        indexes.iter().map(|(suffix, _, _)| format!("{}_{suffix}", table.name)).collect();
    let present: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid \
         WHERE c.relnamespace = format('%I', $1::text)::regnamespace AND c.relname = ANY($2) AND i.indisvalid \
           AND i.indrelid = $3::regclass",
    )
    .bind(table.schema)
    .bind(&wanted)
    .bind(table.qualified)
    .fetch_all(pool)
    .await?;
    Ok(wanted.into_iter().filter(|w| !present.contains(w)).collect())
}

/// Rounds of "index every partition, attach" before giving up: a partition created by
/// maintenance in between gets the index from the partitioned one if it was there, or is
/// found missing and indexed by the next round.
const ROUNDS: usize = 3;

/// Builds the indexes of `indexes` that `table` lacks; returns the ones built.
pub(crate) async fn create(pool: &PgPool, table: &Indexed<'_>, indexes: &[IndexSpec]) -> Result<Vec<String>> {
    let partitioned: bool = sqlx::query_scalar("SELECT relkind = 'p' FROM pg_class WHERE oid = $1::regclass")
        .bind(table.qualified)
        .fetch_one(pool)
        .await?;
    let mut built = Vec::new();
    for (suffix, short, definition) in indexes {
        let name = format!("{}_{suffix}", table.name);
        match valid(pool, table.schema, &name).await? {
            Some(true) => continue,
            Some(false) => {
                // An interrupted CONCURRENTLY build leaves an invalid index: build it again.
                let drop = if partitioned { "DROP INDEX" } else { "DROP INDEX CONCURRENTLY" };
                execute(pool, format!("{drop} IF EXISTS \"{}\".\"{name}\"", table.schema)).await?;
            }
            None => {}
        }
        if partitioned {
            create_partitioned(table, pool, &name, short, definition).await?;
        } else {
            execute(
                pool,
                format!(
                    "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"{name}\" ON {} {definition}",
                    table.qualified
                ),
            )
            .await?;
        }
        // Valid, and on this table (a table converted into partitions leaves its old one
        // beside it, with indexes of the same names).
        if valid(pool, table.schema, &name).await? != Some(true)
            || missing(pool, table, &[(*suffix, *short, *definition)]).await?.contains(&name)
        {
            return Err(Error::Config(format!(
                "the browse index {name} of {} is not valid after its build: run it again",
                table.qualified
            )));
        }
        info!(table = %table.qualified, index = %name, stage = "browse-indexes", "browse index built");
        built.push(name);
    }
    Ok(built)
}

/// On a partitioned table: the index on the partitioned table only (instant, invalid until
/// every partition has its own attached), then each partition's built concurrently and
/// attached.
async fn create_partitioned(
    table: &Indexed<'_>,
    pool: &PgPool,
    name: &str,
    short: &str,
    definition: &str,
) -> Result<()> {
    let schema = table.schema;
    execute(pool, format!("CREATE INDEX IF NOT EXISTS \"{name}\" ON ONLY {} {definition}", table.qualified))
        .await?;
    for _ in 0..ROUNDS {
        // Partitions without an index attached to this one.
        let lacking: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_partition_tree($1::regclass) t JOIN pg_class c ON c.oid = t.relid \
             WHERE t.isleaf AND NOT EXISTS ( \
                 SELECT 1 FROM pg_inherits h JOIN pg_index i ON i.indexrelid = h.inhrelid \
                 WHERE h.inhparent = format('%I.%I', $2::text, $3::text)::regclass AND i.indrelid = t.relid)",
        )
        .bind(table.qualified)
        .bind(schema)
        .bind(name)
        .fetch_all(pool)
        .await?;
        if lacking.is_empty() {
            return Ok(());
        }
        for partition in lacking {
            let own = format!("{partition}_{short}");
            if valid(pool, schema, &own).await? == Some(false) {
                execute(pool, format!("DROP INDEX CONCURRENTLY IF EXISTS \"{schema}\".\"{own}\"")).await?;
            }
            execute(
                pool,
                format!("CREATE INDEX CONCURRENTLY IF NOT EXISTS \"{own}\" ON \"{schema}\".\"{partition}\" {definition}"),
            )
            .await?;
            execute(
                pool,
                format!("ALTER INDEX \"{schema}\".\"{name}\" ATTACH PARTITION \"{schema}\".\"{own}\""),
            )
            .await?;
        }
    }
    Ok(())
}

/// Whether index `name` of `schema` is valid; `None` when there is none.
async fn valid(pool: &PgPool, schema: &str, name: &str) -> Result<Option<bool>> {
    Ok(sqlx::query_scalar(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE c.relnamespace = format('%I', $1::text)::regnamespace AND c.relname = $2",
    )
    .bind(schema)
    .bind(name)
    .fetch_optional(pool)
    .await?)
}

async fn execute(pool: &PgPool, sql: String) -> Result<()> {
    sqlx::query(AssertSqlSafe(sql)).execute(pool).await?;
    Ok(())
}
