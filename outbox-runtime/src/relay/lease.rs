//! Work partition leases: which partitions this relay may publish, until when, and the
//! fencing token that every mark of a row must present.
//!
//! A relay renews its leases and takes a fair share of the partitions (`ceil(partitions /
//! live relays)`), releasing extras when more relays join and taking over the partitions of
//! a relay whose leases expired. Every change of owner increments the partition's token,
//! so a relay that lost a lease cannot mark rows there any more.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sqlx::{PgPool, SqlStr};
use uuid::Uuid;

use crate::error::Result;
use crate::table::{sql, Names};

/// One held lease.
#[derive(Debug, Clone, Copy)]
struct Held {
    token: i64,
    /// Local deadline, earlier than the database's `expires_at`: it is counted from before
    /// the statement that set `expires_at = now() + ttl` was sent.
    valid_until: Instant,
}

#[derive(Debug)]
struct Statements {
    heartbeat: SqlStr,
    live_relays: SqlStr,
    renew: SqlStr,
    acquire: SqlStr,
    release: SqlStr,
    forget_relay: SqlStr,
    count: SqlStr,
}

/// The leases of one relay.
#[derive(Debug)]
pub(crate) struct Leases {
    relay_id: Uuid,
    ttl: Duration,
    partitions: u32,
    held: BTreeMap<i32, Held>,
    sql: Statements,
}

/// What changed in one [`Leases::maintain`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Maintained {
    pub(crate) acquired: Vec<i32>,
    pub(crate) released: Vec<i32>,
    pub(crate) lost: Vec<i32>,
}

impl Leases {
    /// Leases of the relay `relay_id`; the number of partitions is read from the table.
    pub(crate) fn new(names: &Names, relay_id: Uuid, ttl: Duration) -> Self {
        let (leases, relays) = (&names.leases, &names.relays);
        let secs = "make_interval(secs => $2)";
        let sql = Statements {
            heartbeat: sql(format!(
                "INSERT INTO {relays} (relay_id, heartbeat_at) VALUES ($1, now()) \
                 ON CONFLICT (relay_id) DO UPDATE SET heartbeat_at = now()"
            )),
            live_relays: sql(format!(
                "SELECT count(*) FROM {relays} WHERE heartbeat_at > now() - make_interval(secs => $1)"
            )),
            renew: sql(format!(
                "UPDATE {leases} l SET expires_at = now() + {secs} \
                 FROM unnest($3::int[], $4::bigint[]) AS mine(p, tok) \
                 WHERE l.work_partition = mine.p AND l.token = mine.tok AND l.owner = $1 \
                 RETURNING l.work_partition"
            )),
            acquire: sql(format!(
                "UPDATE {leases} l SET owner = $1, token = l.token + 1, expires_at = now() + {secs} \
                 FROM (SELECT work_partition FROM {leases} \
                       WHERE owner IS NULL OR expires_at <= now() \
                       ORDER BY random() LIMIT $3 FOR UPDATE SKIP LOCKED) free \
                 WHERE l.work_partition = free.work_partition \
                 RETURNING l.work_partition, l.token"
            )),
            release: sql(format!(
                "UPDATE {leases} SET owner = NULL, expires_at = '-infinity' \
                 WHERE owner = $1 AND work_partition = ANY($2)"
            )),
            forget_relay: sql(format!(
                "DELETE FROM {relays} WHERE relay_id = $1 OR heartbeat_at < now() - make_interval(secs => $2)"
            )),
            count: sql(format!("SELECT count(*) FROM {leases}")),
        };
        Leases { relay_id, ttl, partitions: 0, held: BTreeMap::new(), sql }
    }

    /// Renews held leases, then takes or gives back partitions towards a fair share.
    pub(crate) async fn maintain(&mut self, pool: &PgPool) -> Result<Maintained> {
        if self.partitions == 0 {
            // The table, not this relay's configuration, says how many partitions exist.
            let count: i64 = sqlx::query_scalar(self.sql.count.clone()).fetch_one(pool).await?;
            self.partitions = u32::try_from(count).unwrap_or(0);
        }
        let mut changes = Maintained::default();
        let ttl = self.ttl.as_secs_f64();
        let started = Instant::now();
        sqlx::query(self.sql.heartbeat.clone()).bind(self.relay_id).execute(pool).await?;

        if !self.held.is_empty() {
            let (parts, tokens) = self.fence();
            let renewed: Vec<i32> = sqlx::query_scalar(self.sql.renew.clone())
                .bind(self.relay_id)
                .bind(ttl)
                .bind(&parts)
                .bind(&tokens)
                .fetch_all(pool)
                .await?;
            for p in parts {
                if renewed.contains(&p) {
                    if let Some(held) = self.held.get_mut(&p) {
                        held.valid_until = started + self.ttl;
                    }
                } else {
                    self.held.remove(&p);
                    changes.lost.push(p);
                }
            }
        }

        let live: i64 = sqlx::query_scalar(self.sql.live_relays.clone()).bind(ttl).fetch_one(pool).await?;
        let live = u32::try_from(live.max(1)).unwrap_or(u32::MAX);
        let share = self.partitions.div_ceil(live) as usize;
        if self.held.len() > share {
            let extra: Vec<i32> = self.held.keys().rev().take(self.held.len() - share).copied().collect();
            sqlx::query(self.sql.release.clone()).bind(self.relay_id).bind(&extra).execute(pool).await?;
            for p in &extra {
                self.held.remove(p);
            }
            changes.released = extra;
        } else if self.held.len() < share {
            let want = i64::try_from(share - self.held.len()).unwrap_or(0);
            let started = Instant::now();
            let got: Vec<(i32, i64)> = sqlx::query_as(self.sql.acquire.clone())
                .bind(self.relay_id)
                .bind(ttl)
                .bind(want)
                .fetch_all(pool)
                .await?;
            for (p, token) in got {
                self.held.insert(p, Held { token, valid_until: started + self.ttl });
                changes.acquired.push(p);
            }
        }
        Ok(changes)
    }

    /// Announces this relay (its heartbeat) and returns its fair share of the partitions,
    /// `ceil(partitions / live relays)`, without leasing any: what a relay of
    /// [`ClaimMode::HoldLocks`](super::ClaimMode::HoldLocks) locks per batch at most, so that
    /// relays of either mode sharing the outbox all find partitions free.
    pub(crate) async fn share(&mut self, pool: &PgPool) -> Result<usize> {
        if self.partitions == 0 {
            let count: i64 = sqlx::query_scalar(self.sql.count.clone()).fetch_one(pool).await?;
            self.partitions = u32::try_from(count).unwrap_or(0);
        }
        sqlx::query(self.sql.heartbeat.clone()).bind(self.relay_id).execute(pool).await?;
        let live: i64 = sqlx::query_scalar(self.sql.live_relays.clone())
            .bind(self.ttl.as_secs_f64())
            .fetch_one(pool)
            .await?;
        let live = u32::try_from(live.max(1)).unwrap_or(u32::MAX);
        Ok(self.partitions.div_ceil(live) as usize)
    }

    /// Gives every lease back at once (shutdown), so others need not wait for expiry.
    pub(crate) async fn release_all(&mut self, pool: &PgPool) -> Result<()> {
        let parts: Vec<i32> = self.held.keys().copied().collect();
        self.held.clear();
        sqlx::query(self.sql.release.clone()).bind(self.relay_id).bind(&parts).execute(pool).await?;
        sqlx::query(self.sql.forget_relay.clone())
            .bind(self.relay_id)
            .bind(self.ttl.as_secs_f64() * 10.0)
            .execute(pool)
            .await?;
        Ok(())
    }

    /// The partitions held now (locally still valid for at least `margin`).
    pub(crate) fn partitions(&self, margin: Duration) -> Vec<i32> {
        let now = Instant::now();
        self.held.iter().filter(|(_, h)| h.valid_until > now + margin).map(|(p, _)| *p).collect()
    }

    /// Whether `partition` is held and locally valid for at least `margin` more.
    pub(crate) fn is_valid(&self, partition: i32, margin: Duration) -> bool {
        self.held.get(&partition).is_some_and(|h| h.valid_until > Instant::now() + margin)
    }

    /// The (partition, token) pairs a mark must present.
    pub(crate) fn fence(&self) -> (Vec<i32>, Vec<i64>) {
        self.held.iter().map(|(p, h)| (*p, h.token)).unzip()
    }

    pub(crate) fn relay_id(&self) -> Uuid {
        self.relay_id
    }

    pub(crate) fn held_count(&self) -> usize {
        self.held.len()
    }
}
