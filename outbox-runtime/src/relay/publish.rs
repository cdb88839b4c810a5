//! Sending rows to Kafka and judging what the broker answered.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer, PurgeConfig};
use rdkafka::ClientConfig;

use super::claim::{Placement, Row};
use super::RelayConfig;
use crate::error::{Error, Result};
use crate::schema_registry::framing::VALUE_SCHEMA_ID_HEADER;
use crate::schema_registry::Frame;

/// Producer settings the relay's guarantees rest on; they cannot be overridden. With
/// `enable.gapless.guarantee` a broker error that would leave a gap in a partition's
/// sequence (a record failed, a later one persisted) is a fatal error that fails every
/// later record instead: what lets the relay send an aggregate's events without waiting
/// for each acknowledgement.
pub(crate) const FIXED: &[(&str, &str)] =
    &[("acks", "all"), ("enable.idempotence", "true"), ("enable.gapless.guarantee", "true")];

/// librdkafka's own `message.timeout.ms`: none (0 is infinite).
///
/// The relay ends a batch itself at `message_timeout` by purging what is still queued or in
/// flight, which with the gapless guarantee fails every record behind a purged one. A
/// record librdkafka times out itself is the one failure that guarantee does not cover:
/// librdkafka bumps the producer epoch and sends the records queued behind it, so a later
/// event of an aggregate would be persisted without an earlier one. Any finite timeout
/// does that to a relay that stalls past its deadline (a starved runtime, a paused
/// process) while the broker is slow; with none, such a relay's records are written late
/// and in order, and its marks are refused once its lease has passed: duplicates, never a
/// gap.
const LIBRDKAFKA_MESSAGE_TIMEOUT: &str = "0";

/// The relay's partitioner unless a `kafka_setting` says otherwise: Java-compatible
/// murmur2 of the key (null keys, which the relay never sends, at random).
pub(crate) const DEFAULT_PARTITIONER: &str = "murmur2_random";

/// Builds the idempotent, gapless producer: `acks=all`, and no timeout of its own
/// ([`LIBRDKAFKA_MESSAGE_TIMEOUT`]): every record ends when the relay says so.
pub(crate) fn producer(brokers: &str, overrides: &BTreeMap<String, String>) -> Result<FutureProducer> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("message.timeout.ms", LIBRDKAFKA_MESSAGE_TIMEOUT)
        // The relay hands a whole batch over at once: waiting for more only adds latency
        // (created-to-published p50 went from 18 to 5 ms at 500 events/s with 0 instead of 5).
        .set("linger.ms", "0")
        // One request in flight per broker: a retried request is resent before anything
        // behind it, whether or not the broker checks sequence numbers (see FIXED).
        .set("max.in.flight.requests.per.connection", "1")
        .set("retry.backoff.ms", "100")
        // The Java client's partitioner (murmur2 of the key; librdkafka's default is CRC32),
        // so that producers in other languages keyed by the same aggregate id put its
        // events on the same partition (invariant 13). A `kafka_setting` may change it.
        .set("partitioner", DEFAULT_PARTITIONER);
    for (key, value) in overrides {
        if FIXED.iter().any(|(k, _)| k == key) {
            return Err(Error::Config(format!(
                "producer setting {key} cannot be overridden: the relay needs acks=all, enable.idempotence=true \
                 and enable.gapless.guarantee=true"
            )));
        }
        config.set(key, value);
    }
    for (key, value) in FIXED {
        config.set(*key, *value);
    }
    config.create().map_err(|e| Error::kafka_client("RelayConfig::kafka_setting", e))
}

/// The Kafka headers of a row: CloudEvents binary mode plus the outbox's extensions and
/// the row's extra headers.
/// `schema_id` is the value of the `__value_schema_id` header, when the relay frames its
/// records in that form.
pub(crate) fn headers(row: &Row, config: &RelayConfig, schema_id: Option<&[u8]>) -> OwnedHeaders {
    let event_id = row.event_id.to_string();
    let schema_version = row.schema_version.to_string();
    let dataschema = crate::schema::schema_uri(
        &config.dataschema_base,
        &row.event_type,
        u32::try_from(row.schema_version).unwrap_or(0),
    );
    let aggregate_version = row.aggregate_version.map(|v| v.to_string());
    let mut fixed: Vec<(&str, &str)> = vec![
        ("ce_specversion", "1.0"),
        ("ce_id", &event_id),
        ("ce_type", &row.event_type),
        ("ce_source", &config.source),
        ("ce_time", &row.created_at),
        ("ce_subject", &row.aggregate_id),
        ("content-type", "application/json"),
        ("ce_schemaversion", &schema_version),
        ("ce_aggregatetype", &row.aggregate_type),
        ("ce_dataschema", &dataschema),
    ];
    if let Some(v) = &aggregate_version {
        fixed.push(("ce_aggregateversion", v));
    }
    let mut headers = OwnedHeaders::new_with_capacity(fixed.len() + 3);
    for (key, value) in fixed {
        headers = headers.insert(Header { key, value: Some(value.as_bytes()) });
    }
    if let Some(value) = schema_id {
        headers = headers.insert(Header { key: VALUE_SCHEMA_ID_HEADER, value: Some(value) });
    }
    // Extra headers were validated at append time; a row edited by hand into something
    // that is not a string map still publishes, without them.
    if let Ok(extra) = serde_json::from_str::<BTreeMap<String, String>>(&row.headers) {
        // A schema id header written into a row by hand is left out: it would name a schema
        // the relay did not choose (appends refuse the name).
        for (key, value) in extra.iter().filter(|(key, _)| !crate::append::is_schema_id(key)) {
            headers = headers.insert(Header { key, value: Some(value.as_bytes()) });
        }
    }
    headers
}

/// The reason a row is parked with when its `created_at` (read as an empty `ce_time`) is a
/// time that PostgreSQL takes and RFC 3339 cannot express: only a row written by hand can
/// have one, and every later event of its aggregate waits behind it.
pub(crate) const UNREPRESENTABLE_TIME: &str =
    "created_at is not a time CloudEvents can carry (ce_time is RFC 3339: \
     finite, years 0001 to 9999); correct the row's created_at, then retry it";

/// How a send ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Acknowledged by the broker (acks=all).
    Acked(Placement),
    /// May succeed later: retry with backoff. `code` is the Kafka error code's name, a
    /// bounded metric label.
    Transient { reason: String, code: String },
    /// Will fail again until something changes: quarantine the event.
    Permanent { reason: String, code: String },
    /// Not sent: its topic does not exist. Ask again after `retry_in`; not an attempt.
    Held { reason: String, retry_in: Duration },
}

pub(crate) fn judge(error: &KafkaError) -> Sent {
    let reason = error.to_string();
    let label = error.rdkafka_error_code().map_or_else(|| "client".to_owned(), |code| format!("{code:?}"));
    match error.rdkafka_error_code() {
        Some(code) if crate::kafka_codes::is_permanent_delivery(code) => {
            Sent::Permanent { reason, code: label }
        }
        _ => Sent::Transient { reason, code: label },
    }
}

/// Hands one row to the producer without waiting: the delivery report comes through the
/// returned future. A record the producer refuses at once (queue full, too large) is
/// judged here.
pub(crate) fn enqueue(
    producer: &FutureProducer,
    row: &Row,
    config: &RelayConfig,
) -> std::result::Result<DeliveryFuture, Sent> {
    if row.created_at.is_empty() {
        return Err(Sent::Permanent {
            reason: UNREPRESENTABLE_TIME.to_owned(),
            code: "created_at".to_owned(),
        });
    }
    let frame = match &config.schema_ids {
        None => None,
        Some(ids) => match ids.frame(&row.event_type, row.schema_version) {
            Some(frame) => Some(frame),
            None => {
                return Err(Sent::Permanent {
                    reason: format!(
                        "no schema registry id for {} v{}: the relay frames its records ({} form) and was \
                         started without this schema's id; register it (cargo xtask schema push), restart \
                         the relay, then retry the event",
                        row.event_type,
                        row.schema_version,
                        ids.form()
                    ),
                    code: "schema_id".to_owned(),
                })
            }
        },
    };
    // librdkafka copies the payload: a framed one lives until the send returns.
    let (framed, header) = match frame {
        None => (None, None),
        Some(Frame::Prefix(prefix)) => {
            let mut value = Vec::with_capacity(prefix.len() + row.payload.len());
            value.extend_from_slice(prefix);
            value.extend_from_slice(row.payload.as_bytes());
            (Some(value), None)
        }
        Some(Frame::Header(value)) => (None, Some(value.as_slice())),
    };
    let record = FutureRecord::to(&row.topic)
        .key(row.aggregate_id.as_bytes())
        .payload(framed.as_deref().unwrap_or(row.payload.as_bytes()))
        .headers(headers(row, config, header));
    producer.send_result(record).map_err(|(error, _)| judge(&error))
}

/// Judges a delivery report.
pub(crate) fn outcome(report: <DeliveryFuture as std::future::Future>::Output) -> Sent {
    match report {
        Ok(Ok(d)) => Sent::Acked(Placement { partition: d.partition, offset: d.offset }),
        Ok(Err((error, _))) => judge(&error),
        Err(_) => Sent::Transient {
            reason: "the producer dropped the delivery report".to_owned(),
            code: "dropped".to_owned(),
        },
    }
}

/// Fails what the producer still holds, queued or in flight, at once (their delivery
/// reports say `PurgeQueue` or `PurgeInflight`). In flight records may still be written by
/// the broker: a duplicate later, never a gap, since nothing behind them is sent after.
pub(crate) async fn purge(producer: &FutureProducer, inflight: bool) {
    let producer = producer.clone();
    let flags =
        if inflight { PurgeConfig::default().queue().inflight() } else { PurgeConfig::default().queue() };
    // librdkafka waits for its broker threads to purge: a short block, kept off the runtime.
    if tokio::task::spawn_blocking(move || producer.purge(flags)).await.is_err() {
        tracing::warn!(stage = "publish", "purging the producer's queue panicked");
    }
}

/// Whether the producer hit a fatal error and must be replaced.
pub(crate) fn fatal(producer: &FutureProducer) -> Option<String> {
    producer.client().fatal_error().map(|(code, reason)| format!("{code:?}: {reason}"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use rdkafka::message::Headers;
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::FutureRecord;
    use uuid::Uuid;

    use super::{headers, producer, Row};
    use crate::relay::RelayConfig;

    /// A relay that stalls past its deadline (a starved runtime, a paused process) never
    /// purges its batch: whatever then ends a record is librdkafka's. A record that times
    /// out while queued makes librdkafka bump the producer epoch and send what is queued
    /// behind it, so a later event of the aggregate would be persisted without the earlier
    /// one: the relay's producer must never time a record out itself.
    ///
    /// Here the broker is down for longer than the relay's `message_timeout` twice over;
    /// the record queued first must still be written before the one queued after.
    #[tokio::test]
    async fn a_stalled_relay_never_lets_a_later_record_pass_an_earlier_one() {
        let mock = MockCluster::new(1).expect("mock cluster");
        mock.create_topic("stall", 1, 1).expect("topic");
        // What the relay's deadline would be (the tests' `message_timeout`).
        let message_timeout = Duration::from_secs(2);
        let producer = producer(&mock.bootstrap_servers(), &BTreeMap::new()).expect("producer");
        let send = |payload: &'static str| {
            producer
                .send_result(FutureRecord::to("stall").key("aggregate").payload(payload))
                .map_err(|(e, _)| e)
                .expect("queued")
        };
        // A first record gives the producer its id and epoch.
        send("v1").await.expect("report").expect("v1 delivered");
        mock.broker_down(-1).expect("down");
        let earlier = send("v2");
        // Past the deadline twice over, and past the backstop librdkafka's timeout once was.
        tokio::time::sleep(message_timeout * 2 + Duration::from_millis(500)).await;
        let later = send("v3");
        mock.broker_up(-1).expect("up");
        let earlier =
            tokio::time::timeout(Duration::from_secs(30), earlier).await.expect("v2 ends").expect("report");
        let later =
            tokio::time::timeout(Duration::from_secs(30), later).await.expect("v3 ends").expect("report");
        let (earlier, later) = (earlier.map_err(|(e, _)| e), later.map_err(|(e, _)| e));
        assert!(
            earlier.is_ok() || later.is_err(),
            "v3 was written although v2 before it failed: v2 {earlier:?}, v3 {later:?}"
        );
        let (earlier, later) = (earlier.expect("v2 delivered"), later.expect("v3 delivered"));
        assert!(earlier.offset < later.offset, "v2 at {}, v3 at {}", earlier.offset, later.offset);
    }

    /// What an append counts for a record's headers covers what the relay sends, with the
    /// longest `source` and `dataschema_base` a relay accepts, the largest versions and a
    /// schema GUID header (the header form; the prefix form adds 5 bytes to the value
    /// instead, fewer than the header's 34): a record an append accepted is never refused
    /// by the broker for its headers.
    #[test]
    fn the_headers_fit_in_what_an_append_counts_for_them() {
        let long = format!("urn:{}", "x".repeat(124));
        let config = RelayConfig::new("b:9092").source(long.clone()).dataschema_base(long);
        config.validate().expect("the longest accepted values");
        let row = Row {
            id: 1,
            event_id: Uuid::new_v4(),
            aggregate_type: "order".into(),
            aggregate_id: "a".repeat(100),
            aggregate_version: Some(i64::MIN),
            event_type: "billing.invoice_paid_in_full".into(),
            schema_version: i32::MAX,
            topic: "t".into(),
            payload: "{}".into(),
            headers: "{}".into(),
            created_at: "2026-12-01T21:23:03.123456Z".into(),
            attempts: 0,
            work_partition: 0,
        };
        let guid_header = crate::schema_registry::framing::guid_header([0xff; 16]);
        let sent = headers(&row, &config, Some(&guid_header));
        let bytes: usize = sent.iter().map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len)).sum();
        let counted = row.aggregate_id.len()
            + 2 * row.event_type.len()
            + row.aggregate_type.len()
            + crate::RESERVED_HEADER_BYTES;
        assert!(bytes <= counted, "headers take {bytes} bytes, an append counts {counted}");
        let names: Vec<&str> = sent.iter().map(|h| h.key).collect();
        assert!(names.contains(&"ce_dataschema"), "{names:?}");
        assert!(names.contains(&"__value_schema_id"), "{names:?}");
    }
}
