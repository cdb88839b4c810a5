//! [`Watched`]: an inbox under test, and what it recorded of the events (its rows and its
//! committed offsets), for the judge.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::judge::{EventRow, InboxView, OpenParked};
use crate::inbox::{Handlers, Inbox, InboxStats};
use crate::Result;

/// An inbox under test: its task and what is needed to read its outcomes.
pub(super) struct Watched {
    pub(super) consumer: String,
    pub(super) topics: BTreeSet<String>,
    pub(super) handlers: Arc<Handlers>,
    pub(super) pool: PgPool,
    pub(super) inbox_table: String,
    pub(super) parked_table: String,
    pub(super) offsets: Arc<BaseConsumer>,
    pub(super) stats: Arc<InboxStats>,
    pub(super) task: Option<JoinHandle<Result<()>>>,
}

impl Watched {
    /// What reads the outcomes of `inbox` (its task is started by the caller).
    pub(super) fn new(inbox: &Inbox) -> Result<Watched> {
        let config = inbox.config();
        let mut offsets = ClientConfig::new();
        offsets.set("bootstrap.servers", &config.brokers);
        for (k, v) in &config.kafka {
            offsets.set(k, v);
        }
        // Reads the inbox's committed offsets; never joins the group, never commits.
        offsets.set("group.id", &config.consumer).set("enable.auto.commit", "false");
        let offsets: BaseConsumer = offsets.create()?;
        let names = inbox.names();
        Ok(Watched {
            consumer: config.consumer.clone(),
            topics: config.topics.iter().cloned().collect(),
            handlers: inbox.handlers(),
            pool: inbox.pool().clone(),
            inbox_table: names.inbox.clone(),
            parked_table: names.parked.clone(),
            offsets: Arc::new(offsets),
            stats: inbox.stats(),
            task: None,
        })
    }

    /// What this inbox recorded of `events`. The committed offsets are read first and the
    /// rows after, in one snapshot: the inbox commits a record's row before its offset, so
    /// an offset seen past a record means its row (if it has one) is seen too.
    pub(super) async fn view(&self, events: &[EventRow]) -> Result<InboxView> {
        let partitions: BTreeSet<(String, i32)> = events
            .iter()
            .filter(|e| e.status == "published" && self.topics.contains(&e.topic))
            .filter_map(|e| Some((e.topic.clone(), e.partition?)))
            .collect();
        let committed = self.committed(partitions).await;
        let ids: Vec<Uuid> = events.iter().map(|e| e.event_id).collect();
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY").execute(&mut *tx).await?;
        let outcomes: Vec<(Uuid, String)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT event_id, outcome FROM {} WHERE consumer = $1 AND event_id = ANY($2)",
            self.inbox_table
        )))
        .bind(&self.consumer)
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await?;
        type Open = (i64, Option<Uuid>, String, i32, i64, String, String, bool, Option<Vec<u8>>);
        let open: Vec<Open> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT id, event_id, topic, kafka_partition, kafka_offset, status, reason, retry_requested_at IS NOT NULL, hold_key \
             FROM {} WHERE consumer = $1 AND status IN ('parked', 'held') ORDER BY id",
            self.parked_table
        )))
        .bind(&self.consumer)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let ignored = events
            .iter()
            .filter_map(|e| Some((e, u32::try_from(e.schema_version).ok()?)))
            .filter(|(e, version)| self.handlers.ignores(&e.event_type, *version))
            .map(|(e, _)| (e.event_type.clone(), e.schema_version))
            .collect();
        Ok(InboxView {
            consumer: self.consumer.clone(),
            topics: self.topics.clone(),
            ignored,
            outcomes: outcomes.into_iter().collect::<HashMap<_, _>>(),
            open: open
                .into_iter()
                .map(|(id, event_id, topic, partition, offset, status, reason, retry_requested, hold_key)| {
                    OpenParked {
                        id,
                        event_id,
                        topic,
                        partition,
                        offset,
                        status,
                        reason,
                        retry_requested,
                        hold_key,
                    }
                })
                .collect(),
            committed,
        })
    }

    /// The committed offsets (next offset to read) of `partitions`; a partition without
    /// one, or a failed request, is absent (and so counts as nothing committed).
    async fn committed(&self, partitions: BTreeSet<(String, i32)>) -> BTreeMap<(String, i32), i64> {
        if partitions.is_empty() {
            return BTreeMap::new();
        }
        let mut list = TopicPartitionList::new();
        for (topic, partition) in &partitions {
            list.add_partition(topic, *partition);
        }
        let consumer = self.offsets.clone();
        let fetched =
            tokio::task::spawn_blocking(move || consumer.committed_offsets(list, Duration::from_secs(5)))
                .await
                .ok()
                .and_then(Result::ok);
        let mut out = BTreeMap::new();
        for e in fetched.iter().flat_map(TopicPartitionList::elements) {
            if let Offset::Offset(o) = e.offset() {
                out.insert((e.topic().to_owned(), e.partition()), o);
            }
        }
        out
    }
}

impl std::fmt::Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched").field("consumer", &self.consumer).finish_non_exhaustive()
    }
}
