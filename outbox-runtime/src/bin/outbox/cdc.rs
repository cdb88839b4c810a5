//! `outbox cdc setup | status | drop`, and what `outbox relay --cdc` and `--backfill` run.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use outbox_runtime::cdc::{CdcConfig, CdcRelay, SlotStatus, DEFAULT_SLOT};
use outbox_runtime::relay::{Relay, RelayConfig};
use outbox_runtime::sqlx::PgPool;
use outbox_runtime::{CancellationToken, Outbox};

use crate::{fail, render, Fail};

/// The slot and publication a command works on.
#[derive(Args, Clone)]
pub(crate) struct SlotArgs {
    /// The logical replication slot.
    #[arg(long, default_value = DEFAULT_SLOT)]
    pub(crate) slot: String,
    /// The publication of the outbox table's inserts.
    #[arg(long, default_value = DEFAULT_SLOT)]
    pub(crate) publication: String,
}

impl SlotArgs {
    pub(crate) fn config(&self, url: &str) -> CdcConfig {
        CdcConfig::new(url).slot(&self.slot).publication(&self.publication)
    }
}

#[derive(Subcommand)]
pub(crate) enum CdcCommand {
    /// Creates the publication and the replication slot the change-data-capture relay
    /// streams from (needs wal_level = logical), and hands the pending events written
    /// before the slot to the relay's table path. Run once; it changes nothing when both
    /// exist.
    Setup(SlotArgs),
    /// The slot: streaming or not, retained WAL, confirmed position and lag, wal_status.
    /// Exits 1 when the slot does not exist, 4 when it is lost.
    Status {
        #[command(flatten)]
        slot: SlotArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Drops the slot and the publication (the server stops keeping WAL for them). Refused
    /// while a relay streams.
    Drop {
        #[command(flatten)]
        slot: SlotArgs,
        /// Confirms the drop.
        #[arg(long)]
        yes: bool,
    },
}

pub(crate) async fn command(
    outbox: &Outbox,
    pool: &PgPool,
    url: &str,
    command: CdcCommand,
) -> Result<ExitCode, Fail> {
    match command {
        CdcCommand::Setup(slot) => {
            let report = slot.config(url).setup(pool, outbox).await?;
            let said = |created: bool| if created { "created" } else { "exists" };
            println!("publication {:?}: {}", slot.publication, said(report.publication_created));
            println!("replication slot {:?}: {}", slot.slot, said(report.slot_created));
            if report.handed_to_table > 0 {
                println!(
                    "{} pending event(s) written before the slot are published by the relay's table path",
                    report.handed_to_table
                );
            }
        }
        CdcCommand::Status { slot, json } => {
            let Some(status) = slot.config(url).status(pool).await? else {
                // A server below logical can have no slot: setup would only fail on it.
                let level: String = outbox_runtime::sqlx::query_scalar("SELECT current_setting('wal_level')")
                    .fetch_one(pool)
                    .await
                    .map_err(|e| fail(3, e.to_string()))?;
                let next = if level == "logical" {
                    "run `outbox cdc setup`".to_owned()
                } else {
                    format!(
                        "wal_level is {level}, and change data capture needs logical (ALTER SYSTEM SET wal_level = \
                         logical, then restart PostgreSQL; a managed service has a switch of its own), then run \
                         `outbox cdc setup`"
                    )
                };
                return Err(fail(1, format!("replication slot {:?} does not exist: {next}", slot.slot)));
            };
            if json {
                render::json(&status);
            } else {
                show(&status);
            }
            if status.wal_status.as_deref() == Some("lost") {
                return Err(fail(
                    4,
                    format!(
                        "replication slot {:?} is lost: recover with `outbox relay --backfill`, then `outbox cdc drop` \
                         and `outbox cdc setup`",
                        slot.slot
                    ),
                ));
            }
        }
        CdcCommand::Drop { slot, yes } => {
            if !yes {
                return Err(fail(
                    2,
                    format!(
                        "dropping slot {:?} means events written until the next setup are not streamed \
                         (the next setup hands them to the table path); add --yes to confirm",
                        slot.slot
                    ),
                ));
            }
            let (slot_dropped, publication_dropped) = slot.config(url).drop(pool).await?;
            if !slot_dropped && !publication_dropped {
                return Err(fail(1, format!("no slot or publication {:?}", slot.slot)));
            }
            println!("slot dropped: {slot_dropped}; publication dropped: {publication_dropped}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn show(status: &SlotStatus) {
    let bytes = |b: Option<i64>| b.map_or("-".to_owned(), |b| format!("{b} B"));
    let text = |t: &Option<String>| t.clone().unwrap_or_else(|| "-".to_owned());
    println!("slot                 {}", status.slot);
    let streaming = match status.active_pid {
        Some(pid) if status.active => format!("yes (server process {pid})"),
        _ => "no".to_owned(),
    };
    println!("streaming            {streaming}");
    println!("wal_status           {}", text(&status.wal_status));
    println!("confirmed position   {}", text(&status.confirmed_flush_lsn));
    println!("restart position     {}", text(&status.restart_lsn));
    println!("retained WAL         {}", bytes(status.retained_bytes));
    println!("confirmed lag        {}", bytes(status.confirmed_lag_bytes));
    println!(
        "WAL left before lost {}",
        status.safe_wal_size.map_or("unlimited".to_owned(), |b| format!("{b} B"))
    );
}

/// Streams with the change-data-capture relay until a signal.
pub(crate) async fn stream(
    outbox: Outbox,
    pool: PgPool,
    url: &str,
    config: RelayConfig,
    slot: &SlotArgs,
    shutdown: CancellationToken,
) -> Result<ExitCode, Fail> {
    CdcRelay::new(pool, outbox, config, slot.config(url))?.run(shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

/// Runs the polling relay until every pending event is published (or failed), then stops:
/// the recovery of a lost or dropped slot. Waits for events that are retrying.
pub(crate) async fn backfill(
    outbox: Outbox,
    pool: PgPool,
    config: RelayConfig,
    shutdown: CancellationToken,
) -> Result<ExitCode, Fail> {
    let relay = Relay::new(pool.clone(), outbox.clone(), config)?;
    let stats = relay.stats();
    let stop = shutdown.child_token();
    let task = tokio::spawn(relay.run(stop.clone()));
    let mut idle_checks = 0;
    while !stop.is_cancelled() {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = stop.cancelled() => break,
        }
        if task.is_finished() {
            break;
        }
        match outbox.ops().status(&pool).await {
            Ok(status) if status.pending == 0 => {
                // Twice in a row: a row put up again between two readings is not missed.
                idle_checks += 1;
                if idle_checks >= 2 {
                    eprintln!(
                        "outbox: backfill done: {} event(s) published, nothing pending",
                        stats.published()
                    );
                    stop.cancel();
                }
            }
            Ok(status) => {
                idle_checks = 0;
                eprintln!(
                    "outbox: backfill: {} pending, {} published so far",
                    status.pending,
                    stats.published()
                );
            }
            Err(error) => eprintln!("outbox: backfill: cannot read the status: {error}"),
        }
    }
    stop.cancel();
    match task.await {
        Ok(result) => result?,
        Err(error) => return Err(fail(3, format!("the relay panicked: {error}"))),
    }
    Ok(ExitCode::SUCCESS)
}
