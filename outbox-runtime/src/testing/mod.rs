//! Testing a service that uses the outbox (feature `testing`): an embedded Kafka broker,
//! and a harness that runs a relay and inboxes until everything appended so far has been
//! applied ("publish, then wait until applied"), and fails, naming the event, when
//! something was parked, failed or went where nobody reads.
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
//! // Every event appended so far is published and applied (or ignored on purpose); a
//! // parked record, a failed event or a topic nobody reads is an error naming the event.
//! let settled = harness.settle().await?;
//! assert_eq!(settled.applied, settled.published);
//! harness.stop().await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

use crate::{Error, Result};

mod harness;
mod judge;
mod watched;

pub use self::harness::{Harness, HarnessBuilder, Settled};

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
