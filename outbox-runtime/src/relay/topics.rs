//! What the relay knows of the topics it publishes to. Before a batch is sent, the topics
//! of its rows are checked against the cluster's metadata: an event whose topic the
//! cluster says does not exist is not sent (the send could only time out, with an error
//! that names nothing); it waits with an error naming the topic and, once the topic has
//! been missing for `missing_topic_timeout`, it is marked `failed` with that reason, which
//! holds back its aggregate's later events and nothing else (`outbox retry` releases it
//! once the topic exists).
//!
//! Only a definite answer counts: a topic is missing when a broker answers
//! `UNKNOWN_TOPIC_OR_PART` for it, and an event is failed only on such an answer received
//! `missing_topic_timeout` or more after the first. When the metadata cannot be read
//! (broker down, timeout), a topic never seen missing is sent to as usual and the send's own
//! error decides; one seen missing keeps waiting until an answer comes.
//!
//! The clock is shared: when a relay first finds a topic missing it records the time in
//! the outbox's `_topics` table (PostgreSQL's clock), and every relay counts from the
//! earliest such answer not followed by one that the topic exists. A restart or a
//! takeover goes on counting instead of starting again. When the table cannot be reached
//! the relay counts from its own first answer, as it would alone.
//!
//! Held rows are not attempts: their retry marks leave `attempts` alone, so `max_attempts`
//! never counts them, and they are asked about again within [`HELD_RETRY_MAX`], so an event
//! goes out soon after its topic is created.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::types::RDKafkaRespErr;
use sqlx::{PgPool, SqlStr};
use tracing::{debug, info, warn};

use crate::table::{sql, Names};

/// How long an existing topic is taken to exist without asking again. A send to it that
/// fails transiently makes the next batch ask at once.
const RECHECK_EXISTING: Duration = Duration::from_secs(60);

/// How often a missing topic is asked about again, at most.
const RECHECK_MISSING: Duration = Duration::from_secs(1);

/// The longest one metadata request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest a held row waits before its topic is asked about again.
pub(crate) const HELD_RETRY_MAX: Duration = Duration::from_secs(30);

/// A topic that no batch has asked about for this long is forgotten (its events are gone,
/// failed or with another relay), so that the gauge does not count it for ever.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// The `outbox_missing_topics` gauge counts topics confirmed missing this recently.
const MISSING_RECENTLY: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy)]
enum State {
    Exists {
        checked: Instant,
    },
    /// First found missing by this relay at `since`, last confirmed missing at `checked`,
    /// `answers` times; missing for `confirmed` at `checked`, by any relay's answers.
    Missing {
        since: Instant,
        checked: Instant,
        answers: u32,
        confirmed: Duration,
    },
}

impl State {
    fn checked(self) -> Instant {
        match self {
            State::Exists { checked } | State::Missing { checked, .. } => checked,
        }
    }
}

/// What to do with a row, given its topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Send it.
    Send,
    /// Do not send it; ask again after the delay, with this reason as its last error.
    Wait { reason: String, retry_in: Duration },
    /// Do not send it; mark it failed with this reason.
    Fail(String),
}

/// The `code` label of missing-topic outcomes in `outbox_publish_errors_total`; snake case,
/// so that no Kafka error code's name (`UnknownTopic`, ...) can be mistaken for it.
pub(crate) const MISSING_CODE: &str = "topic_missing";

/// The clock the relays share: `since` and `checked` of each missing topic in the
/// outbox's `_topics` table.
#[derive(Debug, Clone)]
pub(crate) struct SharedClock {
    pool: PgPool,
    /// Records answers that topics are missing; returns how long each has been.
    missing: SqlStr,
    /// Forgets topics found to exist, and rows no relay confirmed for [`FORGET_AFTER`].
    found: SqlStr,
}

impl SharedClock {
    pub(crate) fn new(pool: PgPool, names: &Names) -> Self {
        let topics = &names.topics;
        SharedClock {
            pool,
            // A row nobody confirmed for FORGET_AFTER starts again, as a relay's own memory
            // of the topic would.
            missing: sql(format!(
                "INSERT INTO {topics} AS t (topic, since, checked) SELECT m, now(), now() FROM unnest($1::text[]) AS m \
                 ON CONFLICT (topic) DO UPDATE SET checked = now(), \
                   since = CASE WHEN t.checked < now() - $2 * interval '1 second' THEN now() ELSE t.since END \
                 RETURNING topic, EXTRACT(EPOCH FROM now() - since)::float8"
            )),
            found: sql(format!(
                "DELETE FROM {topics} WHERE topic = ANY($1) OR checked < now() - $2 * interval '1 second'"
            )),
        }
    }

    async fn missing(&self, topics: &[String]) -> sqlx::Result<HashMap<String, Duration>> {
        let rows: Vec<(String, f64)> = sqlx::query_as(self.missing.clone())
            .bind(topics)
            .bind(FORGET_AFTER.as_secs_f64())
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(topic, seconds)| (topic, Duration::try_from_secs_f64(seconds).unwrap_or_default()))
            .collect())
    }

    async fn found(&self, topics: &[String]) -> sqlx::Result<()> {
        sqlx::query(self.found.clone())
            .bind(topics)
            .bind(FORGET_AFTER.as_secs_f64())
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

#[derive(Debug)]
pub(crate) struct Topics {
    state: HashMap<String, State>,
    missing_timeout: Duration,
    shared: Option<SharedClock>,
    /// When the shared clock last failed, for one warning a minute.
    shared_warned: Option<Instant>,
}

impl Topics {
    /// What a relay knows of its topics; with `shared`, the missing-topic clock is the
    /// relays' in the database.
    pub(crate) fn new(missing_timeout: Duration, shared: Option<SharedClock>) -> Self {
        Topics { state: HashMap::new(), missing_timeout, shared, shared_warned: None }
    }

    fn needs_check(&self, topic: &str) -> bool {
        match self.state.get(topic) {
            None => true,
            // Asked again every second while missing, and before any event is failed: an
            // event is failed only on an answer of this batch that came after the timeout.
            Some(State::Missing { checked, confirmed, .. }) => {
                checked.elapsed() >= RECHECK_MISSING || *confirmed >= self.missing_timeout
            }
            Some(State::Exists { checked }) => checked.elapsed() >= RECHECK_EXISTING,
        }
    }

    /// Asks the cluster about every topic among `topics` without a recent answer, within
    /// `budget` in all. Stops at the first request that gets no answer: the broker is
    /// unreachable and every other request would wait as long.
    pub(crate) async fn check<'t>(
        &mut self,
        producer: &FutureProducer,
        topics: impl IntoIterator<Item = &'t str>,
        budget: Duration,
    ) {
        let mut asked: Vec<String> =
            topics.into_iter().filter(|t| self.needs_check(t)).map(str::to_owned).collect();
        asked.sort_unstable();
        asked.dedup();
        self.state.retain(|_, state| state.checked().elapsed() < FORGET_AFTER);
        if asked.is_empty() {
            return;
        }
        let producer = producer.clone();
        let timeout = METADATA_TIMEOUT.min(budget);
        let answers = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let mut answers = Vec::with_capacity(asked.len());
            for topic in asked {
                let left = timeout.saturating_sub(started.elapsed());
                if left.is_zero() {
                    break;
                }
                match producer.client().fetch_metadata(Some(&topic), left) {
                    Ok(metadata) => {
                        let error = metadata.topics().iter().find(|t| t.name() == topic).and_then(|t| t.error());
                        answers.push((topic, error));
                    }
                    Err(error) => {
                        debug!(topic, stage = "metadata", %error, "cannot read the topic's metadata; sending as usual");
                        break;
                    }
                }
            }
            answers
        })
        .await
        .unwrap_or_default();
        let missing_now: Vec<String> = answers
            .iter()
            .filter(|(_, e)| *e == Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART))
            .map(|(t, _)| t.clone())
            .collect();
        let found: Vec<String> = answers
            .iter()
            .filter(|(t, e)| {
                *e != Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
                    && !matches!(self.state.get(t), Some(State::Exists { .. }))
            })
            .map(|(t, _)| t.clone())
            .collect();
        let shared = self.share(&missing_now, &found, timeout).await;
        for (topic, error) in answers {
            let missing = error == Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
            let previous = self.state.get(&topic).copied();
            let now = Instant::now();
            // Missing for as long as any relay's answers show, or this relay's own.
            let confirmed = |since: Instant| {
                now.duration_since(since).max(shared.get(&topic).copied().unwrap_or_default())
            };
            let state = match (missing, previous) {
                (true, Some(State::Missing { since, answers, .. })) => State::Missing {
                    since,
                    checked: now,
                    answers: answers.saturating_add(1),
                    confirmed: confirmed(since),
                },
                (true, _) => {
                    let confirmed = confirmed(now);
                    warn!(topic, stage = "metadata", fails_after = ?self.missing_timeout, missing_for = ?round(confirmed),
                          "the topic does not exist in the Kafka cluster: its events wait for it, then are marked failed");
                    State::Missing { since: now, checked: now, answers: 1, confirmed }
                }
                (false, Some(State::Missing { since, .. })) => {
                    info!(topic, stage = "metadata", missing_for = ?since.elapsed(), "the topic exists now; its events are sent");
                    State::Exists { checked: now }
                }
                (false, _) => State::Exists { checked: now },
            };
            self.state.insert(topic, state);
        }
    }

    /// Records these answers in the shared clock and returns how long each missing topic
    /// has been missing by it (nothing without a shared clock or when it fails: this
    /// relay's own answers count then).
    async fn share(
        &mut self,
        missing: &[String],
        found: &[String],
        within: Duration,
    ) -> HashMap<String, Duration> {
        let Some(shared) = &self.shared else { return HashMap::new() };
        // Bounded like the metadata requests: a slow database must not hold up the batch.
        let shared_clock = async {
            if !found.is_empty() {
                shared.found(found).await?;
            }
            if missing.is_empty() {
                Ok(HashMap::new())
            } else {
                shared.missing(missing).await
            }
        };
        let result = match tokio::time::timeout(within, shared_clock).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {within:?}")),
        };
        result.unwrap_or_else(|error| {
            if self.shared_warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                self.shared_warned = Some(Instant::now());
                warn!(stage = "metadata", %error,
                      "cannot read or record the relays' missing-topic clock; counting from this relay's own answers");
            }
            HashMap::new()
        })
    }

    /// What to do with a row of `topic` now.
    pub(crate) fn verdict(&self, topic: &str) -> Verdict {
        match self.state.get(topic) {
            Some(&State::Missing { checked, answers, confirmed, .. }) => {
                // Missing for as long as the answers show, not for as long as the clock says:
                // without a newer answer the topic may exist by now.
                let confirmed_for = confirmed;
                let fresh = checked.elapsed() < RECHECK_MISSING;
                if confirmed_for >= self.missing_timeout && fresh {
                    Verdict::Fail(format!(
                        "topic {topic} does not exist in the Kafka cluster (missing for {:?}, missing_topic_timeout \
                         {:?}): create it, then `outbox retry`",
                        round(confirmed_for),
                        self.missing_timeout
                    ))
                } else {
                    // Grows with the answers up to HELD_RETRY_MAX, and comes back by the
                    // timeout, so that the event fails on time.
                    let left = self.missing_timeout.saturating_sub(confirmed_for);
                    let retry_in = Duration::from_millis(500u64 << answers.min(6))
                        .min(HELD_RETRY_MAX)
                        .min(left.max(RECHECK_MISSING));
                    Verdict::Wait {
                        reason: format!(
                            "topic {topic} does not exist in the Kafka cluster; not sent, waiting for it (marked \
                             failed after {:?} missing)",
                            self.missing_timeout
                        ),
                        retry_in,
                    }
                }
            }
            _ => Verdict::Send,
        }
    }

    /// A send to `topic` failed transiently: ask about it again before the next batch
    /// (it may have been deleted).
    pub(crate) fn suspect(&mut self, topic: &str) {
        if let Some(State::Exists { .. }) = self.state.get(topic) {
            self.state.remove(topic);
        }
    }

    /// How many topics were confirmed missing in the last two minutes.
    pub(crate) fn missing(&self) -> usize {
        self.state
            .values()
            .filter(|s| matches!(s, State::Missing { checked, .. } if checked.elapsed() < MISSING_RECENTLY))
            .count()
    }
}

fn round(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The relays' missing-topic clock is in the database. A database that fails (here the
    /// table is not there) or does not answer (here its table is locked) must neither hold
    /// up the batch past its budget nor stop a missing topic from being counted: the relay
    /// counts from its own answers then, and fails the event on time.
    #[sqlx::test(migrations = false)]
    async fn a_shared_clock_that_fails_or_stalls_falls_back_to_the_relays_own_answers(pool: sqlx::PgPool) {
        let mock = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
        let settings = [("allow.auto.create.topics".to_owned(), "false".to_owned())].into();
        let producer =
            crate::relay::publish::producer(&mock.bootstrap_servers(), &settings).expect("producer");
        let timeout = Duration::from_secs(1);

        let gone = Names::new("public", "never_migrated").expect("names");
        let mut topics = Topics::new(timeout, Some(SharedClock::new(pool.clone(), &gone)));
        topics.check(&producer, ["absent"], Duration::from_secs(5)).await;
        assert!(matches!(topics.verdict("absent"), Verdict::Wait { .. }), "{:?}", topics.verdict("absent"));
        tokio::time::sleep(RECHECK_MISSING).await;
        topics.check(&producer, ["absent"], Duration::from_secs(5)).await;
        assert!(
            matches!(topics.verdict("absent"), Verdict::Fail(_)),
            "missing for the timeout by this relay's own answers: {:?}",
            topics.verdict("absent")
        );

        let outbox = crate::Outbox::new(crate::OutboxConfig::default()).expect("config");
        outbox.migrator().run(&pool).await.expect("migrate");
        let mut locker = pool.begin().await.expect("begin");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
            outbox.names().topics
        )))
        .execute(&mut *locker)
        .await
        .expect("lock");
        let mut topics = Topics::new(timeout, Some(SharedClock::new(pool.clone(), outbox.names())));
        let budget = Duration::from_secs(2);
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(30), topics.check(&producer, ["absent"], budget))
            .await
            .expect("a stalled clock does not hold the batch");
        assert!(started.elapsed() < budget * 3, "held {:?} for a budget of {budget:?}", started.elapsed());
        assert!(matches!(topics.verdict("absent"), Verdict::Wait { .. }), "{:?}", topics.verdict("absent"));
        locker.rollback().await.expect("rollback");
    }

    #[test]
    fn a_missing_topic_waits_then_fails_on_fresh_answers_and_an_existing_one_sends() {
        let mut topics = Topics::new(Duration::from_secs(60), None);
        assert_eq!(topics.verdict("unknown-yet"), Verdict::Send, "no answer: send, the send decides");
        let now = Instant::now();
        let ago = |s: u64| now.checked_sub(Duration::from_secs(s)).expect("clock");
        topics.state.insert("orders".into(), State::Exists { checked: now });
        topics.state.insert(
            "missing".into(),
            State::Missing { since: now, checked: now, answers: 1, confirmed: Duration::ZERO },
        );
        // First missing 70 s ago, confirmed missing again just now: 70 s of answers.
        topics.state.insert(
            "gone".into(),
            State::Missing { since: ago(70), checked: now, answers: 9, confirmed: Duration::from_secs(70) },
        );
        // The same, but the last answer is 5 s old (no answer since): not failed on it.
        topics.state.insert(
            "stale".into(),
            State::Missing {
                since: ago(70),
                checked: ago(5),
                answers: 9,
                confirmed: Duration::from_secs(65),
            },
        );
        // First missing 70 s ago, but the last answer came 40 s ago (the broker has been
        // unreachable since): 30 s of answers, so it waits, and is asked about again.
        topics.state.insert(
            "unconfirmed".into(),
            State::Missing {
                since: ago(70),
                checked: ago(40),
                answers: 3,
                confirmed: Duration::from_secs(30),
            },
        );
        assert_eq!(topics.verdict("orders"), Verdict::Send);
        assert!(matches!(topics.verdict("missing"), Verdict::Wait { reason, retry_in }
            if reason.contains("topic missing ") && retry_in == Duration::from_secs(1)));
        assert!(matches!(topics.verdict("gone"), Verdict::Fail(r)
            if r.contains("topic gone ") && r.contains("outbox retry")));
        assert!(
            matches!(topics.verdict("unconfirmed"), Verdict::Wait { retry_in, .. } if retry_in == Duration::from_secs(4)),
            "never failed on an old answer: {:?}",
            topics.verdict("unconfirmed")
        );
        assert!(
            matches!(topics.verdict("stale"), Verdict::Wait { retry_in, .. } if retry_in == Duration::from_secs(1)),
            "never failed on an old answer: {:?}",
            topics.verdict("stale")
        );
        assert_eq!(topics.missing(), 4);
        assert!(!topics.needs_check("orders") && !topics.needs_check("missing"), "asked a moment ago");
        assert!(topics.needs_check("gone"), "asked again before anything is failed");
        assert!(
            topics.needs_check("stale") && topics.needs_check("unconfirmed") && topics.needs_check("new")
        );
        topics.suspect("orders");
        assert!(topics.needs_check("orders"), "a failed send makes the next batch ask again");
    }
}
