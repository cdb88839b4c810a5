//! `cargo xtask bench`: the outbox's costs as ratios against baselines measured in the same
//! run, on the same machine, database and broker.
//!
//! A debug build re-runs itself with `--release`. The broker is `KAFKA_BROKERS` when set;
//! otherwise a Tansu process the bench starts (when `tansu` is installed, see `.ci/tansu`);
//! otherwise, loudly, the in-process mock cluster, which flatters the producer baseline.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use outbox_examples::events::{OrderConfirmed, OrderLine, Payment};
use outbox_examples::orders::{self, NewOrder};
use outbox_runtime::inbox::{HandlerError, Handlers, Inbox, InboxConfig, Meta, RawHandler};
use outbox_runtime::relay::{bench as hooks, Relay, RelayConfig};
use outbox_runtime::{AppendOptions, NewEvent, Outbox, OutboxEvent};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;
use serde_json::Value;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Smaller counts: done in under two minutes.
    #[arg(long)]
    quick: bool,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run only these parts (append, relay, inbox, claim, notify), e.g. to profile one.
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
    claims: usize,
    steady_seconds: u64,
    inbox_events: i64,
}

const FULL: Sizes = Sizes {
    confirms: 2_000,
    relay_events: 100_000,
    aggregates: 1_000,
    claim_small: 10_000,
    claim_large: 1_000_000,
    claims: 200,
    steady_seconds: 30,
    // On the mock cluster, whose partition log keeps 5 MB: 8,000 records of 1 KiB with
    // their headers over 4 partitions leave room for an uneven spread.
    inbox_events: 8_000,
};

const QUICK: Sizes = Sizes {
    confirms: 400,
    relay_events: 10_000,
    aggregates: 1_000,
    claim_small: 10_000,
    claim_large: 100_000,
    claims: 100,
    steady_seconds: 8,
    inbox_events: 8_000,
};

/// The relay's poll interval in the NOTIFY benchmark: latency is judged against it.
const POLL: Duration = Duration::from_secs(1);
const PAYLOAD_BYTES: i64 = 1024;
const PARTITIONS: i32 = 6;

pub(crate) fn run(args: BenchArgs) -> ExitCode {
    if cfg!(debug_assertions) && !args.in_this_build {
        return rerun_in_release(&args);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(bench(&args));
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

/// The broker the run talks to, and what to stop at the end.
struct Broker {
    bootstrap: String,
    kind: &'static str,
    description: String,
    _mock: Option<MockCluster<'static, rdkafka::producer::DefaultProducerContext>>,
    _tansu: Option<TansuProcess>,
}

/// A Tansu broker started for the run; killed when dropped.
struct TansuProcess {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for TansuProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16, Failure> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn broker() -> Result<Broker, Failure> {
    if let Ok(bootstrap) = std::env::var("KAFKA_BROKERS") {
        if !bootstrap.is_empty() {
            let description = format!("KAFKA_BROKERS={bootstrap} (a broker process)");
            return Ok(Broker { bootstrap, kind: "external", description, _mock: None, _tansu: None });
        }
    }
    if let Ok(version) = std::process::Command::new("tansu").arg("--version").output() {
        let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let url = format!("tcp://127.0.0.1:{port}");
        let child = std::process::Command::new("tansu")
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
            .args(["--storage-engine", "sqlite://tansu.db"])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let process = TansuProcess { child, _dir: dir };
        let bootstrap = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&bootstrap).is_err() {
            if Instant::now() > deadline {
                return Err("the tansu broker the bench started does not listen".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let description = format!("{version} on {bootstrap}, SQLite storage, started by the bench");
        return Ok(Broker { bootstrap, kind: "tansu", description, _mock: None, _tansu: Some(process) });
    }
    eprintln!(
        "bench: WARNING: KAFKA_BROKERS is not set and tansu is not installed; using librdkafka's in-process \
         mock cluster, which is far faster than a real broker and flatters the producer baseline"
    );
    mock_broker()
}

/// librdkafka's in-process mock cluster: where the inbox is measured, so that the figure is
/// the inbox's own speed rather than a slow broker's fetch rate (Tansu fetches about 400
/// records/s, and in some runs served a new consumer group nothing at all).
fn mock_broker() -> Result<Broker, Failure> {
    let mock = MockCluster::new(1)?;
    let bootstrap = mock.bootstrap_servers();
    Ok(Broker {
        bootstrap: bootstrap.clone(),
        kind: "mock",
        description: format!("librdkafka mock cluster on {bootstrap} (in-process)"),
        _mock: Some(mock),
        _tansu: None,
    })
}

impl Broker {
    async fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), Failure> {
        if let Some(mock) = &self._mock {
            mock.create_topic(topic, partitions, 1)?;
            return Ok(());
        }
        let admin: AdminClient<DefaultClientContext> =
            ClientConfig::new().set("bootstrap.servers", &self.bootstrap).create()?;
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let topics = [NewTopic::new(topic, partitions, TopicReplication::Fixed(1))];
        for result in admin.create_topics(&topics, &options).await? {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => return Err(format!("cannot create topic {name}: {code:?}").into()),
            }
        }
        Ok(())
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
    ("notify_latency_vs_poll", "p99 created->published at 500/s / 1 s poll", 0.02, false),
    ("inbox_vs_raw", "inbox applies/s / raw consumer inserts/s, one per transaction", f64::NAN, true),
    ("inbox_vs_raw_batched", "the same, up to 100 per transaction", 0.7, true),
];

async fn bench(args: &BenchArgs) -> Result<(), Failure> {
    let sizes = if args.quick { QUICK } else { FULL };
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| outbox_examples::relay_process::DEFAULT_DATABASE_URL.to_owned());
    let admin = PgPoolOptions::new().max_connections(1).connect(&base).await?;
    let url = crate::fresh_database(&admin, &base, "outbox_bench").await?;
    let pool = PgPoolOptions::new().max_connections(16).connect(&url).await?;
    let broker = broker().await?;
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
        progress("claim backlog", started);
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

/// `append_overhead`: the example's confirm with its outbox append against the same
/// transaction without it, interleaved so drift hits both alike. A third variant appends
/// without the per-aggregate advisory lock (`lock_aggregates(false)`), which prices the
/// lock: `aggregate_lock_ms`. A fourth writes the same row with a bare `INSERT` into a table
/// with only a primary key, the floor any outbox pays: `append_vs_floor`.
async fn append_overhead(
    pool: &PgPool,
    outbox: &Outbox,
    sizes: Sizes,
    f: &mut Figures,
) -> Result<(), Failure> {
    const VARIANTS: usize = 4;
    let unlocked = Outbox::new(outbox.config().clone().lock_aggregates(false))?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_floor (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
         event_id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL, \
         aggregate_version bigint, event_type text NOT NULL, schema_version integer NOT NULL, \
         topic text NOT NULL, payload json NOT NULL, headers jsonb NOT NULL)",
    )
    .execute(pool)
    .await?;
    let mut ids = Vec::with_capacity(sizes.confirms * VARIANTS);
    for i in 0..sizes.confirms * VARIANTS {
        let order = NewOrder {
            customer_id: Uuid::now_v7(),
            lines: vec![OrderLine { sku: format!("sku-{}", i % 10), quantity: 1 }],
            total_cents: 1_000,
            currency: "EUR".into(),
            payment: Payment::Card { last4: "4242".into() },
        };
        ids.push(orders::place(pool, outbox, &order).await?);
    }
    let mut samples: [Vec<f64>; VARIANTS] = Default::default();
    for (i, group) in ids.chunks(VARIANTS).enumerate() {
        let mut took = [0.0; VARIANTS];
        let started = Instant::now();
        orders::confirm(pool, outbox, group[0]).await?;
        took[0] = started.elapsed().as_secs_f64();
        let started = Instant::now();
        orders::confirm_without_event(pool, group[1]).await?;
        took[1] = started.elapsed().as_secs_f64();
        let started = Instant::now();
        orders::confirm(pool, &unlocked, group[2]).await?;
        took[2] = started.elapsed().as_secs_f64();
        let started = Instant::now();
        confirm_with_bare_insert(pool, group[3]).await?;
        took[3] = started.elapsed().as_secs_f64();
        // The first 20 rounds warm every path up.
        if i >= 20 {
            for (variant, t) in took.iter().enumerate() {
                samples[variant].push(*t);
            }
        }
    }
    let [with, without, with_unlocked, floor] = &mut samples;
    let (p50_with, p50_without) = (percentile(with, 0.5), percentile(without, 0.5));
    let (p50_unlocked, p50_floor) = (percentile(with_unlocked, 0.5), percentile(floor, 0.5));
    f.set("append_overhead", p50_with / p50_without);
    f.set("append_vs_floor", p50_with / p50_floor);
    f.set("confirm_p50_ms_with_append", p50_with * 1e3);
    f.set("confirm_p99_ms_with_append", percentile(with, 0.99) * 1e3);
    f.set("confirm_p50_ms_with_append_unlocked", p50_unlocked * 1e3);
    f.set("confirm_p50_ms_with_bare_insert", p50_floor * 1e3);
    f.set("confirm_p99_ms_with_bare_insert", percentile(floor, 0.99) * 1e3);
    f.set("confirm_p50_ms_without_append", p50_without * 1e3);
    f.set("aggregate_lock_ms", (p50_with - p50_unlocked) * 1e3);
    f.set("confirms_measured", with.len());
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    sqlx::query("DROP TABLE bench_floor").execute(pool).await?;
    Ok(())
}

/// The confirm transaction with the event written by a bare `INSERT` of the same row into
/// `bench_floor`: what appending costs with no outbox machinery at all.
async fn confirm_with_bare_insert(pool: &PgPool, order_id: Uuid) -> Result<(), Failure> {
    let mut tx = pool.begin().await?;
    let row: Option<(i64, i64, String, Value)> =
        sqlx::query_as(orders::CONFIRM).bind(order_id).fetch_optional(&mut *tx).await?;
    let Some((version, total_cents, currency, payment)) = row else {
        return Err(format!("order {order_id} was not pending").into());
    };
    let event = OrderConfirmed {
        order_id,
        total_cents,
        currency,
        payment: serde_json::from_value(payment)?,
        note: None,
    };
    sqlx::query(
        "INSERT INTO bench_floor (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, \
                                  schema_version, topic, payload, headers) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8::json, $9::jsonb)",
    )
    .bind(Uuid::now_v7())
    .bind(OrderConfirmed::AGGREGATE_TYPE)
    .bind(order_id.to_string())
    .bind(version)
    .bind(OrderConfirmed::EVENT_TYPE)
    .bind(i32::try_from(OrderConfirmed::SCHEMA_VERSION)?)
    .bind(OrderConfirmed::TOPIC)
    .bind(serde_json::to_string(&event)?)
    .bind("{}")
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Fills the outbox with `n` pending 1 KiB events over `aggregates` aggregates, on `topic`,
/// then vacuums and analyses it.
async fn fill(pool: &PgPool, n: i64, aggregates: i64, topic: &str) -> Result<(), Failure> {
    fill_rows(pool, n, aggregates, topic).await?;
    sqlx::query("VACUUM ANALYZE outbox").execute(pool).await?;
    Ok(())
}

/// Fills the outbox as [`fill`] does, with nothing vacuumed or analysed after.
async fn fill_rows(pool: &PgPool, n: i64, aggregates: i64, topic: &str) -> Result<(), Failure> {
    let chunk = 50_000;
    let mut from = 0;
    while from < n {
        let to = (from + chunk).min(n);
        sqlx::query(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, \
                                 schema_version, topic, payload) \
             SELECT gen_random_uuid(), 'bench', 'agg-' || (g % $3), g / $3 + 1, 'bench.filled', 1, $4, \
                    json_build_object('n', g, 'data', repeat('x', $5::int - 24)) \
             FROM generate_series($1::bigint, $2::bigint - 1) AS g",
        )
        .bind(from)
        .bind(to)
        .bind(aggregates)
        .bind(topic)
        .bind(PAYLOAD_BYTES)
        .execute(pool)
        .await?;
        from = to;
    }
    Ok(())
}

async fn count(pool: &PgPool, sql: &'static str) -> Result<i64, Failure> {
    Ok(sqlx::query_scalar(sql).fetch_one(pool).await?)
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

/// Runs a relay until `n` rows are published; returns the time from its start.
async fn drain(pool: &PgPool, outbox: &Outbox, config: RelayConfig, n: i64) -> Result<Duration, Failure> {
    let relay = Relay::new(pool.clone(), outbox.clone(), config)?;
    let stop = CancellationToken::new();
    let started = Instant::now();
    let task = tokio::spawn(relay.run(stop.clone()));
    let mut stall = Stall::new();
    loop {
        let published = count(pool, "SELECT count(*) FROM outbox WHERE status = 'published'").await?;
        if published >= n {
            break;
        }
        if task.is_finished() {
            return Err(format!("the relay stopped after publishing {published} of {n}").into());
        }
        if let Err(e) = stall.check("the relay", published, n) {
            stop.cancel();
            return Err(e);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    stop.cancel();
    task.await??;
    Ok(elapsed)
}

/// `relay_vs_raw_producer`, `relay_vs_pg_mark`, `relay_vs_limit`.
async fn relay_throughput(
    pool: &PgPool,
    outbox: &Outbox,
    broker: &Broker,
    sizes: Sizes,
    f: &mut Figures,
) -> Result<(), Failure> {
    let topic = format!("bench-relay-{}", Uuid::new_v4().simple());
    broker.create_topic(&topic, PARTITIONS).await?;
    let n = sizes.relay_events;
    fill(pool, n, sizes.aggregates, &topic).await?;
    let config = RelayConfig::new(&broker.bootstrap).poll_interval(Duration::from_millis(100)).cleanup(None);

    // The raw producer: the same records, the same settings, all in flight at once.
    let (acked, raw_elapsed) = hooks::raw_produce(pool, outbox, &config).await?;
    if i64::try_from(acked)? != n {
        return Err(format!("the raw producer had {acked} of {n} records acknowledged").into());
    }
    let raw = rate(n, raw_elapsed);

    // The relay: claim, publish, mark.
    let relay_elapsed = drain(pool, outbox, config.clone(), n).await?;
    let relay = rate(n, relay_elapsed);

    // The same drain on statistics that say the table is empty: analysed empty, then the
    // whole backlog at once, nothing analysed since (a sudden backlog, autovacuum behind).
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    sqlx::query("ANALYZE outbox").execute(pool).await?;
    fill_rows(pool, n, sizes.aggregates, &topic).await?;
    let unanalyzed_elapsed = drain(pool, outbox, config.clone(), n).await?;
    let unanalyzed = rate(n, unanalyzed_elapsed);

    // The database alone: the relay's claim and mark statements, no Kafka.
    sqlx::query("UPDATE outbox SET status = 'pending', published_at = NULL, attempts = 0")
        .execute(pool)
        .await?;
    sqlx::query("VACUUM ANALYZE outbox").execute(pool).await?;
    let (marked, mark_elapsed) = hooks::mark_all(pool, outbox, 500).await?;
    if i64::try_from(marked)? != n {
        return Err(format!("marking alone marked {marked} of {n}").into());
    }
    let mark = rate(n, mark_elapsed);

    // Hot aggregates: 10 aggregates carry every event, against the raw producer sending
    // the same records.
    let hot_n = n.min(20_000);
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    fill(pool, hot_n, 10, &topic).await?;
    let (acked, raw_hot_elapsed) = hooks::raw_produce(pool, outbox, &config).await?;
    if i64::try_from(acked)? != hot_n {
        return Err(format!("the raw producer had {acked} of {hot_n} hot records acknowledged").into());
    }
    let raw_hot = rate(hot_n, raw_hot_elapsed);
    let hot = rate(hot_n, drain(pool, outbox, config.clone(), hot_n).await?);

    f.set("relay_vs_raw_producer", relay / raw);
    f.set("relay_unanalyzed_vs_raw_producer", unanalyzed / raw);
    f.set("relay_hot_vs_raw_producer", hot / raw_hot);
    f.set("relay_hot_events", hot_n);
    f.set("relay_hot_events_per_s", hot);
    f.set("raw_producer_hot_msgs_per_s", raw_hot);
    f.set("relay_vs_pg_mark", relay / mark);
    f.set("relay_vs_limit", relay / raw.min(mark));
    f.set("relay_events", n);
    f.set("relay_events_per_s", relay);
    f.set("relay_unanalyzed_events_per_s", unanalyzed);
    f.set("raw_producer_msgs_per_s", raw);
    f.set("pg_mark_rows_per_s", mark);
    Ok(())
}

/// The bench consumer's effect: one row per event.
struct Effect;

impl RawHandler for Effect {
    async fn handle(&self, tx: &mut PgConnection, _payload: &[u8], meta: &Meta) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO bench_effects (event_id) VALUES ($1)")
            .bind(meta.event_id)
            .execute(tx)
            .await?;
        Ok(())
    }
}

/// `inbox_vs_raw`: the inbox applying `n` events against a raw consumer doing one INSERT
/// per message, both reading the same one-partition topic.
async fn inbox_throughput(
    pool: &PgPool,
    outbox: &Outbox,
    broker: &Broker,
    sizes: Sizes,
    f: &mut Figures,
) -> Result<(), Failure> {
    let n = sizes.inbox_events;
    let topic = format!("bench-inbox-{}", Uuid::new_v4().simple());
    // Four partitions, a worker each on both sides (the mock cluster serves them all).
    broker.create_topic(&topic, INBOX_PARTITIONS).await?;
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    fill(pool, n, sizes.aggregates, &topic).await?;
    let config = RelayConfig::new(&broker.bootstrap);
    let acked = hooks::produce_pending(pool, outbox, &config).await?;
    if i64::try_from(acked)? != n {
        return Err(format!("producing the inbox input: {acked} of {n} acknowledged").into());
    }
    sqlx::query("CREATE TABLE bench_effects (event_id uuid NOT NULL)").execute(pool).await?;
    sqlx::query(
        "CREATE TABLE bench_raw (kafka_partition int NOT NULL, kafka_offset bigint NOT NULL, event_id text)",
    )
    .execute(pool)
    .await?;

    // The raw consumers first (they warm the broker's caches for neither: each reads cold
    // from its own group's start).
    let raw = rate(n, raw_consume(pool, &broker.bootstrap, &topic, n, 1).await?);
    let single = rate(n, inbox_run(pool, &broker.bootstrap, &topic, n, 1, 0).await?);
    // Batched, both sides take well under a second here: three alternating rounds, the
    // median of their ratios (and of each side's rate).
    let (mut ratios, mut raws, mut inboxes) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..3 {
        let raw_batched = rate(n, raw_consume(pool, &broker.bootstrap, &topic, n, INBOX_BATCH).await?);
        let batched = rate(n, inbox_run(pool, &broker.bootstrap, &topic, n, INBOX_BATCH, round).await?);
        ratios.push(batched / raw_batched);
        raws.push(raw_batched);
        inboxes.push(batched);
    }
    let (raw_batched, batched) = (percentile(&mut raws, 0.5), percentile(&mut inboxes, 0.5));
    f.set("inbox_vs_raw", single / raw);
    f.set("inbox_vs_raw_batched", percentile(&mut ratios, 0.5));
    f.set("inbox_events", n);
    f.set("inbox_events_per_s", single);
    f.set("inbox_batched_events_per_s", batched);
    f.set("raw_consumer_msgs_per_s", raw);
    f.set("raw_consumer_batched_msgs_per_s", raw_batched);
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    Ok(())
}

/// Partitions of the inbox benchmark's topic.
const INBOX_PARTITIONS: i32 = 4;

/// The inbox's default batch size, which both batched consumers use.
const INBOX_BATCH: usize = 100;

/// Runs an inbox (a consumer group of its own per `batch` and `round`, `batch` records per
/// transaction at most) until it applied all `n` events; returns the time it took.
async fn inbox_run(
    pool: &PgPool,
    bootstrap: &str,
    topic: &str,
    n: i64,
    batch: usize,
    round: u32,
) -> Result<Duration, Failure> {
    sqlx::query("TRUNCATE bench_effects").execute(pool).await?;
    let consumer = format!("bench-inbox-{batch}-{round}");
    let inbox_config =
        InboxConfig::new(&consumer, bootstrap, [topic.to_owned()]).dedup_retention(None).batch_size(batch);
    let inbox = Inbox::new(pool.clone(), inbox_config, Handlers::new().fallback(Effect))?;
    inbox.migrator().run(pool).await?;
    let stats = inbox.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(inbox.run(stop.clone()));
    // Timed from the first record applied: joining the consumer group (seconds on the mock
    // cluster) is not the inbox's work, and the raw consumer is timed the same way.
    let mut started = None;
    let mut stall = Stall::new();
    while i64::try_from(stats.applied())? < n {
        if started.is_none() && stats.applied() > 0 {
            started = Some(Instant::now());
        }
        if task.is_finished() {
            return Err(format!("the inbox stopped after applying {} of {n}", stats.applied()).into());
        }
        if let Err(e) = stall.check("the inbox", i64::try_from(stats.applied())?, n) {
            stop.cancel();
            return Err(e);
        }
        tokio::time::sleep(Duration::from_millis(if started.is_some() { 20 } else { 2 })).await;
    }
    let elapsed = started.map_or(Duration::ZERO, |t| t.elapsed());
    stop.cancel();
    task.await??;
    let applied = count(pool, "SELECT count(*) FROM bench_effects").await?;
    if applied != n {
        return Err(format!("the inbox ({consumer}) has {applied} effect rows for {n} events").into());
    }
    Ok(elapsed)
}

/// A consumer with the inbox's Kafka settings and a worker per partition that writes each
/// message's row: the messages waiting, up to `batch`, in one transaction (`batch` 1: each
/// in its own). Offsets are committed by librdkafka, periodically, as the inbox commits
/// its own.
async fn raw_consume(
    pool: &PgPool,
    bootstrap: &str,
    topic: &str,
    n: i64,
    batch: usize,
) -> Result<Duration, Failure> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("bench-raw-{}", Uuid::new_v4().simple()))
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .set("enable.auto.commit", "true")
        .create()?;
    consumer.subscribe(&[topic])?;
    let consumer = Arc::new(consumer);
    let done = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let mut workers: BTreeMap<i32, mpsc::Sender<(i32, i64, Option<String>)>> = BTreeMap::new();
    let mut tasks = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(1800);
    // Timed from the first record received, as the inbox is.
    let mut started = None;
    while done.load(std::sync::atomic::Ordering::Relaxed) < n {
        if Instant::now() > deadline {
            return Err(format!(
                "the raw consumer inserted {} of {n}",
                done.load(std::sync::atomic::Ordering::Relaxed)
            )
            .into());
        }
        let message = match tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await {
            Ok(message) => message?,
            Err(_) => continue,
        };
        started.get_or_insert_with(Instant::now);
        let event_id = message.headers().and_then(|h| {
            h.iter()
                .find(|h| h.key == "ce_id")
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        });
        let sender = workers.entry(message.partition()).or_insert_with(|| {
            let (tx, mut rx) = mpsc::channel::<(i32, i64, Option<String>)>(256);
            let (pool, done) = (pool.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let mut rows = Vec::with_capacity(batch);
                while let Some(first) = rx.recv().await {
                    rows.push(first);
                    while rows.len() < batch {
                        match rx.try_recv() {
                            Ok(row) => rows.push(row),
                            Err(_) => break,
                        }
                    }
                    let mut db = pool.begin().await?;
                    let written = i64::try_from(rows.len()).unwrap_or(i64::MAX);
                    for (partition, offset, event_id) in rows.drain(..) {
                        sqlx::query(
                            "INSERT INTO bench_raw (kafka_partition, kafka_offset, event_id) VALUES ($1, $2, $3)",
                        )
                        .bind(partition)
                        .bind(offset)
                        .bind(event_id)
                        .execute(&mut *db)
                        .await?;
                    }
                    db.commit().await?;
                    done.fetch_add(written, std::sync::atomic::Ordering::Relaxed);
                }
                Ok::<(), sqlx::Error>(())
            }));
            tx
        });
        sender.send((message.partition(), message.offset(), event_id)).await?;
    }
    let elapsed = started.map_or(Duration::ZERO, |t| t.elapsed());
    drop(workers);
    for task in tasks {
        task.await??;
    }
    Ok(elapsed)
}

/// `claim_backlog_ratio`: the relay's claim of one batch over a large backlog against a
/// small one. The two backlogs are two outbox tables side by side and the claims alternate
/// between them, so that whatever else the machine does hits both alike.
async fn claim_backlog(pool: &PgPool, sizes: Sizes, f: &mut Figures) -> Result<(), Failure> {
    let small = Outbox::new(outbox_runtime::OutboxConfig::default().table("claim_small"))?;
    let large = Outbox::new(outbox_runtime::OutboxConfig::default().table("claim_large"))?;
    for (outbox, table, backlog) in
        [(&small, "claim_small", sizes.claim_small), (&large, "claim_large", sizes.claim_large)]
    {
        outbox.migrator().run(pool).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {table} (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, \
                                  schema_version, topic, payload) \
             SELECT gen_random_uuid(), 'bench', 'agg-' || (g % 10000), g / 10000 + 1, 'bench.claim', 1, 'bench-claim', '{{}}' \
             FROM generate_series(0, $1::bigint - 1) AS g"
        )))
        .bind(backlog)
        .execute(pool)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {table}"))).execute(pool).await?;
    }
    // Flush what the inserts dirtied now rather than during the measurement (needs a
    // superuser; without one the checkpoint simply happens when PostgreSQL decides).
    let _ = sqlx::query("CHECKPOINT").execute(pool).await;
    let (mut small_total, mut large_total) = (0.0, 0.0);
    for i in 0..sizes.claims + 5 {
        let (small_rows, small_time) = hooks::claim_once(pool, &small, 500).await?;
        let (large_rows, large_time) = hooks::claim_once(pool, &large, 500).await?;
        if small_rows != 500 || large_rows != 500 {
            return Err(format!("claims read {small_rows} and {large_rows} rows, not 500").into());
        }
        if i >= 5 {
            small_total += small_time.as_secs_f64();
            large_total += large_time.as_secs_f64();
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let (small_mean, large_mean) = (small_total / sizes.claims as f64, large_total / sizes.claims as f64);
    f.set("claim_backlog_ratio", large_mean / small_mean);
    f.set("claim_ms_small_backlog", small_mean * 1e3);
    f.set("claim_ms_large_backlog", large_mean * 1e3);
    f.set("claim_small_backlog", sizes.claim_small);
    f.set("claim_large_backlog", sizes.claim_large);
    f.set("claims_measured", sizes.claims);
    Ok(())
}

/// `notify_latency_vs_poll`: p99 created-to-published latency at a steady 500 events/s,
/// each appended in its own transaction, with the relay woken by NOTIFY and polling every
/// second.
async fn notify_latency(
    pool: &PgPool,
    outbox: &Outbox,
    broker: &Broker,
    sizes: Sizes,
    f: &mut Figures,
) -> Result<(), Failure> {
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    broker.create_topic(<OrderConfirmed as OutboxEvent>::TOPIC, PARTITIONS).await?;
    let relay = Relay::new(
        pool.clone(),
        outbox.clone(),
        RelayConfig::new(&broker.bootstrap).poll_interval(POLL).cleanup(None),
    )?;
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let total = sizes.steady_seconds * 500;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut appended = 0;
    while appended < total {
        tick.tick().await;
        for _ in 0..5 {
            let event = OrderConfirmed {
                order_id: Uuid::now_v7(),
                total_cents: 1_000,
                currency: "EUR".into(),
                payment: Payment::Card { last4: "4242".into() },
                note: None,
            };
            let event = NewEvent::new(&event, AppendOptions::default())?;
            let mut tx = pool.begin().await?;
            outbox.append_batch(&mut tx, std::slice::from_ref(&event)).await?;
            tx.commit().await?;
            appended += 1;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let total_i64 = i64::try_from(total)?;
    while count(pool, "SELECT count(*) FROM outbox WHERE status = 'published'").await? < total_i64 {
        if Instant::now() > deadline {
            return Err("the relay did not publish the steady load".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    task.await??;
    let (p50, p99): (f64, f64) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM published_at - created_at)), \
                percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM published_at - created_at)) \
         FROM outbox",
    )
    .fetch_one(pool)
    .await?;
    f.set("notify_latency_vs_poll", p99 / POLL.as_secs_f64());
    f.set("steady_events", total);
    f.set("created_to_published_p50_ms", p50 * 1e3);
    f.set("created_to_published_p99_ms", p99 * 1e3);
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    Ok(())
}
