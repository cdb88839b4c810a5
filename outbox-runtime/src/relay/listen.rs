//! LISTEN for the outbox's NOTIFY, so that a relay wakes when an append commits.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::warn;

pub(super) async fn listen(pool: PgPool, channel: String, wake: Arc<Notify>, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(error) => {
                warn!(stage = "listen", %error, "cannot connect the NOTIFY listener; polling meanwhile");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    () = shutdown.cancelled() => return,
                }
            }
        };
        if let Err(error) = listener.listen(&channel).await {
            warn!(stage = "listen", %error, "LISTEN failed; polling meanwhile");
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                () = shutdown.cancelled() => return,
            }
        }
        loop {
            tokio::select! {
                received = listener.try_recv() => match received {
                    Ok(_) => wake.notify_one(), // a notification, or a reconnect after which we may have missed some
                    Err(error) => {
                        warn!(stage = "listen", %error, "NOTIFY listener failed; reconnecting");
                        break;
                    }
                },
                () = shutdown.cancelled() => return,
            }
        }
    }
}
