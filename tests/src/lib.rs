//! Shared helpers for the workspace-level integration tests in `tests/tests/`.

use outbox_examples::events::{OrderLine, Payment};
use outbox_examples::orders::{self, NewOrder};
use outbox_runtime::Outbox;
use sqlx::PgPool;
use uuid::Uuid;

pub mod running;

/// Runs the default outbox's and the order service's migrations on `pool`.
pub async fn migrate(pool: &PgPool) -> Outbox {
    let outbox = Outbox::default_ref().clone();
    outbox.migrator().run(pool).await.expect("outbox migrations");
    orders::MIGRATOR.run(pool).await.expect("order migrations");
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

pub mod fuzz;
pub mod kafka;
pub mod raw;

use std::time::{Duration, Instant};

use outbox_runtime::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A test event: step `n` of aggregate `id`, on topic `outbox-test-steps`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "test.step", schema_version = 1, aggregate = "test", topic = "outbox-test-steps")]
pub struct Step {
    /// The aggregate.
    #[outbox(aggregate_id)]
    pub id: String,
    /// Its step number, also given as aggregate_version.
    pub n: i64,
    /// Filler.
    pub data: String,
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

/// The URL of the database `pool` is connected to (for child processes).
pub fn database_url(pool: &PgPool) -> String {
    let base =
        std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let db = pool.connect_options().get_database().unwrap_or("test").to_owned();
    match base.rfind('/') {
        Some(i) => format!("{}/{db}", &base[..i]),
        None => base,
    }
}

/// A small deterministic PRNG (xorshift64*) for tests that print their seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded from `OUTBOX_TEST_SEED` or the clock; prints the seed.
    pub fn from_env(name: &str) -> Rng {
        Rng::seeded(Rng::seed_from_env(name))
    }

    /// `OUTBOX_TEST_SEED`, or one from the clock; printed with `name`, so that a failing
    /// run can be repeated.
    pub fn seed_from_env(name: &str) -> u64 {
        let seed = std::env::var("OUTBOX_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
        eprintln!("{name}: OUTBOX_TEST_SEED={seed}");
        seed
    }

    /// The generator of `seed`.
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// Next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo).max(1)
    }
}
