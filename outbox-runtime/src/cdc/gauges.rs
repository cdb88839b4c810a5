//! The slot's gauges, read from `pg_replication_slots` while a session streams: retained
//! WAL, confirmed lag, time since the confirmed position moved, whether the slot is lost,
//! and a forecast of the time left until `max_slot_wal_keep_size` is reached. The same
//! readings tell the session when the server is shutting down.

use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use super::setup::SlotStatus;
use super::CdcConfig;
use crate::error::{server_stopping, Error};

/// How often the slot is read.
pub(crate) const EVERY: Duration = Duration::from_secs(5);

/// What the forecast and the confirmation clock remember between readings.
#[derive(Debug, Default)]
pub(crate) struct Forecast {
    last: Option<(Instant, i64)>,
    confirmed: Option<(String, Instant)>,
}

impl Forecast {
    /// Seconds until the slot's retained WAL reaches its limit at the rate it grew since the
    /// last reading; `+Inf` when it is not growing or has no limit.
    pub(crate) fn seconds_to_limit(&mut self, now: Instant, status: &SlotStatus) -> f64 {
        let retained = status.retained_bytes.unwrap_or(0);
        let rate = self.last.map(|(then, before)| {
            let seconds = now.duration_since(then).as_secs_f64();
            if seconds > 0.0 {
                (retained - before) as f64 / seconds
            } else {
                0.0
            }
        });
        self.last = Some((now, retained));
        match (status.safe_wal_size, rate) {
            (Some(left), Some(rate)) if rate > 0.0 => (left.max(0) as f64) / rate,
            _ => f64::INFINITY,
        }
    }

    /// Seconds since the confirmed position last moved, 0 while nothing waits to be confirmed.
    pub(crate) fn since_confirmed(&mut self, now: Instant, status: &SlotStatus) -> f64 {
        let position = status.confirmed_flush_lsn.clone().unwrap_or_default();
        let since = match &self.confirmed {
            Some((last, at)) if *last == position => *at,
            _ => now,
        };
        self.confirmed = Some((position, since));
        if status.confirmed_lag_bytes.unwrap_or(0) > 0 {
            now.duration_since(since).as_secs_f64()
        } else {
            0.0
        }
    }
}

/// Sets the slot's gauges every [`EVERY`] until `stop`, or until the server says that it is
/// shutting down: then it returns why, and the session ends its stream.
///
/// A walsender exits at shutdown only once its client confirmed everything it sent, and
/// asks with a keepalive; a relay whose memory budget is full (Kafka down) does not read the
/// stream, so that request waits in the socket behind what the replication client has read
/// ahead, and the server's shutdown waits with it. A connection of the relay's own still
/// hears of the shutdown: the server terminates it (57P01) and refuses a new one (57P03).
/// The readings take a connection of their own, not one of the pool: sqlx's pool keeps
/// connecting through 57P03 until its acquire timeout, and a pool that the relay's other
/// work keeps busy would hold the readings back.
pub(crate) async fn record(pool: PgPool, cdc: CdcConfig, stop: CancellationToken) -> Option<String> {
    let mut forecast = Forecast::default();
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut connection: Option<PgConnection> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return None,
        }
        let mut read = read_on(&pool, &cdc, &mut connection).await;
        if read.is_err() && connection.is_none() {
            // The connection failed: a new one tells whether the server is going away.
            read = read_on(&pool, &cdc, &mut connection).await;
        }
        match read {
            Ok(Some(status)) => {
                let now = Instant::now();
                let lost = status.wal_status.as_deref() == Some("lost");
                if lost {
                    error!(slot = %cdc.slot, stage = "slot", "the replication slot is lost: recover with a backfill");
                }
                metrics::gauge!(crate::metrics::CDC_LOST).set(f64::from(u8::from(lost)));
                metrics::gauge!(crate::metrics::CDC_RETAINED).set(status.retained_bytes.unwrap_or(0) as f64);
                metrics::gauge!(crate::metrics::CDC_LAG_BYTES)
                    .set(status.confirmed_lag_bytes.unwrap_or(0) as f64);
                metrics::gauge!(crate::metrics::CDC_SINCE_CONFIRMED)
                    .set(forecast.since_confirmed(now, &status));
                metrics::gauge!(crate::metrics::CDC_TO_LIMIT).set(forecast.seconds_to_limit(now, &status));
            }
            Ok(None) => debug!(slot = %cdc.slot, stage = "slot", "the slot does not exist"),
            Err(Error::Database(error)) if server_stopping(&error) => {
                warn!(slot = %cdc.slot, stage = "slot", %error, "PostgreSQL is shutting down: ending the stream");
                return Some(format!("PostgreSQL is shutting down ({error})"));
            }
            Err(error) => debug!(slot = %cdc.slot, stage = "slot", %error, "cannot read the slot's state"),
        }
    }
}

/// Reads the slot on `connection`, connected first (with the pool's settings, within
/// [`EVERY`]) when there is none; a connection that fails is dropped.
async fn read_on(
    pool: &PgPool,
    cdc: &CdcConfig,
    connection: &mut Option<PgConnection>,
) -> crate::Result<Option<SlotStatus>> {
    let mut open = match connection.take() {
        Some(open) => open,
        None => {
            match tokio::time::timeout(EVERY, PgConnection::connect_with(&pool.connect_options())).await {
                Ok(connected) => connected?,
                Err(_) => return Err(Error::Replication(format!("no connection within {EVERY:?}"))),
            }
        }
    };
    let read = cdc.status_on(&mut open).await;
    if read.is_ok() {
        *connection = Some(open);
    }
    read
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(retained: i64, safe: Option<i64>, confirmed: &str, lag: i64) -> SlotStatus {
        SlotStatus {
            slot: "s".into(),
            active: true,
            active_pid: None,
            wal_status: Some("reserved".into()),
            restart_lsn: None,
            confirmed_flush_lsn: Some(confirmed.into()),
            retained_bytes: Some(retained),
            confirmed_lag_bytes: Some(lag),
            safe_wal_size: safe,
        }
    }

    #[test]
    fn the_forecast_divides_what_is_left_by_the_growth_rate() {
        let mut f = Forecast::default();
        let t0 = Instant::now();
        assert!(f.seconds_to_limit(t0, &status(1000, Some(10_000), "0/1", 0)).is_infinite(), "one reading");
        let t1 = t0 + Duration::from_secs(10);
        let left = f.seconds_to_limit(t1, &status(2000, Some(9_000), "0/1", 0));
        assert!((left - 90.0).abs() < 1e-6, "100 B/s with 9,000 B left: {left}");
        assert!(f
            .seconds_to_limit(t1 + Duration::from_secs(1), &status(2000, Some(9_000), "0/1", 0))
            .is_infinite());
        assert!(
            f.seconds_to_limit(t1 + Duration::from_secs(2), &status(5000, None, "0/1", 0)).is_infinite(),
            "no limit"
        );
    }

    #[test]
    fn the_confirmation_clock_runs_only_while_something_waits() {
        let mut f = Forecast::default();
        let t0 = Instant::now();
        assert_eq!(f.since_confirmed(t0, &status(0, None, "0/1", 500)), 0.0);
        let waited = f.since_confirmed(t0 + Duration::from_secs(7), &status(0, None, "0/1", 900));
        assert!((waited - 7.0).abs() < 1e-6, "{waited}");
        assert_eq!(
            f.since_confirmed(t0 + Duration::from_secs(8), &status(0, None, "0/2", 100)),
            0.0,
            "moved"
        );
        assert_eq!(
            f.since_confirmed(t0 + Duration::from_secs(9), &status(0, None, "0/2", 0)),
            0.0,
            "caught up"
        );
    }
}
