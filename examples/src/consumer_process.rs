//! The example's consumer process (`cargo run -p outbox-examples --bin consumer`): keeps the
//! confirmed-orders projection in its own database, stopped gracefully by SIGTERM or Ctrl-C.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `CONSUMER_DATABASE_URL` | the projection's database | `postgres://postgres@127.0.0.1:5432/test` |
//! | `KAFKA_BROKERS` | Kafka bootstrap servers | required |
//! | `OUTBOX_METRICS_ADDR` | serve Prometheus metrics here (e.g. `127.0.0.1:9188`) | off |
//! | `RUST_LOG` | log filter | `info` |

use std::process::ExitCode;

use outbox_runtime::inbox::{Inbox, InboxConfig};
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

use crate::events::OrderConfirmed;
use crate::projection;
use crate::relay_process::{init_logging, serve_metrics_from_env, DEFAULT_DATABASE_URL};
use outbox_runtime::OutboxEvent;

/// The projection's inbox configuration for `brokers`.
pub fn inbox_config(brokers: &str) -> InboxConfig {
    InboxConfig::new(projection::CONSUMER, brokers, [OrderConfirmed::TOPIC])
}

/// Runs the consumer until SIGTERM or Ctrl-C. Exit code 2 on bad configuration, 1 on failure.
pub fn main_from_env() -> ExitCode {
    init_logging();
    let database = std::env::var("CONSUMER_DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    let Ok(brokers) = std::env::var("KAFKA_BROKERS") else {
        eprintln!("consumer: KAFKA_BROKERS is not set (e.g. `outbox broker` prints one)");
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("consumer: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result: outbox_runtime::Result<()> = runtime.block_on(async move {
        serve_metrics_from_env()?;
        let pool = PgPoolOptions::new().max_connections(8).connect(&database).await?;
        projection::MIGRATOR.run(&pool).await?;
        let inbox = Inbox::new(pool.clone(), inbox_config(&brokers), projection::handlers())?;
        inbox.migrator().run(&pool).await?;
        let shutdown = CancellationToken::new();
        let signal = outbox_runtime::signal::cancel_on_signal(shutdown.clone());
        let result = inbox.run(shutdown).await;
        signal.abort();
        result
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ outbox_runtime::Error::Config(_)) => {
            eprintln!("consumer: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("consumer: {e}");
            ExitCode::from(1)
        }
    }
}
