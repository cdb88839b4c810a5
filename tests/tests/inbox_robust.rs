//! The inbox under inputs, settings and neighbours nobody planned for (invariants 9, 10,
//! 11, 12): records that PostgreSQL refuses, a stalled partition, header names that are not
//! UTF-8, two consumers sharing one inbox table, settings that cannot work. Each test names
//! the fault it injects; each failed on the code before its fix.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_runtime::inbox::{EventHandler, HandlerError, Handlers, Inbox, InboxConfig, InboxStats, Meta};
use outbox_runtime::{Error, OutboxEvent};
use outbox_tests::eventually;
use outbox_tests::kafka::Kafka;
use outbox_tests::raw::{RawProducer, RawRecord};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "robust.credit", schema_version = 1, aggregate = "account", topic = "unused")]
struct Credit {
    #[outbox(aggregate_id)]
    account: String,
    amount: i64,
}

/// Records every application in `effects`; credits to account `slow` wait for the gate.
#[derive(Clone, Default)]
struct Ledger {
    gate: Option<Arc<tokio::sync::Semaphore>>,
    calls: Arc<AtomicU32>,
}

impl EventHandler<Credit> for Ledger {
    async fn handle(&self, tx: &mut PgConnection, credit: Credit, meta: &Meta) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let (Some(gate), "slow") = (&self.gate, credit.account.as_str()) {
            gate.acquire().await.expect("gate").forget();
        }
        sqlx::query("INSERT INTO effects (event_id, account, amount, kafka_partition, kafka_offset) VALUES ($1, $2, $3, $4, $5)")
            .bind(meta.event_id)
            .bind(&credit.account)
            .bind(credit.amount)
            .bind(meta.partition)
            .bind(meta.offset)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

struct Setup {
    kafka: Kafka,
    topic: String,
    producer: RawProducer,
}

async fn setup(pool: &PgPool, partitions: i32) -> Setup {
    sqlx::query(
        "CREATE TABLE effects (event_id uuid NOT NULL, account text NOT NULL, amount bigint NOT NULL, \
         kafka_partition integer NOT NULL, kafka_offset bigint NOT NULL)",
    )
    .execute(pool)
    .await
    .expect("effects");
    let kafka = Kafka::start();
    let topic = format!("robust-{}", Uuid::new_v4().simple());
    kafka.create_topic(&topic, partitions).await;
    let producer = RawProducer::new(kafka.bootstrap());
    Setup { kafka, topic, producer }
}

fn credit_headers(id: Uuid, subject: Option<&str>, version: Option<i64>) -> Vec<(String, String)> {
    let mut h = vec![
        ("ce_specversion".to_owned(), "1.0".to_owned()),
        ("ce_id".to_owned(), id.to_string()),
        ("ce_type".to_owned(), "robust.credit".to_owned()),
        ("ce_source".to_owned(), "/tests".to_owned()),
        ("ce_schemaversion".to_owned(), "1".to_owned()),
        ("ce_aggregatetype".to_owned(), "account".to_owned()),
    ];
    if let Some(s) = subject {
        h.push(("ce_subject".to_owned(), s.to_owned()));
    }
    if let Some(v) = version {
        h.push(("ce_aggregateversion".to_owned(), v.to_string()));
    }
    h
}

fn credit_payload(account: &str, amount: i64) -> Vec<u8> {
    serde_json::to_vec(&Credit { account: account.to_owned(), amount }).expect("json")
}

impl Setup {
    /// A well-formed credit on `partition`, keyed by its account.
    fn credit(&self, partition: i32, account: &str, amount: i64) -> Uuid {
        let id = Uuid::now_v7();
        let record = RawRecord::text(
            partition,
            account,
            &credit_payload(account, amount),
            &credit_headers(id, Some(account), None),
        );
        self.producer.send(&self.topic, &record);
        id
    }

    fn config(&self, consumer: &str) -> InboxConfig {
        InboxConfig::new(consumer, self.kafka.bootstrap(), [self.topic.clone()])
            .backoff(Duration::from_millis(20), Duration::from_millis(100))
            .commit_interval(Duration::from_millis(100))
    }
}

struct Running {
    stop: CancellationToken,
    task: JoinHandle<outbox_runtime::Result<()>>,
    stats: Arc<InboxStats>,
}

async fn start(pool: &PgPool, config: InboxConfig, ledger: &Ledger) -> Running {
    start_with(pool, config, ledger.clone()).await
}

impl Running {
    async fn shutdown(self) -> Duration {
        let asked = Instant::now();
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("run() returns after cancel")
            .expect("the inbox task does not panic")
            .expect("run() ends without an error");
        asked.elapsed()
    }
}

async fn applied_amounts(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT amount FROM effects ORDER BY amount").fetch_all(pool).await.expect("effects")
}

async fn parked(pool: &PgPool) -> Vec<(i64, String, String)> {
    sqlx::query_as("SELECT kafka_offset, status, reason FROM inbox_parked ORDER BY kafka_offset")
        .fetch_all(pool)
        .await
        .expect("parked")
}

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
        value: Some(credit_payload("nul-key", 1)),
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
        &credit_payload("huge", 2),
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
        &credit_payload("bad-name", 1),
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

/// Neighbour: two consumers share one inbox table, one keeps event ids for a day, the other
/// for ever. Before the fix the first one's cleanup deleted the other's dedup rows too, so
/// a replay would apply those events twice.
#[sqlx::test(migrations = false)]
async fn cleanup_deletes_only_its_own_consumers_rows(pool: PgPool) {
    let config = |consumer: &str| InboxConfig::new(consumer, "127.0.0.1:1", ["t"]);
    let short = Inbox::new(
        pool.clone(),
        config("short").dedup_retention(Some(Duration::from_secs(86_400))),
        Handlers::new(),
    )
    .expect("inbox");
    let forever =
        Inbox::new(pool.clone(), config("forever").dedup_retention(None), Handlers::new()).expect("inbox");
    short.migrator().run(&pool).await.expect("migrate");
    for consumer in ["short", "forever"] {
        sqlx::query(
            "INSERT INTO inbox (consumer, event_id, event_type, schema_version, topic, kafka_partition, kafka_offset, applied_at) \
             SELECT $1, gen_random_uuid(), 'x.y', 1, 't', 0, n, now() - interval '2 days' FROM generate_series(1, 5) n",
        )
        .bind(consumer)
        .execute(&pool)
        .await
        .expect("old rows");
    }
    let deleted = short.delete_applied(Duration::from_secs(86_400), 2).await.expect("cleanup");
    let left: Vec<(String, i64)> =
        sqlx::query_as("SELECT consumer, count(*) FROM inbox GROUP BY consumer ORDER BY consumer")
            .fetch_all(&pool)
            .await
            .expect("count");
    assert_eq!(deleted, 5);
    assert_eq!(left, vec![("forever".to_owned(), 5)]);
    assert_eq!(forever.delete_applied(Duration::from_secs(86_400), 2).await.expect("cleanup"), 5);
}

/// Settings that cannot work: before the fix `commit_interval(0)` panicked inside `run()`
/// and `backoff(0, _)` retried in a hot loop; both were accepted by `Inbox::new`.
#[sqlx::test(migrations = false)]
async fn settings_that_cannot_work_are_refused_by_name(pool: PgPool) {
    let base = || InboxConfig::new("c", "127.0.0.1:1", ["t"]);
    let cases: Vec<(InboxConfig, &str)> = vec![
        (base().commit_interval(Duration::ZERO), "commit_interval"),
        (base().backoff(Duration::ZERO, Duration::from_secs(1)), "backoff"),
        (base().backoff(Duration::from_secs(2), Duration::from_secs(1)), "backoff"),
        (base().queue_per_partition(0), "queue_per_partition"),
        (base().operator_poll_interval(Duration::ZERO), "operator_poll_interval"),
        (base().dedup_retention(Some(Duration::ZERO)), "dedup_retention"),
        (base().batch_size(0), "batch_size"),
        (base().batch_size(10_001), "batch_size"),
        (base().batch_wait(Duration::from_secs(2)), "batch_wait"),
        (base().batch_timeout(Duration::ZERO), "batch_timeout"),
    ];
    for (config, setting) in cases {
        match Inbox::new(pool.clone(), config, Handlers::new()) {
            Err(Error::Config(message)) => assert!(message.contains(setting), "{message:?} names {setting}"),
            other => panic!("{setting}: expected Error::Config, got {other:?}"),
        }
    }
    Inbox::new(pool.clone(), base(), Handlers::new()).expect("the defaults are valid");
    let edges =
        base().batch_size(1).batch_wait(Duration::from_secs(1)).batch_timeout(Duration::from_millis(1));
    Inbox::new(pool.clone(), edges, Handlers::new()).expect("the batch settings' bounds are valid");
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

async fn start_with<H: EventHandler<Credit> + Clone>(
    pool: &PgPool,
    config: InboxConfig,
    handler: H,
) -> Running {
    let inbox = Inbox::new(pool.clone(), config, Handlers::new().on::<Credit, _>(handler)).expect("inbox");
    inbox.migrator().run(pool).await.expect("migrate");
    let stats = inbox.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(inbox.run(stop.clone()));
    Running { stop, task, stats }
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
/// cancel, the stuck record's transaction is rolled back, and its offset is not committed.
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
/// key in its own topic only (before, holds spanned every topic).
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
        RawRecord::text(0, "shared", &credit_payload("shared", 2), &credit_headers(id, Some("shared"), None));
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

/// Neighbour: a second member joins the group mid-stream while the first holds every
/// partition. The revoke stops the first member's workers of the partitions handed over,
/// drops their queued records and commits what they finished (a broker may refuse that
/// commit during the rebalance: librdkafka's mock cluster does); the new owner reads on
/// from the committed offsets. Every record applies exactly once, nothing is lost, and at
/// the end every partition's committed offset is at its end.
#[sqlx::test(migrations = false)]
async fn a_member_joining_mid_stream_takes_partitions_over_without_loss_or_double_effects(pool: PgPool) {
    let s = setup(&pool, 4).await;
    for n in 0..40 {
        s.credit(n % 4, &format!("acc-{n}"), n.into());
    }
    s.producer.flush();
    let config = s.config("rebalance");
    let first = start(&pool, config.clone(), &Ledger::default()).await;
    let stats = first.stats.clone();
    assert!(eventually(Duration::from_secs(20), || async { stats.applied() == 40 }).await);
    let second = start(&pool, config, &Ledger::default()).await;
    let joined = second.stats.clone();
    // Records keep coming until the second member applies some: it owns partitions then.
    let mut n = 40;
    let deadline = Instant::now() + Duration::from_secs(40);
    while joined.applied() == 0 && Instant::now() < deadline {
        for _ in 0..4 {
            s.credit(n % 4, &format!("acc-{n}"), n.into());
            n += 1;
        }
        s.producer.flush();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let total = u64::try_from(n).expect("count");
    let all =
        eventually(Duration::from_secs(40), || async { stats.applied() + joined.applied() == total }).await;
    let (a, b) = (first.stats.clone(), second.stats.clone());
    first.shutdown().await;
    second.shutdown().await;
    assert!(all, "applied {} + {} of {total}", a.applied(), b.applied());
    assert!(b.applied() > 0, "the second member took partitions over");
    assert_eq!(applied_amounts(&pool).await, (0..i64::from(n)).collect::<Vec<i64>>(), "each record once");
    // Both stopping at once is a rebalance too, during which a broker may refuse the final
    // commits (the mock does): a member that starts once the group has settled reads what
    // is left, absorbs it, and commits every partition to its end.
    let ends: Vec<i64> = (0..4).map(|p| i64::from((n + 3 - p) / 4)).collect();
    let left: i64 =
        ends.iter().zip(s.kafka.committed("rebalance", &s.topic, 4)).map(|(e, c)| e - c.max(0)).sum();
    let third = start(&pool, s.config("rebalance"), &Ledger::default()).await;
    let last = third.stats.clone();
    let absorbed = eventually(Duration::from_secs(30), || async {
        last.duplicates() >= u64::try_from(left).unwrap_or(0)
    })
    .await;
    third.shutdown().await;
    assert!(absorbed, "the {left} records not committed come again and are absorbed: {}", last.duplicates());
    assert_eq!(last.applied(), 0, "nothing applies twice");
    assert_eq!(s.kafka.committed("rebalance", &s.topic, 4), ends, "committed to the end of every partition");
    eprintln!("redelivered and absorbed: {} + {} + {}", a.duplicates(), b.duplicates(), last.duplicates());
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

/// Credits, except two accounts: "poison" fails permanently, "panics" panics.
#[derive(Clone, Default)]
struct Picky;

impl EventHandler<Credit> for Picky {
    async fn handle(&self, tx: &mut PgConnection, credit: Credit, meta: &Meta) -> Result<(), HandlerError> {
        match credit.account.as_str() {
            "poison" => return Err(HandlerError::permanent("this credit is poison")),
            "panics" => panic!("the handler panicked on purpose"),
            _ => {}
        }
        Ledger::default().handle(tx, credit, meta).await
    }
}

/// Transactions the inbox rows of `consumer` were written in.
async fn inbox_transactions(pool: &PgPool, consumer: &str) -> i64 {
    sqlx::query_scalar("SELECT count(DISTINCT xmin::text) FROM inbox WHERE consumer = $1")
        .bind(consumer)
        .fetch_one(pool)
        .await
        .expect("transactions")
}

/// Records waiting for a worker are applied in batches, one transaction each; a poison
/// record and a panicking one in the middle of a batch roll it back and then park alone,
/// while every other record applies exactly once and the offsets pass them all. With
/// `batch_size(1)` the same records take one transaction each: the count can tell.
#[sqlx::test(migrations = false)]
async fn a_batch_applies_in_one_transaction_and_a_poison_record_in_it_parks_alone(pool: PgPool) {
    let s = setup(&pool, 1).await;
    let mut expected = Vec::new();
    for amount in 1..=120 {
        let account = match amount {
            30 => "poison".to_owned(),
            75 => "panics".to_owned(),
            _ => {
                expected.push(amount);
                format!("acct-{}", amount % 7)
            }
        };
        s.credit(0, &account, amount);
    }
    s.producer.flush();
    let mut transactions = Vec::new();
    for (consumer, batch) in [("batched", 100), ("unbatched", 1)] {
        sqlx::query("TRUNCATE effects").execute(&pool).await.expect("truncate");
        let running = start_with(&pool, s.config(consumer).batch_size(batch), Picky).await;
        let stats = running.stats.clone();
        let settled =
            eventually(Duration::from_secs(30), || async { stats.applied() + stats.parked() == 120 }).await;
        running.shutdown().await;
        assert!(settled, "{consumer}: applied {} parked {}", stats.applied(), stats.parked());
        assert_eq!(applied_amounts(&pool).await, expected, "{consumer}: every other credit applied once");
        let parked: Vec<(i64, String, String)> = sqlx::query_as(
            "SELECT kafka_offset, status, reason FROM inbox_parked WHERE consumer = $1 ORDER BY kafka_offset",
        )
        .bind(consumer)
        .fetch_all(&pool)
        .await
        .expect("parked");
        assert_eq!(parked.len(), 2, "{consumer}: {parked:?}");
        assert_eq!((parked[0].0, parked[0].1.as_str()), (29, "parked"));
        assert!(parked[0].2.contains("this credit is poison"), "{}", parked[0].2);
        assert_eq!((parked[1].0, parked[1].1.as_str()), (74, "parked"));
        assert!(parked[1].2.contains("panicked on purpose"), "{}", parked[1].2);
        assert_eq!(
            s.kafka.committed(consumer, &s.topic, 1),
            vec![120],
            "{consumer}: offsets pass every record"
        );
        transactions.push(inbox_transactions(&pool, consumer).await);
    }
    eprintln!(
        "transactions for 118 applied records: batched {}, unbatched {}",
        transactions[0], transactions[1]
    );
    assert_eq!(transactions[1], 118, "one record per transaction");
    assert!(transactions[0] <= 20, "batched: {} transactions for 118 records", transactions[0]);
}

/// Differential: the same generated records (repeated event ids, stale, skipped and
/// missing versions, records without a subject, several accounts per batch) applied one
/// per transaction and in batches come to the same outcomes, effects and aggregate rows.
/// The batched run takes the set-based path (fewer transactions); `OUTBOX_TEST_SEED`
/// replays a run.
#[sqlx::test(migrations = false)]
async fn batches_come_to_the_outcomes_records_one_by_one_come_to(pool: PgPool) {
    let s = setup(&pool, 1).await;
    let mut rng = outbox_tests::Rng::from_env("inbox_batches");
    let mut sent: Vec<(Uuid, String, i64, Option<i64>)> = Vec::new();
    let mut versions = [0i64; 5];
    for amount in 1..=400 {
        let (id, account, version) = match rng.range(0, 10) {
            // The same event again.
            0 if !sent.is_empty() => {
                let (id, account, _, version) = sent[rng.range(0, sent.len() as u64) as usize].clone();
                (id, account, version)
            }
            choice => {
                let a = rng.range(0, 5) as usize;
                let version = match choice {
                    1 => Some((versions[a] - 1).max(1)), // stale (or the first)
                    2 => None,
                    3 => {
                        versions[a] += 3; // a gap
                        Some(versions[a])
                    }
                    _ => {
                        versions[a] += 1;
                        Some(versions[a])
                    }
                };
                (Uuid::now_v7(), format!("acct-{a}"), version)
            }
        };
        let subject = (amount % 17 != 0).then_some(account.as_str());
        let record = RawRecord::text(
            0,
            &account,
            &credit_payload(&account, amount),
            &credit_headers(id, subject, version),
        );
        s.producer.send(&s.topic, &record);
        sent.push((id, account, amount, version));
    }
    s.producer.flush();
    let mut results = Vec::new();
    for (consumer, batch) in [("one", 1), ("many", 100)] {
        sqlx::query("TRUNCATE effects").execute(&pool).await.expect("truncate");
        let running = start_with(&pool, s.config(consumer).batch_size(batch), Ledger::default()).await;
        let stats = running.stats.clone();
        let settled = eventually(Duration::from_secs(30), || async {
            stats.applied() + stats.duplicates() + stats.stale() == 400
        })
        .await;
        running.shutdown().await;
        assert!(
            settled,
            "{consumer}: {} applied, {} duplicate, {} stale",
            stats.applied(),
            stats.duplicates(),
            stats.stale()
        );
        let outcomes: Vec<(Uuid, String)> =
            sqlx::query_as("SELECT event_id, outcome FROM inbox WHERE consumer = $1 ORDER BY event_id")
                .bind(consumer)
                .fetch_all(&pool)
                .await
                .expect("outcomes");
        let aggregates: Vec<(String, i64, i64, i64)> = sqlx::query_as(
            "SELECT aggregate_id, last_version, gaps, stale FROM inbox_aggregates WHERE consumer = $1 ORDER BY 1",
        )
        .bind(consumer)
        .fetch_all(&pool)
        .await
        .expect("aggregates");
        let effects: Vec<(Uuid, i64)> =
            sqlx::query_as("SELECT event_id, amount FROM effects ORDER BY kafka_offset")
                .fetch_all(&pool)
                .await
                .expect("effects");
        let counts = (stats.applied(), stats.duplicates(), stats.stale());
        results.push((outcomes, aggregates, effects, counts, inbox_transactions(&pool, consumer).await));
    }
    let (one, many) = (&results[0], &results[1]);
    eprintln!("counts (applied, duplicate, stale) {:?}; transactions: one {}, many {}", one.3, one.4, many.4);
    assert_eq!(many.3, one.3, "the same counts");
    assert_eq!(many.0, one.0, "the same outcome per event");
    assert_eq!(many.1, one.1, "the same aggregate rows");
    assert_eq!(many.2, one.2, "the same effects, in the same order");
    assert!(one.3 .1 > 0 && one.3 .2 > 0, "the generator made duplicates and stale events: {:?}", one.3);
    assert!(many.4 * 4 < one.4, "batched: {} transactions against {}", many.4, one.4);
}
