//! The shared test kit: the workspace-level integration tests in `tests/tests/` and
//! `cargo xtask demo`, `chaos`, `fuzz` and `bench` set up with it.
//!
//! - [`kafka`]: the broker (`KAFKA_BROKERS`, else librdkafka's in-process mock cluster),
//!   topics, and reading records back;
//! - [`db`]: the PostgreSQL server (`DATABASE_URL` or the local default) and fresh
//!   databases on it; [`pg_server`]: servers of the tests' own, for what it lacks
//!   (`wal_level = logical`) or must not be put through (restarts, server-wide settings);
//! - [`events`]: the test events and the headers the relay writes;
//! - [`Rng`]: the seeded generator whose seed a run prints;
//! - [`metrics_kit`], [`log_kit`]: metrics read back through a debugging recorder, log
//!   lines through a subscriber writing into memory;
//! - [`raw`], [`running`], [`fuzz`]: records no safe client writes, a relay running in the
//!   test, the inbox's fuzz run;
//! - [`relay_kit`], [`inbox_kit`], [`cdc_kit`]: what the relay's, the inbox's and the
//!   change-data-capture relay's test files share.

use std::time::{Duration, Instant};

use outbox_examples::events::{OrderLine, Payment};
use outbox_examples::orders::{self, NewOrder};
use outbox_runtime::Outbox;
use sqlx::PgPool;
use uuid::Uuid;

pub mod cdc_kit;
pub mod compat_fuzz;
pub mod db;
pub mod events;
pub mod fuzz;
pub mod inbox_kit;
pub mod kafka;
pub mod log_kit;
pub mod metrics_kit;
pub mod partition_kit;
pub mod pg_server;
pub mod raw;
pub mod registry_standin;
pub mod relay_kit;
mod rng;
pub mod running;

pub use db::database_url;
pub use events::{Credit, Step};
pub use rng::{Rng, SEED_VAR};

/// What the kit's fallible set-up returns on failure (the panicking forms are for tests).
pub type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Runs the default outbox's and the order service's migrations on `pool`.
pub async fn migrate(pool: &PgPool) -> Outbox {
    let outbox = Outbox::default_ref().clone();
    outbox.migrator().run(pool).await.expect("outbox migrations");
    orders::MIGRATOR.run(pool).await.expect("order migrations");
    outbox
}

/// [`migrate`] as an existing install upgrading: the outbox's tables at migration 12, one
/// id taken (an outbox that has had events, cleaned since), then the rest. Its outbox table
/// stays plain (migration 13 partitions only a new install's), for tests of the conversion.
pub async fn migrate_existing(pool: &PgPool) -> Outbox {
    let outbox = Outbox::default_ref().clone();
    outbox.migrator().run_to(12, pool).await.expect("outbox migrations to 12");
    sqlx::query("SELECT nextval(pg_get_serial_sequence('outbox', 'id'))")
        .execute(pool)
        .await
        .expect("an id taken");
    let outbox = migrate(pool).await;
    assert!(!outbox.ops().is_partitioned(pool).await.expect("layout"), "an existing install stays plain");
    outbox
}

/// A small order to place.
pub fn sample_order() -> NewOrder {
    NewOrder {
        customer_id: Uuid::now_v7(),
        lines: vec![OrderLine { sku: "sku-1".into(), quantity: 2 }],
        total_cents: 2_500,
        currency: "EUR".into(),
        payment: Payment::Card { last4: "4242".into() },
    }
}

/// Number of rows in the default outbox.
pub async fn outbox_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM public.outbox").fetch_one(pool).await.expect("count")
}

/// Polls `check` every 50 ms until it returns true or `timeout` passes; says whether it did.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check().await
}

/// Count of outbox rows in `status`.
pub async fn rows_in(pool: &PgPool, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM public.outbox WHERE status = $1")
        .bind(status)
        .fetch_one(pool)
        .await
        .expect("count")
}
