//! How far a consumer is behind, as the broker sees it: its group's committed offsets
//! against the ends of the partitions it has committed on. Read-only: the reader never
//! joins the group and never commits.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use crate::error::{Error, Result};

/// At most this many partitions are read per consumer; the rest are left out and the
/// answer says it is partial.
pub const MAX_LAG_PARTITIONS: usize = 4096;

/// One partition of a consumer's lag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PartitionLag {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The group's committed offset (the next to read); `None` when it has committed on
    /// other partitions of the topic but not this one (counted from the partition's start,
    /// as the inbox reads a partition it has no offset for).
    pub committed: Option<i64>,
    /// The partition's end (its high watermark).
    pub end: i64,
    /// Messages behind the end.
    pub lag: i64,
}

/// A consumer's lag, from [`LagReader::read`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ConsumerLag {
    /// The consumer (its Kafka `group.id`).
    pub consumer: String,
    /// Messages behind, summed over the partitions read.
    pub messages: i64,
    /// Per partition, by topic and partition.
    pub partitions: Vec<PartitionLag>,
    /// Whether some partitions were left out (over [`MAX_LAG_PARTITIONS`], or the read's
    /// time ran out): `messages` is then a lower bound.
    pub partial: bool,
}

/// Reads consumers' lag from the brokers, one read-only client per consumer group, kept
/// for the next read.
pub struct LagReader {
    settings: BTreeMap<String, String>,
    timeout: Duration,
    clients: Mutex<BTreeMap<String, Arc<BaseConsumer>>>,
}

impl std::fmt::Debug for LagReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LagReader")
            .field("settings", &crate::secrets::redacted(&self.settings))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl LagReader {
    /// A reader of the brokers at `bootstrap_servers`; each read takes at most 5 s.
    pub fn new(bootstrap_servers: impl Into<String>) -> Self {
        let mut settings = BTreeMap::new();
        settings.insert("bootstrap.servers".to_owned(), bootstrap_servers.into());
        LagReader { settings, timeout: Duration::from_secs(5), clients: Mutex::new(BTreeMap::new()) }
    }

    /// A librdkafka setting (security, SASL) for its clients. `group.id` and commits are the
    /// reader's own: setting them is an [`Error::Config`] when the first client is made.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.insert(key.into(), value.into());
        self
    }

    /// How long one read may take in all (default 5 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn client(&self, consumer: &str) -> Result<Arc<BaseConsumer>> {
        let mut clients = self.clients.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(client) = clients.get(consumer) {
            return Ok(client.clone());
        }
        let mut config = ClientConfig::new();
        for (key, value) in &self.settings {
            let name = crate::kafka_settings::canonical(key);
            if ["group.id", "enable.auto.commit", "enable.auto.offset.store"].contains(&name) {
                return Err(Error::Config(format!("the lag reader's setting {key:?} is its own")));
            }
            config.set(key, value);
        }
        let client: BaseConsumer = config
            .set("group.id", consumer)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .create()?;
        let client = Arc::new(client);
        clients.insert(consumer.to_owned(), client.clone());
        Ok(client)
    }

    /// `consumer`'s lag: on every topic where its group has committed an offset, each
    /// partition's end minus the committed offset.
    pub async fn read(&self, consumer: &str) -> Result<ConsumerLag> {
        let client = self.client(consumer)?;
        let deadline = Instant::now() + self.timeout;
        let consumer = consumer.to_owned();
        tokio::task::spawn_blocking(move || read(&client, consumer, deadline))
            .await
            .map_err(|e| Error::Config(format!("the lag read stopped: {e}")))?
    }
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

fn read(client: &BaseConsumer, consumer: String, deadline: Instant) -> Result<ConsumerLag> {
    let metadata = client.fetch_metadata(None, left(deadline))?;
    let mut list = TopicPartitionList::new();
    let mut partial = false;
    for topic in metadata.topics() {
        if topic.name().starts_with("__") {
            continue;
        }
        for partition in topic.partitions() {
            if list.count() == MAX_LAG_PARTITIONS {
                partial = true;
                break;
            }
            list.add_partition(topic.name(), partition.id());
        }
    }
    let committed = client.committed_offsets(list, left(deadline))?;
    let mut by_partition: BTreeMap<(String, i32), Option<i64>> = BTreeMap::new();
    for e in committed.elements() {
        by_partition.insert((e.topic().to_owned(), e.partition()), committed_of(e.offset()));
    }
    // The group's topics: those it has committed on.
    let topics: BTreeSet<String> =
        by_partition.iter().filter(|(_, c)| c.is_some()).map(|((t, _), _)| t.clone()).collect();
    let mut partitions = Vec::new();
    for ((topic, partition), committed) in by_partition {
        if !topics.contains(&topic) {
            continue;
        }
        if Instant::now() >= deadline {
            partial = true;
            break;
        }
        let (low, end) = client.fetch_watermarks(&topic, partition, left(deadline))?;
        let lag = (end - committed.unwrap_or(low)).max(0);
        partitions.push(PartitionLag { topic, partition, committed, end, lag });
    }
    Ok(ConsumerLag { consumer, messages: partitions.iter().map(|p| p.lag).sum(), partitions, partial })
}

fn committed_of(offset: Offset) -> Option<i64> {
    match offset {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}
