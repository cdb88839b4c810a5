//! The outbox table in partitions by id range: an existing table is converted while events
//! are appended and a relay publishes them, and nothing is lost or reordered; an event id
//! stays unique across partitions for as long as the first event is kept; a partition goes
//! only when every event in it is done and past retention, counted in the cleaned tally;
//! a new install starts partitioned, an existing one stays plain. The change-data-capture
//! relay on a partitioned outbox is in `cdc_partitions.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_runtime::{AppendOptions, NewEvent, Outbox};
use outbox_tests::kafka::Kafka;
use outbox_tests::partition_kit::{append, is_unique_violation, move_on, partition_of, round};
use outbox_tests::relay_kit::TOPIC;
use outbox_tests::running::{quick, start};
use outbox_tests::{eventually, migrate, migrate_existing, rows_in, Step};
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

#[sqlx::test(migrations = false)]
async fn converting_under_appends_and_a_relay_loses_nothing_and_keeps_each_aggregates_order(pool: PgPool) {
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate_existing(&pool).await;
    let aggregates: Vec<String> = (0..5).map(|a| format!("conv-{a}-{}", Uuid::new_v4())).collect();
    const BEFORE: i64 = 20;
    const ALL: i64 = 160;
    for n in 1..=BEFORE {
        for a in &aggregates {
            append(&pool, &outbox, a, n, None).await.expect("append");
        }
    }
    let relay = start(&pool, &outbox, quick(&kafka));
    let appender = {
        let (pool, outbox, aggregates) = (pool.clone(), outbox.clone(), aggregates.clone());
        tokio::spawn(async move {
            for n in BEFORE + 1..=ALL {
                for a in &aggregates {
                    append(&pool, &outbox, a, n, None).await.expect("append during the conversion");
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(outbox.ops().partition_table(&pool).await.expect("convert"), "converted");
    assert!(!outbox.ops().partition_table(&pool).await.expect("again"), "a second run finds it done");
    appender.await.expect("appender");
    let total = ALL * 5;
    assert!(
        eventually(Duration::from_secs(60), || async { rows_in(&pool, "published").await == total }).await,
        "every event published: {} of {total}",
        rows_in(&pool, "published").await
    );
    relay.shutdown().await;
    let placed: Vec<(String, i64)> =
        sqlx::query_as("SELECT tableoid::regclass::text, count(*) FROM outbox GROUP BY 1 ORDER BY 1")
            .fetch_all(&pool)
            .await
            .expect("placement");
    assert!(placed.iter().any(|(p, n)| p == "outbox_legacy" && *n >= BEFORE * 5), "{placed:?}");
    assert!(
        placed.iter().any(|(p, n)| p.starts_with("outbox_p") && *n > 0),
        "appends after it in partitions: {placed:?}"
    );

    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    let mut versions: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for r in &records {
        if let Some(list) =
            aggregates.iter().find(|a| **a == r.key).map(|a| versions.entry(a.as_str()).or_default())
        {
            let v: i64 = r.headers["ce_aggregateversion"].parse().expect("version");
            // A redelivery repeats what was sent before it; the first sightings are the order.
            if !list.contains(&v) {
                list.push(v);
            }
        }
    }
    for a in &aggregates {
        assert_eq!(
            versions.get(a.as_str()),
            Some(&(1..=ALL).collect::<Vec<_>>()),
            "aggregate {a} in order, none lost"
        );
    }
    // A relay started on the partitioned table (its claims bounded to the partitions that
    // can hold open events) publishes what comes next, in order, with appends running.
    let relay = start(&pool, &outbox, quick(&kafka));
    const MORE: i64 = 40;
    for n in ALL + 1..=ALL + MORE {
        for a in &aggregates {
            append(&pool, &outbox, a, n, None).await.expect("append");
        }
    }
    let total = total + MORE * 5;
    assert!(
        eventually(Duration::from_secs(60), || async { rows_in(&pool, "published").await == total }).await,
        "events appended after the conversion are published by a relay started after it"
    );
    relay.shutdown().await;
    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    for a in &aggregates {
        let mut seen = Vec::new();
        for r in records.iter().filter(|r| r.key == *a) {
            let v: i64 = r.headers["ce_aggregateversion"].parse().expect("version");
            if !seen.contains(&v) {
                seen.push(v);
            }
        }
        assert_eq!(seen, (1..=ALL + MORE).collect::<Vec<_>>(), "aggregate {a} in order after the restart");
    }
    let late: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT tableoid::regclass::text FROM outbox WHERE aggregate_version > $1",
    )
    .bind(ALL)
    .fetch_all(&pool)
    .await
    .expect("late partitions");
    assert!(late.iter().all(|p| p.starts_with("outbox_p")), "{late:?}");
}

/// A round after appends moved on, with no append since (the sequence set, no id taken):
/// the next append still goes to the newest partition. Before the fix, the round took the
/// lowest partition for the current one and set the sequence back into a partition that
/// held rows: the next append failed on a duplicate id.
#[sqlx::test(migrations = false)]
async fn a_quiet_round_after_moving_on_never_sets_the_ids_back(pool: PgPool) {
    let outbox = migrate_existing(&pool).await;
    assert!(outbox.ops().partition_table(&pool).await.expect("convert"));
    let first = append(&pool, &outbox, "quiet", 1, None).await.expect("append");
    move_on(&pool, &outbox).await;
    let second = append(&pool, &outbox, "quiet", 2, None).await.expect("append");
    let moved = move_on(&pool, &outbox).await;
    for _ in 0..3 {
        let report = round(&pool, &outbox, None).await;
        assert_eq!(report.moved_to, None, "nothing to move on from: {report:?}");
    }
    let third = append(&pool, &outbox, "quiet", 3, None).await.expect("the next append goes in");
    let partitions = [
        partition_of(&pool, first).await,
        partition_of(&pool, second).await,
        partition_of(&pool, third).await,
    ];
    assert_eq!(Some(&partitions[2]), moved.moved_to.as_ref(), "the append went where appends moved on to");
    assert!(partitions[0] < partitions[1] && partitions[1] < partitions[2], "{partitions:?}");
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox ORDER BY aggregate_version")
        .fetch_all(&pool)
        .await
        .expect("ids");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids only grow: {ids:?}");
}

#[sqlx::test(migrations = false)]
async fn an_event_id_stays_unique_across_partitions_while_its_first_event_is_kept(pool: PgPool) {
    let outbox = migrate_existing(&pool).await;
    let before = append(&pool, &outbox, "dup", 1, None).await.expect("append");
    assert!(outbox.ops().partition_table(&pool).await.expect("convert"));
    assert_eq!(partition_of(&pool, before).await, "outbox_legacy");
    let first = append(&pool, &outbox, "dup", 2, None).await.expect("append");
    let first_partition = partition_of(&pool, first).await;
    assert!(first_partition.starts_with("outbox_p"), "{first_partition}");
    move_on(&pool, &outbox).await;
    let later = append(&pool, &outbox, "dup", 3, None).await.expect("append");
    let later_partition = partition_of(&pool, later).await;
    assert_ne!(later_partition, first_partition, "appends moved on to the next partition");

    // The same ids again, given by the caller: refused wherever the first one is.
    for (id, where_) in [(before, "legacy"), (first, "an earlier partition"), (later, "the same partition")] {
        let again = append(&pool, &outbox, "dup", 9, Some(id)).await;
        assert!(is_unique_violation(&again), "a duplicate of an event in {where_} is refused: {again:?}");
    }
    // In one batch, a given id and a duplicate of an existing one: the batch goes whole or not at all.
    let fresh = Uuid::now_v7();
    let batch: Vec<NewEvent> = [fresh, first]
        .iter()
        .map(|id| {
            NewEvent::new(
                &Step { id: "dup".into(), n: 10, data: String::new() },
                AppendOptions::default().event_id(*id),
            )
            .expect("event")
        })
        .collect();
    let mut tx = pool.begin().await.expect("begin");
    let refused = outbox.append_batch(&mut tx, &batch).await;
    assert!(
        matches!(&refused, Err(outbox_runtime::Error::Database(e)) if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("23505")),
        "{refused:?}"
    );
    drop(tx);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox").fetch_one(&pool).await.expect("count");
    assert_eq!(rows, 3, "nothing of a refused append is kept");
    // A new id given by the caller goes in.
    let given = append(&pool, &outbox, "dup", 11, Some(fresh)).await.expect("a new given id");
    assert_eq!(given, fresh);
}

#[sqlx::test(migrations = false)]
async fn a_partition_goes_only_when_every_event_in_it_is_done_and_past_retention(pool: PgPool) {
    let outbox = migrate_existing(&pool).await;
    assert!(outbox.ops().partition_table(&pool).await.expect("convert"));
    let mut parts = Vec::new();
    for round_no in 0..3 {
        let mut ids = Vec::new();
        for n in 1..=10 {
            ids.push(
                append(&pool, &outbox, &format!("ret-{n}"), round_no * 10 + n, None).await.expect("append"),
            );
        }
        parts.push(partition_of(&pool, ids[0]).await);
        if round_no < 2 {
            move_on(&pool, &outbox).await;
        }
    }
    let (done, held, current) = (&parts[0], &parts[1], &parts[2]);
    assert!(done != held && held != current, "{parts:?}");
    // Appended eleven days ago and published ten days ago, and the second partition keeps
    // one failed event; the current one's events are published, but young.
    sqlx::query(AssertSqlSafe(format!("UPDATE {current} SET status = 'published', published_at = now()")))
        .execute(&pool)
        .await
        .expect("publish the current one");
    for part in [done, held] {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {part} SET status = 'published', published_at = now() - interval '10 days', \
             created_at = now() - interval '11 days'"
        )))
        .execute(&pool)
        .await
        .expect("publish");
    }
    sqlx::query(AssertSqlSafe(format!("UPDATE {held} SET status = 'failed', failed_at = now(), published_at = NULL WHERE id = (SELECT max(id) FROM {held})")))
        .execute(&pool)
        .await
        .expect("fail one");

    let week = Some(Duration::from_secs(7 * 24 * 3600));
    let report = round(&pool, &outbox, week).await;
    assert!(report.dropped.contains(done), "the done partition goes: {report:?}");
    assert!(!report.dropped.contains(held) && !report.dropped.contains(current), "{report:?}");
    assert!(
        report.kept.iter().any(|k| &k.partition == held && k.reason == "holds pending or failed events"),
        "the partition with a failed event is kept and said so: {report:?}"
    );
    let tallied: i64 = sqlx::query_scalar("SELECT coalesce(sum(events), 0)::bigint FROM outbox_cleaned")
        .fetch_one(&pool)
        .await
        .expect("tally");
    assert_eq!(tallied, 10, "the dropped events are counted in the cleaned tally");
    assert_eq!(rows_in(&pool, "failed").await, 1, "the failed event is still there");

    // Young events keep their partition whatever their status.
    let young = round(&pool, &outbox, Some(Duration::from_secs(30 * 24 * 3600))).await;
    assert!(young.dropped.is_empty(), "{young:?}");

    // Once the failed event is published, its partition goes too.
    sqlx::query(AssertSqlSafe(format!("UPDATE {held} SET status = 'published', published_at = now() - interval '10 days' WHERE status = 'failed'")))
        .execute(&pool)
        .await
        .expect("publish the failed one");
    let report = round(&pool, &outbox, week).await;
    assert_eq!(report.dropped, vec![held.clone()], "{report:?}");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox").fetch_one(&pool).await.expect("count");
    assert_eq!(left, 10, "the current partition's events stay");
}

/// The relay that holds its locks across the send claims (`FOR UPDATE`) and marks through a
/// partitioned table too, events of both the legacy partition and a new one, in order.
#[sqlx::test(migrations = false)]
async fn a_relay_holding_locks_publishes_a_partitioned_outbox_in_order(pool: PgPool) {
    use outbox_runtime::relay::ClaimMode;
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate_existing(&pool).await;
    let aggregates: Vec<String> = (0..3).map(|a| format!("hold-{a}-{}", Uuid::new_v4())).collect();
    for n in 1..=10 {
        for a in &aggregates {
            append(&pool, &outbox, a, n, None).await.expect("append");
        }
    }
    assert!(outbox.ops().partition_table(&pool).await.expect("convert"));
    for n in 11..=20 {
        for a in &aggregates {
            append(&pool, &outbox, a, n, None).await.expect("append");
        }
    }
    let relay = start(&pool, &outbox, quick(&kafka).claim_mode(ClaimMode::HoldLocks).batch_size(7));
    assert!(
        eventually(Duration::from_secs(60), || async { rows_in(&pool, "published").await == 60 }).await,
        "published: {} of 60",
        rows_in(&pool, "published").await
    );
    relay.shutdown().await;
    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    for a in &aggregates {
        let mut seen = Vec::new();
        for r in records.iter().filter(|r| r.key == *a) {
            let v: i64 = r.headers["ce_aggregateversion"].parse().expect("version");
            if !seen.contains(&v) {
                seen.push(v);
            }
        }
        assert_eq!(
            seen,
            (1..=20).collect::<Vec<_>>(),
            "aggregate {a} in order across the legacy partition and the new one"
        );
    }
}

/// The outbox table's indexes: (name, definition with the table's name taken out).
async fn indexes_of(pool: &PgPool, table: &str) -> BTreeMap<String, String> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.relname::text, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE i.indrelid = $1::regclass",
    )
    .bind(table)
    .fetch_all(pool)
    .await
    .expect("indexes");
    rows.into_iter()
        .map(|(name, def)| {
            (name, def.replace(" ON ONLY ", " ON ").replace(&format!(" ON {table} "), " ON t "))
        })
        .collect()
}

/// A new install's outbox starts partitioned (migration 13): partition 0 takes the first
/// ids, two wait ahead, with the default partition and no legacy one; it has every index a
/// plain outbox has (the unique event id index per partition instead); a second run of the
/// migrations changes nothing; a relay publishes from it. Before, a new install's outbox
/// was a plain table.
#[sqlx::test(migrations = false)]
async fn a_new_install_starts_partitioned_with_a_plain_outboxs_indexes(pool: PgPool) {
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    assert!(outbox.ops().is_partitioned(&pool).await.expect("layout"), "a new install is partitioned");
    let parts: Vec<String> = sqlx::query_scalar(
        "SELECT relid::regclass::text FROM pg_partition_tree('outbox') WHERE isleaf ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .expect("partitions");
    assert_eq!(parts, ["outbox_default", "outbox_p000000", "outbox_p000001", "outbox_p000002"]);
    outbox.migrator().run(&pool).await.expect("a second run");

    // An existing install's plain table, in a schema of its own: the same indexes.
    sqlx::query("CREATE SCHEMA existing").execute(&pool).await.expect("schema");
    let plain = Outbox::new(outbox_runtime::OutboxConfig::default().schema("existing")).expect("outbox");
    plain.migrator().run_to(12, &pool).await.expect("to 12");
    let mut plain_indexes = indexes_of(&pool, "existing.outbox").await;
    assert!(plain_indexes.remove("outbox_event_id_key").is_some(), "{plain_indexes:?}");
    assert_eq!(indexes_of(&pool, "public.outbox").await, plain_indexes, "the partitioned table's indexes");

    let aggregate = format!("new-{}", Uuid::new_v4());
    let mut ids = Vec::new();
    for n in 1..=5 {
        ids.push(append(&pool, &outbox, &aggregate, n, None).await.expect("append"));
    }
    assert_eq!(partition_of(&pool, ids[0]).await, "outbox_p000000");
    let first: i64 = sqlx::query_scalar("SELECT min(id) FROM outbox").fetch_one(&pool).await.expect("id");
    assert_eq!(first, 1, "ids start at 1");
    let given = ids[2];
    assert!(
        is_unique_violation(&append(&pool, &outbox, &aggregate, 6, Some(given)).await),
        "a given event id already in the table is refused"
    );
    let relay = start(&pool, &outbox, quick(&kafka));
    assert!(eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 5 }).await);
    relay.shutdown().await;
}

/// Migration 13 leaves an existing install's table as it is: one with events in it (its
/// sequence set back, so that only the rows say so), one that took an id, one in a
/// publication (of the table, or of its whole schema), with a trigger or a unique index of
/// the user's, or a view on it. A new install in a schema of its own is partitioned.
#[sqlx::test(migrations = false)]
async fn an_existing_install_stays_plain(pool: PgPool) {
    let setups = [
        ("fresh", ""),
        ("events", "INSERT INTO {t} (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload) \
                    VALUES (gen_random_uuid(), 'a', 'b', 'c', 1, 'd', '{}'); \
                    SELECT setval(pg_get_serial_sequence('{t}', 'id'), 1, false)"),
        ("used", "SELECT nextval(pg_get_serial_sequence('{t}', 'id'))"),
        ("publication", "CREATE PUBLICATION keep_plain_{s} FOR TABLE {t}"),
        ("whole_schema", "CREATE PUBLICATION keep_plain_{s} FOR TABLES IN SCHEMA {s}"),
        ("trigger", "CREATE FUNCTION {s}.noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$; \
                     CREATE TRIGGER noop BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {s}.noop()"),
        ("unique_index", "CREATE UNIQUE INDEX outbox_mine ON {t} (aggregate_id, aggregate_version)"),
        ("view", "CREATE VIEW {s}.pending AS SELECT id FROM {t} WHERE status = 'pending'"),
    ];
    for (schema, setup) in setups {
        sqlx::query(AssertSqlSafe(format!("CREATE SCHEMA {schema}"))).execute(&pool).await.expect("schema");
        let outbox = Outbox::new(outbox_runtime::OutboxConfig::default().schema(schema)).expect("outbox");
        outbox.migrator().run_to(12, &pool).await.expect("to 12");
        if !setup.is_empty() {
            let setup = setup.replace("{t}", &format!("{schema}.outbox")).replace("{s}", schema);
            sqlx::raw_sql(AssertSqlSafe(setup)).execute(&pool).await.expect("setup");
        }
        outbox.migrator().run(&pool).await.expect("migration 13");
        let partitioned = outbox.ops().is_partitioned(&pool).await.expect("layout");
        assert_eq!(partitioned, schema == "fresh", "{schema}: partitioned only when new");
    }
    for publication in ["keep_plain_publication", "keep_plain_whole_schema"] {
        sqlx::query(AssertSqlSafe(format!("DROP PUBLICATION {publication}")))
            .execute(&pool)
            .await
            .expect("drop");
    }
}
