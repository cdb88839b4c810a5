//! The fuzz run's verdict: what the inbox recorded (effects, stale and parked rows, its
//! counters, committed offsets) checked against what the generator says each record must
//! come to.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use outbox_runtime::inbox::InboxStats;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::{total, Expected, Planned};
use crate::kafka::Kafka;

/// What starts the line on which `tests/tests/inbox_fuzz.rs` prints its [`Verdict`] as
/// JSON, and `cargo xtask fuzz inbox` finds it.
pub const VERDICT_PREFIX: &str = "fuzz verdict: ";

/// The result of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// The seed that reproduces the run (`OUTBOX_TEST_SEED` / `--seed`).
    pub seed: u64,
    /// Records produced.
    pub records: usize,
    /// Partitions of the topic.
    pub partitions: i32,
    /// Outcomes the inbox counted.
    pub applied: u64,
    /// Duplicates absorbed.
    pub duplicates: u64,
    /// Stale versions absorbed.
    pub stale: u64,
    /// Parked with a reason.
    pub parked: u64,
    /// Held behind a parked record.
    pub held: u64,
    /// Ignored types.
    pub ignored: u64,
    /// Retries (transient failures).
    pub retries: u64,
    /// Event ids whose effect ran more than once.
    pub applied_twice: u64,
    /// Records with no recorded outcome.
    pub without_outcome: u64,
    /// Records whose recorded outcome is not the one they must have.
    pub wrong_outcome: u64,
    /// Valid events (that must apply) not applied.
    pub valid_not_applied: u64,
    /// Offsets between the committed ones and the partitions' ends, summed.
    pub offsets_behind: i64,
    /// Records the broker deleted before they could be read (low watermarks above 0):
    /// the run is void then; use more partitions.
    pub broker_dropped: i64,
    /// Whether `run()` returned `Ok` within its shutdown timeout after cancel.
    pub run_returned: bool,
    /// Expected outcomes by kind.
    pub expected: BTreeMap<Expected, u64>,
    /// Seconds from the first record to the last outcome.
    pub seconds: f64,
    /// The first few mismatches, for the reader.
    pub mismatches: Vec<String>,
}

impl Verdict {
    /// Whether every guarantee held.
    pub fn ok(&self) -> bool {
        self.applied_twice == 0
            && self.without_outcome == 0
            && self.wrong_outcome == 0
            && self.valid_not_applied == 0
            && self.offsets_behind == 0
            && self.broker_dropped == 0
            && self.run_returned
    }
}

/// What a finished run leaves to judge.
pub(super) struct Finished {
    /// The seed the records were generated from.
    pub(super) seed: u64,
    /// How many records were produced.
    pub(super) records: usize,
    /// Partitions of the topic.
    pub(super) partitions: i32,
    /// The inbox's consumer group.
    pub(super) consumer: String,
    /// The topic.
    pub(super) topic: String,
    /// The records, with what each must come to.
    pub(super) planned: Vec<Planned>,
    /// Per partition, the offset after the last record produced.
    pub(super) ends: Vec<i64>,
    /// The inbox's counters.
    pub(super) stats: Arc<InboxStats>,
    /// Seconds from the first record to the last outcome.
    pub(super) seconds: f64,
    /// Whether `run()` returned `Ok` within its shutdown timeout after cancel.
    pub(super) run_returned: bool,
}

/// Judges what the inbox recorded in a finished run.
pub(super) async fn check(pool: &PgPool, kafka: &Kafka, finished: Finished) -> Verdict {
    let Finished { seed, records, partitions, consumer, topic, planned, ends, stats, seconds, run_returned } =
        finished;
    // What the inbox recorded, per (partition, offset).
    let effects: Vec<(Uuid, i32, i64)> =
        sqlx::query_as("SELECT event_id, kafka_partition, kafka_offset FROM fuzz_effects")
            .fetch_all(pool)
            .await
            .expect("effects");
    let stale: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT kafka_partition, kafka_offset FROM inbox WHERE consumer = $1 AND topic = $2 AND outcome = 'stale'",
    )
    .bind(&consumer)
    .bind(&topic)
    .fetch_all(pool)
    .await
    .expect("stale");
    let parked: Vec<(i32, i64, String)> = sqlx::query_as(
        "SELECT kafka_partition, kafka_offset, status FROM inbox_parked WHERE consumer = $1 AND topic = $2",
    )
    .bind(&consumer)
    .bind(&topic)
    .fetch_all(pool)
    .await
    .expect("parked");
    let mut per_event: HashMap<Uuid, u64> = HashMap::new();
    let mut traced: HashMap<(i32, i64), Vec<Expected>> = HashMap::new();
    for (id, p, o) in &effects {
        *per_event.entry(*id).or_default() += 1;
        traced.entry((*p, *o)).or_default().push(Expected::Applied);
    }
    for (p, o) in &stale {
        traced.entry((*p, *o)).or_default().push(Expected::Stale);
    }
    for (p, o, status) in &parked {
        let outcome = if status == "held" { Expected::Held } else { Expected::Parked };
        traced.entry((*p, *o)).or_default().push(outcome);
    }
    let mut verdict = Verdict {
        seed,
        records,
        partitions,
        applied: stats.applied(),
        duplicates: stats.duplicates(),
        stale: stats.stale(),
        parked: stats.parked(),
        held: stats.held(),
        ignored: stats.ignored(),
        retries: stats.retries(),
        applied_twice: per_event.values().filter(|n| **n > 1).count() as u64,
        without_outcome: (records as u64).saturating_sub(total(&stats)),
        wrong_outcome: 0,
        valid_not_applied: 0,
        offsets_behind: 0,
        broker_dropped: 0,
        run_returned,
        expected: BTreeMap::new(),
        seconds,
        mismatches: Vec::new(),
    };
    for p in &planned {
        *verdict.expected.entry(p.expected).or_default() += 1;
        let seen = traced.get(&(p.record.partition, p.offset)).cloned().unwrap_or_default();
        let fine = match p.expected {
            // No trace in the database: counted below.
            Expected::Duplicate | Expected::Ignored => seen.is_empty(),
            outcome => seen == [outcome],
        };
        if !fine {
            if seen.is_empty() {
                verdict.without_outcome += 1;
            } else {
                verdict.wrong_outcome += 1;
            }
            if p.expected == Expected::Applied && !seen.contains(&Expected::Applied) {
                verdict.valid_not_applied += 1;
            }
            if verdict.mismatches.len() < 10 {
                verdict.mismatches.push(format!(
                    "{} record at {}@{} must be {:?}, recorded {seen:?}",
                    p.kind, p.record.partition, p.offset, p.expected
                ));
            }
        }
    }
    // The counters must agree with the model for the outcomes that leave no trace.
    let count = |e: Expected| verdict.expected.get(&e).copied().unwrap_or(0);
    for (name, counted, must) in [
        ("duplicate", verdict.duplicates, count(Expected::Duplicate)),
        ("ignored", verdict.ignored, count(Expected::Ignored)),
        ("applied", verdict.applied, count(Expected::Applied)),
        ("parked", verdict.parked, count(Expected::Parked)),
        ("held", verdict.held, count(Expected::Held)),
        ("stale", verdict.stale, count(Expected::Stale)),
    ] {
        if counted != must {
            verdict.wrong_outcome += counted.abs_diff(must);
            verdict.mismatches.push(format!("{name}: counted {counted}, must be {must}"));
        }
    }
    let watermarks = kafka.watermarks(&topic, partitions);
    verdict.broker_dropped = watermarks.iter().map(|(low, _)| *low).sum();
    let highs: Vec<i64> = watermarks.iter().map(|(_, high)| *high).collect();
    if verdict.broker_dropped != 0 || highs != ends {
        verdict.mismatches.push(format!(
            "the topic holds {watermarks:?} (low, high) per partition, {ends:?} were produced: the broker dropped \
             records; the run is void (use more partitions)"
        ));
        verdict.broker_dropped = verdict.broker_dropped.max(1);
    }
    let committed = kafka.committed(&consumer, &topic, partitions);
    verdict.offsets_behind =
        ends.iter().zip(&committed).map(|(end, c)| if *end == 0 { 0 } else { end - (*c).max(0) }).sum();
    if verdict.offsets_behind != 0 {
        verdict.mismatches.push(format!("committed offsets {committed:?}, partition ends {ends:?}"));
    }
    verdict
}
