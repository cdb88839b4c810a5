//! Leases and fencing against real PostgreSQL.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::claim::{Placement, Row, Statements};
use super::cursor::FreshCursor;
use super::lease::Leases;
use super::mark::{Fence, Marked, Marks};
use crate::{Outbox, OutboxConfig, OutboxEvent};

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "test.ping", schema_version = 1, aggregate = "test", topic = "test")]
struct Ping {
    #[outbox(aggregate_id)]
    id: u32,
}

const TTL: Duration = Duration::from_secs(30);

async fn one_partition_outbox(pool: &PgPool) -> Outbox {
    let outbox = Outbox::new(OutboxConfig::default().work_partitions(1)).expect("config");
    outbox.migrator().run(pool).await.expect("migrate");
    let mut tx = pool.begin().await.expect("begin");
    outbox.append(&mut tx, &Ping { id: 1 }).await.expect("append");
    outbox.append(&mut tx, &Ping { id: 2 }).await.expect("append");
    tx.commit().await.expect("commit");
    outbox
}

fn fence_of(leases: &Leases) -> Fence {
    let (partitions, tokens) = leases.fence();
    Fence { relay_id: leases.relay_id(), partitions, tokens }
}

#[sqlx::test(migrations = false)]
async fn a_relay_whose_lease_expired_cannot_mark_rows_taken_over(pool: PgPool) {
    // Fault: relay A stalls past its lease while B takes the partition over. Invariant 5:
    // A's marks are refused (fenced); B's go through; A learns it lost the lease.
    let outbox = one_partition_outbox(&pool).await;
    let sql = Statements::new(outbox.names());
    let mut a = Leases::new(outbox.names(), Uuid::new_v4(), TTL);
    assert_eq!(a.maintain(&pool).await.expect("maintain").acquired, [0]);
    let rows = sql.claim(&pool, &a.partitions(Duration::ZERO), 10, &[]).await.expect("claim");
    assert_eq!(rows.len(), 2);

    let mut b = Leases::new(outbox.names(), Uuid::new_v4(), TTL);
    assert!(
        b.maintain(&pool).await.expect("maintain").acquired.is_empty(),
        "no takeover while A's lease runs"
    );

    sqlx::query("UPDATE outbox_leases SET expires_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .expect("expire");
    assert_eq!(b.maintain(&pool).await.expect("maintain").acquired, [0], "B takes the expired partition");

    let marks = || Marks {
        published: vec![(rows[0].id, Placement { partition: 0, offset: 7 })],
        retry: vec![(rows[1].id, Duration::from_secs(1), "transient".into(), true)],
        failed: Vec::new(),
    };
    let refused = sql.mark(&pool, &marks(), &fence_of(&a)).await.expect("mark");
    assert_eq!(refused, Marked::default(), "A's marks are fenced off");
    let untouched: Vec<(String, i32)> = sqlx::query_as("SELECT status, attempts FROM outbox ORDER BY id")
        .fetch_all(&pool)
        .await
        .expect("rows");
    assert_eq!(untouched, [("pending".to_owned(), 0), ("pending".to_owned(), 0)]);

    let accepted = sql.mark(&pool, &marks(), &fence_of(&b)).await.expect("mark");
    assert_eq!(accepted, Marked { published: 1, retry: 1, failed: 0 });

    assert_eq!(a.maintain(&pool).await.expect("maintain").lost, [0], "A finds out at its next renewal");
    assert!(a.partitions(Duration::ZERO).is_empty());
}

#[sqlx::test(migrations = false)]
async fn fair_share_splits_partitions_between_live_relays(pool: PgPool) {
    let outbox = Outbox::new(OutboxConfig::default().work_partitions(8)).expect("config");
    outbox.migrator().run(&pool).await.expect("migrate");
    let mut a = Leases::new(outbox.names(), Uuid::new_v4(), TTL);
    assert_eq!(a.maintain(&pool).await.expect("maintain").acquired.len(), 8, "alone, A takes all");
    let mut b = Leases::new(outbox.names(), Uuid::new_v4(), TTL);
    assert!(b.maintain(&pool).await.expect("maintain").acquired.is_empty(), "nothing free yet");
    assert_eq!(a.maintain(&pool).await.expect("maintain").released.len(), 4, "A sees B and gives back half");
    assert_eq!(b.maintain(&pool).await.expect("maintain").acquired.len(), 4);
    let (mut pa, pb) = (a.partitions(Duration::ZERO), b.partitions(Duration::ZERO));
    pa.extend(&pb);
    pa.sort_unstable();
    assert_eq!(pa, (0..8).collect::<Vec<_>>(), "disjoint and complete");

    b.release_all(&pool).await.expect("release");
    assert_eq!(a.maintain(&pool).await.expect("maintain").acquired.len(), 4, "A takes B's back at once");
}

/// A claim must cost O(batch), not O(backlog): with 20,000 pending rows, the check for an
/// earlier blocking event of the same aggregate goes through the small `blocked` partial
/// index (of a partitioned table, its partitions'). Planned as a scan of every open row, a
/// claim over 100k pending rows took 14.9 ms instead of 0.4 ms (BENCHMARKS.md). For both
/// layouts: an existing install's plain table and a new install's partitioned one.
#[sqlx::test(migrations = false)]
async fn the_claims_order_check_probes_the_blocked_index_not_every_open_row(pool: PgPool) {
    for (schema, partitioned) in [("plain", false), ("public", true)] {
        let outbox = Outbox::new(OutboxConfig::default().schema(schema)).expect("outbox");
        if partitioned {
            outbox.migrator().run(&pool).await.expect("migrate");
        } else {
            crate::migrate::migrate_existing(&outbox, &pool).await;
        }
        assert_eq!(outbox.ops().is_partitioned(&pool).await.expect("layout"), partitioned, "{schema}");
        let table = &outbox.names().outbox;
        sqlx::query(crate::table::sql(format!(
            "INSERT INTO {table} (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload) \
             SELECT gen_random_uuid(), 'test', 'a' || (g % 2000), 'test.ping', 1, 'test', '{{}}' \
             FROM generate_series(1, 20000) AS g"
        )))
        .execute(&pool)
        .await
        .expect("backlog");
        // One aggregate waits for a retry, so there is something to find.
        let first: i64 = sqlx::query_scalar(crate::table::sql(format!("SELECT min(id) FROM {table}")))
            .fetch_one(&pool)
            .await
            .expect("first");
        sqlx::query(crate::table::sql(format!(
            "UPDATE {table} SET next_attempt_at = now() + interval '1 hour', attempts = 1 WHERE id = {first}"
        )))
        .execute(&pool)
        .await
        .expect("retrying");
        sqlx::query(crate::table::sql(format!("ANALYZE {table}"))).execute(&pool).await.expect("analyze");
        let blocked: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_class c \
             WHERE c.oid = $1::regclass OR c.oid IN (SELECT relid FROM pg_partition_tree($1::regclass))",
        )
        .bind(format!("\"{schema}\".outbox_blocked"))
        .fetch_all(&pool)
        .await
        .expect("the blocked index");
        let sql = if partitioned {
            Statements::partitioned(outbox.names())
        } else {
            Statements::new(outbox.names())
        };
        let partitions: Vec<i32> = (0..32).collect();
        for statement in sql.claim_sql() {
            let plan: serde_json::Value =
                sqlx::query_scalar(crate::table::sql(format!("EXPLAIN (FORMAT JSON) {statement}")))
                    .bind(&partitions)
                    .bind(500_i64)
                    .bind(Vec::<i64>::new())
                    .bind(0_i64)
                    .bind(FreshCursor::window(500))
                    .fetch_one(&pool)
                    .await
                    .expect("explain");
            let plan = plan.to_string();
            assert!(
                blocked.iter().any(|index| plan.contains(&format!("\"Index Name\":\"{index}\""))),
                "{schema}: the order check must use the blocked index ({blocked:?}): {plan}"
            );
        }
        let rows = sql.claim(&pool, &partitions, 500, &[]).await.expect("claim");
        assert_eq!(rows.len(), 500);
        assert!(
            rows.iter().all(|r| r.aggregate_id != "a1" || r.id == first)
                && rows.iter().all(|r| r.id != first),
            "{schema}: a1 waits behind its retrying event"
        );
    }
}

/// Rows of `relation` each scan node of `plan` (EXPLAIN ANALYZE, FORMAT JSON) read, in
/// all loops, with the node's type and index.
pub(super) fn rows_read(plan: &serde_json::Value, relation: &str) -> Vec<(String, String, u64)> {
    fn walk(node: &serde_json::Value, relation: &str, found: &mut Vec<(String, String, u64)>) {
        // Scan nodes only: the UPDATE node above them names the table too.
        if node["Relation Name"] == relation && node["Node Type"] != "ModifyTable" {
            let rows = node["Actual Rows"].as_f64().unwrap_or(0.0)
                + node["Rows Removed by Filter"].as_f64().unwrap_or(0.0);
            let loops = node["Actual Loops"].as_f64().unwrap_or(1.0);
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            found.push((
                node["Node Type"].as_str().unwrap_or("").to_owned(),
                node["Index Name"].as_str().unwrap_or("").to_owned(),
                (rows * loops) as u64,
            ));
        }
        for child in node["Plans"].as_array().into_iter().flatten() {
            walk(child, relation, found);
        }
    }
    let mut found = Vec::new();
    walk(&plan[0]["Plan"], relation, &mut found);
    found
}

/// Issue 13: with 100,000 pending rows in a table never analysed (a sudden backlog while
/// autovacuum is behind), the claim sorted every pending row and each mark hashed every
/// pending row with a fence subquery per row (600 ms and 750 ms a batch in psql, seconds
/// under load). Both must read O(batch) rows of the outbox, through their indexes, on
/// an un-analysed table and on an analysed one.
#[sqlx::test(migrations = false)]
async fn claim_and_marks_read_o_batch_rows_whatever_the_statistics(pool: PgPool) {
    const PENDING: i64 = 100_000;
    const BATCH: usize = 2_000;
    let outbox = Outbox::default_ref();
    outbox.migrator().run(&pool).await.expect("migrate");
    sqlx::query(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, \
                             topic, payload) \
         SELECT gen_random_uuid(), 'test', 'a' || (g % 10000), g / 10000 + 1, 'test.ping', 1, 'test', \
                json_build_object('pad', repeat('x', 500)) \
         FROM generate_series(1, $1) AS g",
    )
    .bind(PENDING)
    .execute(&pool)
    .await
    .expect("backlog");
    let sql = Statements::new(outbox.names());
    let mut leases = Leases::new(outbox.names(), Uuid::new_v4(), TTL);
    leases.maintain(&pool).await.expect("maintain");
    let partitions = leases.partitions(Duration::ZERO);
    let fence = fence_of(&leases);
    for analysed in [false, true] {
        if analysed {
            sqlx::query("ANALYZE outbox").execute(&pool).await.expect("analyze");
        }
        let plans = sql.explain_claim(&pool, &partitions, BATCH as i64).await.expect("explain claim");
        let read: Vec<_> = plans.iter().flat_map(|plan| rows_read(plan, "outbox")).collect();
        let total: u64 = read.iter().map(|(_, _, n)| n).sum();
        assert!(
            read.iter().all(|(node, _, _)| node.starts_with("Index")) && total <= 3 * BATCH as u64,
            "analysed {analysed}: the claim reads {total} rows of outbox: {read:?}"
        );
        let rows = sql.claim(&pool, &partitions, BATCH as i64, &[]).await.expect("claim");
        assert_eq!(rows.len(), BATCH);
        let marks = Marks {
            published: rows[..BATCH - 200]
                .iter()
                .map(|r| (r.id, Placement { partition: 0, offset: r.id }))
                .collect(),
            retry: rows[BATCH - 200..BATCH - 100]
                .iter()
                .map(|r| (r.id, Duration::from_secs(60), "broker down".to_owned(), true))
                .collect(),
            failed: rows[BATCH - 100..].iter().map(|r| (r.id, "too large".to_owned())).collect(),
        };
        let plans = sql.explain_mark(&pool, &marks, &fence).await.expect("explain marks");
        assert_eq!(plans.len(), 3, "published, retry and failed marks");
        for (plan, asked) in plans.iter().zip([BATCH - 200, 100, 100]) {
            let read = rows_read(plan, "outbox");
            let total: u64 = read.iter().map(|(_, _, n)| n).sum();
            assert!(
                read.iter().all(|(node, _, _)| node.starts_with("Index")) && total <= 2 * asked as u64,
                "analysed {analysed}: a mark of {asked} rows reads {total} rows of outbox: {read:?}"
            );
        }
        // The marks themselves still do what they did.
        let marked = sql.mark(&pool, &marks, &fence).await.expect("mark");
        assert_eq!(marked, Marked { published: 1800, retry: 100, failed: 100 });
    }
}

/// Issue 24: during a broker outage every pending row waits for a retry, and the claim
/// walked the pending index in id order past all of them, on every claim, exactly when the
/// backlog was largest (419 ms a claim with 1,000,000 rows waiting and 10 due, in psql).
/// With 1,000,000 rows not due and 10 due, a claim reads O(batch) rows of the outbox,
/// through indexes, analysed or not, and returns the 10.
#[sqlx::test(migrations = false)]
async fn a_claim_reads_o_batch_rows_when_a_million_wait_for_a_retry(pool: PgPool) {
    const WAITING: i64 = 1_000_000;
    let outbox = Outbox::default_ref();
    outbox.migrator().run(&pool).await.expect("migrate");
    sqlx::query(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload, \
                             attempts, next_attempt_at, last_error) \
         SELECT gen_random_uuid(), 'test', 'a' || g, 'test.ping', 1, 'test', '{}', 3, \
                now() + interval '1 hour' + g * interval '1 millisecond', 'broker down' \
         FROM generate_series(1, $1) AS g",
    )
    .bind(WAITING)
    .execute(&pool)
    .await
    .expect("waiting rows");
    // Ten due, of aggregates of their own: five fresh, five whose retry is due.
    sqlx::query(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload, \
                             attempts, next_attempt_at) \
         SELECT gen_random_uuid(), 'test', 'due' || g, 'test.ping', 1, 'test', '{}', \
                CASE WHEN g <= 5 THEN 0 ELSE 1 END, \
                CASE WHEN g <= 5 THEN '-infinity'::timestamptz ELSE now() - interval '1 second' END \
         FROM generate_series(1, 10) AS g",
    )
    .execute(&pool)
    .await
    .expect("due rows");
    let sql = Statements::new(outbox.names());
    let partitions: Vec<i32> = (0..32).collect();
    for analysed in [false, true] {
        if analysed {
            sqlx::query("ANALYZE outbox").execute(&pool).await.expect("analyze");
        }
        let plans = sql.explain_claim(&pool, &partitions, 500).await.expect("explain claim");
        let read: Vec<_> = plans.iter().flat_map(|plan| rows_read(plan, "outbox")).collect();
        let total: u64 = read.iter().map(|(_, _, n)| n).sum();
        assert!(
            read.iter().all(|(node, _, _)| node.starts_with("Index")) && total <= 100,
            "analysed {analysed}: a claim reads {total} rows of outbox: {read:?}"
        );
        let rows = sql.claim(&pool, &partitions, 500, &[]).await.expect("claim");
        let mut due: Vec<&str> = rows.iter().map(|r| r.aggregate_id.as_str()).collect();
        due.sort_unstable();
        assert_eq!(due, ["due1", "due10", "due2", "due3", "due4", "due5", "due6", "due7", "due8", "due9"]);
    }
}

/// Per-aggregate order with the claim's two walks (fresh rows by id, rows due for a retry
/// by due time): a row waiting for a retry holds back every later row of its aggregate,
/// due or not, and rows due out of id order come one at a time, the earliest first.
#[sqlx::test(migrations = false)]
async fn the_claim_keeps_each_aggregate_in_order_across_its_two_walks(pool: PgPool) {
    let outbox = Outbox::default_ref();
    outbox.migrator().run(&pool).await.expect("migrate");
    // Aggregate a: 1 due (retry), 2 fresh. Aggregate b: 3 due later than 4, both due.
    // Aggregate c: 5 fresh, 6 due (5 committed after 6 was tried: ids are taken at insert).
    sqlx::query(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload, \
                             attempts, next_attempt_at) VALUES \
         (gen_random_uuid(), 't', 'a', 'e', 1, 't', '{}', 1, now() - interval '1 second'), \
         (gen_random_uuid(), 't', 'a', 'e', 1, 't', '{}', 0, '-infinity'), \
         (gen_random_uuid(), 't', 'b', 'e', 1, 't', '{}', 1, now() - interval '1 second'), \
         (gen_random_uuid(), 't', 'b', 'e', 1, 't', '{}', 1, now() - interval '2 seconds'), \
         (gen_random_uuid(), 't', 'c', 'e', 1, 't', '{}', 0, '-infinity'), \
         (gen_random_uuid(), 't', 'c', 'e', 1, 't', '{}', 1, now() - interval '1 second')",
    )
    .execute(&pool)
    .await
    .expect("rows");
    let sql = Statements::new(outbox.names());
    let partitions: Vec<i32> = (0..32).collect();
    let ids = |rows: Vec<Row>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(sql.claim(&pool, &partitions, 100, &[]).await.expect("claim")), [1, 3, 5, 6]);
    // A limit keeps the lowest ids of both walks: never 6 without 5.
    assert_eq!(ids(sql.claim(&pool, &partitions, 2, &[]).await.expect("claim")), [1, 3]);
    assert_eq!(ids(sql.claim(&pool, &partitions, 3, &[]).await.expect("claim")), [1, 3, 5]);
}

/// Settings that would let a send outlive its lease or weaken acks, idempotence or order,
/// set directly, through librdkafka's aliases or with its `topic.` prefix. Before the fix
/// each of these was accepted (invariant 12).
#[test]
fn settings_that_break_a_guarantee_are_refused_whatever_name_sets_them() {
    use super::RelayConfig;
    let base = || RelayConfig::new("127.0.0.1:9092");
    let cases: Vec<(RelayConfig, &str)> = vec![
        (base().message_timeout(Duration::ZERO), "message_timeout is 0"),
        (base().kafka_setting("message.timeout.ms", "600000"), "message.timeout.ms"),
        (base().kafka_setting("delivery.timeout.ms", "600000"), "delivery.timeout.ms"),
        (base().kafka_setting("topic.message.timeout.ms", "600000"), "topic.message.timeout.ms"),
        (base().kafka_setting("acks", "1"), "acks"),
        (base().kafka_setting("request.required.acks", "1"), "request.required.acks"),
        (base().kafka_setting("topic.acks", "0"), "topic.acks"),
        (base().kafka_setting("enable.idempotence", "false"), "enable.idempotence"),
        (
            base().kafka_setting("max.in.flight.requests.per.connection", "100"),
            "max.in.flight.requests.per.connection",
        ),
        (base().kafka_setting("max.in.flight", "6"), "max.in.flight"),
        (base().kafka_setting("max.in.flight", "5"), "max.in.flight"),
        (base().kafka_setting("enable.gapless.guarantee", "false"), "enable.gapless.guarantee"),
        (base().kafka_setting("transactional.id", "relay-1"), "transactional.id"),
        (base().max_attempts(Some(0)), "max_attempts"),
        (base().lease_ttl(Duration::from_secs(15)).message_timeout(Duration::from_secs(10)), "lease_ttl"),
        (base().missing_topic_timeout(Duration::ZERO), "missing_topic_timeout"),
        (
            base().schema_ids(crate::schema_registry::SchemaIds::new(Default::default())),
            "schema_ids holds no schema",
        ),
    ];
    for (config, setting) in cases {
        match config.validate() {
            Err(crate::Error::Config(message)) => {
                assert!(message.contains(setting), "{message:?} names {setting}")
            }
            other => panic!("{setting}: expected Error::Config, got {other:?}"),
        }
    }
    base()
        .kafka_setting("max.in.flight", "1")
        .kafka_setting("compression.type", "lz4")
        .validate()
        .expect("allowed");
    let secret = base().kafka_setting("sasl.password", "hunter2").kafka_setting("transactional.id", "x");
    assert!(!format!("{secret:?}").contains("hunter2"), "Debug redacts secrets");
}

/// Secrets never reach `Debug`: secret settings, and passwords in URL-valued settings and
/// in the brokers string, whichever form the URL takes.
#[test]
fn debug_never_shows_a_secret() {
    use super::RelayConfig;
    let config = RelayConfig::new("sasl_ssl://svc:hunter1@broker:9093")
        .kafka_setting("sasl.password", "hunter2")
        .kafka_setting("ssl.key.password", "hunter3")
        .kafka_setting("sasl.oauthbearer.client.secret", "hunter4")
        .kafka_setting("sasl.oauthbearer.token.endpoint.url", "https://idp/token?client_secret=hunter5")
        .kafka_setting("security.protocol", "SASL_SSL");
    let shown = format!("{config:?}");
    assert!(!shown.contains("hunter"), "{shown}");
    assert!(
        shown.contains("SASL_SSL") && shown.contains("https://idp/token?client_secret=(redacted)"),
        "{shown}"
    );
}

/// Fault: relay A's mark waits on a row lock (an operator's transaction holds the row)
/// after its snapshot saw A's token; meanwhile A's lease has expired and B tries to take
/// the partition over. Invariant 5: a takeover and a mark of the old owner never both
/// commit. Before the fix B took over while the mark waited, and the mark then went
/// through (token 5 -> 6 committed, the old owner's UPDATE still counted 1).
#[sqlx::test(migrations = false)]
async fn a_takeover_never_commits_under_a_blocked_mark_of_the_old_owner(pool: PgPool) {
    let outbox = one_partition_outbox(&pool).await;
    let sql = std::sync::Arc::new(Statements::new(outbox.names()));
    let mut a = Leases::new(outbox.names(), Uuid::new_v4(), TTL);
    assert_eq!(a.maintain(&pool).await.expect("maintain").acquired, [0]);
    let rows = sql.claim(&pool, &a.partitions(Duration::ZERO), 10, &[]).await.expect("claim");
    sqlx::query("UPDATE outbox_leases SET expires_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .expect("expire");
    // Another transaction holds row 0.
    let mut holder = pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE")
        .bind(rows[0].id)
        .execute(&mut *holder)
        .await
        .expect("lock row");
    let marks =
        Marks { published: vec![(rows[0].id, Placement { partition: 0, offset: 1 })], ..Marks::default() };
    let fence = fence_of(&a);
    let mark = {
        let (pool, sql) = (pool.clone(), sql.clone());
        tokio::spawn(async move { sql.mark(&pool, &marks, &fence).await })
    };
    // Wait until the mark is blocked on the row lock.
    let mut waiting = false;
    for _ in 0..100 {
        waiting = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE %outbox%')",
        )
        .fetch_one(&pool)
        .await
        .expect("activity");
        if waiting {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(waiting, "the mark waits on the row lock");
    let mut b = Leases::new(outbox.names(), Uuid::new_v4(), TTL);
    let took_over = b.maintain(&pool).await.expect("maintain").acquired;
    holder.commit().await.expect("release the row");
    let marked = tokio::time::timeout(Duration::from_secs(10), mark)
        .await
        .expect("mark ends")
        .expect("task")
        .expect("mark");
    assert!(
        took_over.is_empty() || marked.published == 0,
        "B took the partition over ({took_over:?}) and A's blocked mark still counted {}",
        marked.published
    );
    // Once the mark is done, B takes the partition over.
    assert_eq!(b.maintain(&pool).await.expect("maintain").acquired, [0]);
}
