//! Events in flight: claimed by a relay (or streamed to the change-data-capture relay) and
//! not yet recorded. A claim writes nothing to a row, so the overview reads each relay's
//! own count, per topic, from its row of the relays table: counted from the claim until
//! the mark, in all three relay models, summed over the relays whose report stands; a
//! relay that dies stops counting once its last report lapses, while its rows stay
//! pending for the others.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use outbox_runtime::ops::Overview;
use outbox_runtime::relay::{ClaimMode, Relay};
use outbox_runtime::{AppendOptions, CancellationToken, NewEvent, Outbox, OutboxEvent};
use outbox_tests::cdc_kit::{self, Slot};
use outbox_tests::kafka::Kafka;
use outbox_tests::running::{quick, start, Running};
use outbox_tests::{database_url, eventually, migrate, rows_in};
use schemars::JsonSchema;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "test.flight_a",
    schema_version = 1,
    aggregate = "test",
    topic = "outbox-test-flight-a"
)]
struct ToA {
    #[outbox(aggregate_id)]
    id: String,
}

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "test.flight_b",
    schema_version = 1,
    aggregate = "test",
    topic = "outbox-test-flight-b"
)]
struct ToB {
    #[outbox(aggregate_id)]
    id: String,
}

const A: &str = ToA::TOPIC;
const B: &str = ToB::TOPIC;

/// Three events to topic A and two to B, each its own aggregate, in one transaction (as
/// appended: the change-data-capture relay publishes the row its stream carries).
async fn append(pool: &PgPool, outbox: &Outbox) {
    let id = |i: usize| format!("flight-{i}-{}", Uuid::new_v4());
    let mut events = Vec::new();
    for i in 0..3 {
        events.push(NewEvent::new(&ToA { id: id(i) }, AppendOptions::default()).expect("event"));
    }
    for i in 3..5 {
        events.push(NewEvent::new(&ToB { id: id(i) }, AppendOptions::default()).expect("event"));
    }
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &events).await.expect("append");
    tx.commit().await.expect("commit");
}

fn all_five() -> BTreeMap<String, i64> {
    BTreeMap::from([(A.to_owned(), 3), (B.to_owned(), 2)])
}

async fn overview(pool: &PgPool, outbox: &Outbox) -> Overview {
    outbox.ops().overview(pool, 1000).await.expect("overview")
}

/// Reads the overview until `check` holds (true, and that overview) or `timeout` passes
/// (false, and the last one read).
async fn overview_until(
    pool: &PgPool,
    outbox: &Outbox,
    timeout: Duration,
    check: impl Fn(&Overview) -> bool,
) -> (bool, Overview) {
    let deadline = Instant::now() + timeout;
    loop {
        let now = overview(pool, outbox).await;
        if check(&now) || Instant::now() >= deadline {
            return (check(&now), now);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the overview shows the five in flight, per topic, and on one relay (`relay`,
/// when given).
fn shows_five(overview: &Overview, relay: Option<Uuid>) -> bool {
    overview.in_flight.events == 5
        && overview.in_flight.by_topic == all_five()
        && overview.relays.iter().any(|r| {
            r.relay_id.is_some() && relay.is_none_or(|id| r.relay_id == Some(id)) && r.in_flight == Some(5)
        })
}

/// With the broker down, the relay `running` (of the model `what`) holds the five in
/// flight; once it is back, they are published and nothing is in flight.
async fn the_broker_down_then_up(
    pool: &PgPool,
    kafka: &Kafka,
    outbox: &Outbox,
    running: Running,
    what: &str,
) {
    let mock = kafka.mock_cluster().expect("mock");
    append(pool, outbox).await;
    let (seen, last) = overview_until(pool, outbox, Duration::from_secs(10), |o| shows_five(o, None)).await;
    assert!(seen, "{what}: the five unacknowledged events in flight, per topic and on the relay: {last:#?}");
    assert_eq!(running.stats.in_flight(), 5, "{what}");
    let by_topic: BTreeMap<String, i64> =
        running.stats.in_flight_by_topic().into_iter().map(|(t, n)| (t, n as i64)).collect();
    assert_eq!(by_topic, all_five(), "{what}");
    // A claim changes no row: they are pending all the while, and counted there too.
    assert_eq!(rows_in(pool, "pending").await, 5, "{what}");

    mock.broker_up(1).expect("broker up");
    assert!(
        eventually(Duration::from_secs(30), || async { rows_in(pool, "published").await == 5 }).await,
        "{what}: published once the broker is back"
    );
    let (settled, last) = overview_until(pool, outbox, Duration::from_secs(10), |o| {
        o.in_flight.events == 0
            && o.in_flight.by_topic.is_empty()
            && o.relays.iter().filter(|r| r.relay_id.is_some()).all(|r| r.in_flight == Some(0))
    })
    .await;
    assert!(settled, "{what}: nothing in flight once marked, the relay's report says 0: {last:#?}");
    assert_eq!(running.stats.in_flight(), 0, "{what}");
    running.shutdown().await;
    let relays: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_relays").fetch_one(pool).await.expect("relays");
    assert_eq!(relays, 0, "{what}: a relay that stops takes its row, and its report, with it");
}

async fn broker_down(pool: &PgPool) -> (Kafka, Outbox) {
    let kafka = Kafka::mock();
    for topic in [A, B] {
        kafka.create_topic(topic, 3).await;
    }
    let outbox = migrate(pool).await;
    kafka.mock_cluster().expect("mock").broker_down(1).expect("broker down");
    (kafka, outbox)
}

/// A batch stays unacknowledged (not yet scheduled for a retry) for seconds while the
/// broker is down; the relay reports every 2 s, each report standing 6 s.
fn slow(kafka: &Kafka) -> outbox_runtime::relay::RelayConfig {
    quick(kafka).message_timeout(Duration::from_secs(5)).lease_ttl(Duration::from_secs(12))
}

#[sqlx::test(migrations = false)]
async fn leasing_relays_count_a_batch_in_flight_from_its_claim_to_its_mark(pool: PgPool) {
    let (kafka, outbox) = broker_down(&pool).await;
    let running = start(&pool, &outbox, slow(&kafka));
    the_broker_down_then_up(&pool, &kafka, &outbox, running, "lease").await;
}

#[sqlx::test(migrations = false)]
async fn relays_holding_locks_count_a_batch_in_flight_until_its_transaction_ends(pool: PgPool) {
    let (kafka, outbox) = broker_down(&pool).await;
    let running = start(&pool, &outbox, slow(&kafka).claim_mode(ClaimMode::HoldLocks));
    the_broker_down_then_up(&pool, &kafka, &outbox, running, "hold_locks").await;
}

/// The stream's events are in flight from the stream until marked, through the retries the
/// broker's outage causes; the table path's relay reports them with its own.
#[tokio::test]
async fn the_change_data_capture_relay_counts_streamed_events_in_flight() {
    let pool = cdc_kit::database().await;
    let (kafka, outbox) = broker_down(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    let running = slot.start(&pool, &outbox, slow(&kafka));
    // Streaming before the appends: the stream, not the table path, takes them.
    assert!(
        eventually(Duration::from_secs(10), || async {
            sqlx::query_scalar::<_, bool>("SELECT active FROM pg_replication_slots WHERE slot_name = $1")
                .bind(slot.name())
                .fetch_one(&pool)
                .await
                .expect("slot")
        })
        .await,
        "streaming"
    );
    the_broker_down_then_up(&pool, &kafka, &outbox, running, "cdc").await;
}

/// A relay that dies (its process gone: here its runtime, with every task of it) leaves
/// its row and its last report; the overview stops counting that report once it lapses (a
/// few report intervals), while the heartbeat row stays for the operator to see.
#[sqlx::test(migrations = false)]
async fn a_dead_relays_events_stop_counting_once_its_report_lapses(pool: PgPool) {
    let (kafka, outbox) = broker_down(&pool).await;
    append(&pool, &outbox).await;
    let url = database_url(&pool);
    let config = slow(&kafka);
    let process =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("rt");
    let (id_tx, id_rx) = tokio::sync::oneshot::channel();
    let relay_outbox = outbox.clone();
    process.spawn(async move {
        // A pool of its own: connections belong to the runtime that opened them.
        let pool = PgPool::connect(&url).await.expect("connect");
        let relay = Relay::new(pool, relay_outbox, config).expect("relay");
        let _ = id_tx.send(relay.id());
        relay.run(CancellationToken::new()).await
    });
    let dead = id_rx.await.expect("relay id");
    let (seen, last) =
        overview_until(&pool, &outbox, Duration::from_secs(10), |o| shows_five(o, Some(dead))).await;
    assert!(seen, "in flight before it dies: {last:#?}");
    process.shutdown_background();
    let (lapsed, last) = overview_until(&pool, &outbox, Duration::from_secs(15), |o| {
        o.in_flight.events == 0
            && o.relays
                .iter()
                .any(|r| r.relay_id == Some(dead) && r.in_flight.is_none() && r.heartbeat_at.is_some())
    })
    .await;
    assert!(lapsed, "a dead relay's report lapses; its row stays: {last:#?}");
    assert_eq!(rows_in(&pool, "pending").await, 5, "its rows are pending, for the next relay");
}
