//! The outbox's tables as sqlx migrations, named after the configured schema and table.
//!
//! The applied migrations are tracked in `<schema>.<table>_migrations`, apart from the
//! application's own `_sqlx_migrations`, so both can be run against one database.

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AssertSqlSafe, SqlSafeStr};

use crate::error::{Error, Result};
use crate::outbox::Outbox;
use crate::table::Names;

impl Outbox {
    /// Whether this outbox's tables exist ([`Error::NotMigrated`] otherwise) and are at this
    /// library's latest migration ([`Error::MigrationsBehind`] otherwise).
    pub(crate) async fn check_migrated(&self, pool: &sqlx::PgPool) -> Result<()> {
        let names = self.names();
        self.check_tables(pool, &[&names.outbox, &names.leases, &names.relays, &names.cleaned, &names.audit])
            .await
    }

    /// [`Outbox::check_migrated`] for the tables a relay uses, and no others: a role that
    /// may not read the operators' audit table still runs a relay.
    pub(crate) async fn check_migrated_for_relay(&self, pool: &sqlx::PgPool, cleanup: bool) -> Result<()> {
        let names = self.names();
        let mut tables = vec![&names.outbox, &names.leases, &names.relays];
        if cleanup {
            tables.push(&names.cleaned);
        }
        self.check_tables(pool, &tables).await?;
        // Migration 10's table: relays share the missing-topic clock through it.
        let sql = format!("SELECT 1 FROM {} LIMIT 0", names.topics);
        let missing = format!("no table {}, of migration 10", names.topics);
        behind(sqlx::query(AssertSqlSafe(sql)).execute(pool).await, ("42P01", missing), names, Error::from)?;
        // Correct without them, but slow: said at every start until rebuilt.
        for index in self.invalid_indexes(pool).await? {
            tracing::warn!(table = %names.outbox, index = %index.name, fix = %index.rebuild,
                           "an index of the outbox is invalid (a concurrent build failed): claims walk the table until it is rebuilt");
        }
        Ok(())
    }

    /// The outbox table's indexes that PostgreSQL marks invalid, each with the statement
    /// that rebuilds it; `outbox migrate` and every relay's start report them.
    ///
    /// A `CREATE INDEX CONCURRENTLY` that fails or is cancelled (a deadlock, a statement
    /// timeout, a killed session) leaves its index behind, invalid: the migration is not
    /// recorded, and its next run (`IF NOT EXISTS`) finds the index and is recorded as
    /// applied. Writes still maintain such an index but no query reads it, so the claims it
    /// was built for walk the table instead: correct, and slow.
    ///
    /// An index still being built is invalid too until its build ends (a relay starting
    /// while `outbox migrate` runs, in a rolling deploy), and is not reported: builds listed
    /// in `pg_stat_progress_create_index` are left out. That view shows another role's
    /// builds only to members of that role or of `pg_read_all_stats`; to any other role, an
    /// index another role is still building looks the same as one whose build failed.
    ///
    /// # Errors
    /// [`Error::Database`] if the catalog cannot be read.
    pub async fn invalid_indexes(&self, pool: &sqlx::PgPool) -> Result<Vec<InvalidIndex>> {
        let names = self.names();
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT c.relname::text FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indexrelid \
             JOIN pg_class t ON t.oid = i.indrelid \
             JOIN pg_namespace n ON n.oid = t.relnamespace \
             WHERE n.nspname = $1 AND t.relname = $2 AND NOT i.indisvalid \
               AND NOT EXISTS (SELECT 1 FROM pg_stat_progress_create_index b WHERE b.index_relid = i.indexrelid) \
             ORDER BY 1",
        )
        .bind(&names.schema)
        .bind(&names.table)
        .fetch_all(pool)
        .await?;
        let quote = |name: &str| format!("\"{}\"", name.replace('"', "\"\""));
        Ok(rows
            .into_iter()
            .map(|(name,)| InvalidIndex {
                rebuild: format!("REINDEX INDEX CONCURRENTLY {}.{}", quote(&names.schema), quote(&name)),
                name,
            })
            .collect())
    }

    async fn check_tables(&self, pool: &sqlx::PgPool, tables: &[&String]) -> Result<()> {
        let names = self.names();
        let sql =
            tables.iter().map(|t| format!("(SELECT 1 FROM {t} LIMIT 0)")).collect::<Vec<_>>().join(", ");
        // The latest migration's column too: a relay marks failed events with it.
        let sql = format!("SELECT {sql}, (SELECT failed_at FROM {} LIMIT 0)", names.outbox);
        // undefined_column: migrated, but not to the latest version.
        let result = sqlx::query(AssertSqlSafe(sql)).execute(pool).await;
        let missing = "no column failed_at, of migration 4".to_owned();
        behind(result, ("42703", missing), names, |e| names.not_migrated(e.into()))
    }

    /// A migrator that creates (and later upgrades) this outbox's tables:
    /// `outbox.migrator().run(&pool).await?`.
    ///
    /// A new install's outbox table is partitioned by id range (migration 13; see
    /// [`Ops::partition_table`](crate::ops::Ops::partition_table)); an existing install's,
    /// one that has taken an append, stays as it is until an operator converts it online.
    pub fn migrator(&self) -> Migrator {
        let names = self.names();
        let mut migrator = Migrator::with_migrations(migrations(names, self.config().work_partitions));
        migrator.create_schema(names.schema.clone());
        migrator.dangerous_set_table_name(names.sibling("migrations"));
        migrator
    }
}

/// Migrates `outbox` as an existing install upgrading (tests only): its tables at
/// migration 12, one id taken, then the rest; the outbox table stays plain.
#[cfg(test)]
pub(crate) async fn migrate_existing(outbox: &Outbox, pool: &sqlx::PgPool) {
    outbox.migrator().run_to(12, pool).await.expect("migrations to 12");
    sqlx::query("SELECT nextval(pg_get_serial_sequence($1, 'id'))")
        .bind(&outbox.names().outbox)
        .execute(pool)
        .await
        .expect("an id taken");
    outbox.migrator().run(pool).await.expect("migrations");
}

/// An index of the outbox table that PostgreSQL marks invalid: see
/// [`Outbox::invalid_indexes`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InvalidIndex {
    /// The index's name, in the outbox's schema.
    pub name: String,
    /// The statement that rebuilds it without blocking writes.
    pub rebuild: String,
}

/// A check's `result`: `Ok` when it ran, [`Error::MigrationsBehind`] saying `missing` when
/// it failed with SQLSTATE `code`, else `other` of the database's error.
fn behind<T>(
    result: sqlx::Result<T>,
    (code, missing): (&str, String),
    names: &Names,
    other: impl FnOnce(sqlx::Error) -> Error,
) -> Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(e) if e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == code) => {
            Err(Error::MigrationsBehind { table: names.outbox.clone(), missing })
        }
        Err(e) => Err(other(e)),
    }
}

/// A pending row anything but its append touched: attempted (a retry is scheduled or was
/// made), published or failed before (put up again by `replay` or `retry`), or handed to
/// the change-data-capture relay's table path. A pending row not touched is fresh: the
/// stream's to publish. The predicate of the `touched` indexes, spelled as they are so
/// that a query can use them.
pub(crate) const TOUCHED: &str =
    "(next_attempt_at > '-infinity' OR attempts > 0 OR published_at IS NOT NULL OR failed_at IS NOT NULL)";

/// `o.status = 'pending'` for a statement that finds its rows by primary key (the marks):
/// spelled in the "C" collation (the same equality for these ASCII values) so that it
/// implies no partial index's predicate. On a table not analysed since a sudden backlog
/// the planner takes `status = 'pending'` as rare and ANDs the open-by-aggregate index
/// (every open row) into the primary key lookup; this leaves it the lookup alone.
pub(crate) const PENDING_BY_ID: &str = "o.status = 'pending' COLLATE \"C\"";

/// The lowest id of any open row (pending or failed), as a scalar subquery over the
/// indexes that hold them (fresh, touched, failed): a lower bound that every per-aggregate
/// probe of a claim can add, so that it reads only the partitions that can hold such a
/// row, not every partition the table ever had. NULL when there is none.
pub(crate) fn open_floor_sql(outbox: &str) -> String {
    format!(
        "(SELECT least( \
           (SELECT min(id) FROM {outbox} WHERE status = 'pending' AND next_attempt_at = '-infinity'), \
           (SELECT min(id) FROM {outbox} WHERE status = 'pending' AND {touched}), \
           (SELECT min(id) FROM {outbox} WHERE status = 'failed')))",
        touched = TOUCHED
    )
}

fn migrations(names: &Names, work_partitions: u32) -> Vec<Migration> {
    let outbox = &names.outbox;
    let leases = &names.leases;
    let n = work_partitions;
    let v1 = format!(
        r#"
-- One row per event. Columns up to created_at are the event; the rest is relay bookkeeping.
CREATE TABLE {outbox} (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id          uuid NOT NULL UNIQUE,
    aggregate_type    text NOT NULL,
    aggregate_id      text NOT NULL,
    aggregate_version bigint,
    event_type        text NOT NULL,
    schema_version    integer NOT NULL CHECK (schema_version > 0),
    topic             text NOT NULL,
    payload           json NOT NULL,
    headers           jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    created_at        timestamptz NOT NULL DEFAULT now(),
    -- Aggregates hash into {n} work partitions; a relay leases whole partitions, so one
    -- aggregate is only ever in one relay's hands.
    work_partition    integer NOT NULL GENERATED ALWAYS AS (
        (((hashtextextended(aggregate_type || ':' || aggregate_id, 0) % {n}) + {n}) % {n})::integer
    ) STORED,
    status            text NOT NULL DEFAULT 'pending'
                      CHECK (status IN ('pending', 'published', 'failed', 'discarded')),
    attempts          integer NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz NOT NULL DEFAULT '-infinity',
    last_error        text,
    published_at      timestamptz,
    kafka_partition   integer,
    kafka_offset      bigint
);

-- Only unpublished rows: claiming stays O(batch) whatever the published backlog.
CREATE INDEX {pending} ON {outbox} (id) INCLUDE (work_partition, next_attempt_at)
    WHERE status = 'pending';

-- Per-aggregate order: is there an earlier event of this aggregate still open?
CREATE INDEX {open} ON {outbox} (aggregate_type, aggregate_id, id)
    WHERE status IN ('pending', 'failed');

-- Work partition leases. token grows with every change of owner and fences marks.
CREATE TABLE {leases} (
    work_partition integer PRIMARY KEY,
    owner          uuid,
    token          bigint NOT NULL DEFAULT 0,
    expires_at     timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO {leases} (work_partition) SELECT generate_series(0, {last});

-- Live relays, so that each takes a fair share of the work partitions.
CREATE TABLE {relays} (
    relay_id     uuid PRIMARY KEY,
    heartbeat_at timestamptz NOT NULL
);
"#,
        relays = names.relays,
        pending = names.index("pending"),
        open = names.index("open_by_aggregate"),
        last = n - 1,
    );
    let v2 = format!(
        r#"
-- Time windows for rates, replay and reconcile. BRIN indexes are a few pages, cost appends
-- next to nothing and do not stop HOT updates; rows are appended and published in time order.
CREATE INDEX {created} ON {outbox} USING brin (created_at);
CREATE INDEX {published} ON {outbox} USING brin (published_at);

-- What purge and cleanup deleted, per event type, status and hour of creation (UTC), so
-- reconcile and replay can still count what is gone.
CREATE TABLE {cleaned} (
    event_type text NOT NULL,
    status     text NOT NULL,
    hour       timestamp NOT NULL,
    events     bigint NOT NULL,
    PRIMARY KEY (event_type, status, hour)
);
"#,
        created = names.index("created_at"),
        published = names.index("published_at"),
        cleaned = names.cleaned,
    );
    let v3 = format!(
        r#"
-- Rows that hold their aggregate's later events back: failed ones and ones waiting for a
-- retry. Normally next to none, so the claim's per-aggregate order check probes a tiny
-- index instead of scanning every open row: a claim costs the same at 10 thousand or
-- 1 million pending events.
CREATE INDEX {blocked} ON {outbox} (aggregate_type, aggregate_id, id)
    WHERE status = 'failed' OR (status = 'pending' AND next_attempt_at > '-infinity');
"#,
        blocked = names.index("blocked"),
    );
    let v4 = format!(
        r#"
-- When an event failed, for operators' actions by time (NULL for events failed before).
-- A nullable column without a default: no table rewrite.
ALTER TABLE {outbox} ADD COLUMN failed_at timestamptz;
{audit}"#,
        audit = crate::action::audit_table_sql(&names.audit, ""),
    );
    // Pending events an operator put up again (`retry`, `replay`), waiting for a retry, or
    // handed over by the change-data-capture stream: its table path, by id and by aggregate
    // (the stream's order check). Empty most of the time. Built concurrently, one
    // statement per migration (CONCURRENTLY runs outside a transaction), so that an
    // existing outbox keeps taking appends while they are built.
    let touched = |name: &str, columns: &str| {
        format!(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {outbox} ({columns}) WHERE status = 'pending' AND {TOUCHED}",
            index = names.index(name),
        )
    };
    let v5 = touched("touched", "id");
    let v6 = touched("touched_by_aggregate", "aggregate_type, aggregate_id, id");
    // The claim walks two indexes instead of the `pending` one, so that rows waiting for a
    // retry cost it nothing until they are due (a broker outage leaves every pending row
    // waiting, and a walk of `pending` in id order read past all of them on every claim):
    // fresh rows (never attempted or put up again) in id order, and rows waiting for a
    // retry in order of their due time. The append path keeps one index: `pending` goes.
    // The `blocked` index's predicate is the `due` one's or `failed`.
    let v7 = format!(
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS {fresh} ON {outbox} (id) INCLUDE (work_partition) \
         WHERE status = 'pending' AND next_attempt_at = '-infinity'",
        fresh = names.index("fresh"),
    );
    let v8 = format!(
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS {due} ON {outbox} (next_attempt_at, id) INCLUDE (work_partition) \
         WHERE status = 'pending' AND next_attempt_at > '-infinity'",
        due = names.index("due"),
    );
    let v10 = format!(
        r#"
-- Topics a relay found missing in the Kafka cluster: since when (the first such answer
-- with no answer that it exists since) and when last confirmed. The relays share this
-- clock of missing_topic_timeout, so that a restart or a takeover does not start it
-- again. A row goes when a relay finds its topic.
CREATE TABLE {topics} (
    topic   text PRIMARY KEY,
    since   timestamptz NOT NULL,
    checked timestamptz NOT NULL
);
"#,
        topics = names.topics,
    );
    // A caller-given event id is checked against the whole table (a partitioned one holds a
    // unique index per partition), and a partitioned outbox's span and partitions ahead.
    let v11 = crate::partition::check_event_ids_sql(names);
    // Failed events by id, for the lowest open id a partitioned outbox's claim bounds its
    // probes with. An append inserts none (its rows are pending): it costs appends nothing.
    let v12 = format!(
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS {failed} ON {outbox} (id) WHERE status = 'failed'",
        failed = names.index("failed"),
    );
    // A new install's outbox starts partitioned (an existing one is converted online).
    let v13 = crate::partition::convert::new_install_sql(names);
    let v14 = format!(
        r#"
-- What each relay has in flight (claimed or streamed, not yet recorded), per topic, as it
-- last reported, and until when that report stands (NULL: nothing in flight, which needs
-- no refreshing). Nullable columns without a default: no table rewrite.
ALTER TABLE {relays} ADD COLUMN in_flight jsonb, ADD COLUMN in_flight_until timestamptz;
"#,
        relays = names.relays,
    );
    let v9 = format!("DROP INDEX CONCURRENTLY IF EXISTS \"{}\".{}", names.schema, names.index("pending"));
    // (version, description, SQL, whether it runs outside a transaction: CONCURRENTLY)
    [
        (1, "outbox, work partition leases", v1, false),
        (2, "time indexes, cleaned tally", v2, false),
        (3, "index of blocking rows", v3, false),
        (4, "time of failure, operators' audit", v4, false),
        (5, "index of events put up again", v5, true),
        (6, "index of events put up again, by aggregate", v6, true),
        (7, "index of fresh events", v7, true),
        (8, "index of events waiting for a retry, by due time", v8, true),
        (9, "the pending index, replaced by the fresh and due ones", v9, true),
        (10, "missing topics, the relays' shared clock", v10, false),
        (11, "event id check across partitions, partitioning settings", v11, false),
        (12, "index of failed events by id", v12, true),
        (13, "a new install's outbox in partitions", v13, false),
        (14, "what each relay has in flight", v14, false),
    ]
    .into_iter()
    .map(|(version, description, sql, no_tx)| {
        Migration::new(
            version,
            description.into(),
            MigrationType::Simple,
            AssertSqlSafe(sql).into_sql_str(),
            no_tx,
        )
    })
    .collect()
}
