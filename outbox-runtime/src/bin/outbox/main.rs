//! The `outbox` operator command line (feature `cli`).
//!
//! Exit codes: 0 done; 1 nothing matched (no such failed event or parked message, nothing
//! to retry) or, for `reconcile`, differences found; 2 bad arguments or settings (an
//! unmigrated database, no database given, an unknown consumer or table, a schema
//! registry URL with credentials in it, a committed schema the registry does not hold);
//! 3 the database, the broker, the schema registry or the metrics listener is
//! unreachable or failed; 4 the request
//! conflicts with the current state (a message held behind an earlier one: release that
//! first).
//!
//! There is no generic `consume`: applying an event needs the application's handlers, so
//! a consumer is the application's own binary (`outbox_runtime::inbox::Inbox`); the
//! `inbox` commands operate its tables from here.

mod act;
mod args;
mod broker;
mod cdc;
mod commands;
mod console;
mod hint;
mod render;
mod setup;

use std::process::ExitCode;

use clap::Parser;
use outbox_runtime::secrets::redact_urls;
use outbox_runtime::Error;

use self::args::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outbox: {e}");
            return ExitCode::from(3);
        }
    };
    runtime.block_on(run(cli))
}

/// A failure with its exit code; `missing` when it is a table that does not exist, for
/// the hint that names a close one.
pub(crate) struct Fail {
    pub(crate) code: u8,
    pub(crate) message: String,
    pub(crate) missing: Option<hint::Missing>,
}

/// A failure with exit code `code`.
pub(crate) fn fail(code: u8, message: impl Into<String>) -> Fail {
    Fail { code, message: message.into(), missing: None }
}

impl From<Error> for Fail {
    fn from(error: Error) -> Self {
        match error {
            Error::NotFound(message) => fail(1, message),
            Error::Config(_) | Error::InvalidIdentifier { .. } => fail(2, error.to_string()),
            Error::NotMigrated { table } => hint::Missing {
                table,
                inbox: false,
                fix: "run `outbox migrate` (with the same --schema and --table) to create the outbox's tables".into(),
            }
            .into(),
            Error::InboxNotMigrated { table } => hint::Missing {
                table,
                inbox: true,
                fix: "the inbox's tables are created by the consumer's own binary, with `inbox.migrator().run(&pool)` (`outbox migrate` creates the outbox's only)".into(),
            }
            .into(),
            Error::MigrationsBehind { table, missing } => fail(
                2,
                format!(
                    "table {table} predates this version of outbox ({missing}): run `outbox migrate` \
                     (with the same --schema and --table) to upgrade it"
                ),
            ),
            Error::Conflict(_) => fail(4, error.to_string()),
            // A slot dropped or lost: the operator's to recover (a backfill), not a retry.
            Error::Replication(_) => fail(4, error.to_string()),
            _ => fail(3, error.to_string()),
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
    match commands::execute(cli).await {
        Ok(code) => code,
        Err(Fail { code, message, .. }) => {
            // Whatever reported the error, a URL in it is shown without its password.
            eprintln!("outbox: {}", redact_urls(&message));
            ExitCode::from(code)
        }
    }
}
