//! The relay: publishes outbox rows to Kafka at least once, in order per aggregate.
//!
//! Each relay leases work partitions (aggregates hash into them), reads due rows of its
//! partitions in a short query, publishes them outside any transaction, then marks them,
//! fenced by its lease tokens. An aggregate's events to one topic are handed to the
//! idempotent, gapless producer together and judged in order: the broker persists a
//! partition's records in sequence, and an error that would skip one fails every later one,
//! so no event is acknowledged before an earlier event of its aggregate (an event to another
//! topic waits for the acknowledgements before it). Transient errors back off exponentially with jitter;
//! permanent ones mark the event `failed`, which holds back that aggregate's later events
//! and nothing else. Many relays may run against one database: they share the partitions
//! and take over those of a relay that died when its leases expire.
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool) -> outbox_runtime::Result<()> {
//! use outbox_runtime::relay::{Relay, RelayConfig};
//! use tokio_util::sync::CancellationToken;
//!
//! let outbox = outbox_runtime::Outbox::default_ref().clone();
//! let relay = Relay::new(pool, outbox, RelayConfig::new("127.0.0.1:9092"))?;
//! let shutdown = CancellationToken::new();
//! relay.run(shutdown.clone()).await?; // returns after shutdown.cancel(), once in-flight work is done
//! # Ok(()) }
//! ```

pub(crate) mod batch;
#[cfg(feature = "bench-hooks")]
#[doc(hidden)]
pub mod bench;
pub(crate) mod claim;
mod config;
mod cursor;
pub(crate) mod flight;
mod hold;
mod lease;
mod listen;
pub(crate) mod mark;
pub(crate) mod plan;
pub(crate) mod publish;
mod run;
pub(crate) mod topics;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rdkafka::producer::FutureProducer;
use sqlx::PgPool;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use self::claim::Statements;
use self::lease::Leases;
use self::topics::{SharedClock, Topics};
use crate::error::Result;
use crate::outbox::Outbox;

pub use self::config::{ClaimMode, RelayConfig};
pub use crate::cleanup::Cleanup;

/// Counters of one relay, readable while it runs.
#[derive(Debug, Default)]
pub struct RelayStats {
    pub(crate) published: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) fenced: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) order_gaps: AtomicU64,
    pub(crate) in_flight: flight::Counts,
}

impl RelayStats {
    /// Events acknowledged by Kafka and marked published.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }
    /// Transient failures scheduled for retry.
    pub fn retried(&self) -> u64 {
        self.retried.load(Ordering::Relaxed)
    }
    /// Events marked `failed`.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
    /// Marks refused because the lease had passed to another relay.
    pub fn fenced(&self) -> u64 {
        self.fenced.load(Ordering::Relaxed)
    }
    /// Batches processed.
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }
    /// Events the broker acknowledged after an earlier event of their aggregate failed, or
    /// out of partition order (`outbox_relay_order_gaps_total`). Never expected: any is a
    /// bug or a broker that does not keep the idempotent producer's sequence.
    pub fn order_gaps(&self) -> u64 {
        self.order_gaps.load(Ordering::Relaxed)
    }
    /// Events claimed (or, for the change-data-capture relay, streamed) and not yet
    /// recorded: being sent, waiting in memory for a retry, or sent and being marked.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.by_topic().values().sum()
    }
    /// [`in_flight`](Self::in_flight) per topic, topics with none left out.
    pub fn in_flight_by_topic(&self) -> std::collections::BTreeMap<String, u64> {
        self.in_flight.by_topic()
    }
}

/// A relay process's worker. See the [module documentation](self).
pub struct Relay {
    pool: PgPool,
    outbox: Outbox,
    config: RelayConfig,
    producer: FutureProducer,
    leases: Leases,
    sql: Arc<Statements>,
    /// The ids of the last batch while its mark is written in the background, and the task.
    marking: Option<(Vec<i64>, tokio::task::JoinHandle<()>)>,
    /// Marks that failed in a row (a read-only database after a failover, say): the relay
    /// backs off before claiming again instead of republishing the same batch in a loop.
    mark_failures: Arc<AtomicU32>,
    /// When the last transient publish failure was logged at warn, and how many were
    /// logged at debug since.
    transient_warned: Option<Instant>,
    transient_suppressed: u64,
    /// Which topics exist, as the cluster's metadata last said.
    topics: Topics,
    stats: Arc<RelayStats>,
    /// The relay's background tasks (listener, cleanup, gauges, marks), waited for at
    /// shutdown.
    tasks: TaskTracker,
    /// Whether appends' NOTIFY wakes it (not for the change-data-capture relay's table
    /// path, which the stream's appends do not concern).
    listen: bool,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").field("id", &self.id()).field("config", &self.config).finish_non_exhaustive()
    }
}

impl Relay {
    /// Builds a relay on `pool` for `outbox`. It uses up to five of the pool's
    /// connections: one to listen for NOTIFY, two for its work (a batch's claim while the
    /// last batch's mark is written), one for cleanup and one for its gauges.
    pub fn new(pool: PgPool, outbox: Outbox, config: RelayConfig) -> Result<Self> {
        config.validate()?;
        let producer = publish::producer(&config.brokers, &config.producer)?;
        let names = outbox.names();
        let leases = Leases::new(names, Uuid::new_v4(), config.lease_ttl);
        let sql = Arc::new(Statements::new(names));
        let topics = Topics::new(config.missing_topic_timeout, Some(SharedClock::new(pool.clone(), names)));
        Ok(Relay {
            pool,
            outbox,
            config,
            producer,
            leases,
            sql,
            marking: None,
            mark_failures: Arc::default(),
            transient_warned: None,
            transient_suppressed: 0,
            topics,
            stats: Arc::default(),
            tasks: TaskTracker::new(),
            listen: true,
        })
    }

    /// This relay as the change-data-capture relay's table path: it publishes only the
    /// pending events the stream handed over or that an operator put up again (those with a
    /// `next_attempt_at`), polls instead of listening, and counts into `stats`.
    #[cfg(feature = "cdc")]
    pub(crate) fn table_path(mut self, stats: Arc<RelayStats>) -> Self {
        self.sql = Arc::new(Statements::table_path(self.outbox.names()));
        // Leases, whatever the configuration says: the table path is not where a
        // transaction should hold locks across a send.
        self.config.claim_mode = ClaimMode::Lease;
        self.listen = false;
        self.stats = stats;
        self
    }

    /// The pool it works on.
    #[cfg(feature = "testing")]
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// How long its cleanup keeps published rows (`None`: no cleanup).
    #[cfg(feature = "testing")]
    pub(crate) fn cleanup_retention(&self) -> Option<std::time::Duration> {
        self.config.cleanup.as_ref().map(crate::relay::Cleanup::get_retention)
    }

    /// The outbox it relays.
    #[cfg(feature = "testing")]
    pub(crate) fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// This relay's counters.
    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// This relay's id (its lease owner id).
    pub fn id(&self) -> Uuid {
        self.leases.relay_id()
    }
}

#[cfg(test)]
mod cursor_tests;
#[cfg(test)]
mod partition_tests;
#[cfg(test)]
mod tests;
