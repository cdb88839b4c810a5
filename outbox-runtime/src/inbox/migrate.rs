//! The inbox's tables: its migrations.

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AssertSqlSafe, SqlSafeStr};

use super::{Inbox, InboxNames};

impl Inbox {
    /// A migrator creating the inbox tables.
    pub fn migrator(&self) -> Migrator {
        let InboxNames { inbox, parked, aggregates, audit, schema, table, progress } = &self.names;
        let v1 = format!(
            r#"
-- One row per (consumer, event) applied: the dedup key, plus what diagnosing needs.
CREATE TABLE {inbox} (
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
    outcome           text NOT NULL DEFAULT 'applied' CHECK (outcome IN ('applied', 'stale', 'discarded')),
    applied_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX "{table}_applied_at" ON {inbox} (applied_at);

-- Messages not applied: parked with their reason, or held behind a parked one of their
-- key. Raw bytes are kept: nothing is lost.
CREATE TABLE {parked} (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text NOT NULL,
    topic           text NOT NULL,
    kafka_partition integer NOT NULL,
    kafka_offset    bigint NOT NULL,
    record_key      bytea,
    headers         jsonb NOT NULL,
    payload         bytea NOT NULL,
    event_id        uuid,
    event_type      text,
    schema_version  integer,
    status          text NOT NULL CHECK (status IN ('parked', 'held', 'retried', 'discarded')),
    reason          text NOT NULL,
    parked_at       timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz,
    UNIQUE (consumer, topic, kafka_partition, kafka_offset)
);
CREATE INDEX "{table}_parked_open" ON {parked} (consumer, record_key, id) WHERE status IN ('parked', 'held');

-- Last applied aggregate_version per aggregate and topic (order holds within a topic's
-- partition only), with the gaps and stale events seen.
CREATE TABLE {aggregates} (
    consumer       text NOT NULL,
    topic          text NOT NULL,
    aggregate_type text NOT NULL,
    aggregate_id   text NOT NULL,
    last_version   bigint NOT NULL,
    gaps           bigint NOT NULL DEFAULT 0,
    stale          bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, topic, aggregate_type, aggregate_id)
);
"#
        );
        let migration = Migration::new(
            1,
            "inbox, parked, aggregates".into(),
            MigrationType::Simple,
            AssertSqlSafe(v1).into_sql_str(),
            false,
        );
        let v2 = format!(
            r#"
-- Retries requested by operators (outbox inbox retry), carried out by the running consumer.
ALTER TABLE {parked} ADD COLUMN retry_requested_at timestamptz;
"#
        );
        let migration2 = Migration::new(
            2,
            "operator retry requests".into(),
            MigrationType::Simple,
            AssertSqlSafe(v2).into_sql_str(),
            false,
        );
        let v3 = format!(
            r#"
-- Holds are keyed by topic and record key (a parked record holds back later records of its
-- key in its topic only), hashed: keys may be any size, an index row about 2,700 bytes.
-- Every header is kept as read, bytes included; null values are told from empty ones.
DROP INDEX "{schema}"."{table}_parked_open";
-- The database's encoding never changes, so the function is immutable and the key can be a
-- generated column: every row gets it, however it is inserted.
CREATE FUNCTION "{schema}"."{table}_hold_key"(topic text, record_key bytea) RETURNS bytea
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT sha256(convert_to(topic, 'UTF8') || decode('00', 'hex') || record_key) $$;
ALTER TABLE {parked}
    ADD COLUMN hold_key bytea GENERATED ALWAYS AS ("{schema}"."{table}_hold_key"(topic, record_key)) STORED,
    ADD COLUMN raw_headers jsonb,
    ADD COLUMN null_value boolean NOT NULL DEFAULT false;
CREATE INDEX "{table}_parked_hold" ON {parked} (consumer, hold_key, id) WHERE status IN ('parked', 'held');
-- Cleanup deletes one consumer's rows at a time.
DROP INDEX "{schema}"."{table}_applied_at";
CREATE INDEX "{table}_applied_at" ON {inbox} (consumer, applied_at);
"#
        );
        let migration3 = Migration::new(
            3,
            "holds by topic and hashed key, raw headers, cleanup per consumer".into(),
            MigrationType::Simple,
            AssertSqlSafe(v3).into_sql_str(),
            false,
        );
        let v4 = format!(
            r#"
-- A CloudEvent's own id and source, kept when its id is not a UUID (event_id is then the
-- UUIDv5 of the two, see inbox::event_id_of); NULL when event_id is the id as sent.
-- Nullable columns without a default: no table rewrite.
ALTER TABLE {inbox} ADD COLUMN ce_id text, ADD COLUMN ce_source text;
"#
        );
        let migration4 = Migration::new(
            4,
            "CloudEvents ids that are not UUIDs".into(),
            MigrationType::Simple,
            AssertSqlSafe(v4).into_sql_str(),
            false,
        );
        let v5 = format!(
            r#"
{audit_table}"#,
            audit_table = crate::action::audit_table_sql(audit, "    consumer text NOT NULL,\n"),
        );
        let migration5 = Migration::new(
            5,
            "operators' audit".into(),
            MigrationType::Simple,
            AssertSqlSafe(v5).into_sql_str(),
            false,
        );
        let migration6 = Migration::new(
            6,
            "dedup table in partitions: bucket, consumers' retention, span".into(),
            MigrationType::Simple,
            AssertSqlSafe(super::partitions::migration_sql(&self.names)).into_sql_str(),
            false,
        );
        let v7 = format!(
            r#"
-- Aggregates whose versions skipped ahead (gaps > 0), for the console's overview: a few rows
-- of a large table, found without reading it. Updates that leave `gaps` unchanged stay HOT.
CREATE INDEX "{table}_aggregates_gaps" ON {aggregates} (consumer) WHERE gaps > 0;
"#
        );
        let migration7 = Migration::new(
            7,
            "aggregates with version gaps".into(),
            MigrationType::Simple,
            AssertSqlSafe(v7).into_sql_str(),
            false,
        );
        let v8 = format!(
            r#"
-- A consumer's newest parked messages, for failure groups counted up to the console's cap:
-- read without walking past other consumers' messages or resolved ones.
CREATE INDEX "{table}_parked_newest" ON {parked} (consumer, id) WHERE status = 'parked';
"#
        );
        let migration8 = Migration::new(
            8,
            "newest parked messages".into(),
            MigrationType::Simple,
            AssertSqlSafe(v8).into_sql_str(),
            false,
        );
        let v9 = format!(
            r#"
-- Per consumer, topic and Kafka partition: the deliveries absorbed as duplicates, counted in
-- the transaction that absorbs them (one partition's worker writes its row: no contention
-- between partitions), for the console's consumer row and InboxAdmin::summary.
CREATE TABLE {progress} (
    consumer          text NOT NULL,
    topic             text NOT NULL,
    kafka_partition   integer NOT NULL,
    duplicates        bigint NOT NULL DEFAULT 0,
    last_duplicate_at timestamptz,
    PRIMARY KEY (consumer, topic, kafka_partition)
);
{access};
"#,
            access = crate::table::access_sql(inbox, progress),
        );
        let migration9 = Migration::new(
            9,
            "duplicates per consumer and partition".into(),
            MigrationType::Simple,
            AssertSqlSafe(v9).into_sql_str(),
            false,
        );
        let mut migrator = Migrator::with_migrations(vec![
            migration, migration2, migration3, migration4, migration5, migration6, migration7, migration8,
            migration9,
        ]);
        migrator.create_schema(schema.clone());
        migrator.dangerous_set_table_name(format!("\"{schema}\".\"{table}_migrations\""));
        migrator
    }
}
