//! The change-data-capture relay: publishes the outbox's inserts as PostgreSQL's logical
//! replication streams them (`pgoutput`), instead of polling the table.
//!
//! **The stream.** One relay process reads the slot; others started against the same slot
//! wait and take over when it dies (PostgreSQL refuses a second reader of an active slot).
//! Each inserted event is sent with the same record as the polling relay's (key, value,
//! headers, partitioner), an aggregate's events in commit order. The slot's confirmed
//! position moves only to the end of a commit whose every event, and every earlier
//! commit's, is acknowledged by Kafka (acks=all) and marked `published` in the table,
//! or recorded as failed or handed to the table path: a crash at any point sends again,
//! never skips ([invariant 15](crate::guarantees#i15)). A transient failure (the broker
//! down) is retried in memory with backoff while the confirmed position waits; what the
//! relay holds in memory is bounded ([`CdcConfig::max_buffered_bytes`]).
//!
//! **The table stays the source of truth.** Each published event is marked `published`
//! (in batches, off the path of the stream), so `outbox status`, `failed`, `retry`,
//! `replay`, reconcile, gauges and cleanup work as with the polling relay. Events the
//! stream does not publish go to the **table path**, a polling relay limited to events
//! with a `next_attempt_at` that runs beside the stream: an event whose aggregate has an
//! earlier failed or waiting event (handed over, so that order holds), and events an
//! operator put up again (`retry`, `replay`), which the stream, carrying inserts only,
//! never sees. A permanent error marks the event `failed` and holds back its aggregate's
//! later events, released by `retry` or `discard` as with the polling relay.
//!
//! **The slot is the operator's.** [`CdcConfig::setup`] (`outbox cdc setup`) creates the
//! publication and the slot; the relay refuses to start without them or without
//! `wal_level = logical` ([`Error::Config`]), and stops with [`Error::Replication`] when
//! the slot is dropped or lost (`max_slot_wal_keep_size`), never creating one itself.
//! Recovery from a lost slot is a backfill from the table: the polling relay
//! (`outbox relay --backfill`) publishes every event without a published mark.
//!
//! Do not run the polling relay and this one on one outbox at the same time: both would
//! publish the fresh events (duplicates, and the order across the two is not kept).
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool) -> outbox_runtime::Result<()> {
//! use outbox_runtime::cdc::{CdcConfig, CdcRelay};
//! use outbox_runtime::relay::RelayConfig;
//!
//! let outbox = outbox_runtime::Outbox::default_ref().clone();
//! let cdc = CdcConfig::new("postgres://postgres@127.0.0.1:5432/test");
//! cdc.setup(&pool, &outbox).await?; // once per database, or `outbox cdc setup`
//! let relay = CdcRelay::new(pool, outbox, RelayConfig::new("127.0.0.1:9092"), cdc)?;
//! relay.run(outbox_runtime::CancellationToken::new()).await?;
//! # Ok(()) }
//! ```

mod decode;
mod gauges;
mod marks;
mod progress;
mod publisher;
mod run;
mod setup;
mod stream;

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::error::{Error, Result};
use crate::outbox::Outbox;
use crate::relay::{RelayConfig, RelayStats};
use crate::secrets::redact_urls;

pub use self::setup::{SetupReport, SlotStatus};

/// A log filter directive for the replication client's own error log: it logs every
/// session that ends, at error level (a standby's refused attempt, every
/// [`CdcConfig::takeover_interval`]), and the relay logs the same errors itself with what
/// they mean. Add it to a `tracing_subscriber::EnvFilter` to see each once; the `outbox`
/// command and the example relay do.
pub const QUIET_CLIENT_LOG: &str = "pgwire_replication::client::tokio_client=off";

/// The default name of the slot and of the publication.
pub const DEFAULT_SLOT: &str = "outbox_cdc";

/// Where and how the change-data-capture relay streams. See the [module documentation](self).
#[derive(Clone)]
pub struct CdcConfig {
    pub(crate) url: String,
    pub(crate) slot: String,
    pub(crate) publication: String,
    pub(crate) max_buffered_bytes: usize,
    pub(crate) takeover_interval: Duration,
    pub(crate) status_interval: Duration,
    pub(crate) connect_timeout: Duration,
}

impl std::fmt::Debug for CdcConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CdcConfig")
            .field("url", &redact_urls(&self.url))
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .field("max_buffered_bytes", &self.max_buffered_bytes)
            .field("takeover_interval", &self.takeover_interval)
            .field("status_interval", &self.status_interval)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl CdcConfig {
    /// Streams over a replication connection to the database at `url`
    /// (`postgres://user:password@host:port/database`, `sslmode` as a query parameter),
    /// from slot and publication [`DEFAULT_SLOT`]. The role needs the `REPLICATION`
    /// attribute (or to be a superuser).
    pub fn new(url: impl Into<String>) -> Self {
        CdcConfig {
            url: url.into(),
            slot: DEFAULT_SLOT.to_owned(),
            publication: DEFAULT_SLOT.to_owned(),
            max_buffered_bytes: 64 << 20,
            takeover_interval: Duration::from_secs(2),
            status_interval: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(10),
        }
    }

    /// The replication slot's name. Default: [`DEFAULT_SLOT`].
    #[must_use]
    pub fn slot(mut self, name: impl Into<String>) -> Self {
        self.slot = name.into();
        self
    }

    /// The publication's name. Default: [`DEFAULT_SLOT`].
    #[must_use]
    pub fn publication(mut self, name: impl Into<String>) -> Self {
        self.publication = name.into();
        self
    }

    /// Most payload and header bytes of streamed events held in memory (sent and not yet
    /// done, or waiting for a retry); past it the relay stops reading the stream until
    /// some are done (an event larger than this is read alone). Default: 64 MiB.
    #[must_use]
    pub fn max_buffered_bytes(mut self, bytes: usize) -> Self {
        self.max_buffered_bytes = bytes;
        self
    }

    /// How often a standby relay tries to take the slot over. Default: 2 s.
    #[must_use]
    pub fn takeover_interval(mut self, interval: Duration) -> Self {
        self.takeover_interval = interval;
        self
    }

    /// How often the confirmed position is reported to the server. Default: 1 s.
    #[must_use]
    pub fn status_interval(mut self, interval: Duration) -> Self {
        self.status_interval = interval;
        self
    }

    /// See [`CdcConfig::slot`].
    pub fn get_slot(&self) -> &str {
        &self.slot
    }
    /// See [`CdcConfig::publication`].
    pub fn get_publication(&self) -> &str {
        &self.publication
    }
    /// See [`CdcConfig::max_buffered_bytes`].
    pub fn get_max_buffered_bytes(&self) -> usize {
        self.max_buffered_bytes
    }
    /// See [`CdcConfig::takeover_interval`].
    pub fn get_takeover_interval(&self) -> Duration {
        self.takeover_interval
    }
    /// See [`CdcConfig::status_interval`].
    pub fn get_status_interval(&self) -> Duration {
        self.status_interval
    }

    /// Refuses settings that cannot work, naming them.
    pub(crate) fn validate(&self) -> Result<()> {
        crate::table::validate_identifier("replication slot name", &self.slot)?;
        crate::table::validate_identifier("publication name", &self.publication)?;
        for (name, value) in [
            ("CdcConfig::takeover_interval", self.takeover_interval),
            ("CdcConfig::status_interval", self.status_interval),
        ] {
            if value.is_zero() {
                return Err(Error::Config(format!("{name} must be above zero")));
            }
        }
        if self.max_buffered_bytes == 0 {
            return Err(Error::Config("CdcConfig::max_buffered_bytes must be above zero".to_owned()));
        }
        stream::connection(self)?;
        Ok(())
    }
}

/// The change-data-capture relay. See the [module documentation](self).
pub struct CdcRelay {
    pool: PgPool,
    outbox: Outbox,
    config: RelayConfig,
    cdc: CdcConfig,
    stats: Arc<RelayStats>,
}

impl std::fmt::Debug for CdcRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CdcRelay")
            .field("config", &self.config)
            .field("cdc", &self.cdc)
            .finish_non_exhaustive()
    }
}

impl CdcRelay {
    /// A relay streaming `outbox`'s inserts as `cdc` says, publishing with `config` (its
    /// producer settings, timeouts, backoff, cleanup). `pool` serves the marks and the
    /// table path.
    ///
    /// # Errors
    /// [`Error::Config`] naming a setting that cannot work.
    pub fn new(pool: PgPool, outbox: Outbox, config: RelayConfig, cdc: CdcConfig) -> Result<Self> {
        config.validate()?;
        cdc.validate()?;
        Ok(CdcRelay { pool, outbox, config, cdc, stats: Arc::default() })
    }

    /// Counters of the stream and the table path together.
    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }
}
