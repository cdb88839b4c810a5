//! Parked messages retried or discarded by filter, in bounded transactions, each action
//! recorded in `<table>_audit` (see [`crate::action`]).

use sqlx::{AssertSqlSafe, PgConnection};

use super::{discard_row, InboxAdmin};
use crate::action::{ActionFilter, ActionReport, Audit, ACTION_BATCH, LISTED_IDS};
use crate::error::Result;
use crate::inbox::store::Store;

impl InboxAdmin {
    /// Asks the running consumer to retry the parked messages matching `filter` that are
    /// the first open message of their key (the consumer then applies the messages held
    /// behind each, in order, as after [`InboxAdmin::request_retry`]); a matching message
    /// held behind another is not matched: it follows its head, and neither is one whose
    /// retry is already requested (a repeated call finds nothing new). A dry run counts and
    /// lists the first of them and changes nothing. Otherwise the matching messages are
    /// fixed when it starts and requested in transactions of [`ACTION_BATCH`]; one no
    /// longer open, or no longer first of its key, by its turn is skipped. `actor` is
    /// recorded with the action in `<table>_audit`.
    pub async fn retry_matching(
        &self,
        filter: &ActionFilter,
        actor: &str,
        dry_run: bool,
    ) -> Result<ActionReport> {
        self.act(filter, actor, dry_run, None).await.map_err(|e| self.names.not_migrated(e))
    }

    /// Discards the open (parked or held) messages matching `filter`: they never apply
    /// (a redelivery is absorbed). It goes key by key, a key's matched messages in id order
    /// in one transaction under the key's lock ([`ACTION_BATCH`] at most; a key with more
    /// takes several, handed over with the last); a matching message held behind an
    /// unmatched one is discarded too, and the unmatched one keeps holding the rest. Once
    /// a key's first open message is discarded, the next one is handed to the running
    /// consumer, in the same transaction as the key's last discard: the consumer never
    /// applies a message this action is about to discard. Dry run and the audit row as for
    /// [`InboxAdmin::retry_matching`]; the audit's counts are kept with every transaction.
    pub async fn discard_matching(
        &self,
        filter: &ActionFilter,
        reason: &str,
        actor: &str,
        dry_run: bool,
    ) -> Result<ActionReport> {
        self.act(filter, actor, dry_run, Some(reason)).await.map_err(|e| self.names.not_migrated(e))
    }

    /// Retries (`discard` `None`) or discards.
    async fn act(
        &self,
        filter: &ActionFilter,
        actor: &str,
        dry_run: bool,
        discard: Option<&str>,
    ) -> Result<ActionReport> {
        filter.validate()?;
        let parked = &self.names.parked;
        let condition = format!(
            "{} AND {}",
            ActionFilter::condition(2, "p.reason", "p.parked_at"),
            filter.ids_condition(false)?
        );
        // The first open message of its key: nothing open before it.
        let head = format!(
            "NOT EXISTS (SELECT 1 FROM {parked} q WHERE q.consumer = p.consumer AND q.hold_key = p.hold_key \
               AND q.status IN ('parked', 'held') AND q.id < p.id)"
        );
        // A retry takes heads not already waiting for one: run again, it finds nothing new.
        let heads_only = if discard.is_none() {
            format!("AND {head} AND p.retry_requested_at IS NULL")
        } else {
            String::new()
        };
        let (types, topic, text, since, until, cause) = filter.binds();
        let matching: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT p.id FROM {parked} p WHERE p.consumer = $1 AND p.status IN ('parked', 'held') \
               AND {condition} {heads_only} ORDER BY p.id"
        )))
        .bind(&self.consumer)
        .bind(&types)
        .bind(&topic)
        .bind(&text)
        .bind(since)
        .bind(until)
        .bind(&cause)
        .fetch_all(&self.pool)
        .await?;
        let action = if discard.is_some() { "discard" } else { "retry" };
        let mut report = ActionReport {
            action,
            dry_run,
            matched: matching.len() as u64,
            first: matching.iter().take(LISTED_IDS).map(ToString::to_string).collect(),
            ..ActionReport::default()
        };
        if dry_run {
            return Ok(report);
        }
        let audit = Audit {
            table: &self.names.audit,
            consumer: Some(&self.consumer),
            actor,
            action,
            reason: discard,
        };
        let request = format!(
            "UPDATE {parked} p SET retry_requested_at = now() WHERE p.id = ANY($8) AND p.consumer = $1 \
               AND p.status IN ('parked', 'held') AND p.retry_requested_at IS NULL AND {condition} AND {head}"
        );
        let mut tx = self.pool.begin().await?;
        let audit_id = audit.start(&mut tx, filter, report.matched).await?;
        report.audit_id = Some(audit_id);
        let Some(reason) = discard else {
            // At least one transaction, so that an action that found nothing is recorded too.
            let chunks: Vec<&[i64]> =
                if matching.is_empty() { vec![&[]] } else { matching.chunks(ACTION_BATCH).collect() };
            let mut first = Some(tx);
            for ids in chunks {
                let mut tx = match first.take() {
                    Some(tx) => tx,
                    None => self.pool.begin().await?,
                };
                let changed = sqlx::query(AssertSqlSafe(request.as_str()))
                    .bind(&self.consumer)
                    .bind(&types)
                    .bind(&topic)
                    .bind(&text)
                    .bind(since)
                    .bind(until)
                    .bind(&cause)
                    .bind(ids)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                let skipped = ids.len() as u64 - changed;
                audit.add(&mut tx, audit_id, changed, skipped).await?;
                tx.commit().await?;
                report.applied += changed;
                report.skipped += skipped;
            }
            return Ok(report);
        };
        tx.commit().await?;
        // Discards go key by key: each key's matched messages in one transaction under
        // that key's lock alone (several keys' locks in one transaction could deadlock with
        // the consumer, which locks a batch's keys in its own order), at most ACTION_BATCH
        // of them, and the key is handed to the consumer in the transaction that discards
        // its last matched message, so the consumer never applies one this action is about
        // to discard; the audit row is kept in every transaction.
        for ids in self.by_key(&matching).await? {
            let last = ids.len().div_ceil(ACTION_BATCH);
            for (n, chunk) in ids.chunks(ACTION_BATCH).enumerate() {
                let mut tx = self.pool.begin().await?;
                let changed = self.discard_chunk(&mut tx, chunk, filter, reason, n + 1 == last).await?;
                let skipped = chunk.len() as u64 - changed;
                audit.add(&mut tx, audit_id, changed, skipped).await?;
                tx.commit().await?;
                report.applied += changed;
                report.skipped += skipped;
            }
        }
        Ok(report)
    }

    /// `ids` grouped by key (topic and record key), each group in id order, the groups in
    /// the order of their first id; a message without a key is a group of its own.
    async fn by_key(&self, ids: &[i64]) -> Result<Vec<Vec<i64>>> {
        let keys: Vec<(i64, Option<Vec<u8>>)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT id, hold_key FROM {} WHERE id = ANY($1) ORDER BY id",
            self.names.parked
        )))
        .bind(ids)
        .fetch_all(&self.pool)
        .await?;
        let mut groups: Vec<Vec<i64>> = Vec::new();
        let mut of_key: std::collections::HashMap<Vec<u8>, usize> = std::collections::HashMap::new();
        for (id, key) in keys {
            match key {
                Some(key) => {
                    let at = *of_key.entry(key).or_insert_with(|| {
                        groups.push(Vec::new());
                        groups.len() - 1
                    });
                    groups[at].push(id);
                }
                None => groups.push(vec![id]),
            }
        }
        Ok(groups)
    }

    /// Discards the messages `ids` of one key that, under the key's lock, are still open
    /// and still match `filter`; how many. A message held behind an earlier open one is
    /// discarded too (it will never apply, and the earlier one still holds the rest). With
    /// `hand_over` (the key's last chunk), when the key's first open message was discarded,
    /// the next open one is handed to the running consumer.
    async fn discard_chunk(
        &self,
        tx: &mut PgConnection,
        ids: &[i64],
        filter: &ActionFilter,
        reason: &str,
        hand_over: bool,
    ) -> Result<u64> {
        let parked = &self.names.parked;
        type Row = (String, Option<Vec<u8>>, Option<Vec<u8>>);
        let row: Option<Row> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT topic, record_key, hold_key FROM {parked} WHERE id = $1 AND consumer = $2"
        )))
        .bind(ids[0])
        .bind(&self.consumer)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((topic, key, hold_key)) = row else { return Ok(0) };
        Store::new(&self.names, &self.consumer).lock(tx, &topic, key.as_deref()).await?;
        let first_open = || {
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
                "SELECT id FROM {parked} WHERE consumer = $1 AND hold_key = $2 AND status IN ('parked', 'held') \
                 ORDER BY id LIMIT 1"
            )))
            .bind(&self.consumer)
            .bind(hold_key.as_deref())
        };
        let head: Option<i64> = first_open().fetch_optional(&mut *tx).await?;
        // Read again under the lock, and the row locked (a message without a key has no key
        // lock): the consumer may have released it meanwhile.
        let condition = format!(
            "{} AND {}",
            ActionFilter::condition(3, "p.reason", "p.parked_at"),
            filter.ids_condition(false)?
        );
        let (types, topic_filter, text, since, until, cause) = filter.binds();
        let still = format!(
            "SELECT p.id FROM {parked} p WHERE p.id = $1 AND p.consumer = $2 \
               AND p.status IN ('parked', 'held') AND {condition} FOR UPDATE"
        );
        let mut discarded = 0;
        for &id in ids {
            let open: Option<i64> = sqlx::query_scalar(AssertSqlSafe(still.as_str()))
                .bind(id)
                .bind(&self.consumer)
                .bind(&types)
                .bind(&topic_filter)
                .bind(&text)
                .bind(since)
                .bind(until)
                .bind(&cause)
                .fetch_optional(&mut *tx)
                .await?;
            if open.is_some() && discard_row(tx, &self.names, id, reason).await? {
                discarded += 1;
            }
        }
        if hand_over && hold_key.is_some() {
            let next: Option<i64> = first_open().fetch_optional(&mut *tx).await?;
            if let Some(next) = next.filter(|next| Some(*next) != head) {
                sqlx::query(AssertSqlSafe(format!(
                    "UPDATE {parked} SET retry_requested_at = now() WHERE id = $1"
                )))
                .bind(next)
                .execute(&mut *tx)
                .await?;
            }
        }
        Ok(discarded)
    }
}
