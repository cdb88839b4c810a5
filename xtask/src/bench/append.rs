//! `append_overhead` and `append_vs_floor`: the example's confirm with its outbox append
//! against the same transaction without it, without the aggregate lock, and with a bare
//! `INSERT`.

use std::time::Instant;

use outbox_examples::events::{OrderConfirmed, OrderLine, Payment};
use outbox_examples::orders::{self, NewOrder};
use outbox_runtime::{Outbox, OutboxEvent};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::{percentile, Failure, Figures, Sizes};

/// `append_overhead`: the example's confirm with its outbox append against the same
/// transaction without it, interleaved so drift hits both alike. A third variant appends
/// without the per-aggregate advisory lock (`lock_aggregates(false)`), which prices the
/// lock: `aggregate_lock_ms`. A fourth writes the same row with a bare `INSERT` into a table
/// with only a primary key, the floor any outbox pays: `append_vs_floor`.
pub(super) async fn append_overhead(
    pool: &PgPool,
    outbox: &Outbox,
    sizes: Sizes,
    f: &mut Figures,
) -> Result<(), Failure> {
    const VARIANTS: usize = 4;
    let unlocked = Outbox::new(outbox.config().clone().lock_aggregates(false))?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_floor (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
         event_id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL, \
         aggregate_version bigint, event_type text NOT NULL, schema_version integer NOT NULL, \
         topic text NOT NULL, payload json NOT NULL, headers jsonb NOT NULL)",
    )
    .execute(pool)
    .await?;
    let mut ids = Vec::with_capacity(sizes.confirms * VARIANTS);
    for i in 0..sizes.confirms * VARIANTS {
        let order = NewOrder {
            customer_id: Uuid::now_v7(),
            lines: vec![OrderLine { sku: format!("sku-{}", i % 10), quantity: 1 }],
            total_cents: 1_000,
            currency: "EUR".into(),
            payment: Payment::Card { last4: "4242".into() },
        };
        ids.push(orders::place(pool, outbox, &order).await?);
    }
    let mut samples: [Vec<f64>; VARIANTS] = Default::default();
    for (i, group) in ids.chunks(VARIANTS).enumerate() {
        let mut took = [0.0; VARIANTS];
        let started = Instant::now();
        orders::confirm(pool, outbox, group[0]).await?;
        took[0] = started.elapsed().as_secs_f64();
        let started = Instant::now();
        orders::confirm_without_event(pool, group[1]).await?;
        took[1] = started.elapsed().as_secs_f64();
        let started = Instant::now();
        orders::confirm(pool, &unlocked, group[2]).await?;
        took[2] = started.elapsed().as_secs_f64();
        let started = Instant::now();
        confirm_with_bare_insert(pool, group[3]).await?;
        took[3] = started.elapsed().as_secs_f64();
        // The first 20 rounds warm every path up.
        if i >= 20 {
            for (variant, t) in took.iter().enumerate() {
                samples[variant].push(*t);
            }
        }
    }
    let [with, without, with_unlocked, floor] = &mut samples;
    let (p50_with, p50_without) = (percentile(with, 0.5), percentile(without, 0.5));
    let (p50_unlocked, p50_floor) = (percentile(with_unlocked, 0.5), percentile(floor, 0.5));
    f.set("append_overhead", p50_with / p50_without);
    f.set("append_vs_floor", p50_with / p50_floor);
    f.set("confirm_p50_ms_with_append", p50_with * 1e3);
    f.set("confirm_p99_ms_with_append", percentile(with, 0.99) * 1e3);
    f.set("confirm_p50_ms_with_append_unlocked", p50_unlocked * 1e3);
    f.set("confirm_p50_ms_with_bare_insert", p50_floor * 1e3);
    f.set("confirm_p99_ms_with_bare_insert", percentile(floor, 0.99) * 1e3);
    f.set("confirm_p50_ms_without_append", p50_without * 1e3);
    f.set("aggregate_lock_ms", (p50_with - p50_unlocked) * 1e3);
    f.set("confirms_measured", with.len());
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    sqlx::query("DROP TABLE bench_floor").execute(pool).await?;
    Ok(())
}

/// The confirm transaction with the event written by a bare `INSERT` of the same row into
/// `bench_floor`: what appending costs with no outbox machinery at all.
async fn confirm_with_bare_insert(pool: &PgPool, order_id: Uuid) -> Result<(), Failure> {
    let mut tx = pool.begin().await?;
    let row: Option<(i64, i64, String, Value)> =
        sqlx::query_as(orders::CONFIRM).bind(order_id).fetch_optional(&mut *tx).await?;
    let Some((version, total_cents, currency, payment)) = row else {
        return Err(format!("order {order_id} was not pending").into());
    };
    let event = OrderConfirmed {
        order_id,
        total_cents,
        currency,
        payment: serde_json::from_value(payment)?,
        note: None,
    };
    sqlx::query(
        "INSERT INTO bench_floor (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, \
                                  schema_version, topic, payload, headers) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8::json, $9::jsonb)",
    )
    .bind(Uuid::now_v7())
    .bind(OrderConfirmed::AGGREGATE_TYPE)
    .bind(order_id.to_string())
    .bind(version)
    .bind(OrderConfirmed::EVENT_TYPE)
    .bind(i32::try_from(OrderConfirmed::SCHEMA_VERSION)?)
    .bind(OrderConfirmed::TOPIC)
    .bind(serde_json::to_string(&event)?)
    .bind("{}")
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}
