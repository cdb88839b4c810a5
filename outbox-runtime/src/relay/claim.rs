//! Reading due events of held partitions, and recording what happened to them, fenced by
//! the lease tokens.

use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, PgPool, Row as _, SqlStr};
use uuid::Uuid;

use crate::error::Result;
use crate::migrate::PENDING_BY_ID;
use crate::table::{sql, Names};

use super::cursor::FreshCursor;
#[cfg(test)]
use super::plan::{array_literal, explained, EXPLAINED_DONE};
use super::plan::{CLAIM_PLAN, CLAIM_PLAN_PARTITIONED};

/// One outbox row as the relay publishes it.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) id: i64,
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) aggregate_version: Option<i64>,
    pub(crate) event_type: String,
    pub(crate) schema_version: i32,
    pub(crate) topic: String,
    pub(crate) payload: String,
    pub(crate) headers: String,
    /// `created_at` as RFC 3339 UTC, for `ce_time`; empty when RFC 3339 cannot express it
    /// (infinite, before year 1 or after 9999: the row is parked, see `publish::enqueue`).
    pub(crate) created_at: String,
    pub(crate) attempts: i32,
    pub(crate) work_partition: i32,
}

impl FromRow<'_, PgRow> for Row {
    fn from_row(r: &PgRow) -> sqlx::Result<Self> {
        Ok(Row {
            id: r.try_get("id")?,
            event_id: r.try_get("event_id")?,
            aggregate_type: r.try_get("aggregate_type")?,
            aggregate_id: r.try_get("aggregate_id")?,
            aggregate_version: r.try_get("aggregate_version")?,
            event_type: r.try_get("event_type")?,
            schema_version: r.try_get("schema_version")?,
            topic: r.try_get("topic")?,
            payload: r.try_get("payload")?,
            headers: r.try_get("headers")?,
            created_at: r.try_get("created_at")?,
            attempts: r.try_get("attempts")?,
            work_partition: r.try_get("work_partition")?,
        })
    }
}

/// Where Kafka put a published record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    pub(crate) partition: i32,
    pub(crate) offset: i64,
}

#[derive(Debug)]
pub(crate) struct Statements {
    /// The polling relay's claim: fresh rows in id order and rows whose retry is due in
    /// order of due time, each walk its own index under [`CLAIM_PLAN`], in one statement
    /// (one snapshot: an operator's action committing between two statements could show
    /// a row to neither walk or to both), merged by id and cut to the limit in [`merge`].
    /// The table path's claim is one walk (its rows are few: the `touched` indexes).
    claim: SqlStr,
    /// The claim of the relay that holds locks across the send: the same rows, locked
    /// `FOR UPDATE` until its transaction ends (an operator's `retry` or `discard` of one
    /// waits for the send).
    claim_locked: SqlStr,
    /// The whole outbox's claim (under [`CLAIM_PLAN`]), not the table path's (which reads
    /// the small `touched` and `blocked` indexes as the planner likes).
    whole: bool,
    /// The planner settings of the whole outbox's claim: [`CLAIM_PLAN`], or
    /// [`CLAIM_PLAN_PARTITIONED`] for a partitioned outbox.
    plan: &'static str,
    /// Free work partitions (no live lease), at most the relay's share, locked
    /// `FOR UPDATE SKIP LOCKED` for the transaction of the relay that holds locks: relays of
    /// either model never publish one partition at once.
    lock_partitions: SqlStr,
    pub(super) fence: SqlStr,
    pub(super) published: SqlStr,
    pub(super) retry: SqlStr,
    pub(super) failed: SqlStr,
}

/// Row `alias` is not one of `$3`, the rows whose mark is being written, by binary search
/// (`width_bucket` over the sorted ids: the bucket's lower bound is the row's id if it is
/// one of them; bucket 0, below the first, indexes no element and gives NULL). `<> ALL($3)`
/// compared every row the claim read with every id of the previous batch: 2,000 × 4,000
/// comparisons made a pipelined claim of 2,000 rows take twice as long as the claim alone.
/// [`Statements::claim_in`] sorts the ids.
fn not_marking(alias: &str) -> String {
    format!("$3[width_bucket({alias}.id, $3)] IS DISTINCT FROM {alias}.id")
}

/// What the change-data-capture relay's table path claims, besides what the polling relay does.
fn table_path_scope() -> String {
    format!("AND {} ", crate::migrate::TOUCHED)
}

impl Statements {
    pub(crate) fn new(names: &Names) -> Self {
        Self::with_scope(names, "", false)
    }

    /// [`Statements::new`] for a partitioned outbox: each per-aggregate probe bounded below
    /// by the lowest open id ([`open_floor_sql`](crate::migrate::open_floor_sql)), so
    /// that it reads the partitions that can hold an open row and no older one; each mark
    /// bounded by its batch's lowest and highest id, so that it reads their partitions only.
    /// The same rows either way: the bounds only leave out partitions with none.
    pub(crate) fn partitioned(names: &Names) -> Self {
        Self::with_scope(names, "", true)
    }

    /// The change-data-capture relay's table path: only rows something touched since
    /// their append ([`crate::migrate::TOUCHED`]: handed over by the stream, waiting for a
    /// retry, put up again by an operator); a fresh row is the stream's.
    #[cfg(feature = "cdc")]
    pub(crate) fn table_path(names: &Names) -> Self {
        Self::with_scope(names, &table_path_scope(), false)
    }

    /// These statements for a partitioned outbox ([`Statements::partitioned`], or the
    /// table path's bounded the same way).
    pub(crate) fn on_partitions(&self, names: &Names) -> Self {
        if self.whole {
            Self::partitioned(names)
        } else {
            Self::with_scope(names, &table_path_scope(), true)
        }
    }

    fn with_scope(names: &Names, scope: &str, partitioned: bool) -> Self {
        let (outbox, leases) = (&names.outbox, &names.leases);
        let floor = |alias: &str| {
            if partitioned {
                format!(" AND {alias}.id >= {}", crate::migrate::open_floor_sql(outbox))
            } else {
                String::new()
            }
        };
        let (p_floor, q_floor) = (floor("p"), floor("q"));
        let ids = if partitioned {
            " AND o.id >= (SELECT min(b) FROM unnest($1::bigint[]) AS b) \
              AND o.id <= (SELECT max(b) FROM unnest($1::bigint[]) AS b)"
        } else {
            ""
        };
        let columns = "o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.aggregate_version, \
                        o.event_type, o.schema_version, o.topic, o.payload::text AS payload, \
                        o.headers::text AS headers, \
                        CASE WHEN o.created_at >= '0001-01-01 00:00:00+00' \
                              AND o.created_at < '10000-01-01 00:00:00+00' \
                             THEN to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') \
                             ELSE '' END AS created_at, \
                        o.attempts, o.work_partition";
        // Due pending rows of held partitions, skipping every aggregate whose earlier
        // event is failed or waits for a retry: per-aggregate order. The blocker condition
        // is the predicate of the `blocked` index, which keeps the check O(blocked rows)
        // whatever the backlog.
        let blocked_by = |rule: &str| {
            format!(
                "NOT EXISTS ( \
                   SELECT 1 FROM {outbox} p \
                   WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id \
                     AND p.id < o.id{p_floor} \
                     AND (p.status = 'failed' OR (p.status = 'pending' AND p.next_attempt_at > '-infinity')){rule})"
            )
        };
        let base = format!("o.status = 'pending' AND o.work_partition = ANY($1) AND {}", not_marking("o"));
        let (claim, claim_locked) = if scope.is_empty() {
            // Two walks. Head of line: any earlier row waiting for a retry blocks, due or
            // not, so a batch holds at most one such row per aggregate and nothing of the
            // aggregate after it; fresh rows come in id order. Merged by id and cut to the
            // limit, every aggregate's rows in a batch are a prefix of its open rows in id
            // order (an earlier fresh row left out means `limit` fresh rows before it,
            // so nothing later is in the batch either).
            //
            // The fresh walk reads a window of at most $5 entries of the `fresh` index of the
            // held partitions, from id $4 (see [`FreshCursor`]): rows held back behind an
            // earlier waiting or failed row of their aggregate stay in that index, and a
            // walk from the start read past every one of them on every claim. From a
            // cursor, a row is taken only if its aggregate has no open row before the
            // cursor either (one the walk passed, or one committed or put up again since):
            // that probe keeps the prefix rule for rows the window does not see.
            let order = blocked_by("");
            let window = |what: &str| {
                format!(
                    "SELECT {what} FROM {outbox} \
                     WHERE status = 'pending' AND next_attempt_at = '-infinity' AND work_partition = ANY($1) \
                       AND id >= $4 \
                     ORDER BY id LIMIT $5"
                )
            };
            let fresh_rule = format!(
                "{base} AND o.next_attempt_at = '-infinity' AND {order} \
                 AND ($4 = 0 OR NOT EXISTS ( \
                   SELECT 1 FROM {outbox} q \
                   WHERE q.aggregate_type = o.aggregate_type AND q.aggregate_id = o.aggregate_id \
                     AND q.id < $4{q_floor} AND q.status IN ('pending', 'failed')))"
            );
            // The window a subquery, not a CTE: its order carries through, so that the walk
            // stops at `limit` rows without reading the rest of it. Its rows as they are
            // (one walk of the index, as without a window); to lock, only the rows taken,
            // found again by id (a lock on the subquery would lock its whole window).
            let fresh = format!(
                "SELECT {columns}, true AS fresh_walk FROM ({}) AS o WHERE {fresh_rule} ORDER BY o.id LIMIT $2",
                window("*")
            );
            let fresh_locked = format!(
                "SELECT {columns}, true AS fresh_walk FROM ({}) AS w JOIN {outbox} o ON o.id = w.id \
                 WHERE {fresh_rule} ORDER BY o.id LIMIT $2 FOR UPDATE OF o",
                window("id")
            );
            // A row due for a retry has no earlier waiting or failed row ({order}), and no
            // earlier fresh row the fresh walk left out: one before its cursor or past its
            // window (committed late, or put up again by an operator). Fresh rows it took
            // come first in the batch, or the due row is cut with them.
            let due = format!(
                "SELECT {columns}, false AS fresh_walk FROM {outbox} o \
                 WHERE {base} AND o.next_attempt_at > '-infinity' AND o.next_attempt_at <= now() AND {order} \
                   AND NOT EXISTS ( \
                     SELECT 1 FROM {outbox} q \
                     WHERE q.aggregate_type = o.aggregate_type AND q.aggregate_id = o.aggregate_id \
                       AND q.id < o.id{q_floor} AND q.status IN ('pending', 'failed') AND q.next_attempt_at = '-infinity' \
                       AND {q_not_marking} AND NOT EXISTS (SELECT 1 FROM fresh f WHERE f.id = q.id)) \
                 ORDER BY o.next_attempt_at, o.id LIMIT $2",
                q_not_marking = not_marking("q"),
            );
            // The window's end and length, read only when the fresh walk took fewer than
            // `limit` rows (it then read its whole window); one more row, its row columns null.
            let nulls = "NULL::bigint, NULL::uuid, NULL::text, NULL::text, NULL::bigint, NULL::text, NULL::integer, \
                         NULL::text, NULL::text, NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::boolean";
            let both = |fresh: &str, lock: &str| {
                format!(
                    "WITH fresh AS ({fresh}), due AS ({due}{lock}) \
                     SELECT NULL::bigint AS window_end, NULL::bigint AS window_len, fresh.* FROM fresh \
                     UNION ALL SELECT NULL, NULL, due.* FROM due \
                     UNION ALL SELECT max(w.id), count(*), {nulls} FROM ({}) AS w \
                       WHERE (SELECT count(*) FROM fresh) < $2",
                    window("id")
                )
            };
            (both(&fresh, ""), both(&fresh_locked, " FOR UPDATE OF o"))
        } else {
            // The table path: few rows, one walk in id order. An earlier due row has a
            // lower id, so it is in the batch whenever a later one is; only one not yet
            // due blocks.
            let order = blocked_by(" AND (p.status = 'failed' OR p.next_attempt_at > now())");
            let claim = format!(
                "SELECT {columns} FROM {outbox} o \
                 WHERE {base} {scope}AND o.next_attempt_at <= now() AND {order} \
                 ORDER BY o.id LIMIT $2"
            );
            let locked = format!("{claim} FOR UPDATE OF o");
            (claim, locked)
        };
        Statements {
            claim: sql(claim),
            claim_locked: sql(claim_locked),
            whole: scope.is_empty(),
            plan: if partitioned { CLAIM_PLAN_PARTITIONED } else { CLAIM_PLAN },
            lock_partitions: sql(format!(
                "SELECT work_partition FROM {leases} WHERE owner IS NULL OR expires_at <= now() \
                 ORDER BY random() LIMIT $1 FOR UPDATE SKIP LOCKED"
            )),
            // The partitions this relay still holds with the same token, their lease rows
            // locked `FOR SHARE` until the marks commit: a takeover (an `UPDATE` of such a
            // row, or the acquire's `FOR UPDATE SKIP LOCKED`) cannot commit in between, even
            // while a mark waits on a row lock. Checked once per batch, not once per row.
            fence: sql(format!(
                "SELECT l.work_partition FROM {leases} l \
                 JOIN unnest($2::int[], $3::bigint[]) AS mine(p, tok) \
                   ON l.work_partition = mine.p AND l.token = mine.tok \
                 WHERE l.owner = $1 FOR SHARE OF l"
            )),
            published: sql(format!(
                "UPDATE {outbox} o SET status = 'published', published_at = now(), attempts = o.attempts + 1, \
                        last_error = NULL, kafka_partition = d.kp, kafka_offset = d.ko \
                 FROM unnest($1::bigint[], $2::int[], $3::bigint[]) AS d(id, kp, ko) \
                 WHERE o.id = ANY($1) AND o.id = d.id{ids} AND {PENDING_BY_ID} AND o.work_partition = ANY($4) \
                 RETURNING EXTRACT(EPOCH FROM o.published_at - o.created_at)::float8, o.attempts"
            )),
            retry: sql(format!(
                "UPDATE {outbox} o SET attempts = o.attempts + d.attempt, last_error = d.err, \
                        next_attempt_at = now() + d.delay_ms * interval '1 millisecond' \
                 FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::int[]) AS d(id, delay_ms, err, attempt) \
                 WHERE o.id = ANY($1) AND o.id = d.id{ids} AND {PENDING_BY_ID} AND o.work_partition = ANY($5)"
            )),
            failed: sql(format!(
                "UPDATE {outbox} o SET status = 'failed', attempts = o.attempts + 1, last_error = d.err, failed_at = now() \
                 FROM unnest($1::bigint[], $2::text[]) AS d(id, err) \
                 WHERE o.id = ANY($1) AND o.id = d.id{ids} AND {PENDING_BY_ID} AND o.work_partition = ANY($3)"
            )),
        }
    }

    /// Due rows of `partitions`, at most `limit`, leaving out `marking` (published rows
    /// whose mark is still being written), the walk of fresh rows from the start.
    #[cfg(any(test, feature = "bench-hooks"))]
    pub(crate) async fn claim(
        &self,
        pool: &PgPool,
        partitions: &[i32],
        limit: i64,
        marking: &[i64],
    ) -> Result<Vec<Row>> {
        self.claim_from(pool, partitions, limit, marking, &mut FreshCursor::default()).await
    }

    /// [`Statements::claim`], the walk of fresh rows from `cursor`, which it moves on.
    pub(crate) async fn claim_from(
        &self,
        pool: &PgPool,
        partitions: &[i32],
        limit: i64,
        marking: &[i64],
        cursor: &mut FreshCursor,
    ) -> Result<Vec<Row>> {
        let mut tx = pool.begin().await?;
        let rows = self.claim_in(&mut tx, &self.claim, partitions, limit, marking, Some(cursor)).await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// Runs a claim in `tx`, merges its walks and moves `cursor` on.
    async fn claim_in(
        &self,
        tx: &mut PgConnection,
        claim: &SqlStr,
        partitions: &[i32],
        limit: i64,
        marking: &[i64],
        cursor: Option<&mut FreshCursor>,
    ) -> Result<Vec<Row>> {
        if self.whole {
            sqlx::query(self.plan).execute(&mut *tx).await?;
        }
        // Sorted for the binary search of [`not_marking`].
        let mut marking = marking.to_vec();
        marking.sort_unstable();
        marking.dedup();
        let query = sqlx::query(claim.clone()).bind(partitions).bind(limit).bind(marking);
        if !self.whole {
            let found = query.fetch_all(&mut *tx).await?;
            let rows = found.iter().map(Row::from_row).collect::<sqlx::Result<Vec<Row>>>()?;
            return Ok(merge(rows, limit));
        }
        // Without a cursor (partitions that change every claim), the whole walk from the
        // start: a window read again each time could hide every row past it.
        let (from, window) = match &cursor {
            Some(cursor) => (cursor.from, FreshCursor::window(limit)),
            None => (0, i64::MAX),
        };
        let found = query.bind(from).bind(window).fetch_all(&mut *tx).await?;
        // The claimed rows, and the window's figures when the fresh walk read it all.
        let mut window_seen = None;
        let mut rows = Vec::with_capacity(found.len());
        let mut fresh = Vec::new();
        for r in &found {
            if let Some(len) = r.try_get::<Option<i64>, _>("window_len")? {
                window_seen = Some((r.try_get::<Option<i64>, _>("window_end")?, len));
            } else {
                let row = Row::from_row(r)?;
                if r.try_get::<bool, _>("fresh_walk")? {
                    fresh.push(row.id);
                }
                rows.push(row);
            }
        }
        let rows = merge(rows, limit);
        fresh.sort_unstable();
        if let Some(cursor) = cursor {
            let full_to = window_seen.and_then(|(end, len)| end.filter(|_| len >= window));
            let kept: Vec<i64> = rows.iter().map(|r| r.id).collect();
            cursor.moved(limit, full_to, &fresh, &kept);
        }
        Ok(rows)
    }

    /// In `tx`, the relay that holds locks across the send: locks up to `share` free work
    /// partitions, chosen at random, and then the due rows of those, at most `limit`; the
    /// locks last until `tx` ends. Returns the partitions and the rows (none when no
    /// partition is free).
    pub(crate) async fn claim_locked(
        &self,
        tx: &mut PgConnection,
        share: usize,
        limit: i64,
    ) -> Result<(Vec<i32>, Vec<Row>)> {
        let partitions: Vec<i32> = sqlx::query_scalar(self.lock_partitions.clone())
            .bind(i64::try_from(share).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await?;
        if partitions.is_empty() {
            return Ok((partitions, Vec::new()));
        }
        // Partitions chosen at random each time: no cursor to walk on from, so no window
        // either (a window full of held rows would be read again on every claim and the
        // rows past it never reached): the whole walk from the start, as before windows.
        let rows = self.claim_in(tx, &self.claim_locked, &partitions, limit, &[], None).await?;
        Ok((partitions, rows))
    }

    /// The plans and row counts of a claim's walks as they run (`EXPLAIN (ANALYZE, FORMAT
    /// JSON)`): fresh rows, then rows due for a retry.
    #[cfg(test)]
    pub(crate) async fn explain_claim(
        &self,
        pool: &PgPool,
        partitions: &[i32],
        limit: i64,
    ) -> Result<Vec<serde_json::Value>> {
        self.explain_claim_from(pool, partitions, limit, 0).await
    }

    /// [`Statements::explain_claim`] with the walk of fresh rows from id `from`.
    #[cfg(test)]
    pub(crate) async fn explain_claim_from(
        &self,
        pool: &PgPool,
        partitions: &[i32],
        limit: i64,
        from: i64,
    ) -> Result<Vec<serde_json::Value>> {
        let mut tx = pool.begin().await?;
        sqlx::query(self.plan).execute(&mut *tx).await?;
        let mut plans = Vec::new();
        for statement in self.claim_sql() {
            let args = [
                array_literal(partitions, "int"),
                limit.to_string(),
                array_literal::<i64>(&[], "bigint"),
                from.to_string(),
                FreshCursor::window(limit).to_string(),
            ];
            let (prepare, explain) = explained(statement, "int[], bigint, bigint[], bigint, bigint", &args);
            sqlx::raw_sql(sql(prepare)).execute(&mut *tx).await?;
            plans.push(sqlx::query_scalar(sql(explain)).fetch_one(&mut *tx).await?);
            sqlx::raw_sql(EXPLAINED_DONE).execute(&mut *tx).await?;
        }
        tx.rollback().await?;
        Ok(plans)
    }

    /// The claim's statements, for plan checks.
    #[cfg(test)]
    pub(crate) fn claim_sql(&self) -> Vec<&str> {
        vec![self.claim.as_str()]
    }
}

/// A claim's walks as one batch: the `limit` lowest ids of them, in id order.
fn merge(mut rows: Vec<Row>, limit: i64) -> Vec<Row> {
    rows.sort_unstable_by_key(|row| row.id);
    rows.dedup_by_key(|row| row.id);
    rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    rows
}
