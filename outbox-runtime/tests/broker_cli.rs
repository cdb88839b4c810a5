//! `outbox broker`: a dev broker other processes can reach, stopped cleanly by SIGTERM.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use outbox_runtime::rdkafka::consumer::{BaseConsumer, Consumer};
use outbox_runtime::rdkafka::ClientConfig;

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
