//! `cargo xtask fuzz inbox --records N --seed S`: the inbox against a seeded generator of
//! records nobody planned for (`outbox_tests::fuzz`), long. It runs the bounded test
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
    let FuzzCommand::Inbox(args) = command;
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
