//! The example's order service as a process (`cargo run -p outbox-examples --bin order-service`):
//! places `ORDERS` orders and confirms each (twice at once: one wins), then exits.
//! A transient database failure (the server restarting, say) is retried for up to a
//! minute, each retry logged: a confirmation whose commit was cut off is retried safely,
//! because a retry of a confirmation that did commit finds the order no longer pending.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `DATABASE_URL` | the order service's database | `postgres://postgres@127.0.0.1:5432/test` |
//! | `ORDERS` | how many orders | 100 |
//! | `ORDERS_PER_SECOND` | pace (0: as fast as possible) | 0 |

use std::future::Future;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use outbox_runtime::Outbox;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use crate::events::{OrderLine, Payment};
use crate::orders::{self, Confirmed, NewOrder, OrderError};
use crate::relay_process::{init_logging, DEFAULT_DATABASE_URL};

fn number(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|_| format!("{name}={v:?} is not a number")),
        Err(_) => Ok(default),
    }
}

/// How long one operation is retried while the database fails transiently.
const RETRY_FOR: Duration = Duration::from_secs(60);

/// Runs `op` until it succeeds, fails for good, or has failed transiently for
/// [`RETRY_FOR`]; each retry is logged at warn.
async fn with_retries<T, F, Fut>(what: &str, mut op: F) -> Result<T, OrderError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, OrderError>>,
{
    let started = Instant::now();
    let mut attempt = 1u32;
    loop {
        let error = match op().await {
            Ok(value) => return Ok(value),
            Err(OrderError::Database(e)) => OrderError::Outbox(outbox_runtime::Error::Database(e)),
            Err(e) => e,
        };
        let transient = matches!(&error, OrderError::Outbox(e) if e.is_transient());
        if !transient || started.elapsed() >= RETRY_FOR {
            return Err(error);
        }
        tracing::warn!(stage = what, attempt, %error, "transient database failure; retrying");
        tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt.min(10)))).await;
        attempt += 1;
    }
}

/// Places and confirms orders. Prints `confirmed N` at the end. Exit code 2 on bad
/// configuration, 1 on failure.
pub fn main_from_env() -> ExitCode {
    init_logging();
    let database = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    let (count, rate) = match (number("ORDERS", 100), number("ORDERS_PER_SECOND", 0)) {
        (Ok(c), Ok(r)) => (c, r),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("order-service: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("order-service: {e}");
            return ExitCode::from(1);
        }
    };
    let result: Result<u64, Box<dyn std::error::Error>> = runtime.block_on(async move {
        let pool = PgPoolOptions::new().max_connections(4).connect(&database).await?;
        let outbox = Outbox::default_ref().clone();
        outbox.migrator().run(&pool).await?;
        orders::MIGRATOR.run(&pool).await?;
        let pause = if rate == 0 { Duration::ZERO } else { Duration::from_secs_f64(1.0 / rate as f64) };
        let mut confirmed = 0;
        for i in 0..count {
            let order = NewOrder {
                customer_id: Uuid::now_v7(),
                lines: vec![OrderLine { sku: format!("sku-{}", i % 7), quantity: 1 }],
                total_cents: 500 + i as i64,
                currency: "EUR".into(),
                payment: Payment::Card { last4: "4242".into() },
            };
            // A place whose commit was cut off and did commit leaves an order that is never
            // confirmed; the retry places a new one.
            let id = with_retries("place", || orders::place(&pool, &outbox, &order)).await?;
            let (a, b) = tokio::join!(
                with_retries("confirm", || orders::confirm(&pool, &outbox, id)),
                with_retries("confirm", || orders::confirm(&pool, &outbox, id))
            );
            confirmed += [a?, b?].iter().filter(|c| matches!(c, Confirmed::Now { .. })).count() as u64;
            tokio::time::sleep(pause).await;
        }
        Ok(confirmed)
    });
    match result {
        Ok(confirmed) => {
            println!("confirmed {confirmed}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("order-service: {e}");
            ExitCode::from(1)
        }
    }
}
