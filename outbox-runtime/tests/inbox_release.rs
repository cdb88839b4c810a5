//! An operator's release of a parked message, without Kafka: the reason a message with no
//! handler is parked with, and the counters a release moves.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use outbox_runtime::inbox::{EventHandler, HandlerError, Handlers, Inbox, InboxConfig, Meta};
use outbox_runtime::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.confirmed", schema_version = 1, aggregate = "order", topic = "orders")]
struct OrderConfirmed {
    #[outbox(aggregate_id)]
    order_id: String,
}

/// Fails for good while `failing` is set, then applies.
#[derive(Clone, Default)]
struct Flaky {
    failing: Arc<AtomicBool>,
}

impl EventHandler<OrderConfirmed> for Flaky {
    async fn handle(
        &self,
        _: &mut sqlx::PgConnection,
        _: OrderConfirmed,
        _: &Meta,
    ) -> Result<(), HandlerError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(HandlerError::permanent("ledger closed"));
        }
        Ok(())
    }
}

/// An inbox of consumer `billing` with `handlers`, migrated, and one parked message of
/// `event_type` at `version` (its CloudEvents headers as the relay writes them).
async fn parked_one(pool: &PgPool, handlers: Handlers, event_type: &str, version: u32) -> Inbox {
    let inbox = Inbox::new(pool.clone(), InboxConfig::new("billing", "127.0.0.1:1", ["orders"]), handlers)
        .expect("inbox");
    inbox.migrator().run(pool).await.expect("migrate");
    let headers = serde_json::json!({
        "ce_specversion": "1.0", "ce_id": uuid::Uuid::now_v7().to_string(), "ce_type": event_type,
        "ce_source": "/tests", "ce_schemaversion": version.to_string(), "ce_aggregatetype": "order",
        "ce_subject": "o-1",
    });
    sqlx::query(
        "INSERT INTO inbox_parked (consumer, topic, kafka_partition, kafka_offset, record_key, headers, payload, status, reason) \
         VALUES ('billing', 'orders', 0, 0, 'o-1', $1, '{\"order_id\":\"o-1\"}', 'parked', 'handler failed: ledger closed')",
    )
    .bind(headers)
    .execute(pool)
    .await
    .expect("park");
    inbox
}

/// "no handler" names `Handlers::ignore` for that type and lists what is registered.
#[sqlx::test(migrations = false)]
async fn no_handler_names_handlers_ignore_and_the_registered_types(pool: PgPool) {
    let handlers = Handlers::new().on::<OrderConfirmed, _>(Flaky::default()).ignore("order.placed");
    let inbox = parked_one(&pool, handlers, "invoice.issued", 2).await;
    let released = inbox.retry_parked(1).await.expect("retry");
    let expected = "no handler for event type invoice.issued version 2 (this consumer handles order.confirmed v1; \
                    ignores order.placed): to skip it on purpose, add `Handlers::ignore(\"invoice.issued\")`; \
                    to apply it, register a handler with `Handlers::on`";
    assert_eq!(released.parked_again.as_deref(), Some(expected));
    let stored: String = sqlx::query_scalar("SELECT reason FROM inbox_parked WHERE id = 1")
        .fetch_one(&pool)
        .await
        .expect("reason");
    assert_eq!(stored, expected);
}

/// The list stays bounded however many types are registered.
#[sqlx::test(migrations = false)]
async fn the_no_handler_reason_is_bounded(pool: PgPool) {
    let mut handlers = Handlers::new();
    for i in 0..1000 {
        handlers = handlers.on_type::<OrderConfirmed, _>(
            &format!("type.{i:04}.{}", "x".repeat(100)),
            1,
            Flaky::default(),
        );
    }
    let inbox = parked_one(&pool, handlers, "invoice.issued", 2).await;
    let reason = inbox.retry_parked(1).await.expect("retry").parked_again.expect("parked");
    assert!(reason.len() < 4096, "{}", reason.len());
    assert!(
        reason.contains("and 980 more") && reason.contains("Handlers::ignore(\"invoice.issued\")"),
        "{reason}"
    );
}

/// A message an operator released and applied counts as applied, as one the consumer
/// read does (before, `InboxStats::applied` missed it).
#[sqlx::test(migrations = false)]
async fn a_released_message_counts_in_the_stats(pool: PgPool) {
    let flaky = Flaky::default();
    flaky.failing.store(true, Ordering::SeqCst);
    let inbox =
        parked_one(&pool, Handlers::new().on::<OrderConfirmed, _>(flaky.clone()), "order.confirmed", 1).await;
    let stats = inbox.stats();
    let again = inbox.retry_parked(1).await.expect("retry");
    assert!(again.parked_again.is_some_and(|r| r.contains("ledger closed")));
    assert_eq!((stats.applied(), stats.parked()), (0, 1), "parked again: counted as parked");
    flaky.failing.store(false, Ordering::SeqCst);
    let released = inbox.retry_parked(1).await.expect("retry");
    assert_eq!((released.applied, released.parked_again), (1, None));
    assert_eq!(stats.applied(), 1, "applied by a release");
}
