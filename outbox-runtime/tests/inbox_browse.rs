//! Browsing one consumer's inbox (`InboxAdmin`): applied records in keyset pages newest
//! first, checked against the table read whole (generated rows with many ties on the time,
//! generated queries, seed printed); parked messages a page at a time, with keys that are
//! not UTF-8; parked messages grouped by cause and a retry of exactly one group; the audit
//! of that action, of this consumer only.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_runtime::inbox::{ActionFilter, AppliedQuery, AppliedRecord, InboxAdmin, ParkedQuery};
use sqlx::PgPool;
use uuid::Uuid;

mod common;

use common::{billing_inbox, near, park, Parked};

const OUTCOMES: [&str; 3] = ["applied", "stale", "discarded"];
const TYPES: [&str; 2] = ["order.placed", "order.paid"];
const AGGREGATES: [&str; 5] = ["o-1", "o-2", "o-3", "o-4", "o-5"];
/// The applied times rows are given: few, so that many rows share one (rows applied in one
/// transaction share `now()`).
const BASE_SECONDS: i64 = 1_800_000_000;

/// `n` records of `consumer`, times drawn from 8 instants (some a microsecond apart).
async fn random_records(pool: &PgPool, consumer: &str, n: usize, rng: &mut fastrand::Rng) {
    for i in 0..n {
        let micros = BASE_SECONDS * 1_000_000
            + [0, 1, 2, 1_000_000, 1_000_001, 7_000_000, 7_000_001, 9_999_999][rng.usize(0..8)];
        sqlx::query(
            "INSERT INTO inbox (consumer, event_id, event_type, schema_version, topic, kafka_partition, kafka_offset, \
                                outcome, applied_at, bucket, aggregate_type, aggregate_id) \
             VALUES ($1, $2, $6, 1, 'orders', 0, $3, $4, to_timestamp(0) + $5 * interval '1 microsecond', \
                     inbox_bucket($2), 'order', $7)",
        )
        .bind(consumer)
        .bind(Uuid::from_u128(rng.u128(..)))
        .bind(i64::try_from(i).expect("i"))
        .bind(OUTCOMES[rng.usize(0..OUTCOMES.len())])
        .bind(micros)
        .bind(TYPES[rng.usize(0..TYPES.len())])
        .bind(AGGREGATES[rng.usize(0..AGGREGATES.len())])
        .execute(pool)
        .await
        .expect("record");
    }
}

/// `(micros, event id, outcome, event type, aggregate id)` of `consumer`'s records, newest
/// first, as PostgreSQL orders them.
async fn truth(pool: &PgPool, consumer: &str) -> Vec<(i64, Uuid, String, String, String)> {
    sqlx::query_as(
        "SELECT (extract(epoch FROM applied_at) * 1000000)::bigint, event_id, outcome, event_type, aggregate_id FROM inbox \
         WHERE consumer = $1 ORDER BY applied_at DESC, event_id DESC",
    )
    .bind(consumer)
    .fetch_all(pool)
    .await
    .expect("truth")
}

async fn walk(admin: &InboxAdmin, query: &AppliedQuery) -> Vec<AppliedRecord> {
    let mut all = Vec::new();
    let mut query = query.clone();
    for _ in 0..1_000 {
        let page = admin.applied(&query).await.expect("page");
        assert!(page.records.len() <= query.limit as usize);
        all.extend(page.records);
        match page.next {
            Some(next) => query = query.before(next),
            None => return all,
        }
    }
    panic!("more than 1,000 pages");
}

fn at(micros: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(u64::try_from(micros).expect("after the epoch"))
}

#[sqlx::test(migrations = false)]
async fn applied_records_page_newest_first_like_the_table_read_whole(pool: PgPool) {
    let seed = std::env::var("OUTBOX_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("inbox browse: OUTBOX_TEST_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    billing_inbox(&pool).await;
    random_records(&pool, "billing", 240, &mut rng).await;
    random_records(&pool, "shipping", 40, &mut rng).await;
    let admin = InboxAdmin::new(pool.clone(), "public", "inbox", "billing").expect("admin");
    let rows = truth(&pool, "billing").await;
    let instants: Vec<i64> = rows.iter().map(|r| r.0).collect();
    // By aggregate or type only with the browse indexes: refused by name, then built on
    // every partition of the dedup table, once.
    for (query, index) in [
        (AppliedQuery::default().aggregate_id("o-1"), "inbox_browse_agg"),
        (AppliedQuery::default().event_type("order.paid"), "inbox_browse_type"),
    ] {
        let err = admin.applied(&query).await.expect_err("refused").to_string();
        assert!(err.contains(index) && err.contains("create_browse_indexes"), "{err}");
    }
    assert_eq!(
        admin.create_browse_indexes().await.expect("built"),
        ["inbox_browse_agg", "inbox_browse_type"]
    );
    assert!(admin.create_browse_indexes().await.expect("again").is_empty(), "idempotent");
    assert!(admin.missing_browse_indexes().await.expect("missing").is_empty());
    let unindexed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_partition_tree('inbox') t WHERE t.isleaf AND NOT EXISTS ( \
             SELECT 1 FROM pg_index i JOIN pg_inherits h ON h.inhrelid = i.indexrelid \
             WHERE i.indrelid = t.relid AND h.inhparent = 'inbox_browse_agg'::regclass)",
    )
    .fetch_one(&pool)
    .await
    .expect("partitions");
    let partitions: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_partition_tree('inbox') WHERE isleaf")
        .fetch_one(&pool)
        .await
        .expect("partitions");
    assert!(partitions > 1 && unindexed == 0, "{unindexed} of {partitions} partitions without the index");
    for round in 0..40 {
        let mut query = AppliedQuery::default().limit(rng.u32(1..30));
        if rng.bool() {
            query = query.outcome(OUTCOMES[rng.usize(0..3)]);
        }
        if rng.u8(0..4) == 0 {
            let instant = at(instants[rng.usize(0..instants.len())]);
            query = query.since(near(&mut rng, instant));
        }
        if rng.u8(0..4) == 0 {
            let instant = at(instants[rng.usize(0..instants.len())] + 1);
            query = query.until(near(&mut rng, instant));
        }
        if rng.u8(0..8) == 0 {
            query = query.event_id(rows[rng.usize(0..rows.len())].1);
        }
        if rng.u8(0..3) == 0 {
            query = query.aggregate_id(AGGREGATES[rng.usize(0..AGGREGATES.len())]);
        }
        if rng.u8(0..3) == 0 {
            query = query.event_type(TYPES[rng.usize(0..TYPES.len())]);
        }
        let expected: Vec<Uuid> = rows
            .iter()
            .filter(|(micros, id, outcome, event_type, aggregate_id)| {
                query.outcome.as_ref().is_none_or(|o| o == outcome)
                    && query.event_id.is_none_or(|e| e == *id)
                    && query.aggregate_id.as_ref().is_none_or(|a| a == aggregate_id)
                    && query.event_type.as_ref().is_none_or(|t| t == event_type)
                    && query.since.is_none_or(|s| at(*micros) >= s)
                    && query.until.is_none_or(|u| at(*micros) < u)
            })
            .map(|r| r.1)
            .collect();
        if matches!((query.since, query.until), (Some(s), Some(u)) if u <= s) {
            assert!(admin.applied(&query).await.is_err(), "until not after since is refused");
            continue;
        }
        let got: Vec<Uuid> = walk(&admin, &query).await.iter().map(|r| r.event_id).collect();
        assert_eq!(got, expected, "round {round}, seed {seed}: {query:?}");
    }
    let shipping = InboxAdmin::new(pool.clone(), "public", "inbox", "shipping").expect("admin");
    assert_eq!(walk(&shipping, &AppliedQuery::default().limit(500)).await.len(), 40, "one consumer's only");
    let cursor =
        admin.applied(&AppliedQuery::default().limit(3)).await.expect("page").next.expect("a next page");
    assert_eq!(cursor.to_string().parse::<outbox_runtime::inbox::AppliedCursor>().expect("parses"), cursor);
    for bad in ["", "12", "x~y", "12~not-a-uuid"] {
        let err = bad.parse::<outbox_runtime::inbox::AppliedCursor>().expect_err(bad).to_string();
        assert!(err.contains(&format!("{bad:?}")), "names the cursor: {err}");
    }
    for query in [
        AppliedQuery::default().limit(0),
        AppliedQuery::default().limit(501),
        AppliedQuery::default().outcome("done"),
    ] {
        assert!(matches!(admin.applied(&query).await, Err(outbox_runtime::Error::Config(_))), "{query:?}");
    }
}

#[sqlx::test(migrations = false)]
async fn parked_messages_page_group_by_cause_and_a_group_retry_is_audited(pool: PgPool) {
    billing_inbox(&pool).await;
    let rows: Vec<Parked<'_>> = (0..7)
        .map(|i| Parked {
            partition: 0,
            offset: i,
            key: ["k1", "k2", "k3", "k4", "k5", "k6", "k7"][usize::try_from(i).expect("i")],
            event_type: if i % 2 == 0 { "invoice.issued" } else { "order.placed" },
            version: 1,
            status: "parked",
            reason: if i < 4 {
                "handler failed: ledger 17 closed for offset 9"
            } else {
                "no handler for event type <script>alert(1)</script> version 2"
            },
        })
        .collect();
    park(&pool, &rows).await;
    sqlx::query("UPDATE inbox_parked SET record_key = '\\xff00fe'::bytea, reason = 'handler failed: ledger 4 closed for offset 123' WHERE id = 2")
        .execute(&pool)
        .await
        .expect("a key that is not UTF-8");
    let admin = InboxAdmin::new(pool.clone(), "public", "inbox", "billing").expect("admin");

    let first = admin.parked_page(&ParkedQuery::default().limit(3)).await.expect("page");
    assert_eq!(first.messages.iter().map(|m| m.id).collect::<Vec<_>>(), [7, 6, 5]);
    let second = admin.parked_page(&ParkedQuery::default().limit(3).before(first.next)).await.expect("page");
    assert_eq!(second.messages.iter().map(|m| m.id).collect::<Vec<_>>(), [4, 3, 2]);
    assert_eq!(second.messages[2].record_key.as_deref(), Some("0xff00fe"));
    assert_eq!(second.messages[1].record_key.as_deref(), Some("k3"));
    assert_eq!(second.messages[0].payload_bytes, "PAYLOAD-MARKER".len() as i32);
    let typed = admin.parked_page(&ParkedQuery::default().event_type("order.placed")).await.expect("page");
    assert_eq!(typed.messages.iter().map(|m| m.id).collect::<Vec<_>>(), [6, 4, 2]);
    assert!(admin.parked_page(&ParkedQuery::default().status("stuck")).await.is_err());
    let (one, headers) = admin.parked_message(2).await.expect("read").expect("message 2");
    assert_eq!((one.id, headers), (2, serde_json::json!({})));
    assert!(admin.parked_message(99).await.expect("read").is_none());
    assert!(!format!("{first:?}{second:?}").contains("PAYLOAD-MARKER"), "a page never carries the payload");

    let groups = admin.parked_groups().await.expect("groups");
    let summary: Vec<(&str, i64, i64)> =
        groups.iter().map(|g| (g.cause.as_str(), g.messages, g.oldest_id)).collect();
    assert_eq!(
        summary,
        [
            ("handler failed: ledger <n> closed for offset <n>", 4, 1),
            ("no handler for event type <script>alert(<n>)</script> version <n>", 3, 5),
        ]
    );
    assert_eq!(groups[0].event_types, ["invoice.issued", "order.placed"]);
    assert_eq!(groups[0].example_reason, "handler failed: ledger 17 closed for offset 9");

    // Another consumer's message of the same topic and cause is never taken.
    sqlx::query(
        "INSERT INTO inbox_parked (consumer, topic, kafka_partition, kafka_offset, record_key, headers, payload, status, reason) \
         VALUES ('shipping', 'orders', 0, 1, 'k1', '{}', 'x', 'parked', 'handler failed: ledger 1 closed for offset 2')",
    )
    .execute(&pool)
    .await
    .expect("other consumer");
    let filter = ActionFilter::default().topic(groups[0].topic.clone()).cause(groups[0].cause.clone());
    let report = admin.retry_matching(&filter, "ops@example", false).await.expect("retry");
    assert_eq!((report.matched, report.applied), (4, 4));
    let requested: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM inbox_parked WHERE retry_requested_at IS NOT NULL ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("requested");
    assert_eq!(requested, [1, 2, 3, 4]);

    let audit = admin.audit(None, 10).await.expect("audit");
    assert_eq!(audit.entries.len(), 1);
    let entry = &audit.entries[0];
    assert_eq!(
        (
            entry.consumer.as_deref(),
            entry.actor.as_str(),
            entry.action.as_str(),
            entry.matched,
            entry.applied
        ),
        (Some("billing"), "ops@example", "retry", 4, 4)
    );
    assert_eq!(entry.filter["cause"], groups[0].cause.as_str());
    assert_eq!(Some(entry.id), report.audit_id);
    let shipping = InboxAdmin::new(pool.clone(), "public", "inbox", "shipping").expect("admin");
    assert!(shipping.audit(None, 10).await.expect("audit").entries.is_empty(), "one consumer's only");
    assert!(admin.audit(None, 0).await.is_err());

    // By parked id: exactly that message, audited with its id.
    let report = admin
        .retry_matching(&ActionFilter::default().parked_id(6), "ops@example", false)
        .await
        .expect("by id");
    assert_eq!((report.matched, report.applied, report.first.clone()), (1, 1, vec!["6".to_owned()]));
    let entry = &admin.audit(None, 1).await.expect("audit").entries[0];
    assert_eq!(entry.filter["ids"], serde_json::json!([6]));
    let wrong = admin.retry_matching(&ActionFilter::default().event_id(Uuid::nil()), "ops", false).await;
    assert!(matches!(&wrong, Err(outbox_runtime::Error::Config(m)) if m.contains("event ids")), "{wrong:?}");
}

/// Rows of the parked table the database says it read (its statistics).
async fn parked_rows_read(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT (coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0))::bigint FROM pg_stat_user_tables \
         WHERE relid = 'inbox_parked'::regclass",
    )
    .fetch_one(pool)
    .await
    .expect("statistics")
}

#[sqlx::test(migrations = false)]
async fn parked_groups_under_a_cap_read_the_newest_parked_only(pool: PgPool) {
    billing_inbox(&pool).await;
    // Connections of their own: what the test writes and reads before measuring goes
    // through `setup`, closed (a connection reports its statistics as it exits; one left
    // open can report them seconds later, inside the measurement), the measured call
    // through `one`.
    let connect = || async {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_with((*pool.connect_options()).clone())
            .await
            .expect("one connection")
    };
    let (setup, one) = (connect().await, connect().await);
    // An incident: 1,400 older messages parked of one cause, the 200 newest of another,
    // and 10,000 of another consumer in between.
    sqlx::query(
        "INSERT INTO inbox_parked (consumer, topic, kafka_partition, kafka_offset, record_key, headers, payload, status, reason) \
         SELECT CASE WHEN n BETWEEN 1401 AND 11400 THEN 'shipping' ELSE 'billing' END, 'orders', 0, n, 'k', '{}', 'x', 'parked', \
                CASE WHEN n > 11400 THEN 'handler failed: ledger ' || n || ' closed' ELSE 'no handler for version ' || n END \
         FROM generate_series(1, 11600) AS n",
    )
    .execute(&setup)
    .await
    .expect("parked");
    sqlx::query("VACUUM ANALYZE inbox_parked").execute(&setup).await.expect("analyze");
    let shape = |groups: &[outbox_runtime::inbox::ParkedGroup]| -> Vec<(String, i64, bool)> {
        groups.iter().map(|g| (g.cause.clone(), g.messages, g.at_least)).collect()
    };
    let admin = |pool: &PgPool| InboxAdmin::new(pool.clone(), "public", "inbox", "billing").expect("admin");
    let all = admin(&setup).parked_groups().await.expect("groups");
    assert_eq!(
        shape(&all),
        [
            ("no handler for version <n>".to_owned(), 1400, false),
            ("handler failed: ledger <n> closed".to_owned(), 200, false)
        ]
    );
    let under = admin(&setup).parked_groups_capped(1600).await.expect("under the cap");
    assert_eq!(shape(&under), shape(&all), "under its cap, every parked message counts");
    setup.close().await;
    let mut before = parked_rows_read(&pool).await;
    for settled in 0.. {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = parked_rows_read(&pool).await;
        if now == before && now > 0 {
            break;
        }
        assert!(settled < 50, "the statistics did not settle");
        before = now;
    }
    let capped = admin(&one).parked_groups_capped(300).await.expect("capped");
    sqlx::query("SELECT pg_stat_force_next_flush()").execute(&one).await.expect("flush");
    let mut reads = 0;
    for _ in 0..200 {
        reads = parked_rows_read(&pool).await - before;
        if reads > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "parked groups capped at 300 of 1,600 parked (and 10,000 of another consumer): {reads} rows read"
    );
    // The newest 301 of billing's: all 200 of the new cause, 101 of the old.
    assert_eq!(
        shape(&capped),
        [
            ("handler failed: ledger <n> closed".to_owned(), 200, true),
            ("no handler for version <n>".to_owned(), 101, true)
        ]
    );
    // 301 through the consumer's index of its newest parked (inbox migration 8), and the
    // two groups' oldest read by id, never walking the primary key past the other
    // consumer's 10,000.
    assert!((301..=301 + 10).contains(&reads), "read {reads} rows for groups capped at 300");
}

/// A value of one kind that a reason may carry from a payload, drawn at random.
fn value_of(kind: usize, rng: &mut fastrand::Rng) -> String {
    // `n` letters and digits, `n` drawn from `lengths`.
    let word = |rng: &mut fastrand::Rng, lengths: std::ops::Range<usize>| -> String {
        let n = rng.usize(lengths);
        (0..n).map(|_| rng.alphanumeric()).collect()
    };
    match kind {
        // An e-mail address, bare.
        0 => format!("{}.{}@{}.example.com", word(rng, 6..7), rng.u32(..), word(rng, 5..6)),
        // A string as serde quotes it, escapes included.
        1 => format!("\"{}\\\" {}@x.org\"", word(rng, 0..12), word(rng, 4..5)),
        // A customer id with a long hex run.
        2 => format!("C-{:x}{:012x}", rng.u8(10..16), rng.u64(..) >> 16),
        // A UUID.
        3 => Uuid::from_u128(rng.u128(..)).to_string(),
        // A token in base64 (some padded), letters and digits.
        4 => {
            let mut token = format!("{}{}", word(rng, 18..40), rng.u32(..));
            token.push_str(["", "=", "=="][rng.usize(0..3)]);
            token
        }
        // A variant name as serde quotes it.
        5 => format!("`{}`", word(rng, 6..12)),
        // A number.
        _ => rng.u32(..).to_string(),
    }
}

/// Reasons of one cause whose values come from payloads (e-mail addresses, quoted strings,
/// customer ids, UUIDs, tokens, variant names, numbers) group as one cause, and no group's
/// key carries any of those values. Before, only digits and UUIDs were left out: four
/// reasons of one cause made four groups (`C-<n>a<n>ecc<n>ff...`,
/// `someone<n>@example.com`), each showing a customer's data.
#[sqlx::test(migrations = false)]
async fn parked_groups_take_a_cause_without_its_values(pool: PgPool) {
    let seed = std::env::var("OUTBOX_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_nanos() as u64);
    eprintln!("parked groups: OUTBOX_TEST_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    billing_inbox(&pool).await;
    // Each cause with two values of its kinds; the last, fixed text with nothing to leave out.
    let causes: [(&str, usize, usize); 8] = [
        ("invalid type: string {}, expected u64 at line {} column {}", 1, 6),
        ("customer {} not found (attempt {})", 0, 6),
        ("customer {} is blocked by {}", 2, 3),
        ("unknown variant {}, expected one of `Card`, `Iban` for {}", 5, 0),
        ("payment token {} rejected for order {}", 4, 3),
        ("handler failed: {} owes {}", 0, 4),
        ("handler failed: ledger closed", 6, 6),
        // Names with digits and dashes are the cause's own, not a token; a hex run after `_`
        // is a value.
        ("ledger_{} closed in orders-v2-eu-west-1-prod after {}", 2, 6),
    ];
    let mut values = Vec::new();
    let mut rows = Vec::new();
    for (c, (template, first, second)) in causes.iter().enumerate() {
        for i in 0..5 {
            let (a, b) = (value_of(*first, &mut rng), value_of(*second, &mut rng));
            let mut reason = template.replacen("{}", &a, 1).replacen("{}", &b, 1);
            if reason.contains("{}") {
                reason = reason.replacen("{}", &rng.u16(..).to_string(), 1);
            }
            if template.contains("{}") {
                values.extend([a, b]);
            }
            rows.push((c * 10 + i, format!("k{c}-{i}"), reason));
        }
    }
    let parked: Vec<Parked<'_>> = rows
        .iter()
        .map(|(i, key, reason)| Parked {
            partition: 0,
            offset: i64::try_from(*i).expect("offset"),
            key,
            event_type: "order.placed",
            version: 1,
            status: "parked",
            reason,
        })
        .collect();
    park(&pool, &parked).await;
    let admin = InboxAdmin::new(pool.clone(), "public", "inbox", "billing").expect("admin");
    let groups = admin.parked_groups().await.expect("groups");
    let summary: Vec<(&str, i64)> = groups.iter().map(|g| (g.cause.as_str(), g.messages)).collect();
    assert_eq!(groups.len(), causes.len(), "seed {seed}: one group per cause: {summary:#?}");
    assert!(groups.iter().all(|g| g.messages == 5), "seed {seed}: {summary:#?}");
    for group in &groups {
        for value in &values {
            // A value's own text, quotes and backticks aside (the cause keeps its own).
            let bare = value.trim_matches(|c| c == '"' || c == '`');
            assert!(
                !group.cause.contains(bare),
                "seed {seed}: the cause {:?} carries {value:?}",
                group.cause
            );
        }
    }
    let causes_seen: Vec<&str> = groups.iter().map(|g| g.cause.as_str()).collect();
    for expected in [
        "invalid type: string <s>, expected u<n> at line <n> column <n>",
        "customer <email> not found (attempt <n>)",
        "customer C-<hex> is blocked by <id>",
        "unknown variant <s>, expected one of <s>, <s> for <email>",
        "payment token <token> rejected for order <id>",
        "handler failed: <email> owes <token>",
        "handler failed: ledger closed",
        "ledger_C-<hex> closed in orders-v<n>-eu-west-<n>-prod after <n>",
    ] {
        assert!(causes_seen.contains(&expected), "seed {seed}: {expected:?} in {causes_seen:#?}");
    }
    // A group is acted on by its cause: the same expression filters as grouped.
    let report = admin
        .retry_matching(
            &ActionFilter::default().cause("customer <email> not found (attempt <n>)"),
            "test",
            true,
        )
        .await
        .expect("dry run");
    assert_eq!(report.matched, 5, "seed {seed}");
}
