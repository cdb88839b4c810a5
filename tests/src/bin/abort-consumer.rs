//! An inbox consumer as a service built with `panic = "abort"` runs it. The process's
//! panic hook aborts it, so any panic anywhere ends the process at once, before any
//! `catch_unwind` could catch it: what `panic = "abort"` does, without building the
//! workspace a second time under another profile. It applies credits (the tests' `Ledger`,
//! into the `effects` table) until killed.
//!
//! Usage: `abort-consumer DATABASE_URL BOOTSTRAP TOPIC CONSUMER`, or `abort-consumer --panic`
//! to panic inside `catch_unwind` (the control: the process aborts).

use std::process::ExitCode;
use std::time::Duration;

use outbox_runtime::inbox::{Handlers, Inbox, InboxConfig};
use outbox_tests::inbox_kit::effects::Ledger;
use outbox_tests::Credit;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("abort-consumer: {info}; aborting, as under panic = \"abort\"");
        std::process::abort();
    }));
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--panic") {
        let caught = std::panic::catch_unwind(|| panic!("a panic that catch_unwind would catch"));
        eprintln!("abort-consumer: the panic was caught ({}): the hook did not abort", caught.is_err());
        return ExitCode::SUCCESS;
    }
    let [url, bootstrap, topic, consumer] = args.as_slice() else {
        eprintln!("usage: abort-consumer DATABASE_URL BOOTSTRAP TOPIC CONSUMER | --panic");
        return ExitCode::from(2);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let pool = PgPoolOptions::new().max_connections(4).connect(url).await.expect("database");
        let config = InboxConfig::new(consumer, bootstrap, [topic.clone()])
            .backoff(Duration::from_millis(20), Duration::from_millis(100))
            .commit_interval(Duration::from_millis(100));
        let inbox = Inbox::new(pool.clone(), config, Handlers::new().on::<Credit, _>(Ledger::default()))
            .expect("inbox");
        inbox.migrator().run(&pool).await.expect("migrate");
        match inbox.run(CancellationToken::new()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("abort-consumer: {error}");
                ExitCode::FAILURE
            }
        }
    })
}
