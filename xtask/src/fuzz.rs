//! `cargo xtask fuzz inbox --records N --seed S`: the inbox against a seeded generator of
//! records nobody planned for (`outbox_tests::fuzz`), long. `cargo xtask fuzz compat
//! --pairs N --seed S`: the compatibility checker against the `jsonschema` crate
//! (`outbox_tests::compat_fuzz`), long.
//!
//! `fuzz inbox` It runs the bounded test
//! (`tests/tests/inbox_fuzz.rs`) with more records, so that the long run and the bounded
//! one are one run with one set of checks, and prints the test's JSON verdict. Exits 0
//! when every guarantee held, 1 when one broke (the seed repeats the run), 2 on bad
//! arguments (clap's).

use std::process::{Command, ExitCode, Stdio};

use clap::{Args, Subcommand};
use outbox_tests::fuzz::VERDICT_PREFIX;
use outbox_tests::SEED_VAR;

#[derive(Subcommand)]
pub(crate) enum FuzzCommand {
    /// Records from nowhere consumed by the inbox: every one must get exactly one outcome.
    Inbox(InboxArgs),
    /// Schema pairs of every dialect judged compatible must have no value the old schema
    /// accepts and the new one refuses (the `jsonschema` crate decides).
    Compat(CompatArgs),
}

#[derive(Args)]
pub(crate) struct CompatArgs {
    /// Schema pairs to generate.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pairs: u64,
    /// Seed of the generator (default: from the clock; printed in the verdict).
    #[arg(long)]
    seed: Option<u64>,
}

#[derive(Args)]
pub(crate) struct InboxArgs {
    /// Records to generate.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    records: u64,
    /// Seed of the generator (default: from the clock; printed in the verdict).
    #[arg(long)]
    seed: Option<u64>,
    /// Partitions of the topic (default: one per 2,500 records, 4 to 64, so that the mock
    /// cluster's 5 MB per partition log keeps every record).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    partitions: Option<u64>,
}

pub(crate) fn run(command: FuzzCommand) -> ExitCode {
    match command {
        FuzzCommand::Inbox(args) => inbox(args),
        FuzzCommand::Compat(args) => compat(args),
    }
}

/// In this process: the checker is a pure function, no service to start. The verdict is
/// the bounded test's (`tests/tests/compat_soundness.rs`), as JSON on stdout.
fn compat(args: CompatArgs) -> ExitCode {
    let seed = args.seed.unwrap_or_else(outbox_tests::Rng::clock_seed);
    eprintln!("fuzz compat: {} pairs, seed {seed}", args.pairs);
    let verdict = outbox_tests::compat_fuzz::run(args.pairs, seed);
    match serde_json::to_string(&verdict) {
        Ok(json) => println!("{json}"),
        Err(e) => {
            eprintln!("fuzz compat: the verdict is not JSON: {e}");
            return ExitCode::from(1);
        }
    }
    eprintln!(
        "fuzz compat: {} directions judged, {} compatible ({} identical), {} values checked, {} counterexample(s), {} identity failure(s)",
        verdict.judged,
        verdict.compatible,
        verdict.compatible_identical,
        verdict.instances,
        verdict.counterexamples.len(),
        verdict.identity_failures.len()
    );
    if verdict.ok() {
        ExitCode::SUCCESS
    } else {
        eprintln!("fuzz compat: the checker is wrong; repeat with --seed {seed} (or OUTBOX_TEST_SEED={seed} cargo test -p outbox-tests --test compat_soundness with OUTBOX_COMPAT_PAIRS={})", args.pairs);
        ExitCode::from(1)
    }
}

fn inbox(args: InboxArgs) -> ExitCode {
    let partitions = args.partitions.unwrap_or_else(|| args.records.div_ceil(2500).clamp(4, 64));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut test = Command::new(cargo);
    test.args(["test", "--quiet", "-p", "outbox-tests", "--test", "inbox_fuzz", "--", "--nocapture"])
        .env("OUTBOX_FUZZ_RECORDS", args.records.to_string())
        .env("OUTBOX_FUZZ_PARTITIONS", partitions.to_string())
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(seed) = args.seed {
        test.env(SEED_VAR, seed.to_string());
    }
    eprintln!("fuzz inbox: {} records over {partitions} partitions", args.records);
    let output = match test.output() {
        Ok(output) => output,
        Err(e) => {
            eprintln!("fuzz inbox: cannot run the fuzz test: {e}");
            return ExitCode::from(1);
        }
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    let verdict = stderr.lines().find_map(|line| line.strip_prefix(VERDICT_PREFIX));
    match verdict {
        Some(json) => println!("{json}"),
        None => {
            // No verdict: the run itself failed; show what it said.
            eprintln!("{stderr}");
            eprintln!("fuzz inbox: the run ended without a verdict");
            return ExitCode::from(1);
        }
    }
    if output.status.success() {
        ExitCode::SUCCESS
    } else {
        let seed = stderr.lines().find_map(|l| l.split(&format!("{SEED_VAR}=")).nth(1)).unwrap_or("?");
        eprintln!("fuzz inbox: a guarantee broke; repeat with --seed {seed}");
        ExitCode::from(1)
    }
}
