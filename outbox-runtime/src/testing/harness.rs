//! [`Harness`]: a relay and inboxes running in the background of a test, and
//! [`Harness::settle`], which succeeds only when every event appended so far has the
//! outcome a passing test needs.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, PgPool};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::judge::{judge_event, EventRow, State};
use super::watched::Watched;
use crate::inbox::{Inbox, InboxStats};
use crate::relay::{Relay, RelayStats};
use crate::{Error, Result};

/// What [`Harness::settle`] found: every event appended before the call, and what became
/// of it. Counts cover every event appended so far, not only since the last call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settled {
    /// Events the relay published.
    pub published: u64,
    /// Events an operator discarded at the outbox: never published, never consumed.
    pub discarded: u64,
    /// Published events on topics declared with [`HarnessBuilder::unconsumed_topic`].
    pub unconsumed: u64,
    /// Outcomes the inboxes gave published events (`applied + ignored +
    /// discarded_by_inbox`); an event counts once per inbox that reads its topic.
    pub consumed: u64,
    /// Of those, events applied (their effect committed, now or in an earlier delivery
    /// that a later one was absorbed as a duplicate of).
    pub applied: u64,
    /// Of those, events whose type the inbox ignores on purpose (`Handlers::ignore`).
    pub ignored: u64,
    /// Of those, events an operator discarded at the inbox (`outbox inbox discard`).
    pub discarded_by_inbox: u64,
}

/// How long [`Harness::settle`] waits unless [`HarnessBuilder::settle_timeout`] says.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The most problems or waiting events one error lists.
const LISTED: usize = 10;

/// Sets up a [`Harness`]: [`Harness::builder`].
#[derive(Debug)]
#[must_use]
pub struct HarnessBuilder {
    relay: Relay,
    inboxes: Vec<Inbox>,
    unconsumed: BTreeSet<String>,
    timeout: Duration,
}

impl HarnessBuilder {
    /// Adds an inbox under test. Every event published to one of its topics must be given
    /// an outcome by it (applied, a duplicate, or ignored by `Handlers::ignore`).
    pub fn inbox(mut self, inbox: Inbox) -> Self {
        self.inboxes.push(inbox);
        self
    }

    /// Declares that no inbox under test reads `topic`: its events need only be published.
    /// Without it, an event to a topic no inbox reads fails [`Harness::settle`].
    pub fn unconsumed_topic(mut self, topic: impl Into<String>) -> Self {
        self.unconsumed.insert(topic.into());
        self
    }

    /// How long [`Harness::settle`] waits (60 s by default).
    pub fn settle_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Starts the relay and the inboxes on the current tokio runtime. Fails only when a
    /// Kafka client that reads an inbox's committed offsets cannot be made of its settings.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(self) -> Result<Harness> {
        // A cleanup that deletes published rows before the inboxes consumed them would
        // leave settle nothing to judge them by.
        if let Some(retention) = self.relay.cleanup_retention().filter(|r| *r < self.timeout) {
            return Err(Error::Config(format!(
                "the relay's cleanup retention ({retention:?}) is shorter than the harness's settle timeout \
                 ({:?}): published events could be deleted before the inboxes give them an outcome; \
                 use a longer retention, or none (RelayConfig::cleanup(None))",
                self.timeout
            )));
        }
        let stop = CancellationToken::new();
        let pool = self.relay.pool().clone();
        let outbox_table = self.relay.outbox().names().outbox.clone();
        let relay_stats = self.relay.stats();
        // Every client is made before anything runs: a failure leaves no task behind.
        let mut watched = Vec::new();
        for inbox in self.inboxes {
            watched.push((Watched::new(&inbox)?, inbox));
        }
        let inboxes = watched
            .into_iter()
            .map(|(mut watched, inbox)| {
                watched.task = Some(tokio::spawn(inbox.run(stop.child_token())));
                watched
            })
            .collect();
        let relay = tokio::spawn(self.relay.run(stop.child_token()));
        Ok(Harness {
            pool,
            outbox_table,
            unconsumed: self.unconsumed,
            timeout: self.timeout,
            relay_stats,
            relay: Some(relay),
            inboxes,
            done: HashMap::new(),
            unfinished: HashMap::new(),
            stop,
        })
    }
}

/// A relay and inboxes running in the background of a test.
///
/// [`Harness::settle`] cannot pass falsely: it succeeds only when every event appended so
/// far was published and then, by every inbox under test that reads its topic, applied,
/// absorbed as a duplicate of an applied one, or ignored by an explicit
/// `Handlers::ignore`. An event the relay failed, a record an inbox parked, held or
/// absorbed as stale, an event to a topic no inbox reads (unless declared with
/// [`HarnessBuilder::unconsumed_topic`]), passed over without an outcome or deleted from
/// the outbox before it had one is an [`Error::NotSettled`] at once, naming the event id,
/// type, topic and reason. A record parked with a retry requested is waited for.
///
/// An event an operator discarded (at the outbox, or a parked record at an inbox) is an
/// outcome too, counted as such in [`Settled`]: the test asked for it.
///
/// It judges every event in the relay's outbox table: give each test a database of its
/// own, as `#[sqlx::test]` does (rows left by an earlier run, or by a test running beside
/// it on the same table, are judged as this test's).
pub struct Harness {
    pool: PgPool,
    outbox_table: String,
    unconsumed: BTreeSet<String>,
    timeout: Duration,
    relay_stats: Arc<RelayStats>,
    relay: Option<JoinHandle<Result<()>>>,
    inboxes: Vec<Watched>,
    /// Events found done, with what each counts for: one deleted since (cleanup, purge)
    /// still counts.
    done: HashMap<Uuid, Settled>,
    /// Events seen not done (in this call or an earlier one), described: each must get
    /// its outcome before it may leave the table.
    unfinished: HashMap<Uuid, String>,
    stop: CancellationToken,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let consumers: Vec<&str> = self.inboxes.iter().map(|i| i.consumer.as_str()).collect();
        f.debug_struct("Harness")
            .field("outbox", &self.outbox_table)
            .field("inboxes", &consumers)
            .field("unconsumed", &self.unconsumed)
            .finish_non_exhaustive()
    }
}

impl Harness {
    /// Starts `relay` and `inbox` on the current tokio runtime:
    /// `Harness::builder(relay).inbox(inbox).start()`.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(relay: Relay, inbox: Inbox) -> Result<Harness> {
        Harness::builder(relay).inbox(inbox).start()
    }

    /// A harness for `relay`, with inboxes, topics nobody reads and a timeout to add.
    pub fn builder(relay: Relay) -> HarnessBuilder {
        HarnessBuilder { relay, inboxes: Vec::new(), unconsumed: BTreeSet::new(), timeout: SETTLE_TIMEOUT }
    }

    /// The relay's counters.
    pub fn relay_stats(&self) -> Arc<RelayStats> {
        self.relay_stats.clone()
    }

    /// The counters of the first inbox under test (fresh, all zero, when there is none).
    pub fn inbox_stats(&self) -> Arc<InboxStats> {
        self.inboxes.first().map(|i| i.stats.clone()).unwrap_or_default()
    }

    /// The counters of the inbox under test named `consumer`.
    pub fn inbox_stats_of(&self, consumer: &str) -> Option<Arc<InboxStats>> {
        self.inboxes.iter().find(|i| i.consumer == consumer).map(|i| i.stats.clone())
    }

    /// Waits until every event appended (and committed) before this call has its outcome
    /// (see [`Harness`]), up to the settle timeout (60 s by default). Events that handlers
    /// append to the relay's outbox meanwhile (follow-ups in the transaction that applied
    /// an event) are waited for too.
    ///
    /// # Errors
    /// [`Error::NotSettled`] naming each event that went wrong (at once) or is still
    /// waiting at the timeout (with the relay's last error for an unpublished one); the
    /// relay's or an inbox's own error if it stopped.
    pub async fn settle(&mut self) -> Result<Settled> {
        self.settle_within(self.timeout).await
    }

    /// [`Harness::settle`] with another timeout.
    pub async fn settle_within(&mut self, timeout: Duration) -> Result<Settled> {
        let started = Instant::now();
        let Some(mut watermark) = self.last_id().await? else { return Ok(self.totals()) };
        loop {
            self.check_running().await?;
            let events = self.events(watermark).await?;
            let mut views = Vec::with_capacity(self.inboxes.len());
            for inbox in &self.inboxes {
                views.push(inbox.view(&events).await?);
            }
            let (mut waiting, mut problems) = (Vec::new(), Vec::new());
            let present: HashSet<Uuid> = events.iter().map(|e| e.event_id).collect();
            for (id, event) in &self.unfinished {
                if !present.contains(id) {
                    problems.push(format!(
                        "{event} was deleted from the outbox (cleanup or purge) before it had its outcome: \
                         a relay's cleanup in a test needs a retention longer than the test"
                    ));
                }
            }
            for event in &events {
                match judge_event(event, &views, &self.unconsumed) {
                    State::Done(counts) => {
                        self.unfinished.remove(&event.event_id);
                        self.done.insert(event.event_id, counts);
                    }
                    State::Waiting(why) => {
                        self.done.remove(&event.event_id);
                        self.unfinished.insert(event.event_id, event.to_string());
                        waiting.push(why);
                    }
                    State::Problem(why) => problems.push(why),
                }
            }
            if !problems.is_empty() {
                return Err(not_settled(started.elapsed(), "", &problems));
            }
            if waiting.is_empty() {
                // Events the handlers appended meanwhile (a follow-up in the transaction that
                // applied one) are part of what the test waits for: a newer row, or one below
                // the watermark that committed after the rows were read (ids are taken at
                // insert, not at commit).
                let newest = self.last_id().await?;
                let late = self.events(watermark).await?.iter().any(|e| !present.contains(&e.event_id));
                match newest {
                    Some(last) if last > watermark => watermark = last,
                    _ if late => {}
                    _ => return Ok(self.totals()),
                }
            }
            if started.elapsed() >= timeout {
                if waiting.is_empty() {
                    waiting.push(format!("events are still being appended (the newest is id {watermark})"));
                }
                let head = format!("{} event(s) still waiting: ", waiting.len());
                return Err(not_settled(timeout, &head, &waiting));
            }
            if !waiting.is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// What every event found done so far counts for.
    fn totals(&self) -> Settled {
        let mut totals = Settled::default();
        for counts in self.done.values() {
            totals.add(counts);
        }
        totals
    }

    /// The newest outbox row's id.
    async fn last_id(&self) -> Result<Option<i64>> {
        let table = &self.outbox_table;
        Ok(sqlx::query_scalar(AssertSqlSafe(format!("SELECT max(id) FROM {table}")))
            .fetch_one(&self.pool)
            .await?)
    }

    /// Every outbox row up to `watermark`.
    async fn events(&self, watermark: i64) -> Result<Vec<EventRow>> {
        type Row = (Uuid, String, i32, String, String, String, i32, Option<String>, Option<i32>, Option<i64>);
        let rows: Vec<Row> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT event_id, event_type, schema_version, aggregate_id, topic, status, attempts, last_error, \
                    kafka_partition, kafka_offset \
             FROM {} WHERE id <= $1 ORDER BY id",
            self.outbox_table
        )))
        .bind(watermark)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(
                    event_id,
                    event_type,
                    schema_version,
                    aggregate_id,
                    topic,
                    status,
                    attempts,
                    last_error,
                    partition,
                    offset,
                )| EventRow {
                    event_id,
                    event_type,
                    schema_version,
                    aggregate_id,
                    topic,
                    status,
                    attempts,
                    last_error,
                    partition,
                    offset,
                },
            )
            .collect())
    }

    /// A task's error if it ended; a task that ended cleanly before `stop` is an error too
    /// (neither stops unless cancelled).
    async fn check_running(&mut self) -> Result<()> {
        let mut slots: Vec<(String, &mut Option<JoinHandle<Result<()>>>)> =
            vec![("relay".to_owned(), &mut self.relay)];
        for inbox in &mut self.inboxes {
            slots.push((format!("inbox `{}`", inbox.consumer), &mut inbox.task));
        }
        for (name, slot) in slots {
            if slot.as_ref().is_some_and(JoinHandle::is_finished) {
                let Some(task) = slot.take() else { continue };
                return match task.await {
                    Ok(Err(e)) => Err(e),
                    Ok(Ok(())) => Err(Error::NotSettled {
                        waited: Duration::ZERO,
                        waiting: format!("the {name} stopped"),
                    }),
                    Err(panic) => Err(Error::NotSettled {
                        waited: Duration::ZERO,
                        waiting: format!("the {name} panicked: {panic}"),
                    }),
                };
            }
        }
        Ok(())
    }

    /// Stops the relay and the inboxes and returns the first error one ended with.
    pub async fn stop(mut self) -> Result<()> {
        self.stop.cancel();
        let mut tasks = vec![self.relay.take()];
        tasks.extend(self.inboxes.iter_mut().map(|i| i.task.take()));
        let mut first = Ok(());
        for task in tasks.into_iter().flatten() {
            let result = match task.await {
                Ok(result) => result,
                Err(panic) => Err(Error::NotSettled {
                    waited: Duration::ZERO,
                    waiting: format!("a task panicked: {panic}"),
                }),
            };
            if first.is_ok() {
                first = result;
            }
        }
        first
    }
}

/// `head` and the first [`LISTED`] of `lines`, with how many more there are.
fn not_settled(waited: Duration, head: &str, lines: &[String]) -> Error {
    let mut text = head.to_owned();
    text.push_str(&lines.iter().take(LISTED).cloned().collect::<Vec<_>>().join("; "));
    if lines.len() > LISTED {
        text.push_str(&format!("; and {} more", lines.len() - LISTED));
    }
    Error::NotSettled { waited, waiting: text }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
