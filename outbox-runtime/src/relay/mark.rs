//! Recording what happened to a batch's rows, fenced by the lease tokens or guarded by the
//! partition locks of the relay that holds them.

use std::time::Duration;

use sqlx::{PgConnection, PgPool, Row as _, SqlStr};
use uuid::Uuid;

use super::claim::{Placement, Statements};
use super::plan::{array_literal, explained, EXPLAINED_DONE, MARK_PLAN};
use crate::error::Result;

/// The fencing credentials of a mark.
#[derive(Debug, Clone)]
pub(crate) struct Fence {
    pub(crate) relay_id: Uuid,
    pub(crate) partitions: Vec<i32>,
    pub(crate) tokens: Vec<i64>,
}

/// What to record after one batch.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    pub(crate) published: Vec<(i64, Placement)>,
    /// (row id, delay before the next attempt, reason, whether it was an attempt: a row
    /// held back for a missing topic was not sent, and its attempts stay as they are)
    pub(crate) retry: Vec<(i64, Duration, String, bool)>,
    pub(crate) failed: Vec<(i64, String)>,
}

/// What entitles a mark: lease tokens checked in its transaction, or partition locks its
/// transaction already holds.
#[derive(Debug, Clone, Copy)]
enum Guard<'a> {
    Fence(&'a Fence),
    Locked(&'a [i32]),
}

/// Rows actually marked; fewer than asked means leases were lost on the way.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marked {
    pub(crate) published: u64,
    pub(crate) retry: u64,
    pub(crate) failed: u64,
}

impl Statements {
    /// Records a batch in one transaction: the fence first, then the marks of the rows of
    /// the partitions it still holds. Rows of partitions it lost are left to the new owner.
    pub(crate) async fn mark(&self, pool: &PgPool, marks: &Marks, fence: &Fence) -> Result<Marked> {
        let mut tx = pool.begin().await?;
        let marked = self.mark_in(&mut tx, marks, Guard::Fence(fence), false).await?.0;
        tx.commit().await?;
        Ok(marked)
    }

    /// The marks' plans and row counts as they run (`EXPLAIN (ANALYZE, FORMAT JSON)`), in a
    /// transaction rolled back after.
    #[cfg(test)]
    pub(crate) async fn explain_mark(
        &self,
        pool: &PgPool,
        marks: &Marks,
        fence: &Fence,
    ) -> Result<Vec<serde_json::Value>> {
        let mut tx = pool.begin().await?;
        let plans = self.mark_in(&mut tx, marks, Guard::Fence(fence), true).await?.1;
        tx.rollback().await?;
        Ok(plans)
    }

    /// Records a batch in the transaction that locked its partitions and rows
    /// ([`Statements::claim_locked`]): no fence, the locks are the guard.
    pub(crate) async fn mark_locked(
        &self,
        tx: &mut PgConnection,
        marks: &Marks,
        partitions: &[i32],
    ) -> Result<Marked> {
        Ok(self.mark_in(tx, marks, Guard::Locked(partitions), false).await?.0)
    }

    async fn mark_in(
        &self,
        tx: &mut PgConnection,
        marks: &Marks,
        guard: Guard<'_>,
        explain: bool,
    ) -> Result<(Marked, Vec<serde_json::Value>)> {
        let mut marked = Marked::default();
        let mut plans = Vec::new();
        let held: Vec<i32> = match guard {
            Guard::Fence(fence) => {
                sqlx::query_scalar(self.fence.clone())
                    .bind(fence.relay_id)
                    .bind(&fence.partitions)
                    .bind(&fence.tokens)
                    .fetch_all(&mut *tx)
                    .await?
            }
            Guard::Locked(partitions) => partitions.to_vec(),
        };
        if held.is_empty() {
            return Ok((marked, plans));
        }
        sqlx::query(MARK_PLAN).execute(&mut *tx).await?;
        if !marks.published.is_empty() {
            let ids: Vec<i64> = marks.published.iter().map(|(id, _)| *id).collect();
            let parts: Vec<i32> = marks.published.iter().map(|(_, p)| p.partition).collect();
            let offsets: Vec<i64> = marks.published.iter().map(|(_, p)| p.offset).collect();
            if explain {
                let args = [
                    array_literal(&ids, "bigint"),
                    array_literal(&parts, "int"),
                    array_literal(&offsets, "bigint"),
                    array_literal(&held, "int"),
                ];
                plans.push(explain_in(tx, &self.published, "bigint[], int[], bigint[], int[]", &args).await?);
            } else {
                let query =
                    sqlx::query(self.published.clone()).bind(ids).bind(parts).bind(offsets).bind(&held);
                let latencies = query
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(|r| Ok((r.try_get::<f64, _>(0)?, r.try_get::<i32, _>(1)?)))
                    .collect::<sqlx::Result<Vec<_>>>()?;
                for (seconds, attempts) in &latencies {
                    metrics::histogram!(crate::metrics::CREATED_TO_PUBLISHED).record(*seconds);
                    metrics::histogram!(crate::metrics::ATTEMPTS).record(f64::from(*attempts));
                }
                // Sent before without a recorded ack (a retry after an error or a timeout), or
                // replayed: consumers may see these twice and absorb them.
                let again = latencies.iter().filter(|(_, attempts)| *attempts > 1).count() as u64;
                metrics::counter!(crate::metrics::REPUBLISHED).increment(again);
                marked.published = latencies.len() as u64;
            }
        }
        if !marks.retry.is_empty() {
            let ids: Vec<i64> = marks.retry.iter().map(|(id, ..)| *id).collect();
            let delays: Vec<i64> = marks
                .retry
                .iter()
                .map(|(_, d, ..)| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                .collect();
            let errors: Vec<String> = marks.retry.iter().map(|(_, _, e, _)| storable(e)).collect();
            let attempts: Vec<i32> = marks.retry.iter().map(|(.., attempt)| i32::from(*attempt)).collect();
            if explain {
                let args = [
                    array_literal(&ids, "bigint"),
                    array_literal(&delays, "bigint"),
                    array_literal(&errors, "text"),
                    array_literal(&attempts, "int"),
                    array_literal(&held, "int"),
                ];
                plans.push(
                    explain_in(tx, &self.retry, "bigint[], bigint[], text[], int[], int[]", &args).await?,
                );
            } else {
                let query = sqlx::query(self.retry.clone())
                    .bind(ids)
                    .bind(delays)
                    .bind(errors)
                    .bind(attempts)
                    .bind(&held);
                marked.retry = query.execute(&mut *tx).await?.rows_affected();
            }
        }
        if !marks.failed.is_empty() {
            let ids: Vec<i64> = marks.failed.iter().map(|(id, _)| *id).collect();
            let errors: Vec<String> = marks.failed.iter().map(|(_, e)| storable(e)).collect();
            if explain {
                let args = [
                    array_literal(&ids, "bigint"),
                    array_literal(&errors, "text"),
                    array_literal(&held, "int"),
                ];
                plans.push(explain_in(tx, &self.failed, "bigint[], text[], int[]", &args).await?);
            } else {
                let query = sqlx::query(self.failed.clone()).bind(ids).bind(errors).bind(&held);
                marked.failed = query.execute(&mut *tx).await?.rows_affected();
            }
        }
        Ok((marked, plans))
    }
}

/// The plan and row counts of `sql` run in `tx` as the relay runs it, one generic plan
/// ([`MARK_PLAN`]): prepared with parameters of `types`, executed with `args`.
async fn explain_in(
    tx: &mut PgConnection,
    sql: &SqlStr,
    types: &str,
    args: &[String],
) -> Result<serde_json::Value> {
    let (prepare, execute) = explained(sql.as_str(), types, args);
    sqlx::raw_sql(crate::table::sql(prepare)).execute(&mut *tx).await?;
    let plan = sqlx::query_scalar(crate::table::sql(execute)).fetch_one(&mut *tx).await?;
    sqlx::raw_sql(EXPLAINED_DONE).execute(&mut *tx).await?;
    Ok(plan)
}

/// `text` as PostgreSQL stores it: without NUL characters, which `text` cannot hold (an
/// error from a broker could carry one, and the mark would then fail every time).
pub(crate) fn storable(text: &str) -> String {
    text.replace('\0', "\u{fffd}")
}
