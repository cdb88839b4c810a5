//! Events written by other languages' CloudEvents SDKs reach the inbox (invariant 14): the
//! records in `tests/interop/fixtures/` are the exact bytes the Python SDK (cloudevents
//! 2.2, `cloudevents.core.bindings.kafka`) and the JavaScript SDK (cloudevents 10, as
//! kafkajs sends its messages) produce, recorded by `tests/interop/record_python.py` and
//! `record_js.mjs`. Each says what the inbox must make of it: applied once, deduplicated on
//! the id it was sent with (a UUIDv5 of `source` and `id` when that is not a UUID, kept as
//! sent in the inbox row), or parked with its reason.
//!
//! Under the inbox's earlier rules every one of the 7 records expected to apply was parked:
//! ids that are not UUIDs ("is not a UUID"), a plain CloudEvent without `ce_schemaversion`,
//! the JavaScript SDK's null headers ("header ce_subject has a null value") and structured
//! mode ("missing header ce_id").

use std::time::Duration;

use base64::Engine as _;
use outbox_runtime::inbox::event_id_of;
use outbox_tests::eventually;
use outbox_tests::inbox_kit::credits::{self, count, Ledger};
use outbox_tests::raw::{RawProducer, RawRecord};
use serde::Deserialize;
use sqlx::PgPool;
use uuid::Uuid;

#[derive(Debug, Deserialize)]
struct Fixture {
    producer: String,
    records: Vec<Recorded>,
}

#[derive(Debug, Deserialize)]
struct Recorded {
    name: String,
    key: Option<String>,
    value_base64: String,
    headers: Vec<(String, Option<String>)>,
    expect: Expect,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
enum Expect {
    Applied { id: String, source: String },
    Parked { reason: String },
}

fn fixtures() -> Vec<Fixture> {
    ["python.json", "js.json"]
        .iter()
        .map(|name| {
            let path = format!("{}/interop/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
        })
        .collect()
}

#[sqlx::test(migrations = false)]
async fn events_from_the_python_and_javascript_sdks_are_applied_or_parked_with_their_reason(pool: PgPool) {
    let setup = credits::setup(&pool).await;
    let fixtures = fixtures();
    let producer = RawProducer::new(setup.kafka.bootstrap());
    let mut expected = Vec::new();
    for fixture in &fixtures {
        for (i, r) in fixture.records.iter().enumerate() {
            let value = base64::engine::general_purpose::STANDARD.decode(&r.value_base64).expect("base64");
            let record = RawRecord {
                // One partition, in order: the parked ones are checked by offset.
                partition: 0,
                key: r.key.as_ref().map(|k| k.clone().into_bytes()),
                value: Some(value),
                headers: r
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone().into_bytes(), v.clone().map(String::into_bytes)))
                    .collect(),
            };
            producer.send(&setup.topic, &record);
            expected.push((format!("{} #{i}: {}", fixture.producer, r.name), &r.expect));
        }
    }
    producer.flush();
    assert!(expected.len() >= 9, "the fixtures hold the recorded records: {}", expected.len());

    let ledger = Ledger::default();
    let (running, _) = credits::start(&pool, setup.config("interop"), &ledger).await;
    let total = i64::try_from(expected.len()).unwrap_or(i64::MAX);
    let settled = eventually(Duration::from_secs(60), || async {
        count(&pool, "SELECT count(*) FROM inbox").await
            + count(&pool, "SELECT count(*) FROM inbox_parked").await
            >= total
    })
    .await;
    running.shutdown().await;
    assert!(settled, "every record has an outcome");

    let parked: Vec<(i64, String)> =
        sqlx::query_as("SELECT kafka_offset, reason FROM inbox_parked ORDER BY kafka_offset")
            .fetch_all(&pool)
            .await
            .expect("parked");
    let mut wrong = Vec::new();
    for (offset, (name, expect)) in expected.iter().enumerate() {
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        match expect {
            Expect::Applied { id, source } => {
                let event_id = event_id_of(source, id);
                let row: Option<(Option<String>, Option<String>)> = sqlx::query_as(
                    "SELECT ce_id, ce_source FROM inbox WHERE consumer = 'interop' AND event_id = $1",
                )
                .bind(event_id)
                .fetch_optional(&pool)
                .await
                .expect("inbox row");
                let credited: i64 = sqlx::query_scalar("SELECT count(*) FROM credits WHERE event_id = $1")
                    .bind(event_id)
                    .fetch_one(&pool)
                    .await
                    .expect("credits");
                let kept = if Uuid::parse_str(id).is_ok() {
                    (None, None)
                } else {
                    (Some(id.clone()), Some(source.clone()))
                };
                if row != Some(kept.clone()) || credited != 1 {
                    let reason = parked.iter().find(|(o, _)| *o == offset).map(|(_, r)| r.as_str());
                    wrong.push(format!(
                        "{name}: expected applied once as {event_id} with {kept:?}; inbox row {row:?}, \
                         {credited} credit(s), parked: {reason:?}"
                    ));
                }
            }
            Expect::Parked { reason } => match parked.iter().find(|(o, _)| *o == offset) {
                Some((_, got)) if got.starts_with(reason.as_str()) => {}
                other => wrong.push(format!("{name}: expected parked with {reason:?}, got {other:?}")),
            },
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} records wrong:\n  {}",
        wrong.len(),
        expected.len(),
        wrong.join("\n  ")
    );
}
