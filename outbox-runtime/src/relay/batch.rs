//! One batch: chains of an aggregate's rows sent in order, their delivery reports judged
//! in order, and the marks that record the outcome of every row.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rdkafka::producer::DeliveryFuture;
use sqlx::PgPool;
use tracing::{debug, info_span, warn, Instrument};
use uuid::Uuid;

use super::claim::{Placement, Row, Statements};
use super::flight::Flight;
use super::mark::{Fence, Marked, Marks};
use super::publish::{self, Sent};
use super::topics::{Verdict, MISSING_CODE};
use super::{Relay, RelayStats};
use crate::backoff;

/// How long a record may still wait after its batch's purge before the producer is purged
/// again, and how many times.
const REPURGE_AFTER: Duration = Duration::from_secs(1);
const REPURGES: u32 = 5;

/// The least time between two warnings about transient publish failures.
const TRANSIENT_WARN_EVERY: Duration = Duration::from_secs(10);

/// What one batch came to.
#[derive(Debug, Default)]
pub(super) struct BatchOutcome {
    pub(super) rows: usize,
    pub(super) acked: usize,
    pub(super) transient: usize,
}

impl Relay {
    /// Publishes one batch and records the outcome of every row.
    pub(super) async fn process(&mut self, rows: Vec<Row>, margin: Duration) -> BatchOutcome {
        let span = info_span!("relay_batch", relay_id = %self.id(), rows = rows.len());
        // In flight from the claim until the mark is written (or has failed).
        let flight = Flight::new(&self.stats, rows.iter().map(|r| r.topic.as_str()));
        async {
            let started = Instant::now();
            let (outcome, marks) = self.send(rows, Some(margin)).await;
            let (partitions, tokens) = self.leases.fence();
            let fence = Fence { relay_id: self.id(), partitions, tokens };
            // The previous batch's mark goes first: marks are written in batch order.
            self.finish_marking().await;
            let recorder = Recorder {
                sql: self.sql.clone(),
                pool: self.pool.clone(),
                stats: self.stats.clone(),
                relay_id: self.id(),
                failures: self.mark_failures.clone(),
            };
            if marks.retry.is_empty() && marks.failed.is_empty() {
                // Every row was acknowledged: no later row of these aggregates waits on this
                // mark, so the next batch is claimed (without these rows) and sent while it
                // is written. A crash before it commits republishes them: duplicates only.
                let ids = marks.published.iter().map(|(id, _)| *id).collect();
                let task = self.tasks.spawn(
                    async move {
                        recorder.record(&marks, &fence).await;
                        drop(flight);
                    }
                    .in_current_span(),
                );
                self.marking = Some((ids, task));
            } else {
                // A retry or failure mark must be written before the next claim: it is what
                // holds the aggregate's later events back.
                recorder.record(&marks, &fence).await;
                drop(flight);
            }
            self.renew_producer_if_fatal();
            metrics::histogram!(crate::metrics::BATCH_SECONDS).record(started.elapsed().as_secs_f64());
            outcome
        }
        .instrument(span)
        .await
    }

    /// Replaces a producer that hit a fatal error (an idempotence sequence broken beyond
    /// repair) before the next batch.
    pub(super) fn renew_producer_if_fatal(&mut self) {
        if let Some(reason) = publish::fatal(&self.producer) {
            warn!(relay_id = %self.id(), stage = "publish", %reason, "producer fatal error; creating a new producer");
            match publish::producer(&self.config.brokers, &self.config.producer) {
                Ok(producer) => self.producer = producer,
                Err(error) => warn!(relay_id = %self.id(), %error, "cannot create a producer"),
            }
        }
    }

    /// Sends a batch's chains and judges every row's outcome into the marks that record it.
    /// With a `margin`, a row is sent only while its partition's lease has that long left;
    /// without, the caller holds the partitions' locks for the whole send.
    pub(super) async fn send(&mut self, rows: Vec<Row>, margin: Option<Duration>) -> (BatchOutcome, Marks) {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.topics
            .check(&self.producer, rows.iter().map(|r| r.topic.as_str()), self.config.message_timeout / 2)
            .await;
        metrics::gauge!(crate::metrics::MISSING_TOPICS).set(self.topics.missing() as f64);
        let chains = chains(rows);
        let deadline = tokio::time::Instant::now() + self.config.message_timeout;
        let purged = AtomicBool::new(false);
        let sender = self.sender();
        let leases = &self.leases;
        let results = join_all(chains.iter().map(|chain| {
            sender.chain(
                chain,
                |row| margin.is_none_or(|margin| leases.is_valid(row.work_partition, margin)),
                deadline,
                &purged,
            )
        }))
        .await;

        let mut outcome = BatchOutcome::default();
        let mut marks = Marks::default();
        for (row, sent) in results.into_iter().flatten() {
            outcome.rows += 1;
            let attempt = row.attempts + 1;
            match sent {
                Sent::Acked(placement) => {
                    outcome.acked += 1;
                    marks.published.push((row.id, placement));
                }
                Sent::Transient { reason, .. }
                    if self.config.max_attempts.is_some_and(|max| attempt.unsigned_abs() >= max) =>
                {
                    warn!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                              attempt, stage = "publish", %reason, "event failed: attempts exhausted");
                    metrics::counter!(crate::metrics::PUBLISH_ERRORS, "kind" => "exhausted", "code" => "max_attempts").increment(1);
                    marks.failed.push((row.id, format!("gave up after {attempt} attempts: {reason}")));
                }
                Sent::Held { reason, retry_in } => {
                    // Not sent, so not an attempt: attempts stay, max_attempts does not
                    // count it, and the batch-wide backoff for a failing broker neither.
                    metrics::counter!(crate::metrics::PUBLISH_ERRORS, "kind" => "held", "code" => MISSING_CODE).increment(1);
                    debug!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                               attempt = row.attempts, stage = "publish", %reason, retry_in = ?retry_in, "held back: topic missing");
                    marks.retry.push((row.id, retry_in, reason, false));
                }
                Sent::Transient { reason, code } => {
                    outcome.transient += 1;
                    if matches!(
                        code.as_str(),
                        "UnknownTopic" | "UnknownTopicOrPartition" | "UnknownPartition"
                    ) {
                        // The topic may have been deleted: ask the cluster before the next batch.
                        self.topics.suspect(&row.topic);
                    }
                    metrics::counter!(crate::metrics::PUBLISH_ERRORS, "kind" => "transient", "code" => code)
                        .increment(1);
                    let delay = backoff::delay(
                        self.config.backoff_base,
                        self.config.backoff_max,
                        attempt.unsigned_abs(),
                    );
                    // The error alone ("Message timed out") does not say where: name the topic.
                    let named = format!("topic {}", row.topic);
                    let reason = if reason.contains(&named) { reason } else { format!("{reason} ({named})") };
                    if self.transient_warned.is_none_or(|t| t.elapsed() >= TRANSIENT_WARN_EVERY) {
                        self.transient_warned = Some(Instant::now());
                        warn!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                                  attempt, stage = "publish", %reason, retry_in = ?delay,
                                  suppressed = std::mem::take(&mut self.transient_suppressed),
                                  "transient publish failure; retrying (one warning every 10 s)");
                    } else {
                        self.transient_suppressed += 1;
                        debug!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                                   attempt, stage = "publish", %reason, retry_in = ?delay, "transient publish failure");
                    }
                    marks.retry.push((row.id, delay, reason, true));
                }
                Sent::Permanent { reason, code } => {
                    metrics::counter!(crate::metrics::PUBLISH_ERRORS, "kind" => "permanent", "code" => code)
                        .increment(1);
                    warn!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                              attempt, stage = "publish", %reason, "event failed permanently; its aggregate is held back");
                    marks.failed.push((row.id, reason));
                }
            }
        }
        (outcome, marks)
    }

    /// Waits until the last batch's background mark is written.
    pub(super) async fn finish_marking(&mut self) {
        if let Some((_, task)) = self.marking.take() {
            if let Err(error) = task.await {
                warn!(relay_id = %self.id(), stage = "mark", %error, "the mark task failed; its rows will be published again");
            }
        }
    }

    /// What sends this relay's chains.
    fn sender(&self) -> Sender<'_> {
        Sender {
            producer: &self.producer,
            config: &self.config,
            topics: &self.topics,
            stats: &self.stats,
            relay_id: self.id(),
        }
    }
}

/// Sends chains of an aggregate's rows and judges the delivery reports, for the polling
/// relay and the change-data-capture relay alike.
#[derive(Clone, Copy)]
pub(crate) struct Sender<'a> {
    pub(crate) producer: &'a rdkafka::producer::FutureProducer,
    pub(crate) config: &'a super::RelayConfig,
    pub(crate) topics: &'a super::topics::Topics,
    pub(crate) stats: &'a RelayStats,
    pub(crate) relay_id: Uuid,
}

impl std::fmt::Debug for Sender<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").field("relay_id", &self.relay_id).finish_non_exhaustive()
    }
}

impl Sender<'_> {
    /// Sends one aggregate's rows in order and returns, in order, the outcome of each up to
    /// and including the first that was not acknowledged. A row `may_send` refuses (its
    /// lease is about to end) stops the chain there, without an outcome.
    ///
    /// Consecutive rows to one topic go to one partition (the key is the aggregate id), so
    /// they are handed to the producer together, without waiting for acknowledgements: the
    /// idempotent producer keeps them in order across retries, and the gapless guarantee
    /// turns a broker error that would persist a later one without an earlier one into a
    /// fatal error that fails every later one. Rows to another topic wait until the run
    /// before them is acknowledged. A later row acknowledged after an earlier one failed
    /// would break that; it is counted (`outbox_relay_order_gaps_total`), logged, and left
    /// pending so that it is sent again after the earlier one.
    pub(crate) async fn chain<'r>(
        &self,
        chain: &'r [Row],
        may_send: impl Fn(&Row) -> bool,
        deadline: tokio::time::Instant,
        purged: &AtomicBool,
    ) -> Vec<(&'r Row, Sent)> {
        let mut results = Vec::with_capacity(chain.len());
        let mut rest = chain;
        while let Some(first) = rest.first() {
            let run = rest.iter().take_while(|r| r.topic == first.topic).count();
            let (segment, tail) = rest.split_at(run);
            rest = tail;
            let mut in_flight = Vec::with_capacity(segment.len());
            let mut stop: Option<Option<(&'r Row, Sent)>> = None;
            for row in segment {
                // Nothing is sent once the batch is over (its deadline passed, or another
                // chain purged the producer): such a record could wait for ever, since
                // librdkafka times nothing out itself. The row stays as it is.
                if !may_send(row) || purged.load(Ordering::Relaxed) || tokio::time::Instant::now() >= deadline
                {
                    stop = Some(None);
                    break;
                }
                let refused = match self.topics.verdict(&row.topic) {
                    Verdict::Send => match publish::enqueue(self.producer, row, self.config) {
                        Ok(delivery) => {
                            in_flight.push((row, delivery));
                            continue;
                        }
                        Err(sent) => sent,
                    },
                    Verdict::Wait { reason, retry_in } => Sent::Held { reason, retry_in },
                    Verdict::Fail(reason) => Sent::Permanent { reason, code: MISSING_CODE.to_owned() },
                };
                stop = Some(Some((row, refused)));
                break;
            }
            let count = in_flight.len();
            let mut broken: Option<&Row> = None;
            let mut last: Option<Placement> = None;
            for (i, (row, delivery)) in in_flight.into_iter().enumerate() {
                let sent = self.delivered(delivery, deadline, purged).await;
                match (&sent, broken) {
                    (Sent::Acked(placement), None) => {
                        // An offset below 0 is unknown (librdkafka may report a retry the
                        // broker recognised as a duplicate without one): nothing to compare.
                        if last.is_some_and(|l| {
                            l.offset >= 0
                                && placement.offset >= 0
                                && (l.partition != placement.partition || l.offset >= placement.offset)
                        }) {
                            self.order_gap(row, "acknowledged out of partition order", last, *placement);
                        }
                        last = Some(*placement);
                        results.push((row, sent));
                    }
                    (_, None) => {
                        if i + 1 < count {
                            // Keep the rest of this aggregate's run from being sent after it.
                            publish::purge(self.producer, false).await;
                        }
                        broken = Some(row);
                        results.push((row, sent));
                    }
                    (Sent::Acked(placement), Some(_)) => {
                        self.order_gap(
                            row,
                            "acknowledged after an earlier event of its aggregate failed",
                            last,
                            *placement,
                        );
                    }
                    (_, Some(_)) => {}
                }
            }
            if broken.is_some() {
                return results;
            }
            if let Some(stop) = stop {
                results.extend(stop);
                return results;
            }
        }
        results
    }

    /// Waits for one delivery report until the batch's deadline; past it, purges the
    /// producer once for the whole batch, so that nothing is still sent after the batch
    /// ended (librdkafka times nothing out itself: see `publish::LIBRDKAFKA_MESSAGE_TIMEOUT`).
    async fn delivered(
        &self,
        mut delivery: DeliveryFuture,
        deadline: tokio::time::Instant,
        purged: &AtomicBool,
    ) -> Sent {
        match tokio::time::timeout_at(deadline, &mut delivery).await {
            Ok(report) => publish::outcome(report),
            Err(_) => {
                if !purged.swap(true, Ordering::Relaxed) {
                    warn!(relay_id = %self.relay_id, stage = "publish", timeout = ?self.config.message_timeout,
                          "batch not acknowledged within the message timeout; purging the producer's queue");
                    metrics::counter!(crate::metrics::PURGES, "why" => "deadline").increment(1);
                    publish::purge(self.producer, true).await;
                }
                // A record enqueued just after that purge (by a chain that checked the
                // deadline a moment before) is failed by the next one.
                for purges in 1..=REPURGES {
                    match tokio::time::timeout(REPURGE_AFTER, &mut delivery).await {
                        Ok(report) => return publish::outcome(report),
                        Err(_) => {
                            warn!(relay_id = %self.relay_id, stage = "publish", purges,
                                  "a record outlived the batch's purge; purging again");
                            metrics::counter!(crate::metrics::PURGES, "why" => "again").increment(1);
                            publish::purge(self.producer, true).await;
                        }
                    }
                }
                match tokio::time::timeout(REPURGE_AFTER, &mut delivery).await {
                    Ok(report) => publish::outcome(report),
                    Err(_) => Sent::Transient {
                        reason: format!("no delivery report after {REPURGES} purges"),
                        code: "unpurged".to_owned(),
                    },
                }
            }
        }
    }

    fn order_gap(&self, row: &Row, what: &str, before: Option<Placement>, placement: Placement) {
        metrics::counter!(crate::metrics::ORDER_GAPS).increment(1);
        self.stats.order_gaps.fetch_add(1, Ordering::Relaxed);
        tracing::error!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                        attempt = row.attempts + 1, stage = "publish", partition = placement.partition,
                        offset = placement.offset, before = ?before,
                        "per-aggregate order not guaranteed: {what}; the event stays pending and is sent again");
    }
}

struct Recorder {
    sql: Arc<Statements>,
    pool: PgPool,
    stats: Arc<RelayStats>,
    relay_id: Uuid,
    /// Consecutive failed marks (reset by one that succeeds).
    failures: Arc<AtomicU32>,
}

impl Recorder {
    async fn record(&self, marks: &Marks, fence: &Fence) {
        match self.sql.mark(&self.pool, marks, fence).await {
            Ok(marked) => {
                self.failures.store(0, Ordering::Relaxed);
                account(&self.stats, self.relay_id, marks, marked);
            }
            Err(error) => {
                // Published but unmarked rows are published again later: a duplicate, never a loss.
                let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                warn!(relay_id = %self.relay_id, stage = "mark", %error, failures,
                      "marking the batch failed; its rows will be published again after a backoff");
            }
        }
    }
}

/// Counts a written mark; rows asked for and not marked had lost their lease on the way.
pub(super) fn account(stats: &RelayStats, relay_id: Uuid, marks: &Marks, marked: Marked) {
    metrics::counter!(crate::metrics::PUBLISHED).increment(marked.published);
    stats.published.fetch_add(marked.published, Ordering::Relaxed);
    stats.retried.fetch_add(marked.retry, Ordering::Relaxed);
    stats.failed.fetch_add(marked.failed, Ordering::Relaxed);
    let asked = (marks.published.len() + marks.retry.len() + marks.failed.len()) as u64;
    let done = marked.published + marked.retry + marked.failed;
    if done < asked {
        stats.fenced.fetch_add(asked - done, Ordering::Relaxed);
        metrics::counter!(crate::metrics::FENCED).increment(asked - done);
        warn!(relay_id = %relay_id, stage = "mark", unmarked = asked - done,
              "rows not marked: their partition's lease passed to another relay, which publishes them again");
    }
}

/// Groups a batch (ordered by id) into per-aggregate chains, each still ordered by id.
fn chains(rows: Vec<Row>) -> Vec<Vec<Row>> {
    let mut index: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut chains: Vec<Vec<Row>> = Vec::new();
    for row in rows {
        let key = (row.aggregate_type.clone(), row.aggregate_id.clone());
        match index.get(&key) {
            Some(&i) => chains[i].push(row),
            None => {
                index.insert(key, chains.len());
                chains.push(vec![row]);
            }
        }
    }
    chains
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
