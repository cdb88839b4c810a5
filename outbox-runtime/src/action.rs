//! Operators' actions by filter, shared by the outbox ([`Ops::retry_failed`],
//! [`Ops::discard_failed`]) and the inbox ([`InboxAdmin::retry_matching`],
//! [`InboxAdmin::discard_matching`]): which rows an [`ActionFilter`] takes, what an
//! action did ([`ActionReport`]), and the audit row every action leaves.
//!
//! Every action works the same way: the ids of the rows matching when it starts are read
//! once (a row that matches later is not swept in), then changed in transactions of
//! [`ACTION_BATCH`] rows, each checking again that its row is still in the state the
//! filter matched (a row that is not is skipped and counted as such). The audit row
//! (`<table>_audit`) is written with the first transaction and its counts kept with every
//! later one, so it says what the database holds even when the action is interrupted. A
//! repeated action finds nothing left to do.
//!
//! [`Ops::retry_failed`]: crate::ops::Ops::retry_failed
//! [`Ops::discard_failed`]: crate::ops::Ops::discard_failed
//! [`InboxAdmin::retry_matching`]: crate::inbox::InboxAdmin::retry_matching
//! [`InboxAdmin::discard_matching`]: crate::inbox::InboxAdmin::discard_matching

mod cause;
pub(crate) use cause::cause_sql;

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgConnection};

use crate::error::Result;

/// Rows changed per transaction by an action.
pub const ACTION_BATCH: usize = 500;

/// Ids listed in an [`ActionReport`] at most.
pub const LISTED_IDS: usize = 10;

/// Which failed events (outbox) or parked messages (inbox) an operator's action takes:
/// every criterion given must hold; none given matches every one. Build it with the
/// setters: `ActionFilter::default().event_type("invoice.issued").topic("invoices")`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ActionFilter {
    /// Only these event types (any of them); empty: every type.
    pub event_types: Vec<String>,
    /// Only this topic.
    pub topic: Option<String>,
    /// Only rows whose reason (the outbox's last error, the inbox's parked reason)
    /// contains this text, compared without regard to case.
    pub reason_contains: Option<String>,
    /// Failed (outbox) or parked (inbox) at or after this time. Events failed before the
    /// outbox kept the time of failure count from their creation.
    pub since: Option<SystemTime>,
    /// Failed or parked before this time.
    pub until: Option<SystemTime>,
    /// Only rows of this cause exactly: a failure group's, its reason with numbers and
    /// ids left out.
    pub cause: Option<String>,
    /// Only these outbox events (any of them), by event id: an action on one event by id
    /// takes the same bounded, audited path as one by filter. Outbox actions only.
    pub event_ids: Vec<uuid::Uuid>,
    /// Only these parked messages (any of them), by their parked id. Inbox actions only.
    pub parked_ids: Vec<i64>,
}

impl ActionFilter {
    /// Adds an event type (repeatable: any of them matches).
    #[must_use]
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_types.push(event_type.into());
        self
    }

    /// Only this topic.
    #[must_use]
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// Only rows whose reason contains `text` (without regard to case).
    #[must_use]
    pub fn reason_contains(mut self, text: impl Into<String>) -> Self {
        self.reason_contains = Some(text.into());
        self
    }

    /// From this time on (inclusive).
    #[must_use]
    pub fn since(mut self, time: impl Into<Option<SystemTime>>) -> Self {
        self.since = time.into();
        self
    }

    /// Before this time.
    #[must_use]
    pub fn until(mut self, time: impl Into<Option<SystemTime>>) -> Self {
        self.until = time.into();
        self
    }

    /// Only rows of failure group `cause` (a [`FailureGroup`](crate::ops::FailureGroup)'s
    /// cause), exactly.
    #[must_use]
    pub fn cause(mut self, cause: impl Into<String>) -> Self {
        self.cause = Some(cause.into());
        self
    }

    /// Adds an outbox event by its id (repeatable: any of them matches).
    #[must_use]
    pub fn event_id(mut self, event_id: uuid::Uuid) -> Self {
        self.event_ids.push(event_id);
        self
    }

    /// Adds a parked message by its id (repeatable: any of them matches).
    #[must_use]
    pub fn parked_id(mut self, id: i64) -> Self {
        self.parked_ids.push(id);
        self
    }

    /// The condition on the ids given, on the id column `column` of a table aliased `p`:
    /// `p.event_id` for the outbox (`outbox` true), `p.id` for the inbox's parked table.
    /// The ids are typed values written into the statement (a uuid's or an integer's text
    /// holds nothing to escape). Refuses the other table's ids.
    pub(crate) fn ids_condition(&self, outbox: bool) -> Result<String> {
        let (wrong, other) = if outbox {
            (!self.parked_ids.is_empty(), "parked message ids select inbox messages, not outbox events")
        } else {
            (
                !self.event_ids.is_empty(),
                "event ids select outbox events; an inbox action takes parked message ids",
            )
        };
        if wrong {
            return Err(crate::error::Error::Config(format!("the action's filter: {other}")));
        }
        Ok(match self.ids_array() {
            Some(array) if outbox => format!("p.event_id = ANY({array})"),
            Some(array) => format!("p.id = ANY({array})"),
            None => "true".to_owned(),
        })
    }

    /// The ids given as an SQL array literal, `None` when none are.
    fn ids_array(&self) -> Option<String> {
        if !self.event_ids.is_empty() {
            let ids: Vec<String> = self.event_ids.iter().map(ToString::to_string).collect();
            Some(format!("'{{{}}}'::uuid[]", ids.join(",")))
        } else if !self.parked_ids.is_empty() {
            let ids: Vec<String> = self.parked_ids.iter().map(ToString::to_string).collect();
            Some(format!("'{{{}}}'::bigint[]", ids.join(",")))
        } else {
            None
        }
    }

    /// Refuses a filter that cannot be what its caller meant: an empty event type, topic or
    /// reason text (an unset shell variable would otherwise match every row, since every
    /// reason contains ""), or `until` not after `since`.
    pub(crate) fn validate(&self) -> Result<()> {
        let empty =
            |what: &str| Err(crate::error::Error::Config(format!("the action's filter: {what} is empty")));
        if self.event_types.iter().any(|t| t.trim().is_empty()) {
            return empty("an event type");
        }
        if self.topic.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return empty("the topic");
        }
        if self.reason_contains.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return empty("the reason text");
        }
        if self.cause.as_deref().is_some_and(str::is_empty) {
            return empty("the cause");
        }
        if let (Some(since), Some(until)) = (self.since, self.until) {
            if until <= since {
                return Err(crate::error::Error::Config(
                    "the action's filter: until is not after since".to_owned(),
                ));
            }
        }
        Ok(())
    }

    /// The SQL condition on a table aliased `p` with its parameters from `$first`: event
    /// types, topic, reason text, since, until, cause, in that order (see
    /// [`ActionFilter::binds`]): six parameters.
    pub(crate) fn condition(first: usize, reason: &str, time: &str) -> String {
        let [types, topic, text, since, until, cause] = [0, 1, 2, 3, 4, 5].map(|i| first + i);
        let cause_of = cause_sql(reason);
        let (since_at, until_at) = (at_micros(&format!("${since}")), at_micros(&format!("${until}")));
        format!(
            "(${types}::text[] IS NULL OR p.event_type = ANY(${types})) \
             AND (${topic}::text IS NULL OR p.topic = ${topic}) \
             AND (${text}::text IS NULL OR strpos(lower(coalesce({reason}, '')), lower(${text})) > 0) \
             AND (${since}::int8 IS NULL OR {time} >= {since_at}) \
             AND (${until}::int8 IS NULL OR {time} < {until_at}) \
             AND (${cause}::text IS NULL OR {cause_of} = ${cause})"
        )
    }

    /// The values of [`ActionFilter::condition`]'s parameters.
    pub(crate) fn binds(&self) -> Binds {
        (
            (!self.event_types.is_empty()).then(|| self.event_types.clone()),
            self.topic.clone(),
            self.reason_contains.clone(),
            self.since.map(epoch_micros),
            self.until.map(epoch_micros),
            self.cause.clone(),
        )
    }
}

/// [`ActionFilter::condition`]'s parameter values: event types, topic, reason text, since
/// and until ([`epoch_micros`]), cause.
pub(crate) type Binds =
    (Option<Vec<String>>, Option<String>, Option<String>, Option<i64>, Option<i64>, Option<String>);

/// An RFC 3339 UTC rendering of timestamp expression `t` (microseconds, `Z`).
pub(crate) fn rfc3339(t: &str) -> String {
    format!("to_char(({t}) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
}

/// What an operator's action found and did: counts read back from the database, not
/// what was asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ActionReport {
    /// `retry` or `discard`.
    pub action: &'static str,
    /// Nothing was changed: `matched` and `first` say what a real run would take.
    pub dry_run: bool,
    /// Rows matching the filter when the action started.
    pub matched: u64,
    /// Rows the action changed.
    pub applied: u64,
    /// Matched rows left alone because they were no longer in the matched state when
    /// their turn came (retried, discarded or released meanwhile; for the inbox, also a
    /// message held behind an earlier one of its key that is not released first).
    pub skipped: u64,
    /// The first matched ids, at most [`LISTED_IDS`]: event ids (outbox) or parked
    /// message ids (inbox).
    pub first: Vec<String>,
    /// The audit row written (none in a dry run).
    pub audit_id: Option<i64>,
}

/// `t` as whole microseconds since the Unix epoch (negative before it), rounded toward the
/// future, for [`at_micros`]. PostgreSQL keeps microseconds, so for every time `c` it
/// stores, `c >= t` holds exactly when `c >= up(t)`, and `c < t` exactly when `c < up(t)`:
/// a bound with nanoseconds filters as it reads. (Seconds as a float through
/// `to_timestamp` round to the nearest microsecond instead: a `since` 300 ns after an event
/// took the event.) A bound beyond what PostgreSQL stores filters as it reads too: one
/// before its first time (4713 BC) is taken as that time, one past 292,000 years from now
/// as the largest count of microseconds (294,247 AD), earlier and later than any row.
pub(crate) fn epoch_micros(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos().div_ceil(1000)).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_nanos() / 1000)
            .map_or(FIRST_MICROS, |m| (-m).max(FIRST_MICROS)),
    }
}

/// 4713-11-24 00:00:00 BC, PostgreSQL's first `timestamptz`, in microseconds: where
/// [`epoch_micros`] stops going back.
const FIRST_MICROS: i64 = -210_866_803_200_000_000;

/// [`at_micros`] for an audit row: a bound [`epoch_micros`] saturated at either end (the
/// CLI's `-infinity` and `infinity`, "from the beginning", "until the end") is recorded as
/// the infinity it stands for, not as 4713 BC or 294,247 AD.
pub(crate) fn audit_at(param: &str) -> String {
    format!(
        "CASE WHEN {param}::int8 <= {FIRST_MICROS} THEN timestamptz '-infinity' \
              WHEN {param}::int8 = {max} THEN timestamptz 'infinity' ELSE {at} END",
        max = i64::MAX,
        at = at_micros(param)
    )
}

/// The SQL `timestamptz` that the parameter `param`, an [`epoch_micros`], denotes, exactly:
/// whole seconds and the microseconds left, each a product PostgreSQL computes exactly
/// (it multiplies an interval in float8, exact below 2^53: one product of the whole count
/// would be exact only within 285 years of 1970).
pub(crate) fn at_micros(param: &str) -> String {
    format!(
        "(timestamptz 'epoch' + ({param}::int8 / 1000000) * interval '1 second' \
          + ({param}::int8 % 1000000) * interval '1 microsecond')"
    )
}

/// An action's audit row in `audit` (a quoted `<table>_audit`), written in its first
/// transaction and kept up to date in every later one.
pub(crate) struct Audit<'a> {
    pub(crate) table: &'a str,
    /// The inbox's consumer; `None` for the outbox.
    pub(crate) consumer: Option<&'a str>,
    pub(crate) actor: &'a str,
    pub(crate) action: &'static str,
    pub(crate) reason: Option<&'a str>,
}

impl Audit<'_> {
    /// Inserts the row: the filter as JSON (times as PostgreSQL prints them), `matched`.
    pub(crate) async fn start(
        &self,
        conn: &mut PgConnection,
        filter: &ActionFilter,
        matched: u64,
    ) -> Result<i64> {
        let consumer = if self.consumer.is_some() { "consumer, " } else { "" };
        let value = if self.consumer.is_some() { "$11, " } else { "" };
        let sql = format!(
            "INSERT INTO {} ({consumer}actor, action, reason, matched, filter) \
             VALUES ({value}$1, $2, $3, $4, jsonb_strip_nulls(jsonb_build_object('event_types', $5::text[], 'topic', $6::text, \
                 'reason_contains', $7::text, 'since', {since}, 'until', {until}, 'cause', $10::text, \
                 'ids', to_jsonb({ids})))) \
             RETURNING id",
            self.table,
            ids = filter.ids_array().unwrap_or_else(|| "NULL::text".to_owned()),
            since = audit_at("$8"),
            until = audit_at("$9"),
        );
        let (types, topic, text, since, until, cause) = filter.binds();
        let mut query = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(self.actor)
            .bind(self.action)
            .bind(self.reason)
            .bind(i64::try_from(matched).unwrap_or(i64::MAX))
            .bind(types)
            .bind(topic)
            .bind(text)
            .bind(since)
            .bind(until)
            .bind(cause);
        if let Some(consumer) = self.consumer {
            query = query.bind(consumer);
        }
        Ok(query.fetch_one(conn).await?)
    }

    /// Records an action by id that changed its one row (`shown`) in `conn`'s transaction:
    /// the row, with the id as its filter, and the report that says so.
    pub(crate) async fn one(
        &self,
        conn: &mut PgConnection,
        filter: ActionFilter,
        shown: String,
    ) -> Result<ActionReport> {
        let id = self.start(&mut *conn, &filter, 1).await?;
        self.add(conn, id, 1, 0).await?;
        Ok(ActionReport {
            action: self.action,
            dry_run: false,
            matched: 1,
            applied: 1,
            skipped: 0,
            first: vec![shown],
            audit_id: Some(id),
        })
    }

    /// Adds one batch's counts to row `id`.
    pub(crate) async fn add(
        &self,
        conn: &mut PgConnection,
        id: i64,
        applied: u64,
        skipped: u64,
    ) -> Result<()> {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET applied = applied + $2, skipped = skipped + $3 WHERE id = $1",
            self.table
        )))
        .bind(id)
        .bind(i64::try_from(applied).unwrap_or(i64::MAX))
        .bind(i64::try_from(skipped).unwrap_or(i64::MAX))
        .execute(conn)
        .await?;
        Ok(())
    }
}

/// The audit table's statement, for both migrations: `extra` are the columns before
/// `actor` (the inbox's consumer).
pub(crate) fn audit_table_sql(table: &str, extra: &str) -> String {
    format!(
        "-- What operators did by filter: one row per action, its counts kept by its batches.\n\
         CREATE TABLE {table} (\n\
         \x20   id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,\n\
         \x20   at       timestamptz NOT NULL DEFAULT now(),\n{extra}\
         \x20   actor    text NOT NULL,\n\
         \x20   action   text NOT NULL,\n\
         \x20   reason   text,\n\
         \x20   filter   jsonb NOT NULL,\n\
         \x20   matched  bigint NOT NULL,\n\
         \x20   applied  bigint NOT NULL DEFAULT 0,\n\
         \x20   skipped  bigint NOT NULL DEFAULT 0\n\
         );\n"
    )
}

/// One operator action as its audit table keeps it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct AuditEntry {
    /// Its row id: the page cursor.
    pub id: i64,
    /// When it started (RFC 3339, UTC).
    pub at: String,
    /// The inbox consumer it acted on; `None` for the outbox.
    pub consumer: Option<String>,
    /// Who (the `actor` the caller gave).
    pub actor: String,
    /// `retry`, `discard` or `replay`.
    pub action: String,
    /// The reason given to a discard.
    pub reason: Option<String>,
    /// The filter it matched rows with, as JSON.
    pub filter: serde_json::Value,
    /// Rows matching when it started.
    pub matched: i64,
    /// Rows it changed so far (kept by every batch).
    pub applied: i64,
    /// Matched rows it left alone.
    pub skipped: i64,
}

impl sqlx::FromRow<'_, sqlx::postgres::PgRow> for AuditEntry {
    fn from_row(r: &sqlx::postgres::PgRow) -> sqlx::Result<Self> {
        use sqlx::Row as _;
        Ok(AuditEntry {
            id: r.try_get("id")?,
            at: r.try_get("at")?,
            consumer: r.try_get("consumer")?,
            actor: r.try_get("actor")?,
            action: r.try_get("action")?,
            reason: r.try_get("reason")?,
            filter: r.try_get("filter")?,
            matched: r.try_get("matched")?,
            applied: r.try_get("applied")?,
            skipped: r.try_get("skipped")?,
        })
    }
}

/// Rows listed per page at most, by every browsing call (events, inbox records, parked
/// messages, audit entries).
pub const MAX_PAGE: u32 = 500;

/// A page of audit entries, newest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct AuditPage {
    /// The entries.
    pub entries: Vec<AuditEntry>,
    /// The cursor of the next page (entries with a lower id); `None` on the last page.
    pub next: Option<i64>,
}

/// A page of audit table `table` (of the inbox's `consumer`, when given), entries below id
/// `before`, at most `limit` (1 to [`MAX_PAGE`]).
pub(crate) async fn audit_page(
    pool: &sqlx::PgPool,
    table: &str,
    consumer: Option<&str>,
    before: Option<i64>,
    limit: u32,
) -> Result<AuditPage> {
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(crate::error::Error::Config(format!(
            "the audit page: limit {limit} is not between 1 and {}",
            MAX_PAGE
        )));
    }
    let (column, condition) =
        if consumer.is_some() { ("a.consumer", "a.consumer = $2") } else { ("NULL::text", "true") };
    let sql = format!(
        "SELECT a.id, {at} AS at, {column} AS consumer, a.actor, a.action, a.reason, a.filter, a.matched, a.applied, \
                a.skipped \
         FROM {table} a WHERE ($1::bigint IS NULL OR a.id < $1) AND {condition} ORDER BY a.id DESC LIMIT {limit}",
        at = rfc3339("a.at"),
        limit = limit + 1
    );
    let mut query = sqlx::query_as::<_, AuditEntry>(AssertSqlSafe(sql)).bind(before);
    if let Some(consumer) = consumer {
        query = query.bind(consumer);
    }
    let mut entries = query.fetch_all(pool).await?;
    let next = if entries.len() > limit as usize {
        entries.truncate(limit as usize);
        entries.last().map(|e| e.id)
    } else {
        None
    };
    Ok(AuditPage { entries, next })
}
