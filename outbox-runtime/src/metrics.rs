//! Metrics through the [`metrics`] facade: install any recorder and the relay and the inbox
//! report to it; `install_prometheus` (feature `prometheus`, on with `cli`) serves them for
//! Prometheus. Labels stay few and bounded: never an event id or an aggregate id.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `outbox_oldest_unpublished_age_seconds` | gauge | | age of the oldest pending or failed event: the headline |
//! | `outbox_pending` | gauge | | events waiting to be published |
//! | `outbox_retrying` | gauge | | pending events waiting for a retry after a failed attempt |
//! | `outbox_failed` | gauge | | events quarantined after a permanent error |
//! | `outbox_appended_per_second`, `outbox_published_per_second` | gauge | | rates over the last 5 minutes |
//! | `outbox_table_bytes` | gauge | | the outbox table with indexes and TOAST |
//! | `outbox_dead_tuples` | gauge | | dead tuples in the outbox table (`pg_stat_user_tables`) |
//! | `outbox_seconds_since_vacuum` | gauge | | since the outbox table was last vacuumed (by hand or autovacuum); `+Inf` if never |
//! | `outbox_seconds_since_analyze` | gauge | | since its statistics were last gathered; `+Inf` if never |
//! | `outbox_modified_since_analyze` | gauge | | rows changed since then (`n_mod_since_analyze`) |
//! | `outbox_relay_db_connections_in_use`, `outbox_relay_db_connections_max` | gauge | | the relay's pool: connections in use, and its size |
//! | `outbox_capacity_used_ratio` | gauge | | fill level over the configured capacity |
//! | `outbox_capacity_seconds_to_full` | gauge | | forecast at the recent growth rate; `+Inf` when not growing |
//! | `outbox_published_total` | counter | | events acknowledged and marked |
//! | `outbox_republished_total` | counter | | of those, sent again after an earlier attempt (retry, replay) |
//! | `outbox_publish_errors_total` | counter | `kind` = transient, permanent, exhausted, held (not sent: topic missing); `code` = Kafka error code, or `topic_missing` | failed sends, and events held back for a missing topic |
//! | `outbox_publish_attempts` | histogram | | attempts an event took until published |
//! | `outbox_missing_topics` | gauge | | topics events name that the cluster says do not exist (their events wait, then fail) |
//! | `outbox_fenced_total` | counter | | marks refused after a lease passed on |
//! | `outbox_relay_order_gaps_total` | counter | | events the broker acknowledged after an earlier event of their aggregate failed, or out of partition order: never expected (alert on any) |
//! | `outbox_relay_purges_total` | counter | `why` = deadline (a batch not acknowledged within the message timeout), again (a record outlived that purge; at most 5 per record) | purges of the producer's queue and requests in flight |
//! | `outbox_partitions` | gauge | | partitions of a partitioned outbox table (the legacy one included) after the last maintenance round |
//! | `outbox_partitions_overdue` | gauge | | of those, past retention but kept because they hold pending or failed events |
//! | `outbox_partition_errors_total` | counter | | partition maintenance rounds that failed (the next round tries again) |
//! | `outbox_cleanup_errors_total` | counter | | relay cleanup rounds (published rows past retention) that failed (the next round tries again) |
//! | `outbox_relay_claim_windows_passed_total` | counter | | claims whose window of fresh events was full of events held back behind an earlier event of their aggregate (waiting for a retry or failed), so that the next claim walks on past it |
//! | `outbox_refused_total` | counter | `event_type` | non-critical appends refused near capacity |
//! | `outbox_relay_batch_seconds` | histogram | | one relay batch: read, publish, mark |
//! | `outbox_relay_in_flight` | gauge | | events this process's relay claimed (or streamed) and has not recorded yet: being sent, or sent and being marked |
//! | `outbox_relay_report_errors_total` | counter | | reports of events in flight to the relays table that failed (the next report, 2 s later at most, tries again) |
//! | `outbox_created_to_published_seconds` | histogram | | from append to the mark after the ack |
//! | `outbox_cdc_standby` | gauge | | 1 while a change-data-capture relay waits for the slot another process streams from |
//! | `outbox_cdc_reconnects_total` | counter | | replication streams that failed and were connected again |
//! | `outbox_cdc_in_flight` | gauge | | streamed events held in memory for a retry (the broker failing) |
//! | `outbox_cdc_retained_wal_bytes` | gauge | | WAL the slot keeps on the server's disk |
//! | `outbox_cdc_confirmed_lag_bytes` | gauge | | WAL written since the relay's last confirmed position |
//! | `outbox_cdc_seconds_since_confirmed` | gauge | | since the confirmed position last moved while there was WAL to confirm |
//! | `outbox_cdc_slot_lost` | gauge | | 1 when the slot's `wal_status` is `lost`: only a backfill recovers (alert on it) |
//! | `outbox_cdc_seconds_to_wal_limit` | gauge | | forecast until the slot's retained WAL reaches `max_slot_wal_keep_size` at the recent growth rate; `+Inf` when not growing or unlimited |
//! | `outbox_console_read_errors_total` | counter | `stage` = live (the overview for the live streams and the polling fallback; read again at the next interval, each open console showing the failure), lag (a consumer's lag from the brokers; read again 5 s later, the page showing why) | the operator console's background reads that failed |
//! | `inbox_messages_total` | counter | `consumer`, `outcome` | applied, duplicate, stale, parked, held, ignored, retry |
//! | `inbox_version_gaps_total` | counter | `consumer` | aggregate versions never seen |
//! | `inbox_apply_seconds` | histogram | `consumer` | one message's transaction (in a batch, its share of the batch's) |
//! | `inbox_batch_fallbacks_total` | counter | `consumer` | batches rolled back and applied one record per transaction |
//! | `inbox_consumer_lag` | gauge | `consumer`, `topic`, `partition` | messages behind the partition's end |
//! | `inbox_paused_partitions` | gauge | `consumer` | partitions paused because their worker is behind or the memory budget is spent |
//! | `inbox_buffered_bytes` | gauge | `consumer` | bytes of records the inbox holds, from receipt until their outcome (see `InboxConfig::memory_budget`) |
//! | `inbox_receive_errors_total` | counter | `consumer` | errors receiving from Kafka (the consumer goes on) |
//! | `inbox_maintenance_errors_total` | counter | `consumer`, `stage` = partitions, cleanup | the consumer's maintenance rounds of its dedup table that failed (the next round tries again) |
//! | `inbox_partitions` | gauge | `consumer` | time partitions of a partitioned dedup table, after the consumer's last maintenance round |
//! | `inbox_partitions_overdue` | gauge | `consumer` | of those, past this consumer's dedup retention but kept for another consumer (one within its own retention, keeping for ever, or of an older version that registered none) |
//!
//! Gauges of the outbox's state are set by [`Ops::record_gauges`](crate::ops::Ops::record_gauges) (in `ops`), which relays call at
//! every lease renewal; it reads partial indexes and statistics views, never the whole
//! table. A relay sets its pool's gauges at the same moment.

use sqlx::PgPool;

pub(crate) const PUBLISHED: &str = "outbox_published_total";
pub(crate) const REPUBLISHED: &str = "outbox_republished_total";
pub(crate) const PUBLISH_ERRORS: &str = "outbox_publish_errors_total";
pub(crate) const ATTEMPTS: &str = "outbox_publish_attempts";
pub(crate) const MISSING_TOPICS: &str = "outbox_missing_topics";
pub(crate) const FENCED: &str = "outbox_fenced_total";
pub(crate) const ORDER_GAPS: &str = "outbox_relay_order_gaps_total";
pub(crate) const PURGES: &str = "outbox_relay_purges_total";
pub(crate) const CLAIM_WINDOWS_PASSED: &str = "outbox_relay_claim_windows_passed_total";
pub(crate) const REFUSED: &str = "outbox_refused_total";
pub(crate) const BATCH_SECONDS: &str = "outbox_relay_batch_seconds";
pub(crate) const CREATED_TO_PUBLISHED: &str = "outbox_created_to_published_seconds";
pub(crate) const RELAY_IN_FLIGHT: &str = "outbox_relay_in_flight";
pub(crate) const RELAY_REPORT_ERRORS: &str = "outbox_relay_report_errors_total";
#[cfg(feature = "cdc")]
pub(crate) const CDC_STANDBY: &str = "outbox_cdc_standby";
#[cfg(feature = "cdc")]
pub(crate) const CDC_RECONNECTS: &str = "outbox_cdc_reconnects_total";
#[cfg(feature = "cdc")]
pub(crate) const CDC_IN_FLIGHT: &str = "outbox_cdc_in_flight";
#[cfg(feature = "cdc")]
pub(crate) const CDC_RETAINED: &str = "outbox_cdc_retained_wal_bytes";
#[cfg(feature = "cdc")]
pub(crate) const CDC_LAG_BYTES: &str = "outbox_cdc_confirmed_lag_bytes";
#[cfg(feature = "cdc")]
pub(crate) const CDC_SINCE_CONFIRMED: &str = "outbox_cdc_seconds_since_confirmed";
#[cfg(feature = "cdc")]
pub(crate) const CDC_LOST: &str = "outbox_cdc_slot_lost";
#[cfg(feature = "cdc")]
pub(crate) const CDC_TO_LIMIT: &str = "outbox_cdc_seconds_to_wal_limit";
#[cfg(feature = "console")]
pub(crate) const CONSOLE_READ_ERRORS: &str = "outbox_console_read_errors_total";
pub(crate) const INBOX_MESSAGES: &str = "inbox_messages_total";
pub(crate) const INBOX_GAPS: &str = "inbox_version_gaps_total";
pub(crate) const INBOX_APPLY_SECONDS: &str = "inbox_apply_seconds";
pub(crate) const INBOX_BATCH_FALLBACKS: &str = "inbox_batch_fallbacks_total";
pub(crate) const INBOX_LAG: &str = "inbox_consumer_lag";
pub(crate) const INBOX_PAUSED: &str = "inbox_paused_partitions";
pub(crate) const INBOX_BUFFERED: &str = "inbox_buffered_bytes";
pub(crate) const INBOX_RECEIVE_ERRORS: &str = "inbox_receive_errors_total";
pub(crate) const INBOX_PARTITIONS: &str = "inbox_partitions";
pub(crate) const INBOX_MAINTENANCE_ERRORS: &str = "inbox_maintenance_errors_total";
pub(crate) const INBOX_PARTITIONS_OVERDUE: &str = "inbox_partitions_overdue";
pub(crate) const OUTBOX_PARTITIONS: &str = "outbox_partitions";
pub(crate) const OUTBOX_PARTITIONS_OVERDUE: &str = "outbox_partitions_overdue";
pub(crate) const OUTBOX_PARTITION_ERRORS: &str = "outbox_partition_errors_total";
pub(crate) const OUTBOX_CLEANUP_ERRORS: &str = "outbox_cleanup_errors_total";

/// Sets the gauges of a relay's database pool: connections open and in use, and its
/// maximum.
pub(crate) fn record_pool(pool: &PgPool) {
    let open = pool.size();
    let idle = u32::try_from(pool.num_idle()).unwrap_or(u32::MAX);
    metrics::gauge!("outbox_relay_db_connections_in_use").set(f64::from(open.saturating_sub(idle)));
    metrics::gauge!("outbox_relay_db_connections_max").set(f64::from(pool.options().get_max_connections()));
}

/// Installs a Prometheus recorder as the global [`metrics`] recorder and serves
/// `GET /metrics` on `addr` from a background task of the current Tokio runtime.
/// Histograms are exported as summaries of their quantiles except the latency ones,
/// which get buckets from 1 ms to 5 min so that they aggregate across processes.
#[cfg(feature = "prometheus")]
pub fn install_prometheus(addr: std::net::SocketAddr) -> crate::Result<()> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    const SECONDS: &[f64] =
        &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), SECONDS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(ATTEMPTS.to_owned()), &[1.0, 2.0, 3.0, 5.0, 10.0, 20.0])
        })
        .and_then(PrometheusBuilder::install)
        .map_err(|source| crate::Error::Metrics { address: addr, source })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// This module: the names, and the table documenting them.
    const SOURCE: &str = include_str!("metrics.rs");
    /// Where the outbox's gauges are set.
    const GAUGES: &str = include_str!("ops/gauges.rs");
    const DASHBOARD: &str = include_str!("../dashboards/outbox.json");

    /// Metric names in `text`: `outbox_...` or `inbox_...` identifiers, without the
    /// Prometheus histogram suffixes.
    fn names(text: &str) -> BTreeSet<String> {
        let mut found = BTreeSet::new();
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let starts = text[i..].starts_with("outbox_") || text[i..].starts_with("inbox_");
            let boundary = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
            if starts && boundary {
                let end = text[i..]
                    .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                    .map_or(text.len(), |n| i + n);
                let name = &text[i..end];
                let name =
                    ["_bucket", "_sum", "_count"].iter().fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
                if !name.ends_with('_') {
                    found.insert(name.to_owned());
                }
                i = end;
            } else {
                i += 1;
            }
        }
        found
    }

    #[test]
    fn the_dashboard_shows_every_metric_and_only_metrics_that_exist() {
        let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
        let exprs: Vec<&str> = dashboard["panels"]
            .as_array()
            .expect("panels")
            .iter()
            .flat_map(|p| p["targets"].as_array().into_iter().flatten())
            .filter_map(|t| t["expr"].as_str())
            .collect();
        let on_dashboard = names(&exprs.join("\n"));
        // Emitted: a string literal in this module or the gauges' (constants and gauge! calls).
        let code = format!("{SOURCE}\n{GAUGES}");
        let emitted: BTreeSet<String> =
            names(&code).into_iter().filter(|n| code.contains(&format!("\"{n}\""))).collect();
        assert!(emitted.len() >= 20, "{emitted:?}");
        let unknown: Vec<_> = on_dashboard.difference(&emitted).collect();
        assert!(unknown.is_empty(), "the dashboard queries metrics nothing emits: {unknown:?}");
        let missing: Vec<_> = emitted.difference(&on_dashboard).collect();
        assert!(missing.is_empty(), "metrics missing from the dashboard: {missing:?}");
        let undocumented: Vec<_> = emitted.iter().filter(|n| !SOURCE.contains(&format!("`{n}`"))).collect();
        assert!(undocumented.is_empty(), "metrics missing from the table above: {undocumented:?}");
    }
}
