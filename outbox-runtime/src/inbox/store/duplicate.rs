//! What a duplicate says: its span, its count in `<table>_progress` (in the transaction that
//! absorbs it, so a rolled-back batch counts nothing), and a debug line naming the event and
//! how and when its first delivery was recorded (read only while debug lines are on: nothing
//! is paid for it otherwise).

use sqlx::{AssertSqlSafe, PgConnection};

use super::super::message::Incoming;
use super::super::spans;
use super::super::Meta;
use super::Store;
use crate::action::rfc3339;
use crate::error::Result;

impl Store {
    /// A delivery of an event this consumer recorded before, absorbed in `tx`.
    pub(super) async fn absorbed(&self, tx: &mut PgConnection, msg: &Incoming, meta: &Meta) -> Result<()> {
        spans::duplicate(&self.consumer, msg, meta);
        let progress = &self.names.progress;
        let count = format!(
            "INSERT INTO {progress} (consumer, topic, kafka_partition, duplicates, last_duplicate_at) \
             VALUES ($1, $2, $3, 1, now()) ON CONFLICT (consumer, topic, kafka_partition) \
             DO UPDATE SET duplicates = {progress}.duplicates + 1, last_duplicate_at = now()"
        );
        sqlx::query(AssertSqlSafe(count))
            .bind(&self.consumer)
            .bind(&msg.topic)
            .bind(msg.partition)
            .execute(&mut *tx)
            .await?;
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return Ok(());
        }
        let sql = format!(
            "SELECT {}, outcome FROM {} WHERE consumer = $1 AND event_id = $2",
            rfc3339("applied_at"),
            self.names.inbox
        );
        // Missing when the first recording is not committed yet (two partitions carrying
        // one event at once: this insert waited for it, then found it).
        let (first_at, first_outcome): (String, String) = sqlx::query_as(AssertSqlSafe(sql))
            .bind(&self.consumer)
            .bind(meta.event_id)
            .fetch_optional(&mut *tx)
            .await?
            .unwrap_or_else(|| ("not committed yet".to_owned(), "unknown".to_owned()));
        tracing::debug!(
            consumer = %self.consumer,
            event_id = %meta.event_id,
            event_type = %meta.event_type,
            aggregate_id = meta.aggregate_id.as_deref().unwrap_or(""),
            topic = %msg.topic,
            partition = msg.partition,
            offset = msg.offset,
            first_at = %first_at,
            first_outcome = %first_outcome,
            "duplicate absorbed: the event was recorded before, its handler did not run"
        );
        Ok(())
    }
}
