//! [`RelayConfig`]: how a relay runs, and the checks that keep its settings from breaking
//! a guarantee ([invariant 12](crate::guarantees#i12)).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::cleanup::Cleanup;
use crate::error::{Error, Result};
use crate::kafka_settings::canonical;
use crate::schema_registry::SchemaIds;
use crate::secrets::{redact_urls, redacted};

/// How a relay runs. Every setting has a default except the brokers. Its `Debug` redacts
/// secrets among the producer settings.
#[derive(Clone)]
pub struct RelayConfig {
    pub(crate) brokers: String,
    pub(crate) batch_size: u32,
    pub(crate) poll_interval: Duration,
    pub(crate) lease_ttl: Duration,
    pub(crate) message_timeout: Duration,
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) missing_topic_timeout: Duration,
    pub(crate) source: String,
    pub(crate) dataschema_base: String,
    pub(crate) producer: BTreeMap<String, String>,
    pub(crate) cleanup: Option<Cleanup>,
    pub(crate) claim_mode: ClaimMode,
    pub(crate) schema_ids: Option<Arc<SchemaIds>>,
}

/// How the polling relay keeps two relays from publishing one aggregate at once: the
/// first two of the three relay models (the third, reading the write-ahead log, is
/// `CdcRelay`, feature `cdc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClaimMode {
    /// Work partitions leased in short transactions and renewed; rows read in one short
    /// query, sent outside any transaction, marked in another, fenced by the lease tokens.
    /// No transaction stays open while the broker answers, and the next batch is read while
    /// the last one's mark is written. The default.
    #[default]
    Lease,
    /// One transaction per batch that locks the free work partitions
    /// (`FOR UPDATE SKIP LOCKED`) and the rows it reads (`FOR UPDATE`), sends them, marks
    /// them and commits: no lease rows to renew, and a relay that dies releases its locks
    /// with its connection at once instead of when a lease expires. The price: a connection
    /// and the rows' locks are held for as long as the broker takes to answer (up to the
    /// message timeout; an operator's `retry` or `discard` of a row in flight waits for it),
    /// and batches do not overlap with their marks. Each batch locks at most its relay's
    /// fair share of the partitions (`ceil(partitions / live relays)`, chosen at random), so
    /// several relays share the work. Relays of both modes may share an outbox: neither
    /// takes a partition the other holds.
    HoldLocks,
}

impl std::fmt::Debug for RelayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayConfig")
            .field("brokers", &redact_urls(&self.brokers))
            .field("batch_size", &self.batch_size)
            .field("poll_interval", &self.poll_interval)
            .field("lease_ttl", &self.lease_ttl)
            .field("message_timeout", &self.message_timeout)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("max_attempts", &self.max_attempts)
            .field("missing_topic_timeout", &self.missing_topic_timeout)
            .field("source", &self.source)
            .field("dataschema_base", &self.dataschema_base)
            .field("producer", &redacted(&self.producer))
            .field("cleanup", &self.cleanup)
            .field("claim_mode", &self.claim_mode)
            .field("schema_ids", &self.schema_ids.as_ref().map(|ids| (ids.form(), ids.len())))
            .finish()
    }
}

/// The longest message timeout, 12 days: a batch waits that long for its acknowledgements
/// at most (the lease must exceed twice it, and PostgreSQL takes the lease as an interval).
const MAX_MESSAGE_TIMEOUT: Duration = Duration::from_secs(12 * 24 * 3600);

impl RelayConfig {
    /// A relay publishing to `brokers` (Kafka's `bootstrap.servers`), otherwise defaults.
    pub fn new(brokers: impl Into<String>) -> Self {
        RelayConfig {
            brokers: brokers.into(),
            batch_size: 2000,
            poll_interval: Duration::from_secs(1),
            lease_ttl: Duration::from_secs(30),
            message_timeout: Duration::from_secs(10),
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(300),
            max_attempts: None,
            missing_topic_timeout: Duration::from_secs(300),
            source: "/outbox".to_owned(),
            dataschema_base: crate::schema::DEFAULT_SCHEMA_BASE.to_owned(),
            producer: BTreeMap::new(),
            cleanup: Some(Cleanup::default()),
            claim_mode: ClaimMode::Lease,
            schema_ids: None,
        }
    }

    /// Frames every record's payload in a schema registry's wire format, naming the
    /// registered schema of its event type and version ([`SchemaIds`], resolved before the
    /// relay starts; the relay never calls the registry): what Confluent's deserializers
    /// (Java, Python, Go, Kafka Connect, ksqlDB) need to read the records. A row whose type
    /// and version `ids` does not hold is failed, with a reason naming them, until they are
    /// registered and the relay restarted (then `outbox retry`). The CloudEvents headers
    /// stay as they are. Default: none, records are unframed CloudEvents.
    #[must_use]
    pub fn schema_ids(mut self, ids: impl Into<Option<SchemaIds>>) -> Self {
        self.schema_ids = ids.into().map(Arc::new);
        self
    }

    /// How rows are claimed: [`ClaimMode::Lease`] (the default) or
    /// [`ClaimMode::HoldLocks`], which holds a transaction and its locks across the send.
    #[must_use]
    pub fn claim_mode(mut self, mode: ClaimMode) -> Self {
        self.claim_mode = mode;
        self
    }

    /// Most rows read and published per batch. Default: 2,000.
    #[must_use]
    pub fn batch_size(mut self, rows: u32) -> Self {
        self.batch_size = rows;
        self
    }

    /// How often to look for work when no NOTIFY arrives (a fallback: appends wake the
    /// relay at commit). Default: 1 s.
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long a work partition lease lasts without renewal; a relay that dies leaves its
    /// partitions to the others after this long. Renewed every third of it. Must exceed
    /// twice the message timeout. Default: 30 s.
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How long a batch's records may take to be acknowledged. Past it, the relay purges
    /// what the producer still holds (a transient failure, retried with backoff). This is
    /// the only timeout on a record: librdkafka's own `message.timeout.ms` is off, since a
    /// record it times out lets the records queued behind it through. Default: 10 s.
    #[must_use]
    pub fn message_timeout(mut self, timeout: Duration) -> Self {
        self.message_timeout = timeout;
        self
    }

    /// Retry delays after transient failures: `base` after the first, doubling with each
    /// attempt, with equal jitter, up to `max`. Default: 500 ms and 5 min. Refused unless
    /// `0 < base <= max`.
    #[must_use]
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }

    /// First retry delay; see [`RelayConfig::backoff`], which sets both.
    #[deprecated(since = "0.1.0", note = "use `backoff(base, max)`, as on InboxConfig")]
    #[must_use]
    pub fn backoff_base(mut self, delay: Duration) -> Self {
        self.backoff_base = delay;
        self
    }

    /// Largest retry delay; see [`RelayConfig::backoff`], which sets both.
    #[deprecated(since = "0.1.0", note = "use `backoff(base, max)`, as on InboxConfig")]
    #[must_use]
    pub fn backoff_max(mut self, delay: Duration) -> Self {
        self.backoff_max = delay;
        self
    }

    /// After this many failed attempts a transiently failing event is marked `failed` too.
    /// Default: none (retry until it succeeds; nothing is given up automatically).
    #[must_use]
    pub fn max_attempts(mut self, attempts: impl Into<Option<u32>>) -> Self {
        self.max_attempts = attempts.into();
        self
    }

    /// How long an event waits for its topic when the cluster says the topic does not
    /// exist. Until then it is not sent (a send could only time out); it stays pending with
    /// a `last_error` naming the topic and is asked about again within 30 s; being held
    /// back is not an attempt. Once the cluster has said "missing" for this long (from the
    /// first such answer this relay got to one this long after it), the event is marked
    /// `failed` with that reason, holding back only its aggregate's later events; `outbox
    /// retry` puts it back once the topic exists. Default: 5 min.
    #[must_use]
    pub fn missing_topic_timeout(mut self, timeout: Duration) -> Self {
        self.missing_topic_timeout = timeout;
        self
    }

    /// The CloudEvents `source` attribute (`ce_source` header): a URI-reference naming the
    /// producing service, e.g. `/order-service` or `urn:example:order-service`; 1 to 128
    /// bytes. Consumers may take events with the same `source` and `id` as duplicates.
    /// Default: `/outbox`.
    #[must_use]
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }

    /// The base of the CloudEvents `dataschema` attribute (`ce_dataschema` header):
    /// each record names its committed schema as `{base}/{event_type}/v{schema_version}.json`
    /// ([`schema_uri`](crate::schema::schema_uri)), the `$id` of the file `cargo xtask
    /// schema generate` writes with the same base (`Xtask::schema_base`). An absolute URI
    /// (CloudEvents requires one; the JavaScript SDK checks it), e.g.
    /// `https://schemas.example.com`; 1 to 128 bytes.
    /// Default: [`DEFAULT_SCHEMA_BASE`](crate::schema::DEFAULT_SCHEMA_BASE), `urn:outbox:schemas`.
    #[must_use]
    pub fn dataschema_base(mut self, base: impl Into<String>) -> Self {
        self.dataschema_base = base.into();
        self
    }

    /// A librdkafka producer setting (e.g. `compression.type`, `security.protocol`, or
    /// `partitioner`, which is `murmur2_random` unless set: the Java client's choice of
    /// partition for a key, where librdkafka's own default is `consistent_random`), as
    /// [`InboxConfig::kafka_setting`](crate::inbox::InboxConfig::kafka_setting) is for the
    /// consumer. `acks` and `enable.idempotence` are fixed and cannot be set, nor anything
    /// else that would break a guarantee, under any name or alias; a value librdkafka
    /// refuses is an [`Error::Config`] from [`Relay::new`](super::Relay::new).
    #[must_use]
    pub fn kafka_setting(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.producer.insert(key.into(), value.into());
        self
    }

    /// See [`RelayConfig::kafka_setting`].
    #[deprecated(since = "0.1.0", note = "use `kafka_setting`, as on InboxConfig")]
    #[must_use]
    pub fn producer_setting(self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.kafka_setting(key, value)
    }

    /// Deleting published rows after a retention period; `None` turns it off.
    /// Default: [`Cleanup::default`].
    #[must_use]
    pub fn cleanup(mut self, cleanup: impl Into<Option<Cleanup>>) -> Self {
        self.cleanup = cleanup.into();
        self
    }

    /// Checks every setting against the relay's guarantees ([invariant 12](crate::guarantees#i12)): a send must end
    /// within its lease, and nothing may weaken acks=all, idempotence or per-partition
    /// order, whatever name or alias sets it.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.batch_size == 0 || self.batch_size > 100_000 {
            return Err(Error::Config(format!("batch_size must be 1 to 100000, not {}", self.batch_size)));
        }
        if self.message_timeout.is_zero() {
            return Err(Error::Config(
                "message_timeout is 0: every batch would be purged before the broker could acknowledge it"
                    .into(),
            ));
        }
        if self.message_timeout > MAX_MESSAGE_TIMEOUT {
            return Err(Error::Config(format!(
                "message_timeout ({:?}) must be at most {MAX_MESSAGE_TIMEOUT:?}: a batch waits that long for \
                 acknowledgements before the relay purges it",
                self.message_timeout
            )));
        }
        if self.max_attempts == Some(0) {
            return Err(Error::Config(
                "max_attempts is Some(0): give at least 1, or None to retry until published".into(),
            ));
        }
        for (key, value) in &self.producer {
            let refused = match canonical(key) {
                "request.required.acks" | "enable.idempotence" | "enable.gapless.guarantee" => {
                    "the relay's guarantees need acks=all, enable.idempotence=true and enable.gapless.guarantee=true"
                }
                "transactional.id" => "the relay publishes with the idempotent producer, not with transactions",
                "message.timeout.ms" => {
                    "the relay turns librdkafka's own timeout off (a record it times out lets the ones queued behind \
                     it through, out of order) and ends each batch itself: set RelayConfig::message_timeout"
                }
                "max.in.flight" if value.trim() != "1" => {
                    "the relay sends an aggregate's events without waiting for each acknowledgement, so it keeps one \
                     produce request in flight per broker: with more, a retried request could be written after a later \
                     one by a broker that does not check the idempotent producer's sequence numbers (librdkafka's mock \
                     cluster does not)"
                }
                _ => continue,
            };
            // No refused setting holds a secret, but its value may be a URL with one.
            let shown = redact_urls(value);
            return Err(Error::Config(format!("kafka_setting {key} = {shown:?} is refused: {refused}")));
        }
        if self.lease_ttl <= self.message_timeout.saturating_mul(2) {
            return Err(Error::Config(format!(
                "lease_ttl ({:?}) must exceed twice the message timeout ({:?}): a batch must end within a lease",
                self.lease_ttl, self.message_timeout
            )));
        }
        if self.missing_topic_timeout.is_zero() {
            return Err(Error::Config(
                "missing_topic_timeout is 0: events would be failed the moment their topic is not found"
                    .into(),
            ));
        }
        if self.poll_interval.is_zero() {
            return Err(Error::Config("poll_interval is 0: give a positive interval".into()));
        }
        if self.backoff_base.is_zero() || self.backoff_max < self.backoff_base {
            return Err(Error::Config(format!(
                "backoff ({:?}, {:?}) must have 0 < base <= max",
                self.backoff_base, self.backoff_max
            )));
        }
        for (name, value) in [("source", &self.source), ("dataschema_base", &self.dataschema_base)] {
            if value.is_empty()
                || value.len() > 128
                || value.chars().any(|c| c.is_control() || c.is_whitespace())
            {
                return Err(Error::Config(format!(
                    "{name} {value:?} must be 1 to 128 bytes without spaces or control characters (a URI)"
                )));
            }
        }
        if !self.dataschema_base.contains(':') {
            return Err(Error::Config(format!(
                "dataschema_base {:?} must be an absolute URI (https://..., urn:...): CloudEvents requires \
                 dataschema to be one, and consumers' SDKs check it",
                self.dataschema_base
            )));
        }
        if let Some(cleanup) = &self.cleanup {
            cleanup.validate()?;
        }
        if self.schema_ids.as_ref().is_some_and(|ids| ids.is_empty()) {
            return Err(Error::Config(
                "schema_ids holds no schema: every record would be failed; give None to publish unframed"
                    .into(),
            ));
        }
        Ok(())
    }

    /// How rows are claimed.
    pub fn get_claim_mode(&self) -> ClaimMode {
        self.claim_mode
    }

    /// Kafka's `bootstrap.servers`.
    pub fn get_brokers(&self) -> &str {
        &self.brokers
    }
    /// See [`RelayConfig::batch_size`].
    pub fn get_batch_size(&self) -> u32 {
        self.batch_size
    }
    /// See [`RelayConfig::poll_interval`].
    pub fn get_poll_interval(&self) -> Duration {
        self.poll_interval
    }
    /// See [`RelayConfig::lease_ttl`].
    pub fn get_lease_ttl(&self) -> Duration {
        self.lease_ttl
    }
    /// See [`RelayConfig::message_timeout`].
    pub fn get_message_timeout(&self) -> Duration {
        self.message_timeout
    }
    /// See [`RelayConfig::backoff`]: `(base, max)`.
    pub fn get_backoff(&self) -> (Duration, Duration) {
        (self.backoff_base, self.backoff_max)
    }
    /// See [`RelayConfig::max_attempts`].
    pub fn get_max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }
    /// See [`RelayConfig::missing_topic_timeout`].
    pub fn get_missing_topic_timeout(&self) -> Duration {
        self.missing_topic_timeout
    }
    /// See [`RelayConfig::source`].
    pub fn get_source(&self) -> &str {
        &self.source
    }
    /// See [`RelayConfig::dataschema_base`].
    pub fn get_dataschema_base(&self) -> &str {
        &self.dataschema_base
    }
    /// The value of a librdkafka setting given with [`RelayConfig::kafka_setting`].
    pub fn get_kafka_setting(&self, key: &str) -> Option<&str> {
        self.producer.get(key).map(String::as_str)
    }
    /// See [`RelayConfig::cleanup`].
    pub fn get_cleanup(&self) -> Option<&Cleanup> {
        self.cleanup.as_ref()
    }
    /// See [`RelayConfig::schema_ids`].
    pub fn get_schema_ids(&self) -> Option<&SchemaIds> {
        self.schema_ids.as_deref()
    }
}
