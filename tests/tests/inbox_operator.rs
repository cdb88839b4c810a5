//! The inbox's operator side and upkeep, against real PostgreSQL and a Kafka-protocol
//! broker (invariant 9): parked records retried and discarded in the operator's process or
//! requested from another one and carried out by the running consumer, a dedup retention
//! shorter than the topics' refused at start-up, and the cleanup of old dedup rows.

use std::time::Duration;

use outbox_runtime::inbox::{Handlers, Inbox, InboxConfig};
use outbox_runtime::OutboxEvent;
use outbox_tests::events::event_headers;
use outbox_tests::inbox_kit::credits::{count, credits, setup, start, Ledger};
use outbox_tests::kafka::Kafka;
use outbox_tests::{eventually, Credit};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[sqlx::test(migrations = false)]
async fn operator_retry_and_discard_release_held_messages_in_order(pool: PgPool) {
    // Fault: a permanent handler error on the first event of two accounts. Invariant 9:
    // they park, later events of those accounts are held, others apply; retry (after the
    // cause is fixed) and discard release the held ones in order.
    let s = setup(&pool).await;
    sqlx::query("INSERT INTO blocked_accounts VALUES ('acc-a'), ('acc-c')")
        .execute(&pool)
        .await
        .expect("block");
    s.credit("acc-a", 1, None).await;
    s.credit("acc-a", 2, None).await;
    s.credit("acc-a", 3, None).await;
    let discarded_event = s.credit("acc-c", 100, None).await;
    s.credit("acc-c", 101, None).await;
    s.credit("acc-b", 50, None).await;
    let ledger = Ledger::default();
    let (running, operator) = start(&pool, s.config("operator"), &ledger).await;
    let stats = running.stats.clone();
    assert!(
        eventually(Duration::from_secs(30), || async {
            stats.parked() == 2 && stats.held() == 3 && stats.applied() == 1
        })
        .await
    );
    running.shutdown().await;
    assert_eq!(credits(&pool).await, [("acc-b".to_owned(), 50)]);

    let parked = operator.parked().await.expect("parked");
    let head = |key: &str| {
        parked
            .iter()
            .find(|p| p.status == "parked" && p.record_key.as_deref() == Some(key.as_bytes()))
            .expect("parked head")
            .id
    };
    // Retrying while the cause remains parks it again and releases nothing.
    let again = operator.retry_parked(head("acc-a")).await.expect("retry");
    assert_eq!(again.applied, 0);
    assert_eq!(again.parked_again.as_deref(), Some("handler failed: account acc-a is blocked"));

    sqlx::query("DELETE FROM blocked_accounts WHERE account = 'acc-a'")
        .execute(&pool)
        .await
        .expect("unblock");
    let released = operator.retry_parked(head("acc-a")).await.expect("retry");
    assert_eq!((released.applied, released.parked_again), (3, None));

    // acc-c stays blocked, but its first event is discarded by the operator: the second,
    // also for acc-c, parks in turn, so unblock first and discard the first.
    sqlx::query("DELETE FROM blocked_accounts").execute(&pool).await.expect("unblock");
    let released = operator.discard_parked(head("acc-c"), "refunded by hand").await.expect("discard");
    assert_eq!((released.applied, released.parked_again), (1, None));

    assert_eq!(
        credits(&pool).await,
        [
            ("acc-a".to_owned(), 1),
            ("acc-a".to_owned(), 2),
            ("acc-a".to_owned(), 3),
            ("acc-b".to_owned(), 50),
            ("acc-c".to_owned(), 101)
        ]
    );
    let order: Vec<i64> = sqlx::query_scalar(
        "SELECT c.amount FROM credits c JOIN inbox i ON i.event_id = c.event_id WHERE c.account = 'acc-a' ORDER BY i.applied_at, c.amount",
    )
    .fetch_all(&pool)
    .await
    .expect("order");
    assert_eq!(order, [1, 2, 3]);
    assert!(operator.parked().await.expect("parked").is_empty(), "nothing left parked or held");
    let discarded: String = sqlx::query_scalar("SELECT reason FROM inbox_parked WHERE status = 'discarded'")
        .fetch_one(&pool)
        .await
        .expect("discarded");
    assert!(discarded.ends_with("discarded: refunded by hand"), "{discarded}");

    // The discarded event delivered again (a relay duplicate) is absorbed, not applied.
    let payload = Credit::json("acc-c", 100);
    s.produce("acc-c", &payload, &event_headers(discarded_event, Credit::EVENT_TYPE, None, Some("acc-c")))
        .await;
    let (again, _) = start(&pool, s.config("operator"), &ledger).await;
    let stats = again.stats.clone();
    assert!(eventually(Duration::from_secs(30), || async { stats.duplicates() == 1 }).await);
    again.shutdown().await;
    assert_eq!(credits(&pool).await.len(), 5, "the discarded credit never applies");
}

#[sqlx::test(migrations = false)]
async fn operator_requests_from_another_process_are_carried_out_by_the_running_consumer(pool: PgPool) {
    // Fault: permanent handler errors park the first credits of two accounts. Invariant 9
    // through the operator commands: a retry requested from outside (no handlers there)
    // and a discard are carried out by the running consumer, in key order.
    let s = setup(&pool).await;
    sqlx::query("INSERT INTO blocked_accounts VALUES ('acc-a'), ('acc-c')")
        .execute(&pool)
        .await
        .expect("block");
    s.credit("acc-a", 1, None).await;
    s.credit("acc-a", 2, None).await;
    s.credit("acc-c", 100, None).await;
    s.credit("acc-c", 101, None).await;
    let ledger = Ledger::default();
    let config = s.config("requests").operator_poll_interval(Duration::from_millis(100));
    let (running, _) = start(&pool, config, &ledger).await;
    let stats = running.stats.clone();
    assert!(eventually(Duration::from_secs(30), || async { stats.parked() == 2 && stats.held() == 2 }).await);

    // The operator's side: only the database.
    let admin =
        outbox_runtime::inbox::InboxAdmin::new(pool.clone(), "public", "inbox", "requests").expect("admin");
    let parked = admin.parked().await.expect("parked");
    let head = |key: &str| {
        parked
            .iter()
            .find(|p| p.status == "parked" && p.record_key.as_deref() == Some(key.as_bytes()))
            .expect("head")
            .id
    };
    let held_a = parked
        .iter()
        .find(|p| p.status == "held" && p.record_key.as_deref() == Some(&b"acc-a"[..]))
        .expect("held")
        .id;
    assert!(
        matches!(admin.request_retry(held_a).await, Err(outbox_runtime::Error::Conflict(_))),
        "held: release the head first"
    );
    assert!(matches!(admin.request_retry(999_999).await, Err(outbox_runtime::Error::NotFound(_))));

    // Retried while still blocked: carried out, parked again, the request cleared.
    admin.request_retry(head("acc-a")).await.expect("request");
    let cleared = || async { admin.parked().await.expect("parked").iter().all(|p| !p.retry_requested) };
    assert!(eventually(Duration::from_secs(30), cleared).await, "the consumer took the request");
    assert!(credits(&pool).await.is_empty(), "still blocked: nothing applied");

    sqlx::query("DELETE FROM blocked_accounts").execute(&pool).await.expect("unblock");
    admin.request_retry(head("acc-a")).await.expect("request");
    let discarded = admin.discard(head("acc-c"), "refunded by hand").await.expect("discard");
    assert_eq!(discarded.held_behind, 1);
    let expected = [("acc-a".to_owned(), 1), ("acc-a".to_owned(), 2), ("acc-c".to_owned(), 101)];
    assert!(
        eventually(Duration::from_secs(30), || async { credits(&pool).await == expected }).await,
        "retried and released in order: {:?}",
        credits(&pool).await
    );
    assert!(admin.parked().await.expect("parked").is_empty(), "nothing left parked or held");
    running.shutdown().await;
}

#[sqlx::test(migrations = false)]
async fn start_up_refuses_a_dedup_retention_shorter_than_the_topics(pool: PgPool) {
    // The topic keeps messages 7 days; the inbox would forget event ids after 1 day, and
    // replays reach back 7 days. Brokers that report retention.ms (Kafka, Tansu) make a
    // refusing inbox stop at start-up; the mock cluster answers no DescribeConfigs, and
    // then the inbox starts with a warning that it could not check.
    let kafka = Kafka::start();
    let topic = format!("inbox-retention-{}", Uuid::new_v4().simple());
    kafka.create_topic_with(&topic, 1, &[("retention.ms", "604800000")]).await;
    let day = Duration::from_secs(86_400);
    let config = InboxConfig::new("retention", kafka.bootstrap(), [topic.clone()])
        .dedup_retention(Some(day))
        .replay_window(7 * day)
        .refuse_short_retention(true);
    let inbox = Inbox::new(pool.clone(), config, Handlers::new()).expect("inbox");
    inbox.migrator().run(&pool).await.expect("migrate");
    let stop = CancellationToken::new();
    let run = tokio::spawn(inbox.run(stop.clone()));
    match tokio::time::timeout(Duration::from_secs(20), run).await {
        Ok(result) => {
            let err = result.expect("task").expect_err("refused");
            let text = err.to_string();
            assert!(text.contains("DEDUP RETENTION TOO SHORT"), "{text}");
            assert!(text.contains("14.0 days are needed"), "{text}");
            assert!(kafka.mock_cluster().is_none(), "only a broker that reports retention.ms can refuse");
        }
        Err(_) => {
            // Still running after 20 s: it could not read retention.ms and went on.
            assert!(
                kafka.mock_cluster().is_some(),
                "a broker that reports retention.ms must have made it refuse"
            );
            stop.cancel();
        }
    }
}

#[sqlx::test(migrations = false)]
async fn inbox_cleanup_deletes_only_rows_past_dedup_retention_in_batches(pool: PgPool) {
    let config = InboxConfig::new("cleanup", "127.0.0.1:1", ["unused"]);
    let inbox = Inbox::new(pool.clone(), config, Handlers::new()).expect("inbox");
    inbox.migrator().run(&pool).await.expect("migrate");
    sqlx::query(
        "INSERT INTO inbox (consumer, event_id, event_type, schema_version, topic, kafka_partition, kafka_offset, applied_at, bucket) \
         SELECT 'cleanup', id, 'test.credit', 1, 't', 0, n, \
                CASE WHEN n <= 25 THEN now() - interval '40 days' ELSE now() END, inbox_bucket(id) \
         FROM (SELECT n, gen_random_uuid() AS id FROM generate_series(1, 30) n) s",
    )
    .execute(&pool)
    .await
    .expect("rows");
    let deleted = inbox.delete_applied(Duration::from_secs(30 * 86_400), 10).await.expect("cleanup");
    assert_eq!(deleted, 25);
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, 5, "recent dedup keys stay");
    assert_eq!(count(&pool, "SELECT min(kafka_offset) FROM inbox").await, 26);
}
