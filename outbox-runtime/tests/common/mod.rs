//! What the `outbox` command line's tests share: the event they append, the binary run
//! against the test's database, and the rows they start from (outbox events, and parked
//! inbox messages of consumer `billing`).
// Each test crate uses its own share of these.
#![allow(dead_code)]

use std::process::{Command, Output};

use outbox_runtime::{AppendOptions, NewEvent, Outbox, OutboxEvent};
use schemars::JsonSchema;
use serde::Serialize;
use sqlx::PgPool;

/// The event the tests append.
#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "test.cli", schema_version = 1, aggregate = "test", topic = "test")]
pub(crate) struct Ping {
    #[outbox(aggregate_id)]
    id: String,
    /// A marker that must never appear in operator output.
    secret: String,
}

/// The URL of the test's database.
pub(crate) fn database_url(pool: &PgPool) -> String {
    let base = std::env::var("DATABASE_URL").unwrap_or_else(|_| outbox_runtime::DEFAULT_DATABASE_URL.into());
    let db = pool.connect_options().get_database().unwrap_or("test").to_owned();
    format!("{}/{db}", base.rsplit_once('/').map_or(base.as_str(), |(server, _)| server))
}

/// Runs `outbox --database-url <the test's database> args...`.
pub(crate) fn outbox_cli(pool: &PgPool, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--database-url")
        .arg(database_url(pool))
        .args(args)
        .output()
        .expect("run")
}

/// What a command wrote to stdout.
pub(crate) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Appends one `Ping` per id (with a payload marker) to the default outbox, migrated first.
pub(crate) async fn append_pings(pool: &PgPool, ids: &[String]) -> Vec<uuid::Uuid> {
    let outbox = Outbox::default_ref();
    outbox.migrator().run(pool).await.expect("migrate");
    let events: Vec<NewEvent> = ids
        .iter()
        .map(|id| {
            NewEvent::new(&Ping { id: id.clone(), secret: "PAYLOAD-MARKER".into() }, AppendOptions::default())
                .expect("event")
        })
        .collect();
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &events).await.expect("append");
    tx.commit().await.expect("commit");
    events.iter().map(NewEvent::event_id).collect()
}

/// The outbox's tables as an existing install has them: at migration 12, one id taken (an
/// outbox that has had events, cleaned since), then the rest; its outbox table stays plain
/// (migration 13 partitions only a new install's).
pub(crate) async fn existing_install(pool: &PgPool) {
    let outbox = Outbox::default_ref();
    outbox.migrator().run_to(12, pool).await.expect("migrate to 12");
    sqlx::query("SELECT nextval(pg_get_serial_sequence('outbox', 'id'))").execute(pool).await.expect("an id");
    outbox.migrator().run(pool).await.expect("migrate");
    assert!(!outbox.ops().is_partitioned(pool).await.expect("layout"), "an existing install stays plain");
}

/// The four events the tests start from (aggregates a, a, b, c); returns their event ids.
pub(crate) async fn seed(pool: &PgPool) -> Vec<uuid::Uuid> {
    let ids = append_pings(pool, &["a", "a", "b", "c"].map(String::from)).await;
    // a's first event failed permanently, holding a's second back; c is published; all 10 s old.
    // (By position: an existing install's ids do not start at 1.)
    sqlx::query(
        "WITH r AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM outbox) \
         UPDATE outbox o SET created_at = now() - interval '10 seconds', \
           status = CASE r.n WHEN 1 THEN 'failed' WHEN 4 THEN 'published' ELSE 'pending' END, \
           attempts = CASE r.n WHEN 1 THEN 1 ELSE 0 END, \
           last_error = CASE r.n WHEN 1 THEN 'Broker: Message size too large' END, \
           published_at = CASE r.n WHEN 4 THEN now() END \
         FROM r WHERE r.id = o.id",
    )
    .execute(pool)
    .await
    .expect("states");
    ids
}

/// Consumer `billing`'s inbox on topic `orders` (no broker: it is only operated), its
/// tables migrated.
pub(crate) async fn billing_inbox(pool: &PgPool) -> outbox_runtime::inbox::Inbox {
    use outbox_runtime::inbox::{Handlers, Inbox, InboxConfig};
    let inbox =
        Inbox::new(pool.clone(), InboxConfig::new("billing", "127.0.0.1:1", ["orders"]), Handlers::new())
            .expect("inbox");
    inbox.migrator().run(pool).await.expect("migrate");
    inbox
}

/// A parked (or held) message of consumer `billing` in topic `orders`, with a payload
/// marker that must never appear in operator output.
pub(crate) struct Parked<'a> {
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) key: &'a str,
    pub(crate) event_type: &'a str,
    pub(crate) version: i32,
    pub(crate) status: &'a str,
    pub(crate) reason: &'a str,
}

/// Inserts `rows` into `billing`'s parked table, in order (ids 1, 2, ...).
pub(crate) async fn park(pool: &PgPool, rows: &[Parked<'_>]) {
    for row in rows {
        sqlx::query(
            "INSERT INTO inbox_parked (consumer, topic, kafka_partition, kafka_offset, record_key, headers, payload, \
                                       event_id, event_type, schema_version, status, reason) \
             VALUES ('billing', 'orders', $1, $2, $3, '{}', 'PAYLOAD-MARKER', gen_random_uuid(), $4, $5, $6, $7)",
        )
        .bind(row.partition)
        .bind(row.offset)
        .bind(row.key.as_bytes())
        .bind(row.event_type)
        .bind(row.version)
        .bind(row.status)
        .bind(row.reason)
        .execute(pool)
        .await
        .expect("park");
    }
}

/// `t`, or `t` moved up to 999 ns either way at random: a time bound between two
/// microseconds, which PostgreSQL cannot store, must filter exactly as it reads (`since`
/// rounded to the nearest microsecond took an event 300 ns older than it).
pub(crate) fn near(rng: &mut fastrand::Rng, t: std::time::SystemTime) -> std::time::SystemTime {
    let moved = std::time::Duration::from_nanos(rng.u64(1..1_000));
    match rng.u8(0..3) {
        0 => t,
        1 => t + moved,
        _ => t - moved,
    }
}
