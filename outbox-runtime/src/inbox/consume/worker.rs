//! One partition's worker: processes its records in order, each to a recorded outcome.
//! Records already waiting are applied as a batch in one transaction; a batch in which any
//! record does not simply apply is rolled back and processed one record per transaction.
//!
//! A failure is classified ([`Failure`]): what repeats by nature is parked at once, what may
//! pass is retried with backoff up to `max_attempts` and then parked with the last error,
//! and an unreachable database is waited for (attempts are not counted while it does not
//! answer). Every retry is counted (`inbox_messages_total{outcome="retry"}`) and logged at
//! warn, at most every [`WARN_EVERY`] per worker, with event_id, topic, partition, offset
//! and attempt. A record whose parking itself fails is parked once more without its
//! headers; if even that fails the worker reports a fatal error and `run()` ends with it.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::inbox::message::Received;
use futures_util::FutureExt;
use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info_span, warn, Instrument};

use super::Shared;
use crate::backoff;
use crate::inbox::failure::{self, Failure};
use crate::inbox::message::Incoming;
use crate::inbox::store::{Outcome, Store};
use crate::inbox::{Handlers, InboxStats};

/// The least time between two retry warnings of one worker (the others are logged at debug,
/// and counted in the next warning).
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(10);

/// What one partition's worker needs.
pub(crate) struct Worker {
    pub(crate) pool: PgPool,
    pub(crate) store: Arc<Store>,
    pub(crate) handlers: Arc<Handlers>,
    pub(crate) stats: Arc<InboxStats>,
    pub(crate) consumer: String,
    pub(crate) backoff: (Duration, Duration),
    pub(crate) max_attempts: u32,
    /// Most records per transaction, how long to wait for more after the first, and how
    /// long a batch's transaction may take.
    pub(crate) batch: (usize, Duration, Duration),
    pub(crate) place: (String, i32),
    pub(crate) generation: u64,
    pub(crate) shared: Arc<Shared>,
    /// Cancelled when the partition is revoked, at shutdown, or on a fatal error.
    pub(crate) stop: CancellationToken,
}

/// How one record ended in this worker.
enum Settled {
    /// It has its outcome.
    Done,
    /// The worker was stopped first: the record is redelivered later.
    Abandoned,
}

/// What the worker tries next for a record: process it, park it, or park it without its
/// headers (the last resort when the full row cannot be stored).
enum Stage {
    Process,
    Park(String),
    ParkBare(String),
}

impl Stage {
    /// The next stage after a failure that will not pass at this one (`reason`: why to park,
    /// `error`: what failed); `None` when none is left.
    fn escalate(self, reason: String, error: &str) -> Option<Stage> {
        match self {
            Stage::Process => Some(Stage::Park(reason)),
            Stage::Park(parked) => {
                Some(Stage::ParkBare(format!("{parked} (parked without its headers: {error})")))
            }
            Stage::ParkBare(_) => None,
        }
    }
}

/// Warnings at most every [`WARN_EVERY`].
struct Throttle {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    /// `Some(suppressed since the last warning)` when a warning may be logged now.
    fn allow(&mut self) -> Option<u64> {
        if self.last.is_some_and(|t| t.elapsed() < WARN_EVERY) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(Instant::now());
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// What a caught panic said.
pub(crate) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

impl Worker {
    /// Processes `rx` in order until it closes or the worker is stopped: the records
    /// waiting are taken as a batch and applied in one transaction; a batch that does not
    /// simply apply, and a lone record, go one record per transaction.
    pub(crate) async fn run(self, mut rx: mpsc::Receiver<Received>) {
        let mut throttle = Throttle { last: None, suppressed: 0 };
        let (batch_size, batch_wait, _) = self.batch;
        let mut batch: Vec<Incoming> = Vec::with_capacity(batch_size);
        loop {
            let message = tokio::select! {
                biased;
                () = self.stop.cancelled() => return, // not started: redelivered
                message = rx.recv() => match message { Some(m) => m, None => return },
            };
            batch.push(self.take(message));
            let fill_until = tokio::time::Instant::now() + batch_wait;
            while batch.len() < batch_size {
                let next = match rx.try_recv() {
                    Ok(message) => Some(message),
                    Err(mpsc::error::TryRecvError::Empty) if !batch_wait.is_zero() => {
                        tokio::time::timeout_at(fill_until, rx.recv()).await.ok().flatten()
                    }
                    Err(_) => None,
                };
                match next {
                    Some(message) => batch.push(self.take(message)),
                    None => break,
                }
            }
            if self.stop.is_cancelled() {
                return; // not started: redelivered
            }
            // A batch goes in one transaction. When a record of it does not simply apply,
            // the records before it go again as a batch, that record alone (to its outcome,
            // with retries and parking), and the rest as the next batch.
            let mut from = 0;
            while from < batch.len() {
                let rest = &batch[from..];
                let failed = if rest.len() > 1 { self.apply_batch(rest).await } else { Some(0) };
                let Some(i) = failed else { break };
                let prefix_done = i > 1 && self.apply_batch(&rest[..i]).await.is_none();
                if !prefix_done {
                    for incoming in &rest[..i] {
                        if !self.one(incoming, &mut throttle).await {
                            return;
                        }
                    }
                }
                if !self.one(&rest[i], &mut throttle).await {
                    return;
                }
                from += i + 1;
            }
            batch.clear();
        }
    }

    /// Brings one record to its outcome in a transaction of its own and finishes its
    /// offset; `false` when the worker must stop (stopped, or a fatal error).
    async fn one(&self, incoming: &Incoming, throttle: &mut Throttle) -> bool {
        let event_id = incoming.meta.as_ref().map(|m| m.event_id.to_string()).unwrap_or_default();
        let span = info_span!("inbox_message", consumer = %self.consumer, topic = %incoming.topic,
                              partition = incoming.partition, offset = incoming.offset, event_id = %event_id);
        match self.settle(incoming, &event_id, throttle).instrument(span).await {
            Ok(Settled::Done) => {
                self.shared.finish(&self.place, self.generation, incoming.offset + 1);
                true
            }
            Ok(Settled::Abandoned) => false,
            Err(fatal) => {
                self.shared.fail(fatal);
                false
            }
        }
    }

    /// Reads a record handed to this worker, making room for the next.
    fn take(&self, message: Received) -> Incoming {
        self.shared.made_room(&self.place);
        Incoming::read(message).for_consumer(&self.store.consumer_name)
    }

    /// Applies `batch` in one transaction. `None` when it did; `Some(i)` when record `i` did
    /// not simply apply (or failed, panicked or overran `batch_timeout`) and the
    /// transaction rolled back: nothing of the batch was written.
    async fn apply_batch(&self, batch: &[Incoming]) -> Option<usize> {
        let started = Instant::now();
        let at = AtomicUsize::new(0);
        let span = info_span!("inbox_batch", consumer = %self.consumer, topic = %batch[0].topic,
                              partition = batch[0].partition, first_offset = batch[0].offset, records = batch.len());
        let processed = AssertUnwindSafe(self.store.process_batch(&self.pool, &self.handlers, batch, &at))
            .catch_unwind()
            .instrument(span);
        // Dropped at the timeout, the transaction rolls back.
        let why = match tokio::time::timeout(self.batch.2, processed).await {
            Ok(Ok(Ok((true, outcomes)))) => {
                #[allow(clippy::cast_precision_loss)]
                let share = started.elapsed().as_secs_f64() / batch.len() as f64;
                for (incoming, outcome) in batch.iter().zip(&outcomes) {
                    let event_id = incoming.meta.as_ref().map(|m| m.event_id.to_string()).unwrap_or_default();
                    self.recorded(incoming, &event_id, outcome, share, 1);
                    self.shared.finish(&self.place, self.generation, incoming.offset + 1);
                }
                return None;
            }
            Ok(Ok(Ok((false, _)))) => "it does not simply apply".to_owned(),
            Ok(Ok(Err(error))) => error.to_string(),
            Ok(Err(panic)) => format!("its handler panicked: {}", panic_text(&*panic)),
            Err(_) => format!("the batch took longer than batch_timeout ({:?})", self.batch.2),
        };
        let i = at.load(Ordering::Relaxed).min(batch.len() - 1);
        metrics::counter!(crate::metrics::INBOX_BATCH_FALLBACKS, "consumer" => self.consumer.clone())
            .increment(1);
        debug!(consumer = %self.consumer, topic = %batch[i].topic, partition = batch[i].partition,
               offset = batch[i].offset, records = batch.len(), stage = "inbox", reason = %why,
               "batch rolled back at this record; it goes alone, the others in batches");
        Some(i)
    }

    /// Counts and logs the outcome a record came to.
    fn recorded(&self, incoming: &Incoming, event_id: &str, outcome: &Outcome, seconds: f64, tries: u32) {
        if let Outcome::Parked(reason) = outcome {
            warn!(consumer = %self.consumer, event_id, topic = %incoming.topic, partition = incoming.partition,
                  offset = incoming.offset, attempt = tries, stage = "inbox", %reason, "message parked");
        }
        self.stats.record(&self.consumer, outcome);
        metrics::histogram!(crate::metrics::INBOX_APPLY_SECONDS, "consumer" => self.consumer.clone())
            .record(seconds);
    }

    /// One try: the outcome, or how it failed.
    async fn try_once(&self, incoming: &Incoming) -> Result<Outcome, Failure> {
        let processed =
            AssertUnwindSafe(self.store.process(&self.pool, &self.handlers, incoming)).catch_unwind().await;
        match processed {
            Ok(Ok(Outcome::RetryLater(reason))) => Err(Failure::Transient(format!("handler: {reason}"))),
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(error)) => Err(failure::of_error(&error)),
            // A panicking handler fails the same way next time.
            Err(panic) => Err(Failure::Permanent(format!("handler panicked: {}", panic_text(&*panic)))),
        }
    }

    /// Parks `incoming` with `reason`; when the full record cannot be stored, once more
    /// without its headers.
    async fn park(&self, incoming: &Incoming, reason: &str, minimal: bool) -> Result<Outcome, Failure> {
        let bare;
        let record = if minimal {
            bare = Incoming { headers: Default::default(), raw_headers: Vec::new(), ..incoming.clone() };
            &bare
        } else {
            incoming
        };
        let parked = AssertUnwindSafe(self.store.park_after_rollback(&self.pool, record, reason, None))
            .catch_unwind()
            .await;
        match parked {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(error)) => Err(failure::of_error(&error)),
            Err(panic) => Err(Failure::Permanent(format!("parking panicked: {}", panic_text(&*panic)))),
        }
    }

    /// Whether the database answers (a failure then was the message's, not the database's).
    async fn database_answers(&self) -> bool {
        let ping = sqlx::query("SELECT 1").execute(&self.pool);
        matches!(tokio::time::timeout(Duration::from_secs(5), ping).await, Ok(Ok(_)))
    }

    /// Brings `incoming` to an outcome. `Err` is fatal: the record cannot even be parked.
    async fn settle(
        &self,
        incoming: &Incoming,
        event_id: &str,
        throttle: &mut Throttle,
    ) -> Result<Settled, String> {
        let started = Instant::now();
        let (base, max) = self.backoff;
        // Counted attempts (the message's fault), and tries of any kind (for the backoff).
        let (mut attempts, mut tries) = (0u32, 0u32);
        let mut stage = Stage::Process;
        loop {
            tries += 1;
            let result = match &stage {
                Stage::Process => self.try_once(incoming).await,
                Stage::Park(reason) => self.park(incoming, reason, false).await,
                Stage::ParkBare(reason) => self.park(incoming, reason, true).await,
            };
            let failure = match result {
                Ok(outcome) => {
                    self.recorded(incoming, event_id, &outcome, started.elapsed().as_secs_f64(), tries);
                    return Ok(Settled::Done);
                }
                Err(failure) => failure,
            };
            let fatal = || {
                format!(
                    "record {}/{}@{} cannot be parked, not even without its headers",
                    incoming.topic, incoming.partition, incoming.offset
                )
            };
            let (reason, counted) = match failure {
                Failure::Permanent(reason) => {
                    let park_reason = reason.clone();
                    stage = stage
                        .escalate(park_reason, &reason)
                        .ok_or_else(|| format!("{}: {reason}", fatal()))?;
                    continue;
                }
                Failure::Unavailable(reason) => (reason, false),
                // Counted only while the database answers: otherwise it was the database.
                Failure::Transient(reason) => (reason, self.database_answers().await),
            };
            if counted {
                attempts += 1;
            }
            if attempts >= self.max_attempts {
                attempts = 0;
                let gave_up = format!("gave up after {} attempts; last error: {reason}", self.max_attempts);
                stage = stage.escalate(gave_up, &reason).ok_or_else(|| format!("{}: {reason}", fatal()))?;
                continue;
            }
            self.stats.record(&self.consumer, &Outcome::RetryLater(String::new()));
            let delay = backoff::delay(base, max, tries);
            let stage = if matches!(stage, Stage::Process) { "inbox" } else { "park" };
            let cause = if counted { "failure that may pass" } else { "database unavailable" };
            match throttle.allow() {
                Some(suppressed) => warn!(consumer = %self.consumer, event_id, topic = %incoming.topic,
                                          partition = incoming.partition, offset = incoming.offset, attempt = tries,
                                          counted_attempts = attempts, max_attempts = self.max_attempts, stage,
                                          %reason, retry_in = ?delay, suppressed, "{cause}; retrying"),
                None => {
                    debug!(consumer = %self.consumer, event_id, attempt = tries, stage, %reason, "{cause}; retrying")
                }
            }
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = self.stop.cancelled() => return Ok(Settled::Abandoned),
            }
        }
    }
}
