//! `outbox broker`: a dev broker other processes can reach, stopped cleanly by SIGTERM, and
//! the failure drill the book describes (a topic that does not exist) done against it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_runtime::rdkafka::consumer::{BaseConsumer, Consumer};
use outbox_runtime::rdkafka::ClientConfig;
use sqlx::PgPool;

mod common;

use common::{append_pings, database_url};

#[test]
fn dev_broker_serves_its_topics_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tmp");
    let addr_file = dir.path().join("addr");
    // An earlier run's address is not taken for this one's.
    std::fs::write(&addr_file, "127.0.0.1:1").expect("stale file");
    let broker = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .env_remove("DATABASE_URL")
        .args(["broker", "--topic", "orders:3", "--topic", "audit", "--addr-file"])
        .arg(&addr_file)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start broker");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&addr_file).map_or(true, |a| a == "127.0.0.1:1")
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let bootstrap = std::fs::read_to_string(&addr_file).expect("the broker wrote its address");
    assert!(bootstrap.starts_with("127.0.0.1:"), "{bootstrap}");

    let consumer: BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", &bootstrap).create().expect("client");
    let metadata =
        consumer.fetch_metadata(None, Duration::from_secs(10)).expect("metadata from another process");
    let partitions =
        |name: &str| metadata.topics().iter().find(|t| t.name() == name).map(|t| t.partitions().len());
    assert_eq!(partitions("orders"), Some(3));
    assert_eq!(partitions("audit"), Some(6));

    let status = Command::new("kill").args(["-TERM", &broker.id().to_string()]).status().expect("kill");
    assert!(status.success());
    let exit = broker.wait_with_output().expect("wait");
    assert_eq!(exit.status.code(), Some(0), "SIGTERM stops it cleanly");
    let said = String::from_utf8_lossy(&exit.stdout);
    assert!(said.contains(&format!("export KAFKA_BROKERS={bootstrap}")), "{said}");
    assert!(said.contains("topics: orders (3 partitions), audit (6 partitions)"), "{said}");
    assert!(!addr_file.exists(), "the address goes with the broker");
}

#[test]
fn bad_topic_spec_exits_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .env_remove("DATABASE_URL")
        .args(["broker", "--topic", "orders:many"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--topic \"orders:many\": partitions must be a number")
    );
}

/// `outbox broker --help` lists the broker's own flags, not the outbox's database and
/// capacity flags it has no use for (they were listed, `--database-url` as required).
#[test]
fn broker_help_lists_only_its_own_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox")).args(["broker", "--help"]).output().expect("help");
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for own in ["--topic", "--brokers", "--addr-file"] {
        assert!(help.contains(own), "{own} in {help}");
    }
    for foreign in ["--database-url", "--schema", "--table", "--capacity-rows", "--capacity-bytes"] {
        assert!(!help.contains(foreign), "{foreign} in {help}");
    }
    // Other commands keep them.
    let status =
        Command::new(env!("CARGO_BIN_EXE_outbox")).args(["status", "--help"]).output().expect("help");
    assert!(String::from_utf8_lossy(&status.stdout).contains("--database-url"));
}

/// Starts `outbox broker args...` and waits for the address it writes to `addr_file`.
fn start_broker(args: &[&str], addr_file: &Path) -> (Child, String) {
    let broker = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .env_remove("DATABASE_URL")
        .arg("broker")
        .args(args)
        .arg("--addr-file")
        .arg(addr_file)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start broker");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !addr_file.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    (broker, std::fs::read_to_string(addr_file).expect("the broker wrote its address"))
}

/// The drill: the dev broker creates a topic on a client's first metadata request for it,
/// as a cluster with `auto.create.topics.enable` does, so a relay there never meets a
/// missing topic. With `--kafka-setting allow.auto.create.topics=false` it does, and the
/// event waits for the topic, then fails after `--missing-topic-timeout` with a reason
/// that names the topic (seen before the flag existed: no way to pass the setting).
#[sqlx::test(migrations = false)]
async fn the_missing_topic_drill_fails_an_event_on_the_dev_broker(pool: PgPool) {
    let refused = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args([
            "--database-url",
            "postgres://nowhere/x",
            "relay",
            "--brokers",
            "b:9092",
            "--kafka-setting",
            "acks",
        ])
        .output()
        .expect("run");
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("expected KEY=VALUE"), "{refused:?}");

    let dir = tempfile::tempdir().expect("tmp");
    let (broker, bootstrap) = start_broker(&[], &dir.path().join("addr"));
    let [event] = append_pings(&pool, &["drill".to_owned()]).await[..] else { panic!("one event") };
    let relay = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--database-url")
        .arg(database_url(&pool))
        .args(["relay", "--brokers", &bootstrap, "--poll-interval", "100ms", "--missing-topic-timeout", "2s"])
        .args(["--kafka-setting", "allow.auto.create.topics=false"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("relay");
    let state = || async {
        sqlx::query_as::<_, (String, Option<String>)>(
            "SELECT status, last_error FROM outbox WHERE event_id = $1",
        )
        .bind(event)
        .fetch_one(&pool)
        .await
        .expect("the event")
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while state().await.0 == "pending" && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for child in [&relay, &broker] {
        let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
        assert!(killed.success());
    }
    let out =
        tokio::task::spawn_blocking(move || relay.wait_with_output()).await.expect("join").expect("wait");
    let log = String::from_utf8_lossy(&out.stderr);
    let (status, reason) = state().await;
    assert_eq!(status, "failed", "{log}");
    let reason = reason.unwrap_or_default();
    assert!(reason.contains("test") && reason.contains("does not exist"), "{reason}\n{log}");
    assert_eq!(out.status.code(), Some(0), "{log}");
    let broker =
        tokio::task::spawn_blocking(move || broker.wait_with_output()).await.expect("join").expect("wait");
    assert_eq!(broker.status.code(), Some(0));
}
