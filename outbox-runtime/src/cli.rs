//! The `outbox` operator command line (feature `cli`).
//!
//! Exit codes: 0 done; 1 nothing matched (no such failed event, nothing to retry);
//! 2 bad arguments; 3 the database is unreachable or failed.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use uuid::Uuid;

use crate::ops::RetryTarget;
use crate::{Outbox, OutboxConfig};

#[derive(Parser)]
#[command(
    name = "outbox",
    version,
    about = "Operate a transactional outbox: migrate, status, failed events, retry, discard"
)]
struct Cli {
    /// PostgreSQL holding the outbox.
    #[arg(long, env = "DATABASE_URL", default_value = "postgres://postgres@127.0.0.1:5432/test")]
    database_url: String,
    /// Schema of the outbox tables.
    #[arg(long, default_value = "public")]
    schema: String,
    /// Outbox table name.
    #[arg(long, default_value = "outbox")]
    table: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Creates or upgrades the outbox tables.
    Migrate,
    /// Backlog, failed events and the age of the oldest unpublished event.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Failed events.
    #[command(subcommand)]
    Failed(FailedCommand),
    /// Puts failed events back up for publication.
    Retry(RetryArgs),
    /// Discards an event for good; the events of its aggregate behind it flow again.
    Discard {
        /// The event to discard.
        event_id: Uuid,
        /// Why (kept with the event).
        #[arg(long)]
        reason: String,
        /// Confirms the discard.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Subcommand)]
enum FailedCommand {
    /// Lists failed events with their reasons (never their payloads).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
#[group(required = true, multiple = false)]
struct RetryArgs {
    /// One failed event.
    event_id: Option<Uuid>,
    /// Every failed event of this aggregate id.
    #[arg(long)]
    aggregate: Option<String>,
    /// Every failed event.
    #[arg(long)]
    all_failed: bool,
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outbox: {e}");
            return ExitCode::from(3);
        }
    };
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> ExitCode {
    let outbox = match Outbox::new(OutboxConfig::default().schema(&cli.schema).table(&cli.table)) {
        Ok(outbox) => outbox,
        Err(e) => {
            eprintln!("outbox: {e}");
            return ExitCode::from(2);
        }
    };
    let pool = match PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&cli.database_url)
        .await
    {
        Ok(pool) => pool,
        Err(e) => {
            eprintln!("outbox: cannot connect to {}: {e}", redact(&cli.database_url));
            return ExitCode::from(3);
        }
    };
    match execute(&outbox, &pool, cli.command).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("outbox: {e}");
            ExitCode::from(3)
        }
    }
}

/// The URL without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}@{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

async fn execute(outbox: &Outbox, pool: &PgPool, command: Command) -> crate::Result<ExitCode> {
    match command {
        Command::Migrate => {
            outbox.migrator().run(pool).await?;
            println!("outbox tables are up to date");
        }
        Command::Status { json } => {
            let status = outbox.status(pool).await?;
            if json {
                println!("{}", serde_json::to_string(&status).unwrap_or_default());
            } else {
                let oldest =
                    status.oldest_unpublished_age_seconds.map_or("-".to_owned(), |s| format!("{s:.1} s"));
                println!("pending             {:>10}", status.pending);
                println!("  of which retrying {:>10}", status.retrying);
                println!("failed              {:>10}", status.failed);
                println!("published           {:>10}", status.published);
                println!("discarded           {:>10}", status.discarded);
                println!("oldest unpublished  {oldest:>10}");
            }
        }
        Command::Failed(FailedCommand::List { json }) => {
            let failed = outbox.failed(pool).await?;
            if json {
                println!("{}", serde_json::to_string(&failed).unwrap_or_default());
            } else if failed.is_empty() {
                println!("no failed events");
            } else {
                println!(
                    "{:<36}  {:<24}  {:<24}  {:>8}  {:>9}  reason",
                    "event_id", "type", "aggregate", "attempts", "held back"
                );
                for f in failed {
                    println!(
                        "{}  {:<24}  {:<24}  {:>8}  {:>9}  {}",
                        f.event_id,
                        f.event_type,
                        format!("{}/{}", f.aggregate_type, f.aggregate_id),
                        f.attempts,
                        f.held_back,
                        f.last_error.unwrap_or_default()
                    );
                }
            }
        }
        Command::Retry(args) => {
            let target = match (args.event_id, args.aggregate, args.all_failed) {
                (Some(id), _, _) => RetryTarget::Event(id),
                (_, Some(aggregate), _) => RetryTarget::Aggregate(aggregate),
                _ => RetryTarget::AllFailed,
            };
            let n = outbox.retry(pool, &target).await?;
            println!("{n} failed event(s) put back up for publication");
            if n == 0 {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Discard { event_id, reason, yes } => {
            if !yes {
                eprintln!("outbox: discarding {event_id} means it is never published; add --yes to confirm");
                return Ok(ExitCode::from(2));
            }
            if !outbox.discard(pool, event_id, &reason).await? {
                eprintln!("outbox: no failed or pending event {event_id}");
                return Ok(ExitCode::from(1));
            }
            println!("discarded {event_id}: {reason}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(super::redact("postgres://app:s3cret@db:5432/x"), "postgres://app@db:5432/x");
        assert_eq!(super::redact("postgres://db/x"), "postgres://db/x");
    }
}
