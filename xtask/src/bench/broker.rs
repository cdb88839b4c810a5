//! The broker a run talks to: `KAFKA_BROKERS`, a Tansu process the bench starts, or
//! librdkafka's in-process mock cluster; and creating the benchmarks' topics on it.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::mocking::MockCluster;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

use super::Failure;

/// The broker the run talks to, and what to stop at the end.
pub(super) struct Broker {
    pub(super) bootstrap: String,
    pub(super) kind: &'static str,
    pub(super) description: String,
    _mock: Option<MockCluster<'static, rdkafka::producer::DefaultProducerContext>>,
    _tansu: Option<TansuProcess>,
}

/// A Tansu broker started for the run; killed when dropped.
struct TansuProcess {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for TansuProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16, Failure> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(super) async fn broker() -> Result<Broker, Failure> {
    if let Ok(bootstrap) = std::env::var("KAFKA_BROKERS") {
        if !bootstrap.is_empty() {
            let description = format!("KAFKA_BROKERS={bootstrap} (a broker process)");
            return Ok(Broker { bootstrap, kind: "external", description, _mock: None, _tansu: None });
        }
    }
    if let Ok(version) = std::process::Command::new("tansu").arg("--version").output() {
        let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let url = format!("tcp://127.0.0.1:{port}");
        let child = std::process::Command::new("tansu")
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
            .args(["--storage-engine", "sqlite://tansu.db"])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let process = TansuProcess { child, _dir: dir };
        let bootstrap = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&bootstrap).is_err() {
            if Instant::now() > deadline {
                return Err("the tansu broker the bench started does not listen".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let description = format!("{version} on {bootstrap}, SQLite storage, started by the bench");
        return Ok(Broker { bootstrap, kind: "tansu", description, _mock: None, _tansu: Some(process) });
    }
    eprintln!(
        "bench: WARNING: KAFKA_BROKERS is not set and tansu is not installed; using librdkafka's in-process \
         mock cluster, which is far faster than a real broker and flatters the producer baseline"
    );
    mock_broker()
}

/// librdkafka's in-process mock cluster: where the inbox is measured, so that the figure is
/// the inbox's own speed rather than a slow broker's fetch rate (Tansu fetches about 400
/// records/s, and in some runs served a new consumer group nothing at all).
pub(super) fn mock_broker() -> Result<Broker, Failure> {
    let mock = MockCluster::new(1)?;
    let bootstrap = mock.bootstrap_servers();
    Ok(Broker {
        bootstrap: bootstrap.clone(),
        kind: "mock",
        description: format!("librdkafka mock cluster on {bootstrap} (in-process)"),
        _mock: Some(mock),
        _tansu: None,
    })
}

impl Broker {
    pub(super) async fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), Failure> {
        if let Some(mock) = &self._mock {
            mock.create_topic(topic, partitions, 1)?;
            return Ok(());
        }
        let admin: AdminClient<DefaultClientContext> =
            ClientConfig::new().set("bootstrap.servers", &self.bootstrap).create()?;
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let topics = [NewTopic::new(topic, partitions, TopicReplication::Fixed(1))];
        for result in admin.create_topics(&topics, &options).await? {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => return Err(format!("cannot create topic {name}: {code:?}").into()),
            }
        }
        Ok(())
    }
}
