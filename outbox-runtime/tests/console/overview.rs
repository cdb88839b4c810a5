//! The overview's inbox consumers: version gaps from the aggregates table (capped), the
//! duplicates absorbed (summed over partitions), and the
//! lag their groups have on the brokers (committed offsets against the partitions' ends),
//! read in the background so that no page waits for a broker.

use std::time::{Duration, Instant};

use outbox_runtime::inbox::{InboxAdmin, LagReader};
use outbox_runtime::rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
use outbox_runtime::rdkafka::mocking::MockCluster;
use outbox_runtime::rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
use outbox_runtime::rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::*;

/// Aggregates of `billing` (gaps 2, 1, 0, 5) and `shipping` (gaps 1).
async fn aggregates_with_gaps(pool: &PgPool) {
    for (consumer, id, gaps) in [
        ("billing", "a1", 2),
        ("billing", "a2", 1),
        ("billing", "a3", 0),
        ("billing", "a4", 5),
        ("shipping", "s1", 1),
    ] {
        sqlx::query(
            "INSERT INTO inbox_aggregates (consumer, topic, aggregate_type, aggregate_id, last_version, gaps) \
             VALUES ($1, 'orders', 'order', $2, 7, $3)",
        )
        .bind(consumer)
        .bind(id)
        .bind(gaps)
        .execute(pool)
        .await
        .expect("aggregate");
    }
}

/// Topic `orders` with 4, 4 and 2 records in partitions 0, 1, 2; group `billing` has
/// committed 2 on partition 0 and 4 on partition 1, nothing on 2: 2 + 0 + 2 behind.
fn produce_and_commit(bootstrap: String) {
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", &bootstrap).create().expect("producer");
    for (partition, n) in [(0, 4), (1, 4), (2, 2)] {
        for i in 0..n {
            let key = format!("k{i}");
            producer
                .send(BaseRecord::to("orders").partition(partition).key(&key).payload("{}"))
                .map_err(|(e, _)| e)
                .expect("send");
        }
    }
    producer.flush(Duration::from_secs(10)).expect("flush");
    let group: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "billing")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut offsets = TopicPartitionList::new();
    offsets.add_partition_offset("orders", 0, Offset::Offset(2)).expect("offset");
    offsets.add_partition_offset("orders", 1, Offset::Offset(4)).expect("offset");
    group.commit(&offsets, CommitMode::Sync).expect("commit");
}

#[sqlx::test(migrations = false)]
async fn the_overview_shows_each_consumers_lag_and_version_gaps(pool: PgPool) {
    seed(&pool).await;
    billing_inbox(&pool).await;
    aggregates_with_gaps(&pool).await;
    // billing absorbed 3 duplicates on one partition and 2 on another; shipping none.
    sqlx::query(
        "INSERT INTO inbox_progress (consumer, topic, kafka_partition, duplicates, last_duplicate_at) \
         VALUES ('billing', 'orders', 0, 3, '2026-12-07 10:00:00+00'), ('billing', 'orders', 1, 2, '2026-12-07 11:00:00+00')",
    )
    .execute(&pool)
    .await
    .expect("duplicates");
    let billing = InboxAdmin::new(pool.clone(), "public", "inbox", "billing").expect("admin");
    let all = billing.summary(100).await.expect("summary");
    assert_eq!((all.version_gaps, all.at_least), (3, false), "{all:?}");
    assert_eq!(all.duplicates, 5, "{all:?}");
    assert_eq!(all.last_duplicate_at.as_deref(), Some("2026-12-07T11:00:00.000000Z"), "{all:?}");
    let capped = billing.summary(2).await.expect("summary");
    assert_eq!((capped.version_gaps, capped.at_least), (2, true), "{capped:?}");

    let kafka = MockCluster::new(1).expect("mock cluster");
    kafka.create_topic("orders", 3, 1).expect("topic");
    let bootstrap = kafka.bootstrap_servers();
    tokio::task::spawn_blocking(move || produce_and_commit(bootstrap)).await.expect("kafka");
    let reader = LagReader::new(kafka.bootstrap_servers());
    let lag = reader.read("billing").await.expect("lag");
    let parts: Vec<_> = lag.partitions.iter().map(|p| (p.partition, p.committed, p.end, p.lag)).collect();
    assert_eq!(parts, [(0, Some(2), 4, 2), (1, Some(4), 4, 0), (2, None, 2, 2)], "{lag:?}");
    assert_eq!((lag.messages, lag.partial), (4, false));
    let none = reader.read("shipping").await.expect("lag");
    assert_eq!((none.messages, none.partitions.len()), (0, 0), "a group that never committed: {none:?}");
    let bad = LagReader::new("127.0.0.1:1").set("group.id", "other");
    assert!(
        matches!(bad.read("billing").await, Err(outbox_runtime::Error::Config(m)) if m.contains("group.id"))
    );

    let (addr, stop) = serve(
        &pool,
        ConsoleConfig::default().inbox("public", "inbox").lag(LagReader::new(kafka.bootstrap_servers())),
    )
    .await;
    // The first page does not wait for the broker; a later one shows what was read.
    let deadline = Instant::now() + Duration::from_secs(20);
    let overview = loop {
        let body = get(addr, "/?format=json").await.body;
        let overview: serde_json::Value = serde_json::from_str(&body).expect("json");
        if overview["consumers"][0]["lag"]["messages"].is_i64() || Instant::now() > deadline {
            break overview;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let consumers = overview["consumers"].as_array().unwrap_or_else(|| panic!("consumers: {overview}"));
    let row = |name: &str| consumers.iter().find(|c| c["consumer"] == name).expect(name).clone();
    assert_eq!(row("billing")["lag"]["messages"], 4, "{overview}");
    assert_eq!(row("billing")["lag"]["partitions"], 3, "{overview}");
    assert_eq!(row("billing")["version_gaps"], 3, "{overview}");
    assert_eq!(row("shipping")["version_gaps"], 1, "{overview}");
    assert_eq!(
        (row("billing")["duplicates"].clone(), row("shipping")["duplicates"].clone()),
        (5.into(), 0.into())
    );
    assert_eq!(row("shipping")["lag"]["partitions"], 0, "{overview}");
    let page = get(addr, "/").await.body;
    assert!(page.contains("Version gaps") && page.contains("no commits"), "{page}");
    assert!(page.contains("Duplicates") && page.contains("last at 2026-12-07T11:00:00"), "{page}");
    stop.cancel();

    // Without brokers the page says where the lag would come from.
    let (addr, stop) = serve(&pool, ConsoleConfig::default().inbox("public", "inbox")).await;
    let overview: serde_json::Value =
        serde_json::from_str(&get(addr, "/?format=json").await.body).expect("json");
    assert!(overview["consumers"][0]["lag"].is_null(), "{overview}");
    assert!(get(addr, "/").await.body.contains("--brokers"));
    stop.cancel();
}

/// Events in flight, as the relays report them: summed over the reports that stand (the
/// live relay's), per topic and per relay; a report that lapsed (a relay that died) and a
/// relay that never reported count nothing and show no figure.
#[sqlx::test(migrations = false)]
async fn the_overview_sums_the_relays_standing_reports_of_events_in_flight(pool: PgPool) {
    seed(&pool).await;
    let (live, dead, silent, idle) =
        (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3), Uuid::from_u128(4));
    for (relay, in_flight, until) in [
        (live, Some(r#"{"orders": 2, "payments": 1}"#), "now() + interval '1 minute'"),
        (dead, Some(r#"{"orders": 7}"#), "now() - interval '1 second'"),
        (silent, None, "NULL"),
        // Nothing in flight needs no refreshing: such a report stands without an end.
        (idle, Some("{}"), "NULL"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO outbox_relays (relay_id, heartbeat_at, in_flight, in_flight_until) \
             VALUES ($1, now(), $2::jsonb, {until})"
        )))
        .bind(relay)
        .bind(in_flight)
        .execute(&pool)
        .await
        .expect("relay");
    }
    let (addr, stop) = serve(&pool, ConsoleConfig::default()).await;
    let overview: serde_json::Value =
        serde_json::from_str(&get(addr, "/?format=json").await.body).expect("json");
    let outbox = &overview["outbox"];
    assert_eq!(outbox["in_flight"]["events"], 3, "{overview}");
    assert_eq!(
        outbox["in_flight"]["by_topic"],
        serde_json::json!({"orders": 2, "payments": 1}),
        "{overview}"
    );
    let relays = outbox["relays"].as_array().expect("relays");
    let of = |id: Uuid| {
        relays.iter().find(|r| r["relay_id"] == id.to_string()).expect("relay")["in_flight"].clone()
    };
    assert_eq!(
        [of(live), of(dead), of(silent), of(idle)],
        [3.into(), serde_json::Value::Null, serde_json::Value::Null, 0.into()]
    );
    let page = get(addr, "/").await.body;
    assert!(page.contains(">in flight</span>") && page.contains("orders 2, payments 1"), "{page}");
    assert!(page.contains("<th scope=\"col\">In flight</th>"), "{page}");
    stop.cancel();
}

/// `outbox console --metrics-addr` serves the console's own metrics: a lag that cannot be
/// read (brokers nobody listens at) is counted there, by stage.
#[sqlx::test(migrations = false)]
async fn the_cli_console_counts_failed_reads_on_its_metrics_address(pool: PgPool) {
    seed_both(&pool).await;
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port");
    let url = common::database_url(&pool);
    let args = ["--inbox-table", "inbox", "--brokers", "127.0.0.1:1", "--metrics-addr", &metrics.to_string()];
    let (running, _stdout, first) = cli_console(&url, &args, &[]);
    let addr: SocketAddr =
        first.trim_start_matches("outbox console: http://").trim_end_matches('/').parse().expect(&first);
    // Each overview asks for the lag (in the background, at most every 5 s).
    let line = "outbox_console_read_errors_total{stage=\"lag\"}";
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut scraped = String::new();
    while Instant::now() < deadline && !scraped.contains(line) {
        assert_eq!(get(addr, "/").await.status, 200);
        tokio::time::sleep(Duration::from_millis(500)).await;
        scraped = get(metrics, "/metrics").await.body;
    }
    let stderr = running.stop();
    assert!(scraped.contains(line), "{scraped}\n{stderr}");
    assert!(stderr.contains("cannot read the consumer's lag"), "logged too: {stderr}");
}
