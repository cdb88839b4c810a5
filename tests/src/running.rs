//! A relay running in the test's runtime, stopped and checked at the end.

use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::relay::{Relay, RelayConfig, RelayStats};
use outbox_runtime::Outbox;
use sqlx::PgPool;

use crate::kafka::Kafka;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A relay started by [`start`].
#[derive(Debug)]
pub struct Running {
    /// Cancels the relay.
    pub stop: CancellationToken,
    /// Its task.
    pub task: JoinHandle<outbox_runtime::Result<()>>,
    /// Its counters.
    pub stats: Arc<RelayStats>,
}

impl Running {
    /// Cancels the relay and checks that it stops cleanly within 20 s; returns its counters.
    pub async fn shutdown(self) -> Arc<RelayStats> {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("relay stops within 20 s")
            .expect("relay task")
            .expect("relay ends cleanly");
        self.stats
    }
}

/// Settings that keep tests quick: short leases, timeouts and backoff.
pub fn quick(kafka: &Kafka) -> RelayConfig {
    RelayConfig::new(kafka.bootstrap())
        .poll_interval(Duration::from_millis(200))
        .lease_ttl(Duration::from_secs(6))
        .message_timeout(Duration::from_secs(2))
        .backoff(Duration::from_millis(200), Duration::from_secs(2))
}

/// Starts a relay of `outbox` on `pool` with `config`.
pub fn start(pool: &PgPool, outbox: &Outbox, config: RelayConfig) -> Running {
    let relay = Relay::new(pool.clone(), outbox.clone(), config).expect("relay");
    let stats = relay.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    Running { stop, task, stats }
}
