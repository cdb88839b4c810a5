//! What the change-data-capture relay's tests share: a slot and publication of their own
//! per test (slot names are server-wide), dropped when the test ends, passed or not: a
//! slot left behind keeps WAL on the server for ever and keeps its database from being
//! dropped.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::cdc::{CdcConfig, CdcRelay};
use outbox_runtime::relay::RelayConfig;
use outbox_runtime::Outbox;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::kafka::Record;
use crate::relay_kit::records_for;
use crate::running::Running;

/// A database of the calling test's own on a server that streams: the server at
/// `DATABASE_URL` when it is at `wal_level = logical`, else a server of the test binary's
/// own ([`pg_server::streaming`](crate::pg_server::streaming)).
pub async fn database() -> PgPool {
    let server =
        crate::pg_server::streaming().unwrap_or_else(|e| panic!("a server at wal_level = logical: {e}"));
    crate::db::test_database(&server).await
}

/// Whether the server can stream (`wal_level = logical`). A test that needs it fails
/// with the fix in its message when it is off: it never passes without running.
pub async fn require_logical(pool: &PgPool) {
    let level: String = sqlx::query_scalar("SHOW wal_level").fetch_one(pool).await.expect("wal_level");
    assert_eq!(
        level, "logical",
        "this test needs wal_level = logical: take its database from cdc_kit::database()"
    );
}

/// A slot and publication of one test, on the database of `pool`.
#[derive(Debug)]
pub struct Slot {
    /// Settings that stream from them.
    pub config: CdcConfig,
    name: String,
    /// Where to drop it from.
    admin_url: String,
}

impl Slot {
    /// A fresh name, not yet set up (for tests of what happens without a slot).
    pub async fn named(pool: &PgPool) -> Slot {
        require_logical(pool).await;
        let name = format!("outbox_t_{}", &Uuid::new_v4().simple().to_string()[..12]);
        let admin_url = crate::database_url(pool);
        let config = CdcConfig::new(admin_url.clone())
            .slot(&name)
            .publication(&name)
            .status_interval(Duration::from_millis(200))
            .takeover_interval(Duration::from_millis(300));
        Slot { config, name, admin_url }
    }

    /// A fresh slot and publication for `outbox`, set up.
    pub async fn setup(pool: &PgPool, outbox: &Outbox) -> Slot {
        let slot = Slot::named(pool).await;
        slot.config.setup(pool, outbox).await.expect("cdc setup");
        slot
    }

    /// The slot's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Starts a relay streaming from this slot.
    pub fn start(&self, pool: &PgPool, outbox: &Outbox, config: RelayConfig) -> Running {
        self.start_with(pool, outbox, config, self.config.clone())
    }

    /// Starts a relay streaming as `cdc` says (settings of this slot's, changed).
    pub fn start_with(&self, pool: &PgPool, outbox: &Outbox, config: RelayConfig, cdc: CdcConfig) -> Running {
        let relay = CdcRelay::new(pool.clone(), outbox.clone(), config, cdc).expect("cdc relay");
        let stats: Arc<_> = relay.stats();
        let stop = CancellationToken::new();
        let task = tokio::spawn(relay.run(stop.clone()));
        Running { stop, task, stats }
    }

    /// The slot's confirmed position, as a number.
    pub async fn confirmed(&self, pool: &PgPool) -> u64 {
        let lsn: Option<String> = sqlx::query_scalar(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&self.name)
        .fetch_one(pool)
        .await
        .expect("the slot");
        lsn.as_deref().map_or(0, lsn_number)
    }
}

/// `X/Y` as a number.
pub fn lsn_number(lsn: &str) -> u64 {
    let (high, low) = lsn.split_once('/').expect("an LSN");
    (u64::from_str_radix(high, 16).expect("hex") << 32) | u64::from_str_radix(low, 16).expect("hex")
}

impl Drop for Slot {
    fn drop(&mut self) {
        let name = self.name.clone();
        let url = self.admin_url.clone();
        // Drop runs in the test's runtime (or while it unwinds): drop the slot from a thread
        // with a runtime of its own, ending the relay's stream first if it still holds it.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let pool = PgPoolOptions::new().max_connections(1).connect(&url).await.ok()?;
                for _ in 0..50 {
                    let _ = sqlx::query(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                         WHERE slot_name = $1 AND active_pid IS NOT NULL",
                    )
                    .bind(&name)
                    .execute(&pool)
                    .await;
                    let gone = sqlx::query(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
                    )
                    .bind(&name)
                    .execute(&pool)
                    .await
                    .is_ok();
                    if gone {
                        return Some(());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                None
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("could not drop replication slot {}: drop it by hand", self.name);
        }
    }
}
/// The records of `records` by event id.
pub fn by_event(records: &[Record]) -> BTreeMap<String, &Record> {
    records.iter().map(|r| (r.headers["ce_id"].clone(), r)).collect()
}

/// Aggregate versions of `key` in the order Kafka holds them, first copies only.
pub fn first_versions(records: &[Record], key: &str) -> Vec<i64> {
    let mut seen = HashSet::new();
    records_for(records, key)
        .iter()
        .filter(|r| seen.insert(r.headers["ce_id"].clone()))
        .map(|r| r.headers["ce_aggregateversion"].parse().expect("a version"))
        .collect()
}

/// The records of `records` that carry one of the events `ids`: a broker process keeps
/// other tests' and runs' records on the same topics.
pub fn ours(records: Vec<Record>, ids: &[uuid::Uuid]) -> Vec<Record> {
    let ids: HashSet<String> = ids.iter().map(uuid::Uuid::to_string).collect();
    records.into_iter().filter(|r| r.headers.get("ce_id").is_some_and(|id| ids.contains(id))).collect()
}
