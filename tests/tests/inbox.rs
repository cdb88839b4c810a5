//! The inbox against real PostgreSQL and a Kafka-protocol broker (invariants 7, 8, 9).
//! Each test produces raw records to a topic of its own, exactly as the relay would (or
//! deliberately not), and consumes them with a consumer group.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::inbox::{
    EventHandler, HandlerError, Handlers, Inbox, InboxConfig, InboxStats, Meta, RawHandler,
};
use outbox_runtime::OutboxEvent;
use outbox_tests::eventually;
use outbox_tests::kafka::Kafka;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The test event: credit `amount` to `account`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "test.credit", schema_version = 1, aggregate = "account", topic = "unused")]
struct Credit {
    #[outbox(aggregate_id)]
    account: String,
    amount: i64,
}

/// Applies credits to a `credits` table. Fails transiently `fail_first` times, and
/// permanently for accounts listed in `blocked_accounts`.
#[derive(Clone, Default)]
struct Ledger {
    fail_first: Arc<AtomicU32>,
    calls: Arc<AtomicU32>,
    /// Credits to account `slow` wait for a permit here.
    gate: Option<Arc<tokio::sync::Semaphore>>,
}

impl EventHandler<Credit> for Ledger {
    async fn handle(&self, tx: &mut PgConnection, credit: Credit, meta: &Meta) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let (Some(gate), "slow") = (&self.gate, credit.account.as_str()) {
            gate.acquire().await.expect("gate").forget();
        }
        if credit.account == "panic" {
            panic!("the ledger cannot take account {}", credit.account);
        }
        // Written before any failure: a rollback must take it away.
        sqlx::query("INSERT INTO credits (event_id, account, amount) VALUES ($1, $2, $3)")
            .bind(meta.event_id)
            .bind(&credit.account)
            .bind(credit.amount)
            .execute(&mut *tx)
            .await?;
        if self.fail_first.load(Ordering::SeqCst) > 0 {
            self.fail_first.fetch_sub(1, Ordering::SeqCst);
            return Err(HandlerError::transient("the ledger is busy"));
        }
        let blocked: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM blocked_accounts WHERE account = $1)")
                .bind(&credit.account)
                .fetch_one(&mut *tx)
                .await?;
        if blocked {
            return Err(HandlerError::permanent(format!("account {} is blocked", credit.account)));
        }
        Ok(())
    }
}

struct Setup {
    kafka: Kafka,
    topic: String,
    producer: FutureProducer,
}

async fn setup(pool: &PgPool) -> Setup {
    sqlx::query(
        "CREATE TABLE credits (event_id uuid NOT NULL, account text NOT NULL, amount bigint NOT NULL)",
    )
    .execute(pool)
    .await
    .expect("credits");
    sqlx::query("CREATE TABLE blocked_accounts (account text PRIMARY KEY)")
        .execute(pool)
        .await
        .expect("blocked");
    let kafka = Kafka::start();
    let topic = format!("inbox-{}", Uuid::new_v4().simple());
    kafka.create_topic(&topic, 3).await;
    let producer =
        ClientConfig::new().set("bootstrap.servers", kafka.bootstrap()).create().expect("producer");
    Setup { kafka, topic, producer }
}

/// The headers the relay writes.
fn event_headers(
    event_id: Uuid,
    event_type: &str,
    version: Option<i64>,
    subject: &str,
) -> Vec<(String, String)> {
    let mut h = vec![
        ("ce_specversion".to_owned(), "1.0".to_owned()),
        ("ce_id".to_owned(), event_id.to_string()),
        ("ce_type".to_owned(), event_type.to_owned()),
        ("ce_source".to_owned(), "/tests".to_owned()),
        ("ce_subject".to_owned(), subject.to_owned()),
        ("ce_schemaversion".to_owned(), "1".to_owned()),
        ("ce_aggregatetype".to_owned(), "account".to_owned()),
    ];
    if let Some(v) = version {
        h.push(("ce_aggregateversion".to_owned(), v.to_string()));
    }
    h
}

impl Setup {
    async fn produce(&self, key: &str, payload: &[u8], headers: &[(String, String)]) {
        self.produce_to(None, key, payload, headers).await;
    }

    async fn produce_to(
        &self,
        partition: Option<i32>,
        key: &str,
        payload: &[u8],
        headers: &[(String, String)],
    ) {
        let mut owned = OwnedHeaders::new();
        for (k, v) in headers {
            owned = owned.insert(Header { key: k, value: Some(v.as_bytes()) });
        }
        let mut record = FutureRecord::to(&self.topic).key(key.as_bytes()).payload(payload).headers(owned);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        self.producer.send(record, Duration::from_secs(10)).await.expect("produce");
    }

    /// Produces a well-formed credit; returns its event id.
    async fn credit(&self, account: &str, amount: i64, version: Option<i64>) -> Uuid {
        let id = Uuid::now_v7();
        let payload = serde_json::to_vec(&Credit { account: account.into(), amount }).expect("json");
        self.produce(account, &payload, &event_headers(id, "test.credit", version, account)).await;
        id
    }

    fn config(&self, consumer: &str) -> InboxConfig {
        InboxConfig::new(consumer, self.kafka.bootstrap(), [self.topic.clone()])
            .backoff(Duration::from_millis(50), Duration::from_millis(400))
            .commit_interval(Duration::from_millis(100))
    }
}

struct Running {
    stop: CancellationToken,
    task: JoinHandle<outbox_runtime::Result<()>>,
    stats: Arc<InboxStats>,
}

async fn start(pool: &PgPool, config: InboxConfig, ledger: &Ledger) -> (Running, Inbox) {
    let handlers = Handlers::new().on::<Credit, _>(ledger.clone()).ignore("test.audit");
    let inbox = Inbox::new(pool.clone(), config.clone(), handlers.clone()).expect("inbox");
    inbox.migrator().run(pool).await.expect("migrate");
    let operator = Inbox::new(pool.clone(), config, handlers).expect("inbox");
    let stats = inbox.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(inbox.run(stop.clone()));
    (Running { stop, task, stats }, operator)
}

impl Running {
    async fn shutdown(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("inbox stops")
            .expect("task")
            .expect("clean stop");
    }
}

async fn credits(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT account, amount FROM credits ORDER BY amount")
        .fetch_all(pool)
        .await
        .expect("credits")
}

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect("count")
}

#[sqlx::test(migrations = false)]
async fn the_same_event_delivered_five_times_applies_once(pool: PgPool) {
    // Fault: one event delivered 5 times (a relay that republished it). Invariant 8.
    let s = setup(&pool).await;
    let id = Uuid::now_v7();
    let payload = serde_json::to_vec(&Credit { account: "acc-1".into(), amount: 10 }).expect("json");
    for _ in 0..5 {
        s.produce("acc-1", &payload, &event_headers(id, "test.credit", None, "acc-1")).await;
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
    let ok = |k: &str| event_headers(Uuid::now_v7(), "test.credit", None, k);
    s.produce("bad-1", b"{\"account\":\"bad-1\",\"amount\":1}", &[]).await;
    s.produce("bad-2", b"not json at all", &ok("bad-2")).await;
    s.produce(
        "bad-3",
        b"{\"account\":\"bad-3\",\"amount\":3}",
        &event_headers(Uuid::now_v7(), "test.unknown", None, "bad-3"),
    )
    .await;
    s.produce("bad-4", b"{\"account\":\"bad-4\",\"amount\":\"four\"}", &ok("bad-4")).await;
    s.credit("bad-1", 5, None).await; // behind the parked record of its key
    s.credit("good", 7, None).await;
    // A type this consumer ignores on purpose is skipped, not parked.
    s.produce("audit", b"{}", &event_headers(Uuid::now_v7(), "test.audit", None, "audit")).await;
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
    assert_eq!(reason_of("bad-3", "parked"), "no handler for event type test.unknown version 1");
    assert!(reason_of("bad-4", "parked").starts_with("payload does not decode as test.credit v1"));
    assert!(reason_of("bad-1", "held").starts_with("held behind parked message"));
    assert_eq!(reason_of("bad-5", "parked"), "header ce_type contains a NUL byte: not storable as text");
    assert_eq!(reason_of("panic", "parked"), "handler panicked: the ledger cannot take account panic");
    let raw = parked.iter().find(|p| p.record_key.as_deref() == Some(b"bad-2".as_slice())).expect("bad-2");
    assert_eq!(raw.payload, b"not json at all", "raw bytes are kept");
}

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
    let payload = serde_json::to_vec(&Credit { account: "acc-c".into(), amount: 100 }).expect("json");
    s.produce("acc-c", &payload, &event_headers(discarded_event, "test.credit", None, "acc-c")).await;
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
    let payload = |account: &str, amount: i64| {
        serde_json::to_vec(&Credit { account: account.into(), amount }).expect("json")
    };
    for (partition, account, amount) in [(0, "slow", 1), (0, "p0-next", 2), (1, "p1-a", 3), (1, "p1-b", 4)] {
        let headers = event_headers(Uuid::now_v7(), "test.credit", None, account);
        s.produce_to(Some(partition), account, &payload(account, amount), &headers).await;
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
        "INSERT INTO inbox (consumer, event_id, event_type, schema_version, topic, kafka_partition, kafka_offset, applied_at) \
         SELECT 'cleanup', gen_random_uuid(), 'test.credit', 1, 't', 0, n, \
                CASE WHEN n <= 25 THEN now() - interval '40 days' ELSE now() END \
         FROM generate_series(1, 30) AS n",
    )
    .execute(&pool)
    .await
    .expect("rows");
    let deleted = inbox.delete_applied(Duration::from_secs(30 * 86_400), 10).await.expect("cleanup");
    assert_eq!(deleted, 25);
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, 5, "recent dedup keys stay");
    assert_eq!(count(&pool, "SELECT min(kafka_offset) FROM inbox").await, 26);
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
    s.produce("k", br#"{"anything":true}"#, &event_headers(Uuid::now_v7(), "test.other", None, "k")).await;
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
