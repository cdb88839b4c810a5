//! Start-up check: the inbox must remember event ids at least as long as Kafka may
//! redeliver them (the topic's retention plus the replay window), or an old event read
//! again would apply twice.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;

use super::InboxConfig;

/// The outcome of the retention check.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetentionVerdict {
    /// The dedup retention covers every topic.
    Covered,
    /// It does not; the message says by how much.
    Short(String),
    /// The topic's retention could not be read.
    Unknown(String),
}

fn days(d: Duration) -> String {
    format!("{:.1} days", d.as_secs_f64() / 86_400.0)
}

/// Judges one topic: `retention_ms` as the broker reports it (`-1` keeps forever).
pub fn judge(
    topic: &str,
    retention_ms: i64,
    dedup: Option<Duration>,
    replay_window: Duration,
) -> RetentionVerdict {
    let Some(dedup) = dedup else { return RetentionVerdict::Covered };
    if retention_ms < 0 {
        return RetentionVerdict::Short(format!(
            "DEDUP RETENTION TOO SHORT: topic {topic} keeps messages forever (retention.ms={retention_ms}) but the inbox \
             forgets event ids after {}: a message read again after that would apply twice; keep ids forever \
             (dedup_retention(None)) or bound the topic's retention",
            days(dedup)
        ));
    }
    let needed = Duration::from_millis(retention_ms.unsigned_abs()) + replay_window;
    if dedup < needed {
        return RetentionVerdict::Short(format!(
            "DEDUP RETENTION TOO SHORT: the inbox forgets event ids after {}, but topic {topic} keeps messages {} \
             (retention.ms={retention_ms}) and the replay window is {}: {} are needed, or a redelivered event \
             applies twice",
            days(dedup),
            days(Duration::from_millis(retention_ms.unsigned_abs())),
            days(replay_window),
            days(needed)
        ));
    }
    RetentionVerdict::Covered
}

/// Judges one topic with its `cleanup.policy`: a compacted topic (`compact`, alone or with
/// `delete`) keeps the latest record of every key past `retention.ms`, for ever, so it is
/// judged as a topic that keeps records for ever.
pub fn judge_topic(
    topic: &str,
    retention_ms: i64,
    cleanup_policy: &str,
    dedup: Option<Duration>,
    replay_window: Duration,
) -> RetentionVerdict {
    let compacted = cleanup_policy.split(',').any(|p| p.trim().eq_ignore_ascii_case("compact"));
    if !compacted {
        return judge(topic, retention_ms, dedup, replay_window);
    }
    match judge(topic, -1, dedup, replay_window) {
        RetentionVerdict::Short(_) => RetentionVerdict::Short(format!(
            "DEDUP RETENTION TOO SHORT: topic {topic} is compacted (cleanup.policy={cleanup_policy}): it keeps the \
             latest record of every key for ever, whatever retention.ms ({retention_ms}) says, but the inbox forgets \
             event ids after {}: such a record read again after that would apply twice; keep ids forever \
             (dedup_retention(None))",
            dedup.map_or("ever".to_owned(), days)
        )),
        verdict => verdict,
    }
}

/// Reads `retention.ms` and `cleanup.policy` of every configured topic from the broker and
/// judges them.
pub(crate) async fn check_topics(config: &InboxConfig) -> RetentionVerdict {
    let admin: AdminClient<DefaultClientContext> =
        match ClientConfig::new().set("bootstrap.servers", &config.brokers).create() {
            Ok(admin) => admin,
            Err(e) => {
                return RetentionVerdict::Unknown(format!(
                    "cannot create an admin client to read retention.ms: {e}"
                ))
            }
        };
    let specs: Vec<ResourceSpecifier<'_>> =
        config.topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(5)));
    let results =
        match tokio::time::timeout(Duration::from_secs(10), admin.describe_configs(&specs, &options)).await {
            Ok(Ok(results)) => results,
            Ok(Err(e)) => return unknown(config, &e.to_string()),
            Err(_) => return unknown(config, "the broker did not answer DescribeConfigs within 10 s"),
        };
    for (topic, result) in config.topics.iter().zip(results) {
        let resource = result.ok();
        let value =
            |name: &str| resource.as_ref().and_then(|r| r.get(name)).and_then(|entry| entry.value.clone());
        let retention = value("retention.ms").and_then(|v| v.parse::<i64>().ok());
        let policy = value("cleanup.policy").unwrap_or_else(|| "delete".to_owned());
        match retention {
            Some(ms) => {
                let verdict = judge_topic(topic, ms, &policy, config.dedup_retention, config.replay_window);
                if verdict != RetentionVerdict::Covered {
                    return verdict;
                }
            }
            None => {
                return unknown(config, &format!("no retention.ms in the configuration of topic {topic}"))
            }
        }
    }
    RetentionVerdict::Covered
}

fn unknown(config: &InboxConfig, why: &str) -> RetentionVerdict {
    RetentionVerdict::Unknown(format!(
        "cannot read the retention of {:?} from the broker ({why}); make sure the dedup retention ({}) covers the \
         topics' retention.ms plus the replay window ({})",
        config.topics,
        config.dedup_retention.map_or("forever".to_owned(), days),
        days(config.replay_window)
    ))
}

/// Logs a verdict that is not `Covered`, once, at start-up.
pub(super) fn warn(consumer: &str, verdict: RetentionVerdict) {
    match verdict {
        RetentionVerdict::Covered => {}
        RetentionVerdict::Short(message) | RetentionVerdict::Unknown(message) => {
            tracing::warn!(consumer, stage = "startup", "{message}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);
    const DAY_MS: i64 = 86_400_000;

    #[test]
    fn covered_when_dedup_outlives_retention_plus_replay() {
        assert_eq!(judge("orders", 7 * DAY_MS, Some(30 * DAY), 7 * DAY), RetentionVerdict::Covered);
        assert_eq!(judge("orders", 7 * DAY_MS, Some(14 * DAY), 7 * DAY), RetentionVerdict::Covered);
        assert_eq!(judge("orders", -1, None, 7 * DAY), RetentionVerdict::Covered);
    }

    #[test]
    fn short_when_a_redelivery_could_outlive_the_dedup_key() {
        let RetentionVerdict::Short(message) = judge("orders", 7 * DAY_MS, Some(10 * DAY), 7 * DAY) else {
            panic!("expected short");
        };
        assert!(message.contains("forgets event ids after 10.0 days"), "{message}");
        assert!(message.contains("topic orders keeps messages 7.0 days"), "{message}");
        assert!(message.contains("14.0 days are needed"), "{message}");
        assert!(
            matches!(judge("orders", -1, Some(365 * DAY), DAY), RetentionVerdict::Short(m) if m.contains("keeps messages forever"))
        );
    }

    #[test]
    fn a_compacted_topic_keeps_records_past_its_retention() {
        // retention.ms says 1 day, but compaction keeps the latest record per key for ever.
        for policy in ["compact", "compact,delete", "delete, compact"] {
            let verdict = judge_topic("orders", DAY_MS, policy, Some(30 * DAY), 7 * DAY);
            assert!(
                matches!(&verdict, RetentionVerdict::Short(m) if m.contains("is compacted")),
                "{policy}: {verdict:?}"
            );
            assert_eq!(judge_topic("orders", DAY_MS, policy, None, 7 * DAY), RetentionVerdict::Covered);
        }
        assert_eq!(
            judge_topic("orders", DAY_MS, "delete", Some(30 * DAY), 7 * DAY),
            RetentionVerdict::Covered
        );
    }
}
