//! The inbox against a seeded generator of records nobody planned for (invariants 7, 8, 9,
//! 11): see `outbox_tests::fuzz`. Bounded here (2,000 records over 4 partitions, or
//! `OUTBOX_FUZZ_RECORDS` and `OUTBOX_FUZZ_PARTITIONS`); `cargo xtask fuzz inbox --records N
//! --seed S` runs this test long and prints its verdict (the line `fuzz verdict: {...}`). A
//! failing run prints its seed: `OUTBOX_TEST_SEED=<seed> cargo test -p outbox-tests --test
//! inbox_fuzz` repeats it.

use outbox_tests::fuzz::{self, Expected, VERDICT_PREFIX};
use outbox_tests::kafka::Kafka;
use outbox_tests::Rng;
use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn every_unplanned_record_gets_exactly_one_outcome_and_valid_events_apply_once(pool: PgPool) {
    let seed = Rng::seed_from_env("inbox_fuzz");
    let kafka = Kafka::start();
    // Tansu pays per header and serves ~400 records/s: a smaller bounded run there.
    let default = if kafka.is_mock() { 2000 } else { 500 };
    let records = std::env::var("OUTBOX_FUZZ_RECORDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    let partitions = std::env::var("OUTBOX_FUZZ_PARTITIONS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let verdict = fuzz::run(&pool, &kafka, records, seed, partitions).await;
    eprintln!("{VERDICT_PREFIX}{}", serde_json::to_string(&verdict).expect("json"));
    // Not vacuous: the run exercised every outcome.
    for outcome in [
        Expected::Applied,
        Expected::Duplicate,
        Expected::Stale,
        Expected::Parked,
        Expected::Held,
        Expected::Ignored,
    ] {
        assert!(
            verdict.expected.get(&outcome).copied().unwrap_or(0) > 0,
            "seed {seed}: no {outcome:?} record"
        );
    }
    assert!(verdict.retries > 0, "seed {seed}: no retry was exercised");
    assert!(verdict.ok(), "seed {seed}: {:#?}", verdict);
}
