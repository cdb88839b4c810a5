//! `cargo xtask chaos --events N --seconds S`: the order service, 2 relays and 2 consumers
//! as separate processes against the dev broker (an in-process mock cluster). For S
//! seconds relays and consumers are killed with SIGKILL at random moments, the broker
//! goes down for a while and PostgreSQL is restarted (every connection of every process
//! is cut, commits in flight included); then everything is left to settle and the result
//! is checked: every confirmed order has exactly one applied effect in the projection.
//!
//! `--cdc` runs the change-data-capture relay instead (a slot of its own, dropped at the
//! end): one relay process streams, the other stands by and takes over. It needs a server
//! at `wal_level = logical`: the one at `DATABASE_URL` when it is, else a server of the
//! run's own started from the installed binaries (`outbox_tests::pg_server`), which is the
//! one restarted.
//!
//! The PostgreSQL restart runs `pg_ctlcluster --skip-systemctl-redirect VERSION main
//! restart` (the one cluster under `/etc/postgresql`), or the shell command in
//! `OUTBOX_CHAOS_PG_RESTART`; `--no-pg-restart` leaves it out (a database this machine
//! cannot restart). Without either, a machine that cannot restart it is an error, not a
//! silently skipped fault. A server of the run's own is restarted with `pg_ctl`.
//!
//! The last line printed is JSON:
//! `{"relay":"polling","events":N,"published":..,"applied":..,"lost":0,"applied_twice":0,"duplicates_absorbed":..,"kills":..,"pg_restarts":1}`;
//! the exit code is 1 when anything was lost or applied twice. `duplicates_absorbed` counts
//! the `order.confirmed` records in the topic beyond one per event (published again by a
//! relay killed before it marked them), each absorbed by the inbox; redeliveries to a
//! restarted consumer are absorbed too but not counted there.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use outbox_tests::db::fresh_databases_on;
use outbox_tests::kafka::Kafka;
use outbox_tests::pg_server::{self, Cluster};
use outbox_tests::{Failure, Rng};
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

#[derive(Args)]
pub(crate) struct ChaosArgs {
    /// Orders to place and confirm (each confirmation is one event to apply once).
    #[arg(long, default_value_t = 2000)]
    events: u64,
    /// How long to inject faults.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Seed for the random kills (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Do not restart PostgreSQL during the faults.
    #[arg(long)]
    no_pg_restart: bool,
    /// Run the change-data-capture relay (a replication slot of its own, `outbox_chaos`, on
    /// a server at wal_level = logical: DATABASE_URL's, or one of the run's own) instead of the polling relay: one relay process streams,
    /// the other stands by, and each kill of the streaming one is a takeover.
    #[arg(long)]
    cdc: bool,
}

/// The slot and publication of a `--cdc` run.
const SLOT: &str = "outbox_chaos";

/// Drops the chaos run's slot if it exists (a database with a slot cannot be dropped, and
/// a slot left behind keeps WAL on the server).
async fn drop_slot(server: &str) -> Result<(), Failure> {
    let admin = PgPoolOptions::new().max_connections(1).connect(&format!("{server}/postgres")).await?;
    sqlx::query("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL")
        .bind(SLOT)
        .execute(&admin)
        .await?;
    for _ in 0..50 {
        let dropped = sqlx::query(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(SLOT)
        .execute(&admin)
        .await;
        if dropped.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("cannot drop replication slot {SLOT}").into())
}

/// The command that restarts the PostgreSQL server, if this machine has one.
fn pg_restart_command() -> Result<String, Failure> {
    if let Ok(command) = std::env::var("OUTBOX_CHAOS_PG_RESTART") {
        return Ok(command);
    }
    let versions: Vec<String> = std::fs::read_dir("/etc/postgresql")
        .map_err(|e| {
            format!(
                "cannot restart PostgreSQL here (/etc/postgresql: {e}): set OUTBOX_CHAOS_PG_RESTART to a command \
                 that does, or pass --no-pg-restart"
            )
        })?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .collect();
    match versions.as_slice() {
        [version] => Ok(format!("pg_ctlcluster --skip-systemctl-redirect {version} main restart")),
        _ => Err(format!(
            "cannot tell which PostgreSQL cluster to restart ({versions:?} under /etc/postgresql): set \
             OUTBOX_CHAOS_PG_RESTART, or pass --no-pg-restart"
        )
        .into()),
    }
}

/// How the run's PostgreSQL is restarted.
enum Restart {
    /// The server at `DATABASE_URL`, by a shell command.
    Command(String),
    /// A server of the run's own.
    Own(Arc<Cluster>),
}

/// Restarts PostgreSQL; returns how long it took.
async fn restart_postgres(restart: &Restart) -> Result<Duration, Failure> {
    let started = Instant::now();
    let restarted = match restart {
        Restart::Command(command) => {
            let command = command.clone();
            tokio::task::spawn_blocking(move || Command::new("sh").args(["-c", &command]).status())
                .await??
                .success()
        }
        Restart::Own(cluster) => {
            let cluster = Arc::clone(cluster);
            tokio::task::spawn_blocking(move || cluster.restart("fast")).await?
        }
    };
    if !restarted {
        return Err("restarting PostgreSQL failed".into());
    }
    Ok(started.elapsed())
}

pub(crate) fn run(args: ChaosArgs) -> ExitCode {
    crate::block_on("chaos", chaos(args))
}

/// The example binaries, built next to this one.
fn binaries() -> Result<PathBuf, Failure> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status =
        Command::new(cargo).args(["build", "--quiet", "-p", "outbox-examples", "--bins"]).status()?;
    if !status.success() {
        return Err("building the example binaries failed".into());
    }
    let exe = std::env::current_exe()?;
    Ok(exe.parent().ok_or("no binary directory")?.to_path_buf())
}

/// A role's process, restarted after each kill.
struct Role {
    name: String,
    program: PathBuf,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Role {
    fn start(&mut self) -> Result<(), Failure> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let mut command = Command::new(&self.program);
        command.envs(self.env.iter().map(|(k, v)| (k, v))).stdout(Stdio::null()).stderr(log);
        self.child = Some(command.spawn()?);
        Ok(())
    }

    fn kill(&mut self) -> Result<(), Failure> {
        if let Some(mut child) = self.child.take() {
            child.kill()?; // SIGKILL
            child.wait()?;
        }
        Ok(())
    }

    fn stop(&mut self) -> Result<(), Failure> {
        if let Some(mut child) = self.child.take() {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            let _ =
                Command::new("kill").args(["-TERM", &child.id().to_string()]).stderr(Stdio::null()).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if child.try_wait()?.is_some() {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }
}

/// Records of `event_type` in `topic`: (all, distinct event ids).
fn topic_counts(kafka: &Kafka, topic: &str, event_type: &str) -> Result<(u64, u64), Failure> {
    // Up to a minute for each of the topic's 6 partitions.
    let records = kafka.try_read_all(topic, Duration::from_secs(6 * 60))?;
    let of_type: Vec<_> =
        records.iter().filter(|r| r.headers.get("ce_type").map(String::as_str) == Some(event_type)).collect();
    let ids: BTreeSet<&String> = of_type.iter().filter_map(|r| r.headers.get("ce_id")).collect();
    Ok((of_type.len() as u64, ids.len() as u64))
}

/// What the projection says about the confirmed orders.
#[derive(Debug, PartialEq, Eq)]
struct Verdict {
    applied: usize,
    lost: usize,
    applied_twice: usize,
}

/// `projected`: (order id, how many times its effect ran).
fn verdict(confirmed: &[Uuid], projected: &[(Uuid, i32)]) -> Verdict {
    let applied: BTreeSet<Uuid> = projected.iter().map(|(id, _)| *id).collect();
    Verdict {
        applied: applied.len(),
        lost: confirmed.iter().filter(|id| !applied.contains(id)).count(),
        applied_twice: projected.iter().filter(|(_, n)| *n > 1).count(),
    }
}

async fn chaos(args: ChaosArgs) -> Result<bool, Failure> {
    let seed = args.seed.unwrap_or_else(Rng::clock_seed);
    let mut rng = Rng::seeded(seed);
    let main = outbox_tests::db::base_url();
    // Kept until the run ends: its server stops when it is dropped.
    let own = if args.cdc && pg_server::wal_level(&main)? != "logical" {
        let cluster = Arc::new(Cluster::streaming()?);
        println!(
            "chaos: {main} is not at wal_level = logical: a server of the run's own at {}",
            cluster.server()
        );
        Some(cluster)
    } else {
        None
    };
    let server = own.as_ref().map_or_else(|| pg_server::server_of(&main).to_owned(), |c| c.server());
    let pg_restart = match (&own, args.no_pg_restart) {
        (_, true) => None,
        (Some(cluster), false) => Some(Restart::Own(Arc::clone(cluster))),
        (None, false) => Some(Restart::Command(pg_restart_command()?)),
    };
    let bin = binaries()?;
    drop_slot(&server).await?;
    let [orders_url, projection_url] =
        fresh_databases_on(&server, ["outbox_chaos_orders", "outbox_chaos_projection"]).await?;
    let orders_db = PgPoolOptions::new().max_connections(4).connect(&orders_url).await?;
    let projection_db = PgPoolOptions::new().max_connections(4).connect(&projection_url).await?;

    // Always a mock cluster of its own: the faults include taking its broker down.
    let kafka = Kafka::try_mock()?;
    kafka.try_create_topic("orders", 6).await?;
    let mock = kafka.mock_cluster().ok_or("not a mock cluster")?;
    let brokers = kafka.bootstrap().to_owned();
    let logs = std::env::temp_dir().join(format!("outbox-chaos-{seed}"));
    std::fs::create_dir_all(&logs)?;
    println!(
        "chaos: seed {seed}, {} events, {} s of faults, broker {brokers}, logs in {}",
        args.events,
        args.seconds,
        logs.display()
    );

    // Migrations first, so that restarted processes never race them.
    let outbox = outbox_runtime::Outbox::default_ref().clone();
    outbox.migrator().run(&orders_db).await?;
    outbox_examples::orders::MIGRATOR.run(&orders_db).await?;
    outbox_examples::projection::MIGRATOR.run(&projection_db).await?;
    let inbox_tables = outbox_runtime::inbox::Inbox::new(
        projection_db.clone(),
        outbox_examples::consumer_process::inbox_config(&brokers),
        outbox_examples::projection::handlers(),
    )?;
    inbox_tables.migrator().run(&projection_db).await?;
    if args.cdc {
        let report = outbox_runtime::cdc::CdcConfig::new(&orders_url)
            .slot(SLOT)
            .publication(SLOT)
            .setup(&orders_db, &outbox)
            .await?;
        println!("chaos: change data capture from slot {SLOT} ({report:?})");
    }

    let role = |name: &str, program: &str, env: &[(&str, &str)], logs: &Path| Role {
        name: name.to_owned(),
        program: bin.join(program),
        env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        log: logs.join(format!("{name}.log")),
        child: None,
    };
    let events = args.events.to_string();
    let mut service = role(
        "order-service",
        "order-service",
        &[("DATABASE_URL", &orders_url), ("ORDERS", &events), ("RUST_LOG", "warn")],
        &logs,
    );
    let mut relay_env = vec![
        ("DATABASE_URL", orders_url.as_str()),
        ("KAFKA_BROKERS", brokers.as_str()),
        ("OUTBOX_LEASE_TTL_MS", "6000"),
        ("OUTBOX_MESSAGE_TIMEOUT_MS", "2000"),
        ("OUTBOX_POLL_MS", "500"),
        ("RUST_LOG", "warn"),
    ];
    if args.cdc {
        relay_env.extend([("OUTBOX_CDC_SLOT", SLOT), ("OUTBOX_CDC_TAKEOVER_MS", "500")]);
    }
    let consumer_env = [
        ("CONSUMER_DATABASE_URL", projection_url.as_str()),
        ("KAFKA_BROKERS", brokers.as_str()),
        ("RUST_LOG", "warn"),
    ];
    let mut victims = vec![
        role("relay-1", "relay", &relay_env, &logs),
        role("relay-2", "relay", &relay_env, &logs),
        role("consumer-1", "consumer", &consumer_env, &logs),
        role("consumer-2", "consumer", &consumer_env, &logs),
    ];
    service.start()?;
    for v in &mut victims {
        v.start()?;
    }

    let started = Instant::now();
    let faults_end = started + Duration::from_secs(args.seconds);
    let outage_at = started + Duration::from_millis(rng.range(args.seconds * 200, args.seconds * 600));
    let outage = Duration::from_millis(rng.range(2000, 4000));
    let mut outage_done = false;
    let restart_at = started + Duration::from_millis(rng.range(args.seconds * 300, args.seconds * 800));
    let mut pg_restarts = 0u64;
    let mut kills = 0u64;
    while Instant::now() < faults_end {
        tokio::time::sleep(Duration::from_millis(rng.range(300, 1500))).await;
        if let Some(command) =
            pg_restart.as_ref().filter(|_| pg_restarts == 0 && Instant::now() >= restart_at)
        {
            let took = restart_postgres(command).await?;
            pg_restarts += 1;
            println!("chaos: PostgreSQL restarted ({:.1} s) under every process", took.as_secs_f64());
        }
        if !outage_done && Instant::now() >= outage_at {
            println!("chaos: broker down for {:.1} s", outage.as_secs_f64());
            mock.broker_down(1)?;
            tokio::time::sleep(outage).await;
            mock.broker_up(1)?;
            outage_done = true;
        }
        let victim = &mut victims[rng.range(0, 4) as usize];
        victim.kill()?;
        kills += 1;
        tokio::time::sleep(Duration::from_millis(rng.range(0, 500))).await;
        victim.start()?;
        if kills % 10 == 0 {
            println!("chaos: {kills} kills so far ({} killed last)", victim.name);
        }
    }
    if let Some(command) = pg_restart.as_ref().filter(|_| pg_restarts == 0) {
        // The faults ended before the moment drawn for the restart (short --seconds).
        let took = restart_postgres(command).await?;
        pg_restarts += 1;
        println!("chaos: PostgreSQL restarted ({:.1} s) under every process", took.as_secs_f64());
    }
    println!("chaos: faults over after {kills} kills; letting it settle");

    // Settle: the service finishes, relays publish everything, consumers apply everything.
    let settle_deadline = Instant::now() + Duration::from_secs(180);
    let mut revived = 0u32;
    loop {
        // A relay or consumer that exited by itself (its start-up cut off by the restart,
        // say) is started again, at most 20 times in all, each said.
        for v in &mut victims {
            if let Some(status) = v.child.as_mut().map(Child::try_wait).transpose()?.flatten() {
                if revived >= 20 {
                    return Err(format!(
                        "{} exited ({status}) once too often; see {}",
                        v.name,
                        v.log.display()
                    )
                    .into());
                }
                println!("chaos: {} exited by itself ({status}); starting it again", v.name);
                revived += 1;
                v.start()?;
            }
        }
        let service_done = match service.child.as_mut() {
            Some(child) => child.try_wait()?.is_some(),
            None => true,
        };
        // The harness's own connections were cut by the restart too: a failed read waits.
        let counts = async {
            let confirmed: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE status = 'confirmed'")
                .fetch_one(&orders_db)
                .await?;
            let projected: i64 =
                sqlx::query_scalar("SELECT count(*) FROM confirmed_orders").fetch_one(&projection_db).await?;
            Ok::<_, sqlx::Error>((confirmed, projected))
        };
        let (confirmed, projected) = match counts.await {
            Ok(counts) => counts,
            Err(error) if Instant::now() < settle_deadline => {
                println!("chaos: reading the counts failed ({error}); trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        if service_done && confirmed as u64 == args.events && projected >= confirmed {
            break;
        }
        if Instant::now() > settle_deadline {
            println!("chaos: did not settle in 180 s: {confirmed} confirmed, {projected} projected, service done: {service_done}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for v in &mut victims {
        v.stop()?;
    }
    service.stop()?;

    let confirmed: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM orders WHERE status = 'confirmed'").fetch_all(&orders_db).await?;
    let published: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE event_type = 'order.confirmed' AND status = 'published'",
    )
    .fetch_one(&orders_db)
    .await?;
    let projected: Vec<(Uuid, i32)> = sqlx::query_as("SELECT order_id, applications FROM confirmed_orders")
        .fetch_all(&projection_db)
        .await?;
    let Verdict { applied, lost, applied_twice } = verdict(&confirmed, &projected);
    let (in_topic, distinct) = topic_counts(&kafka, "orders", "order.confirmed")?;
    if args.cdc {
        drop_slot(&server).await?;
    }
    let line = format!(
        "{{\"relay\":\"{}\",\"events\":{},\"published\":{published},\"applied\":{},\"lost\":{lost},\"applied_twice\":{applied_twice},\"duplicates_absorbed\":{},\"kills\":{kills},\"pg_restarts\":{pg_restarts}}}",
        if args.cdc { "cdc" } else { "polling" },
        confirmed.len(),
        applied,
        in_topic - distinct
    );
    drop(kafka);
    println!("{line}");
    Ok(lost == 0 && applied_twice == 0 && confirmed.len() as u64 == args.events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_counts_lost_and_twice_applied_orders() {
        let ids: Vec<Uuid> = (0..4u128).map(Uuid::from_u128).collect();
        assert_eq!(
            verdict(&ids, &ids.iter().map(|id| (*id, 1)).collect::<Vec<_>>()),
            Verdict { applied: 4, lost: 0, applied_twice: 0 }
        );
        let projected = [(ids[0], 1), (ids[1], 2), (ids[3], 1)];
        assert_eq!(verdict(&ids, &projected), Verdict { applied: 3, lost: 1, applied_twice: 1 });
    }
}
