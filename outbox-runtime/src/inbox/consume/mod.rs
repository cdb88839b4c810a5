//! The receive loop: reads records, hands each partition's to its worker, pauses a
//! partition whose worker is behind (the others go on), commits finished offsets, follows
//! rebalances, and stops on cancel within the shutdown timeout or at once on a fatal error.
//!
//! State shared by the loop, the workers and the rebalance callbacks sits in [`Shared`]
//! behind one mutex, never held across an await:
//! - each owned partition has a worker with a bounded queue and a buffer behind it; the
//!   loop never waits on a queue, so a slow partition never holds up the others. When the
//!   buffer holds `buffer_per_partition` bytes the partition is paused at the broker, so
//!   memory stays bounded; a worker that takes a record wakes the loop, which refills the
//!   queue from the buffer and resumes the partition once half is left ([invariant 11](crate::guarantees#i11));
//!   and when all partitions together hold `memory_budget` bytes, every partition a record
//!   arrives for is paused, until the total is down to half or the partition holds nothing;
//! - a worker reports the next offset to commit after each outcome; the loop commits those
//!   of partitions it owns, and a revoke commits the revoked partitions' finished offsets
//!   synchronously before the revoke completes, stops their workers and drops their queued
//!   records (they are the next owner's now) ([invariant 7](crate::guarantees#i7));
//! - a worker that cannot record an outcome, or panics, fails the whole consumer: `run()`
//!   ends with [`Error::Inbox`] instead of living on without it.

mod context;
mod receive;
mod worker;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::inbox::message::Received;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc::{self};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::warn;

pub(crate) use self::context::InboxContext;

type Place = (String, i32);

/// One owned partition.
struct Partition {
    generation: u64,
    queue: Option<mpsc::Sender<Received>>,
    overflow: VecDeque<Received>,
    /// Bytes of the records in `overflow`.
    overflow_bytes: usize,
    /// Bytes of all its records the inbox holds (see [`crate::inbox::budget`]).
    held: Arc<AtomicUsize>,
    paused: Arc<AtomicBool>,
    stop: CancellationToken,
    /// The next offset to commit (after the last record with an outcome, all earlier ones
    /// having theirs), and the last one committed.
    finished: Option<i64>,
    committed: Option<i64>,
}

#[derive(Default)]
struct State {
    partitions: HashMap<Place, Partition>,
    assigned: HashSet<Place>,
    generation: u64,
    fatal: Option<String>,
}

/// What the loop, the workers and the rebalance callbacks share.
pub(crate) struct Shared {
    consumer: String,
    state: Mutex<State>,
    /// A worker took a record from a paused partition's queue.
    room: Notify,
    /// Set with the first fatal error.
    failed: CancellationToken,
    /// Bytes of all records the inbox holds (see [`crate::inbox::budget`]).
    held: Arc<AtomicUsize>,
    /// The receive loop runs: a revoke commits finished offsets only then (a `run()`
    /// future dropped without cancelling commits nothing more, like a crash; a graceful
    /// stop commits them itself).
    live: AtomicBool,
}

/// Marks the loop as ended when dropped, however it ends.
struct Live<'a>(&'a Shared);

impl Drop for Live<'_> {
    fn drop(&mut self) {
        self.0.live.store(false, Ordering::SeqCst);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than stopping: keep going with what is there.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A worker took a record off `place`'s queue: records waiting in its overflow can move.
    pub(crate) fn made_room(&self, place: &Place) {
        let waiting = self.lock().partitions.get(place).is_some_and(|p| !p.overflow.is_empty());
        if waiting {
            self.room.notify_one();
        }
    }

    /// The record before `next` of `place` has its outcome (ignored if the partition was
    /// revoked since the worker of `generation` started).
    pub(crate) fn finish(&self, place: &Place, generation: u64, next: i64) {
        if let Some(p) = self.lock().partitions.get_mut(place).filter(|p| p.generation == generation) {
            p.finished = Some(next);
        }
    }

    /// Ends the consumer with `reason`.
    pub(crate) fn fail(&self, reason: String) {
        warn!(consumer = %self.consumer, stage = "consume", %reason, "fatal: stopping the consumer");
        self.lock().fatal.get_or_insert(reason);
        self.failed.cancel();
    }

    fn fatal(&self) -> String {
        self.lock().fatal.clone().unwrap_or_else(|| "a partition worker failed".to_owned())
    }

    /// Offsets to commit: finished and not yet committed, of partitions still owned. They
    /// are marked committed (a failed commit resets them, see `commit_callback`).
    fn to_commit(&self, all: bool) -> TopicPartitionList {
        let mut state = self.lock();
        let State { partitions, assigned, .. } = &mut *state;
        let mut list = TopicPartitionList::new();
        for (place, p) in partitions.iter_mut() {
            let Some(next) = p.finished else { continue };
            if assigned.contains(place) && (all || p.committed != Some(next)) {
                let _ = list.add_partition_offset(&place.0, place.1, Offset::Offset(next));
                p.committed = Some(next);
            }
        }
        list
    }

    fn paused_count(&self) -> usize {
        self.lock().partitions.values().filter(|p| p.paused.load(Ordering::Relaxed)).count()
    }
}

/// Commits finished offsets that moved (`all`: every finished offset).
fn commit(consumer: &StreamConsumer<InboxContext>, shared: &Shared, mode: CommitMode, all: bool) {
    let list = shared.to_commit(all);
    if list.count() == 0 {
        return;
    }
    if let Err(error) = consumer.commit(&list, mode) {
        for place in places(&list) {
            if let Some(p) = shared.lock().partitions.get_mut(&place) {
                p.committed = None;
            }
        }
        warn!(consumer = %shared.consumer, stage = "commit", %error, "offset commit failed; tried again at the next tick");
    }
}

pub(super) fn places(list: &TopicPartitionList) -> Vec<Place> {
    list.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect()
}
