//! `cargo xtask`: the project's chores as one command line. Each command lives in its own
//! module and is a thin layer over library functions users can call from their own xtask.

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use outbox_runtime::registry::{self, EventDescriptor};

// Linked for its registered events.
use outbox_examples as _;

mod bench;
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

/// The events the contract commands work on: every registered one but the test kit's
/// (`outbox_tests::events`), which this binary links for its set-up and which have no
/// committed schemas.
fn contract_events() -> Vec<&'static EventDescriptor> {
    registry::events().into_iter().filter(|e| !e.rust_type.starts_with("outbox_tests::")).collect()
}

/// Runs `run` on a multi-threaded runtime: exit code 0 when it returns true, 1 when it
/// returns false or fails (said as "`name` failed: ...").
pub(crate) fn block_on(
    name: &str,
    run: impl Future<Output = Result<bool, outbox_tests::Failure>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("{name} failed: {e}");
            ExitCode::from(1)
        }
    }
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
            .asyncapi_title("Order service events (outbox examples)")
            .run_on(cmd, &contract_events()),
        Command::Demo(args) => demo::run(args),
        Command::Chaos(args) => chaos::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Fuzz(cmd) => fuzz::run(cmd),
    }
}

#[cfg(test)]
mod tests {
    use super::{contract_events, registry};

    #[test]
    fn the_contract_commands_leave_out_the_test_kits_events_only() {
        let all = registry::events();
        let kit = |rust_type: &str| rust_type.starts_with("outbox_tests::");
        let contracts = contract_events();
        assert!(contracts.iter().all(|e| !kit(e.rust_type)));
        assert!(contracts.iter().any(|e| e.rust_type.starts_with("outbox_examples::")));
        assert_eq!(contracts.len(), all.iter().filter(|e| !kit(e.rust_type)).count());
    }
}
