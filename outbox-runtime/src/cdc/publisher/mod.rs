//! The publisher: takes the stream's items in order, sends the events in batches (an
//! aggregate's events in order, as the polling relay sends a chain), records each one's
//! outcome and hands the reader every position that is safe to confirm.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rdkafka::producer::FutureProducer;
use sqlx::PgPool;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, warn};
use uuid::Uuid;

mod judge;

use self::judge::retried;
use super::marks::{Settled, State, Statements};
use super::progress::Progress;
use super::stream::{Ended, Item};
use crate::relay::batch::Sender;
use crate::relay::claim::{Placement, Row};
use crate::relay::flight::Flight;
use crate::relay::publish::{self, Sent};
use crate::relay::topics::{SharedClock, Topics};
use crate::relay::{RelayConfig, RelayStats};
use crate::table::Names;

/// Database writes the stream depends on are tried this many times before the session
/// ends (and the stream is read again from the last confirmed position).
const WRITE_ATTEMPTS: u32 = 8;

/// The least time between two warnings about transient publish failures.
const TRANSIENT_WARN_EVERY: Duration = Duration::from_secs(10);

type Key = (String, String);

/// What the publisher keeps of a streamed event besides the row: its transaction, its
/// share of the memory budget (given back when it is dropped) and its count in flight
/// (until it is done: published and marked, failed, handed over or skipped).
#[derive(Debug)]
struct Meta {
    seq: u64,
    /// Its transaction's id.
    xid: u32,
    _permit: OwnedSemaphorePermit,
    flight: Flight,
}

/// An acknowledged event to mark published: its id, placement, attempts, transaction and
/// count in flight (dropped once the mark is written).
type Acked = (i64, Placement, i32, u64, Flight);

/// An aggregate's events waiting in memory for a retry, in order.
#[derive(Debug)]
struct Waiting {
    due: tokio::time::Instant,
    rows: VecDeque<(Row, Meta)>,
}

/// One aggregate's events of a batch, in order.
#[derive(Debug, Default)]
struct Chain {
    key: Key,
    rows: Vec<Row>,
    meta: Vec<Meta>,
}

pub(crate) struct Publisher {
    pool: PgPool,
    sql: Arc<Statements>,
    config: RelayConfig,
    producer: FutureProducer,
    topics: Topics,
    stats: Arc<RelayStats>,
    id: Uuid,
    progress: Progress,
    /// The transaction being received, and its id.
    open: u64,
    open_xid: u32,
    waiting: HashMap<Key, Waiting>,
    /// The last batch's published mark, written while the next batch is sent: the
    /// transactions of its rows.
    marking: Option<AbortOnDropHandle<crate::Result<Vec<u64>>>>,
    transient_warned: Option<Instant>,
    transient_suppressed: u64,
}

impl Publisher {
    pub(crate) fn new(
        pool: PgPool,
        names: &Names,
        config: RelayConfig,
        producer: FutureProducer,
        stats: Arc<RelayStats>,
    ) -> Self {
        Publisher {
            topics: Topics::new(config.missing_topic_timeout, Some(SharedClock::new(pool.clone(), names))),
            pool,
            sql: Arc::new(Statements::new(names)),

            config,
            producer,
            stats,
            id: Uuid::new_v4(),
            progress: Progress::default(),
            open: 0,
            open_xid: 0,
            waiting: HashMap::new(),
            marking: None,
            transient_warned: None,
            transient_suppressed: 0,
        }
    }

    /// Publishes until `stop`, or until the reader's channel closes; returns the last
    /// confirmed position.
    pub(crate) async fn run(
        mut self,
        mut items: mpsc::Receiver<Item>,
        confirm: watch::Sender<u64>,
        stop: CancellationToken,
    ) -> std::result::Result<u64, Ended> {
        let mut confirmed = 0;
        let result = loop {
            let Some(fresh) = self.collect(&mut items, &stop, &confirm, &mut confirmed).await? else {
                break Ok(());
            };
            if let Err(ended) = self.batch(fresh).await {
                break Err(ended);
            }
            self.confirm(&confirm, &mut confirmed);
        };
        self.finish_marking().await;
        self.confirm(&confirm, &mut confirmed);
        metrics::gauge!(crate::metrics::CDC_IN_FLIGHT).set(0.0);
        result.map(|()| confirmed)
    }

    /// Hands the reader the position to confirm, if it moved.
    fn confirm(&mut self, confirm: &watch::Sender<u64>, confirmed: &mut u64) {
        if let Some(lsn) = self.progress.confirmable() {
            *confirmed = lsn;
            confirm.send_replace(lsn);
        }
        let waiting: usize = self.waiting.values().map(|w| w.rows.len()).sum();
        metrics::gauge!(crate::metrics::CDC_IN_FLIGHT).set(waiting as f64);
    }

    fn take(&mut self, item: Item, fresh: &mut Vec<(Row, Meta)>) {
        match item {
            Item::Begin(xid) => {
                self.open = self.progress.begin();
                self.open_xid = xid;
            }
            Item::Row(row, permit) => {
                self.progress.row(self.open);
                let flight = Flight::new(&self.stats, [row.topic.as_str()]);
                fresh.push((*row, Meta { seq: self.open, xid: self.open_xid, _permit: permit, flight }));
            }
            Item::Commit(end) => self.progress.commit(self.open, end),
            Item::Position(lsn) => self.progress.position(lsn),
        }
    }

    /// The next batch's fresh rows (possibly none, when a retry is due), or `None` at the
    /// end.
    async fn collect(
        &mut self,
        items: &mut mpsc::Receiver<Item>,
        stop: &CancellationToken,
        confirm: &watch::Sender<u64>,
        confirmed: &mut u64,
    ) -> std::result::Result<Option<Vec<(Row, Meta)>>, Ended> {
        let limit = self.config.batch_size as usize;
        let mut fresh = Vec::new();
        loop {
            if stop.is_cancelled() {
                // Nothing new is sent once stopping: what was not sent is not confirmed.
                return Ok(None);
            }
            while fresh.len() < limit {
                match items.try_recv() {
                    Ok(item) => self.take(item, &mut fresh),
                    Err(_) => break,
                }
            }
            self.confirm(confirm, confirmed);
            let now = tokio::time::Instant::now();
            let next_due = self.waiting.values().map(|w| w.due).min();
            if !fresh.is_empty() || next_due.is_some_and(|due| due <= now) {
                return Ok(Some(fresh));
            }
            let retry_at = next_due.unwrap_or(now + Duration::from_secs(3600));
            tokio::select! {
                () = stop.cancelled() => return Ok(None),
                item = items.recv() => match item {
                    Some(item) => self.take(item, &mut fresh),
                    None => return Ok(None),
                },
                () = tokio::time::sleep_until(retry_at) => {}
                done = async { self.marking.as_mut().expect("checked").await }, if self.marking.is_some() => {
                    self.marking = None;
                    self.marked(done)?;
                }
            }
        }
    }

    /// Takes the result of a published mark: its rows are done, or the session ends.
    fn marked(
        &mut self,
        done: std::result::Result<crate::Result<Vec<u64>>, tokio::task::JoinError>,
    ) -> std::result::Result<(), Ended> {
        match done {
            Ok(Ok(seqs)) => {
                for seq in seqs {
                    self.progress.done(seq);
                }
                Ok(())
            }
            Ok(Err(error)) => Err(Ended::Transient(format!("marking published events failed: {error}"))),
            Err(error) => Err(Ended::Transient(format!("the mark task failed: {error}"))),
        }
    }

    async fn finish_marking(&mut self) {
        if let Some(task) = self.marking.take() {
            if let Err(Ended::Transient(reason)) = self.marked(task.await) {
                warn!(stage = "mark", %reason, "published events not marked; they are sent again");
            }
        }
    }

    /// One batch: the fresh rows' state, chains, sends, outcomes and marks.
    async fn batch(&mut self, fresh: Vec<(Row, Meta)>) -> std::result::Result<(), Ended> {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let states = self.states(&fresh).await?;
        let mut chains: Vec<Chain> = Vec::new();
        let mut index: HashMap<Key, usize> = HashMap::new();
        let now = tokio::time::Instant::now();
        let due: Vec<Key> =
            self.waiting.iter().filter(|(_, w)| w.due <= now).map(|(k, _)| k.clone()).collect();
        for key in due {
            let waiting = self.waiting.remove(&key).expect("listed");
            index.insert(key.clone(), chains.len());
            let (rows, meta) = waiting.rows.into_iter().unzip();
            chains.push(Chain { key, rows, meta });
        }
        let mut settled = Settled::default();
        let mut done_now: Vec<u64> = Vec::new();
        // Chains that start with a fresh row, and whether one of their rows was handed over.
        let mut handing: HashMap<Key, bool> = HashMap::new();
        for (row, meta) in fresh {
            let key = (row.aggregate_type.clone(), row.aggregate_id.clone());
            let state = states.get(&row.id).copied().unwrap_or(State::Gone);
            if state == State::Gone {
                debug!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                       stage = "stream", "no longer the stream's (published, handed over or deleted since): skipped");
                done_now.push(meta.seq);
                continue;
            }
            if state == State::Blocked {
                if let Some(waiting) = self.waiting.remove(&key) {
                    // An earlier event of the aggregate was put up again (a replay, a retry)
                    // while these wait in memory: they all go behind it, through the table.
                    for (row, meta) in waiting.rows {
                        settled.handed.push(row.id);
                        done_now.push(meta.seq);
                    }
                    handing.insert(key.clone(), true);
                }
            }
            if let Some(waiting) = self.waiting.get_mut(&key) {
                waiting.rows.push_back((row, meta));
                continue;
            }
            let fresh_chain = !index.contains_key(&key) || handing.contains_key(&key);
            let handed =
                handing.get(&key).copied().unwrap_or(false) || (fresh_chain && state == State::Blocked);
            if fresh_chain {
                handing.insert(key.clone(), handed);
            }
            if handed {
                debug!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                       stage = "stream", "an earlier event of its aggregate failed or waits: handed to the table path");
                settled.handed.push(row.id);
                done_now.push(meta.seq);
                continue;
            }
            let i = *index.entry(key.clone()).or_insert_with(|| {
                chains.push(Chain { key: key.clone(), ..Chain::default() });
                chains.len() - 1
            });
            chains[i].rows.push(row);
            chains[i].meta.push(meta);
        }

        let topics: Vec<String> =
            chains.iter().flat_map(|c| c.rows.iter().map(|r| r.topic.clone())).collect();
        self.topics
            .check(&self.producer, topics.iter().map(String::as_str), self.config.message_timeout / 2)
            .await;
        metrics::gauge!(crate::metrics::MISSING_TOPICS).set(self.topics.missing() as f64);
        let deadline = tokio::time::Instant::now() + self.config.message_timeout;
        let purged = AtomicBool::new(false);
        let sender = Sender {
            producer: &self.producer,
            config: &self.config,
            topics: &self.topics,
            stats: &self.stats,
            relay_id: self.id,
        };
        let results =
            join_all(chains.iter().map(|c| sender.chain(&c.rows, |_| true, deadline, &purged))).await;
        let outcomes: Vec<Vec<Sent>> =
            results.into_iter().map(|r| r.into_iter().map(|(_, sent)| sent).collect()).collect();

        let mut published: Vec<Acked> = Vec::new();
        for (chain, sent) in chains.into_iter().zip(outcomes) {
            self.judge(chain, sent, &mut published, &mut settled, &mut done_now);
        }
        if !settled.failed.is_empty() || !settled.handed.is_empty() {
            // Written before the next batch reads any state: what holds the aggregates back.
            let sql = self.sql.clone();
            let pool = self.pool.clone();
            retried("recording failed and handed-over events", || sql.settle(&pool, &settled)).await?;
            self.stats.failed.fetch_add(settled.failed.len() as u64, Ordering::Relaxed);
        }
        for seq in done_now {
            self.progress.done(seq);
        }
        // The previous batch's mark first; this one's is written while the next is sent.
        if let Some(task) = self.marking.take() {
            self.marked(task.await)?;
        }
        if !published.is_empty() {
            let sql = self.sql.clone();
            let pool = self.pool.clone();
            let stats = self.stats.clone();
            self.marking = Some(AbortOnDropHandle::new(tokio::spawn(async move {
                let rows: Vec<(i64, Placement, i32)> =
                    published.iter().map(|(id, p, a, ..)| (*id, *p, *a)).collect();
                let marked = retried("marking published events", || sql.published(&pool, &rows))
                    .await
                    .map_err(|e| match e {
                        Ended::Transient(reason) | Ended::Busy(reason) => crate::Error::Replication(reason),
                        Ended::Fatal(error) => error,
                    })?;
                metrics::counter!(crate::metrics::PUBLISHED).increment(marked);
                stats.published.fetch_add(marked, Ordering::Relaxed);
                Ok(published.into_iter().map(|(_, _, _, seq, _flight)| seq).collect())
            })));
        }
        if let Some(reason) = publish::fatal(&self.producer) {
            warn!(stage = "publish", %reason, "producer fatal error; creating a new producer");
            match publish::producer(&self.config.brokers, &self.config.producer) {
                Ok(producer) => self.producer = producer,
                Err(error) => warn!(%error, "cannot create a producer"),
            }
        }
        metrics::histogram!(crate::metrics::BATCH_SECONDS).record(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// The table's state of the fresh rows. A row the table does not show is deleted, or
    /// its transaction, committed in the WAL, is not visible yet: never taken for gone
    /// before its transaction has ended (it would be skipped, and the commit confirmed).
    async fn states(&self, fresh: &[(Row, Meta)]) -> std::result::Result<HashMap<i64, State>, Ended> {
        let mut states = HashMap::with_capacity(fresh.len());
        let mut rows: Vec<(i64, &str, &str, u32)> = fresh
            .iter()
            .map(|(row, meta)| (row.id, row.aggregate_type.as_str(), row.aggregate_id.as_str(), meta.xid))
            .collect();
        let mut waited = Instant::now();
        let mut round: u32 = 0;
        while !rows.is_empty() {
            let (sql, pool) = (self.sql.clone(), self.pool.clone());
            let found = retried("reading the streamed events' state", || sql.states(&pool, &rows)).await?;
            states.extend(found.known);
            if found.invisible.is_empty() {
                break;
            }
            rows.retain(|r| found.invisible.contains(&r.0));
            round += 1;
            if waited.elapsed() >= TRANSIENT_WARN_EVERY {
                waited = Instant::now();
                warn!(stage = "stream", rows = rows.len(), transaction = rows[0].3,
                      "streamed transactions are committed but not visible yet (waiting for synchronous standbys?); waiting");
            }
            tokio::time::sleep(Duration::from_millis(u64::from(round.min(100)) * 2)).await;
        }
        Ok(states)
    }
}

#[cfg(test)]
mod tests;
