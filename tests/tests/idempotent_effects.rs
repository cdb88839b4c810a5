//! Effects outside the database (the example's payment capture, `examples/src/payments.rs`):
//! a gateway call that succeeded before its transaction rolled back is repeated with the
//! same `Meta::idempotency_key`, so each order is captured once; a replay appends no second
//! intent; a declined payment is parked with its reason. Run through the testing harness,
//! which must also wait for the intents the handlers append while it settles.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_examples::events::OrderConfirmed;
use outbox_examples::orders::{self, Confirmed};
use outbox_examples::payments::{Capture, CaptureRequested, Gateway, GatewayError, RequestCapture};
use outbox_runtime::inbox::{Handlers, Inbox, InboxConfig, IDEMPOTENCY_NAMESPACE};
use outbox_runtime::ops::ReplayFilter;
use outbox_runtime::relay::{Relay, RelayConfig};
use outbox_runtime::testing::{EmbeddedKafka, Harness};
use outbox_runtime::{Error, Outbox, OutboxEvent};
use outbox_tests::{migrate, sample_order};
use sqlx::PgPool;
use uuid::Uuid;

/// A gateway that captures once per key, and can lose its reply after capturing (the
/// caller sees a timeout and its transaction rolls back) or decline an order.
#[derive(Clone, Default)]
struct FakeGateway(Arc<Mutex<State>>);

#[derive(Default)]
struct State {
    calls: Vec<Uuid>,
    /// Key to the order captured under it.
    captured: BTreeMap<Uuid, Uuid>,
    lose_replies: usize,
    decline: BTreeSet<Uuid>,
}

impl FakeGateway {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Gateway for FakeGateway {
    async fn capture(&self, key: Uuid, order_id: Uuid, _: i64, _: &str) -> Result<(), GatewayError> {
        let mut state = self.state();
        state.calls.push(key);
        if state.decline.contains(&order_id) {
            return Err(GatewayError::Declined("card declined".into()));
        }
        state.captured.entry(key).or_insert(order_id);
        if state.lose_replies > 0 {
            state.lose_replies -= 1;
            return Err(GatewayError::Unavailable("timed out after capturing".into()));
        }
        Ok(())
    }
}

fn inbox(pool: &PgPool, kafka: &EmbeddedKafka, consumer: &str, topic: &str, handlers: Handlers) -> Inbox {
    let config = InboxConfig::new(consumer, kafka.bootstrap(), [topic])
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .shutdown_timeout(Duration::from_secs(2));
    Inbox::new(pool.clone(), config, handlers).expect("inbox")
}

async fn confirmed_order(pool: &PgPool, outbox: &Outbox) -> Uuid {
    let order = orders::place(pool, outbox, &sample_order()).await.expect("place");
    assert!(matches!(orders::confirm(pool, outbox, order).await.expect("confirm"), Confirmed::Now { .. }));
    order
}

#[sqlx::test(migrations = false)]
async fn each_order_is_captured_once_under_its_idempotency_key(pool: PgPool) {
    let outbox = migrate(&pool).await;
    // A mock cluster of its own: `orders` on a shared broker holds other tests' orders.
    let kafka = EmbeddedKafka::start().expect("broker");
    for topic in [OrderConfirmed::TOPIC, CaptureRequested::TOPIC] {
        kafka.create_topic(topic, 3).await.expect("topic");
    }
    let gateway = FakeGateway::default();
    gateway.state().lose_replies = 3;
    let payments = inbox(
        &pool,
        &kafka,
        "payments",
        OrderConfirmed::TOPIC,
        Handlers::new()
            .on::<OrderConfirmed, _>(RequestCapture { outbox: outbox.clone() })
            .ignore("order.placed"),
    );
    let capture = inbox(
        &pool,
        &kafka,
        "payment-capture",
        CaptureRequested::TOPIC,
        Handlers::new().on::<CaptureRequested, _>(Capture { gateway: gateway.clone() }),
    );
    payments.migrator().run(&pool).await.expect("inbox migrations");
    let relay = Relay::new(
        pool.clone(),
        outbox.clone(),
        RelayConfig::new(kafka.bootstrap()).poll_interval(Duration::from_millis(100)),
    )
    .expect("relay");
    let mut harness = Harness::builder(relay).inbox(payments).inbox(capture).start().expect("harness");

    let mut orders = Vec::new();
    for _ in 0..5 {
        orders.push(confirmed_order(&pool, &outbox).await);
    }
    let settled = harness.settle_within(Duration::from_secs(30)).await.expect("settles");
    // 5 placed and 5 confirmed, then the 5 intents the handler appended while settle waited.
    assert_eq!((settled.published, settled.applied, settled.ignored), (15, 10, 5), "{settled:?}");

    // The keys: the confirmed events' idempotency keys for consumer `payments`.
    let confirmed: Vec<Uuid> =
        sqlx::query_scalar("SELECT event_id FROM outbox WHERE event_type = 'order.confirmed' ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("event ids");
    let expected: BTreeSet<Uuid> = confirmed
        .iter()
        .map(|id| Uuid::new_v5(&IDEMPOTENCY_NAMESPACE, &[b"payments\0".as_slice(), id.as_bytes()].concat()))
        .collect();
    {
        let state = gateway.state();
        let keys: BTreeSet<Uuid> = state.captured.keys().copied().collect();
        assert_eq!(keys, expected, "captured under the events' keys");
        let by_order: BTreeSet<Uuid> = state.captured.values().copied().collect();
        assert_eq!(by_order, orders.iter().copied().collect(), "each order captured, under one key each");
        assert_eq!(state.calls.len(), 8, "3 lost replies were called again with the same key");
    }

    // A replay of the confirmations: absorbed by `payments`, no second intent, no call.
    let replayed = outbox
        .ops()
        .replay(
            &pool,
            &ReplayFilter { event_type: Some("order.confirmed".into()), ..ReplayFilter::default() },
            false,
        )
        .await
        .expect("replay");
    assert_eq!(replayed.matched, 5);
    harness.settle_within(Duration::from_secs(30)).await.expect("settles after the replay");
    let intents: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE event_type = 'payment.capture_requested'")
            .fetch_one(&pool)
            .await
            .expect("count");
    assert_eq!(intents, 5, "a replay appends no second intent");
    assert_eq!(gateway.state().calls.len(), 8, "and calls nobody");

    // A declined payment is parked with its reason, and settle says so.
    let declined = {
        let order = orders::place(&pool, &outbox, &sample_order()).await.expect("place");
        gateway.state().decline.insert(order);
        orders::confirm(&pool, &outbox, order).await.expect("confirm");
        order
    };
    let error = harness.settle_within(Duration::from_secs(30)).await.expect_err("a parked capture");
    let Error::NotSettled { waiting, .. } = &error else { panic!("{error:?}") };
    assert!(waiting.contains("was parked by inbox `payment-capture`"), "{error}");
    assert!(waiting.contains(&format!("payment declined for order {declined}: card declined")), "{error}");
    let _ = harness.stop().await;
}
