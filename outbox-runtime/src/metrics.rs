//! Metrics through the [`metrics`] facade: install any recorder (for Prometheus,
//! `metrics-exporter-prometheus`) and the relay and the inbox report to it. Labels stay
//! few and bounded: never an event id or an aggregate id.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `outbox_oldest_unpublished_age_seconds` | gauge | | age of the oldest pending or failed event: the headline |
//! | `outbox_pending` | gauge | | events waiting to be published |
//! | `outbox_retrying` | gauge | | pending events that failed at least once |
//! | `outbox_failed` | gauge | | events quarantined after a permanent error |
//! | `outbox_published_total` | counter | | events acknowledged and marked |
//! | `outbox_publish_errors_total` | counter | `kind` = transient, permanent | failed sends |
//! | `outbox_fenced_total` | counter | | marks refused after a lease passed on |
//! | `outbox_relay_batch_seconds` | histogram | | one batch: read, publish, mark |
//! | `outbox_created_to_published_seconds` | histogram | | from append to the mark after the ack |
//! | `inbox_messages_total` | counter | `consumer`, `outcome` | applied, duplicate, stale, parked, held, ignored, retry |
//! | `inbox_version_gaps_total` | counter | `consumer` | aggregate versions never seen |
//! | `inbox_apply_seconds` | histogram | `consumer` | one message's transaction |

use sqlx::PgPool;

use crate::error::Result;
use crate::ops::Status;
use crate::outbox::Outbox;

pub(crate) const PUBLISHED: &str = "outbox_published_total";
pub(crate) const PUBLISH_ERRORS: &str = "outbox_publish_errors_total";
pub(crate) const FENCED: &str = "outbox_fenced_total";
pub(crate) const BATCH_SECONDS: &str = "outbox_relay_batch_seconds";
pub(crate) const CREATED_TO_PUBLISHED: &str = "outbox_created_to_published_seconds";
pub(crate) const INBOX_MESSAGES: &str = "inbox_messages_total";
pub(crate) const INBOX_GAPS: &str = "inbox_version_gaps_total";
pub(crate) const INBOX_APPLY_SECONDS: &str = "inbox_apply_seconds";

impl Outbox {
    /// Reads the outbox's [`Status`] and sets the gauges from it. Relays call this at every
    /// lease renewal; call it yourself to export the gauges from another process.
    pub async fn record_gauges(&self, pool: &PgPool) -> Result<Status> {
        let status = self.status(pool).await?;
        #[allow(clippy::cast_precision_loss)]
        {
            metrics::gauge!("outbox_pending").set(status.pending as f64);
            metrics::gauge!("outbox_retrying").set(status.retrying as f64);
            metrics::gauge!("outbox_failed").set(status.failed as f64);
        }
        metrics::gauge!("outbox_oldest_unpublished_age_seconds")
            .set(status.oldest_unpublished_age_seconds.unwrap_or(0.0));
        Ok(status)
    }
}
