//! Which position of the write-ahead log may be confirmed to the slot: the end of a commit
//! once every row of it and of every earlier commit is done (acknowledged and marked, or
//! recorded as failed or handed to the table), and a keepalive's or heartbeat's position
//! once everything received before it is done ([invariant 15](crate::guarantees#i15)).

use std::collections::VecDeque;

/// A place in the stream that can be confirmed once everything up to it is done.
#[derive(Debug)]
struct Entry {
    seq: u64,
    /// The LSN to confirm; `None` while a transaction is still being received.
    end: Option<u64>,
    /// Rows of it not yet done.
    outstanding: usize,
    /// The greatest position of the done entries after it, folded into it: confirmable
    /// with it. Entries are so bounded by the transactions not done (whose rows the memory
    /// budget bounds), however many keepalives and done commits queue behind one.
    tail: u64,
}

impl Entry {
    fn done(&self) -> bool {
        self.end.is_some() && self.outstanding == 0
    }

    fn reach(&self) -> u64 {
        self.end.unwrap_or(0).max(self.tail)
    }
}

/// The stream's transactions and positions in the order received, until confirmed.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    entries: VecDeque<Entry>,
    next: u64,
    /// The highest LSN handed out by [`Progress::confirmable`].
    confirmed: u64,
}

impl Progress {
    /// A transaction begins: its rows follow, then its commit.
    pub(crate) fn begin(&mut self) -> u64 {
        let seq = self.next;
        self.next += 1;
        self.entries.push_back(Entry { seq, end: None, outstanding: 0, tail: 0 });
        seq
    }

    fn index(&self, seq: u64) -> Option<usize> {
        self.entries.binary_search_by_key(&seq, |e| e.seq).ok()
    }

    /// Folds entry `i` into the one before it once it is done (never the first: that one
    /// is confirmed instead).
    fn fold(&mut self, i: usize) {
        if i == 0 || !self.entries[i].done() {
            return;
        }
        let reach = self.entries[i].reach();
        let before = &mut self.entries[i - 1];
        before.tail = before.tail.max(reach);
        self.entries.remove(i);
    }

    /// A row of the transaction `seq` (the last one begun) arrived. A keepalive may have
    /// come in between: the transaction is found by its number, not by being last.
    pub(crate) fn row(&mut self, seq: u64) {
        if let Some(i) = self.index(seq) {
            self.entries[i].outstanding += 1;
        }
    }

    /// The transaction `seq` committed, ending at `end`.
    pub(crate) fn commit(&mut self, seq: u64, end: u64) {
        if let Some(i) = self.index(seq) {
            if self.entries[i].end.is_none() {
                self.entries[i].end = Some(end);
            }
            self.fold(i);
        }
    }

    /// A position with nothing of ours before it that was not received (a keepalive's or a
    /// heartbeat's): confirmable once everything received before it is done.
    pub(crate) fn position(&mut self, lsn: u64) {
        match self.entries.back_mut() {
            Some(last) => last.tail = last.tail.max(lsn),
            None => {
                let seq = self.next;
                self.next += 1;
                self.entries.push_back(Entry { seq, end: Some(lsn), outstanding: 0, tail: 0 });
            }
        }
    }

    /// A row of transaction `seq` is done.
    pub(crate) fn done(&mut self, seq: u64) {
        if let Some(i) = self.index(seq) {
            let entry = &mut self.entries[i];
            entry.outstanding = entry.outstanding.saturating_sub(1);
            self.fold(i);
        }
    }

    /// The LSN to confirm now, if it moved: the greatest position of the done prefix.
    pub(crate) fn confirmable(&mut self) -> Option<u64> {
        let mut best = None;
        while let Some(entry) = self.entries.front() {
            if !entry.done() {
                break;
            }
            best = Some(best.map_or(entry.reach(), |b: u64| b.max(entry.reach())));
            self.entries.pop_front();
        }
        let best = best.filter(|b| *b > self.confirmed)?;
        self.confirmed = best;
        Some(best)
    }

    /// Transactions and positions received and not yet confirmable.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Progress;

    /// Rows finish in any order; what is confirmed never passes a commit with a row not
    /// done, and reaches the last commit once all are. Seeded, the seed printed
    /// (`PROGRESS_SEED=n` repeats a run).
    #[test]
    fn never_confirms_past_a_row_not_done() {
        let seed = std::env::var("PROGRESS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| fastrand::u64(..));
        println!("PROGRESS_SEED={seed}");
        let mut rng = fastrand::Rng::with_seed(seed);
        for _ in 0..200 {
            let mut p = Progress::default();
            // (seq, end lsn, rows) per transaction; keepalives between some.
            let mut rows: Vec<(u64, u64)> = Vec::new();
            let mut ends = Vec::new();
            let mut lsn = 100;
            for _ in 0..rng.usize(1..12) {
                if rng.bool() {
                    lsn += 5;
                    p.position(lsn);
                    ends.push((lsn, usize::MAX));
                }
                let seq = p.begin();
                let n = rng.usize(0..5);
                for _ in 0..n {
                    p.row(seq);
                    rows.push((seq, lsn));
                    if rng.u8(..) < 40 {
                        // A keepalive inside the transaction: behind it, so held back by it.
                        p.position(lsn + 1);
                        ends.push((lsn + 1, usize::MAX));
                    }
                }
                lsn += 10;
                p.commit(seq, lsn);
                ends.push((lsn, seq as usize));
            }
            rng.shuffle(&mut rows);
            let mut remaining = rows.clone();
            let mut confirmed = 0;
            while let Some((seq, _)) = remaining.pop() {
                p.done(seq);
                if let Some(c) = p.confirmable() {
                    assert!(c > confirmed, "seed {seed}: confirmed went from {confirmed} to {c}");
                    confirmed = c;
                }
                // No row still outstanding belongs to a commit at or below what is confirmed.
                for (open_seq, _) in &remaining {
                    let (end, _) = ends.iter().find(|(_, s)| *s == *open_seq as usize).expect("its commit");
                    assert!(
                        *end > confirmed,
                        "seed {seed}: confirmed {confirmed} passes an open row of the commit ending at {end}"
                    );
                }
            }
            assert_eq!(
                p.confirmable().unwrap_or(confirmed).max(confirmed),
                lsn,
                "seed {seed}: all done, all confirmed"
            );
            assert_eq!(p.open(), 0);
        }
    }

    /// Behind one transaction not done, a million done ones and keepalives take one
    /// entry, not a million.
    #[test]
    fn done_entries_behind_a_stuck_one_are_folded_into_it() {
        let mut p = Progress::default();
        let stuck = p.begin();
        p.row(stuck);
        p.commit(stuck, 10);
        for i in 0..1_000_000u64 {
            let seq = p.begin();
            p.row(seq);
            p.commit(seq, 20 + i);
            p.done(seq);
            p.position(20 + i);
        }
        assert_eq!(p.open(), 1, "folded");
        assert_eq!(p.confirmable(), None, "the stuck one holds everything");
        p.done(stuck);
        assert_eq!(p.confirmable(), Some(20 + 999_999));
    }

    #[test]
    fn an_open_transaction_holds_back_a_later_keepalive() {
        let mut p = Progress::default();
        let seq = p.begin();
        p.row(seq);
        p.position(500);
        p.row(seq);
        assert_eq!(p.confirmable(), None, "mid-transaction keepalive");
        p.commit(seq, 400);
        assert_eq!(p.confirmable(), None, "rows not done");
        p.done(seq);
        assert_eq!(p.confirmable(), None, "one row not done");
        p.done(seq);
        assert_eq!(p.confirmable(), Some(500));
        assert_eq!(p.confirmable(), None, "nothing new");
    }
}
