//! The inbox applying the records waiting for a worker in batches, one transaction each: a
//! poison or panicking record in a batch parks alone, and batches come to the outcomes
//! that records applied one by one come to.

use std::time::Duration;

use outbox_runtime::inbox::{EventHandler, HandlerError, Meta};
use outbox_tests::inbox_kit::effects::{applied_amounts, credit_headers, setup, start_with, Ledger};
use outbox_tests::raw::RawRecord;
use outbox_tests::{eventually, Credit};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// Credits, except two accounts: "poison" fails permanently, "panics" panics.
#[derive(Clone, Default)]
struct Picky;

impl EventHandler<Credit> for Picky {
    async fn handle(&self, tx: &mut PgConnection, credit: Credit, meta: &Meta) -> Result<(), HandlerError> {
        match credit.account.as_str() {
            "poison" => return Err(HandlerError::permanent("this credit is poison")),
            "panics" => panic!("the handler panicked on purpose"),
            _ => {}
        }
        Ledger::default().handle(tx, credit, meta).await
    }
}

/// Transactions the inbox rows of `consumer` were written in.
async fn inbox_transactions(pool: &PgPool, consumer: &str) -> i64 {
    sqlx::query_scalar("SELECT count(DISTINCT xmin::text) FROM inbox WHERE consumer = $1")
        .bind(consumer)
        .fetch_one(pool)
        .await
        .expect("transactions")
}

/// Records waiting for a worker are applied in batches, one transaction each; a poison
/// record and a panicking one in the middle of a batch roll it back and then park alone,
/// while every other record applies exactly once and the offsets pass them all. With
/// `batch_size(1)` the same records take one transaction each: the count can tell.
#[sqlx::test(migrations = false)]
async fn a_batch_applies_in_one_transaction_and_a_poison_record_in_it_parks_alone(pool: PgPool) {
    let s = setup(&pool, 1).await;
    let mut expected = Vec::new();
    for amount in 1..=120 {
        let account = match amount {
            30 => "poison".to_owned(),
            75 => "panics".to_owned(),
            _ => {
                expected.push(amount);
                format!("acct-{}", amount % 7)
            }
        };
        s.credit(0, &account, amount);
    }
    s.producer.flush();
    let mut transactions = Vec::new();
    for (consumer, batch) in [("batched", 100), ("unbatched", 1)] {
        sqlx::query("TRUNCATE effects").execute(&pool).await.expect("truncate");
        let running = start_with(&pool, s.config(consumer).batch_size(batch), Picky).await;
        let stats = running.stats.clone();
        let settled =
            eventually(Duration::from_secs(30), || async { stats.applied() + stats.parked() == 120 }).await;
        running.shutdown().await;
        assert!(settled, "{consumer}: applied {} parked {}", stats.applied(), stats.parked());
        assert_eq!(applied_amounts(&pool).await, expected, "{consumer}: every other credit applied once");
        let parked: Vec<(i64, String, String)> = sqlx::query_as(
            "SELECT kafka_offset, status, reason FROM inbox_parked WHERE consumer = $1 ORDER BY kafka_offset",
        )
        .bind(consumer)
        .fetch_all(&pool)
        .await
        .expect("parked");
        assert_eq!(parked.len(), 2, "{consumer}: {parked:?}");
        assert_eq!((parked[0].0, parked[0].1.as_str()), (29, "parked"));
        assert!(parked[0].2.contains("this credit is poison"), "{}", parked[0].2);
        assert_eq!((parked[1].0, parked[1].1.as_str()), (74, "parked"));
        assert!(parked[1].2.contains("panicked on purpose"), "{}", parked[1].2);
        assert_eq!(
            s.kafka.committed(consumer, &s.topic, 1),
            vec![120],
            "{consumer}: offsets pass every record"
        );
        transactions.push(inbox_transactions(&pool, consumer).await);
    }
    eprintln!(
        "transactions for 118 applied records: batched {}, unbatched {}",
        transactions[0], transactions[1]
    );
    assert_eq!(transactions[1], 118, "one record per transaction");
    assert!(transactions[0] <= 20, "batched: {} transactions for 118 records", transactions[0]);
}

/// Differential: the same generated records (repeated event ids, stale, skipped and
/// missing versions, records without a subject, several accounts per batch) applied one
/// per transaction and in batches come to the same outcomes, effects and aggregate rows.
/// The batched run takes the set-based path (fewer transactions); `OUTBOX_TEST_SEED`
/// replays a run.
#[sqlx::test(migrations = false)]
async fn batches_come_to_the_outcomes_records_one_by_one_come_to(pool: PgPool) {
    let s = setup(&pool, 1).await;
    let mut rng = outbox_tests::Rng::from_env("inbox_batches");
    let mut sent: Vec<(Uuid, String, i64, Option<i64>)> = Vec::new();
    let mut versions = [0i64; 5];
    for amount in 1..=400 {
        let (id, account, version) = match rng.range(0, 10) {
            // The same event again.
            0 if !sent.is_empty() => {
                let (id, account, _, version) = sent[rng.range(0, sent.len() as u64) as usize].clone();
                (id, account, version)
            }
            choice => {
                let a = rng.range(0, 5) as usize;
                let version = match choice {
                    1 => Some((versions[a] - 1).max(1)), // stale (or the first)
                    2 => None,
                    3 => {
                        versions[a] += 3; // a gap
                        Some(versions[a])
                    }
                    _ => {
                        versions[a] += 1;
                        Some(versions[a])
                    }
                };
                (Uuid::now_v7(), format!("acct-{a}"), version)
            }
        };
        let subject = (amount % 17 != 0).then_some(account.as_str());
        let record = RawRecord::text(
            0,
            &account,
            &Credit::json(&account, amount),
            &credit_headers(id, subject, version),
        );
        s.producer.send(&s.topic, &record);
        sent.push((id, account, amount, version));
    }
    s.producer.flush();
    let mut results = Vec::new();
    for (consumer, batch) in [("one", 1), ("many", 100)] {
        sqlx::query("TRUNCATE effects").execute(&pool).await.expect("truncate");
        let running = start_with(&pool, s.config(consumer).batch_size(batch), Ledger::default()).await;
        let stats = running.stats.clone();
        let settled = eventually(Duration::from_secs(30), || async {
            stats.applied() + stats.duplicates() + stats.stale() == 400
        })
        .await;
        running.shutdown().await;
        assert!(
            settled,
            "{consumer}: {} applied, {} duplicate, {} stale",
            stats.applied(),
            stats.duplicates(),
            stats.stale()
        );
        let outcomes: Vec<(Uuid, String)> =
            sqlx::query_as("SELECT event_id, outcome FROM inbox WHERE consumer = $1 ORDER BY event_id")
                .bind(consumer)
                .fetch_all(&pool)
                .await
                .expect("outcomes");
        let aggregates: Vec<(String, i64, i64, i64)> = sqlx::query_as(
            "SELECT aggregate_id, last_version, gaps, stale FROM inbox_aggregates WHERE consumer = $1 ORDER BY 1",
        )
        .bind(consumer)
        .fetch_all(&pool)
        .await
        .expect("aggregates");
        let effects: Vec<(Uuid, i64)> =
            sqlx::query_as("SELECT event_id, amount FROM effects ORDER BY kafka_offset")
                .fetch_all(&pool)
                .await
                .expect("effects");
        let counts = (stats.applied(), stats.duplicates(), stats.stale());
        results.push((outcomes, aggregates, effects, counts, inbox_transactions(&pool, consumer).await));
    }
    let (one, many) = (&results[0], &results[1]);
    eprintln!("counts (applied, duplicate, stale) {:?}; transactions: one {}, many {}", one.3, one.4, many.4);
    assert_eq!(many.3, one.3, "the same counts");
    assert_eq!(many.0, one.0, "the same outcome per event");
    assert_eq!(many.1, one.1, "the same aggregate rows");
    assert_eq!(many.2, one.2, "the same effects, in the same order");
    assert!(one.3 .1 > 0 && one.3 .2 > 0, "the generator made duplicates and stale events: {:?}", one.3);
    assert!(many.4 * 4 < one.4, "batched: {} transactions against {}", many.4, one.4);
}
