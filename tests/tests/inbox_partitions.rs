//! The dedup table in partitions (invariant 16): a new install is partitioned; a redelivered
//! event is absorbed however many partitions came since; a partition goes only when every
//! consumer with rows in it is past its own retention; rows of a span without a partition
//! wait in the default one and move into it; an existing table is converted while its
//! consumer runs, and events applied before the conversion are still absorbed after it.

use std::time::Duration;

use outbox_runtime::inbox::{Handlers, Inbox, InboxAdmin, InboxConfig, KeptPartition, PartitionReport};
use outbox_tests::eventually;
use outbox_tests::inbox_kit::effects::{credit_headers, setup, start, Ledger};
use outbox_tests::raw::RawRecord;
use outbox_tests::Credit;
use sqlx::PgPool;
use uuid::{NoContext, Timestamp, Uuid};

/// The partition of the dedup table that holds `id` of `consumer`.
async fn partition_of(pool: &PgPool, consumer: &str, id: Uuid) -> String {
    sqlx::query_scalar("SELECT tableoid::regclass::text FROM inbox WHERE consumer = $1 AND event_id = $2")
        .bind(consumer)
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("the row")
}

/// Inserts a dedup row as the inbox does; `true` when it was new.
async fn insert(pool: &PgPool, consumer: &str, id: Uuid) -> bool {
    sqlx::query(
        "INSERT INTO inbox (consumer, event_id, event_type, schema_version, topic, kafka_partition, kafka_offset, bucket) \
         VALUES ($1, $2, 'x.y', 1, 't', 0, 0, inbox_bucket($2)) ON CONFLICT DO NOTHING",
    )
    .bind(consumer)
    .bind(id)
    .execute(pool)
    .await
    .expect("insert")
    .rows_affected()
        == 1
}

/// A UUIDv7 of Unix time `ms`.
fn v7_at(ms: u64) -> Uuid {
    Uuid::new_v7(Timestamp::from_unix(
        NoContext,
        ms / 1000,
        u32::try_from(ms % 1000).expect("ms") * 1_000_000,
    ))
}

/// The database's clock, which decides which partitions are due, in Unix milliseconds.
async fn db_now_ms(pool: &PgPool) -> u64 {
    let ms: i64 = sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
        .fetch_one(pool)
        .await
        .expect("clock");
    u64::try_from(ms).expect("ms")
}

/// Time partitions of the dedup table.
async fn time_partitions(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'inbox'::regclass AND c.relname LIKE 'inbox_p%'",
    )
    .fetch_one(pool)
    .await
    .expect("partitions")
}

/// Sets the span of the partitions created from now on, and how many are created ahead.
async fn span(pool: &PgPool, seconds: i64, ahead: i32) {
    sqlx::query("UPDATE inbox_partitioning SET span_seconds = $1, ahead = $2")
        .bind(seconds)
        .bind(ahead)
        .execute(pool)
        .await
        .expect("span");
}

fn idle(pool: &PgPool, consumer: &str, retention: Option<Duration>) -> Inbox {
    let config = InboxConfig::new(consumer, "127.0.0.1:1", ["t"]).dedup_retention(retention);
    Inbox::new(pool.clone(), config, Handlers::new()).expect("inbox")
}

async fn round(inbox: &Inbox) -> PartitionReport {
    inbox.maintain_partitions().await.expect("round").expect("the table is partitioned")
}

/// Fault: an event delivered again after the table moved on to later partitions (a replay,
/// a consumer group rewound). Its id decides its partition, so it lands where the first
/// delivery did and the unique key absorbs it: applied once.
#[sqlx::test(migrations = false)]
async fn a_redelivered_event_is_absorbed_after_later_partitions_were_created(pool: PgPool) {
    let s = setup(&pool, 1).await;
    let config = s.config("partitioned").cleanup_interval(Duration::from_secs(1));
    let inbox = Inbox::new(pool.clone(), config.clone(), Handlers::new()).expect("inbox");
    inbox.migrator().run(&pool).await.expect("migrate");
    let kind: String = sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = 'inbox'::regclass")
        .fetch_one(&pool)
        .await
        .expect("relkind");
    assert_eq!(kind, "p", "a new install's dedup table is partitioned");
    span(&pool, 1, 2).await;
    let running = start(&pool, config, &Ledger::default()).await;
    assert!(
        eventually(Duration::from_secs(10), || async { time_partitions(&pool).await >= 3 }).await,
        "the consumer's first round creates the current span's partition and two ahead"
    );

    let id = Uuid::now_v7();
    let record =
        RawRecord::text(0, "acct", &Credit::json("acct", 7), &credit_headers(id, Some("acct"), None));
    s.producer.send(&s.topic, &record);
    let applied = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM effects").fetch_one(&pool).await.expect("count")
    };
    assert!(eventually(Duration::from_secs(30), || async { applied().await == 1 }).await, "applied");
    let first = partition_of(&pool, "partitioned", id).await;
    assert!(first.starts_with("inbox_p"), "a UUIDv7 lands in a time partition, not {first}");
    // Two spans on, with partitions created for them by the running consumer.
    let later = |pool: PgPool| async move {
        let probe = Uuid::now_v7();
        sqlx::query_scalar::<_, String>(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = 'inbox'::regclass AND c.relname LIKE 'inbox_p%' \
               AND inbox_bucket($1) >= substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \\(''(-?\\d+)')::bigint \
               AND inbox_bucket($1) < substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \\(''(-?\\d+)')::bigint",
        )
        .bind(probe)
        .fetch_optional(&pool)
        .await
        .expect("current partition")
    };
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert!(
        eventually(Duration::from_secs(10), || {
            let (pool, first) = (pool.clone(), first.clone());
            async move { later(pool).await.is_some_and(|now| now > first) }
        })
        .await,
        "the consumer's rounds create the partition of the current span"
    );
    s.producer.send(&s.topic, &record);
    s.producer.send(&s.topic, &record);
    let marker = Uuid::now_v7();
    s.producer.send(
        &s.topic,
        &RawRecord::text(0, "other", &Credit::json("other", 1), &credit_headers(marker, Some("other"), None)),
    );
    assert!(eventually(Duration::from_secs(30), || async { applied().await == 2 }).await, "marker applied");
    running.shutdown().await;
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM effects WHERE event_id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .expect("effects");
    assert_eq!(effects, 1, "delivered three times, applied once");
    assert_eq!(partition_of(&pool, "partitioned", id).await, first, "the row stays in its partition");
    let later = partition_of(&pool, "partitioned", marker).await;
    assert!(later.starts_with("inbox_p") && later > first, "the marker is in a later partition: {later}");
}

/// Neighbours: consumers with different retentions share the table, and one ran no
/// maintenance round (an older version: its retention is unknown). A partition goes when
/// every consumer with rows in it is past its own retention, and not before; a consumer
/// looks at a partition once its span ended more than its own retention ago.
#[sqlx::test(migrations = false)]
async fn a_partition_goes_only_when_every_consumer_in_it_is_past_its_retention(pool: PgPool) {
    let short = idle(&pool, "short", Some(Duration::from_secs(1)));
    let long = idle(&pool, "long", Some(Duration::from_secs(3600)));
    short.migrator().run(&pool).await.expect("migrate");
    span(&pool, 1, 3).await;
    round(&long).await;
    let base = db_now_ms(&pool).await / 1000 * 1000;
    let created = round(&short).await;
    assert!(created.partitions >= 4 && time_partitions(&pool).await >= 4, "{created:?}");
    let (a, b, c) = (v7_at(base + 500), v7_at(base + 1500), v7_at(base + 2500));
    assert!(
        insert(&pool, "short", a).await && insert(&pool, "short", b).await && insert(&pool, "long", b).await
    );
    assert!(insert(&pool, "ghost", c).await);
    let (part_a, part_b, part_c) = (
        partition_of(&pool, "short", a).await,
        partition_of(&pool, "long", b).await,
        partition_of(&pool, "ghost", c).await,
    );
    assert!(part_a != part_b && part_b != part_c, "{part_a} {part_b} {part_c}");
    // Every span over, and past short's retention of 1 s.
    tokio::time::sleep(Duration::from_millis((base + 4_800).saturating_sub(db_now_ms(&pool).await))).await;

    let report = round(&short).await;
    assert!(report.dropped.contains(&part_a), "{report:?}");
    let kept = |name: &str| report.kept.iter().find(|k| k.partition == name).cloned();
    let kept_b: KeptPartition = kept(&part_b).expect("b kept");
    assert_eq!((kept_b.consumer.as_str(), kept_b.reason.as_str()), ("long", "within retention"));
    let kept_c = kept(&part_c).expect("c kept");
    assert_eq!((kept_c.consumer.as_str(), kept_c.reason.as_str()), ("ghost", "retention unknown"));
    assert!(!insert(&pool, "long", b).await, "a kept partition still absorbs a duplicate");

    sqlx::query("UPDATE inbox SET applied_at = now() - interval '2 hours' WHERE consumer = 'long'")
        .execute(&pool)
        .await
        .expect("age");
    let report = round(&long).await;
    assert!(
        report.dropped.is_empty() && report.kept.is_empty(),
        "not yet past long's own retention: {report:?}"
    );
    let report = round(&short).await;
    assert!(report.dropped.contains(&part_b), "{report:?}");
    assert!(!report.dropped.contains(&part_c), "{report:?}");
    let left: Vec<String> =
        sqlx::query_scalar("SELECT consumer FROM inbox ORDER BY 1").fetch_all(&pool).await.expect("rows");
    assert_eq!(left, ["ghost"]);
}

/// Input: event ids of a span no partition covers yet (the consumers' rounds stopped), and
/// ids that are not UUIDv7. The first wait in the default partition and move into their
/// own when it is created; the others stay in the foreign partition. Each is absorbed the
/// second time wherever it is.
#[sqlx::test(migrations = false)]
async fn rows_without_a_time_partition_are_kept_and_moved_into_theirs(pool: PgPool) {
    let inbox = idle(&pool, "c", Some(Duration::from_secs(3600)));
    inbox.migrator().run(&pool).await.expect("migrate");
    let (v7, v4) = (Uuid::now_v7(), Uuid::new_v4());
    assert!(insert(&pool, "c", v7).await && insert(&pool, "c", v4).await);
    assert_eq!(partition_of(&pool, "c", v7).await, "inbox_default");
    assert_eq!(partition_of(&pool, "c", v4).await, "inbox_foreign");
    assert!(!insert(&pool, "c", v7).await && !insert(&pool, "c", v4).await);

    let report = round(&inbox).await;
    assert_eq!(report.moved, 1, "{report:?}");
    let moved_to = partition_of(&pool, "c", v7).await;
    assert!(moved_to.starts_with("inbox_p") && report.created.contains(&moved_to), "{moved_to} {report:?}");
    assert!(!insert(&pool, "c", v7).await, "absorbed in its new partition");
    assert_eq!(round(&inbox).await.created.len(), 0, "a second round creates nothing");

    sqlx::query("UPDATE inbox SET applied_at = now() - interval '2 hours'")
        .execute(&pool)
        .await
        .expect("age");
    assert_eq!(
        inbox.delete_applied(Duration::from_secs(3600), 10).await.expect("cleanup"),
        1,
        "the foreign row"
    );
    assert_eq!(partition_of(&pool, "c", v7).await, moved_to, "time partitions are not cleaned row by row");
}

/// Neighbour: an existing table with rows, converted while its consumer runs, batching.
/// The consumer goes on (its first insert after the switch finds the new layout and is
/// tried again, not parked), events applied before the conversion and delivered again
/// after it are absorbed, new ones are applied once.
#[sqlx::test(migrations = false)]
async fn an_existing_table_is_converted_while_its_consumer_runs(pool: PgPool) {
    converted_while_running(pool, 100).await;
}

/// The same with one record per transaction: the path with no batch to fall back from.
/// Before the fix its first insert after the switch (no bucket: 23502, an integrity class)
/// was parked as permanent.
#[sqlx::test(migrations = false)]
async fn an_existing_table_is_converted_while_its_consumer_runs_one_record_a_transaction(pool: PgPool) {
    converted_while_running(pool, 1).await;
}

async fn converted_while_running(pool: PgPool, batch: usize) {
    let s = setup(&pool, 1).await;
    let config = s.config("converted").cleanup_interval(Duration::from_secs(1)).batch_size(batch);
    let inbox = Inbox::new(pool.clone(), config.clone(), Handlers::new()).expect("inbox");
    inbox.migrator().run_to(5, &pool).await.expect("migrate to 5");
    sqlx::query(
        "INSERT INTO inbox (consumer, event_id, event_type, schema_version, topic, kafka_partition, kafka_offset) \
         SELECT 'old', gen_random_uuid(), 'x.y', 1, 't', 0, n FROM generate_series(1, 100) n",
    )
    .execute(&pool)
    .await
    .expect("rows of an existing install");
    inbox.migrator().run(&pool).await.expect("migrate");
    let running = start(&pool, config, &Ledger::default()).await;
    let send = |account: &str, id: Uuid| {
        let record =
            RawRecord::text(0, account, &Credit::json(account, 1), &credit_headers(id, Some(account), None));
        s.producer.send(&s.topic, &record);
        record
    };
    let before: Vec<RawRecord> = (0..20).map(|n| send(&format!("a{n}"), Uuid::now_v7())).collect();
    let applied = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM effects").fetch_one(&pool).await.expect("count")
    };
    assert!(eventually(Duration::from_secs(30), || async { applied().await == 20 }).await, "applied before");

    let admin = InboxAdmin::new(pool.clone(), "public", "inbox", "converted").expect("admin");
    assert!(admin.partition_table().await.expect("convert"), "converted");
    assert!(!admin.partition_table().await.expect("again"), "a second run finds it done");
    assert!(
        eventually(Duration::from_secs(10), || async { time_partitions(&pool).await > 0 }).await,
        "the running consumer's rounds create time partitions"
    );
    for (n, record) in before.iter().enumerate() {
        s.producer.send(&s.topic, record);
        send(&format!("b{n}"), Uuid::now_v7());
    }
    assert!(eventually(Duration::from_secs(60), || async { applied().await >= 40 }).await, "applied after");
    let end = s.kafka.watermarks(&s.topic, 1)[0].1;
    assert!(
        eventually(Duration::from_secs(30), || async {
            s.kafka.committed("converted", &s.topic, 1)[0] >= end
        })
        .await,
        "every record has its outcome"
    );
    running.shutdown().await;
    let (effects, distinct): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT event_id) FROM effects")
            .fetch_one(&pool)
            .await
            .expect("effects");
    assert_eq!((effects, distinct), (40, 40), "each event applied once");
    let parked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox_parked").fetch_one(&pool).await.expect("parked");
    assert_eq!(parked, 0, "nothing parked across the conversion");
    let by_partition: Vec<(String, i64)> = sqlx::query_as(
        "SELECT CASE WHEN tableoid::regclass::text LIKE 'inbox_p%' THEN 'time' ELSE tableoid::regclass::text END, count(*) \
         FROM inbox GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .expect("rows");
    assert_eq!(by_partition, [("inbox_legacy".to_owned(), 120), ("time".to_owned(), 20)]);
}

/// Neighbours: consumers sharing the table run their rounds at the same moment. They take
/// turns (one skips while another holds the lock), nothing fails, and the partitions they
/// report creating are the ones there are.
#[sqlx::test(migrations = false)]
async fn concurrent_rounds_take_turns(pool: PgPool) {
    let inboxes: Vec<Inbox> =
        (0..4).map(|n| idle(&pool, &format!("c{n}"), Some(Duration::from_secs(3600)))).collect();
    inboxes[0].migrator().run(&pool).await.expect("migrate");
    span(&pool, 1, 20).await;
    let (a, b, c, d) = tokio::join!(
        inboxes[0].maintain_partitions(),
        inboxes[1].maintain_partitions(),
        inboxes[2].maintain_partitions(),
        inboxes[3].maintain_partitions()
    );
    let reports: Vec<PartitionReport> =
        [a, b, c, d].into_iter().map(|r| r.expect("a round does not fail").expect("partitioned")).collect();
    let created: usize = reports.iter().map(|r| r.created.len()).sum();
    let partitions = time_partitions(&pool).await;
    assert_eq!(i64::try_from(created).expect("count"), partitions, "{reports:?}");
    assert!(partitions >= 20, "{partitions}");
    let registered: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox_consumers").fetch_one(&pool).await.expect("consumers");
    assert_eq!(registered, 4, "every round registers its consumer's retention, skipped or not");
}

/// Setting: converting before migration 6 (its function and tables missing) is refused
/// with the error that names what to migrate, and changes nothing.
#[sqlx::test(migrations = false)]
async fn converting_before_the_migration_names_it(pool: PgPool) {
    idle(&pool, "c", None).migrator().run_to(5, &pool).await.expect("migrate to 5");
    let admin = InboxAdmin::new(pool.clone(), "public", "inbox", "c").expect("admin");
    match admin.partition_table().await {
        Err(outbox_runtime::Error::InboxNotMigrated { table }) => {
            assert_eq!(table, "\"public\".\"inbox_partitioning\"")
        }
        other => panic!("expected InboxNotMigrated, got {other:?}"),
    }
    let columns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = 'inbox' AND column_name = 'bucket'",
    )
    .fetch_one(&pool)
    .await
    .expect("columns");
    assert_eq!(columns, 0, "nothing changed");
}

/// Setting: the application's role is not the one that migrates; it was granted what it
/// needs on the dedup table. The new table of migration 6 (an empty one replaced) and of a
/// conversion keep the owner and those grants: before, the role lost them and every insert
/// failed.
#[sqlx::test(migrations = false)]
async fn the_partitioned_table_keeps_the_owner_and_grants(pool: PgPool) {
    let role = format!("inbox_app_{}", Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE ROLE {role}"))).execute(&pool).await.expect("role");
    let can_insert = |pool: PgPool, role: String| async move {
        sqlx::query_scalar::<_, bool>("SELECT has_table_privilege($1, 'inbox', 'INSERT')")
            .bind(role)
            .fetch_one(&pool)
            .await
            .expect("privilege")
    };
    for rows in [0, 10] {
        sqlx::raw_sql("DROP TABLE IF EXISTS inbox, inbox_parked, inbox_aggregates, inbox_audit, inbox_migrations, \
                     inbox_consumers, inbox_partitioning, inbox_progress CASCADE; DROP FUNCTION IF EXISTS inbox_bucket, inbox_hold_key")
            .execute(&pool)
            .await
            .expect("clean");
        let inbox = idle(&pool, "c", None);
        inbox.migrator().run_to(5, &pool).await.expect("migrate to 5");
        sqlx::query(
            "INSERT INTO inbox (consumer, event_id, event_type, schema_version, topic, kafka_partition, kafka_offset) \
             SELECT 'c', gen_random_uuid(), 'x.y', 1, 't', 0, n FROM generate_series(1, $1) n",
        )
        .bind(rows)
        .execute(&pool)
        .await
        .expect("rows");
        sqlx::query(sqlx::AssertSqlSafe(format!("GRANT SELECT, INSERT, UPDATE, DELETE ON inbox TO {role}")))
            .execute(&pool)
            .await
            .expect("grant");
        inbox.migrator().run(&pool).await.expect("migrate");
        if rows > 0 {
            let admin = InboxAdmin::new(pool.clone(), "public", "inbox", "c").expect("admin");
            assert!(admin.partition_table().await.expect("convert"));
        }
        let kind: String =
            sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = 'inbox'::regclass")
                .fetch_one(&pool)
                .await
                .expect("relkind");
        assert_eq!(kind, "p", "{rows} rows");
        assert!(can_insert(pool.clone(), role.clone()).await, "{role} may still insert ({rows} rows before)");
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP OWNED BY {role}; DROP ROLE {role}")))
        .execute(&pool)
        .await
        .expect("drop role");
}
