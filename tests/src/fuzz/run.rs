//! The fuzz run itself: the generated records produced to a new topic and consumed by an
//! inbox whose handler fails, panics or dawdles as each record asks, until every record has
//! an outcome or progress stops; then the inbox is stopped and the run judged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_runtime::inbox::{EventHandler, HandlerError, Handlers, Inbox, InboxConfig, Meta};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::generator::Generator;
use super::verdict::{check, Finished, Verdict};
use super::{total, Credit, AUDIT, CREDIT, MAX_ATTEMPTS};
use crate::kafka::Kafka;
use crate::raw::RawProducer;
use crate::Rng;

/// Per-event handler state: how many calls have failed so far.
#[derive(Clone, Default)]
struct Ledger {
    failures: Arc<Mutex<HashMap<Uuid, u32>>>,
}

impl Ledger {
    fn fail_once_more(&self, id: Uuid, up_to: u32) -> bool {
        let mut failures = self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = failures.entry(id).or_default();
        *n += 1;
        *n <= up_to
    }
}

impl EventHandler<Credit> for Ledger {
    async fn handle(&self, tx: &mut PgConnection, credit: Credit, meta: &Meta) -> Result<(), HandlerError> {
        match credit.mode.as_str() {
            "transient" if self.fail_once_more(meta.event_id, MAX_ATTEMPTS - 1) => {
                return Err(HandlerError::transient("the ledger is busy"))
            }
            "always-transient" => return Err(HandlerError::transient("the ledger is always busy")),
            "permanent" => return Err(HandlerError::permanent("the ledger refuses this account")),
            "panic" => panic!("the ledger cannot take account {}", credit.account),
            "slow" => tokio::time::sleep(Duration::from_millis(20)).await,
            _ => {}
        }
        // A NUL inside the account makes PostgreSQL refuse the insert (22021): parked.
        sqlx::query("INSERT INTO fuzz_effects (event_id, account, kafka_partition, kafka_offset) VALUES ($1, $2, $3, $4)")
            .bind(meta.event_id)
            .bind(&credit.account)
            .bind(meta.partition)
            .bind(meta.offset)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

/// Produces `records` generated from `seed` to a new topic of `partitions`, consumes them
/// with an inbox on `pool`, and judges what it recorded.
pub async fn run(pool: &PgPool, kafka: &Kafka, records: usize, seed: u64, partitions: i32) -> Verdict {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS fuzz_effects (event_id uuid NOT NULL, account text NOT NULL, \
         kafka_partition integer NOT NULL, kafka_offset bigint NOT NULL)",
    )
    .execute(pool)
    .await
    .expect("effects table");
    let topic = format!("fuzz-{}", Uuid::new_v4().simple());
    kafka.create_topic(&topic, partitions).await;
    let mut generator = Generator::new(Rng::seeded(seed), partitions, records);
    let planned = generator.plan(&topic, records);

    let consumer = format!("fuzz-{}", Uuid::new_v4().simple());
    let config = InboxConfig::new(&consumer, kafka.bootstrap(), [topic.clone()])
        .queue_per_partition(16)
        .buffer_per_partition(16 * 1024)
        .max_attempts(MAX_ATTEMPTS)
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .commit_interval(Duration::from_millis(100))
        .shutdown_timeout(Duration::from_secs(10))
        .dedup_retention(None);
    let handlers = Handlers::new().on_type::<Credit, _>(CREDIT, 1, Ledger::default()).ignore(AUDIT);
    let inbox = Inbox::new(pool.clone(), config, handlers).expect("inbox");
    inbox.migrator().run(pool).await.expect("inbox migrations");
    let stats = inbox.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(inbox.run(stop.clone()));

    let started = Instant::now();
    let producer = RawProducer::new(kafka.bootstrap());
    for p in &planned {
        producer.send(&topic, &p.record);
    }
    producer.flush();
    let budget = Duration::from_secs(60) + Duration::from_millis(20 * records as u64);
    let mut last_progress = (Instant::now(), 0);
    while total(&stats) < records as u64 && started.elapsed() < budget {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = total(&stats);
        if now != last_progress.1 {
            last_progress = (Instant::now(), now);
        } else if last_progress.0.elapsed() > Duration::from_secs(30) {
            break; // no progress for 30 s: judge what there is
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    // Let the last offsets be committed, then stop.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    let run_returned = matches!(tokio::time::timeout(Duration::from_secs(20), task).await, Ok(Ok(Ok(()))));
    let ends: Vec<i64> = generator.next_offset.clone();
    let finished =
        Finished { seed, records, partitions, consumer, topic, planned, ends, stats, seconds, run_returned };
    check(pool, kafka, finished).await
}
