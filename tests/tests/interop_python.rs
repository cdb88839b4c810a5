//! The outbox read and fed by clients nobody here wrote (invariant 14): Python's
//! confluent-kafka and the CloudEvents SDK, in `tests/interop/interop.py`.
//!
//! 1. The example service places and confirms orders; the relay publishes them. Python
//!    reads them with the SDK and checks that each `dataschema` names a committed schema
//!    (its `$id`) of the record's version and type, and that the data validates against it.
//! 2. Python writes credits as plain CloudEvents, binary and structured, with ids that are
//!    not UUIDs and the version only in `dataschema`; the inbox applies each once.
//!
//! It needs a Python with `tests/interop/requirements.txt` installed, named by
//! `OUTBOX_INTEROP_PYTHON`: `.ci/run` makes a throwaway venv and runs it against its Tansu
//! broker (`cargo test -p outbox-tests --test interop_python -- --ignored`).

use std::process::Command;
use std::time::Duration;

use outbox_examples::orders;
use outbox_runtime::inbox::event_id_of;
use outbox_tests::inbox_kit::credits::{self, count, Ledger};
use outbox_tests::running::{quick, start};
use outbox_tests::{eventually, migrate, rows_in, sample_order};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

/// Runs `interop.py` with `args`; its one line of JSON, which must say `ok`.
fn python(args: &[&str]) -> Value {
    let interpreter = std::env::var("OUTBOX_INTEROP_PYTHON")
        .expect("OUTBOX_INTEROP_PYTHON names a Python with tests/interop/requirements.txt installed");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/interop/interop.py");
    let out = Command::new(&interpreter).arg(script).args(args).output().expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "interop.py {args:?} printed no JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(out.status.success() && report["ok"] == true, "interop.py {args:?} failed: {report}");
    report
}

#[sqlx::test(migrations = false)]
#[ignore = "needs OUTBOX_INTEROP_PYTHON (a Python with tests/interop/requirements.txt); .ci/run runs it"]
async fn python_clients_read_what_the_relay_writes_and_feed_the_inbox(pool: PgPool) {
    let setup = credits::setup(&pool).await;
    let kafka = &setup.kafka;
    kafka.create_topic("orders", 6).await;
    let outbox = migrate(&pool).await;
    for _ in 0..3 {
        let order = orders::place(&pool, &outbox, &sample_order()).await.expect("place");
        orders::confirm(&pool, &outbox, order).await.expect("confirm");
    }
    let event_ids: Vec<Uuid> =
        sqlx::query_scalar("SELECT event_id FROM outbox ORDER BY id").fetch_all(&pool).await.expect("events");
    assert_eq!(event_ids.len(), 6, "3 orders placed and confirmed");

    // 1. The relay's records, as Python reads them.
    let relay = start(&pool, &outbox, quick(kafka).source("/interop-test"));
    let published =
        eventually(Duration::from_secs(60), || async { rows_in(&pool, "published").await == 6 }).await;
    relay.shutdown().await;
    assert!(published, "the relay published the 6 events");
    let schemas = concat!(env!("CARGO_MANIFEST_DIR"), "/../schemas");
    let ids: Vec<String> = event_ids.iter().map(Uuid::to_string).collect();
    let mut args = vec!["consume", kafka.bootstrap(), "orders", schemas];
    args.extend(ids.iter().map(String::as_str));
    let read = python(&args);
    eprintln!("python read the relay's records: {read}");
    assert_eq!(read["checked"], 6, "{read}");
    for id in &ids {
        let record = &read["records"][id];
        assert_eq!(record["source"], "/interop-test", "{record}");
        let schema = record["schema"].as_str().unwrap_or_default();
        assert!(schema == "order.placed/v1.json" || schema == "order.confirmed/v2.json", "{record}");
    }

    // 2. Python's CloudEvents, as the inbox applies them.
    let written = python(&["produce", kafka.bootstrap(), &setup.topic, "3"]);
    let written = written["written"].as_array().expect("written").clone();
    assert_eq!(written.len(), 6, "3 binary and 3 structured");
    let ledger = Ledger::default();
    let (running, _) = credits::start(&pool, setup.config("interop-python"), &ledger).await;
    let applied = eventually(Duration::from_secs(60), || async {
        count(&pool, "SELECT count(*) FROM credits").await == 6
    })
    .await;
    running.shutdown().await;
    let parked: Vec<String> =
        sqlx::query_scalar("SELECT reason FROM inbox_parked").fetch_all(&pool).await.expect("parked");
    assert!(applied && parked.is_empty(), "every Python event applied; parked: {parked:?}");
    for w in &written {
        let (id, source) = (w["id"].as_str().expect("id"), w["source"].as_str().expect("source"));
        let kept: Option<(Option<String>, i64)> = sqlx::query_as(
            "SELECT i.ce_id, c.amount FROM inbox i JOIN credits c USING (event_id) \
             WHERE i.consumer = 'interop-python' AND i.event_id = $1",
        )
        .bind(event_id_of(source, id))
        .fetch_optional(&pool)
        .await
        .expect("inbox row");
        assert_eq!(kept, Some((Some(id.to_owned()), w["amount"].as_i64().expect("amount"))), "{w}");
    }
}
