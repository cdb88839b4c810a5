//! The PostgreSQL server of tests and of `cargo xtask demo`, `chaos` and `bench`:
//! `DATABASE_URL`, or the local default; and databases of their own on it.

use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

use crate::Failure;

/// `DATABASE_URL`, or the local server's `test` database
/// ([`DEFAULT_DATABASE_URL`](outbox_examples::relay_process::DEFAULT_DATABASE_URL), the
/// examples' default).
pub fn base_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| outbox_examples::relay_process::DEFAULT_DATABASE_URL.to_owned())
}

/// The URL of database `name` on the server of [`base_url`].
pub fn url_of(name: &str) -> String {
    let base = base_url();
    let server = base.rsplit_once('/').map_or(base.as_str(), |(server, _)| server);
    format!("{server}/{name}")
}

/// The URL of the database `pool` is connected to (for child processes).
pub fn database_url(pool: &PgPool) -> String {
    url_of(pool.connect_options().get_database().unwrap_or("test"))
}

/// Recreates each database of `names` on the server of [`base_url`] (dropping it first,
/// with its connections), so that a repeated run starts from nothing; returns their URLs.
pub async fn fresh_databases<const N: usize>(names: [&str; N]) -> Result<[String; N], Failure> {
    let base = base_url();
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&base)
        .await
        .map_err(|e| format!("PostgreSQL at {base}: {e}"))?;
    for name in names {
        sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")))
            .execute(&admin)
            .await?;
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{name}\""))).execute(&admin).await?;
    }
    admin.close().await;
    Ok(names.map(url_of))
}
