//! The inbox under inputs and handlers nobody planned for (invariants 9, 10, 11, 12):
//! records that PostgreSQL refuses or that cannot be recorded at all, a stalled partition,
//! header names that are not UTF-8, handlers that fail for ever or never return, a parked
//! key on two topics, a redelivered record. Each test names the fault it injects; each
//! failed on the code before its fix. Neighbours and settings are in
//! `inbox_neighbours.rs`, batches in `inbox_batches.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::inbox::{EventHandler, HandlerError, Handlers, Inbox, InboxConfig, Meta};
use outbox_runtime::Error;
use outbox_tests::inbox_kit::effects::{
    applied_amounts, credit_headers, parked, setup, start, start_with, Ledger,
};
use outbox_tests::raw::RawRecord;
use outbox_tests::{eventually, Credit};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Fault: records whose text PostgreSQL refuses (a NUL byte in a binary key used as the
/// aggregate id, SQLSTATE 22021; an 8 KiB `ce_subject` over the index row limit, 54000).
/// Before the fix both were retried as transient forever and the valid credit behind them
/// on the same partition never applied.
#[sqlx::test(migrations = false)]
async fn records_postgres_refuses_get_an_outcome_and_the_partition_moves_on(pool: PgPool) {
    let s = setup(&pool, 1).await;
    let nul_key = RawRecord {
        partition: 0,
        key: Some(b"acc\0ount".to_vec()),
        value: Some(Credit::json("nul-key", 1)),
        headers: credit_headers(Uuid::now_v7(), None, None)
            .into_iter()
            .map(|(k, v)| (k.into_bytes(), Some(v.into_bytes())))
            .collect(),
    };
    s.producer.send(&s.topic, &nul_key);
    let long_subject = "s".repeat(8 * 1024);
    let huge = RawRecord::text(
        0,
        "huge",
        &Credit::json("huge", 2),
        &credit_headers(Uuid::now_v7(), Some(&long_subject), Some(1)),
    );
    s.producer.send(&s.topic, &huge);
    s.credit(0, "valid", 3);
    s.producer.flush();

    let running = start(&pool, s.config("refused"), &Ledger::default()).await;
    let stats = running.stats.clone();
    let settled =
        eventually(Duration::from_secs(20), || async { stats.applied() + stats.parked() >= 3 }).await;
    let amounts = applied_amounts(&pool).await;
    let parked = parked(&pool).await;
    running.shutdown().await;
    assert!(
        settled,
        "3 records must each get an outcome; applied {amounts:?}, parked {parked:?}, retries {}",
        stats.retries()
    );
    // The binary key is not an aggregate id: without ce_subject the credit applies untracked.
    assert_eq!(amounts, vec![1, 3], "the NUL-key credit and the valid one apply");
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!((parked[0].0, parked[0].1.as_str()), (1, "parked"));
    assert!(parked[0].2.contains("ce_subject"), "the reason names the header: {}", parked[0].2);
}

/// Fault: one partition's handler blocks (a lock wait) while hundreds of records queue
/// behind it. Before the fix the receive loop waited on that partition's full queue and
/// no other partition received or committed anything.
#[sqlx::test(migrations = false)]
async fn a_stalled_partition_does_not_stop_the_others(pool: PgPool) {
    let s = setup(&pool, 2).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let ledger = Ledger { gate: Some(gate.clone()), ..Ledger::default() };
    let running =
        start(&pool, s.config("stalled").queue_per_partition(4).buffer_per_partition(4096), &ledger).await;
    s.credit(0, "slow", 0);
    for n in 1..=60 {
        s.credit(0, &format!("p0-{n}"), n);
    }
    s.producer.flush();
    let calls = ledger.calls.clone();
    assert!(eventually(Duration::from_secs(20), || async { calls.load(Ordering::SeqCst) >= 1 }).await);
    // Give the consumer time to receive partition 0's backlog and fill its queue.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for n in 1..=20 {
        s.credit(1, &format!("p1-{n}"), 1000 + n);
    }
    s.producer.flush();
    let flowed = eventually(Duration::from_secs(20), || async {
        applied_amounts(&pool).await.iter().filter(|a| **a > 1000).count() == 20
    })
    .await;
    let p0_applied = applied_amounts(&pool).await.iter().filter(|a| **a < 1000).count();
    gate.add_permits(1);
    let all =
        eventually(Duration::from_secs(30), || async { applied_amounts(&pool).await.len() == 81 }).await;
    running.shutdown().await;
    assert!(flowed, "partition 1's 20 credits apply while partition 0 is stalled");
    assert_eq!(p0_applied, 0, "nothing behind the stalled record of partition 0 applied meanwhile");
    assert!(all, "once released, partition 0's 61 credits apply too: {}", applied_amounts(&pool).await.len());
}

/// Fault: a header name that is not UTF-8 (from a raw client). Before the fix reading it
/// panicked inside rdkafka outside the panic guard and the partition's worker died.
#[sqlx::test(migrations = false)]
async fn a_header_name_that_is_not_utf8_parks_the_record_and_the_consumer_goes_on(pool: PgPool) {
    let s = setup(&pool, 1).await;
    let mut record = RawRecord::text(
        0,
        "bad-name",
        &Credit::json("bad-name", 1),
        &credit_headers(Uuid::now_v7(), Some("bad-name"), None),
    );
    record.headers.push((vec![0xff, 0xfe, b'x'], Some(b"v".to_vec())));
    s.producer.send(&s.topic, &record);
    s.credit(0, "after", 2);
    s.producer.flush();
    let running = start(&pool, s.config("bad-names"), &Ledger::default()).await;
    let stats = running.stats.clone();
    let settled =
        eventually(Duration::from_secs(20), || async { stats.applied() + stats.parked() >= 2 }).await;
    let parked = parked(&pool).await;
    let amounts = applied_amounts(&pool).await;
    let took = running.shutdown().await;
    assert!(settled, "both records get an outcome: applied {amounts:?}, parked {parked:?}");
    assert_eq!(amounts, vec![2]);
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert!(parked[0].2.contains("not UTF-8"), "{}", parked[0].2);
    assert!(took < Duration::from_secs(10), "run() returned {took:?} after cancel");
}

/// A handler that never finishes for account `stuck`, and fails transiently for ever for
/// account `busy`.
#[derive(Clone, Default)]
struct Stubborn;

impl EventHandler<Credit> for Stubborn {
    async fn handle(&self, tx: &mut PgConnection, credit: Credit, meta: &Meta) -> Result<(), HandlerError> {
        match credit.account.as_str() {
            "stuck" => std::future::pending::<()>().await,
            "busy" => return Err(HandlerError::transient("the ledger is busy")),
            _ => {}
        }
        Ledger::default().handle(tx, credit, meta).await
    }
}

/// Fault: a handler that fails transiently every time. Invariant 11: after `max_attempts`
/// it is parked with the last error, counted as retries on the way, and the key's later
/// records are held while other keys flow.
#[sqlx::test(migrations = false)]
async fn a_failure_that_always_passes_for_transient_is_parked_after_the_attempt_limit(pool: PgPool) {
    let s = setup(&pool, 1).await;
    s.credit(0, "busy", 1);
    s.credit(0, "busy", 2);
    s.credit(0, "other", 3);
    s.producer.flush();
    let running = start_with(&pool, s.config("limited").max_attempts(4), Stubborn).await;
    let stats = running.stats.clone();
    let settled = eventually(Duration::from_secs(20), || async {
        stats.parked() + stats.held() + stats.applied() == 3
    })
    .await;
    let parked = parked(&pool).await;
    running.shutdown().await;
    assert!(settled, "parked {parked:?}");
    assert_eq!(stats.retries(), 3, "three retries before the fourth and last attempt");
    assert_eq!((stats.parked(), stats.held(), stats.applied()), (1, 1, 1));
    assert_eq!(parked[0].1, "parked");
    assert!(
        parked[0].2.starts_with("gave up after 4 attempts; last error: handler: the ledger is busy"),
        "{}",
        parked[0].2
    );
    assert_eq!(parked[1].1, "held");
    assert_eq!(applied_amounts(&pool).await, vec![3]);
}

/// Fault: a handler that never returns. `run()` returns within the shutdown timeout after

#[sqlx::test(migrations = false)]
async fn run_returns_within_the_shutdown_timeout_whatever_a_handler_does(pool: PgPool) {
    let s = setup(&pool, 1).await;
    s.credit(0, "first", 1);
    s.credit(0, "stuck", 2);
    s.producer.flush();
    let config = s.config("stuck").shutdown_timeout(Duration::from_secs(2));
    let running = start_with(&pool, config, Stubborn).await;
    let stats = running.stats.clone();
    assert!(eventually(Duration::from_secs(20), || async { stats.applied() == 1 }).await);
    tokio::time::sleep(Duration::from_millis(500)).await; // the stuck record is in hand
    let took = running.shutdown().await;
    assert!(took < Duration::from_secs(4), "run() took {took:?} to return after cancel");
    assert_eq!(applied_amounts(&pool).await, vec![1]);
    let inbox_rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox").fetch_one(&pool).await.expect("rows");
    assert_eq!(inbox_rows, 1, "the abandoned record's transaction rolled back");
    assert_eq!(
        s.kafka.committed("stuck", &s.topic, 1),
        vec![1],
        "committed up to the stuck record, not past it"
    );
}

/// Neighbour: the same key on two topics. A parked record holds back later records of its

#[sqlx::test(migrations = false)]
async fn a_parked_record_holds_its_key_in_its_own_topic_only(pool: PgPool) {
    let s = setup(&pool, 1).await;
    let other = format!("robust-other-{}", Uuid::new_v4().simple());
    s.kafka.create_topic(&other, 1).await;
    let broken =
        RawRecord::text(0, "shared", b"not json", &credit_headers(Uuid::now_v7(), Some("shared"), None));
    s.producer.send(&s.topic, &broken);
    s.credit(0, "shared", 1); // held behind it
    s.producer.flush();
    let running = start(&pool, s.config("topics"), &Ledger::default()).await;
    let stats = running.stats.clone();
    assert!(eventually(Duration::from_secs(20), || async { stats.parked() == 1 && stats.held() == 1 }).await);
    running.shutdown().await;
    // The same key on another topic is not held.
    let id = Uuid::now_v7();
    let record =
        RawRecord::text(0, "shared", &Credit::json("shared", 2), &credit_headers(id, Some("shared"), None));
    s.producer.send(&other, &record);
    s.producer.flush();
    let config = InboxConfig::new("topics", s.kafka.bootstrap(), [s.topic.clone(), other.clone()])
        .commit_interval(Duration::from_millis(100));
    let running = start(&pool, config, &Ledger::default()).await;
    let stats = running.stats.clone();
    let applied = eventually(Duration::from_secs(20), || async { stats.applied() == 1 }).await;
    running.shutdown().await;
    assert!(applied, "the other topic's record applies: held {}", stats.held());
    assert_eq!(applied_amounts(&pool).await, vec![2]);
}

/// Fault: a record that cannot be recorded at all (the parked table refuses every row).
/// The consumer must not live on without it: `run()` ends with `Error::Inbox` at once.
#[sqlx::test(migrations = false)]
async fn a_record_that_cannot_be_recorded_ends_run_with_an_error(pool: PgPool) {
    let s = setup(&pool, 1).await;
    let inbox = Inbox::new(pool.clone(), s.config("fatal"), Handlers::new()).expect("inbox");
    inbox.migrator().run(&pool).await.expect("migrate");
    sqlx::query("ALTER TABLE inbox_parked ADD CONSTRAINT refuse_all CHECK (false) NOT VALID")
        .execute(&pool)
        .await
        .expect("constraint");
    s.producer.send(&s.topic, &RawRecord::text(0, "k", b"not json", &[]));
    s.producer.flush();
    let stop = CancellationToken::new();
    let ended = tokio::time::timeout(Duration::from_secs(30), inbox.run(stop)).await;
    match ended {
        Ok(Err(Error::Inbox(message))) => {
            assert!(message.contains("cannot be parked"), "{message}");
            assert!(message.contains(&format!("{}/0@0", s.topic)), "names the record: {message}");
        }
        other => panic!("run() must end with Error::Inbox, got {other:?}"),
    }
}

/// Fault: a crash after a record was applied and the next one of its key parked, before
/// any offset commit. On restart both come again: the applied one must be absorbed as the
/// duplicate it is, not held behind the parked record that came after it (which would give
/// it a second outcome).
#[sqlx::test(migrations = false)]
async fn a_redelivered_record_is_not_held_behind_a_later_parked_one(pool: PgPool) {
    let s = setup(&pool, 1).await;
    s.credit(0, "k", 1);
    s.producer.send(
        &s.topic,
        &RawRecord::text(0, "k", b"not json", &credit_headers(Uuid::now_v7(), Some("k"), None)),
    );
    s.producer.flush();
    let config = s.config("redelivered").commit_interval(Duration::from_secs(3600));
    let first = start(&pool, config.clone(), &Ledger::default()).await;
    let stats = first.stats.clone();
    assert!(
        eventually(Duration::from_secs(20), || async { stats.applied() == 1 && stats.parked() == 1 }).await
    );
    first.task.abort(); // no graceful stop: nothing committed
    let _ = first.task.await;
    let second = start(&pool, config, &Ledger::default()).await;
    let again = second.stats.clone();
    let settled = eventually(Duration::from_secs(20), || async {
        again.duplicates() + again.held() + again.parked() >= 2
    })
    .await;
    let rows = parked(&pool).await;
    second.shutdown().await;
    assert!(settled, "both redelivered records get an outcome: {rows:?}");
    assert_eq!((again.duplicates(), again.held()), (1, 0), "the applied record is a duplicate, not held");
    assert_eq!(rows.len(), 1, "only the broken record is in the parked table: {rows:?}");
    assert_eq!(applied_amounts(&pool).await, vec![1]);
}
