//! What the inbox holds in memory: every received record carries a [`Charge`] of its
//! bytes against the consumer's total and its partition's, from the moment the receive
//! loop hands it on until the worker is done with it (its outcome recorded, or the record
//! dropped on a revoke or a stop). The loop pauses partitions past the total
//! ([`crate::inbox::InboxConfig::memory_budget`]) and resumes them by these counts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A record's bytes, counted while it lives.
pub(crate) struct Charge {
    total: Arc<AtomicUsize>,
    partition: Arc<AtomicUsize>,
    bytes: usize,
}

impl Charge {
    /// Counts `bytes` against `total` and `partition` until dropped.
    pub(crate) fn new(total: &Arc<AtomicUsize>, partition: &Arc<AtomicUsize>, bytes: usize) -> Self {
        total.fetch_add(bytes, Ordering::Relaxed);
        partition.fetch_add(bytes, Ordering::Relaxed);
        Charge { total: total.clone(), partition: partition.clone(), bytes }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.total.fetch_sub(self.bytes, Ordering::Relaxed);
        self.partition.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Charge").field("bytes", &self.bytes).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_counts_while_it_lives_and_clones_of_its_record_share_it() {
        let (total, partition) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let first = Arc::new(Charge::new(&total, &partition, 100));
        let second = Charge::new(&total, &Arc::new(AtomicUsize::new(0)), 50);
        assert_eq!((total.load(Ordering::Relaxed), partition.load(Ordering::Relaxed)), (150, 100));
        let shared = first.clone();
        drop(first);
        assert_eq!(total.load(Ordering::Relaxed), 150, "a clone of the record still holds it");
        drop(shared);
        drop(second);
        assert_eq!((total.load(Ordering::Relaxed), partition.load(Ordering::Relaxed)), (0, 0));
    }
}
