//! The Kafka-protocol broker of tests and of `cargo xtask demo`, `chaos` and `bench`:
//! `KAFKA_BROKERS` when set (e.g. a Tansu process), otherwise librdkafka's in-process mock
//! cluster. Tests that inject faults always use a mock cluster of their own
//! ([`Kafka::mock`]).
//!
//! The `try_` forms return errors, for the xtask commands; the others panic, for tests.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use outbox_runtime::testing::EmbeddedKafka;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::Failure;

/// A broker for one test or run: [`EmbeddedKafka`], the library's test broker, with the
/// readers tests need (records, committed offsets, watermarks).
pub struct Kafka {
    inner: EmbeddedKafka,
}

impl std::fmt::Debug for Kafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

/// One record read back from a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The record key.
    pub key: String,
    /// The value.
    pub value: String,
    /// Headers by name (last wins), as text (invalid UTF-8 replaced).
    pub headers: BTreeMap<String, String>,
    /// The value's bytes as they were written.
    pub raw_value: Vec<u8>,
    /// The headers' names and bytes, in order.
    pub raw_headers: Vec<(String, Option<Vec<u8>>)>,
    /// Kafka partition.
    pub partition: i32,
    /// Offset in it.
    pub offset: i64,
}

impl Kafka {
    /// `KAFKA_BROKERS` if set, else a fresh in-process mock cluster.
    pub fn start() -> Kafka {
        Kafka::try_start().expect("broker")
    }

    /// [`Kafka::start`], failing instead of panicking.
    pub fn try_start() -> Result<Kafka, Failure> {
        Ok(Kafka {
            inner: EmbeddedKafka::from_env().map_err(|e| format!("cannot start the mock cluster: {e}"))?,
        })
    }

    /// A fresh in-process mock cluster with one broker (id 1), for fault injection.
    pub fn mock() -> Kafka {
        Kafka::try_mock().expect("mock cluster")
    }

    /// [`Kafka::mock`], failing instead of panicking.
    pub fn try_mock() -> Result<Kafka, Failure> {
        Ok(Kafka {
            inner: EmbeddedKafka::start().map_err(|e| format!("cannot start the mock cluster: {e}"))?,
        })
    }

    /// The bootstrap servers.
    pub fn bootstrap(&self) -> &str {
        self.inner.bootstrap()
    }

    /// The mock cluster, when this is one.
    pub fn mock_cluster(&self) -> Option<&MockCluster<'static, DefaultProducerContext>> {
        self.inner.mock_cluster()
    }

    /// Whether this is an in-process mock cluster (not `KAFKA_BROKERS`).
    pub fn is_mock(&self) -> bool {
        self.inner.mock_cluster().is_some()
    }

    /// Creates `topic` with `partitions` partitions unless it exists.
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        self.create_topic_with(topic, partitions, &[]).await;
    }

    /// [`Kafka::create_topic`], failing instead of panicking.
    pub async fn try_create_topic(&self, topic: &str, partitions: i32) -> Result<(), Failure> {
        self.inner
            .create_topic(topic, partitions)
            .await
            .map_err(|e| format!("cannot create topic {topic}: {e}").into())
    }

    /// Creates `topic` with topic settings (ignored by the mock cluster, which takes none).
    pub async fn create_topic_with(&self, topic: &str, partitions: i32, settings: &[(&str, &str)]) {
        self.inner.create_topic_with(topic, partitions, settings).await.expect("create topic");
    }

    /// The offsets `group` committed on `topic`'s first `partitions` partitions (-1: none).
    pub fn committed(&self, group: &str, topic: &str, partitions: i32) -> Vec<i64> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.inner.bootstrap())
            .set("group.id", group)
            .create()
            .expect("client");
        let mut list = TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition(topic, p);
        }
        let offsets = consumer.committed_offsets(list, Duration::from_secs(10)).expect("committed offsets");
        offsets.elements().iter().map(|e| if let Offset::Offset(o) = e.offset() { o } else { -1 }).collect()
    }

    /// Low and high watermarks of `topic`'s first `partitions` partitions.
    pub fn watermarks(&self, topic: &str, partitions: i32) -> Vec<(i64, i64)> {
        let consumer: BaseConsumer =
            ClientConfig::new().set("bootstrap.servers", self.inner.bootstrap()).create().expect("client");
        (0..partitions)
            .map(|p| consumer.fetch_watermarks(topic, p, Duration::from_secs(10)).expect("watermarks"))
            .collect()
    }

    /// Reads every record of `topic` below its high watermarks at the time of the call,
    /// partition by partition (one assigned partition at a time works with every broker
    /// tried), within `timeout`. Returns them in partition then offset order.
    pub fn read_all(&self, topic: &str, timeout: Duration) -> Vec<Record> {
        self.try_read_all(topic, timeout).expect("read the topic")
    }

    /// [`Kafka::read_all`], failing instead of panicking. What is not read within
    /// `timeout` is left out, not an error.
    pub fn try_read_all(&self, topic: &str, timeout: Duration) -> Result<Vec<Record>, Failure> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.inner.bootstrap())
            .set("group.id", format!("outbox-tests-reader-{}", uuid::Uuid::new_v4()))
            .set("enable.auto.commit", "false")
            .create()?;
        // A slow broker (Tansu busy with four kill tests at once) may time a metadata
        // request out: tried three times, like the watermarks below.
        let mut tries = 0;
        let metadata = loop {
            tries += 1;
            match consumer.fetch_metadata(Some(topic), Duration::from_secs(20)) {
                Ok(metadata) => break metadata,
                Err(error) if tries < 3 => {
                    eprintln!("reader: metadata of {topic}, try {tries} of 3: {error}")
                }
                Err(error) => {
                    return Err(format!("{topic}: no metadata after 3 tries of 20 s: {error}").into())
                }
            }
        };
        let partitions: Vec<i32> =
            metadata.topics().iter().flat_map(|t| t.partitions()).map(|p| p.id()).collect();
        let deadline = Instant::now() + timeout;
        let started = Instant::now();
        let mut records = Vec::new();
        for partition in partitions {
            // A slow broker (Tansu after a long run) may need more than one try.
            let (low, high) = (0..3)
                .find_map(|_| consumer.fetch_watermarks(topic, partition, Duration::from_secs(20)).ok())
                .ok_or_else(|| format!("{topic}[{partition}]: no watermarks after 3 tries of 20 s"))?;
            if high <= low {
                continue;
            }
            let mut assignment = TopicPartitionList::new();
            assignment.add_partition_offset(topic, partition, Offset::Offset(low))?;
            consumer.assign(&assignment)?;
            let mut next = low;
            while next < high && Instant::now() < deadline {
                match consumer.poll(Duration::from_millis(200)) {
                    Some(Ok(message)) => {
                        next = message.offset() + 1;
                        records.push(Record::of(&message));
                    }
                    Some(Err(error)) => eprintln!("reader: {error}"),
                    None => {}
                }
            }
        }
        eprintln!("read {} records of {topic} in {:.1}s", records.len(), started.elapsed().as_secs_f64());
        records.sort_by_key(|r| (r.partition, r.offset));
        Ok(records)
    }
}

impl Record {
    fn of(message: &impl Message) -> Record {
        let headers = message
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| {
                        (h.key.to_owned(), String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned())
                    })
                    .collect()
            })
            .unwrap_or_default();
        let raw_headers = message
            .headers()
            .map(|hs| hs.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
            .unwrap_or_default();
        Record {
            key: String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned(),
            value: String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned(),
            headers,
            raw_value: message.payload().unwrap_or_default().to_vec(),
            raw_headers,
            partition: message.partition(),
            offset: message.offset(),
        }
    }
}
