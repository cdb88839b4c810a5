//! The claim's walk of fresh rows from a cursor ([`FreshCursor`]): what it reads, and the
//! prefix rule against a seeded simulation.

use sqlx::PgPool;

use super::claim::Statements;
use super::cursor::FreshCursor;
use super::tests::rows_read;
use crate::outbox::Outbox;

/// Issue 24: a poison event (failed) holds back every later event of its aggregate, and
/// those stay in the index of fresh rows: every claim walked past all of them, 200,000
/// entries here, a cost that grows as long as nobody acts on the poison event. Now a claim
/// reads a window of them at most, and walks on from there: the 10 events of other
/// aggregates appended after them are claimed within one pass, and a claim from the middle
/// of the held rows reads O(batch) rows too.
#[sqlx::test(migrations = false)]
async fn rows_held_behind_a_poison_event_cost_a_claim_a_window_not_all_of_them(pool: PgPool) {
    const HELD: i64 = 200_000;
    const LIMIT: i64 = 500;
    let outbox = Outbox::default_ref();
    outbox.migrator().run(&pool).await.expect("migrate");
    sqlx::query(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload, \
                             status, attempts, last_error, failed_at) \
         VALUES (gen_random_uuid(), 'test', 'poison', 'test.ping', 1, 'test', '{}', 'failed', 1, 'too large', now())",
    )
    .execute(&pool)
    .await
    .expect("poison");
    sqlx::query(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload) \
         SELECT gen_random_uuid(), 'test', CASE WHEN g <= $1 THEN 'poison' ELSE 'other' || g END, 'test.ping', 1, \
                'test', '{}' \
         FROM generate_series(1, $1 + 10) AS g",
    )
    .bind(HELD)
    .execute(&pool)
    .await
    .expect("held and other rows");
    sqlx::query("ANALYZE outbox").execute(&pool).await.expect("analyze");
    let sql = Statements::new(outbox.names());
    let partitions: Vec<i32> = (0..32).collect();
    let window = FreshCursor::window(LIMIT);
    // The window (4 batches) read twice at most, and a probe or two per row of it.
    let bound = 24 * LIMIT as u64;
    for from in [0, HELD / 2] {
        let plans = sql.explain_claim_from(&pool, &partitions, LIMIT, from).await.expect("explain claim");
        let read: Vec<_> = plans.iter().flat_map(|plan| rows_read(plan, "outbox")).collect();
        let total: u64 = read.iter().map(|(_, _, n)| n).sum();
        assert!(
            read.iter().all(|(node, _, _)| node.starts_with("Index")) && total <= bound,
            "from {from}: a claim reads {total} rows of outbox: {read:?}"
        );
    }
    let mut cursor = FreshCursor::default();
    let mut claimed = Vec::new();
    let mut claims = 0;
    let most = HELD / window + 3;
    while claimed.len() < 10 && claims < most {
        let rows = sql.claim_from(&pool, &partitions, LIMIT, &[], &mut cursor).await.expect("claim");
        claims += 1;
        assert!(rows.iter().all(|r| r.aggregate_id != "poison"), "a held row was claimed: {cursor:?}");
        claimed.extend(rows.into_iter().map(|r| r.aggregate_id));
        if !cursor.advancing && claimed.len() < 10 {
            assert!(claims > 1, "the first claim walks on past the window of held rows: {cursor:?}");
        }
    }
    assert_eq!(claimed.len(), 10, "after {claims} claims (at most {most}): {claimed:?}");
}

/// The claim's prefix rule against a seeded simulation of what happens to an outbox:
/// appends, including rows that commit after later ids were walked past (ids are taken at
/// insert; the caller holds its aggregate meanwhile), sends that publish, wait for a retry
/// or fail, operators putting failed rows up again and replaying published ones (fresh,
/// with their old ids), and a relay whose partitions change. After every claim, no claimed
/// row has an earlier open row of its aggregate outside the batch, and each aggregate's
/// rows are first published in id order. A failing seed is printed; OUTBOX_SEED runs one.
/// Seen failing (every run of 8 seeds) without either probe the cursor needs: an open
/// row before the cursor for the fresh walk, an earlier fresh row the walk left out for
/// the due one.
#[sqlx::test(migrations = false)]
async fn claims_from_a_cursor_keep_every_aggregate_in_order_seeded(pool: PgPool) {
    const LIMIT: i64 = 4;
    let outbox = Outbox::default_ref();
    outbox.migrator().run(&pool).await.expect("migrate");
    let sql = Statements::new(outbox.names());
    let seeds: Vec<u64> = match std::env::var("OUTBOX_SEED") {
        Ok(seed) => vec![seed.parse().expect("OUTBOX_SEED")],
        Err(_) => (0..8).map(|_| fastrand::u64(..)).collect(),
    };
    for seed in seeds {
        eprintln!("seed {seed}");
        sqlx::query("TRUNCATE outbox RESTART IDENTITY").execute(&pool).await.expect("truncate");
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut cursor = FreshCursor::default();
        let mut held: Vec<i32> = (0..32).collect();
        let mut published: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
        let mut first = std::collections::BTreeSet::new();
        // Ids taken by a transaction that has not committed yet: appended later.
        let mut late: Vec<(i64, String)> = Vec::new();
        let mut walked_on = 0;
        for step in 0..600 {
            match rng.u8(..10) {
                0..=2 => {
                    // An append of a few rows, some of whose ids commit later.
                    for _ in 0..rng.usize(1..=20) {
                        // A caller holding its aggregate's lock: nothing else of it is
                        // appended until its own append commits.
                        let aggregate = format!("agg{}", rng.u8(..6));
                        if late.iter().any(|(_, a)| *a == aggregate) {
                            continue;
                        }
                        let id: i64 =
                            sqlx::query_scalar("SELECT nextval(pg_get_serial_sequence('outbox', 'id'))")
                                .fetch_one(&pool)
                                .await
                                .expect("id");
                        if rng.u8(..8) == 0 {
                            late.push((id, aggregate));
                        } else {
                            insert_with_id(&pool, id, &aggregate).await;
                        }
                    }
                }
                3 if !late.is_empty() => {
                    let (id, aggregate) = late.swap_remove(rng.usize(..late.len()));
                    insert_with_id(&pool, id, &aggregate).await;
                }
                4 if rng.bool() => {
                    // An operator replays a published row: pending again, fresh, its old id.
                    sqlx::query(
                        "UPDATE outbox SET status = 'pending', next_attempt_at = '-infinity', last_error = NULL \
                         WHERE id = (SELECT id FROM outbox WHERE status = 'published' ORDER BY random() LIMIT 1)",
                    )
                    .execute(&pool)
                    .await
                    .expect("replay");
                }
                4 => {
                    // An operator puts a failed row up again, or every waiting row is due.
                    sqlx::query(
                        "UPDATE outbox SET status = 'pending', next_attempt_at = '-infinity' \
                         WHERE id = (SELECT id FROM outbox WHERE status = 'failed' ORDER BY random() LIMIT 1)",
                    )
                    .execute(&pool)
                    .await
                    .expect("retry");
                    sqlx::query("UPDATE outbox SET next_attempt_at = now() - interval '1 second' WHERE status = 'pending' AND next_attempt_at > now()")
                        .execute(&pool)
                        .await
                        .expect("due");
                }
                5 => {
                    // The relay's partitions change (the loop starts its walk again).
                    held = (0..32).filter(|_| rng.bool()).collect();
                    cursor = FreshCursor::default();
                }
                _ => {
                    let rows = sql.claim_from(&pool, &held, LIMIT, &[], &mut cursor).await.expect("claim");
                    if cursor.advancing {
                        walked_on += 1;
                    }
                    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                    let overtaking: Vec<(i64, i64)> = sqlx::query_as(
                        "SELECT o.id, p.id FROM outbox o JOIN outbox p \
                           ON p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id \
                         WHERE o.id = ANY($1) AND p.id < o.id AND p.status IN ('pending', 'failed') \
                           AND p.id <> ALL($1)",
                    )
                    .bind(&ids)
                    .fetch_all(&pool)
                    .await
                    .expect("check");
                    assert!(
                        overtaking.is_empty(),
                        "seed {seed}, step {step}: claimed past an earlier open row (claimed, earlier): \
                         {overtaking:?}, cursor {cursor:?}"
                    );
                    // Sends: in each aggregate, published up to the first that waits or fails;
                    // the rest of it stays pending, behind that one.
                    let mut stopped = std::collections::BTreeSet::new();
                    for row in &rows {
                        if stopped.contains(&row.aggregate_id) {
                            continue;
                        }
                        let outcome = rng.u8(..10);
                        let statement = match outcome {
                            0 => "UPDATE outbox SET status = 'failed', failed_at = now(), attempts = attempts + 1 WHERE id = $1",
                            1 | 2 => "UPDATE outbox SET next_attempt_at = now() + interval '1 hour', attempts = attempts + 1 WHERE id = $1",
                            _ => "UPDATE outbox SET status = 'published', published_at = now(), attempts = attempts + 1 WHERE id = $1",
                        };
                        sqlx::query(statement).bind(row.id).execute(&pool).await.expect("mark");
                        if outcome < 3 {
                            stopped.insert(row.aggregate_id.clone());
                        } else if first.insert(row.id) {
                            // First publications only: a replay sends an old event again.
                            published.entry(row.aggregate_id.clone()).or_default().push(row.id);
                        }
                    }
                }
            }
        }
        for (aggregate, ids) in &published {
            assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "seed {seed}: {aggregate} published out of order: {ids:?}"
            );
        }
        eprintln!(
            "seed {seed}: {} published, {walked_on} claims walked on",
            published.values().map(Vec::len).sum::<usize>()
        );
    }
}

async fn insert_with_id(pool: &PgPool, id: i64, aggregate: &str) {
    sqlx::query(
        "INSERT INTO outbox (id, event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload) \
         OVERRIDING SYSTEM VALUE VALUES ($1, gen_random_uuid(), 'test', $2, 'test.ping', 1, 'test', '{}')",
    )
    .bind(id)
    .bind(aggregate)
    .execute(pool)
    .await
    .expect("append");
}

/// The relay that holds locks across the send locks partitions at random each time, so
/// it cannot walk on from a cursor: its claim reads the whole walk of fresh rows, as
/// before the window. Found in review: with the window, 100 rows held behind a poison
/// event filled it on every claim and the event of another aggregate after them was
/// never claimed.
#[sqlx::test(migrations = false)]
async fn the_locking_claim_reaches_rows_past_a_window_of_held_ones(pool: PgPool) {
    let outbox = Outbox::default_ref();
    outbox.migrator().run(&pool).await.expect("migrate");
    sqlx::query(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload, \
                             status, attempts, last_error, failed_at) \
         VALUES (gen_random_uuid(), 'test', 'poison', 'test.ping', 1, 'test', '{}', 'failed', 1, 'too large', now())",
    )
    .execute(&pool)
    .await
    .expect("poison");
    sqlx::query(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload) \
         SELECT gen_random_uuid(), 'test', CASE WHEN g <= 100 THEN 'poison' ELSE 'other' END, 'test.ping', 1, \
                'test', '{}' \
         FROM generate_series(1, 101) AS g",
    )
    .execute(&pool)
    .await
    .expect("held and other rows");
    let sql = Statements::new(outbox.names());
    let mut tx = pool.begin().await.expect("begin");
    let (_, rows) = sql.claim_locked(&mut tx, 32, 10).await.expect("claim");
    tx.rollback().await.expect("rollback");
    let claimed: Vec<&str> = rows.iter().map(|r| r.aggregate_id.as_str()).collect();
    assert_eq!(claimed, ["other"]);
}
