//! The `outbox` operator command line (feature `cli`).
//!
//! Exit codes: 0 done; 1 nothing matched (no such failed event or parked message, nothing
//! to retry) or, for `reconcile`, differences found; 2 bad arguments or settings; 3 the
//! database, the broker or the metrics listener is unreachable or failed; 4 the request
//! conflicts with the current state (a message held behind an earlier one: release that
//! first).
//!
//! There is no generic `consume`: applying an event needs the application's handlers, so
//! a consumer is the application's own binary ([`Inbox`](crate::inbox::Inbox)); the
//! `inbox` commands operate its tables from here.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::cleanup::Cleanup;
use crate::inbox::{InboxAdmin, ParkedMessage};
use crate::ops::{InboxSide, ReplayFilter, RetryTarget, Status};
use crate::relay::{Relay, RelayConfig};
use crate::secrets::redact_urls;
use crate::{Capacity, Error, Outbox, OutboxConfig};

#[derive(Parser)]
#[command(
    name = "outbox",
    version,
    about = "Operate a transactional outbox: migrate, relay, status, failed and retrying events, retry, discard, replay, purge, reconcile, inbox",
    after_help = "Exit codes: 0 done; 1 nothing matched, or reconcile found differences; 2 bad arguments or settings; 3 database, broker or metrics listener failure; 4 conflicts with the current state (release the earlier message first)."
)]
struct Cli {
    /// PostgreSQL holding the outbox.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test",
        global = true
    )]
    database_url: String,
    /// Schema of the outbox tables.
    #[arg(long, default_value = "public", global = true)]
    schema: String,
    /// Outbox table name.
    #[arg(long, default_value = "outbox", global = true)]
    table: String,
    /// Capacity in unpublished events, for the forecast in `status` and the relay's metrics.
    #[arg(long, global = true, conflicts_with = "capacity_bytes")]
    capacity_rows: Option<u64>,
    /// Capacity in bytes of the outbox table, for the forecast.
    #[arg(long, global = true)]
    capacity_bytes: Option<u64>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
    Retry(RetryArgs),
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
        #[arg(long, default_value_t = 1000)]
        batch_size: u32,
    },
    /// Counts events per type and hour: appended, published and, given the consumer's
    /// inbox, applied. Exits 1 when any differ.
    Reconcile(ReconcileArgs),
    /// A consumer's parked messages: list, retry, discard.
    Inbox(InboxArgs),
}

#[derive(Args)]
struct RelayArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS")]
    brokers: String,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:9187).
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// Rows per batch. The default is the library's (`RelayConfig::batch_size`).
    #[arg(long, default_value_t = RelayConfig::new("").get_batch_size())]
    batch_size: u32,
    /// Poll interval when no NOTIFY arrives (e.g. 1s). The default is the library's.
    #[arg(long, default_value_t = Dur(RelayConfig::new("").get_poll_interval()), value_parser = parse_dur)]
    poll_interval: Dur,
    /// Delete published rows older than this (e.g. 7d). The default is the library's
    /// (`Cleanup::default`).
    #[arg(long, default_value_t = Dur(Cleanup::default().get_retention()), value_parser = parse_dur)]
    cleanup_after: Dur,
    /// Do not delete published rows (overrides --cleanup-after).
    #[arg(long)]
    no_cleanup: bool,
    /// How long an event waits for its topic to exist before it is marked failed. The
    /// default is the library's.
    #[arg(long, default_value_t = Dur(RelayConfig::new("").get_missing_topic_timeout()), value_parser = parse_dur)]
    missing_topic_timeout: Dur,
}

#[derive(Subcommand)]
enum FailedCommand {
    /// Lists failed events with their reasons (never their payloads).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
#[group(required = true, multiple = false)]
struct RetryArgs {
    /// One failed event.
    event_id: Option<Uuid>,
    /// Every failed event of this aggregate id.
    #[arg(long)]
    aggregate: Option<String>,
    /// Every failed event.
    #[arg(long)]
    all_failed: bool,
}

#[derive(Args)]
struct ReplayArgs {
    #[command(flatten)]
    filter: ReplayFilterArgs,
    /// Count what would be replayed; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
#[group(required = true, multiple = true)]
struct ReplayFilterArgs {
    /// Only this event type.
    #[arg(long)]
    event_type: Option<String>,
    /// Only this aggregate id.
    #[arg(long)]
    aggregate: Option<String>,
    /// Created at or after (a PostgreSQL timestamp, e.g. 2026-11-30T10:00:00Z).
    #[arg(long)]
    since: Option<String>,
    /// Created before.
    #[arg(long)]
    until: Option<String>,
}

#[derive(Args)]
struct ReconcileArgs {
    /// Created at or after (a PostgreSQL timestamp, e.g. 2026-11-30T10:00:00Z).
    #[arg(long)]
    since: String,
    /// Created before.
    #[arg(long)]
    until: String,
    /// The consumer whose inbox to compare with.
    #[arg(long, requires = "inbox_database_url")]
    consumer: Option<String>,
    /// The consumer's database.
    #[arg(long, requires = "consumer")]
    inbox_database_url: Option<String>,
    /// Schema of the inbox tables.
    #[arg(long, default_value = "public")]
    inbox_schema: String,
    /// Inbox table name.
    #[arg(long, default_value = "inbox")]
    inbox_table: String,
    /// An event type the consumer must have applied (repeatable); other types count as
    /// consumed when any of their events is in the inbox.
    #[arg(long = "event-type")]
    event_types: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct InboxArgs {
    /// The consumer (its group id and inbox key).
    #[arg(long)]
    consumer: String,
    /// Schema of the inbox tables.
    #[arg(long, default_value = "public")]
    inbox_schema: String,
    /// Inbox table name.
    #[arg(long, default_value = "inbox")]
    inbox_table: String,
    #[command(subcommand)]
    command: InboxCommand,
}

#[derive(Subcommand)]
enum InboxCommand {
    /// Parked and held messages (never their payloads).
    Parked {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Asks the running consumer to apply a parked message again, then those held behind it.
    Retry {
        /// The parked message's id.
        id: i64,
    },
    /// Discards a parked message for good; the consumer applies those held behind it.
    Discard {
        /// The parked message's id.
        id: i64,
        /// Why (kept with the message).
        #[arg(long)]
        reason: String,
        /// Confirms the discard.
        #[arg(long)]
        yes: bool,
    },
}

/// A duration such as `90s`, `15m`, `12h`, `7d` or `250ms`; a bare number is seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 =
        number.parse().map_err(|_| format!("{text:?} is not a duration such as 30s, 15m, 12h or 7d"))?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        "d" => number * 86_400.0,
        _ => return Err(format!("{text:?}: unknown unit {unit:?}; use ms, s, m, h or d")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// A duration on the command line, shown in its largest whole unit (`7d`, `5m`, `250ms`),
/// so that a default quoted from the library reads as a user would type it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dur(Duration);

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

fn parse_dur(text: &str) -> Result<Dur, String> {
    parse_duration(text).map(Dur)
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outbox: {e}");
            return ExitCode::from(3);
        }
    };
    runtime.block_on(run(cli))
}

/// A failure with its exit code.
struct Fail(u8, String);

impl From<Error> for Fail {
    fn from(error: Error) -> Self {
        match error {
            Error::NotFound(message) => Fail(1, message),
            Error::Config(_) | Error::InvalidIdentifier { .. } => Fail(2, error.to_string()),
            Error::Conflict(_) => Fail(4, error.to_string()),
            _ => Fail(3, error.to_string()),
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
    match execute(cli).await {
        Ok(code) => code,
        Err(Fail(code, message)) => {
            // Whatever reported the error, a URL in it is shown without its password.
            eprintln!("outbox: {}", redact_urls(&message));
            ExitCode::from(code)
        }
    }
}

async fn connect(url: &str) -> Result<PgPool, Fail> {
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .map_err(|e| Fail(3, format!("cannot connect to {}: {e}", redact_urls(url))))
}

/// Reads a timestamp the way PostgreSQL does, so every form it accepts works here.
async fn parse_time(pool: &PgPool, flag: &str, text: &str) -> Result<SystemTime, Fail> {
    let seconds: f64 = sqlx::query_scalar("SELECT EXTRACT(EPOCH FROM $1::text::timestamptz)::float8")
        .bind(text)
        .fetch_one(pool)
        .await
        .map_err(|e| match e.as_database_error() {
            Some(db) => Fail(2, format!("invalid {flag} {text:?}: {}", db.message())),
            None => Fail(3, e.to_string()),
        })?;
    // -infinity and infinity stand for "from the beginning" and "until the end".
    let far = Duration::from_secs(100_000_000_000);
    let time = if seconds == f64::NEG_INFINITY {
        Some(UNIX_EPOCH)
    } else if seconds == f64::INFINITY {
        UNIX_EPOCH.checked_add(far)
    } else if seconds >= 0.0 {
        Duration::try_from_secs_f64(seconds).ok().and_then(|d| UNIX_EPOCH.checked_add(d))
    } else {
        Duration::try_from_secs_f64(-seconds).ok().and_then(|d| UNIX_EPOCH.checked_sub(d))
    };
    time.ok_or_else(|| Fail(2, format!("invalid {flag} {text:?}: out of range")))
}

async fn parse_optional_time(
    pool: &PgPool,
    flag: &str,
    text: Option<&str>,
) -> Result<Option<SystemTime>, Fail> {
    match text {
        Some(text) => parse_time(pool, flag, text).await.map(Some),
        None => Ok(None),
    }
}

fn print_json(value: &impl Serialize) {
    println!("{}", serde_json::to_string(value).unwrap_or_default());
}

async fn execute(cli: Cli) -> Result<ExitCode, Fail> {
    let mut config = OutboxConfig::default().schema(&cli.schema).table(&cli.table);
    if let Some(rows) = cli.capacity_rows {
        config = config.capacity(Capacity::Rows(rows));
    }
    if let Some(bytes) = cli.capacity_bytes {
        config = config.capacity(Capacity::Bytes(bytes));
    }
    let outbox = Outbox::new(config)?;
    let pool = connect(&cli.database_url).await?;
    match cli.command {
        Command::Migrate => {
            outbox.migrator().run(&pool).await.map_err(Error::from)?;
            println!("outbox tables are up to date");
        }
        Command::Relay(args) => return relay(outbox, pool, args).await,
        Command::Status { json, window } => {
            let status = outbox.status_over(&pool, window).await?;
            if json {
                print_json(&status);
            } else {
                print_status(&status);
            }
        }
        Command::Failed(FailedCommand::List { json }) => {
            let failed = outbox.failed(&pool).await?;
            if json {
                print_json(&failed);
            } else if failed.is_empty() {
                println!("no failed events");
            } else {
                println!(
                    "{:<36}  {:<24}  {:<24}  {:>8}  {:>9}  reason",
                    "event_id", "type", "aggregate", "attempts", "held back"
                );
                for f in failed {
                    println!(
                        "{}  {:<24}  {:<24}  {:>8}  {:>9}  {}",
                        f.event_id,
                        f.event_type,
                        format!("{}/{}", f.aggregate_type, f.aggregate_id),
                        f.attempts,
                        f.held_back,
                        f.last_error.unwrap_or_default()
                    );
                }
            }
        }
        Command::Retrying { json, limit } => {
            let retrying = outbox.retrying(&pool, limit).await?;
            if json {
                print_json(&retrying);
            } else if retrying.total == 0 {
                println!("no events waiting for a retry");
            } else {
                println!(
                    "{:<36}  {:<24}  {:<24}  {:<24}  {:>8}  {:>12}  last error",
                    "event_id", "type", "aggregate", "topic", "attempts", "next attempt"
                );
                for r in &retrying.events {
                    let next = if r.next_attempt_in_seconds <= 0.0 {
                        "due".to_owned()
                    } else {
                        format!("in {:.1}s", r.next_attempt_in_seconds)
                    };
                    println!(
                        "{}  {:<24}  {:<24}  {:<24}  {:>8}  {:>12}  {}",
                        r.event_id,
                        r.event_type,
                        format!("{}/{}", r.aggregate_type, r.aggregate_id),
                        r.topic,
                        r.attempts,
                        next,
                        r.last_error.as_deref().unwrap_or_default()
                    );
                }
                if retrying.total > retrying.events.len() as i64 {
                    println!("{} of {} shown (--limit)", retrying.events.len(), retrying.total);
                }
            }
        }
        Command::Retry(args) => {
            let target = match (args.event_id, args.aggregate, args.all_failed) {
                (Some(id), _, _) => RetryTarget::Event(id),
                (_, Some(aggregate), _) => RetryTarget::Aggregate(aggregate),
                _ => RetryTarget::AllFailed,
            };
            let n = outbox.retry(&pool, &target).await?;
            println!("{n} failed event(s) put back up for publication");
            if n == 0 {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Discard { event_id, reason, yes } => {
            if !yes {
                return Err(Fail(
                    2,
                    format!("discarding {event_id} means it is never published; add --yes to confirm"),
                ));
            }
            if !outbox.discard(&pool, event_id, &reason).await? {
                return Err(Fail(1, format!("no failed or pending event {event_id}")));
            }
            println!("discarded {event_id}: {reason}");
        }
        Command::Replay(args) => {
            let f = args.filter;
            let filter = ReplayFilter {
                event_type: f.event_type,
                aggregate_id: f.aggregate,
                since: parse_optional_time(&pool, "--since", f.since.as_deref()).await?,
                until: parse_optional_time(&pool, "--until", f.until.as_deref()).await?,
            };
            let report = outbox.replay(&pool, &filter, args.dry_run).await?;
            if args.json {
                print_json(&report);
            } else {
                let bound = if report.cleaned_up_exact { "" } else { "at most " };
                println!(
                    "{} matched: {} published, {} not yet published, {} discarded; {bound}{} published already cleaned up, cannot be replayed",
                    report.matched, report.replayable, report.not_yet_published, report.discarded, report.cleaned_up
                );
                if args.dry_run {
                    println!("dry run: {} would be published again; nothing changed", report.replayable);
                } else {
                    println!("{} put back up for publication with their original event ids", report.replayed);
                }
            }
            if report.matched == 0 {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Purge { older_than, batch_size } => {
            let deleted = outbox
                .purge(&pool, older_than, batch_size, |total| {
                    if total > 0 {
                        eprintln!("purge: {total} deleted");
                    }
                })
                .await?;
            println!("{deleted} published or discarded event(s) older than {older_than:?} deleted");
        }
        Command::Reconcile(args) => return reconcile(&outbox, &pool, args).await,
        Command::Inbox(args) => return inbox(pool, args).await,
    }
    Ok(ExitCode::SUCCESS)
}

fn print_status(status: &Status) {
    let oldest = status.oldest_unpublished_age_seconds.map_or("-".to_owned(), |s| format!("{s:.1} s"));
    println!("pending             {:>12}", status.pending);
    println!("  of which retrying {:>12}", status.retrying);
    println!("failed              {:>12}", status.failed);
    println!("published           {:>12}", status.published);
    println!("discarded           {:>12}", status.discarded);
    println!("oldest unpublished  {oldest:>12}");
    println!(
        "appended rate       {:>10.2}/s  (last {:.0} s)",
        status.appended_per_second, status.window_seconds
    );
    println!("published rate      {:>10.2}/s", status.published_per_second);
    println!("table size          {:>12}", format!("{} kB", status.table_bytes / 1024));
    println!("dead tuples         {:>12}", status.dead_tuples);
    if let Some(c) = &status.capacity {
        let full = match c.seconds_to_full {
            None => "not growing".to_owned(),
            Some(s) if s <= 0.0 => "FULL".to_owned(),
            Some(s) => format!("{s:.0} s"),
        };
        println!(
            "capacity            {:>11.1}%  ({} of {} {}; non-critical refused from {:.0}%)",
            c.used_ratio * 100.0,
            c.used,
            c.limit,
            c.unit,
            c.refuse_non_critical_at * 100.0
        );
        println!("full in             {full:>12}  (growing {:.2} {}/s)", c.growth_per_second, c.unit);
    }
}

async fn relay(outbox: Outbox, pool: PgPool, args: RelayArgs) -> Result<ExitCode, Fail> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    if let Some(addr) = args.metrics_addr {
        crate::metrics::install_prometheus(addr)?;
        eprintln!("outbox: metrics on http://{addr}/metrics");
    }
    let cleanup = (!args.no_cleanup).then(|| Cleanup::default().retention(args.cleanup_after.0));
    let config = RelayConfig::new(args.brokers)
        .batch_size(args.batch_size)
        .poll_interval(args.poll_interval.0)
        .missing_topic_timeout(args.missing_topic_timeout.0)
        .cleanup(cleanup);
    let relay = Relay::new(pool, outbox, config)?;
    let shutdown = CancellationToken::new();
    crate::signal::cancel_on_signal(shutdown.clone());
    relay.run(shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

async fn reconcile(outbox: &Outbox, pool: &PgPool, args: ReconcileArgs) -> Result<ExitCode, Fail> {
    let since = parse_time(pool, "--since", &args.since).await?;
    let until = parse_time(pool, "--until", &args.until).await?;
    if until <= since {
        return Err(Fail(2, format!("--until {:?} is not after --since {:?}", args.until, args.since)));
    }
    let inbox = match (&args.consumer, &args.inbox_database_url) {
        (Some(consumer), Some(url)) => {
            let inbox_pool = connect(url).await?;
            let mut side =
                InboxSide::new(inbox_pool, &args.inbox_schema, &args.inbox_table, consumer.clone())?;
            for event_type in &args.event_types {
                side = side.require(event_type.clone());
            }
            Some(side)
        }
        _ => None,
    };
    let result = outbox.reconcile(pool, since, until, inbox.as_ref()).await?;
    if args.json {
        print_json(&result);
    } else {
        let dash = |v: Option<i64>| v.map_or("-".to_owned(), |v| v.to_string());
        println!(
            "{:<20}  {:<24}  {:>9}  {:>9}  {:>11}  {:>9}  {:>10}  {:>8}  {:>6}  {:>11}  {:>11}",
            "hour (UTC)",
            "type",
            "appended",
            "published",
            "unpublished",
            "discarded",
            "cleaned up",
            "applied",
            "stale",
            "c-discarded",
            "not applied"
        );
        for r in &result.rows {
            println!(
                "{:<20}  {:<24}  {:>9}  {:>9}  {:>11}  {:>9}  {:>10}  {:>8}  {:>6}  {:>11}  {:>11}",
                r.hour,
                r.event_type,
                r.appended,
                r.published,
                r.unpublished,
                r.discarded,
                r.cleaned_up,
                dash(r.applied),
                dash(r.stale),
                dash(r.consumer_discarded),
                dash(r.not_applied)
            );
            for id in &r.not_applied_ids {
                println!("    not applied: {id}");
            }
        }
        for event_type in &result.not_consumed {
            println!("{event_type}: none of its events is in the inbox; taken as not consumed (require it with --event-type)");
        }
        if result.rows.iter().any(|r| r.not_applied.unwrap_or(0) > 0) {
            let moment = if result.one_snapshot {
                "read at one moment"
            } else {
                "the inbox (another database) read just after the outbox"
            };
            println!(
                "{moment}: events published a moment before show as not applied until the consumer applies them; \
                 set --until a little in the past to leave them out"
            );
        }
        if result.differences == 0 {
            println!("no differences");
        } else {
            println!("{} row(s) with differences", result.differences);
        }
    }
    Ok(if result.differences == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

async fn inbox(pool: PgPool, args: InboxArgs) -> Result<ExitCode, Fail> {
    let admin = InboxAdmin::new(pool, &args.inbox_schema, &args.inbox_table, &args.consumer)?;
    match args.command {
        InboxCommand::Parked { json } => {
            let parked = admin.parked().await?;
            if json {
                #[derive(Serialize)]
                struct Shown<'a> {
                    id: i64,
                    status: &'a str,
                    reason: &'a str,
                    topic: &'a str,
                    partition: i32,
                    offset: i64,
                    event_type: Option<&'a str>,
                    retry_requested: bool,
                }
                let shown: Vec<Shown<'_>> = parked
                    .iter()
                    .map(|p: &ParkedMessage| Shown {
                        id: p.id,
                        status: &p.status,
                        reason: &p.reason,
                        topic: &p.topic,
                        partition: p.kafka_partition,
                        offset: p.kafka_offset,
                        event_type: p.event_type.as_deref(),
                        retry_requested: p.retry_requested,
                    })
                    .collect();
                print_json(&shown);
            } else if parked.is_empty() {
                println!("no parked messages for consumer {}", args.consumer);
            } else {
                println!(
                    "{:>8}  {:<7}  {:<28}  {:<24}  reason",
                    "id", "status", "topic/partition@offset", "type"
                );
                for p in parked {
                    let retry = if p.retry_requested { " (retry requested)" } else { "" };
                    println!(
                        "{:>8}  {:<7}  {:<28}  {:<24}  {}{retry}",
                        p.id,
                        p.status,
                        format!("{}/{}@{}", p.topic, p.kafka_partition, p.kafka_offset),
                        p.event_type.unwrap_or_default(),
                        p.reason
                    );
                }
            }
        }
        InboxCommand::Retry { id } => {
            admin.request_retry(id).await?;
            println!(
                "retry of parked message {id} requested; the running consumer {} carries it out",
                args.consumer
            );
        }
        InboxCommand::Discard { id, reason, yes } => {
            if !yes {
                return Err(Fail(
                    2,
                    format!("discarding parked message {id} means it never applies; add --yes to confirm"),
                ));
            }
            let discarded = admin.discard(id, &reason).await?;
            println!(
                "discarded parked message {id}: {reason}; {} held behind it go to the running consumer",
                discarded.held_behind
            );
        }
    }
    Ok(ExitCode::SUCCESS)
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
        assert!(super::parse_duration("7 weeks").unwrap_err().contains("unknown unit"));
        assert!(super::parse_duration("soon").unwrap_err().contains("not a duration"));
        assert!(super::parse_duration("-5m").is_err());
    }

    /// The relay command's defaults are the library's, and read back as what they are.
    #[test]
    fn relay_defaults_are_quoted_from_the_library() {
        use clap::Parser;
        let cli = super::Cli::try_parse_from(["outbox", "relay", "--brokers", "b:9092"]).expect("parse");
        let super::Command::Relay(args) = cli.command else { panic!("relay") };
        let library = crate::relay::RelayConfig::new("b:9092");
        assert_eq!(args.batch_size, library.get_batch_size());
        assert_eq!(args.poll_interval.0, library.get_poll_interval());
        assert_eq!(args.missing_topic_timeout.0, library.get_missing_topic_timeout());
        assert_eq!(
            Some(args.cleanup_after.0),
            library.get_cleanup().map(crate::relay::Cleanup::get_retention)
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
