//! `cargo xtask bench`: the outbox's costs as ratios against baselines measured in the same
//! run, on the same machine, database and broker.
//!
//! A debug build re-runs itself with `--release`. The broker is `KAFKA_BROKERS` when set;
//! otherwise a Tansu process the bench starts (when `tansu` is installed, see `.ci/tansu`);
//! otherwise, loudly, the in-process mock cluster, which flatters the producer baseline.

mod append;
mod broker;
mod cdc;
mod claim;
mod console;
mod inbox;
mod notify;
mod outbox_retention;
mod relay;
mod retention;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use outbox_examples::orders;
use outbox_runtime::Outbox;
use outbox_tests::db::{fresh_databases, fresh_databases_on};
use outbox_tests::pg_server::{self, Cluster};
use outbox_tests::Failure;
use serde_json::Value;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use self::append::append_overhead;
use self::broker::{broker, mock_broker, start_tansu, Tansu};
use self::cdc::cdc_throughput;
use self::claim::{claim_backlog, claim_outage};
use self::console::console_latency;
use self::inbox::inbox_throughput;
use self::notify::notify_latency;
use self::outbox_retention::outbox_retention;
use self::relay::relay_throughput;
use self::retention::retention;

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Smaller counts: done in under two minutes.
    #[arg(long)]
    quick: bool,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run only these parts (append, relay, inbox, claim, cdc, retention, notify, console), e.g. to
    /// profile one.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Run in this build even if it is a debug build (by default a debug build re-runs
    /// itself with --release).
    #[arg(long, hide = true)]
    in_this_build: bool,
}

/// The counts of one run.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    confirms: usize,
    relay_events: i64,
    aggregates: i64,
    claim_small: i64,
    claim_large: i64,
    /// Rows waiting for a retry, not due, for `claim_outage_ratio`.
    claim_waiting: i64,
    claims: usize,
    steady_seconds: u64,
    inbox_events: i64,
    /// Expired dedup rows (and published events) removed, for `retention_drop_vs_delete`
    /// (and `outbox_retention_drop_vs_delete`).
    retention_rows: i64,
    /// Outbox rows and inbox rows the console is measured over.
    console_rows: i64,
    /// Requests of each kind the console's p95 is taken over.
    console_requests: usize,
}

const FULL: Sizes = Sizes {
    confirms: 2_000,
    relay_events: 100_000,
    aggregates: 1_000,
    claim_small: 10_000,
    claim_large: 1_000_000,
    claim_waiting: 1_000_000,
    claims: 200,
    steady_seconds: 30,
    // On the mock cluster, whose partition log keeps 5 MB: 8,000 records of 1 KiB with
    // their headers over 4 partitions leave room for an uneven spread.
    inbox_events: 8_000,
    retention_rows: 10_000_000,
    console_rows: 1_000_000,
    console_requests: 200,
};

const QUICK: Sizes = Sizes {
    confirms: 400,
    relay_events: 10_000,
    aggregates: 1_000,
    claim_small: 10_000,
    claim_large: 100_000,
    claim_waiting: 1_000_000,
    claims: 100,
    steady_seconds: 8,
    inbox_events: 8_000,
    retention_rows: 1_000_000,
    console_rows: 100_000,
    console_requests: 50,
};

const PARTITIONS: i32 = 6;

pub(crate) fn run(args: BenchArgs) -> ExitCode {
    if cfg!(debug_assertions) && !args.in_this_build {
        return rerun_in_release(&args);
    }
    // Before the runtime's threads: a Tansu broker it starts becomes `KAFKA_BROKERS`.
    let tansu = match start_tansu() {
        Ok(tansu) => tansu,
        Err(e) => {
            eprintln!("bench failed: {e}");
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(bench(&args, tansu.as_ref()));
    // A Kafka client closing against a broker that stopped answering blocks its thread;
    // do not wait for it.
    runtime.shutdown_timeout(Duration::from_secs(5));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench failed: {e}");
            ExitCode::from(1)
        }
    }
}

fn rerun_in_release(args: &BenchArgs) -> ExitCode {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = std::process::Command::new(cargo);
    command.args(["run", "--release", "--quiet", "--package", "xtask", "--", "bench", "--in-this-build"]);
    if args.quick {
        command.arg("--quick");
    }
    if let Some(path) = &args.json {
        command.arg("--json").arg(path);
    }
    if !args.only.is_empty() {
        command.arg("--only").arg(args.only.join(","));
    }
    eprintln!("bench: building and running in release mode");
    match command.status() {
        Ok(status) => ExitCode::from(u8::try_from(status.code().unwrap_or(1)).unwrap_or(1)),
        Err(e) => {
            eprintln!("bench: cannot run cargo: {e}");
            ExitCode::from(1)
        }
    }
}

/// Figures by name, in the order measured.
#[derive(Default)]
struct Figures {
    values: BTreeMap<&'static str, Value>,
    order: Vec<&'static str>,
}

impl Figures {
    fn set(&mut self, name: &'static str, value: impl Into<Value>) {
        if self.values.insert(name, value.into()).is_none() {
            self.order.push(name);
        }
    }

    fn f64(&self, name: &str) -> f64 {
        self.values.get(name).and_then(Value::as_f64).unwrap_or(f64::NAN)
    }
}

/// Ratios with their targets: (name, meaning, target, higher is better).
const RATIOS: &[(&str, &str, f64, bool)] = &[
    ("append_overhead", "p50 confirm with append / without", 1.10, false),
    ("append_vs_floor", "p50 confirm with append / with a bare INSERT", 1.15, false),
    ("relay_vs_raw_producer", "relay events/s / raw producer msgs/s", 0.8, true),
    ("relay_unanalyzed_vs_raw_producer", "the same, table never analysed since the backlog", 0.7, true),
    ("relay_hot_vs_raw_producer", "the same with 10 aggregates carrying every event", 0.5, true),
    ("relay_vs_pg_mark", "relay events/s / claim+mark rows/s, no Kafka", f64::NAN, true),
    ("relay_vs_limit", "relay / min(raw producer, pg mark)", 0.7, true),
    ("claim_backlog_ratio", "claim time, large backlog / 10k backlog", 1.3, false),
    ("claim_outage_ratio", "claim time with 1,000,000 rows waiting for a retry / with none", 1.3, false),
    ("notify_latency_vs_poll", "p99 created->published at 500/s / 1 s poll", 0.02, false),
    ("inbox_vs_raw", "inbox applies/s / raw consumer inserts/s, one per transaction", f64::NAN, true),
    ("inbox_vs_raw_batched", "the same, up to 100 per transaction", 0.7, true),
    (
        "cdc_vs_raw_producer",
        "change-data-capture relay events/s / raw producer msgs/s (mock cluster)",
        0.8,
        true,
    ),
    ("cdc_db_cost", "WAL bytes per event drained, change data capture / polling relay", f64::NAN, false),
    (
        "retention_drop_vs_delete",
        "time to remove expired dedup rows, dropping partitions / batched DELETE",
        f64::NAN,
        false,
    ),
    (
        "retention_drop_vs_delete_wal",
        "WAL written for the same, dropping partitions / batched DELETE",
        f64::NAN,
        false,
    ),
    (
        "outbox_retention_drop_vs_delete",
        "time to remove published events past retention, dropping outbox partitions / batched DELETE",
        f64::NAN,
        false,
    ),
    (
        "outbox_retention_drop_vs_delete_wal",
        "WAL written for the same, dropping outbox partitions / batched DELETE",
        f64::NAN,
        false,
    ),
    (
        "console_page1000_vs_page2",
        "console median server time, 1,000th page / second page (worst of four lists)",
        1.5,
        false,
    ),
    (
        "console_page1000_vs_page1",
        "the same against the first page (informational: its statement can run on a generic plan, a cursor's is planned each time)",
        f64::NAN,
        false,
    ),
    (
        "hold_locks_vs_lease",
        "polling relay events/s holding each batch's locks across the send / leasing (mock cluster)",
        f64::NAN,
        true,
    ),
];

async fn bench(args: &BenchArgs, tansu: Option<&Tansu>) -> Result<(), Failure> {
    let sizes = if args.quick { QUICK } else { FULL };
    let [url] = fresh_databases(["outbox_bench"]).await?;
    let pool = PgPoolOptions::new().max_connections(16).connect(&url).await?;
    let broker = broker(tansu)?;
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let pg_version: String = sqlx::query_scalar("SHOW server_version").fetch_one(&pool).await?;
    println!("outbox bench ({})", if args.quick { "quick" } else { "full" });
    println!("  broker    {}", broker.description);
    println!("  database  {url} (PostgreSQL {pg_version})");
    println!("  machine   {cores} cores");

    let outbox = Outbox::default_ref().clone();
    outbox.migrator().run(&pool).await?;
    orders::MIGRATOR.run(&pool).await?;
    let mut figures = Figures::default();
    figures.set("cores", cores);
    figures.set("broker", broker.description.clone());
    figures.set("broker_kind", broker.kind);
    figures.set("quick", args.quick);

    let started = Instant::now();
    let run = |part: &str| args.only.is_empty() || args.only.iter().any(|o| o == part);
    if run("append") {
        append_overhead(&pool, &outbox, sizes, &mut figures).await?;
        progress("append_overhead", started);
    }
    // The inbox on a mock cluster of its own (see `mock_broker`).
    if run("inbox") {
        let mock = mock_broker()?;
        figures.set("inbox_broker", mock.description.clone());
        inbox_throughput(&pool, &outbox, &mock, sizes, &mut figures).await?;
        progress("inbox throughput", started);
    }
    if run("relay") {
        relay_throughput(&pool, &outbox, &broker, sizes, &mut figures).await?;
        progress("relay throughput and baselines", started);
    }
    if run("claim") {
        claim_backlog(&pool, sizes, &mut figures).await?;
        claim_outage(&pool, sizes, &mut figures).await?;
        progress("claim backlog", started);
    }
    if run("cdc") {
        // On a server that streams: this one, or one of the bench's own (PostgreSQL as
        // installed runs at wal_level = replica); both models are measured there.
        if pg_server::wal_level(&url)? == "logical" {
            cdc_throughput(&pool, &url, &outbox, sizes, &mut figures).await?;
        } else {
            let cluster = Cluster::streaming()?;
            let [url] = fresh_databases_on(&cluster.server(), ["outbox_bench"]).await?;
            println!("  change data capture on a server of the bench's own at wal_level = logical: {url}");
            let streaming = PgPoolOptions::new().max_connections(16).connect(&url).await?;
            outbox.migrator().run(&streaming).await?;
            orders::MIGRATOR.run(&streaming).await?;
            cdc_throughput(&streaming, &url, &outbox, sizes, &mut figures).await?;
            streaming.close().await;
        }
        progress("change data capture", started);
    }
    if run("retention") {
        retention(&pool, sizes, &mut figures).await?;
        outbox_retention(&pool, sizes, &mut figures).await?;
        progress("retention", started);
    }
    if run("console") {
        console_latency(&pool, &url, sizes, &mut figures).await?;
        progress("console", started);
    }
    if run("notify") {
        notify_latency(&pool, &outbox, &broker, sizes, &mut figures).await?;
        progress("notify latency", started);
    }
    figures.set("seconds", started.elapsed().as_secs_f64());

    print_table(&figures);
    if let Some(path) = &args.json {
        let object: serde_json::Map<String, Value> =
            figures.order.iter().map(|name| ((*name).to_owned(), figures.values[name].clone())).collect();
        std::fs::write(path, serde_json::to_string_pretty(&Value::Object(object))? + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("figures written to {}", path.display());
    }
    Ok(())
}

fn progress(what: &str, started: Instant) {
    eprintln!("bench: {what} done at {:.1} s", started.elapsed().as_secs_f64());
}

fn print_table(f: &Figures) {
    println!("\n{:<24} {:>9}  {:>8}  {:<6} meaning", "ratio", "value", "target", "");
    for (name, meaning, target, higher) in RATIOS {
        let value = f.f64(name);
        if value.is_nan() {
            continue; // not run (--only)
        }
        let (target_text, verdict) = if target.is_nan() {
            ("-".to_owned(), "")
        } else if (*higher && value >= *target) || (!*higher && value <= *target) {
            (format!("{}{target}", if *higher { ">=" } else { "<=" }), "ok")
        } else {
            (format!("{}{target}", if *higher { ">=" } else { "<=" }), "MISSED")
        };
        println!("{name:<24} {value:>9.3}  {target_text:>8}  {verdict:<6} {meaning}");
    }
    println!("\n{:<34} {:>14}", "absolute", "value");
    for name in &f.order {
        if RATIOS.iter().any(|(r, ..)| r == name) {
            continue;
        }
        let value = &f.values[name];
        let text = match value.as_f64() {
            Some(v) if value.is_f64() => format!("{v:.3}"),
            _ => value.to_string(),
        };
        println!("{name:<34} {text:>14}");
    }
}

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    if samples.is_empty() {
        return f64::NAN;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
    let index = ((samples.len() - 1) as f64 * p).round() as usize;
    samples[index]
}

#[allow(clippy::cast_precision_loss)]
fn rate(count: impl TryInto<i64>, elapsed: Duration) -> f64 {
    count.try_into().unwrap_or(0) as f64 / elapsed.as_secs_f64().max(1e-9)
}

async fn count(pool: &PgPool, sql: &'static str) -> Result<i64, Failure> {
    Ok(sqlx::query_scalar(sql).fetch_one(pool).await?)
}

/// Waits until `n` rows of the outbox are published by the relay running as `task`. Reads
/// the relay's own counter every 5 ms (free) and the table (a count over the whole outbox)
/// only once the counter reaches `n`, and once a second besides in case the counter
/// counts something else: read every 20 ms, the count took about a third of one of the
/// two cores from the relay and its database while they drained the quick bench's
/// backlog, which the raw producer's baseline never paid. Fails when the relay ends first
/// or nothing moves for a minute.
async fn wait_published<T: std::fmt::Debug>(
    pool: &PgPool,
    stats: &outbox_runtime::relay::RelayStats,
    task: &mut tokio::task::JoinHandle<T>,
    n: i64,
) -> Result<(), Failure> {
    let mut stall = Stall::new();
    let mut counted = Instant::now();
    loop {
        let said = i64::try_from(stats.published()).unwrap_or(i64::MAX);
        if said >= n || counted.elapsed() >= Duration::from_secs(1) {
            counted = Instant::now();
            let published = count(pool, "SELECT count(*) FROM outbox WHERE status = 'published'").await?;
            if published >= n {
                return Ok(());
            }
        }
        if task.is_finished() {
            return Err(format!("the relay stopped after publishing {said} of {n}: {:?}", task.await).into());
        }
        stall.check("the relay", said, n)?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Fails when `progress` has not moved for a minute: a stalled broker, named, instead of
/// a run that never ends.
struct Stall {
    last: i64,
    since: Instant,
}

impl Stall {
    fn new() -> Self {
        Stall { last: -1, since: Instant::now() }
    }

    fn check(&mut self, what: &str, progress: i64, n: i64) -> Result<(), Failure> {
        if progress != self.last {
            self.last = progress;
            self.since = Instant::now();
        } else if self.since.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "{what}: stalled at {progress} of {n} for 60 s; is the broker still serving?"
            )
            .into());
        }
        Ok(())
    }
}
