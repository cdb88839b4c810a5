//! [`CdcRelay::run`]: waits for the slot (a standby while another process streams), then
//! runs a session: the reader, the publisher and the table path, until shutdown or until
//! the stream fails (connected again with backoff) or cannot go on (an error).

use std::sync::Arc;
use std::time::Duration;

use pgwire_replication::{Lsn, ReplicationClient};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, error, info, warn};

use super::publisher::Publisher;
use super::stream::{self, Ended, Feed};
use super::CdcRelay;
use crate::backoff;
use crate::error::{Error, Result};
use crate::relay::{publish, Relay};

/// Items the reader may hold ahead of the publisher (the memory budget bounds their bytes).
const CHANNEL: usize = 8192;

/// How long the table path may take to stop at the end of a session.
const TABLE_PATH_STOP: Duration = Duration::from_secs(30);

impl CdcRelay {
    /// Streams until `shutdown` is cancelled, then finishes what is in flight (bounded by
    /// the message timeout), reports the last confirmed position and returns.
    ///
    /// # Errors
    /// At start, [`Error::NotMigrated`] or [`Error::MigrationsBehind`] for the outbox's
    /// tables and [`Error::Config`] when `wal_level`, the slot or the publication is not
    /// as [`CdcConfig::setup`](super::CdcConfig::setup) leaves them. While running,
    /// [`Error::Replication`] when the slot is dropped or lost, or the stream cannot be
    /// read; a connection or server that fails is connected to again with backoff.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        match self.outbox.check_migrated_for_relay(&self.pool, self.config.cleanup.is_some()).await {
            Err(error @ (Error::NotMigrated { .. } | Error::MigrationsBehind { .. })) => return Err(error),
            Err(error) => {
                warn!(slot = %self.cdc.slot, %error, "cannot check the outbox's migrations; going on")
            }
            Ok(()) => {}
        }
        self.cdc.check(&self.pool, &self.outbox).await?;
        let mut failures: u32 = 0;
        let mut standby = false;
        while !shutdown.is_cancelled() {
            let ended = match self.session(&shutdown).await {
                Ok(()) => break,
                Err(ended) => ended,
            };
            let delay = match ended {
                Ended::Fatal(error) => {
                    error!(slot = %self.cdc.slot, stage = "stream", %error, "change data capture stopped");
                    return Err(error);
                }
                Ended::Busy(reason) => {
                    failures = 0;
                    metrics::gauge!(crate::metrics::CDC_STANDBY).set(1.0);
                    if !standby {
                        info!(slot = %self.cdc.slot, stage = "standby", %reason, every = ?self.cdc.takeover_interval,
                              "another relay streams from the slot: standing by to take over when it stops");
                    } else {
                        debug!(slot = %self.cdc.slot, stage = "standby", %reason, "the slot is still in use");
                    }
                    standby = true;
                    self.cdc.takeover_interval
                }
                Ended::Transient(reason) => {
                    failures += 1;
                    metrics::counter!(crate::metrics::CDC_RECONNECTS).increment(1);
                    // A slot dropped or lost meanwhile is an error, not something to retry.
                    match self.cdc.check(&self.pool, &self.outbox).await {
                        Err(error @ Error::Config(_)) => {
                            let error =
                                Error::Replication(format!("the stream ended ({reason}), and now {error}"));
                            error!(slot = %self.cdc.slot, stage = "stream", %error, "change data capture stopped");
                            return Err(error);
                        }
                        Err(error @ Error::Replication(_)) => {
                            error!(slot = %self.cdc.slot, stage = "stream", %error, "change data capture stopped");
                            return Err(error);
                        }
                        _ => {}
                    }
                    let delay = backoff::delay(self.config.backoff_base, self.config.backoff_max, failures);
                    warn!(slot = %self.cdc.slot, stage = "stream", %reason, attempt = failures, retry_in = ?delay,
                          "the replication stream failed; connecting again (what was not confirmed is sent again)");
                    delay
                }
            };
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = shutdown.cancelled() => {}
            }
        }
        info!(slot = %self.cdc.slot, published = self.stats.published(), "change data capture relay stopped");
        Ok(())
    }

    /// One session on the slot: `Ok` after shutdown, otherwise why it ended.
    async fn session(&self, shutdown: &CancellationToken) -> std::result::Result<(), Ended> {
        let connection = stream::connection(&self.cdc).map_err(Ended::Fatal)?;
        let mut client =
            ReplicationClient::connect(connection).await.map_err(|e| stream::ended(&e, &self.cdc.slot))?;
        match tokio::time::timeout(self.cdc.connect_timeout, client.wait_started()).await {
            Err(_) => {
                client.abort();
                return Err(Ended::Transient(format!(
                    "the replication stream did not start within {:?}",
                    self.cdc.connect_timeout
                )));
            }
            Ok(Err(error)) => return Err(stream::ended(&error, &self.cdc.slot)),
            Ok(Ok(())) => {}
        }
        metrics::gauge!(crate::metrics::CDC_STANDBY).set(0.0);
        info!(slot = %self.cdc.slot, publication = %self.cdc.publication, stage = "stream",
              "streaming the outbox's inserts from the replication slot");

        let stop = shutdown.child_token();
        let table_path = Relay::new(self.pool.clone(), self.outbox.clone(), self.config.clone())
            .map_err(Ended::Fatal)?
            .table_path(self.stats.clone());
        // Dropped with the session (its future dropped): the tasks end with it.
        let table_path = AbortOnDropHandle::new(tokio::spawn(table_path.run(stop.clone())));
        let mut gauges = AbortOnDropHandle::new(tokio::spawn(super::gauges::record(
            self.pool.clone(),
            self.cdc.clone(),
            stop.clone(),
        )));
        let producer =
            publish::producer(&self.config.brokers, &self.config.producer).map_err(Ended::Fatal)?;
        let (items, received) = mpsc::channel(CHANNEL);
        let (confirm, confirmed) = watch::channel(0);
        let budget = Arc::new(Semaphore::new(self.cdc.max_buffered_bytes.min(Semaphore::MAX_PERMITS)));
        let max_bytes = self.cdc.max_buffered_bytes.min(u32::MAX as usize);
        let publisher = Publisher::new(
            self.pool.clone(),
            self.outbox.names(),
            self.config.clone(),
            producer,
            self.stats.clone(),
        );
        let publishing = AbortOnDropHandle::new(tokio::spawn(publisher.run(received, confirm, stop.clone())));
        let names = self.outbox.names();
        let feed = Feed { items, confirmed, budget, max_bytes };
        let mut table_path = Some(table_path);
        // The table path ending by itself ends the session: handed-over events would wait.
        // So does the server shutting down, seen on the gauges' connections: a reader
        // waiting for room in the budget would not see the server's last request.
        let read = tokio::select! {
            Ok(Some(reason)) = &mut gauges => Err(Ended::Transient(reason)),
            read = stream::read(&mut client, (&names.schema, &names.table), &self.cdc.slot, feed, &stop) => read,
            ended = async { table_path.as_mut().expect("running").await } => {
                table_path = None;
                let reason = match ended {
                    Ok(Ok(())) => "the table path stopped".to_owned(),
                    Ok(Err(error)) => format!("the table path stopped: {error}"),
                    Err(error) => format!("the table path panicked: {error}"),
                };
                Err(Ended::Transient(reason))
            }
        };
        stop.cancel();
        let failed = read.is_err();
        if failed {
            // The stream is over: close it before waiting for the publisher's last batch (up
            // to the message timeout, and its marks on a database that may be stopping). A
            // walsender whose client stays connected without confirming holds PostgreSQL's
            // shutdown; what was not confirmed is streamed again next time.
            client.abort();
        }
        let published = match publishing.await {
            Ok(result) => result,
            Err(error) => Err(Ended::Transient(format!("the publisher panicked: {error}"))),
        };
        if !failed {
            if let Ok(last) = &published {
                self.report_last(&client, *last).await;
            }
            if tokio::time::timeout(Duration::from_secs(5), client.shutdown()).await.is_err() {
                client.abort();
            }
        }
        let Some(table_path) = table_path else {
            read?;
            return published.map(|_| ());
        };
        match tokio::time::timeout(TABLE_PATH_STOP, table_path).await {
            Ok(Ok(Err(error))) => {
                warn!(slot = %self.cdc.slot, stage = "table_path", %error, "the table path stopped")
            }
            Ok(Err(error)) => {
                warn!(slot = %self.cdc.slot, stage = "table_path", %error, "the table path panicked")
            }
            Err(_) => {
                warn!(slot = %self.cdc.slot, stage = "table_path", "the table path did not stop in time")
            }
            Ok(Ok(Ok(()))) => {}
        }
        read?;
        published.map(|_| ())
    }

    /// Reports `last` and waits (a little) until the client has sent it: stopping sends no
    /// final status of its own, and a position not reported is streamed again next time.
    async fn report_last(&self, client: &ReplicationClient, last: u64) {
        if last == 0 {
            return;
        }
        client.update_applied_lsn(Lsn(last));
        let metrics = client.metrics();
        let deadline =
            tokio::time::Instant::now() + self.cdc.status_interval * 2 + Duration::from_millis(500);
        while metrics.last_applied_lsn() < Lsn(last) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        debug!(slot = %self.cdc.slot, confirmed = %Lsn(last), reported = %metrics.last_applied_lsn(), "last position reported");
    }
}
