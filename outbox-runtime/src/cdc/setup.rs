//! The slot's lifecycle, fail-closed: `setup` creates the publication and the slot (the
//! relay never does), `check` refuses to start without them or without
//! `wal_level = logical`, `status` reads what operators watch, `drop` removes both.

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgPool, Row as _};

use super::CdcConfig;
use crate::error::{Error, Result};
use crate::outbox::Outbox;

/// How to turn on logical decoding, for every error that needs it.
pub(crate) const WAL_LEVEL_FIX: &str = "set wal_level = logical (ALTER SYSTEM SET wal_level = logical, then restart \
     PostgreSQL; on a managed service, its logical replication switch: rds.logical_replication = 1 on Amazon RDS, \
     cloudsql.logical_decoding = on on Cloud SQL, wal_level = logical on Azure)";

/// What `setup` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SetupReport {
    /// The publication was created (false: it existed).
    pub publication_created: bool,
    /// The slot was created (false: it existed).
    pub slot_created: bool,
    /// Pending events written before the slot (or publication) existed, which its stream
    /// will never carry: handed to the relay's table path, which publishes them.
    pub handed_to_table: u64,
}

/// The slot as PostgreSQL reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SlotStatus {
    /// The slot's name.
    pub slot: String,
    /// A relay process is streaming from it now.
    pub active: bool,
    /// The server process serving that stream.
    pub active_pid: Option<i32>,
    /// `reserved`, `extended`, `unreserved` or `lost` (PostgreSQL's `wal_status`): `lost`
    /// means the WAL it needs was removed and only a backfill recovers.
    pub wal_status: Option<String>,
    /// The oldest WAL position the slot keeps.
    pub restart_lsn: Option<String>,
    /// What the relay last confirmed: everything before it is in Kafka.
    pub confirmed_flush_lsn: Option<String>,
    /// WAL bytes the slot keeps on the server's disk.
    pub retained_bytes: Option<i64>,
    /// WAL bytes written since the last confirmed position.
    pub confirmed_lag_bytes: Option<i64>,
    /// Bytes of WAL that may still be written before the slot is lost
    /// (`max_slot_wal_keep_size`); `None` without a limit.
    pub safe_wal_size: Option<i64>,
}

/// [`Error::Config`] when the outbox table is partitioned and `publication` exists but
/// publishes its partitions' inserts under their own names: the stream reads the outbox's
/// inserts under the outbox's name (`publish_via_partition_root`), and would skip the others.
async fn check_root_published(pool: &PgPool, outbox: &Outbox, publication: &str) -> Result<()> {
    if !crate::partition::is_partitioned(pool, outbox.names()).await? {
        return Ok(());
    }
    let via_root: Option<bool> =
        sqlx::query_scalar("SELECT pubviaroot FROM pg_publication WHERE pubname = $1")
            .bind(publication)
            .fetch_optional(pool)
            .await?;
    if via_root == Some(false) {
        return Err(Error::Config(format!(
            "{} is partitioned, and publication {publication:?} sends its partitions' inserts under the partitions' \
             names, which the stream does not read: ALTER PUBLICATION \"{publication}\" SET \
             (publish_via_partition_root = true)",
            outbox.names().outbox
        )));
    }
    Ok(())
}

impl CdcConfig {
    /// Creates the publication (`FOR TABLE <outbox> WITH (publish = 'insert',
    /// publish_via_partition_root = true)`: a partitioned outbox's inserts under the outbox's
    /// name, whatever partition holds them) and the logical replication slot (`pgoutput`) when they are missing, then hands the pending
    /// events the slot will never stream (written before it) to the relay's table path.
    /// Run once per database (`outbox cdc setup`), by a role allowed to create both.
    ///
    /// # Errors
    /// [`Error::Config`] when `wal_level` is not `logical`, naming the fix.
    pub async fn setup(&self, pool: &PgPool, outbox: &Outbox) -> Result<SetupReport> {
        outbox.check_migrated_for_relay(pool, false).await?;
        check_wal_level(pool).await?;
        let names = outbox.names();
        let publication_created = !publication_exists(pool, &self.publication).await?;
        if publication_created {
            let sql = format!(
                "CREATE PUBLICATION \"{}\" FOR TABLE {} WITH (publish = 'insert', publish_via_partition_root = true)",
                self.publication, names.outbox
            );
            sqlx::query(AssertSqlSafe(sql)).execute(pool).await?;
        }
        check_root_published(pool, outbox, &self.publication).await?;
        let slot_created = slot(pool, &self.slot).await?.is_none();
        if slot_created {
            sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
                .bind(&self.slot)
                .execute(pool)
                .await?;
        }
        if setup_complete(pool, &self.publication).await? {
            return Ok(SetupReport { publication_created, slot_created, handed_to_table: 0 });
        }
        // Rows committed before the slot's consistent point (or before the publication) are
        // not in its stream: the table path publishes them. Those committed after it and
        // handed over too are skipped by the stream (touched: no longer its own). Only then
        // is the setup marked complete: a relay refuses to stream before, or a fresh row
        // behind one still to hand over could be sent first.
        let sql = format!(
            "UPDATE {} SET next_attempt_at = now() WHERE status = 'pending' AND NOT {}",
            names.outbox,
            crate::migrate::TOUCHED
        );
        let handed_to_table = sqlx::query(AssertSqlSafe(sql)).execute(pool).await?.rows_affected();
        let mark = format!("COMMENT ON PUBLICATION \"{}\" IS '{SETUP_MARK}'", self.publication);
        sqlx::query(AssertSqlSafe(mark)).execute(pool).await?;
        Ok(SetupReport { publication_created, slot_created, handed_to_table })
    }

    /// Whether a relay can stream: `wal_level = logical`, the slot (a `pgoutput` slot of
    /// this database, not lost) and the publication of the outbox's inserts exist.
    ///
    /// # Errors
    /// [`Error::Config`] naming what is missing and what to run.
    pub async fn check(&self, pool: &PgPool, outbox: &Outbox) -> Result<()> {
        check_wal_level(pool).await?;
        let names = outbox.names();
        let setup = "run `outbox cdc setup` (or CdcConfig::setup) first";
        match slot(pool, &self.slot).await? {
            None => {
                return Err(Error::Config(format!(
                    "replication slot {:?} does not exist: {setup}; the relay never creates a slot itself. \
                     If it existed and was dropped, events written since may be missing from Kafka: recover them \
                     with a backfill (`outbox relay --backfill`) before streaming again",
                    self.slot
                )))
            }
            Some(found) if found.plugin.as_deref() != Some("pgoutput") || !found.this_database => {
                return Err(Error::Config(format!(
                    "replication slot {:?} is not a pgoutput slot of this database (plugin {:?}): choose another slot name",
                    self.slot, found.plugin
                )))
            }
            Some(found) if found.wal_status.as_deref() == Some("lost") => return Err(lost(&self.slot)),
            Some(_) => {}
        }
        if !publication_exists(pool, &self.publication).await? {
            return Err(Error::Config(format!("publication {:?} does not exist: {setup}", self.publication)));
        }
        check_root_published(pool, outbox, &self.publication).await?;
        if !setup_complete(pool, &self.publication).await? {
            return Err(Error::Config(format!(
                "the setup of publication {:?} is not complete (the pending events written before it are not handed \
                 over yet): {setup}",
                self.publication
            )));
        }
        let publishes: Option<bool> = sqlx::query_scalar(
            "SELECT p.pubinsert FROM pg_publication p JOIN pg_publication_tables t ON t.pubname = p.pubname \
             WHERE p.pubname = $1 AND t.schemaname = $2 AND t.tablename = $3",
        )
        .bind(&self.publication)
        .bind(&names.schema)
        .bind(&names.table)
        .fetch_optional(pool)
        .await?;
        match publishes {
            Some(true) => Ok(()),
            Some(false) => Err(Error::Config(format!(
                "publication {:?} does not publish inserts: ALTER PUBLICATION \"{}\" SET (publish = 'insert')",
                self.publication, self.publication
            ))),
            None => Err(Error::Config(format!(
                "publication {:?} does not include table {}: ALTER PUBLICATION \"{}\" ADD TABLE {}",
                self.publication, names.outbox, self.publication, names.outbox
            ))),
        }
    }

    /// The slot as PostgreSQL reports it, `None` when it does not exist.
    pub async fn status(&self, pool: &PgPool) -> Result<Option<SlotStatus>> {
        self.status_on(pool).await
    }

    /// [`CdcConfig::status`] on any connection.
    pub(crate) async fn status_on<'c, E: sqlx::PgExecutor<'c>>(&self, on: E) -> Result<Option<SlotStatus>> {
        let row = sqlx::query(
            "SELECT active, active_pid, wal_status, restart_lsn::text, confirmed_flush_lsn::text, \
                    pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, \
                    pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, safe_wal_size \
             FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&self.slot)
        .fetch_optional(on)
        .await?;
        row.map(|r| {
            Ok(SlotStatus {
                slot: self.slot.clone(),
                active: r.try_get(0)?,
                active_pid: r.try_get(1)?,
                wal_status: r.try_get(2)?,
                restart_lsn: r.try_get(3)?,
                confirmed_flush_lsn: r.try_get(4)?,
                retained_bytes: r.try_get(5)?,
                confirmed_lag_bytes: r.try_get(6)?,
                safe_wal_size: r.try_get(7)?,
            })
        })
        .transpose()
    }

    /// Drops the slot and the publication (those that exist). The server then keeps no WAL
    /// for the relay; events written until a new setup are published by the table path
    /// only after the next setup hands them to it.
    ///
    /// # Errors
    /// [`Error::Conflict`] while a relay streams from the slot.
    pub async fn drop(&self, pool: &PgPool) -> Result<(bool, bool)> {
        let slot_dropped = match slot(pool, &self.slot).await? {
            Some(found) if found.active => {
                return Err(Error::Conflict(format!(
                    "replication slot {:?} is in use by a relay (server process {}): stop it first",
                    self.slot,
                    found.active_pid.unwrap_or_default()
                )))
            }
            Some(_) => {
                sqlx::query("SELECT pg_drop_replication_slot($1)").bind(&self.slot).execute(pool).await?;
                true
            }
            None => false,
        };
        let publication_dropped = publication_exists(pool, &self.publication).await?;
        if publication_dropped {
            sqlx::query(AssertSqlSafe(format!("DROP PUBLICATION \"{}\"", self.publication)))
                .execute(pool)
                .await?;
        }
        Ok((slot_dropped, publication_dropped))
    }
}

/// The error of a slot whose WAL is gone.
pub(crate) fn lost(slot: &str) -> Error {
    Error::Replication(format!(
        "replication slot {slot:?} is lost (wal_status = 'lost': the server removed WAL it needed, past \
         max_slot_wal_keep_size): events written meanwhile are not in its stream. Recover with a backfill, which \
         publishes every event without a published mark from the table (`outbox relay --backfill`), then drop and \
         set up the slot again (`outbox cdc drop`, `outbox cdc setup`)"
    ))
}

async fn check_wal_level(pool: &PgPool) -> Result<()> {
    let level: String = sqlx::query_scalar("SELECT current_setting('wal_level')").fetch_one(pool).await?;
    if level == "logical" {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "wal_level is {level}, and change data capture needs logical: {WAL_LEVEL_FIX}"
        )))
    }
}

/// The publication's comment once `setup` handed the events the stream will not carry to
/// the table path.
const SETUP_MARK: &str = "outbox cdc: set up (pending events before it handed to the table path)";

async fn setup_complete(pool: &PgPool, publication: &str) -> Result<bool> {
    let comment: Option<String> = sqlx::query_scalar(
        "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1",
    )
    .bind(publication)
    .fetch_optional(pool)
    .await?
    .flatten();
    Ok(comment.as_deref() == Some(SETUP_MARK))
}

async fn publication_exists(pool: &PgPool, name: &str) -> Result<bool> {
    Ok(sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)")
        .bind(name)
        .fetch_one(pool)
        .await?)
}

struct Slot {
    plugin: Option<String>,
    this_database: bool,
    wal_status: Option<String>,
    active: bool,
    active_pid: Option<i32>,
}

async fn slot(pool: &PgPool, name: &str) -> Result<Option<Slot>> {
    let row = sqlx::query(
        "SELECT plugin::text, coalesce(database = current_database(), false), wal_status, active, active_pid \
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(name)
    .fetch_optional(pool)
    .await?;
    row.map(|r| {
        Ok(Slot {
            plugin: r.try_get(0)?,
            this_database: r.try_get(1)?,
            wal_status: r.try_get(2)?,
            active: r.try_get(3)?,
            active_pid: r.try_get(4)?,
        })
    })
    .transpose()
}
