//! The relay frames its records in a schema registry's wire format (`RelayConfig::schema_ids`):
//! the ids of the committed schemas looked up once, before it starts, in a stand-in of a
//! Confluent-API registry, and every record carries its own schema's id (prefix form) or
//! GUID (header form), read back byte for byte from the broker. A relay never calls the
//! registry itself, and a row whose schema has no id is failed with a reason naming it.

use std::path::Path;
use std::time::Duration;

use outbox_examples::orders;
use outbox_runtime::relay::{ClaimMode, RelayConfig};
use outbox_runtime::schema_registry::framing::{parse_guid, unframe, SchemaRef, VALUE_SCHEMA_ID_HEADER};
use outbox_runtime::schema_registry::{
    committed_schemas, Client, RegistryError, SchemaIdForm, SchemaIds, TOPIC_RECORD_SUBJECT,
};
use outbox_tests::kafka::{Kafka, Record};
use outbox_tests::registry_standin::{guid_of, StandIn};
use outbox_tests::running::{quick, start};
use outbox_tests::{eventually, migrate, rows_in, sample_order};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

const SCHEMAS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../schemas");

/// Places and confirms `orders` orders with a relay configured by `config` running, and
/// waits until `published` rows in all are published.
async fn publish(
    pool: &PgPool,
    outbox: &outbox_runtime::Outbox,
    config: RelayConfig,
    orders: usize,
    published: i64,
) {
    let relay = start(pool, outbox, config);
    for _ in 0..orders {
        let order = orders::place(pool, outbox, &sample_order()).await.expect("place");
        orders::confirm(pool, outbox, order).await.expect("confirm");
    }
    let done =
        eventually(Duration::from_secs(60), || async { rows_in(pool, "published").await >= published }).await;
    relay.shutdown().await;
    assert!(done, "{published} rows published");
}

/// Each outbox row by event id: type, version and payload.
async fn rows(pool: &PgPool) -> Vec<(Uuid, String, i32, String)> {
    sqlx::query_as("SELECT event_id, event_type, schema_version, payload::text FROM outbox ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("rows")
}

/// The first record of `event_id` (the topic may hold other tests' records on a shared
/// broker, and a batch retried after a timeout may have written one twice).
fn record_of(records: &[Record], event_id: Uuid) -> &Record {
    let id = event_id.to_string();
    records.iter().find(|r| r.headers.get("ce_id") == Some(&id)).unwrap_or_else(|| panic!("record {id}"))
}

fn schema_header(record: &Record) -> Option<&[u8]> {
    let mut values = record.raw_headers.iter().filter(|(name, _)| name == VALUE_SCHEMA_ID_HEADER);
    let first = values.next().map(|(_, v)| v.as_deref().expect("a value"));
    assert!(values.next().is_none(), "one {VALUE_SCHEMA_ID_HEADER} header");
    first
}

#[sqlx::test(migrations = false)]
async fn records_carry_the_ids_resolved_at_start_and_the_registry_is_not_called_again(pool: PgPool) {
    let registry = StandIn::start();
    let client = Client::new(registry.url()).expect("client");
    let dir = Path::new(SCHEMAS);

    // Nothing registered yet: the resolution names the first file and its subject.
    let error = SchemaIds::resolve(&client, dir, TOPIC_RECORD_SUBJECT, SchemaIdForm::Prefix).unwrap_err();
    assert!(matches!(error, RegistryError::NotRegistered { .. }), "{error}");
    assert!(error.to_string().contains("v1.json") && error.to_string().contains("schema push"), "{error}");

    let files = committed_schemas(dir, TOPIC_RECORD_SUBJECT).expect("committed schemas");
    for file in &files {
        client.register(&file.subject, &file.text).expect("register");
    }
    let prefix = SchemaIds::resolve(&client, dir, TOPIC_RECORD_SUBJECT, SchemaIdForm::Prefix).expect("ids");
    let header = SchemaIds::resolve(&client, dir, TOPIC_RECORD_SUBJECT, SchemaIdForm::Header).expect("ids");
    assert_eq!((prefix.len(), header.len()), (files.len(), files.len()));
    // The id each subject holds, as the stand-in gave it.
    let id_of = |event_type: &str, version: i32| -> u32 {
        let file = files
            .iter()
            .find(|f| f.event_type == event_type && i64::from(f.version) == i64::from(version))
            .unwrap_or_else(|| panic!("{event_type} v{version} is committed"));
        *registry.registry().subjects[&file.subject].last().expect("registered")
    };
    let calls_before = registry.registry().requests.len();

    let kafka = Kafka::start();
    kafka.create_topic("orders", 3).await;
    let outbox = migrate(&pool).await;

    // Prefix form, leased claims: 0x00, the id, then the row's payload.
    publish(&pool, &outbox, quick(&kafka).schema_ids(prefix), 2, 4).await;
    let first = rows(&pool).await;
    // Header form, with the locks held across the send: the payload alone and the GUID.
    let held = quick(&kafka).schema_ids(header).claim_mode(ClaimMode::HoldLocks);
    publish(&pool, &outbox, held, 2, 8).await;
    let all = rows(&pool).await;
    assert_eq!((first.len(), all.len()), (4, 8));

    let records = kafka.read_all("orders", Duration::from_secs(30));
    for (i, (event_id, event_type, version, payload)) in all.iter().enumerate() {
        let record = record_of(&records, *event_id);
        let id = id_of(event_type, *version);
        let payload: Value = serde_json::from_str(payload).expect("payload");
        let (named, value) = if i < first.len() {
            assert_eq!(schema_header(record), None, "prefix form: no header ({event_type} v{version})");
            assert_eq!(
                record.raw_value[..5],
                [0, (id >> 24) as u8, (id >> 16) as u8, (id >> 8) as u8, id as u8]
            );
            let read = unframe(&record.raw_value, None).expect("a frame");
            (read.schema, read.payload)
        } else {
            let value = schema_header(record).expect("header form: the schema header");
            let guid = parse_guid(&guid_of(id)).expect("guid");
            assert_eq!(value, [&[1u8][..], &guid].concat(), "0x01 and the GUID of id {id}");
            assert_eq!(record.raw_value.first(), Some(&b'{'), "header form: the payload unframed");
            let read = unframe(&record.raw_value, Some(value)).expect("a frame");
            (read.schema, read.payload)
        };
        let expected = if i < first.len() {
            SchemaRef::Id(id)
        } else {
            SchemaRef::Guid(parse_guid(&guid_of(id)).expect("guid"))
        };
        assert_eq!(named, Some(expected), "{event_type} v{version}");
        assert_eq!(serde_json::from_slice::<Value>(value).expect("JSON after the frame"), payload);
        assert_eq!(record.headers.get("ce_type"), Some(event_type), "the CloudEvents headers stay");
    }
    assert_eq!(
        registry.registry().requests.len(),
        calls_before,
        "the relays called the registry: {:?}",
        &registry.registry().requests[calls_before..]
    );
}

#[sqlx::test(migrations = false)]
async fn a_row_whose_schema_has_no_id_is_failed_with_a_reason_naming_it(pool: PgPool) {
    let kafka = Kafka::start();
    kafka.create_topic("orders", 1).await;
    let outbox = migrate(&pool).await;
    let mut ids = SchemaIds::new(SchemaIdForm::Prefix);
    ids.insert("order.placed", 1, 41, None);
    let relay = start(&pool, &outbox, quick(&kafka).schema_ids(ids));
    let order = orders::place(&pool, &outbox, &sample_order()).await.expect("place");
    orders::confirm(&pool, &outbox, order).await.expect("confirm");
    let settled = eventually(Duration::from_secs(60), || async {
        rows_in(&pool, "published").await == 1 && rows_in(&pool, "failed").await == 1
    })
    .await;
    relay.shutdown().await;
    assert!(settled, "the placed event published, the confirmed one failed");
    let (event_type, attempts, last_error): (String, i32, Option<String>) =
        sqlx::query_as("SELECT event_type, attempts, last_error FROM outbox WHERE status = 'failed'")
            .fetch_one(&pool)
            .await
            .expect("the failed row");
    assert_eq!(event_type, "order.confirmed");
    let reason = last_error.unwrap_or_default();
    assert!(reason.contains("no schema registry id for order.confirmed v2"), "{reason}");
    assert!(reason.contains("schema push"), "{reason}");
    assert_eq!(attempts, 1, "failed at once, not retried");
    let ids: Vec<Uuid> =
        sqlx::query_scalar("SELECT event_id FROM outbox ORDER BY id").fetch_all(&pool).await.expect("ids");
    let records = kafka.read_all("orders", Duration::from_secs(30));
    let (placed, confirmed) = (ids[0].to_string(), ids[1].to_string());
    let ours: Vec<&Record> = records
        .iter()
        .filter(|r| r.headers.get("ce_id").is_some_and(|id| *id == placed || *id == confirmed))
        .collect();
    assert!(!ours.is_empty(), "the placed event was sent");
    for record in ours {
        assert_eq!(record.headers.get("ce_id"), Some(&placed), "only the placed event was sent");
        assert_eq!(record.raw_value[..5], [0, 0, 0, 0, 41]);
    }
}
