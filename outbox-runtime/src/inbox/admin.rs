//! Operating an inbox from outside the consumer process (the `outbox inbox` commands):
//! list parked messages, request a retry, discard. Applying a message needs the
//! application's handlers, so a retry is a request that the running consumer carries out
//! (it looks every [`InboxConfig::operator_poll_interval`](super::InboxConfig::operator_poll_interval)).

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgConnection, PgPool};

mod browse;
mod bulk;
mod parked;

pub use browse::{AppliedCursor, AppliedPage, AppliedQuery, AppliedRecord};
pub use parked::{ConsumerSummary, ParkedGroup, ParkedPage, ParkedQuery, ParkedSummary};

use super::store::{InboxNames, Store};
use super::ParkedMessage;
use crate::action::{ActionFilter, ActionReport, Audit};
use crate::error::{Error, Result};

type Bytes = Vec<u8>;

/// One consumer's inbox, for operators; needs no handlers and no Kafka.
#[derive(Debug, Clone)]
pub struct InboxAdmin {
    pub(in crate::inbox) pool: PgPool,
    pub(in crate::inbox) names: InboxNames,
    consumer: String,
}

/// What an operator's discard did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Discarded {
    /// Messages of the key still held behind; the consumer applies them next, in order.
    pub held_behind: i64,
}

impl InboxAdmin {
    /// The inbox `schema.table` of `consumer`.
    pub fn new(pool: PgPool, schema: &str, table: &str, consumer: impl Into<String>) -> Result<Self> {
        Ok(InboxAdmin { pool, names: InboxNames::new(schema, table)?, consumer: consumer.into() })
    }

    pub(crate) fn from_parts(pool: PgPool, names: InboxNames, consumer: String) -> Self {
        InboxAdmin { pool, names, consumer }
    }

    /// The consumers that have rows in this inbox's tables (applied, parked or tracked
    /// aggregates), sorted: the names an operator can act on. Reads the inbox's primary
    /// key by skipping from one consumer to the next, so it costs one probe per consumer,
    /// not a scan of the inbox.
    pub async fn consumers(&self) -> Result<Vec<String>> {
        let skip = |t: &str| {
            format!(
                "(WITH RECURSIVE c(consumer) AS (SELECT min(consumer) FROM {t} UNION ALL \
                   SELECT (SELECT min(consumer) FROM {t} WHERE consumer > c.consumer) FROM c \
                   WHERE c.consumer IS NOT NULL) \
                 SELECT consumer FROM c WHERE consumer IS NOT NULL)"
            )
        };
        let sql = format!(
            "{} UNION {} UNION (SELECT DISTINCT consumer FROM {}) ORDER BY 1",
            skip(&self.names.inbox),
            skip(&self.names.aggregates),
            self.names.parked
        );
        sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.names.not_migrated(e.into()))
    }

    /// The pool it works on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The consumer this admin operates.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Parked and held messages, oldest first.
    pub async fn parked(&self) -> Result<Vec<ParkedMessage>> {
        self.parked_unchecked().await.map_err(|e| self.names.not_migrated(e))
    }

    async fn parked_unchecked(&self) -> Result<Vec<ParkedMessage>> {
        let sql = format!(
            "SELECT id, status, reason, topic, kafka_partition, kafka_offset, record_key, event_type, payload, \
                    retry_requested_at IS NOT NULL \
             FROM {} WHERE consumer = $1 AND status IN ('parked', 'held') ORDER BY id",
            self.names.parked
        );
        type Row = (i64, String, String, String, i32, i64, Option<Vec<u8>>, Option<String>, Vec<u8>, bool);
        let rows: Vec<Row> =
            sqlx::query_as(AssertSqlSafe(sql)).bind(&self.consumer).fetch_all(&self.pool).await?;
        Ok(rows
            .into_iter()
            .map(
                |(
                    id,
                    status,
                    reason,
                    topic,
                    kafka_partition,
                    kafka_offset,
                    record_key,
                    event_type,
                    payload,
                    retry,
                )| {
                    ParkedMessage {
                        id,
                        status,
                        reason,
                        topic,
                        kafka_partition,
                        kafka_offset,
                        record_key,
                        event_type,
                        payload,
                        retry_requested: retry,
                    }
                },
            )
            .collect())
    }

    /// Asks the running consumer to apply parked message `id` again, then the messages held
    /// behind it. Fails when `id` is not parked or is held behind an earlier message.
    pub async fn request_retry(&self, id: i64) -> Result<()> {
        self.request_retry_unchecked(id, None).await.map(|_| ()).map_err(|e| self.names.not_migrated(e))
    }

    /// [`InboxAdmin::request_retry`], recorded in the inbox's audit table with `actor`, as
    /// the actions by filter are (the `outbox inbox … retry ID` command). A refusal (not
    /// parked, held behind an earlier message) is an error and records nothing.
    pub async fn request_retry_by(&self, id: i64, actor: &str) -> Result<ActionReport> {
        let audit = self.audit_of(actor, "retry", None);
        let report = self.request_retry_unchecked(id, Some(&audit)).await;
        report.map(Option::unwrap_or_default).map_err(|e| self.names.not_migrated(e))
    }

    async fn request_retry_unchecked(
        &self,
        id: i64,
        audit: Option<&Audit<'_>>,
    ) -> Result<Option<ActionReport>> {
        let mut tx = self.pool.begin().await?;
        self.first_open(&mut tx, id).await?;
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET retry_requested_at = now() WHERE id = $1",
            self.names.parked
        )))
        .bind(id)
        .execute(&mut *tx)
        .await?;
        let report = match audit {
            Some(audit) => {
                Some(audit.one(&mut tx, ActionFilter::default().parked_id(id), id.to_string()).await?)
            }
            None => None,
        };
        tx.commit().await?;
        Ok(report)
    }

    /// The audit of an action by id on this consumer's inbox.
    fn audit_of<'a>(&'a self, actor: &'a str, action: &'static str, reason: Option<&'a str>) -> Audit<'a> {
        Audit { table: &self.names.audit, consumer: Some(&self.consumer), actor, action, reason }
    }

    /// Discards parked message `id` for good: it never applies, and a later delivery of
    /// its event is absorbed. The messages held behind it are handed to the running
    /// consumer, which applies them in order.
    pub async fn discard(&self, id: i64, reason: &str) -> Result<Discarded> {
        let discarded = self.discard_unchecked(id, reason, None).await;
        discarded.map(|(discarded, _)| discarded).map_err(|e| self.names.not_migrated(e))
    }

    /// [`InboxAdmin::discard`], recorded in the inbox's audit table with `actor`, as the
    /// actions by filter are (the `outbox inbox … discard ID` command). A refusal records
    /// nothing.
    pub async fn discard_by(&self, id: i64, reason: &str, actor: &str) -> Result<(ActionReport, Discarded)> {
        let audit = self.audit_of(actor, "discard", Some(reason));
        let discarded = self.discard_unchecked(id, reason, Some(&audit)).await;
        discarded
            .map(|(discarded, report)| (report.unwrap_or_default(), discarded))
            .map_err(|e| self.names.not_migrated(e))
    }

    async fn discard_unchecked(
        &self,
        id: i64,
        reason: &str,
        audit: Option<&Audit<'_>>,
    ) -> Result<(Discarded, Option<ActionReport>)> {
        let mut tx = self.pool.begin().await?;
        let discarded = self.discard_in(&mut tx, id, reason).await?;
        let report = match audit {
            Some(audit) => {
                Some(audit.one(&mut tx, ActionFilter::default().parked_id(id), id.to_string()).await?)
            }
            None => None,
        };
        tx.commit().await?;
        Ok((discarded, report))
    }

    /// [`InboxAdmin::discard`] in `tx`.
    async fn discard_in(&self, tx: &mut PgConnection, id: i64, reason: &str) -> Result<Discarded> {
        let hold_key = self.first_open(&mut *tx, id).await?;
        // Read before the key's lock was taken: the consumer may have released it since.
        if !discard_row(&mut *tx, &self.names, id, reason).await? {
            return Err(Error::NotFound(format!("no parked message {id} for consumer {}", self.consumer)));
        }
        let parked = &self.names.parked;
        let held_behind: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {parked} WHERE consumer = $1 AND hold_key = $2 AND status IN ('parked', 'held')"
        )))
        .bind(&self.consumer)
        .bind(hold_key.as_deref())
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {parked} SET retry_requested_at = now() WHERE id = (SELECT id FROM {parked} \
             WHERE consumer = $1 AND hold_key = $2 AND status IN ('parked', 'held') ORDER BY id LIMIT 1)"
        )))
        .bind(&self.consumer)
        .bind(hold_key.as_deref())
        .execute(&mut *tx)
        .await?;
        Ok(Discarded { held_behind })
    }

    /// Requested retries, oldest first.
    pub(crate) async fn requested(&self) -> Result<Vec<i64>> {
        Ok(sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT id FROM {} WHERE consumer = $1 AND status IN ('parked', 'held') AND retry_requested_at IS NOT NULL \
             ORDER BY id",
            self.names.parked
        )))
        .bind(&self.consumer)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Marks a request carried out (whatever came of it: a message parked again waits for
    /// a new request).
    pub(crate) async fn done(&self, id: i64) -> Result<()> {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET retry_requested_at = NULL WHERE id = $1",
            self.names.parked
        )))
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Locks the key of `id` and checks that `id` is open and the first open message of
    /// its key (in its topic). Returns the hashed key (`None` for a record without key).
    async fn first_open(&self, tx: &mut PgConnection, id: i64) -> Result<Option<Vec<u8>>> {
        let parked = &self.names.parked;
        let row: Option<(String, Option<Bytes>, Option<Bytes>)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT topic, record_key, hold_key FROM {parked} WHERE id = $1 AND consumer = $2 AND status IN ('parked', 'held')"
        )))
        .bind(id)
        .bind(&self.consumer)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((topic, key, hold_key)) = row else {
            return Err(Error::NotFound(format!("no parked message {id} for consumer {}", self.consumer)));
        };
        Store::new(&self.names, &self.consumer).lock(tx, &topic, key.as_deref()).await?;
        if let Some(conflict) = held_behind(tx, &self.names, &self.consumer, hold_key.as_deref(), id).await? {
            return Err(conflict);
        }
        Ok(hold_key)
    }
}

/// The longest part of a blocker's reason quoted in a conflict, in characters.
const QUOTED_REASON_CHARS: usize = 300;

/// When parked message `id` is held behind an earlier open message of its key: the
/// [`Error::Conflict`] naming that one (the first open message of the key, the only one
/// that can be released), what it is, why it is parked and how to release it.
pub(crate) async fn held_behind(
    conn: &mut PgConnection,
    names: &InboxNames,
    consumer: &str,
    hold_key: Option<&[u8]>,
    id: i64,
) -> Result<Option<Error>> {
    type Row = (i64, String, String, i32, i64, Option<String>, String);
    let head: Option<Row> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT id, status, topic, kafka_partition, kafka_offset, event_type, reason FROM {} \
         WHERE consumer = $1 AND hold_key = $2 AND status IN ('parked', 'held') AND id < $3 ORDER BY id LIMIT 1",
        names.parked
    )))
    .bind(consumer)
    .bind(hold_key)
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(head.map(|(head, status, topic, partition, offset, event_type, reason)| {
        let mut quoted: String = reason.chars().take(QUOTED_REASON_CHARS).collect();
        if quoted.len() < reason.len() {
            quoted.push('…');
        }
        Error::Conflict(format!(
            "message {id} is held behind parked message {head} of its key: {status}, topic {topic}, partition \
             {partition}, offset {offset}, event type {}, reason: {quoted}. Release that one first: \
             `outbox inbox --consumer {consumer} retry {head}` once its cause is fixed, or \
             `outbox inbox --consumer {consumer} discard {head} --reason R --yes` (in code, \
             `retry_parked({head})` or `discard_parked({head}, reason)`)",
            event_type.as_deref().unwrap_or("unknown"),
        ))
    }))
}

/// Marks parked row `id` discarded and records its event id, so that a later delivery of
/// the same event is absorbed; `false` when it was no longer open (released meanwhile).
pub(crate) async fn discard_row(
    tx: &mut PgConnection,
    names: &InboxNames,
    id: i64,
    reason: &str,
) -> Result<bool> {
    let (parked, inbox) = (&names.parked, &names.inbox);
    let discarded = sqlx::query(AssertSqlSafe(format!(
        "UPDATE {parked} SET status = 'discarded', resolved_at = now(), retry_requested_at = NULL, \
                reason = reason || '; discarded: ' || $2 \
         WHERE id = $1 AND status IN ('parked', 'held')"
    )))
    .bind(id)
    .bind(super::store::storable_reason(reason))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if discarded == 0 {
        return Ok(false);
    }
    let layout = super::partitions::layout(&mut *tx, names).await?;
    let [column, value, only_new] =
        super::partitions::dedup_insert(names, layout, "p.consumer", "p.event_id");
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {inbox} (consumer, event_id, event_type, schema_version, topic, kafka_partition, kafka_offset, outcome{column}) \
         SELECT consumer, event_id, event_type, schema_version, topic, kafka_partition, kafka_offset, 'discarded'{value} \
         FROM {parked} p WHERE id = $1 AND event_id IS NOT NULL AND event_type IS NOT NULL AND schema_version IS NOT NULL \
           AND {only_new} \
         ON CONFLICT DO NOTHING"
    )))
    .bind(id)
    .execute(&mut *tx)
    .await?;
    Ok(true)
}
