//! The compatibility checker's JSON Schema semantics against the `jsonschema` crate: see
//! `outbox_tests::compat_fuzz`. Bounded here (600 pairs, or `OUTBOX_COMPAT_PAIRS`);
//! `cargo xtask fuzz compat --pairs N --seed S` runs it long. A failing run prints its
//! seed: `OUTBOX_TEST_SEED=<seed> cargo test -p outbox-tests --test compat_soundness`
//! repeats it.

use outbox_tests::compat_fuzz::{self, VERDICT_PREFIX};
use outbox_tests::Rng;

#[test]
fn no_compatible_verdict_has_a_counterexample_and_every_schema_reads_itself() {
    let seed = Rng::seed_from_env("compat_soundness");
    let pairs = std::env::var("OUTBOX_COMPAT_PAIRS").ok().and_then(|s| s.parse().ok()).unwrap_or(600);
    let verdict = compat_fuzz::run(pairs, seed);
    eprintln!("{VERDICT_PREFIX}{}", serde_json::to_string(&verdict).expect("json"));
    // Not vacuous: many compatible verdicts, each tried with values the writer accepts.
    let proved = verdict.compatible - verdict.compatible_identical;
    assert!(
        proved * 5 >= verdict.judged,
        "seed {seed}: too few compatible verdicts on different schemas: {verdict:?}"
    );
    assert!(
        verdict.instances >= verdict.compatible * 5,
        "seed {seed}: too few values per compatible pair: {verdict:?}"
    );
    assert_eq!(verdict.by_dialect.len(), 5, "seed {seed}: every dialect generated");
    assert!(verdict.ok(), "seed {seed}: {verdict:#?}");
}

/// Seeds that once failed, kept: an `anyOf` whose branches lower `exclusiveMaximum`
/// without a `maximum` (the registry emulation once called that the registry failing, on
/// a schema beside an annotated copy of itself), and a writer without `$schema` using
/// `unevaluatedProperties` (draft-07 to registries, and now to the second implementation).
#[test]
fn seeds_that_once_failed_stay_fixed() {
    for seed in [1_796_530_141_417_686_617, 1_796_530_223_015_694_489] {
        let verdict = compat_fuzz::run(600, seed);
        assert!(verdict.ok(), "seed {seed}: {verdict:#?}");
    }
}
