//! The inbox against real PostgreSQL and a Kafka-protocol broker (invariants 7, 8, 9).
//! Each test produces raw records to a topic of its own, exactly as the relay would (or
//! deliberately not), and consumes them with a consumer group. The operator's side and
//! dedup retention are in `inbox_operator.rs`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::inbox::{HandlerError, Handlers, Inbox, Meta, RawHandler};
use outbox_runtime::OutboxEvent;
use outbox_tests::events::event_headers;
use outbox_tests::inbox_kit::credits::{count, credits, setup, start, Ledger};
use outbox_tests::{eventually, Credit};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[sqlx::test(migrations = false)]
async fn the_same_event_delivered_five_times_applies_once(pool: PgPool) {
    // Fault: one event delivered 5 times (a relay that republished it). Invariant 8.
    let s = setup(&pool).await;
    let id = Uuid::now_v7();
    let payload = Credit::json("acc-1", 10);
    for _ in 0..5 {
        s.produce("acc-1", &payload, &event_headers(id, Credit::EVENT_TYPE, None, Some("acc-1"))).await;
    }
    let ledger = Ledger::default();
    let (running, _) = start(&pool, s.config("dedup"), &ledger).await;
    let stats = running.stats.clone();
    assert!(
        eventually(Duration::from_secs(30), || async { stats.applied() + stats.duplicates() == 5 }).await
    );
    running.shutdown().await;
    assert_eq!(credits(&pool).await, [("acc-1".to_owned(), 10)]);
    assert_eq!((stats.applied(), stats.duplicates()), (1, 4));
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, 1);
}

#[sqlx::test(migrations = false)]
async fn a_handler_error_rolls_back_the_inbox_row_and_the_retry_applies_once(pool: PgPool) {
    // Fault: the handler fails transiently twice after writing its effect. Invariant 8:
    // the effect and the inbox row roll back together; the retry applies once.
    let s = setup(&pool).await;
    s.credit("acc-2", 20, None).await;
    let ledger = Ledger { fail_first: Arc::new(AtomicU32::new(2)), ..Ledger::default() };
    let (running, _) = start(&pool, s.config("retry"), &ledger).await;
    let stats = running.stats.clone();
    assert!(eventually(Duration::from_secs(30), || async { stats.applied() == 1 }).await);
    running.shutdown().await;
    assert_eq!(ledger.calls.load(Ordering::SeqCst), 3, "two failed attempts, one that applied");
    assert_eq!(stats.retries(), 2);
    assert_eq!(credits(&pool).await, [("acc-2".to_owned(), 20)], "the failed attempts left nothing");
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, 1);
}

#[sqlx::test(migrations = false)]
async fn malformed_messages_are_parked_with_reasons_and_other_keys_flow(pool: PgPool) {
    // Fault: raw records that are not readable events, produced straight to the topic.
    // Invariant 9: each is parked with its reason and raw bytes; later records of the
    // same key are held; other keys are applied.
    let s = setup(&pool).await;
    let ok = |k: &str| event_headers(Uuid::now_v7(), Credit::EVENT_TYPE, None, Some(k));
    s.produce("bad-1", b"{\"account\":\"bad-1\",\"amount\":1}", &[]).await;
    s.produce("bad-2", b"not json at all", &ok("bad-2")).await;
    s.produce(
        "bad-3",
        b"{\"account\":\"bad-3\",\"amount\":3}",
        &event_headers(Uuid::now_v7(), "test.unknown", None, Some("bad-3")),
    )
    .await;
    // A value of the payload where the type wants another: the reason names where and what,
    // never the value (serde's own message quotes it).
    s.produce("bad-4", b"{\"account\":\"bad-4\",\"amount\":\"someone@example.com\"}", &ok("bad-4")).await;
    s.credit("bad-1", 5, None).await; // behind the parked record of its key
    s.credit("good", 7, None).await;
    // A type this consumer ignores on purpose is skipped, not parked.
    s.produce("audit", b"{}", &event_headers(Uuid::now_v7(), "test.audit", None, Some("audit"))).await;
    // A header PostgreSQL text cannot hold, and a handler that panics.
    let mut nul = ok("bad-5");
    nul[2].1 = "test.cre\0dit".to_owned();
    s.produce("bad-5", b"{}", &nul).await;
    s.credit("panic", 1, None).await;
    let ledger = Ledger::default();
    let (running, operator) = start(&pool, s.config("malformed"), &ledger).await;
    let stats = running.stats.clone();
    assert!(
        eventually(Duration::from_secs(30), || async {
            stats.parked() == 6 && stats.held() == 1 && stats.applied() == 1 && stats.ignored() == 1
        })
        .await,
        "parked {} held {} applied {} ignored {}",
        stats.parked(),
        stats.held(),
        stats.applied(),
        stats.ignored()
    );
    running.shutdown().await;
    assert_eq!(credits(&pool).await, [("good".to_owned(), 7)]);
    let parked = operator.parked().await.expect("parked");
    let reason_of = |key: &str, status: &str| {
        parked
            .iter()
            .find(|p| p.record_key.as_deref() == Some(key.as_bytes()) && p.status == status)
            .map(|p| p.reason.clone())
            .unwrap_or_else(|| panic!("no {status} record for {key}: {parked:?}"))
    };
    assert_eq!(reason_of("bad-1", "parked"), "missing header ce_id");
    assert!(reason_of("bad-2", "parked").starts_with("payload is not JSON"));
    assert_eq!(
        reason_of("bad-3", "parked"),
        "no handler for event type test.unknown version 1 (this consumer handles test.credit v1; ignores \
         test.audit): to skip it on purpose, add `Handlers::ignore(\"test.unknown\")`; to apply it, register a \
         handler with `Handlers::on`"
    );
    let undecodable = reason_of("bad-4", "parked");
    assert!(
        undecodable.starts_with(
            "payload does not decode as test.credit v1: at amount: invalid type: string, expected i64 (line 1, column"
        ),
        "{undecodable}"
    );
    assert!(!undecodable.contains("someone"), "no value of the payload in the reason: {undecodable}");
    assert!(reason_of("bad-1", "held").starts_with("held behind parked message"));
    assert_eq!(reason_of("bad-5", "parked"), "header ce_type contains a NUL byte: not storable as text");
    assert_eq!(reason_of("panic", "parked"), "handler panicked: the ledger cannot take account panic");
    let raw = parked.iter().find(|p| p.record_key.as_deref() == Some(b"bad-2".as_slice())).expect("bad-2");
    assert_eq!(raw.payload, b"not json at all", "raw bytes are kept");
}

#[sqlx::test(migrations = false)]
async fn stale_versions_are_absorbed_and_gaps_counted(pool: PgPool) {
    let s = setup(&pool).await;
    for (amount, version) in [(1, 1), (3, 3), (2, 2), (4, 4)] {
        s.credit("acc-v", amount, Some(version)).await;
    }
    let ledger = Ledger::default();
    let (running, _) = start(&pool, s.config("versions"), &ledger).await;
    let stats = running.stats.clone();
    assert!(eventually(Duration::from_secs(30), || async { stats.applied() + stats.stale() == 4 }).await);
    running.shutdown().await;
    assert_eq!((stats.applied(), stats.stale(), stats.gaps()), (3, 1, 1));
    assert_eq!(
        credits(&pool).await,
        [("acc-v".to_owned(), 1), ("acc-v".to_owned(), 3), ("acc-v".to_owned(), 4)]
    );
    let row: (i64, i64, i64) =
        sqlx::query_as("SELECT last_version, gaps, stale FROM inbox_aggregates WHERE aggregate_id = 'acc-v'")
            .fetch_one(&pool)
            .await
            .expect("aggregate");
    assert_eq!(row, (4, 1, 1));
}

#[sqlx::test(migrations = false)]
async fn a_crash_between_db_commit_and_offset_commit_redelivers_and_absorbs(pool: PgPool) {
    // Fault: the consumer dies after its PostgreSQL commits but before any offset commit
    // (the task is aborted; commits are held back by a long interval). Invariants 7 and 8:
    // on restart the messages are delivered again and absorbed, never applied twice.
    let s = setup(&pool).await;
    for i in 0..6 {
        s.credit(&format!("acc-{i}"), i, None).await;
    }
    let ledger = Ledger::default();
    let config = s.config("crash").commit_interval(Duration::from_secs(3600));
    let (first, _) = start(&pool, config.clone(), &ledger).await;
    let stats = first.stats.clone();
    assert!(eventually(Duration::from_secs(30), || async { stats.applied() == 6 }).await);
    first.task.abort();
    let _ = first.task.await;
    assert_eq!(s.kafka.committed("crash", &s.topic, 3), [-1, -1, -1], "no offset was committed");

    let (second, _) = start(&pool, s.config("crash"), &ledger).await;
    let again = second.stats.clone();
    assert!(
        eventually(Duration::from_secs(30), || async { again.duplicates() == 6 }).await,
        "redelivered: {}",
        again.duplicates()
    );
    second.shutdown().await;
    assert_eq!(again.applied(), 0);
    assert_eq!(credits(&pool).await.len(), 6, "each effect once");
    let after: i64 = s.kafka.committed("crash", &s.topic, 3).iter().filter(|o| **o >= 0).sum();
    assert_eq!(after, 6, "the graceful stop committed every finished offset");
}

#[sqlx::test(migrations = false)]
async fn committed_offsets_never_pass_an_unfinished_message(pool: PgPool) {
    // Fault: the first message of partition 0 takes long (its handler waits) while other
    // partitions run on. Invariant 7: partition 0's committed offset stays before it,
    // partition 1's moves on; once it finishes, partition 0 catches up.
    let s = setup(&pool).await;
    for (partition, account, amount) in [(0, "slow", 1), (0, "p0-next", 2), (1, "p1-a", 3), (1, "p1-b", 4)] {
        let headers = event_headers(Uuid::now_v7(), Credit::EVENT_TYPE, None, Some(account));
        s.produce_to(Some(partition), account, &Credit::json(account, amount), &headers).await;
    }
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let ledger = Ledger { gate: Some(gate.clone()), ..Ledger::default() };
    let (running, _) = start(&pool, s.config("parallel"), &ledger).await;
    let stats = running.stats.clone();
    assert!(
        eventually(Duration::from_secs(30), || async { stats.applied() == 2 }).await,
        "partition 1 proceeds"
    );
    assert!(
        eventually(Duration::from_secs(10), || async { s.kafka.committed("parallel", &s.topic, 3)[1] == 2 })
            .await,
        "partition 1 commits past its finished messages"
    );
    let while_blocked = s.kafka.committed("parallel", &s.topic, 3);
    assert!(
        while_blocked[0] < 1,
        "partition 0 is not committed past the unfinished message: {while_blocked:?}"
    );
    assert_eq!(credits(&pool).await.len(), 2, "the message behind it waits: partitions keep their order");

    gate.add_permits(1);
    assert!(eventually(Duration::from_secs(30), || async { stats.applied() == 4 }).await);
    assert!(
        eventually(Duration::from_secs(10), || async { s.kafka.committed("parallel", &s.topic, 3)[0] == 2 })
            .await
    );
    running.shutdown().await;
}

/// Keeps every message no typed handler claims, raw.
struct Archive;

impl RawHandler for Archive {
    async fn handle(&self, tx: &mut PgConnection, payload: &[u8], meta: &Meta) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO archive (event_type, payload) VALUES ($1, $2)")
            .bind(&meta.event_type)
            .bind(payload)
            .execute(tx)
            .await?;
        Ok(())
    }
}

#[sqlx::test(migrations = false)]
async fn the_fallback_handler_gets_raw_messages_no_typed_handler_claims(pool: PgPool) {
    let s = setup(&pool).await;
    sqlx::query("CREATE TABLE archive (event_type text, payload bytea)")
        .execute(&pool)
        .await
        .expect("archive");
    s.produce("k", br#"{"anything":true}"#, &event_headers(Uuid::now_v7(), "test.other", None, Some("k")))
        .await;
    s.credit("k", 9, None).await;
    let ledger = Ledger::default();
    let handlers = Handlers::new().on::<Credit, _>(ledger.clone()).fallback(Archive);
    let inbox = Inbox::new(pool.clone(), s.config("fallback"), handlers).expect("inbox");
    inbox.migrator().run(&pool).await.expect("migrate");
    let stats = inbox.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(inbox.run(stop.clone()));
    assert!(eventually(Duration::from_secs(30), || async { stats.applied() == 2 }).await);
    stop.cancel();
    task.await.expect("task").expect("clean stop");
    let archived: Vec<(String, Vec<u8>)> =
        sqlx::query_as("SELECT event_type, payload FROM archive").fetch_all(&pool).await.expect("archive");
    assert_eq!(archived, [("test.other".to_owned(), br#"{"anything":true}"#.to_vec())]);
    assert_eq!(credits(&pool).await, [("k".to_owned(), 9)], "the typed handler still takes its type");
}
