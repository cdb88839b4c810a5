//! `outbox relay --schema-registry`: the schema ids resolved before anything is published,
//! and what the command says when they cannot be.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::PgPool;

mod common;

use common::{append_pings, database_url};

/// `outbox relay --schema-registry` resolves every schema id before anything is
/// published: a registry that does not answer is exit 3 naming it, a directory without
/// committed schemas exit 2 naming it, a URL with credentials exit 2 without printing
/// them, and the framing flags without a registry are refused. No relay starts meanwhile.
#[sqlx::test(migrations = false)]
async fn relay_resolves_schema_ids_before_publishing_and_names_what_failed(pool: PgPool) {
    append_pings(&pool, &["framed-0".to_owned()]).await;
    let url = database_url(&pool);
    // A relay that got past resolving would run until stopped: give each a minute, then
    // stop it and say so.
    let relay = |args: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(["--database-url", &url, "relay", "--brokers", "127.0.0.1:1"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run");
        let started = Instant::now();
        while child.try_wait().expect("wait").is_none() {
            if started.elapsed() > Duration::from_secs(60) {
                child.kill().ok();
                child.wait().ok();
                return (None, format!("the relay started with {args:?}: still running after 60 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().expect("output");
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let schemas = concat!(env!("CARGO_MANIFEST_DIR"), "/../schemas");
    let (code, err) = relay(&["--schema-registry", "http://127.0.0.1:1", "--schemas", schemas]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("http://127.0.0.1:1") && err.contains("unreachable"), "{err}");

    let empty = std::env::temp_dir().join(format!("outbox-no-schemas-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("empty dir");
    let (code, err) =
        relay(&["--schema-registry", "http://127.0.0.1:1", "--schemas", &empty.display().to_string()]);
    std::fs::remove_dir_all(&empty).ok();
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no committed schemas") && err.contains("outbox-no-schemas"), "{err}");

    let (code, err) = relay(&["--schema-registry", "http://key:s3cr3t@127.0.0.1:1", "--schemas", schemas]);
    assert_eq!(code, Some(2), "{err}");
    assert!(!err.contains("s3cr3t") && err.contains("OUTBOX_SCHEMA_REGISTRY_USER"), "{err}");

    let (code, err) = relay(&["--schema-id-form", "header"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--schema-registry"), "{err}");

    // A relay that starts says so in the relays table before it claims anything.
    let started: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_relays").fetch_one(&pool).await.expect("count");
    assert_eq!(started, 0, "no relay started");
    let untouched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE attempts = 0 AND published_at IS NULL AND failed_at IS NULL",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(untouched, 1, "nothing was claimed or sent");
}
