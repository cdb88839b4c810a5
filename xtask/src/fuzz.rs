//! `cargo xtask fuzz inbox --records N --seed S`: the inbox against a seeded generator of
//! records nobody planned for (`outbox_tests::fuzz`), long. Prints a JSON verdict; exits 0
//! when every guarantee held, 1 when one broke (the seed repeats the run), 2 on bad
//! arguments (clap's).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use outbox_tests::kafka::Kafka;
use sqlx::postgres::PgPoolOptions;

#[derive(Subcommand)]
pub(crate) enum FuzzCommand {
    /// Records from nowhere consumed by the inbox: every one must get exactly one outcome.
    Inbox(InboxArgs),
}

#[derive(Args)]
pub(crate) struct InboxArgs {
    /// Records to generate.
    #[arg(long, default_value_t = 20_000)]
    records: usize,
    /// Seed of the generator (default: from the clock; printed in the verdict).
    #[arg(long)]
    seed: Option<u64>,
    /// Partitions of the topic (default: one per 2,500 records, 4 to 64, so that the mock
    /// cluster's 5 MB per partition log keeps every record).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=64))]
    partitions: Option<i32>,
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

pub(crate) fn run(command: FuzzCommand) -> ExitCode {
    let FuzzCommand::Inbox(args) = command;
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fuzz: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(inbox(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("fuzz failed: {e}");
            ExitCode::from(1)
        }
    }
}

async fn inbox(args: InboxArgs) -> Result<bool, Failure> {
    let seed = args.seed.unwrap_or_else(|| outbox_tests::Rng::seed_from_env("fuzz inbox"));
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| outbox_examples::relay_process::DEFAULT_DATABASE_URL.to_owned());
    let admin = PgPoolOptions::new().max_connections(1).connect(&base).await?;
    let url = crate::fresh_database(&admin, &base, "outbox_fuzz").await?;
    let pool = PgPoolOptions::new().max_connections(10).connect(&url).await?;
    let partitions = args
        .partitions
        .unwrap_or_else(|| i32::try_from(args.records.div_ceil(2500).clamp(4, 64)).unwrap_or(4));
    let kafka = Kafka::start();
    eprintln!(
        "fuzz inbox: {} records, seed {seed}, {} partitions, broker {}",
        args.records,
        partitions,
        kafka.bootstrap()
    );
    let verdict = outbox_tests::fuzz::run(&pool, &kafka, args.records, seed, partitions).await;
    println!("{}", serde_json::to_string(&verdict)?);
    if !verdict.ok() {
        eprintln!("fuzz inbox: a guarantee broke; repeat with --seed {seed}");
    }
    Ok(verdict.ok())
}
