//! What an operator looks at first: per state and topic, how many events (counted up to a
//! cap, so that a look costs the same on a table of millions), the oldest unpublished one's
//! age, the relays and the work partitions they hold.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

use super::browse::EventState;
use super::Ops;
use crate::error::Result;

/// A count that stops at a cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Capped {
    /// The rows counted.
    pub count: i64,
    /// Whether counting stopped at the cap: there are at least `count`.
    pub at_least: bool,
}

/// One state's events.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct StateCount {
    /// The state.
    pub state: EventState,
    /// How many events are in it (up to the cap).
    pub events: Capped,
    /// Of those counted, how many per topic (topics with none counted left out).
    pub by_topic: BTreeMap<String, i64>,
}

/// A relay that heartbeats into this outbox's table, and the work partitions it holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct RelayLeases {
    /// Its id (`None`: work partitions no relay holds).
    pub relay_id: Option<Uuid>,
    /// Its last heartbeat (RFC 3339, UTC), if it still has a row.
    pub heartbeat_at: Option<String>,
    /// Seconds since then.
    pub heartbeat_age_seconds: Option<f64>,
    /// Work partitions whose lease it holds and has not let expire.
    pub live_partitions: i64,
    /// Work partitions whose lease it held and let expire (another relay takes them).
    pub expired_partitions: i64,
    /// Events it has in flight (claimed or streamed, not yet recorded), as it last reported
    /// them; `None` when it has no report standing (it stopped reporting: it died, or runs
    /// a version that does not report).
    pub in_flight: Option<i64>,
}

/// Events the relays have in flight: claimed (or streamed) and not yet recorded. A claim
/// writes nothing to the rows, so these are the relays' own counts, as each last reported
/// them (every 2 s at most while it has any); a relay that stops reporting stops counting
/// a few reports later.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct InFlight {
    /// Over every relay with a report standing.
    pub events: i64,
    /// Of those, how many per topic (topics with none left out).
    pub by_topic: BTreeMap<String, i64>,
}

/// The outbox at one look, from [`Ops::overview`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Overview {
    /// Per state, in the order events move through them.
    pub states: Vec<StateCount>,
    /// The cap the counts stop at.
    pub cap: i64,
    /// Age in seconds of the oldest event not yet published (pending, retrying or failed).
    pub oldest_unpublished_age_seconds: Option<f64>,
    /// Events in flight (claimed by a relay, not yet recorded): between pending and the
    /// state the relay's mark gives them.
    pub in_flight: InFlight,
    /// The relays and the work partitions they hold; lease holders first.
    pub relays: Vec<RelayLeases>,
}

impl Ops {
    /// Counts per state and topic up to `cap` rows per state, the oldest unpublished
    /// event's age, and the relays with their leases. Each count reads at most `cap` index
    /// entries, whatever the size of the table.
    pub async fn overview(&self, pool: &PgPool, cap: u32) -> Result<Overview> {
        self.overview_unchecked(pool, cap).await.map_err(|e| self.names().not_migrated(e))
    }

    async fn overview_unchecked(&self, pool: &PgPool, cap: u32) -> Result<Overview> {
        let names = self.names();
        let t = &names.outbox;
        let cap = i64::from(cap.max(1));
        let mut states = Vec::new();
        for state in EventState::ALL {
            // One more than the cap's worth of rows, newest first (the order of every state's
            // index, and of the primary key for published events, which have none: without
            // an order the planner reads a table of mostly published events sequentially):
            // the last tells that the count stopped at the cap.
            let rows: Vec<(String, i64, bool)> = sqlx::query_as(AssertSqlSafe(format!(
                "SELECT topic, count(*) FILTER (WHERE n <= $1), bool_or(n > $1) \
                 FROM (SELECT s.topic, row_number() OVER () AS n \
                       FROM (SELECT o.topic FROM {t} o WHERE {condition} ORDER BY o.id DESC LIMIT $1 + 1) s) c \
                 GROUP BY topic ORDER BY topic",
                condition = state
                    .condition()
                    .replace("status", "o.status")
                    .replace("next_attempt_at", "o.next_attempt_at"),
            )))
            .bind(cap)
            .fetch_all(pool)
            .await?;
            let at_least = rows.iter().any(|(_, _, beyond)| *beyond);
            states.push(StateCount {
                state,
                events: Capped { count: rows.iter().map(|(_, n, _)| n).sum(), at_least },
                by_topic: rows
                    .into_iter()
                    .filter(|(_, n, _)| *n > 0)
                    .map(|(topic, n, _)| (topic, n))
                    .collect(),
            });
        }
        // The oldest of each unpublished state is its lowest id.
        let oldest: Option<f64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT EXTRACT(EPOCH FROM now() - min(created_at))::float8 FROM ( \
               (SELECT created_at FROM {t} WHERE {pending} ORDER BY id LIMIT 1) \
               UNION ALL (SELECT created_at FROM {t} WHERE {retrying} ORDER BY next_attempt_at, id LIMIT 1) \
               UNION ALL (SELECT created_at FROM {t} WHERE {failed} ORDER BY id LIMIT 1)) o",
            pending = EventState::Pending.condition(),
            retrying = EventState::Retrying.condition(),
            failed = EventState::Failed.condition(),
        )))
        .fetch_one(pool)
        .await?;
        // A report stands until its `in_flight_until`; one of nothing in flight has none.
        let standing = "r.in_flight IS NOT NULL AND (r.in_flight_until IS NULL OR r.in_flight_until > now())";
        type Row = (Option<Uuid>, Option<String>, Option<f64>, i64, i64, Option<i64>);
        let relays: Vec<Row> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT coalesce(l.owner, r.relay_id), \
                    to_char(r.heartbeat_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), \
                    EXTRACT(EPOCH FROM now() - r.heartbeat_at)::float8, \
                    count(l.work_partition) FILTER (WHERE l.owner IS NOT NULL AND l.expires_at > now()), \
                    count(l.work_partition) FILTER (WHERE l.owner IS NULL OR l.expires_at <= now()), \
                    CASE WHEN {standing} THEN \
                      (SELECT coalesce(sum(n::bigint), 0)::bigint FROM jsonb_each_text(r.in_flight) t(topic, n)) END \
             FROM {leases} l FULL JOIN {relays} r ON r.relay_id = l.owner \
             GROUP BY 1, r.heartbeat_at, r.in_flight, r.in_flight_until \
             ORDER BY 4 DESC, 1",
            leases = names.leases,
            relays = names.relays,
        )))
        .fetch_all(pool)
        .await?;
        let relays = relays
            .into_iter()
            .map(
                |(
                    relay_id,
                    heartbeat_at,
                    heartbeat_age_seconds,
                    live_partitions,
                    expired_partitions,
                    in_flight,
                )| {
                    RelayLeases {
                        relay_id,
                        heartbeat_at,
                        heartbeat_age_seconds,
                        live_partitions,
                        expired_partitions,
                        in_flight,
                    }
                },
            )
            .collect();
        let by_topic: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT t.topic, sum(t.n::bigint)::bigint FROM {relays} r, jsonb_each_text(r.in_flight) t(topic, n) \
             WHERE {standing} GROUP BY t.topic HAVING sum(t.n::bigint) > 0 ORDER BY t.topic",
            relays = names.relays,
        )))
        .fetch_all(pool)
        .await?;
        let in_flight = InFlight {
            events: by_topic.iter().map(|(_, n)| n).sum(),
            by_topic: by_topic.into_iter().collect(),
        };
        Ok(Overview { states, cap, oldest_unpublished_age_seconds: oldest, in_flight, relays })
    }
}
