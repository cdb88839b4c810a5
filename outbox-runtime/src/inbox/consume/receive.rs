//! The receive loop itself: the consumer, dispatch to the partitions' workers, refilling
//! paused partitions, and shutdown within its timeout.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, TopicPartitionList};
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::worker::{panic_text, Worker, WARN_EVERY};
use super::{commit, InboxContext, Live, Partition, Shared};
use crate::error::{Error, Result};
use crate::inbox::budget::Charge;
use crate::inbox::cleanup::cleanup_loop;
use crate::inbox::message::Received;
use crate::inbox::retention::{self, RetentionVerdict};
use crate::inbox::Inbox;

/// How often paused partitions are looked at for resuming, at least.
const RESUME_EVERY: Duration = Duration::from_millis(100);

impl Inbox {
    fn kafka_consumer(&self, shared: Arc<Shared>) -> Result<StreamConsumer<InboxContext>> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.config.brokers)
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            // Statistics carry the consumer lag per partition (the inbox_consumer_lag gauge).
            .set("statistics.interval.ms", "5000");
        // librdkafka's prefetch is a quarter of the memory budget (within what librdkafka
        // takes: 1 KiB to 2 GiB), unless a kafka_setting sets it.
        let prefetch_kib = (self.config.memory_budget / 4 / 1024).clamp(1, 2_097_151);
        config.set("queued.max.messages.kbytes", prefetch_kib.to_string());
        // A partition resumed after a pause is fetched again within 100 ms rather than after
        // librdkafka's 1 s backoff for a full prefetch queue, which a small budget hits.
        config.set("fetch.queue.backoff.ms", "100");
        for (k, v) in &self.config.kafka {
            config.set(k, v);
        }
        config
            .set("group.id", &self.config.consumer)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        config
            .create_with_context(InboxContext { shared })
            .map_err(|e| Error::kafka_client("InboxConfig::kafka_setting", e))
    }

    /// See [`Inbox::run`].
    pub(crate) async fn consume(self, shutdown: CancellationToken) -> Result<()> {
        let shared = Arc::new(Shared {
            consumer: self.config.consumer.clone(),
            state: Mutex::default(),
            room: Notify::new(),
            failed: CancellationToken::new(),
            held: Arc::default(),
            live: AtomicBool::new(true),
        });
        let consumer = self.kafka_consumer(shared.clone())?;
        // Dropped before the consumer (declared after it): see `Shared::live`.
        let live = Live(&shared);
        let tracker = TaskTracker::new();
        // Stops every worker: cancelled on shutdown and on a fatal error.
        let stop_all = shutdown.child_token();
        // Abandons work in hand once the shutdown timeout passes.
        let abandon = CancellationToken::new();
        if self.config.refuse_short_retention {
            // Refusing needs the verdict before consuming anything.
            match retention::check_topics(&self.config).await {
                RetentionVerdict::Short(message) => return Err(Error::Config(message)),
                verdict => retention::warn(&self.config.consumer, verdict),
            }
        } else {
            // Only a warning: do not hold up start-up (some brokers never answer).
            let (config, name) = (self.config.clone(), self.config.consumer.clone());
            tracker.spawn(async move { retention::warn(&name, retention::check_topics(&config).await) });
        }
        let layout = crate::inbox::partitions::layout(&self.pool, &self.names).await?;
        self.store.set_layout(layout);
        let topics: Vec<&str> = self.config.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        info!(consumer = %self.config.consumer, topics = ?topics, "inbox started");
        tracker.spawn(cleanup_loop(self.clone(), stop_all.clone()));
        tracker.spawn(self.clone().operator_requests(stop_all.clone()));

        let mut tick = tokio::time::interval(self.config.commit_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Partitions paused for the memory budget are resumed by what their workers finish,
        // which wakes nothing: looked at this often, whatever the commit interval.
        let mut resume_tick = tokio::time::interval(RESUME_EVERY);
        resume_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_receive_warning: Option<Instant> = None;
        let outcome = loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break Ok(()),
                () = shared.failed.cancelled() => break Err(Error::Inbox(shared.fatal())),
                () = shared.room.notified() => self.refill(&consumer, &shared),
                _ = resume_tick.tick() => self.refill(&consumer, &shared),
                _ = tick.tick() => {
                    self.refill(&consumer, &shared);
                    commit(&consumer, &shared, CommitMode::Async, false);
                    #[allow(clippy::cast_precision_loss)]
                    metrics::gauge!(crate::metrics::INBOX_PAUSED, "consumer" => self.config.consumer.clone())
                        .set(shared.paused_count() as f64);
                    #[allow(clippy::cast_precision_loss)]
                    metrics::gauge!(crate::metrics::INBOX_BUFFERED, "consumer" => self.config.consumer.clone())
                        .set(shared.held.load(Ordering::Relaxed) as f64);
                }
                received = consumer.recv() => match received {
                    Ok(message) => {
                        let message = Received::read(&message);
                        self.dispatch(&consumer, &shared, &tracker, &stop_all, &abandon, message);
                    }
                    Err(KafkaError::PartitionEOF(_)) => {}
                    Err(error) if crate::kafka_codes::is_fatal_receive(&error) => {
                        break Err(Error::Inbox(format!("the Kafka consumer cannot go on: {error}")));
                    }
                    Err(error) => {
                        metrics::counter!(crate::metrics::INBOX_RECEIVE_ERRORS, "consumer" => self.config.consumer.clone())
                            .increment(1);
                        if last_receive_warning.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                            last_receive_warning = Some(Instant::now());
                            warn!(consumer = %self.config.consumer, stage = "consume", %error, "receiving failed; going on");
                        } else {
                            debug!(consumer = %self.config.consumer, stage = "consume", %error, "receiving failed");
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        };
        drop(live);
        self.stop(consumer, &shared, tracker, stop_all, abandon).await;
        if outcome.is_ok() {
            // What this run came to: a duplicate absorbed shows here as well as in a debug line.
            let stats = &self.stats;
            info!(
                consumer = %self.config.consumer,
                applied = stats.applied(),
                duplicates = stats.duplicates(),
                ignored = stats.ignored(),
                stale = stats.stale(),
                parked = stats.parked(),
                held = stats.held(),
                "inbox stopped"
            );
        }
        outcome
    }

    /// Hands `message` to its partition's worker without waiting: when the worker's queue
    /// is full the record waits in the partition's overflow, and the partition is paused
    /// when that overflow or everything the inbox holds is past its bound.
    fn dispatch(
        &self,
        consumer: &StreamConsumer<InboxContext>,
        shared: &Arc<Shared>,
        tracker: &TaskTracker,
        stop_all: &CancellationToken,
        abandon: &CancellationToken,
        mut message: Received,
    ) {
        let place = (message.topic().to_owned(), message.partition());
        let mut guard = shared.lock();
        let state = &mut *guard;
        let floor = self.floor(state.partitions.len() + usize::from(!state.partitions.contains_key(&place)));
        let partition = state.partitions.entry(place.clone()).or_insert_with(|| {
            state.generation += 1;
            let (tx, rx) = mpsc::channel(self.config.queue_per_partition);
            let stop = stop_all.child_token();
            let worker = Worker {
                pool: self.pool.clone(),
                store: self.store.clone(),
                handlers: self.handlers.clone(),
                stats: self.stats.clone(),
                consumer: self.config.consumer.clone(),
                backoff: (self.config.backoff_base, self.config.backoff_max),
                max_attempts: self.config.max_attempts,
                batch: (self.config.batch_size, self.config.batch_wait, self.config.batch_timeout),
                place: place.clone(),
                generation: state.generation,
                shared: shared.clone(),
                stop: stop.clone(),
            };
            let (shared, abandon, place) = (shared.clone(), abandon.clone(), place.clone());
            tracker.spawn(async move {
                tokio::select! {
                    ran = AssertUnwindSafe(worker.run(rx)).catch_unwind() => if let Err(panic) = ran {
                        let what = panic_text(&*panic);
                        shared.fail(format!("the worker of {}/{} panicked: {what}", place.0, place.1));
                    },
                    () = abandon.cancelled() => {}
                }
            });
            Partition {
                generation: state.generation,
                queue: Some(tx),
                overflow: VecDeque::new(),
                overflow_bytes: 0,
                held: Arc::default(),
                paused: Arc::new(AtomicBool::new(false)),
                stop,
                finished: None,
                committed: None,
            }
        });
        let size = message.size();
        message.charge(Charge::new(&shared.held, &partition.held, size));
        let leftover = if partition.overflow.is_empty() {
            let Some(queue) = partition.queue.as_ref() else { return }; // stopping
            match queue.try_send(message) {
                Ok(()) => None,
                Err(TrySendError::Full(m) | TrySendError::Closed(m)) => Some(m),
            }
        } else {
            Some(message)
        };
        if let Some(message) = leftover {
            partition.overflow_bytes += size;
            partition.overflow.push_back(message);
        }
        // Pausing costs a fetch again on resume: only past a memory bound. Past the budget,
        // a partition holding no more than its floor goes on.
        let over = partition.overflow_bytes >= self.config.buffer_per_partition
            || (shared.held.load(Ordering::Relaxed) > self.config.memory_budget
                && partition.held.load(Ordering::Relaxed) > floor);
        let newly_paused = over && !partition.paused.swap(true, Ordering::Relaxed);
        drop(guard);
        if newly_paused {
            let mut list = TopicPartitionList::new();
            let _ = list.add_partition(&place.0, place.1);
            if let Err(error) = consumer.pause(&list) {
                warn!(consumer = %self.config.consumer, stage = "consume", topic = %place.0, partition = place.1,
                      %error, "cannot pause a partition whose worker is behind");
            }
            debug!(consumer = %self.config.consumer, topic = %place.0, partition = place.1, "partition paused");
        }
    }

    /// What each of `partitions` may hold whatever the total: an equal share of a quarter
    /// of the memory budget. The floors add up to a quarter of it, so everything held
    /// stays under 1.25 times the budget (plus the records already received when a
    /// partition crossed its bound).
    fn floor(&self, partitions: usize) -> usize {
        self.config.memory_budget / 4 / partitions.max(1)
    }

    /// Moves overflowed records into their workers' queues and resumes paused partitions
    /// whose overflow is down to half the queue's size.
    fn refill(&self, consumer: &StreamConsumer<InboxContext>, shared: &Shared) {
        let mut resume = TopicPartitionList::new();
        {
            let mut state = shared.lock();
            let floor = self.floor(state.partitions.len());
            for (place, p) in &mut state.partitions {
                let Some(queue) = &p.queue else { continue };
                while let Some(message) = p.overflow.pop_front() {
                    let size = message.size();
                    match queue.try_send(message) {
                        Ok(()) => p.overflow_bytes = p.overflow_bytes.saturating_sub(size),
                        Err(TrySendError::Full(m) | TrySendError::Closed(m)) => {
                            p.overflow.push_front(m);
                            break;
                        }
                    }
                }
                // Resumed while half the buffer still holds work for the worker, so that
                // fetching again (a round trip or more) does not leave it idle; and once
                // everything held is down to half the budget, or this partition is down to
                // half its floor (the records of another that cannot be applied must not
                // stop it for good).
                let room = shared.held.load(Ordering::Relaxed) <= self.config.memory_budget / 2
                    || p.held.load(Ordering::Relaxed) <= floor / 2;
                if p.overflow_bytes <= self.config.buffer_per_partition / 2
                    && room
                    && p.paused.load(Ordering::Relaxed)
                {
                    p.paused.store(false, Ordering::Relaxed);
                    let _ = resume.add_partition(&place.0, place.1);
                }
            }
        }
        if resume.count() > 0 {
            if let Err(error) = consumer.resume(&resume) {
                warn!(consumer = %self.config.consumer, stage = "consume", %error, "cannot resume partitions");
            }
        }
    }

    /// Stops the workers, waits for the records in hand up to the shutdown timeout (then
    /// abandons them: their transactions roll back and they are redelivered), commits what
    /// finished and closes the consumer, all within the timeout.
    async fn stop(
        &self,
        consumer: StreamConsumer<InboxContext>,
        shared: &Arc<Shared>,
        tracker: TaskTracker,
        stop_all: CancellationToken,
        abandon: CancellationToken,
    ) {
        let started = Instant::now();
        let timeout = self.config.shutdown_timeout;
        stop_all.cancel();
        {
            let mut state = shared.lock();
            for p in state.partitions.values_mut() {
                p.queue = None;
                p.overflow.clear();
                p.overflow_bytes = 0;
            }
        }
        tracker.close();
        // Workers get four fifths of the time; committing and closing the rest.
        if tokio::time::timeout(timeout.mul_f64(0.8), tracker.wait()).await.is_err() {
            warn!(consumer = %self.config.consumer, stage = "shutdown", timeout = ?timeout,
                  "records still in hand at the shutdown timeout are abandoned: rolled back, redelivered later");
            abandon.cancel();
            let _ = tokio::time::timeout(Duration::from_millis(100), tracker.wait()).await;
        }
        let list = shared.to_commit(true);
        let consumer_name = self.config.consumer.clone();
        // Committing and closing block on the broker: on a thread of their own, so that a
        // broker that does not answer cannot hold `run()` past the timeout.
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            if list.count() > 0 {
                if let Err(error) = consumer.commit(&list, CommitMode::Sync) {
                    warn!(consumer = %consumer_name, stage = "shutdown", %error, "final offset commit failed");
                }
            }
            drop(consumer);
            let _ = done_tx.send(());
        });
        let left = timeout.saturating_sub(started.elapsed()).max(Duration::from_millis(100));
        if tokio::time::timeout(left, done_rx).await.is_err() {
            warn!(consumer = %self.config.consumer, stage = "shutdown",
                  "the Kafka consumer did not close within the shutdown timeout; left closing in the background");
        }
    }
}
