//! Metrics against a known state, read through a debugging recorder installed for this
//! test binary.

use std::time::Duration;

use outbox_runtime::relay::{Relay, RelayConfig};
use outbox_runtime::{AppendOptions, NewEvent};
use outbox_tests::kafka::Kafka;
use outbox_tests::metrics_kit::{snapshot, snapshotter};
use outbox_tests::{eventually, migrate, rows_in, Step};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

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
    migrate(&pool).await;
    // A capacity of 10 unpublished rows, so the forecast gauges are set too.
    let outbox = outbox_runtime::Outbox::new(
        outbox_runtime::OutboxConfig::default().capacity(outbox_runtime::Capacity::Rows(10)),
    )
    .expect("outbox");
    append(&pool, "gauge", 3).await;
    sqlx::query("UPDATE outbox SET created_at = now() - interval '10 seconds'")
        .execute(&pool)
        .await
        .expect("age");
    let status = outbox.ops().record_gauges(&pool).await.expect("gauges");
    assert_eq!((status.pending, status.failed), (3, 0));
    let metrics = snapshot();
    assert_eq!(metrics["outbox_pending"], [3.0], "3 pending events");
    assert_eq!(metrics["outbox_failed"], [0.0]);
    let age = &metrics["outbox_oldest_unpublished_age_seconds"];
    assert!(age.len() == 1 && age[0] >= 10.0 && age[0] < 60.0, "oldest is 10 s old: {age:?}");
    // 3 appended in the 5-minute window, none published: 3 of 10 rows, growing 0.01/s,
    // full in 700 s.
    assert_eq!(metrics["outbox_capacity_used_ratio"], [0.3]);
    let to_full = metrics["outbox_capacity_seconds_to_full"][0];
    assert!((to_full - 700.0).abs() < 1e-6, "{to_full}");
    assert!((metrics["outbox_appended_per_second"][0] * 300.0 - 3.0).abs() < 1e-9);
    assert!(metrics["outbox_table_bytes"][0] > 8192.0, "{:?}", metrics["outbox_table_bytes"]);
    assert_eq!(metrics["outbox_dead_tuples"].len(), 1);
    // This test database's outbox was never vacuumed nor analysed (autovacuum may be off):
    // the lag reads +Inf, so that an alert on it fires; after ANALYZE it is a few seconds.
    let gauges = outbox.ops().record_gauges(&pool).await.expect("gauges");
    if gauges.seconds_since_analyze.is_none() {
        assert_eq!(snapshot()["outbox_seconds_since_analyze"], [f64::INFINITY]);
    }
    sqlx::query("VACUUM ANALYZE outbox").execute(&pool).await.expect("vacuum analyze");
    let gauges = outbox.ops().record_gauges(&pool).await.expect("gauges");
    let metrics = snapshot();
    for name in ["outbox_seconds_since_analyze", "outbox_seconds_since_vacuum"] {
        let lag = metrics[name][0];
        assert!((0.0..60.0).contains(&lag), "{name} {lag} right after VACUUM ANALYZE");
    }
    assert_eq!(metrics["outbox_modified_since_analyze"], [gauges.modified_since_analyze as f64]);
    assert_eq!((gauges.pending, gauges.retrying, gauges.failed), (3, 0, 0));

    // A topic of this test's own: a broker process (KAFKA_BROKERS) keeps the records other
    // tests wrote to the steps' topic, and the consumer below would count them too (it did,
    // once the change-data-capture tests ran before it).
    let topic = format!("outbox-test-metrics-{}", uuid::Uuid::new_v4().simple());
    let kafka = Kafka::start();
    kafka.create_topic(&topic, 1).await;
    append(&pool, &format!("metrics-{}", uuid::Uuid::new_v4()), 4).await;
    sqlx::query("UPDATE outbox SET topic = $1").bind(&topic).execute(&pool).await.expect("topic");
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
    assert_eq!(metrics["outbox_publish_attempts"], [1.0; 7], "each went out at its first attempt");
    assert_eq!(metrics["outbox_republished_total"], [0.0], "nothing was sent twice");
    // The relay set its pool's gauges at its first lease renewal.
    assert_eq!(metrics["outbox_relay_db_connections_max"], [f64::from(pool.options().get_max_connections())]);
    let in_use = metrics["outbox_relay_db_connections_in_use"][0];
    assert!(in_use >= 1.0 && in_use <= f64::from(pool.options().get_max_connections()), "{in_use}");
    assert_eq!(metrics["outbox_missing_topics"], [0.0], "the topic exists");

    // A consumer reads the 7 events: its lag per partition reaches 0 once it has committed.
    let inbox = outbox_runtime::inbox::Inbox::new(
        pool.clone(),
        outbox_runtime::inbox::InboxConfig::new("metrics", kafka.bootstrap(), [topic.as_str()])
            .commit_interval(Duration::from_millis(100)),
        outbox_runtime::inbox::Handlers::new().ignore("test.step"),
    )
    .expect("inbox");
    inbox.migrator().run(&pool).await.expect("inbox tables");
    let stats = inbox.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(inbox.run(stop.clone()));
    assert!(eventually(Duration::from_secs(30), || async { stats.ignored() == 7 }).await);
    // Taken before the lag is polled: a snapshot drains the counters.
    let metrics = snapshot();
    assert_eq!(metrics["inbox_messages_total{consumer=metrics,outcome=ignored}"], [7.0]);
    let lag = format!("inbox_consumer_lag{{consumer=metrics,topic={topic},partition=0}}");
    let lag = lag.as_str();
    let mut last = None;
    let caught_up = eventually(Duration::from_secs(30), || {
        let values = snapshot().get(lag).cloned();
        last.clone_from(&values);
        async move { values == Some(vec![0.0]) }
    })
    .await;
    assert!(caught_up, "lag never reported 0, last {last:?}");
    stop.cancel();
    task.await.expect("task").expect("inbox");
}
