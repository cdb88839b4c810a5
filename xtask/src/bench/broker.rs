//! The broker a run talks to, from the test kit (`outbox_tests::kafka`): `KAFKA_BROKERS`, a
//! Tansu process the bench starts (as `KAFKA_BROKERS`), or librdkafka's in-process mock
//! cluster.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use outbox_tests::kafka::Kafka;

use super::Failure;

/// The broker the run talks to.
pub(super) struct Broker {
    kafka: Kafka,
    pub(super) kind: &'static str,
    pub(super) description: String,
}

/// A Tansu broker started for the run; killed when dropped.
pub(super) struct Tansu {
    child: Child,
    _dir: tempfile::TempDir,
    version: String,
    bootstrap: String,
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16, Failure> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Without `KAFKA_BROKERS`, a Tansu broker when `tansu` is installed, made the broker of
/// `KAFKA_BROKERS` for this process. Called before the process starts any other thread,
/// which setting a variable needs.
pub(super) fn start_tansu() -> Result<Option<Tansu>, Failure> {
    if std::env::var("KAFKA_BROKERS").is_ok_and(|b| !b.trim().is_empty()) {
        return Ok(None);
    }
    let Ok(version) = std::process::Command::new("tansu").arg("--version").output() else {
        return Ok(None);
    };
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
    let bootstrap = format!("127.0.0.1:{port}");
    let tansu = Tansu { child, _dir: dir, version, bootstrap };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&tansu.bootstrap).is_err() {
        if Instant::now() > deadline {
            return Err("the tansu broker the bench started does not listen".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::env::set_var("KAFKA_BROKERS", &tansu.bootstrap);
    Ok(Some(tansu))
}

/// The run's broker: `KAFKA_BROKERS` (the `tansu` started by [`start_tansu`], if it was),
/// else, loudly, the mock cluster.
pub(super) fn broker(tansu: Option<&Tansu>) -> Result<Broker, Failure> {
    let kafka = Kafka::try_start()?;
    if !kafka.is_mock() {
        let (kind, description) = match tansu {
            Some(t) => {
                ("tansu", format!("{} on {}, SQLite storage, started by the bench", t.version, t.bootstrap))
            }
            None => ("external", format!("KAFKA_BROKERS={} (a broker process)", kafka.bootstrap())),
        };
        return Ok(Broker { kafka, kind, description });
    }
    eprintln!(
        "bench: WARNING: KAFKA_BROKERS is not set and tansu is not installed; using librdkafka's in-process \
         mock cluster, which is far faster than a real broker and flatters the producer baseline"
    );
    Ok(Broker::mock(kafka))
}

/// librdkafka's in-process mock cluster: where the inbox is measured, so that the figure is
/// the inbox's own speed rather than a slow broker's fetch rate (Tansu fetches about 400
/// records/s, and in some runs served a new consumer group nothing at all).
pub(super) fn mock_broker() -> Result<Broker, Failure> {
    Ok(Broker::mock(Kafka::try_mock()?))
}

impl Broker {
    fn mock(kafka: Kafka) -> Broker {
        let description = format!("librdkafka mock cluster on {} (in-process)", kafka.bootstrap());
        Broker { kafka, kind: "mock", description }
    }

    pub(super) fn bootstrap(&self) -> &str {
        self.kafka.bootstrap()
    }

    pub(super) async fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), Failure> {
        self.kafka.try_create_topic(topic, partitions).await
    }
}
