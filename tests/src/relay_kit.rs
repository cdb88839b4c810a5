//! What the relay's tests (`tests/tests/relay.rs` and `relay_faults.rs`) share: [`Step`]
//! events appended to the outbox, and their records found in the topic again.

use outbox_runtime::{AppendOptions, NewEvent, Outbox};
use sqlx::PgPool;
use uuid::Uuid;

use crate::kafka::Record;
use crate::Step;

/// Where [`Step`] events go.
pub const TOPIC: &str = "outbox-test-steps";

/// Appends steps 1..=n of aggregate `id` in one transaction; returns their event ids.
pub async fn append_steps(pool: &PgPool, outbox: &Outbox, id: &str, n: i64, data: &str) -> Vec<Uuid> {
    let events: Vec<NewEvent> = (1..=n)
        .map(|k| {
            let step = Step { id: id.to_owned(), n: k, data: data.to_owned() };
            NewEvent::new(&step, AppendOptions::default().aggregate_version(k).header("x-test", "yes"))
                .expect("event")
        })
        .collect();
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &events).await.expect("append");
    tx.commit().await.expect("commit");
    events.iter().map(NewEvent::event_id).collect()
}

/// The records of aggregate `key`, in the order read.
pub fn records_for<'r>(records: &'r [Record], key: &str) -> Vec<&'r Record> {
    records.iter().filter(|r| r.key == key).collect()
}

/// Whether records hold every one of the events `ids`.
pub fn has_all(ids: &[Uuid]) -> impl Fn(&[Record]) -> bool + '_ {
    move |records: &[Record]| {
        ids.iter().all(|id| records.iter().any(|r| r.headers.get("ce_id") == Some(&id.to_string())))
    }
}
