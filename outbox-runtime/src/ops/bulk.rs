//! Failed events retried or discarded by filter, in bounded transactions, each action
//! recorded in `<table>_audit` (see [`crate::action`]).

use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

use super::{Ops, RetryTarget};
use crate::action::{ActionFilter, ActionReport, Audit, ACTION_BATCH, LISTED_IDS};
use crate::error::{Error, Result};

impl Ops {
    /// Puts the failed events matching `filter` back up for publication (due at once), as
    /// [`Ops::retry`] does one. A dry run counts and lists the first of them and changes
    /// nothing. Otherwise the matching events are fixed when it starts and retried in
    /// transactions of [`ACTION_BATCH`]; one no longer failed (or no longer matching) by
    /// its turn is skipped. `actor` is recorded with the action in `<table>_audit`.
    pub async fn retry_failed(
        &self,
        pool: &PgPool,
        filter: &ActionFilter,
        actor: &str,
        dry_run: bool,
    ) -> Result<ActionReport> {
        let set = "status = 'pending', next_attempt_at = '-infinity'";
        self.act(pool, filter, actor, dry_run, "retry", None, set).await.map_err(|e| self.not_migrated(e))
    }

    /// Discards the failed events matching `filter`, as [`Ops::discard`] does one: they
    /// are never published, and the events of their aggregates behind them flow again.
    /// Dry run, batches, skips and the audit row as for [`Ops::retry_failed`].
    pub async fn discard_failed(
        &self,
        pool: &PgPool,
        filter: &ActionFilter,
        reason: &str,
        actor: &str,
        dry_run: bool,
    ) -> Result<ActionReport> {
        let set = "status = 'discarded', last_error = 'discarded: ' || $8";
        self.act(pool, filter, actor, dry_run, "discard", Some(reason), set)
            .await
            .map_err(|e| self.not_migrated(e))
    }

    /// [`Ops::retry`] recorded in `<table>_audit` with `actor` (the `outbox retry` and
    /// `outbox failed retry ID` commands): the failed event, the failed events of an
    /// aggregate (fixed when it starts, recorded by their ids) or every failed event, put
    /// back up as [`Ops::retry_failed`] does. An event or an outbox with nothing failed is
    /// recorded with `matched` 0, as an action by filter that finds nothing is; an
    /// aggregate without failed events records nothing (it names no ids to record).
    pub async fn retry_by(&self, pool: &PgPool, target: &RetryTarget, actor: &str) -> Result<ActionReport> {
        let filter = match target {
            RetryTarget::Event(id) => ActionFilter::default().event_id(*id),
            RetryTarget::AllFailed => ActionFilter::default(),
            RetryTarget::Aggregate(aggregate_id) => {
                let ids: Vec<Uuid> = sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT event_id FROM {} WHERE status = 'failed' AND aggregate_id = $1 ORDER BY id",
                    self.names().outbox
                )))
                .bind(aggregate_id)
                .fetch_all(pool)
                .await
                .map_err(|e| self.not_migrated(e.into()))?;
                if ids.is_empty() {
                    return Ok(ActionReport { action: "retry", ..ActionReport::default() });
                }
                ids.into_iter().fold(ActionFilter::default(), ActionFilter::event_id)
            }
        };
        self.retry_failed(pool, &filter, actor, false).await
    }

    /// Discards one failed or pending event (a pending one too: one waiting for retries
    /// that cannot succeed, or held behind its aggregate's failed event), as
    /// [`Ops::discard`] does, recorded in `<table>_audit` with `actor` in the same
    /// transaction (the `outbox discard ID` and `outbox failed discard ID` commands). No
    /// such event failed or pending: `matched` 0, and nothing is recorded.
    pub async fn discard_by(
        &self,
        pool: &PgPool,
        event_id: Uuid,
        reason: &str,
        actor: &str,
    ) -> Result<ActionReport> {
        let names = self.names();
        let mut tx = pool.begin().await.map_err(|e| self.not_migrated(e.into()))?;
        let done = self.discard_one(&mut *tx, event_id, reason).await.map_err(|e| self.not_migrated(e))?;
        if !done {
            return Ok(ActionReport { action: "discard", ..ActionReport::default() });
        }
        let audit =
            Audit { table: &names.audit, consumer: None, actor, action: "discard", reason: Some(reason) };
        let report =
            audit.one(&mut tx, ActionFilter::default().event_id(event_id), event_id.to_string()).await?;
        tx.commit().await?;
        Ok(report)
    }

    /// A missing table of the outbox as [`Error::NotMigrated`], its missing `failed_at`
    /// column (migration 4 not run) as [`Error::MigrationsBehind`].
    fn not_migrated(&self, error: Error) -> Error {
        let undefined_column = matches!(&error, Error::Database(e)
            if e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == "42703"));
        if undefined_column {
            return Error::MigrationsBehind {
                table: self.names().outbox.clone(),
                missing: "no column failed_at, of migration 4".to_owned(),
            };
        }
        self.names().not_migrated(error)
    }

    #[allow(clippy::too_many_arguments)]
    async fn act(
        &self,
        pool: &PgPool,
        filter: &ActionFilter,
        actor: &str,
        dry_run: bool,
        action: &'static str,
        reason: Option<&str>,
        set: &str,
    ) -> Result<ActionReport> {
        filter.validate()?;
        let names = self.names();
        let t = &names.outbox;
        let condition = format!(
            "{} AND {}",
            ActionFilter::condition(1, "p.last_error", "coalesce(p.failed_at, p.created_at)"),
            filter.ids_condition(true)?
        );
        let (types, topic, text, since, until, cause) = filter.binds();
        let matching: Vec<(i64, Uuid)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT p.id, p.event_id FROM {t} p WHERE p.status = 'failed' AND {condition} ORDER BY p.id"
        )))
        .bind(&types)
        .bind(&topic)
        .bind(&text)
        .bind(since)
        .bind(until)
        .bind(&cause)
        .fetch_all(pool)
        .await?;
        let mut report = ActionReport {
            action,
            dry_run,
            matched: matching.len() as u64,
            first: matching.iter().take(LISTED_IDS).map(|(_, e)| e.to_string()).collect(),
            ..ActionReport::default()
        };
        if dry_run {
            return Ok(report);
        }
        let audit = Audit { table: &names.audit, consumer: None, actor, action, reason };
        let change = format!(
            "UPDATE {t} p SET {set} WHERE p.id = ANY($7) AND p.status = 'failed' AND {condition} RETURNING p.id"
        );
        let mut tx = pool.begin().await?;
        let audit_id = audit.start(&mut tx, filter, report.matched).await?;
        report.audit_id = Some(audit_id);
        // At least one transaction, so that an action that found nothing is recorded too.
        let chunks: Vec<&[(i64, Uuid)]> =
            if matching.is_empty() { vec![&[]] } else { matching.chunks(ACTION_BATCH).collect() };
        let mut first = Some(tx);
        for chunk in chunks {
            let mut tx = match first.take() {
                Some(tx) => tx,
                None => pool.begin().await?,
            };
            let ids: Vec<i64> = chunk.iter().map(|(id, _)| *id).collect();
            let mut query = sqlx::query(AssertSqlSafe(change.as_str()))
                .bind(&types)
                .bind(&topic)
                .bind(&text)
                .bind(since)
                .bind(until)
                .bind(&cause)
                .bind(&ids);
            if let Some(reason) = reason {
                query = query.bind(reason);
            }
            let changed = query.execute(&mut *tx).await?.rows_affected();
            let skipped = ids.len() as u64 - changed;
            audit.add(&mut tx, audit_id, changed, skipped).await?;
            tx.commit().await?;
            report.applied += changed;
            report.skipped += skipped;
        }
        if action == "retry" && report.applied > 0 && self.config().notify {
            sqlx::query("SELECT pg_notify($1, '')").bind(&names.channel).execute(pool).await?;
        }
        Ok(report)
    }
}
