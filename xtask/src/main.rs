//! `cargo xtask`: the project's chores as one command line. Each command lives in its own
//! module and is a thin layer over library functions users can call from their own xtask.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

// Linked for its registered events.
use outbox_examples as _;

mod bench;
mod broker;
mod chaos;
mod demo;
mod fuzz;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Chores of the outbox workspace", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// `schema generate | check | compat` and `typegen`, as every project gets them from
    /// `outbox_runtime::xtask`.
    #[command(flatten)]
    Contracts(outbox_runtime::xtask::Command),
    /// Hosts a development Kafka broker (librdkafka's mock cluster) until Ctrl-C.
    Broker(broker::BrokerArgs),
    /// Runs the whole path once: order service -> outbox -> relay -> Kafka -> inbox -> projection.
    Demo(demo::DemoArgs),
    /// Runs service, 2 relays and 2 consumers as processes, kills them at random, checks nothing is lost or applied twice.
    Chaos(chaos::ChaosArgs),
    /// Adversarial runs: records nobody planned for, with a JSON verdict.
    #[command(subcommand)]
    Fuzz(fuzz::FuzzCommand),
    /// Benchmarks: the outbox's costs as ratios against baselines measured in the same run.
    Bench(bench::BenchArgs),
}

/// Recreates database `name` on the server of `base_url` (dropping it first); returns its URL.
pub(crate) async fn fresh_database(
    admin: &sqlx::PgPool,
    base_url: &str,
    name: &str,
) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    use sqlx::AssertSqlSafe;
    sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")))
        .execute(admin)
        .await?;
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{name}\""))).execute(admin).await?;
    let server = base_url.rsplit_once('/').map_or(base_url, |(server, _)| server);
    Ok(format!("{server}/{name}"))
}

/// The workspace root (where `schemas/` lives).
pub(crate) fn project_root() -> PathBuf {
    let xtask_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    xtask_dir.parent().map(PathBuf::from).unwrap_or(xtask_dir)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Contracts(cmd) => outbox_runtime::xtask::Xtask::new()
            .root(project_root())
            .typegen_out("examples/src/consumer_types.rs")
            .run(cmd),
        Command::Broker(args) => broker::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Chaos(args) => chaos::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Fuzz(cmd) => fuzz::run(cmd),
    }
}
