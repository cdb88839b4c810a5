//! Browsing an outbox (`outbox.ops()`): keyset pages by state and filter, checked against
//! the table read whole (generated states and queries, seed printed); a filter whose index
//! is missing is refused by name; the browse indexes on a plain and on a partitioned
//! outbox, used by every list; one event in full, its payload byte for byte; failure groups
//! and an action on exactly one group; capped counts.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use outbox_runtime::ops::{ActionFilter, EventQuery, EventState, EventSummary};
use outbox_runtime::{Error, Outbox};
use sqlx::PgPool;
use uuid::Uuid;

mod common;

use common::{append_pings, existing_install, near};

/// A row as the ground truth reads it: (id, event id, aggregate id, type, topic, state,
/// seconds after [`BASE`] it was appended).
type Truth = (i64, Uuid, String, String, String, EventState, u64);

/// 2026-01-01T00:00:00Z: the events' times are this and up to 120 seconds after, at random
/// (ties included), so that their order by time is not their order by id.
const BASE: u64 = 1_767_225_600;

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(BASE + seconds)
}

const TYPES: [&str; 3] = ["order.placed", "order.shipped", "invoice.issued"];
const TOPICS: [&str; 2] = ["orders", "invoices"];

/// `n` events over 9 aggregates, each given a random type, topic and state by `rng`.
async fn random_events(pool: &PgPool, n: usize, rng: &mut fastrand::Rng) {
    let ids: Vec<String> = (0..n).map(|_| format!("agg-{}", rng.u8(0..9))).collect();
    append_pings(pool, &ids).await;
    let states = ["pending", "retrying", "failed", "published", "discarded"];
    for id in 1..=i64::try_from(n).expect("n") {
        let state = states[rng.usize(0..states.len())];
        let (status, next) = if state == "retrying" {
            ("pending", "now() + interval '1 hour'")
        } else {
            (state, "'-infinity'")
        };
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE outbox SET status = $2, next_attempt_at = {next}, event_type = $3, topic = $4, \
                    created_at = to_timestamp($5::bigint), last_error = CASE WHEN $2 IN ('failed', 'discarded') THEN 'error on offset ' || $1 END \
             WHERE id = (SELECT min(id) FROM outbox) + $1 - 1"
        )))
        .bind(id)
        .bind(status)
        .bind(TYPES[rng.usize(0..TYPES.len())])
        .bind(TOPICS[rng.usize(0..TOPICS.len())])
        .bind(i64::try_from(BASE).expect("base") + rng.i64(0..=120))
        .execute(pool)
        .await
        .expect("state");
    }
}

async fn truth(pool: &PgPool) -> Vec<Truth> {
    /// Id, event id, aggregate id, type, topic, status, waiting, seconds since 1970.
    type Row = (i64, Uuid, String, String, String, String, bool, i64);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, event_id, aggregate_id, event_type, topic, status, next_attempt_at > '-infinity', \
                extract(epoch FROM created_at)::bigint FROM outbox ORDER BY id DESC",
    )
    .fetch_all(pool)
    .await
    .expect("rows");
    rows.into_iter()
        .map(|(id, event_id, aggregate, t, topic, status, waiting, epoch)| {
            let state = match (status.as_str(), waiting) {
                ("pending", true) => EventState::Retrying,
                (status, _) => status.parse().expect("a state"),
            };
            let seconds = u64::try_from(epoch).expect("after 1970") - BASE;
            (id, event_id, aggregate, t, topic, state, seconds)
        })
        .collect()
}

fn matches(row: &Truth, q: &EventQuery) -> bool {
    q.state.is_none_or(|s| s == row.5)
        && q.event_id.is_none_or(|e| e == row.1)
        && q.aggregate_id.as_ref().is_none_or(|a| *a == row.2)
        && q.event_type.as_ref().is_none_or(|t| *t == row.3)
        && q.topic.as_ref().is_none_or(|t| *t == row.4)
        && q.since.is_none_or(|t| at(row.6) >= t)
        && q.until.is_none_or(|t| at(row.6) < t)
}

/// The event ids of the failed events.
async fn failed_ids(pool: &PgPool) -> BTreeSet<Uuid> {
    sqlx::query_scalar("SELECT event_id FROM outbox WHERE status = 'failed'")
        .fetch_all(pool)
        .await
        .expect("failed")
        .into_iter()
        .collect()
}

/// Every page of `query`, walked by its cursor.
async fn walk(pool: &PgPool, query: &EventQuery) -> Vec<EventSummary> {
    let ops = Outbox::default_ref().ops();
    let mut all = Vec::new();
    let mut q = query.clone();
    for _ in 0..1000 {
        let page = ops.events(pool, &q).await.expect("page");
        assert!(page.events.len() <= q.limit as usize, "a page holds at most its limit");
        all.extend(page.events);
        match page.next {
            Some(next) => q = q.before(next),
            None => return all,
        }
    }
    panic!("more than 1,000 pages");
}

fn seed() -> u64 {
    let seed = std::env::var("OUTBOX_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("browse: OUTBOX_TEST_SEED={seed}");
    seed
}

#[sqlx::test(migrations = false)]
async fn pages_list_every_matching_event_once_newest_first(pool: PgPool) {
    // Newest first: by id, or, in a time window, by time then id.
    let seed = seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    random_events(&pool, 300, &mut rng).await;
    let ops = Outbox::default_ref().ops();
    assert_eq!(ops.create_browse_indexes(&pool).await.expect("indexes").len(), 6);
    let rows = truth(&pool).await;
    let mut compared = 0;
    let mut reordered = 0;
    for round in 0..80 {
        let mut q = EventQuery::default().limit(rng.u32(1..40));
        if rng.bool() {
            q = q.state(EventState::ALL[rng.usize(0..5)]);
        }
        if rng.u8(0..4) == 0 {
            q = q.aggregate_id(format!("agg-{}", rng.u8(0..10)));
        }
        if rng.u8(0..3) == 0 {
            q = q.event_type(TYPES[rng.usize(0..TYPES.len())]);
        }
        if rng.u8(0..3) == 0 {
            q = q.topic(TOPICS[rng.usize(0..TOPICS.len())]);
        }
        if rng.u8(0..6) == 0 {
            q = q.event_id(rows[rng.usize(0..rows.len())].1);
        }
        let (from, to) = (rng.u64(0..=120), rng.u64(1..=121));
        match rng.u8(0..4) {
            0 => q = q.since(near(&mut rng, at(from))),
            1 => q = q.until(near(&mut rng, at(to))),
            2 if from < to => q = q.since(near(&mut rng, at(from))).until(near(&mut rng, at(to))),
            _ => {}
        }
        let mut matched: Vec<&Truth> = rows.iter().filter(|r| matches(r, &q)).collect();
        if q.since.is_some() || q.until.is_some() {
            matched.sort_by_key(|r| std::cmp::Reverse((r.6, r.0)));
        }
        let expected: Vec<i64> = matched.iter().map(|r| r.0).collect();
        let listed = walk(&pool, &q).await;
        let got: Vec<i64> = listed.iter().map(|e| e.id).collect();
        assert_eq!(got, expected, "seed {seed}, round {round}: {q:?}");
        reordered += usize::from(!got.is_sorted_by(|a, b| a > b));
        for e in &listed {
            let row = rows.iter().find(|r| r.0 == e.id).expect("a row");
            assert_eq!(
                (e.event_id, &e.aggregate_id, &e.event_type, &e.topic, e.state),
                (row.1, &row.2, &row.3, &row.4, row.5)
            );
        }
        compared += got.len();
    }
    assert!(compared > 300, "the queries listed events ({compared}), not only empty pages");
    assert!(reordered > 3, "time windows listed events out of id order ({reordered} rounds)");
}

#[sqlx::test(migrations = false)]
async fn a_filter_whose_index_is_missing_is_refused_by_name(pool: PgPool) {
    let ids = append_pings(&pool, &["a".to_owned(), "b".to_owned()]).await;
    let ops = Outbox::default_ref().ops();
    let missing = ops.missing_browse_indexes(&pool).await.expect("missing");
    assert_eq!(
        missing,
        [
            "outbox_browse_agg",
            "outbox_browse_type",
            "outbox_browse_retry",
            "outbox_browse_disc",
            "outbox_browse_time",
            "outbox_browse_pub"
        ]
    );
    for (q, index) in [
        (EventQuery::default().aggregate_id("a"), "outbox_browse_agg"),
        (EventQuery::default().event_type("test.cli"), "outbox_browse_type"),
        (EventQuery::default().state(EventState::Retrying), "outbox_browse_retry"),
        (EventQuery::default().state(EventState::Discarded), "outbox_browse_disc"),
        (EventQuery::default().since(SystemTime::now()), "outbox_browse_time"),
        (EventQuery::default().state(EventState::Failed).until(SystemTime::now()), "outbox_browse_time"),
    ] {
        match ops.events(&pool, &q).await {
            Err(Error::Config(message)) => assert!(message.contains(index), "{message}"),
            other => panic!("{q:?}: {other:?}"),
        }
    }
    // What the table's own indexes serve works without them.
    let page = ops.events(&pool, &EventQuery::default().event_id(ids[1])).await.expect("by id");
    assert_eq!(page.events.iter().map(|e| e.event_id).collect::<Vec<_>>(), [ids[1]]);
    let page = ops.events(&pool, &EventQuery::default().state(EventState::Pending)).await.expect("pending");
    assert_eq!(page.events.len(), 2);
    // Published events are listed without theirs: it only spares reading unpublished ones.
    let page =
        ops.events(&pool, &EventQuery::default().state(EventState::Published)).await.expect("published");
    assert!(page.events.is_empty());
    for bad in
        [EventQuery::default().limit(0), EventQuery::default().limit(501), EventQuery::default().topic("")]
    {
        assert!(matches!(ops.events(&pool, &bad).await, Err(Error::Config(_))), "{bad:?}");
    }
}

/// The plan of `sql` with sequential scans off: an index can serve it.
async fn plan(pool: &PgPool, sql: &str) -> String {
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("SET LOCAL enable_seqscan = off").execute(&mut *tx).await.expect("set");
    let lines: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
        .fetch_all(&mut *tx)
        .await
        .expect("explain");
    lines.join("\n")
}

async fn indexes_serve_every_list(pool: &PgPool) {
    let ops = Outbox::default_ref().ops();
    assert_eq!(ops.create_browse_indexes(pool).await.expect("indexes").len(), 6, "built");
    assert!(ops.create_browse_indexes(pool).await.expect("again").is_empty(), "a second run builds nothing");
    assert!(ops.missing_browse_indexes(pool).await.expect("missing").is_empty());
    sqlx::query("ANALYZE outbox").execute(pool).await.expect("analyze");
    let summary = "SELECT id FROM outbox o WHERE";
    for condition in [
        "o.aggregate_id = 'a' ORDER BY o.id DESC LIMIT 51",
        "o.event_type = 'test.cli' ORDER BY o.id DESC LIMIT 51",
        "o.status = 'pending' AND o.next_attempt_at > '-infinity' ORDER BY o.id DESC LIMIT 51",
        "o.status = 'discarded' ORDER BY o.id DESC LIMIT 51",
        "o.status = 'published' ORDER BY o.id DESC LIMIT 51",
        "o.status = 'failed' ORDER BY o.id DESC LIMIT 51",
        "o.status = 'pending' AND o.next_attempt_at = '-infinity' ORDER BY o.id DESC LIMIT 51",
        "o.event_id = '00000000-0000-0000-0000-000000000000'",
        "o.created_at >= now() - interval '1 hour' ORDER BY o.created_at DESC, o.id DESC LIMIT 51",
        "(o.created_at, o.id) < ((SELECT c.created_at FROM outbox c WHERE c.id = 7), 7) \
         ORDER BY o.created_at DESC, o.id DESC LIMIT 51",
    ] {
        let plan = plan(pool, &format!("{summary} {condition}")).await;
        assert!(!plan.contains("Seq Scan"), "{condition}:\n{plan}");
        if condition.starts_with("o.status = 'published'") {
            let published = plan.contains("outbox_browse_pub") || plan.contains("_bpub");
            assert!(published, "{condition}:\n{plan}");
        }
        if condition.contains("created_at") {
            // In order from the time index: no sort of the whole window.
            let by_time = plan.contains("outbox_browse_time") || plan.contains("_btim");
            let sorts = plan
                .lines()
                .any(|l| l.trim_start().trim_start_matches("->").trim_start().starts_with("Sort  ("));
            assert!(by_time && !sorts, "{condition}:\n{plan}");
        }
    }
}

#[sqlx::test(migrations = false)]
async fn browse_indexes_build_on_a_partitioned_outbox_and_serve_every_list(pool: PgPool) {
    append_pings(&pool, &["a".to_owned()]).await;
    assert!(Outbox::default_ref().ops().is_partitioned(&pool).await.expect("layout"));
    indexes_serve_every_list(&pool).await;
    // A partition made after the build has them too: the partitioned table's indexes are
    // valid, so PostgreSQL gives every new partition its own.
    let ops = Outbox::default_ref().ops();
    sqlx::query("SELECT setval(pg_get_serial_sequence('outbox', 'id'), 3 * (1::bigint << 40))")
        .execute(&pool)
        .await
        .expect("ids ahead");
    ops.maintain_partitions(&pool, None).await.expect("partitions ahead");
    assert!(ops.missing_browse_indexes(&pool).await.expect("missing").is_empty());
    let unindexed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_partition_tree('outbox') t WHERE t.isleaf \
         AND NOT EXISTS (SELECT 1 FROM pg_inherits h JOIN pg_index i ON i.indexrelid = h.inhrelid \
                         WHERE h.inhparent = 'outbox_browse_agg'::regclass AND i.indrelid = t.relid)",
    )
    .fetch_one(&pool)
    .await
    .expect("partitions");
    assert_eq!(unindexed, 0, "every partition has the aggregate index");
}

#[sqlx::test(migrations = false)]
async fn browse_indexes_build_on_a_plain_outbox_and_serve_every_list(pool: PgPool) {
    existing_install(&pool).await;
    append_pings(&pool, &["a".to_owned()]).await;
    indexes_serve_every_list(&pool).await;
}

#[sqlx::test(migrations = false)]
async fn an_event_in_full_its_payload_exact_and_capped(pool: PgPool) {
    let ids = append_pings(&pool, &(0..9).map(|i| format!("agg-{}", i % 3)).collect::<Vec<_>>()).await;
    let ops = Outbox::default_ref().ops();
    ops.create_browse_indexes(&pool).await.expect("indexes");
    // Event 4 (agg-1, the second of its aggregate) failed; 7 behind it.
    let big = r#"{"n": 123456789012345678901234567890, "s": "é€😀"}"#;
    sqlx::query(
        "UPDATE outbox SET status = 'failed', last_error = 'Broker: Message size too large', failed_at = now(), \
                payload = $2::json, headers = '{\"trace\": \"t-1\"}' WHERE event_id = $1",
    )
    .bind(ids[4])
    .bind(big)
    .execute(&pool)
    .await
    .expect("failed");
    let detail = ops.event(&pool, ids[4]).await.expect("event").expect("found");
    assert_eq!(detail.summary.state, EventState::Failed);
    assert_eq!(detail.summary.last_error.as_deref(), Some("Broker: Message size too large"));
    assert!(detail.failed_at.is_some());
    assert_eq!(detail.headers, serde_json::json!({"trace": "t-1"}));
    assert_eq!(detail.behind, 1, "event 7 of agg-1 waits behind it");
    assert_eq!(detail.payload_bytes, i64::try_from(big.len()).expect("len"));
    let neighbours: Vec<Uuid> = detail.neighbours.expect("indexed").iter().map(|e| e.event_id).collect();
    assert_eq!(neighbours, [ids[1], ids[7]], "its aggregate's others, in order");
    let json =
        serde_json::to_value(ops.event(&pool, ids[4]).await.expect("again").expect("found")).expect("json");
    assert!(
        !json.to_string().contains("PAYLOAD-MARKER") && !json.to_string().contains("1234567890"),
        "{json}"
    );
    // The payload as appended, big integer and all; cut at a character boundary.
    let whole = ops.event_payload(&pool, ids[4], 1 << 20).await.expect("payload").expect("found");
    assert_eq!((whole.text.as_str(), whole.truncated), (big, false));
    for cap in 0..big.len() {
        let cut = ops.event_payload(&pool, ids[4], cap).await.expect("payload").expect("found");
        assert!(cut.text.len() <= cap && big.starts_with(&cut.text) && cut.truncated, "cap {cap}: {cut:?}");
        assert!(cut.text.len() + 4 > cap, "cap {cap}: cut at the last boundary ({})", cut.text.len());
    }
    assert_eq!(ops.event(&pool, Uuid::new_v4()).await.expect("event"), None);
    assert_eq!(ops.event_payload(&pool, Uuid::new_v4(), 10).await.expect("payload"), None);
}

#[sqlx::test(migrations = false)]
async fn failures_group_by_cause_and_a_group_is_retried_exactly(pool: PgPool) {
    let ids = append_pings(&pool, &(0..8).map(|i| format!("agg-{i}")).collect::<Vec<_>>()).await;
    let errors = [
        (
            0,
            "orders",
            "Broker: Message size too large (1048577 bytes, event 6a1f3e0c-5d1e-4b53-9c1f-0c8b2a6e9d11)",
        ),
        (
            1,
            "orders",
            "Broker: Message size too large (2000000 bytes, event 7b2f3e0c-5d1e-4b53-9c1f-0c8b2a6e9d12)",
        ),
        (
            2,
            "invoices",
            "Broker: Message size too large (1048577 bytes, event 8c3f3e0c-5d1e-4b53-9c1f-0c8b2a6e9d13)",
        ),
        (3, "orders", "gave up after 5 attempts: Local: Message timed out"),
        (4, "orders", "gave up after 12 attempts: Local: Message timed out"),
        (
            5,
            "orders",
            "Broker: Message size too large (99 bytes, event 9d4f3e0c-5d1e-4b53-9c1f-0c8b2a6e9d14)",
        ),
    ];
    for (i, topic, error) in errors {
        sqlx::query("UPDATE outbox SET status = 'failed', topic = $2, last_error = $3, failed_at = now() WHERE event_id = $1")
            .bind(ids[i])
            .bind(topic)
            .bind(error)
            .execute(&pool)
            .await
            .expect("failed");
    }
    let ops = Outbox::default_ref().ops();
    let groups = ops.failure_groups(&pool).await.expect("groups");
    let shape: Vec<(&str, &str, i64)> =
        groups.iter().map(|g| (g.topic.as_str(), g.cause.as_str(), g.events)).collect();
    assert_eq!(
        shape,
        [
            ("orders", "Broker: Message size too large (<n> bytes, event <id>)", 3),
            ("orders", "gave up after <n> attempts: Local: Message timed out", 2),
            ("invoices", "Broker: Message size too large (<n> bytes, event <id>)", 1),
        ]
    );
    assert_eq!(groups[0].oldest_event_id, ids[0]);
    assert_eq!(groups[0].example_reason, errors[0].2);
    assert_eq!(groups[0].event_types, ["test.cli"]);
    // Event 6 fails with the same cause after the groups were read: acting on the group
    // takes what matches when the action starts, so it is in; event 2 (other topic) is not.
    sqlx::query("UPDATE outbox SET status = 'failed', topic = 'orders', last_error = $2 WHERE event_id = $1")
        .bind(ids[6])
        .bind("Broker: Message size too large (5 bytes, event 0a4f3e0c-5d1e-4b53-9c1f-0c8b2a6e9d15)")
        .execute(&pool)
        .await
        .expect("failed");
    let group = ActionFilter::default().topic(&groups[0].topic).cause(&groups[0].cause);
    let report = ops.retry_failed(&pool, &group, "alice", false).await.expect("retry");
    assert_eq!((report.matched, report.applied, report.skipped), (4, 4, 0));
    let failed = failed_ids(&pool).await;
    assert_eq!(failed, BTreeSet::from([ids[2], ids[3], ids[4]]));
    let filter: serde_json::Value = sqlx::query_scalar("SELECT filter FROM outbox_audit WHERE id = $1")
        .bind(report.audit_id.expect("audited"))
        .fetch_one(&pool)
        .await
        .expect("audit");
    assert_eq!(filter["cause"], groups[0].cause.as_str(), "the audit names the group: {filter}");
    // The audit page reads the same row, newest first, without a consumer.
    ops.discard_failed(&pool, &ActionFilter::default().topic("nowhere"), "none", "bob", false)
        .await
        .expect("discard");
    let page = ops.audit(&pool, None, 1).await.expect("audit page");
    assert_eq!((page.entries[0].actor.as_str(), page.entries[0].matched), ("bob", 0));
    let older = ops.audit(&pool, page.next, 10).await.expect("next page");
    let entry = &older.entries[0];
    assert_eq!(
        (entry.id, entry.actor.as_str(), entry.action.as_str()),
        (report.audit_id.expect("id"), "alice", "retry")
    );
    assert_eq!((entry.matched, entry.applied, entry.consumer.as_deref()), (4, 4, None));
    assert_eq!(entry.filter, filter);
    assert!(older.next.is_none());

    // By event id: the same bounded, audited path, exactly that event.
    let one = ActionFilter::default().event_id(ids[3]);
    let report = ops.retry_failed(&pool, &one, "carol", false).await.expect("retry by id");
    assert_eq!((report.matched, report.applied, report.first.clone()), (1, 1, vec![ids[3].to_string()]));
    let again = ops.retry_failed(&pool, &one, "carol", false).await.expect("twice");
    assert_eq!((again.matched, again.applied), (0, 0), "a second submit finds nothing left to do");
    let failed = failed_ids(&pool).await;
    assert_eq!(failed, BTreeSet::from([ids[2], ids[4]]));
    let audited = ops.audit(&pool, None, 2).await.expect("audit");
    assert_eq!(audited.entries[1].filter["ids"], serde_json::json!([ids[3].to_string()]));
    let wrong = ops.retry_failed(&pool, &ActionFilter::default().parked_id(1), "carol", false).await;
    assert!(matches!(&wrong, Err(Error::Config(m)) if m.contains("parked message ids")), "{wrong:?}");
}

#[sqlx::test(migrations = false)]
async fn the_overview_counts_up_to_its_cap(pool: PgPool) {
    append_pings(&pool, &(0..30).map(|i| format!("agg-{i}")).collect::<Vec<_>>()).await;
    sqlx::query(
        "UPDATE outbox SET status = CASE WHEN id % 3 = 0 THEN 'published' ELSE status END, \
                topic = CASE WHEN id % 2 = 0 THEN 'even' ELSE 'odd' END, \
                created_at = now() - interval '1 hour' * (id = (SELECT min(id) FROM outbox))::int",
    )
    .execute(&pool)
    .await
    .expect("states");
    sqlx::query("INSERT INTO outbox_relays VALUES ('00000000-0000-0000-0000-00000000000a', now())")
        .execute(&pool)
        .await
        .expect("relay");
    sqlx::query(
        "UPDATE outbox_leases SET owner = '00000000-0000-0000-0000-00000000000a', expires_at = now() + interval '1 minute' \
         WHERE work_partition < 3",
    )
    .execute(&pool)
    .await
    .expect("leases");
    let ops = Outbox::default_ref().ops();
    let wide = ops.overview(&pool, 1000).await.expect("overview");
    let count = |o: &outbox_runtime::ops::Overview, s: EventState| {
        let c = o.states.iter().find(|c| c.state == s).expect("state");
        (c.events.count, c.events.at_least, c.by_topic.values().sum::<i64>())
    };
    assert_eq!(count(&wide, EventState::Pending), (20, false, 20));
    assert_eq!(count(&wide, EventState::Published), (10, false, 10));
    assert_eq!(count(&wide, EventState::Failed), (0, false, 0));
    let age = wide.oldest_unpublished_age_seconds.expect("an age");
    assert!((3500.0..3700.0).contains(&age), "the oldest pending is an hour old: {age}");
    let holder = &wide.relays[0];
    assert_eq!(
        (holder.relay_id.map(|r| r.to_string()), holder.live_partitions),
        (Some("00000000-0000-0000-0000-00000000000a".to_owned()), 3)
    );
    assert!(holder.heartbeat_at.is_some());
    let narrow = ops.overview(&pool, 7).await.expect("overview");
    assert_eq!(count(&narrow, EventState::Pending), (7, true, 7), "at least 7: counting stopped at the cap");
    assert_eq!(count(&narrow, EventState::Published), (7, true, 7));
    assert_eq!(count(&narrow, EventState::Discarded), (0, false, 0));
}
