//! The outbox read and fed by clients nobody here wrote (invariant 14): Python's
//! confluent-kafka and the CloudEvents SDK, in `tests/interop/interop.py`.
//!
//! 1. The example service places and confirms orders; the relay publishes them. Python
//!    reads them with the SDK and checks that each `dataschema` names a committed schema
//!    (its `$id`) of the record's version and type, and that the data validates against it.
//! 2. Python writes credits as plain CloudEvents, binary and structured, with ids that are
//!    not UUIDs and the version only in `dataschema`; the inbox applies each once.
//! 3. With a schema registry (a stand-in of its API, started here): the relay frames its
//!    records with the ids of the committed schemas, prefix and header forms, and Python's
//!    `JSONDeserializer` reads them, fetching and validating against the registered
//!    schema; records Python's `JSONSerializer` framed both ways are applied by the inbox.
//!
//! It needs a Python with `tests/interop/requirements.txt` installed, named by
//! `OUTBOX_INTEROP_PYTHON`: `.ci/run` makes a throwaway venv and runs it against its Tansu
//! broker (`cargo test -p outbox-tests --test interop_python -- --ignored`).

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use outbox_examples::orders;
use outbox_runtime::inbox::event_id_of;
use outbox_runtime::relay::ClaimMode;
use outbox_runtime::schema_registry::framing::{parse_guid, SchemaRef};
use outbox_runtime::schema_registry::{
    committed_schemas, Client, SchemaIdForm, SchemaIds, TOPIC_RECORD_SUBJECT,
};
use outbox_tests::inbox_kit::credits::{self, count, Ledger};
use outbox_tests::registry_standin::StandIn;
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

/// Runs an inbox of `consumer` over the credits Python `written`, and checks that each was
/// applied once, kept with its own id and amount, and nothing parked.
/// Applies `written` with an inbox of its own, checks each was applied once with its
/// amount, and returns the registry schema each event's record named.
async fn applied_once(
    pool: &PgPool,
    setup: &credits::Setup,
    consumer: &str,
    written: &[Value],
) -> HashMap<Uuid, Option<SchemaRef>> {
    let ledger = Ledger::default();
    let (running, _) = credits::start(pool, setup.config(consumer), &ledger).await;
    let want = written.len() as i64;
    let applied = eventually(Duration::from_secs(60), || async {
        count(pool, "SELECT count(*) FROM credits").await == want
    })
    .await;
    running.shutdown().await;
    let parked: Vec<String> =
        sqlx::query_scalar("SELECT reason FROM inbox_parked").fetch_all(pool).await.expect("parked");
    assert!(applied && parked.is_empty(), "every Python event applied; parked: {parked:?}");
    for w in written {
        let (id, source) = (w["id"].as_str().expect("id"), w["source"].as_str().expect("source"));
        let kept: Option<(Option<String>, i64)> = sqlx::query_as(
            "SELECT i.ce_id, c.amount FROM inbox i JOIN credits c USING (event_id) \
             WHERE i.consumer = $2 AND i.event_id = $1",
        )
        .bind(event_id_of(source, id))
        .bind(consumer)
        .fetch_optional(pool)
        .await
        .expect("inbox row");
        assert_eq!(kept, Some((Some(id.to_owned()), w["amount"].as_i64().expect("amount"))), "{w}");
    }
    let schemas = ledger.schemas.lock().expect("schemas").iter().copied().collect();
    schemas
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
    let named = applied_once(&pool, &setup, "interop-python", &written).await;
    assert!(named.values().all(Option::is_none), "plain CloudEvents name no registry schema: {named:?}");
}

#[sqlx::test(migrations = false)]
#[ignore = "needs OUTBOX_INTEROP_PYTHON (a Python with tests/interop/requirements.txt); .ci/run runs it"]
async fn python_registry_clients_read_the_relays_framed_records_and_frame_what_the_inbox_applies(
    pool: PgPool,
) {
    let setup = credits::setup(&pool).await;
    let kafka = &setup.kafka;
    kafka.create_topic("orders", 3).await;
    let outbox = migrate(&pool).await;
    let registry = StandIn::start();
    let client = Client::new(registry.url()).expect("client");
    let schemas = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../schemas"));
    for file in committed_schemas(schemas, TOPIC_RECORD_SUBJECT).expect("committed") {
        client.register(&file.subject, &file.text).expect("register");
    }
    let ids = |form| SchemaIds::resolve(&client, schemas, TOPIC_RECORD_SUBJECT, form).expect("ids");

    // 1. The relay's framed records, prefix form then header form, as Python's
    //    deserializer reads them.
    let (prefix, header) = (ids(SchemaIdForm::Prefix), ids(SchemaIdForm::Header));
    for (i, config) in [
        quick(kafka).schema_ids(prefix.clone()),
        quick(kafka).schema_ids(header.clone()).claim_mode(ClaimMode::HoldLocks),
    ]
    .into_iter()
    .enumerate()
    {
        let relay = start(&pool, &outbox, config);
        for _ in 0..2 {
            let order = orders::place(&pool, &outbox, &sample_order()).await.expect("place");
            orders::confirm(&pool, &outbox, order).await.expect("confirm");
        }
        let want = 4 * (i as i64 + 1);
        let published =
            eventually(Duration::from_secs(60), || async { rows_in(&pool, "published").await == want }).await;
        relay.shutdown().await;
        assert!(published, "{want} events published");
    }
    let rows: Vec<(Uuid, String, i32, String)> =
        sqlx::query_as("SELECT event_id, event_type, schema_version, payload::text FROM outbox ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("rows");
    let event_ids: Vec<String> = rows.iter().map(|r| r.0.to_string()).collect();
    let mut args = vec!["consume-registry", kafka.bootstrap(), "orders", registry.url()];
    args.extend(event_ids.iter().map(String::as_str));
    let read = python(&args);
    eprintln!("python's JSONDeserializer read the relay's records: {read}");
    assert_eq!(read["checked"], 8, "{read}");
    for (i, (event_id, event_type, version, payload)) in rows.iter().enumerate() {
        let record = &read["records"][event_id.to_string()];
        let version = u32::try_from(*version).expect("version");
        let payload: Value = serde_json::from_str(payload).expect("payload");
        assert_eq!(record["data"], payload, "{event_type} v{version}: {record}");
        if i < 4 {
            let Some(SchemaRef::Id(id)) = prefix.get(event_type, version) else { panic!("an id") };
            assert_eq!(
                (record["framing"].as_str(), record["schema_id"].as_u64()),
                (Some("prefix"), Some(id.into()))
            );
        } else {
            let Some(SchemaRef::Guid(guid)) = header.get(event_type, version) else { panic!("a GUID") };
            let read_guid = record["schema_guid"].as_str().and_then(parse_guid);
            assert_eq!((record["framing"].as_str(), read_guid), (Some("header"), Some(guid)), "{record}");
        }
    }

    // 2. Python's framed records, as the inbox applies them.
    let written = python(&["produce-registry", kafka.bootstrap(), &setup.topic, registry.url(), "3"]);
    let written = written["written"].as_array().expect("written").clone();
    assert_eq!(written.len(), 6, "3 prefix and 3 header");
    assert!(
        registry.registry().subjects.contains_key(&format!("{}-value", setup.topic)),
        "Python registered its schema: {:?}",
        registry.registry().subjects.keys().collect::<Vec<_>>()
    );
    let named = applied_once(&pool, &setup, "interop-registry", &written).await;
    // The inbox read the schema each record named: the prefix's id, or the header's GUID,
    // the one the registry gave Python's schema.
    let id = *registry.registry().subjects[&format!("{}-value", setup.topic)].first().expect("registered");
    let guid = parse_guid(&outbox_tests::registry_standin::guid_of(id)).expect("a GUID");
    for w in &written {
        let event_id = event_id_of(w["source"].as_str().expect("source"), w["id"].as_str().expect("id"));
        let want = match w["form"].as_str() {
            Some("prefix") => SchemaRef::Id(id),
            Some("header") => SchemaRef::Guid(guid),
            other => panic!("form {other:?}"),
        };
        assert_eq!(named.get(&event_id), Some(&Some(want)), "{w}");
    }
}
