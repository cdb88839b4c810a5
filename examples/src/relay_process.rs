//! The example's relay process (`cargo run -p outbox-examples --bin relay`), configured from
//! the environment, stopped gracefully by SIGTERM or Ctrl-C.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `DATABASE_URL` | PostgreSQL holding the outbox | `postgres://postgres@127.0.0.1:5432/test` |
//! | `KAFKA_BROKERS` | Kafka bootstrap servers | required |
//! | `OUTBOX_BATCH_SIZE` | rows per batch | 500 |
//! | `OUTBOX_POLL_MS` | poll interval when no NOTIFY arrives | 1000 |
//! | `OUTBOX_LEASE_TTL_MS` | work partition lease | 30000 |
//! | `OUTBOX_MESSAGE_TIMEOUT_MS` | Kafka `message.timeout.ms` | 10000 |
//! | `OUTBOX_METRICS_ADDR` | serve Prometheus metrics here (e.g. `127.0.0.1:9187`) | off |
//! | `RUST_LOG` | log filter | `info` |

use std::process::ExitCode;
use std::time::Duration;

use outbox_runtime::relay::{Relay, RelayConfig};
use outbox_runtime::Outbox;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

/// The default local database.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn env_ms(name: &str, default: u64) -> Result<Duration, String> {
    match std::env::var(name) {
        Ok(v) => v
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("{name}={v:?} is not a number of milliseconds")),
        Err(_) => Ok(Duration::from_millis(default)),
    }
}

fn config() -> Result<(String, RelayConfig), String> {
    let database = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    let brokers = std::env::var("KAFKA_BROKERS")
        .map_err(|_| "KAFKA_BROKERS is not set (e.g. `cargo xtask broker` prints one)".to_owned())?;
    let batch = match std::env::var("OUTBOX_BATCH_SIZE") {
        Ok(v) => v.parse::<u32>().map_err(|_| format!("OUTBOX_BATCH_SIZE={v:?} is not a number"))?,
        Err(_) => 500,
    };
    let config = RelayConfig::new(brokers)
        .batch_size(batch)
        .poll_interval(env_ms("OUTBOX_POLL_MS", 1000)?)
        .lease_ttl(env_ms("OUTBOX_LEASE_TTL_MS", 30_000)?)
        .message_timeout(env_ms("OUTBOX_MESSAGE_TIMEOUT_MS", 10_000)?);
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

/// Installs a log subscriber honouring `RUST_LOG` (default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Runs a relay until SIGTERM or Ctrl-C. Exit code 2 on bad configuration, 1 on failure.
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
        let pool = PgPoolOptions::new().max_connections(4).connect(&database).await?;
        let outbox = Outbox::default_ref().clone();
        outbox.migrator().run(&pool).await?;
        let relay = Relay::new(pool, outbox, config)?;
        let shutdown = CancellationToken::new();
        outbox_runtime::signal::cancel_on_signal(shutdown.clone());
        relay.run(shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("relay: {e}");
            ExitCode::from(1)
        }
    }
}
