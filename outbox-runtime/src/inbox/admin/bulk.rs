//! Parked messages retried or discarded by filter, in bounded transactions, each action
//! recorded in `<table>_audit` (see [`crate::action`]).

use sqlx::{AssertSqlSafe, PgConnection};

use super::InboxAdmin;
use crate::action::{ActionFilter, ActionReport, Audit, ACTION_BATCH, LISTED_IDS};
use crate::error::{Error, Result};

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
        // At least one transaction, so that an action that found nothing is recorded too.
        let chunks: Vec<&[i64]> =
            if matching.is_empty() { vec![&[]] } else { matching.chunks(ACTION_BATCH).collect() };
        let mut first = Some(tx);
        for ids in chunks {
            let mut tx = match first.take() {
                Some(tx) => tx,
                None => self.pool.begin().await?,
            };
            let changed = match discard {
                None => sqlx::query(AssertSqlSafe(request.as_str()))
                    .bind(&self.consumer)
                    .bind(&types)
                    .bind(&topic)
                    .bind(&text)
                    .bind(since)
                    .bind(until)
                    .bind(ids)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected(),
                Some(reason) => self.discard_each(&mut tx, ids, filter, reason).await?,
            };
            let skipped = ids.len() as u64 - changed;
            audit.add(&mut tx, audit_id, changed, skipped).await?;
            tx.commit().await?;
            report.applied += changed;
            report.skipped += skipped;
        }
        Ok(report)
    }

    /// Discards each of `ids` in order that is still open, still matches and is the first
    /// open message of its key; returns how many.
    async fn discard_each(
        &self,
        tx: &mut PgConnection,
        ids: &[i64],
        filter: &ActionFilter,
        reason: &str,
    ) -> Result<u64> {
        let condition = ActionFilter::condition(3, "p.reason", "p.parked_at");
        let still = format!(
            "SELECT EXISTS (SELECT 1 FROM {} p WHERE p.id = $1 AND p.consumer = $2 AND p.status IN ('parked', 'held') \
               AND {condition})",
            self.names.parked
        );
        let (types, topic, text, since, until) = filter.binds();
        let mut discarded = 0;
        for &id in ids {
            let matches: bool = sqlx::query_scalar(AssertSqlSafe(still.as_str()))
                .bind(id)
                .bind(&self.consumer)
                .bind(&types)
                .bind(&topic)
                .bind(&text)
                .bind(since)
                .bind(until)
                .fetch_one(&mut *tx)
                .await?;
            if !matches {
                continue;
            }
            match self.discard_in(tx, id, reason).await {
                Ok(_) => discarded += 1,
                // Released meanwhile, or held behind a message this action does not take.
                Err(Error::NotFound(_) | Error::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(discarded)
    }
}
