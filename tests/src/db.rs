//! The PostgreSQL server of tests and of `cargo xtask demo`, `chaos` and `bench`:
//! `DATABASE_URL`, or the local default; databases of their own on it, or on a server of
//! the tests' own ([`pg_server`](crate::pg_server)) for what it lacks.

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
    format!("{}/{name}", crate::pg_server::server_of(&base))
}

/// The URL of the database `pool` is connected to (for child processes), on the main
/// server or on a server of the tests' own.
pub fn database_url(pool: &PgPool) -> String {
    let options = pool.connect_options();
    let name = options.get_database().unwrap_or("test");
    if crate::pg_server::is_cluster_port(options.get_host(), options.get_port()) {
        format!("postgres://postgres@127.0.0.1:{}/{name}", options.get_port())
    } else {
        url_of(name)
    }
}

/// Recreates each database of `names` on the server of [`base_url`] (dropping it first,
/// with its connections), so that a repeated run starts from nothing; returns their URLs.
pub async fn fresh_databases<const N: usize>(names: [&str; N]) -> Result<[String; N], Failure> {
    fresh_databases_on(crate::pg_server::server_of(&base_url()), names).await
}

/// [`fresh_databases`] on the server at `server` (a URL without its database); the
/// replication slots of a database dropped are dropped with it (a slot left by an earlier
/// run that died would keep it from being dropped).
pub async fn fresh_databases_on<const N: usize>(
    server: &str,
    names: [&str; N],
) -> Result<[String; N], Failure> {
    let admin_url = format!("{server}/postgres");
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&admin_url)
        .await
        .map_err(|e| format!("PostgreSQL at {admin_url}: {e}"))?;
    for name in names {
        // Waits (up to 5 s) for each to end: an active slot cannot be dropped.
        sqlx::query(
            "SELECT pg_terminate_backend(active_pid, 5000) FROM pg_replication_slots \
             WHERE database = $1 AND active_pid IS NOT NULL",
        )
        .bind(name)
        .execute(&admin)
        .await?;
        sqlx::query(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1",
        )
        .bind(name)
        .execute(&admin)
        .await?;
        sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")))
            .execute(&admin)
            .await?;
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{name}\""))).execute(&admin).await?;
    }
    admin.close().await;
    Ok(names.map(|name| format!("{server}/{name}")))
}

/// A database of the calling test's own on the server at `server`, recreated empty, named
/// after the test binary and the test (the thread libtest runs it on) so that a repeated
/// run replaces it instead of adding one; a pool of 5 connections on it, as
/// `#[sqlx::test]` gives.
pub async fn test_database(server: &str) -> PgPool {
    // `cdc-0123abcd` for tests/cdc.rs.
    let binary = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.file_stem()?.to_str()?.rsplit_once('-')?.0.to_owned()))
        .unwrap_or_default();
    // libtest names each test's thread after it; elsewhere (`main` with --test-threads=1
    // on some platforms, a runtime's worker) a name of this call's own.
    let thread = std::thread::current().name().map(str::to_owned);
    let test = match thread {
        Some(name) if name != "main" && !name.starts_with("tokio-") => format!("{binary}::{name}"),
        _ => format!("{binary}::{}", uuid::Uuid::new_v4().simple()),
    };
    let name = test_database_name(&test);
    let [url] =
        fresh_databases_on(server, [name.as_str()]).await.unwrap_or_else(|e| panic!("database {name}: {e}"));
    PgPoolOptions::new()
        .max_connections(5)
        .idle_timeout(Some(std::time::Duration::from_secs(1)))
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// `outbox_t_` and the test's name, within PostgreSQL's 63 bytes: a long name is cut and
/// ends with a hash of the whole, so that two tests never share a database.
fn test_database_name(test: &str) -> String {
    let clean: String =
        test.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
    let name = format!("outbox_t_{clean}");
    if name.len() <= 63 {
        return name;
    }
    // FNV-1a: stable across runs and builds, unlike std's hasher.
    let hash = test
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("{}_{hash:016x}", &name[..46])
}

#[cfg(test)]
mod tests {
    use super::test_database_name;

    #[test]
    fn test_database_names_fit_and_differ() {
        assert_eq!(test_database_name("cdc::a_test"), "outbox_t_cdc__a_test");
        let long = "x".repeat(80);
        let (a, b) = (test_database_name(&format!("{long}a")), test_database_name(&format!("{long}b")));
        assert_eq!(a.len(), 63);
        assert_ne!(a, b, "names cut at the same place still differ");
    }
}
