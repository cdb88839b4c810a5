//! Shared helpers for the workspace-level integration tests in `tests/tests/`.

use outbox_examples::events::{OrderLine, Payment};
use outbox_examples::orders::{self, NewOrder};
use outbox_runtime::Outbox;
use sqlx::PgPool;
use uuid::Uuid;

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
