//! An inbox consumer whose handler holds every credit until a file exists, so that records
//! pile up in memory as far as the inbox lets them: the process whose resident memory the
//! `inbox_memory` test measures (the broker and the producer live in the test's process,
//! not here). It applies credits (the tests' `Ledger`, into the `effects` table) once the
//! file exists, until killed. It prints `calls N` (credits that reached the handler so far)
//! four times a second.
//!
//! Usage: `budget-consumer DATABASE_URL BOOTSTRAP TOPIC CONSUMER MEMORY_BUDGET RELEASE_FILE`

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::inbox::{Handlers, Inbox, InboxConfig};
use outbox_tests::inbox_kit::effects::Ledger;
use outbox_tests::Credit;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, bootstrap, topic, consumer, budget, release] = args.as_slice() else {
        eprintln!("usage: budget-consumer DATABASE_URL BOOTSTRAP TOPIC CONSUMER MEMORY_BUDGET RELEASE_FILE");
        return ExitCode::from(2);
    };
    let Ok(budget) = budget.parse::<usize>() else {
        eprintln!("budget-consumer: MEMORY_BUDGET {budget:?} is not a number of bytes");
        return ExitCode::from(2);
    };
    let release = PathBuf::from(release);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let pool = PgPoolOptions::new().max_connections(8).connect(url).await.expect("database");
        let gate = Arc::new(Semaphore::new(0));
        let opened = gate.clone();
        tokio::spawn(async move {
            while !release.exists() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            opened.add_permits(1_000_000);
        });
        let config = InboxConfig::new(consumer, bootstrap, [topic.clone()])
            .memory_budget(budget)
            .batch_timeout(Duration::from_secs(3600))
            .commit_interval(Duration::from_millis(100));
        let ledger = Ledger { gate: Some(gate), ..Ledger::default() };
        // How many credits reached the handler so far, for the test to see records held.
        let calls = ledger.calls.clone();
        tokio::spawn(async move {
            loop {
                println!("calls {}", calls.load(std::sync::atomic::Ordering::SeqCst));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        let inbox = Inbox::new(pool.clone(), config, Handlers::new().on::<Credit, _>(ledger)).expect("inbox");
        inbox.migrator().run(&pool).await.expect("migrate");
        match inbox.run(CancellationToken::new()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("budget-consumer: {error}");
                ExitCode::FAILURE
            }
        }
    })
}
