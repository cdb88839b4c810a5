//! Testing a service that uses the outbox (feature `testing`): an embedded Kafka broker,
//! and a harness that runs a relay and an inbox until everything appended so far has been
//! consumed ("publish, then wait until consumed").
//!
//! ```no_run
//! # use outbox_runtime::inbox::{Handlers, Inbox, InboxConfig};
//! # use outbox_runtime::relay::{Relay, RelayConfig};
//! # use outbox_runtime::testing::{EmbeddedKafka, Harness};
//! # async fn f(pool: sqlx::PgPool, outbox: outbox_runtime::Outbox, handlers: Handlers) -> outbox_runtime::Result<()> {
//! let kafka = EmbeddedKafka::start()?;
//! kafka.create_topic("orders", 3).await?;
//! let relay = Relay::new(pool.clone(), outbox.clone(), RelayConfig::new(kafka.bootstrap()))?;
//! let inbox = Inbox::new(pool.clone(), InboxConfig::new("projection", kafka.bootstrap(), ["orders"]), handlers)?;
//! let mut harness = Harness::start(relay, inbox)?;
//! // ... the service appends events in its transactions ...
//! let settled = harness.settle().await?; // every event appended so far is published and consumed
//! assert_eq!(settled.failed, 0);
//! assert_eq!(harness.inbox_stats().parked(), 0);
//! harness.stop().await?;
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::inbox::{Inbox, InboxStats};
use crate::relay::{Relay, RelayStats};
use crate::{Error, Result};

/// A Kafka broker for tests: librdkafka's in-process mock cluster, or the broker named by
/// `KAFKA_BROKERS` ([`EmbeddedKafka::from_env`]). The mock cluster lives as long as this
/// value.
pub struct EmbeddedKafka {
    mock: Option<MockCluster<'static, DefaultProducerContext>>,
    bootstrap: String,
}

impl std::fmt::Debug for EmbeddedKafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedKafka")
            .field("bootstrap", &self.bootstrap)
            .field("mock", &self.mock.is_some())
            .finish()
    }
}

impl EmbeddedKafka {
    /// A fresh in-process mock cluster of one broker.
    pub fn start() -> Result<Self> {
        let mock = MockCluster::new(1)?;
        let bootstrap = mock.bootstrap_servers();
        Ok(EmbeddedKafka { mock: Some(mock), bootstrap })
    }

    /// The broker at `KAFKA_BROKERS` when it is set and not empty, else [`EmbeddedKafka::start`].
    pub fn from_env() -> Result<Self> {
        match std::env::var("KAFKA_BROKERS") {
            Ok(bootstrap) if !bootstrap.trim().is_empty() => Ok(EmbeddedKafka { mock: None, bootstrap }),
            _ => EmbeddedKafka::start(),
        }
    }

    /// The bootstrap servers, for [`RelayConfig::new`](crate::relay::RelayConfig::new) and
    /// [`InboxConfig::new`](crate::inbox::InboxConfig::new).
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The mock cluster, for fault injection (`None` for an external broker).
    pub fn mock_cluster(&self) -> Option<&MockCluster<'static, DefaultProducerContext>> {
        self.mock.as_ref()
    }

    /// Creates `topic` with `partitions` partitions; an existing topic is left as it is.
    /// (The mock cluster cannot create topics through the admin API, so it is asked
    /// directly.)
    pub async fn create_topic(&self, topic: &str, partitions: i32) -> Result<()> {
        self.create_topic_with(topic, partitions, &[]).await
    }

    /// [`EmbeddedKafka::create_topic`] with topic settings (`retention.ms`, ...), which the
    /// mock cluster ignores: it takes none.
    pub async fn create_topic_with(
        &self,
        topic: &str,
        partitions: i32,
        settings: &[(&str, &str)],
    ) -> Result<()> {
        if let Some(mock) = &self.mock {
            return Ok(mock.create_topic(topic, partitions, 1)?);
        }
        let admin: AdminClient<DefaultClientContext> =
            ClientConfig::new().set("bootstrap.servers", &self.bootstrap).create()?;
        let mut new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        for (key, value) in settings {
            new_topic = new_topic.set(key, value);
        }
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        for result in admin.create_topics(&[new_topic], &options).await? {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => return Err(Error::Kafka(rdkafka::error::KafkaError::AdminOp(code))),
            }
        }
        Ok(())
    }
}

/// What [`Harness::settle`] waited for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settled {
    /// Events appended before the call that the relay published.
    pub published: u64,
    /// Events appended before the call that the relay gave up on (`failed` or
    /// `discarded`): they will not be consumed.
    pub failed: u64,
    /// Of the published ones, records on the inbox's topics whose offsets the inbox has
    /// committed, that is, given an outcome (applied, duplicate, parked, ...).
    pub consumed: u64,
}

/// A relay and an inbox running in the background of a test.
pub struct Harness {
    pool: PgPool,
    outbox_table: String,
    topics: Vec<String>,
    offsets: Arc<BaseConsumer>,
    relay_stats: Arc<RelayStats>,
    inbox_stats: Arc<InboxStats>,
    stop: CancellationToken,
    relay: Option<JoinHandle<Result<()>>>,
    inbox: Option<JoinHandle<Result<()>>>,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("outbox", &self.outbox_table)
            .field("topics", &self.topics)
            .finish_non_exhaustive()
    }
}

/// How long [`Harness::settle`] waits.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

impl Harness {
    /// Starts `relay` and `inbox` on the current tokio runtime. Fails only when the
    /// Kafka client that reads the inbox's committed offsets cannot be made of the
    /// inbox's settings.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(relay: Relay, inbox: Inbox) -> Result<Harness> {
        let pool = relay.pool().clone();
        let outbox_table = relay.outbox().names().outbox.clone();
        let config = inbox.config();
        let mut offsets = ClientConfig::new();
        offsets.set("bootstrap.servers", &config.brokers);
        for (k, v) in &config.kafka {
            offsets.set(k, v);
        }
        // Reads the inbox's committed offsets; never joins the group, never commits.
        offsets.set("group.id", &config.consumer).set("enable.auto.commit", "false");
        let offsets: BaseConsumer = offsets.create()?;
        let topics = config.topics.clone();
        let (relay_stats, inbox_stats) = (relay.stats(), inbox.stats());
        let stop = CancellationToken::new();
        let relay = tokio::spawn(relay.run(stop.child_token()));
        let inbox = tokio::spawn(inbox.run(stop.child_token()));
        Ok(Harness {
            pool,
            outbox_table,
            topics,
            offsets: Arc::new(offsets),
            relay_stats,
            inbox_stats,
            stop,
            relay: Some(relay),
            inbox: Some(inbox),
        })
    }

    /// The relay's counters.
    pub fn relay_stats(&self) -> Arc<RelayStats> {
        self.relay_stats.clone()
    }

    /// The inbox's counters.
    pub fn inbox_stats(&self) -> Arc<InboxStats> {
        self.inbox_stats.clone()
    }

    /// Waits up to 60 s until every event appended (and committed) before this call has
    /// been published or given up on by the relay, and every published one on the
    /// inbox's topics has been given an outcome by the inbox (its offset committed).
    pub async fn settle(&mut self) -> Result<Settled> {
        self.settle_within(SETTLE_TIMEOUT).await
    }

    /// [`Harness::settle`] with another timeout. On timeout, the error says what is
    /// still waiting; if the relay or the inbox stopped, it is their error.
    pub async fn settle_within(&mut self, timeout: Duration) -> Result<Settled> {
        let deadline = Instant::now() + timeout;
        let table = &self.outbox_table;
        let watermark: Option<i64> =
            sqlx::query_scalar(AssertSqlSafe(format!("SELECT max(id) FROM {table}")))
                .fetch_one(&self.pool)
                .await
                .map_err(Error::from)?;
        let Some(watermark) = watermark else { return Ok(Settled::default()) };
        loop {
            self.check_running().await?;
            let (waiting, settled, behind) = self.progress(watermark).await?;
            if waiting == 0 && behind.is_empty() {
                return Ok(settled);
            }
            if Instant::now() >= deadline {
                let mut what = Vec::new();
                if waiting > 0 {
                    what.push(format!("{waiting} event(s) not yet published"));
                }
                for (topic, partition, committed, last) in behind {
                    what.push(format!(
                        "{topic}[{partition}]: inbox committed up to offset {committed}, last published {last}"
                    ));
                }
                return Err(Error::NotSettled { waited: timeout, waiting: what.join("; ") });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Either task's error if it ended; a task that ended cleanly before `stop` is an
    /// error too (the inbox stops only when cancelled).
    async fn check_running(&mut self) -> Result<()> {
        for (name, slot) in [("relay", &mut self.relay), ("inbox", &mut self.inbox)] {
            if slot.as_ref().is_some_and(JoinHandle::is_finished) {
                let task = slot.take().expect("checked");
                return match task.await {
                    Ok(Err(e)) => Err(e),
                    Ok(Ok(())) => Err(Error::NotSettled {
                        waited: Duration::ZERO,
                        waiting: format!("the {name} stopped"),
                    }),
                    Err(panic) => Err(Error::NotSettled {
                        waited: Duration::ZERO,
                        waiting: format!("the {name} panicked: {panic}"),
                    }),
                };
            }
        }
        Ok(())
    }

    /// Events up to `watermark` not yet published or given up, the counts, and the
    /// partitions whose committed offset is behind their last published record.
    async fn progress(&self, watermark: i64) -> Result<(i64, Settled, Vec<(String, i32, i64, i64)>)> {
        let table = &self.outbox_table;
        let (waiting, published, failed): (i64, i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'published'), \
                    count(*) FILTER (WHERE status IN ('failed', 'discarded')) \
             FROM {table} WHERE id <= $1"
        )))
        .bind(watermark)
        .fetch_one(&self.pool)
        .await?;
        let last: Vec<(String, i32, i64, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT topic, kafka_partition, max(kafka_offset), count(*) FROM {table} \
             WHERE id <= $1 AND status = 'published' AND topic = ANY($2) AND kafka_offset >= 0 \
             GROUP BY 1, 2 ORDER BY 1, 2"
        )))
        .bind(watermark)
        .bind(&self.topics)
        .fetch_all(&self.pool)
        .await?;
        let mut settled = Settled { published: published as u64, failed: failed as u64, consumed: 0 };
        if waiting > 0 || last.is_empty() {
            return Ok((waiting, settled, Vec::new()));
        }
        let committed = self.committed(&last).await;
        let mut behind = Vec::new();
        for (topic, partition, offset, rows) in last {
            let done = committed.get(&(topic.clone(), partition)).copied().unwrap_or(-1);
            if done > offset {
                settled.consumed += rows as u64;
            } else {
                behind.push((topic, partition, done, offset));
            }
        }
        Ok((waiting, settled, behind))
    }

    /// The inbox's committed offsets (next offset to read) of the given partitions; a
    /// partition without one, or a failed request, is absent.
    async fn committed(&self, partitions: &[(String, i32, i64, i64)]) -> BTreeMap<(String, i32), i64> {
        let mut list = TopicPartitionList::new();
        for (topic, partition, ..) in partitions {
            list.add_partition(topic, *partition);
        }
        let consumer = self.offsets.clone();
        let fetched =
            tokio::task::spawn_blocking(move || consumer.committed_offsets(list, Duration::from_secs(5)))
                .await
                .ok()
                .and_then(Result::ok);
        let mut out = BTreeMap::new();
        for e in fetched.iter().flat_map(TopicPartitionList::elements) {
            if let Offset::Offset(o) = e.offset() {
                out.insert((e.topic().to_owned(), e.partition()), o);
            }
        }
        out
    }

    /// Stops the relay and the inbox and returns the first error either ended with.
    pub async fn stop(mut self) -> Result<()> {
        self.stop.cancel();
        let mut first = Ok(());
        for task in [self.relay.take(), self.inbox.take()].into_iter().flatten() {
            let result = match task.await {
                Ok(result) => result,
                Err(panic) => Err(Error::NotSettled {
                    waited: Duration::ZERO,
                    waiting: format!("a task panicked: {panic}"),
                }),
            };
            if first.is_ok() {
                first = result;
            }
        }
        first
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
