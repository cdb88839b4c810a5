//! The outbox's fill level against its configured [`Capacity`], and the refusal of
//! non-critical appends near it (backpressure).

use std::time::Instant;

use sqlx::{AssertSqlSafe, PgConnection};

use crate::error::{Error, Result};
use crate::outbox::{Capacity, Outbox};
use crate::table::Names;

/// The statement measuring the fill level in the capacity's unit.
pub(crate) fn fill_sql(names: &Names, capacity: Capacity) -> String {
    match capacity {
        // Served by the partial index on open rows: O(backlog), not O(table).
        Capacity::Rows(_) => {
            format!("SELECT count(*) FROM {} WHERE status IN ('pending', 'failed')", names.outbox)
        }
        Capacity::Bytes(_) => {
            format!(
                "SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint \
                 FROM (SELECT '{t}'::regclass AS relid UNION SELECT relid FROM pg_partition_tree('{t}')) AS t",
                t = names.outbox.replace('\'', "''")
            )
        }
    }
}

/// Seconds until `used` reaches `limit` growing at `growth_per_second`: 0 when already
/// there, `None` when it is not growing.
pub(crate) fn seconds_to_full(used: u64, limit: u64, growth_per_second: f64) -> Option<f64> {
    if used >= limit {
        Some(0.0)
    } else if growth_per_second > 0.0 {
        #[allow(clippy::cast_precision_loss)]
        Some((limit - used) as f64 / growth_per_second)
    } else {
        None
    }
}

impl Outbox {
    /// The fill level now, in the capacity's unit (`None` without a capacity).
    pub(crate) async fn fill(&self, conn: &mut PgConnection) -> Result<Option<u64>> {
        let Some(capacity) = self.config().capacity else { return Ok(None) };
        let used: i64 =
            sqlx::query_scalar(AssertSqlSafe(fill_sql(self.names(), capacity))).fetch_one(conn).await?;
        Ok(Some(u64::try_from(used).unwrap_or(0)))
    }

    /// Refuses a non-critical event when the outbox is at or above the refusal share of
    /// its capacity. The level is measured at most once per check interval.
    pub(crate) async fn admit_non_critical(
        &self,
        conn: &mut PgConnection,
        event_type: &'static str,
    ) -> Result<()> {
        let Some(capacity) = self.config().capacity else { return Ok(()) };
        let cached = {
            let fill = self.inner.fill.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            fill.filter(|(at, _)| at.elapsed() < self.config().capacity_check_interval).map(|(_, used)| used)
        };
        let used = match cached {
            Some(used) => used,
            None => {
                let used = self.fill(conn).await?.unwrap_or(0);
                *self.inner.fill.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some((Instant::now(), used));
                used
            }
        };
        #[allow(clippy::cast_precision_loss)]
        let share = used as f64 / capacity.limit() as f64;
        if share >= self.config().refuse_non_critical_at {
            metrics::counter!(crate::metrics::REFUSED, "event_type" => event_type).increment(1);
            return Err(Error::Backpressure {
                event_type,
                used,
                limit: capacity.limit(),
                unit: capacity.unit(),
                percent: share * 100.0,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::seconds_to_full;

    #[test]
    fn forecast_is_the_room_left_over_the_growth_rate() {
        assert_eq!(seconds_to_full(600, 1000, 4.0), Some(100.0));
        assert_eq!(seconds_to_full(1000, 1000, 4.0), Some(0.0), "full is full, growing or not");
        assert_eq!(seconds_to_full(1200, 1000, -1.0), Some(0.0));
        assert_eq!(seconds_to_full(600, 1000, 0.0), None, "not growing: never full");
        assert_eq!(seconds_to_full(600, 1000, -3.0), None, "shrinking: never full");
    }
}
