//! Metrics against a known state, read through a debugging recorder installed for this
//! test binary.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use outbox_runtime::relay::{Relay, RelayConfig};
use outbox_runtime::{AppendOptions, NewEvent};
use outbox_tests::kafka::Kafka;
use outbox_tests::{eventually, migrate, rows_in, Step};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("the only recorder of this test binary");
        snapshotter
    })
}

/// One snapshot (taking it drains the histograms), by metric name: gauges and counters as
/// one number, histograms as their samples.
fn snapshot() -> std::collections::BTreeMap<String, Vec<f64>> {
    let mut by_name: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for (key, _, _, value) in snapshotter().snapshot().into_vec() {
        let values = by_name.entry(key.key().name().to_owned()).or_default();
        match value {
            DebugValue::Gauge(g) => values.push(g.into_inner()),
            #[allow(clippy::cast_precision_loss)]
            DebugValue::Counter(c) => values.push(c as f64),
            DebugValue::Histogram(h) => values.extend(h.into_iter().map(|v| v.into_inner())),
        }
    }
    by_name
}

async fn append(pool: &PgPool, id: &str, n: i64) {
    let outbox = outbox_runtime::Outbox::default_ref();
    let events: Vec<NewEvent> = (1..=n)
        .map(|k| {
            NewEvent::new(&Step { id: id.into(), n: k, data: String::new() }, AppendOptions::default())
                .expect("event")
        })
        .collect();
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &events).await.expect("append");
    tx.commit().await.expect("commit");
}

// One test: the recorder is global to this binary, and two tests at once would mix their
// gauges.
#[sqlx::test(migrations = false)]
async fn gauges_match_a_known_state_and_the_relay_counts_what_it_publishes(pool: PgPool) {
    snapshotter();
    let outbox = migrate(&pool).await;
    append(&pool, "gauge", 3).await;
    sqlx::query("UPDATE outbox SET created_at = now() - interval '10 seconds'")
        .execute(&pool)
        .await
        .expect("age");
    let status = outbox.record_gauges(&pool).await.expect("gauges");
    assert_eq!((status.pending, status.failed), (3, 0));
    let metrics = snapshot();
    assert_eq!(metrics["outbox_pending"], [3.0], "3 pending events");
    assert_eq!(metrics["outbox_failed"], [0.0]);
    let age = &metrics["outbox_oldest_unpublished_age_seconds"];
    assert!(age.len() == 1 && age[0] >= 10.0 && age[0] < 60.0, "oldest is 10 s old: {age:?}");

    let kafka = Kafka::start();
    kafka.create_topic("outbox-test-steps", 1).await;
    append(&pool, &format!("metrics-{}", uuid::Uuid::new_v4()), 4).await;
    let relay = Relay::new(
        pool.clone(),
        outbox,
        RelayConfig::new(kafka.bootstrap()).poll_interval(Duration::from_millis(100)),
    )
    .expect("relay");
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    assert!(eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 7 }).await);
    stop.cancel();
    task.await.expect("task").expect("relay");
    let metrics = snapshot();
    assert_eq!(metrics["outbox_published_total"], [7.0]);
    let latencies = &metrics["outbox_created_to_published_seconds"];
    assert_eq!(latencies.len(), 7, "{latencies:?}");
    assert_eq!(
        latencies.iter().filter(|s| **s >= 10.0).count(),
        3,
        "the three old events waited 10 s and more"
    );
    assert!(!metrics["outbox_relay_batch_seconds"].is_empty());
}
