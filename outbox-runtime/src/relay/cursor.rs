//! The claim's walk of fresh rows in windows: where the next one starts.

/// Where the claim's walk of fresh rows starts: from the start (`from` 0) as long as its
/// window of `4 * limit` index entries holds enough rows to take; past a window that did
/// not (rows held back behind an earlier row of their aggregate, waiting or failed, fill
/// it), from the entry after it, and so on to the end of the index, then from the start
/// again. So a claim reads O(batch) entries however many rows are held back, and a poison
/// event with a million later events of its aggregate behind it costs each claim a window,
/// not a million entries. A relay keeps one per loop; it starts from the start again
/// whenever the partitions it holds change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FreshCursor {
    /// The first id of the walk; 0 from the start.
    pub(crate) from: i64,
    /// The last claim's window was full and the walk goes on past it: claim again at once.
    pub(crate) advancing: bool,
}

impl FreshCursor {
    /// Entries of the fresh index a claim of `limit` rows reads at most.
    pub(crate) fn window(limit: i64) -> i64 {
        limit.saturating_mul(4).max(64)
    }

    /// Moves on after a claim of `limit` rows: `fresh` the ids its fresh walk found,
    /// sorted, `kept` the ids of the batch, `full_to` the end of its window when the walk
    /// read all of it and it was full.
    pub(super) fn moved(&mut self, limit: i64, full_to: Option<i64>, fresh: &[i64], kept: &[i64]) {
        let kept_fresh: Vec<i64> =
            kept.iter().copied().filter(|id| fresh.binary_search(id).is_ok()).collect();
        let cut = fresh.len() > kept_fresh.len();
        let from = if cut || i64::try_from(fresh.len()).is_ok_and(|n| n >= limit) {
            // The batch is full of what the window holds: from the start again as before,
            // or past the last row taken when walking on.
            if self.from == 0 {
                0
            } else {
                kept_fresh.last().map_or(self.from, |id| id + 1)
            }
        } else if let Some(window_end) = full_to {
            // Rows held back filled the window: walk on past it.
            window_end.saturating_add(1)
        } else {
            // The window reached the end of the index: from the start next time.
            0
        };
        *self = FreshCursor { from, advancing: from > 0 };
    }
}
