//! [`Outbox`]: one outbox table's configuration and the handle that appends to it.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::insert::InsertStatements;
use crate::table::Names;

/// Where the outbox table is and how appends behave.
///
/// ```
/// use outbox_runtime::OutboxConfig;
/// let config = OutboxConfig::default().schema("billing").max_record_bytes(256 * 1024);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxConfig {
    pub(crate) schema: String,
    pub(crate) table: String,
    pub(crate) work_partitions: u32,
    pub(crate) max_record_bytes: usize,
    pub(crate) notify: bool,
    pub(crate) lock_aggregates: bool,
    pub(crate) capacity: Option<Capacity>,
    pub(crate) refuse_non_critical_at: f64,
    pub(crate) capacity_check_interval: Duration,
}

/// How much the outbox may hold before it is full: the figure `status` and the
/// `outbox_capacity_seconds_to_full` metric forecast against, and that non-critical appends
/// are refused near (see [`OutboxConfig::capacity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capacity {
    /// Unpublished events (pending and failed): the backlog the relays have not cleared.
    Rows(u64),
    /// The outbox table's size on disk, with its indexes and TOAST (`pg_total_relation_size`).
    Bytes(u64),
}

impl Capacity {
    /// `rows` or `bytes`.
    pub fn unit(self) -> &'static str {
        match self {
            Capacity::Rows(_) => "rows",
            Capacity::Bytes(_) => "bytes",
        }
    }

    /// The limit, in [`Capacity::unit`]s.
    pub fn limit(self) -> u64 {
        match self {
            Capacity::Rows(n) | Capacity::Bytes(n) => n,
        }
    }
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            schema: "public".to_owned(),
            table: "outbox".to_owned(),
            work_partitions: 32,
            max_record_bytes: 1_000_000,
            notify: true,
            lock_aggregates: true,
            capacity: None,
            refuse_non_critical_at: 0.8,
            capacity_check_interval: Duration::from_secs(1),
        }
    }
}

impl OutboxConfig {
    /// The PostgreSQL schema of the outbox tables. Default: `public`.
    #[must_use]
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The outbox table's name; its lease and migration tables are named after it
    /// (`<table>_leases`, `<table>_migrations`). Default: `outbox`.
    #[must_use]
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Into how many work partitions aggregates are hashed. Relays lease whole work
    /// partitions, so this bounds how many relays can share the work. It is fixed when the
    /// migrations first run (changing it later makes the migrator refuse). Default: 32.
    #[must_use]
    pub fn work_partitions(mut self, n: u32) -> Self {
        self.work_partitions = n;
        self
    }

    /// The largest Kafka record (key, value and headers) an append accepts; a larger event
    /// fails the append, before the business transaction commits. Keep it at or below the
    /// broker's and the topic's `max.message.bytes`. Default: 1,000,000.
    #[must_use]
    pub fn max_record_bytes(mut self, bytes: usize) -> Self {
        self.max_record_bytes = bytes;
        self
    }

    /// Whether append sends `NOTIFY` (delivered at commit) so relays wake at once instead of
    /// at their next poll. Default: true.
    #[must_use]
    pub fn notify(mut self, notify: bool) -> Self {
        self.notify = notify;
        self
    }

    /// Whether append serialises the appends of one aggregate ([invariant 13](crate::guarantees#i13)): it takes a
    /// transaction-level advisory lock on each aggregate it appends to (a batch takes them
    /// in one fixed order), so a second transaction appending to the same aggregate waits
    /// until the first ends, and the aggregate's events get ids, and reach Kafka, in commit
    /// order. Without it, two transactions that append to one aggregate without locking a
    /// row of their own can commit in the other order and the relay publish the later event
    /// first. Turn it off only when every caller already locks the aggregate (e.g. `UPDATE`
    /// of its row before appending). Default: true.
    #[must_use]
    pub fn lock_aggregates(mut self, lock: bool) -> Self {
        self.lock_aggregates = lock;
        self
    }

    /// The outbox's capacity. With one, `status` and the metrics forecast the time until
    /// it is full, and appends of non-critical events
    /// ([`AppendOptions::critical`](crate::AppendOptions::critical)) are refused with
    /// [`Error::Backpressure`] once it is [`refuse_non_critical_at`](Self::refuse_non_critical_at)
    /// full. Critical events are never refused. `None` removes it. Default: none.
    #[must_use]
    pub fn capacity(mut self, capacity: impl Into<Option<Capacity>>) -> Self {
        self.capacity = capacity.into();
        self
    }

    /// The share of the capacity (0 to 1) from which non-critical appends are refused.
    /// Default: 0.8.
    #[must_use]
    pub fn refuse_non_critical_at(mut self, share: f64) -> Self {
        self.refuse_non_critical_at = share;
        self
    }

    /// How long a measured fill level is reused by non-critical appends before it is
    /// measured again (one query, on the appending connection). Default: 1 s.
    #[must_use]
    pub fn capacity_check_interval(mut self, interval: Duration) -> Self {
        self.capacity_check_interval = interval;
        self
    }

    /// See [`OutboxConfig::schema`].
    pub fn get_schema(&self) -> &str {
        &self.schema
    }
    /// See [`OutboxConfig::table`].
    pub fn get_table(&self) -> &str {
        &self.table
    }
    /// See [`OutboxConfig::work_partitions`].
    pub fn get_work_partitions(&self) -> u32 {
        self.work_partitions
    }
    /// See [`OutboxConfig::max_record_bytes`].
    pub fn get_max_record_bytes(&self) -> usize {
        self.max_record_bytes
    }
    /// See [`OutboxConfig::notify`].
    pub fn get_notify(&self) -> bool {
        self.notify
    }
    /// See [`OutboxConfig::lock_aggregates`].
    pub fn get_lock_aggregates(&self) -> bool {
        self.lock_aggregates
    }
    /// See [`OutboxConfig::capacity`].
    pub fn get_capacity(&self) -> Option<Capacity> {
        self.capacity
    }
    /// See [`OutboxConfig::refuse_non_critical_at`].
    pub fn get_refuse_non_critical_at(&self) -> f64 {
        self.refuse_non_critical_at
    }
    /// See [`OutboxConfig::capacity_check_interval`].
    pub fn get_capacity_check_interval(&self) -> Duration {
        self.capacity_check_interval
    }
}

/// A handle on one outbox table: append events, build its migrator. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Outbox {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) config: OutboxConfig,
    pub(crate) names: Names,
    /// The append statements.
    pub(crate) insert: InsertStatements,
    /// The last measured fill level, for non-critical appends.
    pub(crate) fill: Mutex<Option<(Instant, u64)>>,
    /// Migration 11's check of caller-given event ids was found (see `Outbox::insert`).
    pub(crate) check_ids_ready: std::sync::atomic::AtomicBool,
}

impl Outbox {
    /// Validates `config` (names are checked as identifiers) and prepares its statements.
    pub fn new(config: OutboxConfig) -> Result<Self> {
        let names = Names::new(&config.schema, &config.table)?;
        if !(1..=4096).contains(&config.work_partitions) {
            return Err(Error::Config(format!(
                "work_partitions must be between 1 and 4096, not {}",
                config.work_partitions
            )));
        }
        if config.max_record_bytes < 1024 {
            return Err(Error::Config(format!(
                "max_record_bytes must be at least 1024, not {}",
                config.max_record_bytes
            )));
        }
        if !(config.refuse_non_critical_at > 0.0 && config.refuse_non_critical_at <= 1.0) {
            return Err(Error::Config(format!(
                "refuse_non_critical_at must be a share above 0 and at most 1, not {}",
                config.refuse_non_critical_at
            )));
        }
        if config.capacity.is_some_and(|c| c.limit() == 0) {
            return Err(Error::Config("capacity must be above 0".to_owned()));
        }
        let insert = InsertStatements::new(&names, config.notify, config.lock_aggregates);
        Ok(Outbox {
            inner: Arc::new(Inner {
                config,
                names,
                insert,
                fill: Mutex::new(None),
                check_ids_ready: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// The outbox with [`OutboxConfig::default`]: table `public.outbox`.
    pub fn default_ref() -> &'static Outbox {
        static DEFAULT: OnceLock<Outbox> = OnceLock::new();
        DEFAULT.get_or_init(|| {
            // The default names are valid identifiers; this cannot fail.
            Outbox::new(OutboxConfig::default()).unwrap_or_else(|e| unreachable!("default config: {e}"))
        })
    }

    /// The configuration this outbox was built with.
    pub fn config(&self) -> &OutboxConfig {
        &self.inner.config
    }

    pub(crate) fn names(&self) -> &Names {
        &self.inner.names
    }
}
