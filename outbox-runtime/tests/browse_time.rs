//! A list by time window reads what its page holds, however deep the window lies in the
//! table and however deep the page lies in the window; the published list and the
//! overview read what they show, however many unpublished events a broker outage leaves
//! above them; failure groups under a cap read the newest failed events only: measured in the rows the database says it read (its statistics), not in
//! time. A page whose cursor's event was cleaned up meanwhile is refused by name, never
//! shown as the end of the list.

use std::time::{Duration, SystemTime};

use outbox_runtime::ops::EventQuery;
use outbox_runtime::{Error, Outbox};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

mod common;

use common::{append_pings, existing_install};

/// Events in the table, one a second from [`BASE`].
const ROWS: u64 = 20_000;

/// 2026-01-01T00:00:00Z.
const BASE: u64 = 1_767_225_600;

/// Rows a page of 50 may read: its 50, the one that says there is a next page, the cursor's
/// event, and room for rows of the table outside the window at its edges.
const PAGE_READS: i64 = 120;

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(BASE + seconds)
}

/// `ROWS` events, the `n`th appended `n` seconds after `BASE`, with the browse indexes,
/// written through `setup` ([`one_connection`], then [`settle`]d); the id of the first.
async fn table(setup: &PgPool) -> i64 {
    let pool = setup;
    append_pings(pool, &["before".to_owned()]).await;
    sqlx::query("DELETE FROM outbox").execute(pool).await.expect("empty");
    sqlx::query(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload, \
                             created_at, status) \
         SELECT gen_random_uuid(), 'test', 'agg-' || (g % 500), 'test.cli', 1, 'test', '{}', to_timestamp($1 + g), \
                CASE WHEN g % 7 = 0 THEN 'pending' ELSE 'published' END \
         FROM generate_series(1, $2) g",
    )
    .bind(i64::try_from(BASE).expect("base"))
    .bind(i64::try_from(ROWS).expect("rows"))
    .execute(pool)
    .await
    .expect("rows");
    Outbox::default_ref().ops().create_browse_indexes(pool).await.expect("indexes");
    sqlx::query("VACUUM ANALYZE outbox").execute(pool).await.expect("analyze");
    sqlx::query_scalar("SELECT min(id) FROM outbox").fetch_one(pool).await.expect("first")
}

/// Closes `setup`, the connection the test wrote and read the outbox through before it
/// measures, and waits for its statistics: a connection reports them as it exits, where one
/// left open can report them seconds later, inside a measurement.
async fn settle(pool: &PgPool, setup: PgPool) {
    setup.close().await;
    let mut last = rows_read(pool).await;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = rows_read(pool).await;
        if now == last && now > 0 {
            return;
        }
        last = now;
    }
    panic!("the statistics did not settle");
}

/// Rows of the outbox (all its partitions, or the table in one piece, of which
/// `pg_partition_tree` says nothing) read so far: fetched through an index, or by a
/// sequential scan.
async fn rows_read(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0)), 0)::bigint \
         FROM pg_stat_user_tables \
         WHERE relid IN (SELECT relid FROM pg_partition_tree('outbox') UNION SELECT 'outbox'::regclass)",
    )
    .fetch_one(pool)
    .await
    .expect("statistics")
}

/// A pool of one connection to the test's database: its statistics are its own.
async fn one_connection(pool: &PgPool) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await
        .expect("one connection")
}

/// The rows of the outbox read since `before` (of [`rows_read`]) by `one`, a pool of one
/// connection, whose statistics are flushed as it goes idle and awaited (bounded: reading
/// nothing at all fails).
async fn read_since(pool: &PgPool, one: &PgPool, before: i64) -> i64 {
    sqlx::query("SELECT pg_stat_force_next_flush()").execute(one).await.expect("flush");
    for _ in 0..200 {
        let after = rows_read(pool).await;
        if after != before {
            return after - before;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the statistics never showed the reads");
}

/// `query`'s page, and the rows of the outbox it read, run on `one` ([`read_since`]).
async fn page_and_reads(pool: &PgPool, one: &PgPool, query: &EventQuery) -> (Vec<i64>, Option<i64>, i64) {
    let before = rows_read(pool).await;
    let page = Outbox::default_ref().ops().events(one, query).await.expect("page");
    let reads = read_since(pool, one, before).await;
    (page.events.iter().map(|e| e.id).collect(), page.next, reads)
}

/// The row id of the event appended `seconds` after `BASE`, the first's being `first`.
fn id_at(first: i64, seconds: u64) -> i64 {
    first + i64::try_from(seconds).expect("seconds") - 1
}

/// The same, read from the table.
async fn id_at_read(pool: &PgPool, seconds: u64) -> i64 {
    sqlx::query_scalar("SELECT id FROM outbox WHERE created_at = to_timestamp($1)")
        .bind(i64::try_from(BASE + seconds).expect("time"))
        .fetch_one(pool)
        .await
        .expect("id")
}

#[sqlx::test(migrations = false)]
async fn a_time_window_reads_what_its_page_holds_at_any_depth(pool: PgPool) {
    pages_read_what_they_hold(&pool).await;
    assert!(Outbox::default_ref().ops().is_partitioned(&pool).await.expect("layout"));
}

#[sqlx::test(migrations = false)]
async fn a_time_window_reads_what_its_page_holds_on_a_plain_outbox(pool: PgPool) {
    existing_install(&pool).await;
    pages_read_what_they_hold(&pool).await;
    assert!(!Outbox::default_ref().ops().is_partitioned(&pool).await.expect("layout"));
}

async fn pages_read_what_they_hold(pool: &PgPool) {
    let pool = pool.clone();
    let setup = one_connection(&pool).await;
    let first_id = table(&setup).await;
    assert_eq!(id_at_read(&setup, 777).await, id_at(first_id, 777), "ids follow times");
    settle(&pool, setup).await;
    let one = one_connection(&pool).await;
    let deep = id_at(first_id, ROWS - 10_000);
    let cases = [
        ("the newest 100 seconds", EventQuery::default().since(at(ROWS - 99)).until(at(ROWS + 1)), ROWS),
        ("the oldest 100 seconds", EventQuery::default().since(at(1)).until(at(101)), 100),
        ("all of it, 10,000 rows down", EventQuery::default().since(at(0)).before(deep), ROWS - 10_001),
        ("until 100, from its top", EventQuery::default().until(at(101)), 100),
        (
            "published, the oldest 100 seconds",
            EventQuery::default()
                .since(at(1))
                .until(at(101))
                .state(outbox_runtime::ops::EventState::Published),
            100,
        ),
    ];
    for (what, query, first) in cases {
        let (ids, next, reads) = page_and_reads(&pool, &one, &query).await;
        eprintln!("{what}: {} events, {reads} rows read", ids.len());
        assert_eq!(ids.len(), 50, "{what}: a full page");
        assert_eq!(ids[0], id_at(first_id, first), "{what}: newest first");
        assert!(next.is_some(), "{what}: a next page");
        assert!(reads <= PAGE_READS, "{what}: read {reads} rows of the outbox for a page of 50");
    }
}

#[sqlx::test(migrations = false)]
async fn a_page_after_an_event_cleaned_up_meanwhile_is_refused_by_name(pool: PgPool) {
    table(&pool).await;
    let ops = Outbox::default_ref().ops();
    let window = EventQuery::default().since(at(1)).until(at(1001)).limit(10);
    let page = ops.events(&pool, &window).await.expect("first page");
    let cursor = page.next.expect("a next page");
    let second = ops.events(&pool, &window.clone().before(cursor)).await.expect("second page");
    assert_eq!(second.events.len(), 10);
    sqlx::query("DELETE FROM outbox WHERE id = $1").bind(cursor).execute(&pool).await.expect("cleaned up");
    match ops.events(&pool, &window.clone().before(cursor)).await {
        Err(Error::Config(message)) => {
            assert!(message.contains(&format!("cursor {cursor}")) && message.contains("gone"), "{message}");
        }
        other => panic!("a page after a deleted event: {other:?}"),
    }
    // A list by id goes on past it: ids still order.
    let by_id = ops.events(&pool, &EventQuery::default().limit(10).before(cursor)).await.expect("by id");
    assert_eq!(by_id.events.len(), 10);
    assert!(by_id.events.iter().all(|e| e.id < cursor));
    // The end of a window is an empty page only where it ends: the last page's cursor.
    let mut q = window.clone();
    let mut pages = 0;
    loop {
        let page = ops.events(&pool, &q).await.expect("page");
        pages += 1;
        match page.next {
            Some(next) => q = q.before(next),
            None => break,
        }
    }
    assert_eq!(pages, 100, "999 events in pages of 10");
}

#[sqlx::test(migrations = false)]
async fn published_lists_and_the_overview_read_past_no_backlog(pool: PgPool) {
    let setup = one_connection(&pool).await;
    let first_id = table(&setup).await;
    // A broker outage: the newest 5,000 events wait.
    sqlx::query("UPDATE outbox SET status = CASE WHEN id > (SELECT max(id) FROM outbox) - 5000 THEN 'pending' ELSE 'published' END")
        .execute(&setup)
        .await
        .expect("outage");
    sqlx::query("VACUUM ANALYZE outbox").execute(&setup).await.expect("analyze");
    settle(&pool, setup).await;
    let one = one_connection(&pool).await;
    let published = EventQuery::default().state(outbox_runtime::ops::EventState::Published);
    let (ids, next, reads) = page_and_reads(&pool, &one, &published).await;
    eprintln!("published, 5,000 pending above: {} events, {reads} rows read", ids.len());
    assert_eq!((ids.len(), ids[0]), (50, id_at(first_id, ROWS - 5000)));
    assert!(next.is_some());
    assert!(reads <= PAGE_READS, "read {reads} rows of the outbox for a page of 50 published events");
    // The overview counts each state up to its cap: 101 rows each, at most, for pending and
    // published; none for the states no event is in.
    let before = rows_read(&pool).await;
    let overview = Outbox::default_ref().ops().overview(&one, 100).await.expect("overview");
    let reads = read_since(&pool, &one, before).await;
    eprintln!("overview, 5,000 pending above: {reads} rows read");
    let published = overview.states.iter().find(|c| c.state == outbox_runtime::ops::EventState::Published);
    assert_eq!(published.map(|c| (c.events.count, c.events.at_least)), Some((100, true)));
    assert!(reads <= 2 * 101 + 20, "the overview read {reads} rows of the outbox");
}

#[sqlx::test(migrations = false)]
async fn failure_groups_under_a_cap_read_the_newest_failed_only(pool: PgPool) {
    let setup = one_connection(&pool).await;
    table(&setup).await;
    // An incident: 400 older events failed of one cause, the 200 newest of another.
    sqlx::query(
        "UPDATE outbox SET status = 'failed', failed_at = created_at, topic = 'orders', \
                last_error = CASE WHEN id > (SELECT max(id) FROM outbox) - 200 THEN 'Broker: Unknown topic (' || id || ')' \
                                  ELSE 'Broker: Message size too large (' || id || ' bytes)' END \
         WHERE id > (SELECT max(id) FROM outbox) - 600",
    )
    .execute(&setup)
    .await
    .expect("failed");
    sqlx::query("VACUUM ANALYZE outbox").execute(&setup).await.expect("analyze");
    let ops = Outbox::default_ref().ops();
    let shape = |groups: &[outbox_runtime::ops::FailureGroup]| -> Vec<(String, i64, bool)> {
        groups.iter().map(|g| (g.cause.clone(), g.events, g.at_least)).collect()
    };
    let all = ops.failure_groups(&setup).await.expect("groups");
    settle(&pool, setup).await;
    assert_eq!(
        shape(&all),
        [
            ("Broker: Message size too large (<n> bytes)".to_owned(), 400, false),
            ("Broker: Unknown topic (<n>)".to_owned(), 200, false)
        ]
    );
    let one = one_connection(&pool).await;
    let before = rows_read(&pool).await;
    let capped = ops.failure_groups_capped(&one, 300).await.expect("capped");
    let reads = read_since(&pool, &one, before).await;
    eprintln!("failure groups capped at 300 of 600 failed: {reads} rows read");
    // The newest 301: all 200 of the new cause, 101 of the old.
    assert_eq!(
        shape(&capped),
        [
            ("Broker: Unknown topic (<n>)".to_owned(), 200, true),
            ("Broker: Message size too large (<n> bytes)".to_owned(), 101, true)
        ]
    );
    assert!(reads <= 301 + 10, "read {reads} rows for groups capped at 300");
    let under = ops.failure_groups_capped(&pool, 600).await.expect("under the cap");
    assert_eq!(shape(&under), shape(&all), "under its cap, every failed event counts");
}
