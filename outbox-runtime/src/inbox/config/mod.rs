//! How an inbox consumer runs: its settings, their defaults, and the bounds `Inbox::new`
//! holds them to ([invariant 12](crate::guarantees#i12): a setting that cannot work is refused by name).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::kafka_settings::canonical;
use crate::secrets::{redact_urls, redacted};

const MS: Duration = Duration::from_millis(1);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

/// [`InboxConfig::memory_budget`]'s default.
const DEFAULT_MEMORY_BUDGET: usize = 256 * 1024 * 1024;

/// How an inbox consumer runs. Every setting has a default except consumer, brokers, topics;
/// [`Inbox::new`](super::Inbox::new) refuses values that cannot work with
/// [`Error::Config`] naming the setting. Its `Debug` redacts secrets among the Kafka
/// settings.
#[derive(Clone)]
pub struct InboxConfig {
    pub(crate) consumer: String,
    pub(crate) brokers: String,
    pub(crate) topics: Vec<String>,
    pub(crate) schema: String,
    pub(crate) table: String,
    pub(crate) dedup_retention: Option<Duration>,
    pub(crate) replay_window: Duration,
    pub(crate) refuse_short_retention: bool,
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) max_attempts: u32,
    pub(crate) queue_per_partition: usize,
    pub(crate) batch_size: usize,
    pub(crate) batch_wait: Duration,
    pub(crate) batch_timeout: Duration,
    pub(crate) buffer_per_partition: usize,
    pub(crate) memory_budget: usize,
    pub(crate) commit_interval: Duration,
    pub(crate) operator_poll_interval: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) cleanup_interval: Duration,
    pub(crate) cleanup_batch: u32,
    pub(crate) kafka: BTreeMap<String, String>,
}

impl std::fmt::Debug for InboxConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxConfig")
            .field("consumer", &self.consumer)
            .field("brokers", &redact_urls(&self.brokers))
            .field("topics", &self.topics)
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("dedup_retention", &self.dedup_retention)
            .field("replay_window", &self.replay_window)
            .field("refuse_short_retention", &self.refuse_short_retention)
            .field("backoff", &(self.backoff_base, self.backoff_max))
            .field("max_attempts", &self.max_attempts)
            .field("queue_per_partition", &self.queue_per_partition)
            .field("buffer_per_partition", &self.buffer_per_partition)
            .field("memory_budget", &self.memory_budget)
            .field("commit_interval", &self.commit_interval)
            .field("operator_poll_interval", &self.operator_poll_interval)
            .field("batch_size", &self.batch_size)
            .field("batch_wait", &self.batch_wait)
            .field("batch_timeout", &self.batch_timeout)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("cleanup_interval", &self.cleanup_interval)
            .field("cleanup_batch_size", &self.cleanup_batch)
            .field("kafka", &redacted(&self.kafka))
            .finish()
    }
}

impl InboxConfig {
    /// A consumer named `consumer` (its Kafka `group.id`, and its key in the inbox),
    /// reading `topics` from `brokers`; otherwise defaults.
    pub fn new(
        consumer: impl Into<String>,
        brokers: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        InboxConfig {
            consumer: consumer.into(),
            brokers: brokers.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            schema: "public".to_owned(),
            table: "inbox".to_owned(),
            dedup_retention: Some(30 * DAY),
            replay_window: 7 * DAY,
            refuse_short_retention: false,
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            max_attempts: 10,
            queue_per_partition: 256,
            batch_size: 100,
            batch_wait: Duration::ZERO,
            batch_timeout: Duration::from_secs(5),
            buffer_per_partition: 64 * 1024 * 1024,
            memory_budget: DEFAULT_MEMORY_BUDGET,
            commit_interval: Duration::from_millis(500),
            operator_poll_interval: Duration::from_secs(2),
            shutdown_timeout: Duration::from_secs(30),
            cleanup_interval: Duration::from_secs(60),
            cleanup_batch: 1000,
            kafka: BTreeMap::new(),
        }
    }

    /// Schema of the inbox tables. Default: `public`.
    #[must_use]
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Inbox table name; `<table>_parked`, `<table>_aggregates` and `<table>_migrations`
    /// are named after it. Default: `inbox`.
    #[must_use]
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// How long event ids are kept for deduplication; `None` keeps them forever. It must
    /// cover the topic's retention plus the replay window, or a redelivered old event
    /// would apply twice. At least 1 s. Default: 30 days.
    #[must_use]
    pub fn dedup_retention(mut self, retention: impl Into<Option<Duration>>) -> Self {
        self.dedup_retention = retention.into();
        self
    }

    /// How far back events may be replayed (re-published) after they first arrived. At most
    /// 100 years. Default: 7 days.
    #[must_use]
    pub fn replay_window(mut self, window: Duration) -> Self {
        self.replay_window = window;
        self
    }

    /// Refuse to start (instead of warning) when the dedup retention is shorter than the
    /// topic's retention plus the replay window. Default: false.
    #[must_use]
    pub fn refuse_short_retention(mut self, refuse: bool) -> Self {
        self.refuse_short_retention = refuse;
        self
    }

    /// First retry delay after a failure that may pass, doubling with jitter up to `max`.
    /// `base` between 1 ms and 1 h, `max` between `base` and 1 day. Defaults: 200 ms and 30 s.
    #[must_use]
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }

    /// How many times one message is tried when it fails in a way that may pass (a
    /// transient handler error, a serialization failure, an unclassified database error)
    /// before it is parked with the last error. Failures that repeat by nature (bad data,
    /// constraint violations, program limits) park at once; an unreachable database is
    /// waited for without a limit, since nothing could be recorded meanwhile. Between 1
    /// and 1,000,000. Default: 10 (about 80 s with the default backoff).
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Records handed to each partition's worker ahead of the one in hand. The receive loop
    /// never waits on a worker: records beyond this wait in the partition's buffer (see
    /// [`InboxConfig::buffer_per_partition`]) while the other partitions go on. Between 1
    /// and 1,000,000. Default: 256.
    #[must_use]
    pub fn queue_per_partition(mut self, messages: usize) -> Self {
        self.queue_per_partition = messages;
        self
    }

    /// Most records of one partition applied in one transaction. A worker takes the records
    /// already waiting for it (up to this many, see [`InboxConfig::batch_wait`]) and applies
    /// them in order in one transaction: dedup rows for the group, then each effect, one
    /// commit; offsets are committed after it as always. If any record of the batch does
    /// not simply apply (a handler error, a panic, a record to park after a rollback, a
    /// database error), the transaction rolls back and the batch is processed again one
    /// record per transaction, so a poison record still parks alone and a handler may run
    /// more than once for a record (its effects roll back with the batch). 1 applies every
    /// record in its own transaction. Between 1 and 10,000. Default: 100.
    #[must_use]
    pub fn batch_size(mut self, records: usize) -> Self {
        self.batch_size = records;
        self
    }

    /// How long a worker waits for more records to fill a batch after the first one
    /// arrived. 0 takes only what is already waiting, adding no latency. Between 0 and
    /// 1 s. Default: 0.
    #[must_use]
    pub fn batch_wait(mut self, wait: Duration) -> Self {
        self.batch_wait = wait;
        self
    }

    /// How long one batch's transaction may take. Past it, the batch is rolled back and its
    /// records applied one per transaction, so that a slow or stuck handler holds up only
    /// its own record, not the ones before it in the batch. Between 1 ms and 1 h.
    /// Default: 5 s.
    #[must_use]
    pub fn batch_timeout(mut self, timeout: Duration) -> Self {
        self.batch_timeout = timeout;
        self
    }

    /// Bytes (keys, values and headers) of records that may wait per partition behind a
    /// worker that is behind, before the partition is paused at the broker; it is resumed
    /// once half of that is left. Pausing costs a fetch again on resume, so this is a bound
    /// on memory, not a flow control for every burst. It is per partition and on top of
    /// the worker's queue (`queue_per_partition` records) and librdkafka's own prefetch
    /// (`queued.max.messages.kbytes`). Between 1 KiB and 1 TiB. Default: 64 MiB.
    #[must_use]
    pub fn buffer_per_partition(mut self, bytes: usize) -> Self {
        self.buffer_per_partition = bytes;
        self
    }

    /// Bytes (keys, values and headers) of records the inbox may hold in all, across its
    /// partitions, from receipt until their outcome: in workers' queues, in buffers and in
    /// batches being applied. Past it, every partition a record arrives for is paused at
    /// the broker unless it holds no more than its floor (an equal share of a quarter of
    /// the budget), and resumed once the total is down to half or it is down to half its
    /// floor: a partition whose records cannot be applied never stops the others.
    /// librdkafka's prefetch, `queued.max.messages.kbytes`, is a quarter of it unless a
    /// `kafka_setting` sets it: records in memory stay under 1.5 times the budget, plus the
    /// records already received when a partition crossed its bound. Shown as the
    /// `inbox_buffered_bytes` gauge. Between 1 MiB and 1 TiB. Default: 256 MiB.
    #[must_use]
    pub fn memory_budget(mut self, bytes: usize) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// How often finished offsets are committed. Between 1 ms and 1 h. Default: 500 ms.
    #[must_use]
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval;
        self
    }

    /// How often expired dedup rows (past [`InboxConfig::dedup_retention`]) are deleted.
    /// At least 1 s. Default: 60 s.
    #[must_use]
    pub fn cleanup_interval(mut self, interval: Duration) -> Self {
        self.cleanup_interval = interval;
        self
    }

    /// Expired dedup rows deleted per transaction. 1 to 100,000. Default: 1,000.
    #[must_use]
    pub fn cleanup_batch_size(mut self, rows: u32) -> Self {
        self.cleanup_batch = rows;
        self
    }

    /// How often the running consumer looks for retries requested by operators
    /// ([`InboxAdmin::request_retry`](super::InboxAdmin::request_retry), `outbox inbox
    /// retry`). Between 10 ms and 1 h. Default: 2 s.
    #[must_use]
    pub fn operator_poll_interval(mut self, interval: Duration) -> Self {
        self.operator_poll_interval = interval;
        self
    }

    /// How long [`Inbox::run`](super::Inbox::run) waits, after it was cancelled, for the
    /// messages in hand to finish; then it abandons them (their transactions roll back,
    /// they are redelivered) and returns. Between 1 ms and 1 h. Default: 30 s.
    #[must_use]
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// A librdkafka consumer setting. `enable.auto.commit`, `enable.auto.offset.store` and
    /// `group.id` are fixed.
    #[must_use]
    pub fn kafka_setting(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.kafka.insert(key.into(), value.into());
        self
    }

    /// The consumer name (Kafka `group.id`).
    pub fn get_consumer(&self) -> &str {
        &self.consumer
    }

    /// The topics read.
    pub fn get_topics(&self) -> &[String] {
        &self.topics
    }

    /// The consumer name (Kafka `group.id`).
    #[deprecated(since = "0.1.0", note = "use get_consumer, named as every other getter")]
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// The topics read.
    #[deprecated(since = "0.1.0", note = "use get_topics, named as every other getter")]
    pub fn topics(&self) -> &[String] {
        &self.topics
    }

    /// How often expired dedup rows are deleted.
    pub fn get_cleanup_interval(&self) -> Duration {
        self.cleanup_interval
    }

    /// Expired dedup rows deleted per transaction.
    pub fn get_cleanup_batch_size(&self) -> u32 {
        self.cleanup_batch
    }

    /// The dedup retention (`None`: forever).
    pub fn get_dedup_retention(&self) -> Option<Duration> {
        self.dedup_retention
    }

    /// The attempt limit of [`InboxConfig::max_attempts`].
    pub fn get_max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The shutdown timeout of [`InboxConfig::shutdown_timeout`].
    pub fn get_shutdown_timeout(&self) -> Duration {
        self.shutdown_timeout
    }

    /// Kafka's `bootstrap.servers`.
    pub fn get_brokers(&self) -> &str {
        &self.brokers
    }
    /// See [`InboxConfig::schema`].
    pub fn get_schema(&self) -> &str {
        &self.schema
    }
    /// See [`InboxConfig::table`].
    pub fn get_table(&self) -> &str {
        &self.table
    }
    /// See [`InboxConfig::replay_window`].
    pub fn get_replay_window(&self) -> Duration {
        self.replay_window
    }
    /// See [`InboxConfig::refuse_short_retention`].
    pub fn get_refuse_short_retention(&self) -> bool {
        self.refuse_short_retention
    }
    /// See [`InboxConfig::backoff`]: `(base, max)`.
    pub fn get_backoff(&self) -> (Duration, Duration) {
        (self.backoff_base, self.backoff_max)
    }
    /// See [`InboxConfig::queue_per_partition`].
    pub fn get_queue_per_partition(&self) -> usize {
        self.queue_per_partition
    }
    /// See [`InboxConfig::batch_size`].
    pub fn get_batch_size(&self) -> usize {
        self.batch_size
    }
    /// See [`InboxConfig::batch_wait`].
    pub fn get_batch_wait(&self) -> Duration {
        self.batch_wait
    }
    /// See [`InboxConfig::batch_timeout`].
    pub fn get_batch_timeout(&self) -> Duration {
        self.batch_timeout
    }
    /// See [`InboxConfig::buffer_per_partition`].
    pub fn get_buffer_per_partition(&self) -> usize {
        self.buffer_per_partition
    }

    /// See [`InboxConfig::memory_budget`].
    pub fn get_memory_budget(&self) -> usize {
        self.memory_budget
    }
    /// See [`InboxConfig::commit_interval`].
    pub fn get_commit_interval(&self) -> Duration {
        self.commit_interval
    }
    /// See [`InboxConfig::operator_poll_interval`].
    pub fn get_operator_poll_interval(&self) -> Duration {
        self.operator_poll_interval
    }
    /// The value of a librdkafka setting given with [`InboxConfig::kafka_setting`].
    pub fn get_kafka_setting(&self, key: &str) -> Option<&str> {
        self.kafka.get(key).map(String::as_str)
    }

    /// Checks every setting against what can work.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.consumer.is_empty() || self.consumer.len() > 200 || self.consumer.contains('\0') {
            return Err(Error::Config(format!(
                "inbox setting consumer is {:?}: name the consumer with 1 to 200 bytes of text (it is part of \
                 every index key)",
                self.consumer
            )));
        }
        if self.topics.is_empty() || self.topics.iter().any(String::is_empty) {
            return Err(Error::Config(format!(
                "inbox setting topics is {:?}: give at least one topic, none empty",
                self.topics
            )));
        }
        within("commit_interval", self.commit_interval, MS, HOUR)?;
        within("backoff (base)", self.backoff_base, MS, HOUR)?;
        within("backoff (max)", self.backoff_max, self.backoff_base, DAY)?;
        within("operator_poll_interval", self.operator_poll_interval, 10 * MS, HOUR)?;
        within("shutdown_timeout", self.shutdown_timeout, MS, HOUR)?;
        within("replay_window", self.replay_window, Duration::ZERO, 36_500 * DAY)?;
        if let Some(retention) = self.dedup_retention {
            within("dedup_retention", retention, Duration::from_secs(1), 36_500 * DAY)?;
        }
        count("max_attempts", u64::from(self.max_attempts))?;
        within("cleanup_interval", self.cleanup_interval, Duration::from_secs(1), 36_500 * DAY)?;
        if !(1..=100_000).contains(&self.cleanup_batch) {
            return Err(Error::Config(format!(
                "inbox setting cleanup_batch_size is {}: it must be between 1 and 100000",
                self.cleanup_batch
            )));
        }
        count("queue_per_partition", self.queue_per_partition as u64)?;
        if !(1..=10_000).contains(&self.batch_size) {
            return Err(Error::Config(format!(
                "inbox setting batch_size is {}: it must be between 1 and 10000",
                self.batch_size
            )));
        }
        within("batch_wait", self.batch_wait, Duration::ZERO, Duration::from_secs(1))?;
        within("batch_timeout", self.batch_timeout, MS, HOUR)?;
        if !(1024..=1 << 40).contains(&self.buffer_per_partition) {
            return Err(Error::Config(format!(
                "inbox setting buffer_per_partition is {} bytes: it must be between 1 KiB and 1 TiB",
                self.buffer_per_partition
            )));
        }
        if !(1 << 20..=1 << 40).contains(&self.memory_budget) {
            return Err(Error::Config(format!(
                "inbox setting memory_budget is {} bytes: it must be between 1 MiB and 1 TiB",
                self.memory_budget
            )));
        }
        for key in self.kafka.keys() {
            if ["enable.auto.commit", "enable.auto.offset.store", "group.id"].contains(&canonical(key)) {
                return Err(Error::Config(format!(
                    "inbox kafka_setting {key} cannot be set: the inbox commits offsets itself, after each \
                     transaction, and its group is the consumer name"
                )));
            }
        }
        Ok(())
    }
}

fn within(setting: &str, value: Duration, min: Duration, max: Duration) -> Result<()> {
    if value < min || value > max {
        return Err(Error::Config(format!(
            "inbox setting {setting} is {value:?}: it must be between {min:?} and {max:?}"
        )));
    }
    Ok(())
}

fn count(setting: &str, value: u64) -> Result<()> {
    if !(1..=1_000_000).contains(&value) {
        return Err(Error::Config(format!(
            "inbox setting {setting} is {value}: it must be between 1 and 1000000"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
