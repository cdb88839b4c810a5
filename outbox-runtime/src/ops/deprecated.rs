//! The operator methods as they were on [`Outbox`] before [`Outbox::ops`]: each calls the
//! same method of [`Ops`](super::Ops). Kept for one release so that code written against
//! them still builds, with a warning that names the replacement.

use std::time::{Duration, SystemTime};

use sqlx::PgPool;
use uuid::Uuid;

use super::{
    FailedEvent, Gauges, InboxSide, Reconciliation, ReplayFilter, ReplayReport, RetryTarget, Retrying, Status,
};
use crate::error::Result;
use crate::outbox::Outbox;

#[doc(hidden)]
impl Outbox {
    #[deprecated(since = "0.1.0", note = "use `outbox.ops().status(pool)`")]
    pub async fn status(&self, pool: &PgPool) -> Result<Status> {
        self.ops().status(pool).await
    }
    #[deprecated(since = "0.1.0", note = "use `outbox.ops().status_over(pool, window)`")]
    pub async fn status_over(&self, pool: &PgPool, window: Duration) -> Result<Status> {
        self.ops().status_over(pool, window).await
    }
    #[deprecated(since = "0.1.0", note = "use `outbox.ops().failed(pool)`")]
    pub async fn failed(&self, pool: &PgPool) -> Result<Vec<FailedEvent>> {
        self.ops().failed(pool).await
    }
    #[deprecated(since = "0.1.0", note = "use `outbox.ops().retrying(pool, limit)`")]
    pub async fn retrying(&self, pool: &PgPool, limit: u32) -> Result<Retrying> {
        self.ops().retrying(pool, limit).await
    }
    #[deprecated(since = "0.1.0", note = "use `outbox.ops().retry(pool, target)`")]
    pub async fn retry(&self, pool: &PgPool, target: &RetryTarget) -> Result<u64> {
        self.ops().retry(pool, target).await
    }
    #[deprecated(since = "0.1.0", note = "use `outbox.ops().discard(pool, event_id, reason)`")]
    pub async fn discard(&self, pool: &PgPool, event_id: Uuid, reason: &str) -> Result<bool> {
        self.ops().discard(pool, event_id, reason).await
    }
    #[deprecated(since = "0.1.0", note = "use `outbox.ops().replay(pool, filter, dry_run)`")]
    pub async fn replay(&self, pool: &PgPool, filter: &ReplayFilter, dry_run: bool) -> Result<ReplayReport> {
        self.ops().replay(pool, filter, dry_run).await
    }
    #[deprecated(since = "0.1.0", note = "use `outbox.ops().purge(pool, older_than, batch_size, progress)`")]
    pub async fn purge(
        &self,
        pool: &PgPool,
        older_than: Duration,
        batch_size: u32,
        progress: impl FnMut(u64),
    ) -> Result<u64> {
        self.ops().purge(pool, older_than, batch_size, progress).await
    }
    #[deprecated(since = "0.1.0", note = "use `outbox.ops().reconcile(pool, since, until, inbox)`")]
    pub async fn reconcile(
        &self,
        pool: &PgPool,
        since: SystemTime,
        until: SystemTime,
        inbox: Option<&InboxSide>,
    ) -> Result<Reconciliation> {
        self.ops().reconcile(pool, since, until, inbox).await
    }
    #[deprecated(since = "0.1.0", note = "use `outbox.ops().record_gauges(pool)`")]
    pub async fn record_gauges(&self, pool: &PgPool) -> Result<Gauges> {
        self.ops().record_gauges(pool).await
    }
}
