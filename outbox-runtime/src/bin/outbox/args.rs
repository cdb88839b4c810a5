//! The command line: its commands, flags and their defaults (the library's, read from
//! it), and durations as operators type them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use outbox_runtime::inbox::InboxConfig;
use outbox_runtime::relay::{Cleanup, RelayConfig};
use outbox_runtime::OutboxConfig;
use uuid::Uuid;

pub(crate) use crate::act::ActionArgs;

#[derive(Parser)]
#[command(
    name = "outbox",
    version,
    about = "Operate a transactional outbox: migrate, relay, status, failed and retrying events, retry, discard, replay, purge, reconcile, inbox",
    after_help = "Exit codes: 0 done; 1 nothing matched, or reconcile found differences; 2 bad arguments or settings (a schema registry URL, a committed schema the registry does not hold); 3 database, broker, schema registry or metrics listener failure; 4 conflicts with the current state (release the earlier message first)."
)]
pub(crate) struct Cli {
    /// PostgreSQL holding the outbox (required by every command but `broker`: there is no
    /// default database). Its value is never printed, in `--help` neither.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub(crate) database_url: Option<String>,
    /// Schema of the outbox tables.
    #[arg(long, default_value_t = OutboxConfig::default().get_schema().to_owned(), global = true)]
    pub(crate) schema: String,
    /// Outbox table name.
    #[arg(long, default_value_t = OutboxConfig::default().get_table().to_owned(), global = true)]
    pub(crate) table: String,
    /// Capacity in unpublished events, for the forecast in `status` and the relay's metrics.
    #[arg(long, global = true, conflicts_with = "capacity_bytes")]
    pub(crate) capacity_rows: Option<u64>,
    /// Capacity in bytes of the outbox table, for the forecast.
    #[arg(long, global = true)]
    pub(crate) capacity_bytes: Option<u64>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Creates or upgrades the outbox tables.
    Migrate,
    /// Publishes the outbox to Kafka until SIGTERM or Ctrl-C.
    Relay(RelayArgs),
    /// Backlog, failed events, the age of the oldest unpublished event, rates, table size
    /// and the capacity forecast.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Window the rates are measured over (e.g. 300s, 5m, 1h).
        #[arg(long, default_value = "5m", value_parser = parse_duration)]
        window: Duration,
    },
    /// Failed events.
    #[command(subcommand)]
    Failed(FailedCommand),
    /// Pending events waiting for a retry after a failed attempt, with attempts, next
    /// attempt and last error (never their payloads), oldest first.
    Retrying {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Show at most this many (the total is always given).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Puts failed events back up for publication.
    Retry {
        #[command(flatten)]
        target: RetryArgs,
        /// Who acts, recorded in the audit table. Default: $USER, else "unknown".
        #[arg(long)]
        actor: Option<String>,
    },
    /// Discards an event for good; the events of its aggregate behind it flow again.
    Discard {
        /// The event to discard.
        event_id: Uuid,
        /// Why (kept with the event).
        #[arg(long)]
        reason: String,
        /// Confirms the discard.
        #[arg(long)]
        yes: bool,
        /// Who acts, recorded in the audit table. Default: $USER, else "unknown".
        #[arg(long)]
        actor: Option<String>,
    },
    /// Publishes published events again, with their original event ids (consumers absorb
    /// what they already applied).
    Replay(ReplayArgs),
    /// Deletes published and discarded events older than a duration, in batches; never
    /// pending or failed ones.
    Purge {
        /// Age from which published (by publication time) and discarded (by creation
        /// time) events are deleted (e.g. 7d, 12h).
        #[arg(long, value_parser = parse_duration)]
        older_than: Duration,
        /// Rows per transaction.
        #[arg(long, default_value_t = Cleanup::default().get_batch_size())]
        batch_size: u32,
    },
    /// Converts the outbox table into partitions by id range, online: the table becomes
    /// the legacy partition as it is; only the last step locks it, for a moment. With
    /// --maintain, runs one maintenance round of a partitioned outbox instead (what relays
    /// do at their cleanup interval) and prints what it did.
    Partition {
        /// One maintenance round: create partitions ahead, move appends on, and with
        /// --retention drop the partitions whose events are all done and past it.
        #[arg(long)]
        maintain: bool,
        /// With --maintain: drop done partitions whose newest event is older (e.g. 7d).
        #[arg(long, value_parser = parse_duration, requires = "maintain")]
        retention: Option<Duration>,
    },
    /// Builds the indexes the console's and the library's lists by aggregate id, event type
    /// and the retrying and discarded states need, without blocking appends (CREATE INDEX
    /// CONCURRENTLY, per partition); with --inbox-table, the inbox's too (its records by
    /// aggregate id and event type). Idempotent: says what it built.
    BrowseIndexes {
        /// Also the indexes of this inbox table (its dedup table).
        #[arg(long, value_name = "TABLE")]
        inbox_table: Option<String>,
        /// The inbox table's schema.
        #[arg(long, default_value = "public", requires = "inbox_table")]
        inbox_schema: String,
    },
    /// Counts events per type and hour: appended, published and, given the consumer's
    /// inbox, applied. Exits 1 when any differ.
    Reconcile(ReconcileArgs),
    /// A consumer's parked messages: list, retry, discard.
    Inbox(InboxArgs),
    /// The change-data-capture relay's replication slot and publication.
    #[command(subcommand)]
    Cdc(crate::cdc::CdcCommand),
    /// Runs a development Kafka broker in this process (librdkafka's mock cluster: in
    /// memory, at most 5 MB per partition, gone when it stops) until SIGTERM or Ctrl-C;
    /// needs no database.
    Broker(crate::broker::BrokerArgs),
    /// Serves the operator console in the browser (127.0.0.1:8089 by default) until
    /// SIGTERM or Ctrl-C.
    Console(crate::console::ConsoleArgs),
}

/// `KEY=VALUE` of `--kafka-setting` (the value may hold `=`).
fn parse_setting(setting: &str) -> Result<(String, String), String> {
    match setting.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => Ok((key.trim().to_owned(), value.to_owned())),
        _ => Err("expected KEY=VALUE, a librdkafka setting (e.g. allow.auto.create.topics=false)".to_owned()),
    }
}

#[derive(Args)]
pub(crate) struct RelayArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS")]
    pub(crate) brokers: String,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:9187).
    #[arg(long)]
    pub(crate) metrics_addr: Option<SocketAddr>,
    /// Rows per batch. The default is the library's (`RelayConfig::batch_size`).
    #[arg(long, default_value_t = RelayConfig::new("").get_batch_size())]
    pub(crate) batch_size: u32,
    /// Poll interval when no NOTIFY arrives (e.g. 1s). The default is the library's.
    #[arg(long, default_value_t = Dur(RelayConfig::new("").get_poll_interval()), value_parser = parse_dur)]
    pub(crate) poll_interval: Dur,
    /// Delete published rows older than this (e.g. 7d). The default is the library's
    /// (`Cleanup::default`).
    #[arg(long, default_value_t = Dur(Cleanup::default().get_retention()), value_parser = parse_dur)]
    pub(crate) cleanup_after: Dur,
    /// The CloudEvents `source` of the records (name the service, e.g. /order-service).
    #[arg(long, default_value_t = RelayConfig::new("").get_source().to_owned())]
    pub(crate) source: String,
    /// The base of the records' `dataschema` (the committed schemas' `$id` base).
    #[arg(long, default_value_t = RelayConfig::new("").get_dataschema_base().to_owned())]
    pub(crate) dataschema_base: String,
    /// Do not delete published rows (overrides --cleanup-after).
    #[arg(long)]
    pub(crate) no_cleanup: bool,
    /// How long an event waits for its topic to exist before it is marked failed. The
    /// default is the library's.
    #[arg(long, default_value_t = Dur(RelayConfig::new("").get_missing_topic_timeout()), value_parser = parse_dur)]
    pub(crate) missing_topic_timeout: Dur,
    /// A librdkafka producer setting, KEY=VALUE, repeatable (`RelayConfig::kafka_setting`):
    /// security (security.protocol=SASL_SSL, sasl.*, ssl.*), client.id, linger.ms, or
    /// allow.auto.create.topics=false so that a broker which creates topics on first use
    /// (`outbox broker`) does not. Settings that would break a guarantee are refused.
    #[arg(long = "kafka-setting", value_name = "KEY=VALUE", value_parser = parse_setting)]
    pub(crate) kafka_settings: Vec<(String, String)>,
    /// Stream the outbox's inserts from a logical replication slot (`outbox cdc setup`
    /// first) instead of polling the table. The database URL is also the replication
    /// connection's; its role needs the REPLICATION attribute.
    #[arg(long, conflicts_with_all = ["backfill", "hold_locks"])]
    pub(crate) cdc: bool,
    /// Hold each batch's transaction, and its partitions' and rows' locks, until the broker
    /// answers, instead of leasing partitions (`ClaimMode::HoldLocks`: no leases to renew,
    /// a connection and the locks held while the broker is slow).
    #[arg(long)]
    pub(crate) hold_locks: bool,
    /// Poll the table until every pending event is published, then stop: the recovery
    /// after a replication slot is lost or dropped. Do not stream meanwhile.
    #[arg(long)]
    pub(crate) backfill: bool,
    #[command(flatten)]
    pub(crate) slot: crate::cdc::SlotArgs,
    #[command(flatten)]
    pub(crate) schema_ids: SchemaIdArgs,
}

/// Framing records in a schema registry's wire format (`RelayConfig::schema_ids`).
#[derive(Args)]
pub(crate) struct SchemaIdArgs {
    /// Frame each record with its schema's id in this registry (Confluent's REST API),
    /// for consumers that read with a registry's deserializers. Every committed schema
    /// (--schemas) is looked up once, at start (register them with `cargo xtask schema
    /// push`); credentials from OUTBOX_SCHEMA_REGISTRY_USER and _PASSWORD.
    #[arg(long = "schema-registry", value_name = "URL")]
    pub(crate) registry: Option<String>,
    /// Where the id goes: `prefix` (magic byte 0 and the id before the payload) or
    /// `header` (the `__value_schema_id` header: the schema's GUID, or its id).
    #[arg(long, default_value = "prefix", value_name = "prefix|header", requires = "registry")]
    pub(crate) schema_id_form: outbox_runtime::schema_registry::SchemaIdForm,
    /// The committed schemas (`<event_type>/v<N>.json`).
    #[arg(long, default_value = "schemas", value_name = "DIR", requires = "registry")]
    pub(crate) schemas: PathBuf,
    /// The subject of each schema, as `cargo xtask schema push --subject` names it.
    #[arg(long, default_value = outbox_runtime::schema_registry::TOPIC_RECORD_SUBJECT, requires = "registry")]
    pub(crate) schema_subject: String,
}

#[derive(Subcommand)]
pub(crate) enum FailedCommand {
    /// Lists failed events with their reasons (never their payloads).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Puts failed events back up for publication: one by id, or every one a filter
    /// matches (counted first; --yes to act).
    Retry {
        /// One failed event.
        event_id: Option<Uuid>,
        #[command(flatten)]
        action: ActionArgs,
    },
    /// Discards failed events for good: one by id, or every one a filter matches (counted
    /// first; --yes to act). The events of their aggregates behind them flow again.
    Discard {
        /// One failed event.
        event_id: Option<Uuid>,
        /// Why (kept with each event).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        action: ActionArgs,
    },
}

#[derive(Args)]
#[group(required = true, multiple = false)]
pub(crate) struct RetryArgs {
    /// One failed event.
    pub(crate) event_id: Option<Uuid>,
    /// Every failed event of this aggregate id.
    #[arg(long)]
    pub(crate) aggregate: Option<String>,
    /// Every failed event.
    #[arg(long)]
    pub(crate) all_failed: bool,
}

#[derive(Args)]
pub(crate) struct ReplayArgs {
    #[command(flatten)]
    pub(crate) filter: ReplayFilterArgs,
    /// Count what would be replayed; change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Who replays, recorded in the audit table. Default: $USER, else "unknown".
    #[arg(long)]
    pub(crate) actor: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
#[group(required = true, multiple = true)]
pub(crate) struct ReplayFilterArgs {
    /// Only this event type.
    #[arg(long)]
    pub(crate) event_type: Option<String>,
    /// Only this aggregate id.
    #[arg(long)]
    pub(crate) aggregate: Option<String>,
    /// Created at or after (a PostgreSQL timestamp, e.g. 2026-11-30T10:00:00Z).
    #[arg(long)]
    pub(crate) since: Option<String>,
    /// Created before.
    #[arg(long)]
    pub(crate) until: Option<String>,
    /// Only this event (its event id).
    #[arg(long)]
    pub(crate) event_id: Option<uuid::Uuid>,
}

#[derive(Args)]
pub(crate) struct ReconcileArgs {
    /// Created at or after (a PostgreSQL timestamp, e.g. 2026-11-30T10:00:00Z).
    #[arg(long)]
    pub(crate) since: String,
    /// Created before.
    #[arg(long)]
    pub(crate) until: String,
    /// The consumer whose inbox to compare with.
    #[arg(long, requires = "inbox_database_url")]
    pub(crate) consumer: Option<String>,
    /// The consumer's database.
    #[arg(long, requires = "consumer")]
    pub(crate) inbox_database_url: Option<String>,
    /// Schema of the inbox tables.
    #[arg(long, default_value_t = inbox_defaults().get_schema().to_owned())]
    pub(crate) inbox_schema: String,
    /// Inbox table name.
    #[arg(long, default_value_t = inbox_defaults().get_table().to_owned())]
    pub(crate) inbox_table: String,
    /// An event type the consumer must have applied (repeatable); other types count as
    /// consumed when any of their events is in the inbox.
    #[arg(long = "event-type")]
    pub(crate) event_types: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct InboxArgs {
    /// The consumer (its group id and inbox key).
    #[arg(long)]
    pub(crate) consumer: String,
    /// Schema of the inbox tables.
    #[arg(long, default_value_t = inbox_defaults().get_schema().to_owned())]
    pub(crate) inbox_schema: String,
    /// Inbox table name.
    #[arg(long, default_value_t = inbox_defaults().get_table().to_owned())]
    pub(crate) inbox_table: String,
    #[command(subcommand)]
    pub(crate) command: InboxCommand,
}

#[derive(Subcommand)]
pub(crate) enum InboxCommand {
    /// Parked and held messages (never their payloads).
    Parked {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Asks the running consumer to apply a parked message again, then those held behind
    /// it: one by id, or every first message of its key a filter matches (counted first;
    /// --yes to act).
    Retry {
        /// The parked message's id.
        id: Option<i64>,
        #[command(flatten)]
        action: ActionArgs,
    },
    /// Discards parked messages for good; the consumer applies those held behind them: one
    /// by id, or every one a filter matches, in order (counted first; --yes to act).
    Discard {
        /// The parked message's id.
        id: Option<i64>,
        /// Why (kept with the message).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        action: ActionArgs,
    },
    /// Converts the dedup table (every consumer's) into partitions by event id time,
    /// online: the table becomes the legacy partition as it is; only the last step locks
    /// it, for a moment. Every consumer of the table must run this version first.
    Partition,
}

/// An inbox's settings as the library defaults them, for the defaults the flags quote.
fn inbox_defaults() -> InboxConfig {
    InboxConfig::new("", "", [""])
}

/// A duration in humantime's grammar (`90s`, `15m`, `12h`, `7d`, `250ms`, `1h 30m`); a
/// bare whole number is seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration such as 30s, 15m, 12h or 7d ({e})"))
}

/// A duration on the command line, shown in its largest whole unit (`7d`, `5m`, `250ms`),
/// so that a default quoted from the library reads as a user would type it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dur(pub(crate) Duration);

impl std::fmt::Display for Dur {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.0.as_millis();
        if ms % 1000 != 0 || ms == 0 {
            return write!(f, "{ms}ms");
        }
        let s = ms / 1000;
        match [(86_400, "d"), (3600, "h"), (60, "m")].into_iter().find(|(unit, _)| s % unit == 0) {
            Some((unit, name)) => write!(f, "{}{name}", s / unit),
            None => write!(f, "{s}s"),
        }
    }
}

pub(crate) fn parse_dur(text: &str) -> Result<Dur, String> {
    parse_duration(text).map(Dur)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn durations_take_a_unit_and_bad_ones_say_what_is_wrong() {
        assert_eq!(super::parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(super::parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(super::parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(super::parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(super::parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        let unknown = super::parse_duration("7 fortnights").unwrap_err();
        assert!(
            unknown.contains("\"7 fortnights\" is not a duration") && unknown.contains("unit"),
            "{unknown}"
        );
        assert!(super::parse_duration("soon").unwrap_err().contains("not a duration"));
        assert!(super::parse_duration("-5m").is_err());
        assert!(super::parse_duration("").is_err());
        assert!(
            super::parse_duration("99999999999999999999d").is_err(),
            "an overflow is an error, not a panic"
        );
    }

    /// The relay command's defaults are the library's, and read back as what they are.
    #[test]
    fn relay_defaults_are_quoted_from_the_library() {
        use clap::Parser;
        let cli = super::Cli::try_parse_from(["outbox", "relay", "--brokers", "b:9092"]).expect("parse");
        let super::Command::Relay(args) = cli.command else { panic!("relay") };
        let library = outbox_runtime::relay::RelayConfig::new("b:9092");
        assert_eq!(args.batch_size, library.get_batch_size());
        assert_eq!(args.poll_interval.0, library.get_poll_interval());
        assert_eq!(args.missing_topic_timeout.0, library.get_missing_topic_timeout());
        assert_eq!(
            Some(args.cleanup_after.0),
            library.get_cleanup().map(outbox_runtime::relay::Cleanup::get_retention)
        );
        assert!(!args.no_cleanup, "cleanup is on by default, as in the library");
        for d in [
            Duration::from_secs(7 * 86_400),
            Duration::from_secs(300),
            Duration::from_millis(250),
            Duration::from_secs(90),
        ] {
            assert_eq!(super::parse_duration(&super::Dur(d).to_string()), Ok(d), "{d:?}");
        }
    }
}
