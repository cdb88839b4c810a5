//! Relay processes killed with SIGKILL at random moments (invariants 4 and 5).

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_runtime::{AppendOptions, NewEvent, OutboxEvent};
use outbox_tests::cdc_kit::{self, Slot};
use outbox_tests::kafka::Kafka;
use outbox_tests::{database_url, migrate, rows_in, Rng};
use schemars::JsonSchema;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

/// Step `n` of aggregate `id`, on a topic of its own.
#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "test.kill_step", schema_version = 1, aggregate = "test", topic = "outbox-test-kill")]
struct KillStep {
    #[outbox(aggregate_id)]
    id: String,
    n: i64,
    data: String,
}

const TOPIC: &str = KillStep::TOPIC;
const RELAYS: usize = 3;

/// Events per aggregate: 100 (20,000 events), or `OUTBOX_KILL_VERSIONS`. CI's run against
/// Tansu uses 10: Tansu's SQLite storage serves fetches at about 125 records/s here, which
/// makes reading 20,000 records back take minutes; the mock cluster runs the full size.
fn versions() -> i64 {
    std::env::var("OUTBOX_KILL_VERSIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(100)
}

/// Which of the three relay models the processes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Model {
    /// The polling relay leasing work partitions.
    Lease,
    /// The polling relay holding each batch's locks across the send.
    HoldLocks,
    /// The change-data-capture relay.
    Cdc,
}

/// A relay process: the polling relay, or with `slot` the change-data-capture relay
/// streaming from it (a standby while another process streams). Its connections carry
/// `name` as their application name, so that the streaming one can be told apart.
fn spawn_relay(database: &str, brokers: &str, model: Model, slot: Option<&str>, name: &str) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_test-relay"));
    if let Some(slot) = slot {
        command.env("OUTBOX_CDC_SLOT", slot).env("OUTBOX_CDC_TAKEOVER_MS", "300");
    }
    if model == Model::HoldLocks {
        command.env("OUTBOX_CLAIM_MODE", "hold-locks");
    }
    command
        .env("DATABASE_URL", format!("{database}?application_name={name}"))
        .env("KAFKA_BROKERS", brokers)
        // A message timeout makes librdkafka bump its idempotent producer epoch, which
        // Tansu 0.6.0 cannot handle (its storage panics at lite.rs:503, "more or less than
        // one row", and serves nothing after): keep timeouts rare with 4 s.
        .env("OUTBOX_LEASE_TTL_MS", "10000")
        .env("OUTBOX_MESSAGE_TIMEOUT_MS", "4000")
        .env("OUTBOX_POLL_MS", "200")
        .env("OUTBOX_BATCH_SIZE", "100")
        .env("RUST_LOG", std::env::var("RELAY_LOG").unwrap_or_else(|_| "error".into()))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start a relay process")
}

#[sqlx::test(migrations = false)]
async fn relays_killed_at_random_lose_nothing_and_keep_per_aggregate_order(pool: PgPool) {
    // Fault: SIGKILL of relay processes at random moments, at any point of claim, send or
    // mark, while 3 relays drain 20,000 events of 200 aggregates (see `versions`). Invariant 4: nothing is
    // lost (killed relays' partitions return when their leases expire). Invariant 5: for
    // every aggregate, first appearances in the topic follow aggregate_version order.
    // At least 6,000 events: 2,000 drained in 1.5 s in CI, before a third kill landed.
    kill_run(pool, 200, versions().max(30), Model::Lease).await;
}

/// The same with relays holding each batch's transaction and locks across the send: a
/// killed relay's connection closes, its transaction rolls back and its rows are free at
/// once; what it had sent is sent again.
#[sqlx::test(migrations = false)]
async fn relays_holding_locks_killed_at_random_lose_nothing_and_keep_per_aggregate_order(pool: PgPool) {
    kill_run(pool, 200, versions().max(30), Model::HoldLocks).await;
}

/// The same with 10 hot aggregates carrying every event: each batch sends every
/// aggregate's events without waiting for each acknowledgement, and relays die with such
/// windows in flight (20,000 events; 6,000 on Tansu, where 2,000 drained in 1.2 s, before
/// a third kill).
#[sqlx::test(migrations = false)]
async fn relays_killed_at_random_keep_hot_aggregates_in_order(pool: PgPool) {
    kill_run(pool, 10, (versions() * 20).max(600), Model::Lease).await;
}

/// The change-data-capture relay's processes killed at random: one streams, two stand by
/// and take the slot over; what was not confirmed is streamed again. Nothing lost, order
/// per aggregate kept (test 5 of the design: takeovers after kill -9, 0 order violations).
#[tokio::test]
async fn streaming_relays_killed_at_random_lose_nothing_and_keep_per_aggregate_order() {
    let pool = cdc_kit::database().await;
    // At least 6,000 events: a stream drains 2,000 in about a second, too fast for the
    // kills to land on the streaming process.
    kill_run(pool, 200, versions().max(30), Model::Cdc).await;
}

async fn kill_run(pool: PgPool, aggregates: i64, versions: i64, model: Model) {
    let cdc = model == Model::Cdc;
    let kafka = Kafka::start();
    let run = Uuid::new_v4().simple().to_string()[..8].to_owned();
    // A topic of this run's own: reading back one that several runs and tests share took a
    // broker process (Tansu, ~100 records/s) past the read's time limit, and events that
    // were in it showed as missing.
    let topic = format!("{TOPIC}-{run}");
    kafka.create_topic(&topic, 6).await;
    let outbox = migrate(&pool).await;
    // Rows get the run's topic as they are inserted (the test's database is its own): a
    // streaming relay sends the inserted row, not a later UPDATE of it.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE FUNCTION kill_topic() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN NEW.topic := '{topic}'; RETURN NEW; END $$"
    )))
    .execute(&pool)
    .await
    .expect("trigger function");
    sqlx::query(
        "CREATE TRIGGER kill_topic BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION kill_topic()",
    )
    .execute(&pool)
    .await
    .expect("trigger");
    // The slot before the appends: they are streamed, not handed to the table path.
    let slot = if cdc { Some(Slot::setup(&pool, &outbox).await) } else { None };
    let slot_name = slot.as_ref().map(Slot::name);
    let key = |a: i64| format!("kill-{run}-{a:03}");
    for version in 1..=versions {
        let events: Vec<NewEvent> = (0..aggregates)
            .map(|a| {
                let step = KillStep { id: key(a), n: version, data: "k".repeat(64) };
                NewEvent::new(&step, AppendOptions::default().aggregate_version(version)).expect("event")
            })
            .collect();
        let mut tx = pool.begin().await.expect("begin");
        outbox.append_batch(&mut tx, &events).await.expect("append");
        tx.commit().await.expect("commit");
    }
    let total = aggregates * versions;
    let database = database_url(&pool);
    let mut rng = Rng::from_env("relay_kill");
    let mut names: Vec<String> = (0..RELAYS).map(|i| format!("kill-relay-{i}")).collect();
    let mut relays: Vec<Child> =
        names.iter().map(|name| spawn_relay(&database, kafka.bootstrap(), model, slot_name, name)).collect();
    let mut spawned = RELAYS;
    // Kills are placed by progress, not by the clock: one as the drain passes each of KILLS
    // points drawn at random in 2-75% of it, then one every 50-500 ms until it is done.
    // Relays that drain 20,000 events in 1.7 s (the mock cluster) still die mid-drain;
    // with clock-driven kills alone they died twice and CI failed on it. A burst (relays
    // taking over expired leases at once) may finish the drain while a killed relay is
    // being restarted, before the last points: at least MIN_KILLS must land.
    const KILLS: usize = 5;
    const MIN_KILLS: usize = 3;
    let mut points: Vec<i64> =
        (0..KILLS).map(|_| rng.range(total as u64 * 2 / 100, total as u64 * 75 / 100) as i64).collect();
    points.sort_unstable();
    let started = Instant::now();
    let mut kills = 0u32;
    let mut streaming_kills = 0u32;
    let mut next_point = 0;
    while started.elapsed() < Duration::from_secs(240) {
        let published = rows_in(&pool, "published").await;
        if published >= total {
            break;
        }
        if next_point < points.len() && published < points[next_point] {
            tokio::time::sleep(Duration::from_millis(rng.range(2, 20))).await;
            continue;
        }
        next_point += 1;
        let mut victim = rng.range(0, RELAYS as u64) as usize;
        if let Some(slot) = slot_name {
            // The first kill, and then two in three, hit the process that streams (a
            // standby's death changes nothing): found by the application name of the slot's
            // server process, waited for up to 2 s while a standby takes the slot over (a
            // kill that looked once, between two streamers, found none: in CI, 0 of 6).
            let mut streaming = None;
            for _ in 0..40 {
                let name: Option<String> = sqlx::query_scalar(
                    "SELECT a.application_name FROM pg_replication_slots s \
                     JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = $1",
                )
                .bind(slot)
                .fetch_optional(&pool)
                .await
                .expect("the streaming relay");
                streaming = name.and_then(|name| names.iter().position(|n| *n == name));
                if streaming.is_some() || rows_in(&pool, "published").await >= total {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if let Some(i) = streaming {
                if streaming_kills == 0 || rng.range(0, 3) < 2 {
                    victim = i;
                    streaming_kills += 1;
                }
            }
        }
        relays[victim].kill().expect("SIGKILL");
        relays[victim].wait().expect("reap");
        kills += 1;
        tokio::time::sleep(Duration::from_millis(rng.range(0, 400))).await;
        names[victim] = format!("kill-relay-{spawned}");
        spawned += 1;
        relays[victim] = spawn_relay(&database, kafka.bootstrap(), model, slot_name, &names[victim]);
        if next_point > points.len() {
            // Past the last point: one kill every 50-500 ms until drained; streaming relays
            // need a takeover (a start, then up to 300 ms) after each, so every 1-3 s.
            let (low, high) = if cdc { (1000, 3000) } else { (50, 500) };
            tokio::time::sleep(Duration::from_millis(rng.range(low, high))).await;
        }
    }
    let drained_in = started.elapsed();
    for relay in &mut relays {
        relay.kill().expect("stop");
        relay.wait().expect("reap");
    }
    let published = rows_in(&pool, "published").await;
    if published < total {
        let stuck: Vec<(String, i64, i32, Option<String>)> = sqlx::query_as(
            "SELECT status, count(*), max(attempts), max(last_error) FROM outbox WHERE status <> 'published' GROUP BY status",
        )
        .fetch_all(&pool)
        .await
        .expect("stuck rows");
        let leases: Vec<(Option<Uuid>, i64)> = sqlx::query_as(
            "SELECT owner, count(*) FROM outbox_leases WHERE expires_at > now() GROUP BY owner",
        )
        .fetch_all(&pool)
        .await
        .expect("leases");
        eprintln!("not published (status, rows, max attempts, an error): {stuck:?}\nleases: {leases:?}");
    }
    assert_eq!(published, total, "every event published within 240 s");

    let ids: BTreeSet<String> = sqlx::query_scalar::<_, Uuid>("SELECT event_id FROM outbox")
        .fetch_all(&pool)
        .await
        .expect("ids")
        .into_iter()
        .map(|id| id.to_string())
        .collect();
    let prefix = format!("kill-{run}-");
    // Tansu serves a few dozen records a second while four kill tests share it (CI read 5,260
    // of 6,000 in 120 s, every row placed in the database): the reader gets 300 s.
    let records = kafka.read_all(&topic, Duration::from_secs(300));
    let ours: Vec<_> = records.iter().filter(|r| r.key.starts_with(&prefix)).collect();
    let seen: BTreeSet<&String> = ours.iter().filter_map(|r| r.headers.get("ce_id")).collect();
    let missing = ids.iter().filter(|id| !seen.contains(id)).count();

    let mut by_key: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for r in &ours {
        let v = r.headers["ce_aggregateversion"].parse::<i64>().expect("version");
        by_key.entry(r.key.as_str()).or_default().push(v);
    }
    let mut order_violations = 0;
    for versions in by_key.values() {
        let mut next = 1;
        for &v in versions {
            if v == next {
                next += 1;
            } else if v > next {
                order_violations += 1; // a later version appeared before an earlier one
            }
        }
    }
    let duplicates = ours.len() - seen.len();
    let rate = total as f64 / drained_in.as_secs_f64();
    eprintln!(
        "relay_kill: model={model:?} events={total} aggregates={aggregates} relays={RELAYS} kills={kills} \
         streaming_kills={streaming_kills} in_topic={} missing={missing} \
         duplicates={duplicates} order_violations={order_violations} drained_in={:.1}s rate={rate:.0}/s cores={}",
        ours.len(),
        drained_in.as_secs_f64(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if missing > 0 {
        let db: Vec<(i32, i64, i64, i64)> = sqlx::query_as(
            "SELECT kafka_partition, count(*), min(kafka_offset), max(kafka_offset) FROM outbox GROUP BY 1 ORDER BY 1",
        )
        .fetch_all(&pool)
        .await
        .expect("placements");
        let mut read: BTreeMap<i32, (usize, i64, i64)> = BTreeMap::new();
        for r in &records {
            let e = read.entry(r.partition).or_insert((0, i64::MAX, i64::MIN));
            *e = (e.0 + 1, e.1.min(r.offset), e.2.max(r.offset));
        }
        eprintln!("database (partition, rows, min offset, max offset): {db:?}\nread (partition -> records, min, max): {read:?}");
    }
    assert_eq!(missing, 0, "every event is in the topic at least once");
    assert_eq!(order_violations, 0, "first appearances follow aggregate_version order");
    assert!(!cdc || streaming_kills >= 1, "a streaming relay was killed: {streaming_kills} of {kills} kills");
    assert!(
        kills as usize >= MIN_KILLS,
        "the fault was injected: {kills} kills, {KILLS} planned, {MIN_KILLS} needed"
    );
}
