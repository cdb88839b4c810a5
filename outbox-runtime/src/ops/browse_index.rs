//! Building the browse indexes ([`Ops::create_browse_indexes`](super::Ops::create_browse_indexes))
//! without blocking appends, on a plain or a partitioned outbox.

use sqlx::{AssertSqlSafe, PgPool};
use tracing::info;

use super::browse::BROWSE_INDEXES;
use crate::error::{Error, Result};
use crate::table::Names;

/// Rounds of "index every partition, attach" before giving up: a partition created by
/// maintenance in between gets the index from the partitioned one if it was there, or is
/// found missing and indexed by the next round.
const ROUNDS: usize = 3;

/// Builds the browse indexes `names`'s outbox lacks; returns the ones built.
pub(super) async fn create(names: &Names, pool: &PgPool) -> Result<Vec<String>> {
    let partitioned: bool = sqlx::query_scalar("SELECT relkind = 'p' FROM pg_class WHERE oid = $1::regclass")
        .bind(&names.outbox)
        .fetch_one(pool)
        .await?;
    let mut built = Vec::new();
    for (suffix, short, definition) in BROWSE_INDEXES {
        let name = format!("{}_{suffix}", names.table);
        match valid(pool, &names.schema, &name).await? {
            Some(true) => continue,
            Some(false) => {
                // An interrupted CONCURRENTLY build leaves an invalid index: build it again.
                let drop = if partitioned { "DROP INDEX" } else { "DROP INDEX CONCURRENTLY" };
                execute(pool, format!("{drop} IF EXISTS \"{}\".\"{name}\"", names.schema)).await?;
            }
            None => {}
        }
        if partitioned {
            create_partitioned(names, pool, &name, short, definition).await?;
        } else {
            execute(
                pool,
                format!(
                    "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"{name}\" ON {} {definition}",
                    names.outbox
                ),
            )
            .await?;
        }
        if valid(pool, &names.schema, &name).await? != Some(true) {
            return Err(Error::Config(format!(
                "the browse index {name} of {} is not valid after its build: run it again",
                names.outbox
            )));
        }
        info!(table = %names.outbox, index = %name, stage = "browse-indexes", "browse index built");
        built.push(name);
    }
    Ok(built)
}

/// On a partitioned outbox: the index on the partitioned table only (instant, invalid until
/// every partition has its own attached), then each partition's built concurrently and
/// attached.
async fn create_partitioned(
    names: &Names,
    pool: &PgPool,
    name: &str,
    short: &str,
    definition: &str,
) -> Result<()> {
    let schema = &names.schema;
    execute(pool, format!("CREATE INDEX IF NOT EXISTS \"{name}\" ON ONLY {} {definition}", names.outbox))
        .await?;
    for _ in 0..ROUNDS {
        // Partitions without an index attached to this one.
        let lacking: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_partition_tree($1::regclass) t JOIN pg_class c ON c.oid = t.relid \
             WHERE t.isleaf AND NOT EXISTS ( \
                 SELECT 1 FROM pg_inherits h JOIN pg_index i ON i.indexrelid = h.inhrelid \
                 WHERE h.inhparent = format('%I.%I', $2::text, $3::text)::regclass AND i.indrelid = t.relid)",
        )
        .bind(&names.outbox)
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
