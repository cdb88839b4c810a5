//! The `outbox` operator command line (feature `cli`).
//!
//! Exit codes: 0 done; 1 nothing matched (no such failed event or parked message, nothing
//! to retry) or, for `reconcile`, differences found; 2 bad arguments or settings; 3 the
//! database, the broker or the metrics listener is unreachable or failed; 4 the request
//! conflicts with the current state (a message held behind an earlier one: release that
//! first).
//!
//! There is no generic `consume`: applying an event needs the application's handlers, so
//! a consumer is the application's own binary (`outbox_runtime::inbox::Inbox`); the
//! `inbox` commands operate its tables from here.

mod args;
mod commands;
mod render;

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

/// A failure with its exit code.
pub(crate) struct Fail(pub(crate) u8, pub(crate) String);

impl From<Error> for Fail {
    fn from(error: Error) -> Self {
        match error {
            Error::NotFound(message) => Fail(1, message),
            Error::Config(_) | Error::InvalidIdentifier { .. } => Fail(2, error.to_string()),
            Error::Conflict(_) => Fail(4, error.to_string()),
            _ => Fail(3, error.to_string()),
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
    match commands::execute(cli).await {
        Ok(code) => code,
        Err(Fail(code, message)) => {
            // Whatever reported the error, a URL in it is shown without its password.
            eprintln!("outbox: {}", redact_urls(&message));
            ExitCode::from(code)
        }
    }
}
