//! Parked messages retried or discarded by filter, in bounded transactions, each action
//! recorded in `<table>_audit` (see [`crate::action`]).

use sqlx::{AssertSqlSafe, PgConnection};

use super::{discard_row, held_behind, InboxAdmin};
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

    /// Discards the open (parked or held) messages matching `filter`, in id order, as
    /// [`InboxAdmin::discard`] does one: they never apply, and the running consumer applies
    /// the messages held behind them. A matching message held behind one that is neither
    /// matched nor released is skipped. Dry run, batches and the audit row as for
    /// [`InboxAdmin::retry_matching`].
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
        let condition = ActionFilter::condition(2, "p.reason", "p.parked_at");
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
        let (types, topic, text, since, until) = filter.binds();
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
            "UPDATE {parked} p SET retry_requested_at = now() WHERE p.id = ANY($7) AND p.consumer = $1 \
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
        // Discards go one message per transaction, each under its key's lock alone (a
        // transaction holding several keys' locks could deadlock with the consumer, which
        // locks a batch's keys in its own order); the audit row is brought up to date every
        // ACTION_BATCH messages.
        let mut remaining: std::collections::HashSet<i64> = matching.iter().copied().collect();
        for ids in matching.chunks(ACTION_BATCH) {
            let mut changed = 0;
            for &id in ids {
                remaining.remove(&id);
                let mut tx = self.pool.begin().await?;
                if self.discard_matched(&mut tx, id, filter, reason, &remaining).await? {
                    changed += 1;
                }
                tx.commit().await?;
            }
            let skipped = ids.len() as u64 - changed;
            let mut tx = self.pool.begin().await?;
            audit.add(&mut tx, audit_id, changed, skipped).await?;
            tx.commit().await?;
            report.applied += changed;
            report.skipped += skipped;
        }
        Ok(report)
    }

    /// Discards parked message `id` if, under its key's lock, it is still open and still
    /// matches `filter`; whether it did. A message held behind an earlier open one is
    /// discarded too (it will never apply, and the earlier one still holds the rest). When
    /// `id` was the first open message of its key, the next one is handed to the running
    /// consumer, unless this action is about to discard it as well (`remaining`): the
    /// consumer must not apply what the operator asked to discard.
    async fn discard_matched(
        &self,
        tx: &mut PgConnection,
        id: i64,
        filter: &ActionFilter,
        reason: &str,
        remaining: &std::collections::HashSet<i64>,
    ) -> Result<bool> {
        let parked = &self.names.parked;
        type Row = (String, Option<Vec<u8>>, Option<Vec<u8>>);
        let row: Option<Row> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT topic, record_key, hold_key FROM {parked} WHERE id = $1 AND consumer = $2"
        )))
        .bind(id)
        .bind(&self.consumer)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((topic, key, hold_key)) = row else { return Ok(false) };
        Store::new(&self.names, &self.consumer).lock(tx, &topic, key.as_deref()).await?;
        // Read again under the lock: the consumer may have released it meanwhile.
        let condition = ActionFilter::condition(3, "p.reason", "p.parked_at");
        let (types, topic_filter, text, since, until) = filter.binds();
        let still: bool = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT EXISTS (SELECT 1 FROM {parked} p WHERE p.id = $1 AND p.consumer = $2 \
               AND p.status IN ('parked', 'held') AND {condition})"
        )))
        .bind(id)
        .bind(&self.consumer)
        .bind(&types)
        .bind(&topic_filter)
        .bind(&text)
        .bind(since)
        .bind(until)
        .fetch_one(&mut *tx)
        .await?;
        if !still {
            return Ok(false);
        }
        let was_first =
            held_behind(tx, &self.names, &self.consumer, hold_key.as_deref(), id).await?.is_none();
        if !discard_row(tx, &self.names, id, reason).await? {
            return Ok(false);
        }
        if was_first {
            let next: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT id FROM {parked} WHERE consumer = $1 AND hold_key = $2 AND status IN ('parked', 'held') \
                 ORDER BY id LIMIT 1"
            )))
            .bind(&self.consumer)
            .bind(hold_key.as_deref())
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(next) = next.filter(|next| !remaining.contains(next)) {
                sqlx::query(AssertSqlSafe(format!(
                    "UPDATE {parked} SET retry_requested_at = now() WHERE id = $1"
                )))
                .bind(next)
                .execute(&mut *tx)
                .await?;
            }
        }
        Ok(true)
    }
}
