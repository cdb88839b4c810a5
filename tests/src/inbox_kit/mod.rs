//! What the inbox's integration tests share: an inbox running in the test ([`Running`]),
//! and two set-ups with their handlers: [`credits`] (a `credits` table, records produced
//! through rdkafka) for `tests/tests/inbox.rs` and `inbox_operator.rs`, and [`effects`]
//! (an `effects` table, records produced raw) for `inbox_robust.rs`, `inbox_neighbours.rs`
//! and `inbox_batches.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_runtime::inbox::InboxStats;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub mod credits;
pub mod effects;

/// An inbox running in the test's runtime, started by `credits::start` or `effects::start`.
#[derive(Debug)]
pub struct Running {
    /// Cancels the inbox.
    pub stop: CancellationToken,
    /// Its task.
    pub task: JoinHandle<outbox_runtime::Result<()>>,
    /// Its counters.
    pub stats: Arc<InboxStats>,
}

impl Running {
    /// Cancels the inbox and checks that `run()` ends cleanly within 30 s; returns how long
    /// it took.
    pub async fn shutdown(self) -> Duration {
        let asked = Instant::now();
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("run() returns after cancel")
            .expect("the inbox task does not panic")
            .expect("run() ends without an error");
        asked.elapsed()
    }
}
