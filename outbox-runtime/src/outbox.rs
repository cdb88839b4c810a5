//! [`Outbox`]: one outbox table's configuration and the handle that appends to it.

use std::sync::{Arc, OnceLock};

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::error::{Error, Result};
use crate::table::Names;

/// Where the outbox table is and how appends behave.
///
/// ```
/// use outbox_runtime::OutboxConfig;
/// let config = OutboxConfig::default().schema("billing").max_record_bytes(256 * 1024);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxConfig {
    pub(crate) schema: String,
    pub(crate) table: String,
    pub(crate) work_partitions: u32,
    pub(crate) max_record_bytes: usize,
    pub(crate) notify: bool,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            schema: "public".to_owned(),
            table: "outbox".to_owned(),
            work_partitions: 32,
            max_record_bytes: 1_000_000,
            notify: true,
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
    pub(crate) insert_sql: SqlStr,
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
        let insert_sql = AssertSqlSafe(crate::append::insert_sql(&names, config.notify)).into_sql_str();
        Ok(Outbox { inner: Arc::new(Inner { config, names, insert_sql }) })
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
