//! What the relay knows of the topics it publishes to. Before a batch is sent, the topics
//! of its rows are checked against the cluster's metadata: an event whose topic the
//! cluster says does not exist is not sent (the send could only time out, with an error
//! that names nothing); it waits with an error naming the topic and, once the topic has
//! been missing for `missing_topic_timeout`, it is marked `failed` with that reason, which
//! holds back its aggregate's later events and nothing else (`outbox retry` releases it
//! once the topic exists).
//!
//! Only a definite answer counts: a topic is missing when a broker answers
//! `UNKNOWN_TOPIC_OR_PART` for it. When the metadata cannot be read (broker down, timeout),
//! the rows are sent as usual and the send's own error decides.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::types::RDKafkaRespErr;
use tracing::{debug, info, warn};

/// How long an existing topic is taken to exist without asking again. A send to it that
/// fails transiently makes the next batch ask at once.
const RECHECK_EXISTING: Duration = Duration::from_secs(60);

/// How often a missing topic is asked about again, at most.
const RECHECK_MISSING: Duration = Duration::from_secs(1);

/// The longest one metadata request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
enum State {
    Exists { checked: Instant },
    Missing { since: Instant, checked: Instant },
}

/// What to do with a row, given its topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Send it.
    Send,
    /// Do not send it; retry later with this reason.
    Wait(String),
    /// Do not send it; mark it failed with this reason.
    Fail(String),
}

/// The label of missing-topic outcomes in `outbox_publish_errors_total`.
pub(crate) const MISSING_CODE: &str = "UnknownTopic";

#[derive(Debug)]
pub(crate) struct Topics {
    state: HashMap<String, State>,
    missing_timeout: Duration,
}

impl Topics {
    pub(crate) fn new(missing_timeout: Duration) -> Self {
        Topics { state: HashMap::new(), missing_timeout }
    }

    fn needs_check(&self, topic: &str) -> bool {
        match self.state.get(topic) {
            None => true,
            // Never fail an event on an old answer: the topic may have been created since
            // (and an operator's `retry` says it was).
            Some(State::Missing { since, checked }) => {
                checked.elapsed() >= RECHECK_MISSING || since.elapsed() >= self.missing_timeout
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
        for (topic, error) in answers {
            let missing = error == Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
            let previous = self.state.get(&topic).copied();
            let now = Instant::now();
            let state = match (missing, previous) {
                (true, Some(State::Missing { since, .. })) => State::Missing { since, checked: now },
                (true, _) => {
                    warn!(topic, stage = "metadata", fails_after = ?self.missing_timeout,
                          "the topic does not exist in the Kafka cluster: its events wait for it, then are marked failed");
                    State::Missing { since: now, checked: now }
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

    /// What to do with a row of `topic` now.
    pub(crate) fn verdict(&self, topic: &str) -> Verdict {
        match self.state.get(topic) {
            Some(State::Missing { since, .. }) => {
                let missing_for = since.elapsed();
                if missing_for >= self.missing_timeout {
                    Verdict::Fail(format!(
                        "topic {topic} does not exist in the Kafka cluster (missing for {:?}, missing_topic_timeout \
                         {:?}): create it, then `outbox retry`",
                        round(missing_for),
                        self.missing_timeout
                    ))
                } else {
                    Verdict::Wait(format!(
                        "topic {topic} does not exist in the Kafka cluster; not sent, waiting for it (marked failed \
                         after {:?} missing)",
                        self.missing_timeout
                    ))
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

    /// How many topics are known to be missing.
    pub(crate) fn missing(&self) -> usize {
        self.state.values().filter(|s| matches!(s, State::Missing { .. })).count()
    }
}

fn round(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_topic_waits_then_fails_and_an_existing_one_sends() {
        let mut topics = Topics::new(Duration::from_secs(60));
        assert_eq!(topics.verdict("unknown-yet"), Verdict::Send, "no answer: send, the send decides");
        topics.state.insert("orders".into(), State::Exists { checked: Instant::now() });
        topics
            .state
            .insert("missing".into(), State::Missing { since: Instant::now(), checked: Instant::now() });
        let long_ago = Instant::now().checked_sub(Duration::from_secs(61)).expect("clock");
        topics.state.insert("gone".into(), State::Missing { since: long_ago, checked: long_ago });
        assert_eq!(topics.verdict("orders"), Verdict::Send);
        assert!(matches!(topics.verdict("missing"), Verdict::Wait(r) if r.contains("topic missing ")));
        assert!(
            matches!(topics.verdict("gone"), Verdict::Fail(r) if r.contains("topic gone ") && r.contains("outbox retry"))
        );
        assert_eq!(topics.missing(), 2);
        assert!(!topics.needs_check("orders") && !topics.needs_check("missing"), "asked a moment ago");
        assert!(topics.needs_check("gone") && topics.needs_check("new"));
        topics.suspect("orders");
        assert!(topics.needs_check("orders"), "a failed send makes the next batch ask again");
    }
}
