use super::*;

#[test]
fn defaults_are_valid_and_every_bad_value_is_named() {
    let base = || InboxConfig::new("c", "b", ["t"]);
    base().validate().expect("defaults");
    let cases = [
        (base().commit_interval(Duration::ZERO), "commit_interval"),
        (base().commit_interval(2 * HOUR), "commit_interval"),
        (base().backoff(Duration::ZERO, Duration::from_secs(1)), "backoff (base)"),
        (base().backoff(Duration::from_secs(2), Duration::from_secs(1)), "backoff (max)"),
        (base().backoff(MS, 2 * DAY), "backoff (max)"),
        (base().operator_poll_interval(Duration::ZERO), "operator_poll_interval"),
        (base().shutdown_timeout(Duration::ZERO), "shutdown_timeout"),
        (base().dedup_retention(Duration::ZERO), "dedup_retention"),
        (base().replay_window(Duration::MAX), "replay_window"),
        (base().max_attempts(0), "max_attempts"),
        (base().queue_per_partition(0), "queue_per_partition"),
        (base().queue_per_partition(usize::MAX), "queue_per_partition"),
        (base().buffer_per_partition(10), "buffer_per_partition"),
        (base().cleanup_interval(MS), "cleanup_interval"),
        (base().cleanup_batch_size(0), "cleanup_batch_size"),
        (base().cleanup_batch_size(100_001), "cleanup_batch_size"),
        (base().kafka_setting("enable.auto.commit", "true"), "enable.auto.commit"),
        (base().kafka_setting("auto.commit.enable", "true"), "auto.commit.enable"),
        (base().kafka_setting("topic.auto.commit.enable", "true"), "topic.auto.commit.enable"),
        (InboxConfig::new("", "b", ["t"]), "consumer"),
        (InboxConfig::new("c", "b", [""]), "topics"),
        (InboxConfig::new("c", "b", Vec::<String>::new()), "topics"),
    ];
    for (config, setting) in cases {
        match config.validate() {
            Err(Error::Config(message)) => {
                assert!(message.contains(setting), "{message:?} names {setting}")
            }
            other => panic!("{setting}: expected Error::Config, got {other:?}"),
        }
    }
    base()
        .dedup_retention(None)
        .max_attempts(1)
        .queue_per_partition(1)
        .cleanup_interval(Duration::from_secs(1))
        .cleanup_batch_size(100_000)
        .validate()
        .expect("edges");
}

#[test]
fn debug_never_shows_a_secret() {
    let config = InboxConfig::new("c", "sasl_ssl://svc:hunter1@broker:9093", ["t"])
        .kafka_setting("sasl.password", "hunter2")
        .kafka_setting("sasl.oauthbearer.token.endpoint.url", "https://svc:hunter4@idp/token")
        .kafka_setting("ssl.key.password", "hunter3")
        .kafka_setting("security.protocol", "SASL_SSL");
    let shown = format!("{config:?}");
    assert!(!shown.contains("hunter"), "{shown}");
    assert!(shown.contains("SASL_SSL") && shown.contains("(redacted)"), "{shown}");
}
