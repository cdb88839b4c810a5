//! Append inside the caller's transaction (invariants 1 and 2), against real PostgreSQL.

use std::sync::Arc;

use outbox_examples::events::OrderConfirmed;
use outbox_examples::orders::{self, Confirmed};
use outbox_runtime::{AppendOptions, Error, NewEvent, Outbox, OutboxConfig, OutboxEvent};
use outbox_tests::{migrate, outbox_rows, sample_order};
use schemars::JsonSchema;
use serde::{Serialize, Serializer};
use sqlx::PgPool;
use uuid::Uuid;

/// An event whose serialization always fails.
#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "test.unserializable", schema_version = 1, aggregate = "test", topic = "test")]
struct Unserializable {
    #[outbox(aggregate_id)]
    id: u64,
    #[serde(serialize_with = "refuse")]
    value: u8,
}

fn refuse<S: Serializer>(_: &u8, _: S) -> Result<S::Ok, S::Error> {
    Err(serde::ser::Error::custom("this value cannot be written"))
}

/// An event with a payload of any size.
#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "test.blob", schema_version = 1, aggregate = "test", topic = "test")]
struct Blob {
    #[outbox(aggregate_id)]
    id: u64,
    data: String,
}

#[sqlx::test(migrations = false)]
async fn rollback_of_the_business_transaction_leaves_no_outbox_row(pool: PgPool) {
    // Fault: the business transaction rolls back after the append. Invariant 1.
    let outbox = migrate(&pool).await;
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("INSERT INTO orders (id, customer_id, total_cents, currency, payment) VALUES ($1, $1, 1, 'EUR', '{}')")
        .bind(Uuid::now_v7())
        .execute(&mut *tx)
        .await
        .expect("insert order");
    outbox.append(&mut tx, &Blob { id: 1, data: "x".into() }).await.expect("append");
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox").fetch_one(&mut *tx).await.expect("count"),
        1,
        "visible inside the transaction"
    );
    tx.rollback().await.expect("rollback");
    assert_eq!(outbox_rows(&pool).await, 0);
    let orders: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&pool).await.expect("count");
    assert_eq!(orders, 0);
}

#[sqlx::test(migrations = false)]
async fn commit_stores_the_event_with_its_metadata(pool: PgPool) {
    let outbox = migrate(&pool).await;
    let order_id = orders::place(&pool, &outbox, &sample_order()).await.expect("place");
    let row: (String, String, Option<i64>, String, i32, String, serde_json::Value, String) = sqlx::query_as(
        "SELECT aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, topic, payload::jsonb, status FROM outbox",
    )
    .fetch_one(&pool)
    .await
    .expect("row");
    assert_eq!(
        (row.0.as_str(), row.1, row.2, row.3.as_str(), row.4, row.5.as_str(), row.7.as_str()),
        ("order", order_id.to_string(), Some(1), "order.placed", 1, "orders", "pending")
    );
    assert_eq!(row.6["order_id"], order_id.to_string());
    assert_eq!(row.6["total_cents"], 2_500);
}

#[sqlx::test(migrations = false)]
async fn serialization_error_fails_the_append_before_commit(pool: PgPool) {
    // Fault: the event cannot be serialized. Invariant 2: the caller learns at append time.
    let outbox = migrate(&pool).await;
    let mut tx = pool.begin().await.expect("begin");
    let err = outbox.append(&mut tx, &Unserializable { id: 7, value: 1 }).await.expect_err("must fail");
    assert!(matches!(err, Error::Serialize { event_type: "test.unserializable", .. }), "{err}");
    assert!(err.to_string().contains("this value cannot be written"), "{err}");
    tx.commit().await.expect("the transaction is still usable");
    assert_eq!(outbox_rows(&pool).await, 0);
}

#[sqlx::test(migrations = false)]
async fn oversized_record_fails_the_append_before_commit(pool: PgPool) {
    // Fault: a record larger than max_record_bytes. Invariant 2.
    let outbox = Outbox::new(OutboxConfig::default().max_record_bytes(4096)).expect("config");
    migrate(&pool).await;
    let mut tx = pool.begin().await.expect("begin");
    let err = outbox.append(&mut tx, &Blob { id: 9, data: "x".repeat(4096) }).await.expect_err("too large");
    match &err {
        Error::RecordTooLarge { event_type, aggregate_id, size, max } => {
            assert_eq!((*event_type, aggregate_id.as_str(), *max), ("test.blob", "9", 4096));
            assert!(*size > 4096);
        }
        other => panic!("unexpected {other}"),
    }
    // Just under the limit is accepted.
    // Counted: the payload, the aggregate id "9" twice (key, ce_subject), the event type twice
    // (ce_type, ce_dataschema), the aggregate type.
    let counted = r#"{"id":9,"data":""}"#.len() + 2 * "9".len() + 2 * "test.blob".len() + "test".len();
    let fits = 4096 - outbox_runtime::RESERVED_HEADER_BYTES - counted;
    outbox.append(&mut tx, &Blob { id: 9, data: "x".repeat(fits) }).await.expect("fits");
    tx.commit().await.expect("commit");
    assert_eq!(outbox_rows(&pool).await, 1);
}

#[sqlx::test(migrations = false)]
async fn batch_append_is_all_or_nothing_and_keeps_order(pool: PgPool) {
    let outbox = Outbox::new(OutboxConfig::default().max_record_bytes(4096)).expect("config");
    migrate(&pool).await;
    let small = |n: u64| {
        NewEvent::new(
            &Blob { id: 1, data: n.to_string() },
            AppendOptions::default().aggregate_version(n as i64),
        )
        .expect("event")
    };
    let big =
        NewEvent::new(&Blob { id: 1, data: "x".repeat(5000) }, AppendOptions::default()).expect("event");

    let mut tx = pool.begin().await.expect("begin");
    let err = outbox.append_batch(&mut tx, &[small(1), big, small(2)]).await.expect_err("one is too large");
    assert!(matches!(err, Error::RecordTooLarge { .. }));
    outbox.append_batch(&mut tx, &[small(1), small(2), small(3)]).await.expect("batch");
    tx.commit().await.expect("commit");
    let versions: Vec<i64> = sqlx::query_scalar("SELECT aggregate_version FROM outbox ORDER BY id")
        .fetch_all(&pool)
        .await
        .expect("rows");
    assert_eq!(versions, [1, 2, 3]);
}

#[sqlx::test(migrations = false)]
async fn reserved_headers_are_refused_and_extra_headers_stored(pool: PgPool) {
    let outbox = migrate(&pool).await;
    let err =
        NewEvent::new(&Blob { id: 1, data: String::new() }, AppendOptions::default().header("ce_id", "x"))
            .expect_err("reserved");
    assert_eq!(
        err.to_string(),
        "header \"ce_id\" is reserved: the outbox sets ce_*, content-type and schema id (__value_schema_id, \
         __key_schema_id) headers itself"
    );
    for name in ["__value_schema_id", "__key_schema_id", "content-type"] {
        let refused =
            NewEvent::new(&Blob { id: 1, data: String::new() }, AppendOptions::default().header(name, "x"));
        assert!(
            matches!(refused, Err(outbox_runtime::Error::ReservedHeader(ref n)) if n == name),
            "{name}: {refused:?}"
        );
    }
    let mut tx = pool.begin().await.expect("begin");
    outbox
        .append_with(
            &mut tx,
            &Blob { id: 1, data: String::new() },
            AppendOptions::default().header("traceparent", "00-ab-cd-01"),
        )
        .await
        .expect("append");
    tx.commit().await.expect("commit");
    let headers: serde_json::Value =
        sqlx::query_scalar("SELECT headers FROM outbox").fetch_one(&pool).await.expect("headers");
    assert_eq!(headers, serde_json::json!({ "traceparent": "00-ab-cd-01" }));
}

#[sqlx::test(migrations = false)]
async fn fifty_concurrent_confirms_record_exactly_one_event(pool: PgPool) {
    // Fault: 50 racing commands on one order. Invariant 1: one transition, one event.
    let outbox = Arc::new(migrate(&pool).await);
    let order_id = orders::place(&pool, &outbox, &sample_order()).await.expect("place");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        tasks.spawn(async move { orders::confirm(&pool, &outbox, order_id).await });
    }
    let mut confirmed = Vec::new();
    while let Some(result) = tasks.join_next().await {
        if let Confirmed::Now { version, event_id } = result.expect("task").expect("confirm") {
            confirmed.push((version, event_id));
        }
    }
    assert_eq!(confirmed.len(), 1, "exactly one call confirms: {confirmed:?}");
    let events: Vec<(Uuid, Option<i64>)> =
        sqlx::query_as("SELECT event_id, aggregate_version FROM outbox WHERE event_type = $1")
            .bind(OrderConfirmed::EVENT_TYPE)
            .fetch_all(&pool)
            .await
            .expect("events");
    assert_eq!(events, [(confirmed[0].1, Some(2))]);
}

#[sqlx::test(migrations = false)]
async fn notify_is_delivered_at_commit_not_before(pool: PgPool) {
    let outbox = migrate(&pool).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await.expect("listener");
    listener.listen("public.outbox").await.expect("listen");
    let mut tx = pool.begin().await.expect("begin");
    outbox.append(&mut tx, &Blob { id: 3, data: String::new() }).await.expect("append");
    let early = tokio::time::timeout(std::time::Duration::from_millis(300), listener.recv()).await;
    assert!(early.is_err(), "no notification before commit");
    tx.commit().await.expect("commit");
    let note = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
        .await
        .expect("notified after commit")
        .expect("notification");
    assert_eq!(note.channel(), "public.outbox");
}

#[sqlx::test(migrations = false)]
async fn configurable_names_are_validated_and_used(pool: PgPool) {
    let err = Outbox::new(OutboxConfig::default().table("events; drop table orders")).expect_err("invalid");
    assert!(matches!(err, Error::InvalidIdentifier { what: "table name", .. }), "{err}");

    let outbox =
        Outbox::new(OutboxConfig::default().schema("ops").table("events").notify(false)).expect("config");
    outbox.migrator().run(&pool).await.expect("migrate");
    outbox.migrator().run(&pool).await.expect("migrating twice is a no-op");
    let mut tx = pool.begin().await.expect("begin");
    outbox.append(&mut tx, &Blob { id: 4, data: String::new() }).await.expect("append");
    tx.commit().await.expect("commit");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM ops.events").fetch_one(&pool).await.expect("count");
    assert_eq!(n, 1);
    let leases: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ops.events_leases").fetch_one(&pool).await.expect("leases");
    assert_eq!(leases, 32);

    // The partition count is fixed by the first migration: a different one is refused.
    let other = Outbox::new(OutboxConfig::default().schema("ops").table("events").work_partitions(8))
        .expect("config");
    let err = other.migrator().run(&pool).await.expect_err("checksum mismatch");
    assert!(err.to_string().contains("previously applied but has been modified"), "{err}");
}

#[sqlx::test(migrations = false)]
async fn near_capacity_non_critical_appends_are_refused_and_critical_ones_never(pool: PgPool) {
    // Fault: the backlog grows to 80% of a 5-row capacity. Backpressure: a non-critical
    // append fails with a typed error and appends nothing, a critical one always goes in.
    migrate(&pool).await;
    let outbox = Outbox::new(
        OutboxConfig::default()
            .capacity(outbox_runtime::Capacity::Rows(5))
            .refuse_non_critical_at(0.8)
            .capacity_check_interval(std::time::Duration::ZERO),
    )
    .expect("outbox");
    let blob = |id: u64| Blob { id, data: "x".into() };
    let non_critical = || AppendOptions::default().critical(false);
    let mut tx = pool.begin().await.expect("begin");
    for id in 0..3 {
        outbox.append_with(&mut tx, &blob(id), non_critical()).await.expect("below 80%: accepted");
    }
    outbox.append(&mut tx, &blob(3)).await.expect("critical");
    // 4 of 5 unpublished (the transaction's own rows count): 80%.
    let refused = outbox.append_with(&mut tx, &blob(4), non_critical()).await;
    match refused {
        Err(Error::Backpressure { event_type, used, limit, unit, .. }) => {
            assert_eq!((event_type, used, limit, unit), ("test.blob", 4, 5, "rows"));
        }
        other => panic!("expected Error::Backpressure, got {other:?}"),
    }
    assert!(refused.as_ref().is_err_and(Error::is_transient), "worth retrying later");
    // The transaction is intact: critical events go in, even past the capacity.
    for id in 5..8 {
        outbox.append(&mut tx, &blob(id)).await.expect("critical events are never refused");
    }
    tx.commit().await.expect("commit");
    assert_eq!(outbox_rows(&pool).await, 7, "the refused event was not appended");

    // Once the relay has published the backlog, non-critical events are accepted again.
    sqlx::query("UPDATE outbox SET status = 'published', published_at = now()")
        .execute(&pool)
        .await
        .expect("publish");
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_with(&mut tx, &blob(9), non_critical()).await.expect("room again");
    tx.commit().await.expect("commit");

    // A bytes capacity below the table's size refuses at once.
    let tiny =
        Outbox::new(OutboxConfig::default().capacity(outbox_runtime::Capacity::Bytes(1024))).expect("outbox");
    let mut tx = pool.begin().await.expect("begin");
    let err = tiny.append_with(&mut tx, &blob(10), non_critical()).await.expect_err("over");
    assert!(err.to_string().contains("bytes): non-critical event test.blob refused"), "{err}");
}

/// Fault: a batch near capacity that mixes one non-critical event with a critical one.
/// Before the fix the whole batch was refused with `Backpressure`, critical event included,
/// and a caller going on without it committed its transition without its event
/// (invariant 1). A batch holding a critical event is appended whole.
#[sqlx::test(migrations = false)]
async fn a_batch_with_a_critical_event_is_never_refused(pool: PgPool) {
    migrate(&pool).await;
    let outbox = Outbox::new(
        OutboxConfig::default()
            .capacity(outbox_runtime::Capacity::Rows(2))
            .capacity_check_interval(std::time::Duration::ZERO),
    )
    .expect("outbox");
    let blob = |id: u64| Blob { id, data: "x".into() };
    let mut tx = pool.begin().await.expect("begin");
    outbox.append(&mut tx, &blob(0)).await.expect("critical");
    outbox.append(&mut tx, &blob(1)).await.expect("critical, at capacity");
    let mixed = vec![
        NewEvent::new(&blob(2), AppendOptions::default().critical(false)).expect("event"),
        NewEvent::new(&blob(3), AppendOptions::default()).expect("event"),
    ];
    outbox.append_batch(&mut tx, &mixed).await.expect("a batch with a critical event goes in whole");
    let only_non_critical =
        vec![NewEvent::new(&blob(4), AppendOptions::default().critical(false)).expect("event")];
    let refused = outbox.append_batch(&mut tx, &only_non_critical).await;
    assert!(matches!(refused, Err(Error::Backpressure { .. })), "{refused:?}");
    tx.commit().await.expect("commit");
    assert_eq!(outbox_rows(&pool).await, 4);
}

/// Invariant 13 across the two statements: a single-event append and a batch append
/// take the same per-aggregate lock, so an append to an aggregate waits for a transaction
/// that appended to it with the other statement, in both directions.
#[sqlx::test(migrations = false)]
async fn single_and_batch_appends_to_one_aggregate_wait_for_each_other(pool: PgPool) {
    use outbox_tests::Step;
    let outbox = migrate(&pool).await;
    let step = |n: i64| Step { id: "shared".to_owned(), n, data: String::new() };
    for batch_first in [true, false] {
        let mut first = pool.begin().await.expect("begin");
        if batch_first {
            let events = [
                NewEvent::new(&step(1), AppendOptions::default()).expect("event"),
                NewEvent::new(&step(2), AppendOptions::default()).expect("event"),
            ];
            outbox.append_batch(&mut first, &events).await.expect("batch");
        } else {
            outbox.append(&mut first, &step(1)).await.expect("single");
        }
        let second = {
            let (pool, outbox) = (pool.clone(), outbox.clone());
            tokio::spawn(async move {
                let mut tx = pool.begin().await.expect("begin");
                if batch_first {
                    outbox.append(&mut tx, &step(3)).await.expect("single");
                } else {
                    let events = [NewEvent::new(&step(3), AppendOptions::default()).expect("event")];
                    outbox.append_batch(&mut tx, &events[..]).await.expect("batch of one");
                    let more = [
                        NewEvent::new(&step(4), AppendOptions::default()).expect("event"),
                        NewEvent::new(&step(5), AppendOptions::default()).expect("event"),
                    ];
                    outbox.append_batch(&mut tx, &more).await.expect("batch");
                }
                tx.commit().await.expect("commit");
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        assert!(
            !second.is_finished(),
            "batch_first={batch_first}: the second append waits for the first transaction"
        );
        first.commit().await.expect("commit");
        tokio::time::timeout(std::time::Duration::from_secs(10), second)
            .await
            .expect("the second append goes on once the first commits")
            .expect("second");
        sqlx::query("TRUNCATE outbox").execute(&pool).await.expect("truncate");
    }
}

#[sqlx::test(migrations = false)]
async fn appending_before_the_migrations_names_the_table_and_what_to_run(pool: PgPool) {
    // Before: `relation "public.outbox" does not exist at line 1371`, a Database error.
    let outbox = Outbox::new(OutboxConfig::default().schema("billing").table("events")).expect("outbox");
    for batch in [1, 3] {
        let events: Vec<NewEvent> = (0..batch)
            .map(|i| {
                NewEvent::new(&Blob { id: i, data: "x".into() }, AppendOptions::default()).expect("event")
            })
            .collect();
        let mut tx = pool.begin().await.expect("begin");
        let err = outbox.append_batch(&mut tx, &events).await.expect_err("no table");
        assert!(matches!(&err, Error::NotMigrated { table } if table == "\"billing\".\"events\""), "{err:?}");
        assert_eq!(
            err.to_string(),
            "table \"billing\".\"events\" does not exist: run the outbox's migrations first \
             (`outbox.migrator().run(&pool)`, or `outbox migrate`)"
        );
        assert!(!err.is_transient());
    }
    // Once migrated, the same append goes in.
    outbox.migrator().run(&pool).await.expect("migrate");
    let mut tx = pool.begin().await.expect("begin");
    outbox.append(&mut tx, &Blob { id: 1, data: "x".into() }).await.expect("append");
    tx.commit().await.expect("commit");
}

#[sqlx::test(migrations = false)]
async fn an_append_in_autocommit_is_refused_and_one_in_any_transaction_is_not(pool: PgPool) {
    // Fault: the caller passes a pooled connection in autocommit. The event would commit at
    // once and outlive a business change rolled back later (invariant 1).
    use sqlx::{Acquire, PgConnection};
    let outbox = migrate(&pool).await;
    let mut conn = pool.acquire().await.expect("connection");
    let err = outbox.append(&mut conn, &Blob { id: 1, data: "x".into() }).await.expect_err("autocommit");
    assert!(matches!(err, Error::NotInTransaction), "{err:?}");
    assert!(err.to_string().starts_with("append outside a transaction"), "{err}");
    let batch = [NewEvent::new(&Blob { id: 2, data: "x".into() }, AppendOptions::default()).expect("event")];
    assert!(matches!(outbox.append_batch(&mut conn, &batch).await, Err(Error::NotInTransaction)));
    assert_eq!(outbox_rows(&pool).await, 0, "nothing was appended");

    // The connection inside a transaction (what an inbox handler is given) joins it: a
    // rollback takes the event away.
    let mut tx = conn.begin().await.expect("begin");
    let inside: &mut PgConnection = &mut tx;
    outbox.append(inside, &Blob { id: 3, data: "x".into() }).await.expect("append in a transaction");
    tx.rollback().await.expect("rollback");
    assert_eq!(outbox_rows(&pool).await, 0);

    // A savepoint inside it too.
    let mut tx = pool.begin().await.expect("begin");
    let mut savepoint = tx.begin().await.expect("savepoint");
    outbox.append(&mut savepoint, &Blob { id: 4, data: "x".into() }).await.expect("append in a savepoint");
    savepoint.commit().await.expect("release");
    tx.commit().await.expect("commit");
    assert_eq!(outbox_rows(&pool).await, 1);
}
