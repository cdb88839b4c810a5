//! Graceful stop on SIGTERM or Ctrl-C (feature `signal`), for relay and consumer processes.

/// Waits for SIGTERM or Ctrl-C (Ctrl-C only where there are no Unix signals).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Cancels `token` on SIGTERM or Ctrl-C, from a task of the current runtime.
pub fn cancel_on_signal(token: tokio_util::sync::CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        shutdown_signal().await;
        token.cancel();
    })
}
