//! What every command starts with: the database connection, times as PostgreSQL reads
//! them, the log. A leaf: the commands use it, it uses none of them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_runtime::secrets::redact_urls;
use outbox_runtime::sqlx::postgres::PgPoolOptions;
use outbox_runtime::sqlx::PgPool;

use crate::{fail, Fail};

pub(crate) async fn connect(url: &str) -> Result<PgPool, Fail> {
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .map_err(|e| fail(3, format!("cannot connect to {}: {e}", redact_urls(url))))
}

/// Reads a timestamp the way PostgreSQL does, so every form it accepts works here, exact to
/// its microsecond (a float of seconds is not: it would move a bound by a fraction of one).
pub(crate) async fn parse_time(pool: &PgPool, flag: &str, text: &str) -> Result<SystemTime, Fail> {
    let (after, micros): (bool, Option<i64>) = sqlx::query_as(
        "SELECT t > 'epoch', CASE WHEN isfinite(t) THEN (EXTRACT(EPOCH FROM t) * 1000000)::int8 END \
         FROM (SELECT $1::text::timestamptz AS t) AS given",
    )
    .bind(text)
    .fetch_one(pool)
    .await
    .map_err(|e| match e.as_database_error() {
        Some(db) => fail(2, format!("invalid {flag} {text:?}: {}", db.message())),
        None => fail(3, e.to_string()),
    })?;
    // -infinity and infinity stand for "from the beginning" and "until the end": times past
    // either end of PostgreSQL's range, which filters take as its ends and audit rows record
    // as the infinities (before, -infinity was the epoch, recorded as 1970-01-01).
    let far = Duration::from_secs(10_000_000_000_000);
    let time = match micros {
        Some(m) if m >= 0 => UNIX_EPOCH.checked_add(Duration::from_micros(m.unsigned_abs())),
        Some(m) => UNIX_EPOCH.checked_sub(Duration::from_micros(m.unsigned_abs())),
        None if after => UNIX_EPOCH.checked_add(far),
        None => UNIX_EPOCH.checked_sub(far),
    };
    time.ok_or_else(|| fail(2, format!("invalid {flag} {text:?}: out of range")))
}

pub(crate) async fn parse_optional_time(
    pool: &PgPool,
    flag: &str,
    text: Option<&str>,
) -> Result<Option<SystemTime>, Fail> {
    match text {
        Some(text) => parse_time(pool, flag, text).await.map(Some),
        None => Ok(None),
    }
}

/// Logs to standard error at `info` unless `RUST_LOG` says otherwise, the replication
/// client's chatter quieted; colour only on a terminal (a log file or a collector gets no
/// escape codes).
pub(crate) fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let filter = match outbox_runtime::cdc::QUIET_CLIENT_LOG.parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
