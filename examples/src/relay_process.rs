//! The example's relay process (`cargo run -p outbox-examples --bin relay`), configured from
//! the environment, stopped gracefully by SIGTERM or Ctrl-C.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `DATABASE_URL` | PostgreSQL holding the outbox | `postgres://postgres@127.0.0.1:5432/test` |
//! | `KAFKA_BROKERS` | Kafka bootstrap servers | required |
//! | `OUTBOX_BATCH_SIZE` | rows per batch | `RelayConfig`'s (2,000) |
//! | `OUTBOX_POLL_MS` | poll interval when no NOTIFY arrives | `RelayConfig`'s (1 s) |
//! | `OUTBOX_LEASE_TTL_MS` | work partition lease | `RelayConfig`'s (30 s) |
//! | `OUTBOX_MESSAGE_TIMEOUT_MS` | how long a batch's records may wait to be acknowledged | `RelayConfig`'s (10 s) |
//! | `OUTBOX_CLAIM_MODE` | `lease` or `hold-locks` (`ClaimMode`: hold each batch's transaction and locks across the send) | `lease` |
//! | `OUTBOX_CDC_SLOT` | stream from this replication slot and publication (the change-data-capture relay; `outbox cdc setup --slot S --publication S` first) instead of polling | off |
//! | `OUTBOX_CDC_TAKEOVER_MS` | how often a standby tries to take the slot over | `CdcConfig`'s (2 s) |
//! | `OUTBOX_METRICS_ADDR` | serve Prometheus metrics here (e.g. `127.0.0.1:9187`) | off |
//! | `RUST_LOG` | log filter | `info` |
//!
//! The records name this service as their CloudEvents `source`: `/order-service`.

use std::process::ExitCode;
use std::time::Duration;

use outbox_runtime::cdc::{CdcConfig, CdcRelay};
use outbox_runtime::relay::{ClaimMode, Relay, RelayConfig};
use outbox_runtime::Outbox;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

/// The default local database (the library's, quoted).
pub use outbox_runtime::DEFAULT_DATABASE_URL;

/// The CloudEvents `source` of this service's events.
pub const SOURCE: &str = "/order-service";

/// A number from the environment, `None` when unset (the library's default then applies).
fn env_number(name: &str) -> Result<Option<u64>, String> {
    match std::env::var(name) {
        Ok(v) => v.parse::<u64>().map(Some).map_err(|_| format!("{name}={v:?} is not a number")),
        Err(_) => Ok(None),
    }
}

fn config() -> Result<(String, RelayConfig), String> {
    let database = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    let brokers = std::env::var("KAFKA_BROKERS")
        .map_err(|_| "KAFKA_BROKERS is not set (e.g. `outbox broker` prints one)".to_owned())?;
    let mut config = RelayConfig::new(brokers).source(SOURCE);
    if let Some(rows) = env_number("OUTBOX_BATCH_SIZE")? {
        config = config
            .batch_size(u32::try_from(rows).map_err(|_| format!("OUTBOX_BATCH_SIZE={rows} is too large"))?);
    }
    if let Some(ms) = env_number("OUTBOX_POLL_MS")? {
        config = config.poll_interval(Duration::from_millis(ms));
    }
    if let Some(ms) = env_number("OUTBOX_LEASE_TTL_MS")? {
        config = config.lease_ttl(Duration::from_millis(ms));
    }
    if let Some(ms) = env_number("OUTBOX_MESSAGE_TIMEOUT_MS")? {
        config = config.message_timeout(Duration::from_millis(ms));
    }
    match std::env::var("OUTBOX_CLAIM_MODE").as_deref() {
        Err(_) | Ok("lease") => {}
        Ok("hold-locks") => config = config.claim_mode(ClaimMode::HoldLocks),
        Ok(other) => return Err(format!("OUTBOX_CLAIM_MODE={other:?} is not lease or hold-locks")),
    }
    Ok((database, config))
}

/// Serves Prometheus metrics on `OUTBOX_METRICS_ADDR` when set. Call inside the runtime.
pub fn serve_metrics_from_env() -> outbox_runtime::Result<()> {
    let Ok(addr) = std::env::var("OUTBOX_METRICS_ADDR") else { return Ok(()) };
    let addr = addr.parse().map_err(|e| {
        outbox_runtime::Error::Config(format!(
            "OUTBOX_METRICS_ADDR={addr:?} is not an address such as 127.0.0.1:9187: {e}"
        ))
    })?;
    outbox_runtime::metrics::install_prometheus(addr)?;
    tracing::info!(%addr, "serving Prometheus metrics at /metrics");
    Ok(())
}

/// Installs a log subscriber honouring `RUST_LOG` (default `info`), on standard error, in
/// colour only when that is a terminal (a log file gets no escape codes).
pub fn init_logging() {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let filter = match outbox_runtime::cdc::QUIET_CLIENT_LOG.parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Runs a relay until SIGTERM or Ctrl-C. Exit code 2 on bad configuration (a variable, or
/// a setting the library refuses: `Error::Config`), 1 on failure.
pub fn main_from_env() -> ExitCode {
    init_logging();
    let (database, config) = match config() {
        Ok(c) => c,
        Err(message) => {
            eprintln!("relay: {message}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("relay: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async move {
        serve_metrics_from_env()?;
        // The change-data-capture relay also runs the table path and marks in the background.
        let connections = if std::env::var_os("OUTBOX_CDC_SLOT").is_some() { 8 } else { 4 };
        let pool = PgPoolOptions::new().max_connections(connections).connect(&database).await?;
        let outbox = Outbox::default_ref().clone();
        outbox.migrator().run(&pool).await?;
        let shutdown = CancellationToken::new();
        outbox_runtime::signal::cancel_on_signal(shutdown.clone());
        match std::env::var("OUTBOX_CDC_SLOT") {
            Ok(slot) => {
                let mut cdc = CdcConfig::new(&database).slot(&slot).publication(&slot);
                if let Some(ms) =
                    env_number("OUTBOX_CDC_TAKEOVER_MS").map_err(outbox_runtime::Error::Config)?
                {
                    cdc = cdc.takeover_interval(Duration::from_millis(ms));
                }
                CdcRelay::new(pool, outbox, config, cdc)?.run(shutdown).await
            }
            Err(_) => Relay::new(pool, outbox, config)?.run(shutdown).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ outbox_runtime::Error::Config(_)) => {
            eprintln!("relay: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("relay: {e}");
            ExitCode::from(1)
        }
    }
}
