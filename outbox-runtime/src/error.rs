//! The crate's error type: one enum, transient and permanent failures told apart by variant.

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `outbox-runtime`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A schema, table or channel name is not a plain SQL identifier.
    #[error(
        "invalid {what} {value:?}: use 1 to 48 characters of a-z, 0-9 and _, starting with a letter or _"
    )]
    InvalidIdentifier {
        /// Which name.
        what: &'static str,
        /// The name given.
        value: String,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The event could not be serialized to JSON; nothing was appended.
    #[error("cannot serialize event {event_type}: {source}")]
    Serialize {
        /// The event's type.
        event_type: &'static str,
        /// What serde_json said.
        source: serde_json::Error,
    },
    /// The event's Kafka record would exceed the configured maximum; nothing was appended.
    #[error("event {event_type} of aggregate {aggregate_id} makes a {size}-byte record, over the maximum of {max} bytes")]
    RecordTooLarge {
        /// The event's type.
        event_type: &'static str,
        /// The aggregate it belongs to.
        aggregate_id: String,
        /// Key, value and headers, in bytes.
        size: usize,
        /// The configured maximum.
        max: usize,
    },
    /// An extra header uses a name the outbox sets itself.
    #[error("header {0:?} is reserved: the outbox sets ce_*, content-type and schema id (__value_schema_id, __key_schema_id) headers itself")]
    ReservedHeader(String),
    /// The outbox is nearly full and the event is not critical: it was not appended (nor
    /// was anything else of the same `append_batch`). The caller's transaction is intact.
    #[error(
        "outbox is {percent:.0}% full ({used} of {limit} {unit}): non-critical event {event_type} refused, not appended"
    )]
    Backpressure {
        /// The refused event's type.
        event_type: &'static str,
        /// The fill level measured, in `unit`s.
        used: u64,
        /// The configured capacity.
        limit: u64,
        /// `rows` or `bytes`.
        unit: &'static str,
        /// `used` as a percentage of `limit`.
        percent: f64,
    },
    /// What an operator asked for conflicts with the current state (a parked message held
    /// behind an earlier one of its key, say): nothing was changed. Retrying the same
    /// request fails the same way until the state changes.
    #[error("{0}")]
    Conflict(String),
    /// The Prometheus exporter could not start (its address is taken, say, or a global
    /// recorder is already installed).
    #[cfg(feature = "prometheus")]
    #[error("cannot serve metrics on {address}: {source}")]
    Metrics {
        /// The address asked for.
        address: std::net::SocketAddr,
        /// What the exporter said.
        source: metrics_exporter_prometheus::BuildError,
    },
    /// What an operator asked for does not exist (no such parked message, for instance).
    #[error("{0}")]
    NotFound(String),
    /// The inbox consumer stopped for good: a record could not be given any outcome, a
    /// worker panicked, or the Kafka consumer failed in a way it cannot recover from.
    #[error("inbox stopped: {0}")]
    Inbox(String),
    /// An append on a connection that is not inside a transaction (autocommit): the event
    /// would be committed at once, whatever became of the business change.
    #[error("append outside a transaction: append on the business change's transaction (`let mut tx = pool.begin().await?; outbox.append(&mut tx, &event)`), so that both commit or neither does; nothing was appended")]
    NotInTransaction,
    /// The outbox's table does not exist: its migrations have not run on this database.
    #[error("table {table} does not exist: run the outbox's migrations first (`outbox.migrator().run(&pool)`, or `outbox migrate`)")]
    NotMigrated {
        /// The table, as `"schema"."table"`.
        table: String,
    },
    /// The outbox's tables predate this library: a migration it needs has not run (a newer
    /// version deployed before `outbox migrate`).
    #[error("table {table} predates this version of the library ({missing}): run the outbox's migrations first (`outbox.migrator().run(&pool)`, or `outbox migrate`)")]
    MigrationsBehind {
        /// The table, as `"schema"."table"`.
        table: String,
        /// What is missing.
        missing: String,
    },
    /// An inbox's table does not exist: its migrations have not run on this database. They
    /// are the consumer's: its own binary creates them with `inbox.migrator()`.
    #[error("table {table} does not exist: the inbox's migrations have not run on this database; the consumer's own binary creates its tables with `inbox.migrator().run(&pool)`")]
    InboxNotMigrated {
        /// The table, as `"schema"."table"`.
        table: String,
    },
    /// [`Harness::settle`](crate::testing::Harness::settle) gave up, or the relay or
    /// inbox it runs stopped.
    #[cfg(feature = "testing")]
    #[error("not settled after {waited:?}: {waiting}")]
    NotSettled {
        /// How long it waited.
        waited: std::time::Duration,
        /// What was still waiting.
        waiting: String,
    },
    /// A PostgreSQL error.
    #[cfg(feature = "runtime")]
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// Running the migrations failed.
    #[cfg(feature = "runtime")]
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A Kafka client error (creating the producer, for instance).
    #[cfg(feature = "runtime")]
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The change-data-capture relay's replication stream failed or stopped: the slot was
    /// lost or dropped, taken by another process past the wait, or it sent what the relay
    /// cannot read. The message names the slot and what to do.
    #[cfg(feature = "cdc")]
    #[error("replication: {0}")]
    Replication(String),
}

impl Error {
    /// A client-creation error as this crate reports it: librdkafka refusing a setting is a
    /// bad setting, [`Error::Config`] naming it (`setter` is the method that set it, e.g.
    /// `RelayConfig::kafka_setting`), with a secret's value left out; anything else stays
    /// [`Error::Kafka`].
    #[cfg(feature = "runtime")]
    pub(crate) fn kafka_client(setter: &str, error: rdkafka::error::KafkaError) -> Error {
        match error {
            rdkafka::error::KafkaError::ClientConfig(_, description, key, value) => {
                let shown = if crate::secrets::is_secret(&key) {
                    "(redacted)".into()
                } else {
                    format!("{:?}", crate::secrets::redact_urls(&value))
                };
                let description = crate::secrets::redact_urls(&description);
                Error::Config(format!("{setter} {key} = {shown} is refused by librdkafka: {description}"))
            }
            other => Error::Kafka(other),
        }
    }

    /// Whether retrying the same operation later may succeed (a lost connection, a busy
    /// database) as opposed to an error that repeats until something is changed.
    pub fn is_transient(&self) -> bool {
        match self {
            #[cfg(feature = "runtime")]
            Error::Database(e) => {
                matches!(
                    e,
                    sqlx::Error::Io(_)
                        | sqlx::Error::PoolTimedOut
                        | sqlx::Error::PoolClosed
                        | sqlx::Error::WorkerCrashed
                        | sqlx::Error::Protocol(_)
                ) || e.as_database_error().and_then(|d| d.code()).is_some_and(|code| {
                    // serialization_failure, deadlock_detected, admin shutdown, cannot connect now,
                    // too many connections, lock_not_available
                    matches!(code.as_ref(), "40001" | "40P01" | "57P01" | "57P03" | "53300" | "55P03")
                })
            }
            #[cfg(feature = "runtime")]
            Error::Kafka(e) => crate::kafka_codes::is_transient(e),
            Error::Backpressure { .. } => true,
            _ => false,
        }
    }
}

/// SQLSTATE classes that mean the server is gone or going: 08 connection exception, 57P
/// (57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now, 57P04-05).
#[cfg(feature = "runtime")]
pub(crate) fn server_gone_code(code: &str) -> bool {
    code.starts_with("08") || code.starts_with("57P")
}

/// Whether a database error says the server is gone or on its way out: the connection is
/// lost (I/O, TLS, a closed pool, a crashed worker) or the server answered with a
/// [`server_gone_code`]. A busy pool (`PoolTimedOut`) is not: the server answers others.
#[cfg(feature = "runtime")]
pub(crate) fn server_gone(error: &sqlx::Error) -> bool {
    matches!(
        error,
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed
    ) || error.as_database_error().and_then(|d| d.code()).is_some_and(|c| server_gone_code(&c))
}

/// Whether the server said that it is shutting down or not taking connections (SQLSTATE
/// 57P01 to 57P03): a fast shutdown in progress terminates sessions and refuses new ones.
#[cfg(feature = "cdc")]
pub(crate) fn server_stopping(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| matches!(c.as_ref(), "57P01" | "57P02" | "57P03"))
}
