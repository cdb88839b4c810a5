//! The relay under faults, against real PostgreSQL and a Kafka-protocol broker: a broker
//! down, retriable produce errors, a record too large, appends racing to commit, marks that
//! fail, a missing topic. Each test names the fault and the invariant; those that need
//! fault injection run on a mock cluster of their own whatever `KAFKA_BROKERS` says.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_runtime::{AppendOptions, NewEvent};
use outbox_tests::kafka::Kafka;
use outbox_tests::relay_kit::{append_steps, has_all, records_for, TOPIC};
use outbox_tests::running::{quick, start};
use outbox_tests::{eventually, migrate, rows_in, Step};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use sqlx::PgPool;
use uuid::Uuid;

#[sqlx::test(migrations = false)]
async fn mock_broker_down_marks_nothing_early_backs_off_then_publishes_all(pool: PgPool) {
    // Fault: the only broker is down for ~7 s. Invariants 3 (published_at only after the
    // ack) and 6 (transient errors back off exponentially and keep the row pending).
    let kafka = Kafka::mock();
    let mock = kafka.mock_cluster().expect("mock");
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.extend(append_steps(&pool, &outbox, &format!("down-{i}"), 2, "x").await);
    }
    mock.broker_down(1).expect("broker down");
    let relay = start(
        &pool,
        &outbox,
        quick(&kafka).message_timeout(Duration::from_millis(400)).lease_ttl(Duration::from_secs(3)),
    );

    // Watch one head row: each new attempt shows the delay chosen before the next one.
    let mut delays_by_attempt: BTreeMap<i32, f64> = BTreeMap::new();
    let watch_until = std::time::Instant::now() + Duration::from_secs(7);
    while std::time::Instant::now() < watch_until {
        let (attempts, wait): (i32, f64) = sqlx::query_as(
            "SELECT attempts, CASE WHEN attempts > 0 THEN EXTRACT(EPOCH FROM next_attempt_at - now())::float8 ELSE 0 END \
             FROM outbox WHERE aggregate_id = 'down-0' ORDER BY id LIMIT 1",
        )
        .fetch_one(&pool)
        .await
        .expect("row");
        if attempts > 0 {
            delays_by_attempt.entry(attempts).or_insert(wait);
        }
        assert_eq!(
            rows_in(&pool, "published").await,
            0,
            "nothing is marked published while the broker is down"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
            .fetch_one(&pool)
            .await
            .expect("count"),
        0
    );
    // The error names where it went (before, "Local: Message timed out" alone).
    let last_error: Option<String> =
        sqlx::query_scalar("SELECT last_error FROM outbox WHERE aggregate_id = 'down-0' ORDER BY id LIMIT 1")
            .fetch_one(&pool)
            .await
            .expect("last error");
    assert!(last_error.as_deref().is_some_and(|e| e.contains(&format!("(topic {TOPIC})"))), "{last_error:?}");
    mock.broker_up(1).expect("broker up");
    assert!(
        eventually(Duration::from_secs(40), || async { rows_in(&pool, "published").await == 10 }).await,
        "all published after recovery"
    );
    relay.shutdown().await;

    // base 200 ms, equal jitter: attempt 1 waits 100-200 ms, attempt 3 waits 400-800 ms.
    eprintln!("observed delays by attempt: {delays_by_attempt:?}");
    let first = delays_by_attempt.get(&1).copied().expect("a first failed attempt was seen");
    assert!(first <= 0.25, "first retry delay {first}");
    let later = delays_by_attempt
        .range(3..)
        .next()
        .map(|(_, d)| *d)
        .expect("a third attempt happened during the outage");
    assert!(later > 0.3 && later > first, "delays grow: {delays_by_attempt:?}");
    assert!(relay_attempts_bounded(&pool).await, "attempts stay few during the outage");
    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    assert!(has_all(&ids)(&records));
}

async fn relay_attempts_bounded(pool: &PgPool) -> bool {
    let max: i32 = sqlx::query_scalar("SELECT max(attempts) FROM outbox").fetch_one(pool).await.expect("max");
    // 7 s down: librdkafka reports timeouts about once a second, and delays grow.
    (2..=8).contains(&max)
}

#[sqlx::test(migrations = false)]
async fn mock_retriable_produce_errors_are_retried_without_duplicates(pool: PgPool) {
    // Fault: the broker answers Produce with retriable errors (not enough replicas, leader
    // moved). Invariant 3: rows are marked only once acknowledged; the idempotent producer
    // retries without writing twice.
    let kafka = Kafka::mock();
    let mock = kafka.mock_cluster().expect("mock");
    kafka.create_topic(TOPIC, 1).await;
    let outbox = migrate(&pool).await;
    let ids = append_steps(&pool, &outbox, "retriable", 4, "x").await;
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        ],
    );
    // A deadline the retries cannot reach even on a loaded machine (librdkafka's retries
    // and the leader lookup after NOT_LEADER take about a second): past it the relay purges
    // and publishes again, a duplicate by design, which is not what this test is about.
    let config = quick(&kafka).message_timeout(Duration::from_secs(10)).lease_ttl(Duration::from_secs(30));
    let relay = start(&pool, &outbox, config);
    assert!(eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 4 }).await);
    relay.shutdown().await;
    let records = kafka.read_all(TOPIC, Duration::from_secs(20));
    let versions: Vec<&str> = records.iter().map(|r| r.headers["ce_aggregateversion"].as_str()).collect();
    assert_eq!(versions, ["1", "2", "3", "4"], "each once, in order: {records:?}");
    let event_ids: Vec<String> = records.iter().map(|r| r.headers["ce_id"].clone()).collect();
    assert_eq!(event_ids, ids.iter().map(Uuid::to_string).collect::<Vec<_>>());
}

#[sqlx::test(migrations = false)]
async fn record_too_large_fails_that_event_and_holds_back_only_its_aggregate(pool: PgPool) {
    // Fault: one record is larger than the producer/broker accepts (message.max.bytes).
    // Invariant 6: that event ends `failed` with its reason, later events of its aggregate
    // stay pending, other aggregates are all published.
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let poisoned = format!("poisoned-{}", Uuid::new_v4());
    let small = |n: i64| {
        NewEvent::new(
            &Step { id: poisoned.clone(), n, data: "s".into() },
            AppendOptions::default().aggregate_version(n),
        )
        .expect("event")
    };
    let big = NewEvent::new(
        &Step { id: poisoned.clone(), n: 2, data: "L".repeat(8_000) },
        AppendOptions::default().aggregate_version(2),
    )
    .expect("event");
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &[small(1), big, small(3)]).await.expect("append");
    tx.commit().await.expect("commit");
    let mut others = Vec::new();
    for i in 0..6 {
        others
            .extend(append_steps(&pool, &outbox, &format!("healthy-{i}-{}", Uuid::new_v4()), 3, "ok").await);
    }

    let relay = start(&pool, &outbox, quick(&kafka).kafka_setting("message.max.bytes", "4096"));
    assert!(
        eventually(Duration::from_secs(30), || async {
            rows_in(&pool, "published").await == 19 && rows_in(&pool, "failed").await == 1
        })
        .await
    );
    // Give the relay a few more rounds: the held-back event must stay pending.
    tokio::time::sleep(Duration::from_secs(1)).await;
    relay.shutdown().await;

    let rows: Vec<(Option<i64>, String, i32, Option<String>)> = sqlx::query_as(
        "SELECT aggregate_version, status, attempts, last_error FROM outbox WHERE aggregate_id = $1 ORDER BY id",
    )
    .bind(&poisoned)
    .fetch_all(&pool)
    .await
    .expect("rows");
    assert_eq!((rows[0].0, rows[0].1.as_str()), (Some(1), "published"));
    assert_eq!((rows[1].0, rows[1].1.as_str(), rows[1].2), (Some(2), "failed", 1));
    let reason = rows[1].3.clone().unwrap_or_default();
    assert!(reason.to_lowercase().contains("too large"), "reason names the cause: {reason}");
    assert_eq!(
        (rows[2].0, rows[2].1.as_str(), rows[2].2),
        (Some(3), "pending", 0),
        "held back, never attempted"
    );
    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    assert!(has_all(&others)(&records), "every other aggregate is published");
    let poisoned_versions: Vec<&str> =
        records_for(&records, &poisoned).iter().map(|r| r.headers["ce_aggregateversion"].as_str()).collect();
    assert_eq!(poisoned_versions, ["1"]);
}

/// Fault: two transactions append versions 1 and 2 of one aggregate without locking a row
/// of their own, and the later one tries to commit first while a relay runs. Invariant 13:
/// the toolkit serialises the appends (the second waits for the first), so Kafka carries
/// v1 before v2. Before the fix the second committed first, the relay published v2 at
/// offset 0 and v1 after it, and a consumer marked v1 stale.
#[sqlx::test(migrations = false)]
async fn appends_to_one_aggregate_reach_kafka_in_commit_order_without_caller_locks(pool: PgPool) {
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 1).await;
    let outbox = migrate(&pool).await;
    let relay = start(&pool, &outbox, quick(&kafka));
    let id = format!("unlocked-{}", Uuid::new_v4().simple());
    let step = |n: i64| Step { id: id.clone(), n, data: String::new() };
    let mut first = pool.begin().await.expect("begin");
    outbox
        .append_with(&mut first, &step(1), AppendOptions::default().aggregate_version(1))
        .await
        .expect("append v1");
    let second = {
        let (pool, outbox, event) = (pool.clone(), outbox.clone(), step(2));
        tokio::spawn(async move {
            let mut tx = pool.begin().await.expect("begin");
            outbox
                .append_with(&mut tx, &event, AppendOptions::default().aggregate_version(2))
                .await
                .expect("append v2");
            tx.commit().await.expect("commit v2");
        })
    };
    // Give the second transaction every chance to commit first, and the relay to publish it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    first.commit().await.expect("commit v1");
    second.await.expect("second transaction");
    assert!(eventually(Duration::from_secs(20), || async { rows_in(&pool, "published").await == 2 }).await);
    relay.shutdown().await;
    let records = kafka.read_all(TOPIC, Duration::from_secs(20));
    let versions: Vec<String> = records_for(&records, &id)
        .iter()
        .map(|r| r.headers.get("ce_aggregateversion").cloned().unwrap_or_default())
        .collect();
    assert_eq!(versions, ["1", "2"], "Kafka order follows the aggregate's versions");
}

/// Fault: marks fail (the database turned read-only, as after a failover to a standby)
/// while the broker works. Before the fix the relay claimed the same unmarked batch again
/// at once and republished it in a tight loop until its lease lapsed; now it backs off
/// after each failed mark, and marks the rows once the database takes writes again.
#[sqlx::test(migrations = false)]
async fn failed_marks_back_off_instead_of_republishing_in_a_loop(pool: PgPool) {
    let kafka = Kafka::mock();
    kafka.create_topic(TOPIC, 1).await;
    let outbox = migrate(&pool).await;
    // Read-only while `read_only` has a row: turned off by a DELETE, not by dropping the
    // trigger, whose locks deadlocked with the running relay's (seen in CI on Tansu).
    sqlx::raw_sql(
        "CREATE TABLE read_only (on_since timestamptz); INSERT INTO read_only VALUES (now()); \
         CREATE FUNCTION refuse_marks() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF EXISTS (SELECT 1 FROM read_only) THEN \
             RAISE EXCEPTION 'cannot execute UPDATE in a read-only transaction' USING ERRCODE = '25006'; \
           END IF; RETURN NEW; END $$",
    )
    .execute(&pool)
    .await
    .expect("function");
    sqlx::query(
        "CREATE TRIGGER read_only BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION refuse_marks()",
    )
    .execute(&pool)
    .await
    .expect("trigger");
    let ids = append_steps(&pool, &outbox, "read-only", 3, "x").await;
    let relay =
        start(&pool, &outbox, quick(&kafka).backoff(Duration::from_millis(200), Duration::from_secs(2)));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let sent_while_read_only = kafka.read_all(TOPIC, Duration::from_secs(10)).len();
    sqlx::query("DELETE FROM read_only").execute(&pool).await.expect("writable again");
    let marked =
        eventually(Duration::from_secs(20), || async { rows_in(&pool, "published").await == 3 }).await;
    relay.shutdown().await;
    // 3 rows a try; backing off from 200 ms doubling to 2 s makes at most ~6 tries in 4 s,
    // where a loop makes hundreds.
    assert!(sent_while_read_only <= 3 * 8, "{sent_while_read_only} records sent while marks failed");
    assert!(sent_while_read_only >= 3, "the batch was sent");
    assert!(marked, "marked once the database takes writes");
    assert!(has_all(&ids)(&kafka.read_all(TOPIC, Duration::from_secs(10))));
}

/// Issue 24: the missing-topic clock was each relay's own, so a restart or a takeover
/// started it again and an event whose topic never comes could wait for ever under relays
/// that restart more often than `missing_topic_timeout`. The clock is now in the database:
/// a relay that takes over fails the event when the topic has been missing for the
/// timeout since any relay first found it so.
#[sqlx::test(migrations = false)]
async fn a_restart_does_not_restart_the_missing_topic_clock(pool: PgPool) {
    let kafka = Kafka::mock();
    let outbox = migrate(&pool).await;
    let missing = format!("no-such-topic-{}", Uuid::new_v4());
    append_steps(&pool, &outbox, "lost", 1, "x").await;
    sqlx::query("UPDATE outbox SET topic = $1").bind(&missing).execute(&pool).await.expect("point at it");
    let timeout = Duration::from_secs(20);
    let config =
        || quick(&kafka).kafka_setting("allow.auto.create.topics", "false").missing_topic_timeout(timeout);
    let first = start(&pool, &outbox, config());
    let started = std::time::Instant::now();
    assert!(
        eventually(Duration::from_secs(10), || async {
            outbox.ops().retrying(&pool, 10).await.is_ok_and(|r| {
                r.events.iter().any(|e| e.last_error.as_deref().is_some_and(|l| l.contains("does not exist")))
            })
        })
        .await,
        "the first relay finds the topic missing"
    );
    // Most of the timeout with the first relay, then another takes over.
    tokio::time::sleep(Duration::from_secs(14).saturating_sub(started.elapsed())).await;
    first.shutdown().await;
    assert_eq!(rows_in(&pool, "failed").await, 0, "not failed before the timeout");
    let second = start(&pool, &outbox, config());
    let taken_over = std::time::Instant::now();
    assert!(
        eventually(Duration::from_secs(40), || async { rows_in(&pool, "failed").await == 1 }).await,
        "failed after missing_topic_timeout"
    );
    let waited = taken_over.elapsed();
    second.shutdown().await;
    assert!(started.elapsed() >= timeout, "not failed before the timeout: {:?}", started.elapsed());
    // The second relay counts from the first relay's first answer (about 6 s left), not
    // from its own (20 s).
    assert!(waited < Duration::from_secs(13), "the second relay waited {waited:?}: its clock started again");
    let reason: String =
        sqlx::query_scalar("SELECT last_error FROM outbox").fetch_one(&pool).await.expect("reason");
    assert!(reason.contains(&missing) && reason.contains("missing for"), "{reason}");
}

/// Problem 6 of issue 12: with auto-create off, an event whose topic does not exist stayed
/// pending for ever with `last_error` "Message timed out", naming no topic, and nothing
/// listed it. Now the relay asks the cluster's metadata before sending: the event is not
/// sent, its `last_error` names the topic, `Ops::retrying` lists it, and after
/// `missing_topic_timeout` it is `failed` with that reason, holding back only its own
/// aggregate; once the topic exists, `retry` publishes the aggregate in order.
#[sqlx::test(migrations = false)]
async fn a_missing_topic_is_named_then_failed_holding_back_only_its_aggregate(pool: PgPool) {
    let kafka = Kafka::mock();
    kafka.create_topic(TOPIC, 1).await;
    let outbox = migrate(&pool).await;
    let missing = format!("no-such-topic-{}", Uuid::new_v4());
    let lost = append_steps(&pool, &outbox, "lost", 3, "x").await;
    sqlx::query("UPDATE outbox SET topic = $1 WHERE aggregate_id = 'lost'")
        .bind(&missing)
        .execute(&pool)
        .await
        .expect("point lost at a missing topic");
    let mut healthy = Vec::new();
    for i in 0..4 {
        healthy.extend(append_steps(&pool, &outbox, &format!("healthy-{i}"), 2, "ok").await);
    }
    let timeout = Duration::from_secs(8);
    let started = std::time::Instant::now();
    let relay = start(
        &pool,
        &outbox,
        quick(&kafka).kafka_setting("allow.auto.create.topics", "false").missing_topic_timeout(timeout),
    );

    // While the topic is missing: the head event waits, naming the topic, listed as retrying.
    assert!(
        eventually(Duration::from_secs(10), || async {
            rows_in(&pool, "published").await == 8
                && outbox
                    .ops()
                    .retrying(&pool, 10)
                    .await
                    .is_ok_and(|r| r.events.iter().any(|e| e.last_error.is_some()))
        })
        .await,
        "the other aggregates are published while lost's head waits"
    );
    let waiting = outbox.ops().retrying(&pool, 10).await.expect("retrying");
    assert!(started.elapsed() < timeout, "seen waiting before the timeout");
    assert_eq!(waiting.total, 1, "{waiting:?}");
    let head = &waiting.events[0];
    assert_eq!((head.event_id, head.topic.as_str()), (lost[0], missing.as_str()));
    let reason = head.last_error.clone().unwrap_or_default();
    assert!(
        reason.contains(&format!("topic {missing} does not exist")),
        "the error names the topic: {reason}"
    );
    assert!(head.next_attempt_at.ends_with('Z') && head.next_attempt_in_seconds.is_finite());
    assert_eq!(head.attempts, 0, "held back, never sent: not an attempt");
    // Held rows do not make the relay back off as if the broker were down: an event
    // appended now goes out at once.
    let late = append_steps(&pool, &outbox, "late", 1, "ok").await;
    let appended = std::time::Instant::now();
    assert!(
        eventually(Duration::from_secs(10), || async { rows_in(&pool, "published").await == 9 }).await,
        "a new event is published while the held one waits"
    );
    assert!(appended.elapsed() < Duration::from_secs(2), "published in {:?}", appended.elapsed());
    healthy.extend(late);

    // After the timeout: failed with that reason, its later events held back, never tried.
    assert!(
        eventually(Duration::from_secs(30), || async { rows_in(&pool, "failed").await == 1 }).await,
        "failed after missing_topic_timeout"
    );
    assert!(started.elapsed() >= timeout, "not failed before the timeout");
    let failed = outbox.ops().failed(&pool).await.expect("failed");
    assert_eq!((failed[0].event_id, failed[0].held_back), (lost[0], 2));
    let reason = failed[0].last_error.clone().unwrap_or_default();
    assert!(reason.contains(&missing) && reason.contains("outbox retry"), "{reason}");
    let held: Vec<i32> = sqlx::query_scalar(
        "SELECT attempts FROM outbox WHERE aggregate_id = 'lost' AND status = 'pending' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .expect("held");
    assert_eq!(held, [0, 0], "later events of the aggregate are held back, never attempted");

    // The topic is created; retry publishes the aggregate, in order.
    kafka.create_topic(&missing, 1).await;
    let retried = outbox
        .ops()
        .retry(&pool, &outbox_runtime::ops::RetryTarget::Aggregate("lost".into()))
        .await
        .expect("retry");
    assert_eq!(retried, 1);
    assert!(
        eventually(Duration::from_secs(20), || async { rows_in(&pool, "published").await == 12 }).await,
        "published once the topic exists: {:?}",
        sqlx::query_as::<_, (String, i32, Option<String>)>(
            "SELECT status, attempts, last_error FROM outbox WHERE aggregate_id = 'lost' ORDER BY id"
        )
        .fetch_all(&pool)
        .await
    );
    relay.shutdown().await;
    let records = kafka.read_all(&missing, Duration::from_secs(20));
    let versions: Vec<&str> = records.iter().map(|r| r.headers["ce_aggregateversion"].as_str()).collect();
    assert_eq!(versions, ["1", "2", "3"]);
    assert!(has_all(&healthy)(&kafka.read_all(TOPIC, Duration::from_secs(20))));
    assert_eq!(outbox.ops().retrying(&pool, 10).await.expect("retrying").total, 0);
}
