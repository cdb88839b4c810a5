//! librdkafka setting names as librdkafka reads them: a `topic.` prefix is dropped and an
//! alias is the property it stands for, so that a setting the outbox fixes cannot be
//! changed through another name (invariant 12).

/// librdkafka's aliases (`rdkafka_conf.c`, `_RK_C_ALIAS`): alias, property.
const ALIASES: &[(&str, &str)] = &[
    ("metadata.broker.list", "bootstrap.servers"),
    ("max.in.flight.requests.per.connection", "max.in.flight"),
    ("queue.buffering.max.ms", "linger.ms"),
    ("message.send.max.retries", "retries"),
    ("compression.codec", "compression.type"),
    ("acks", "request.required.acks"),
    ("delivery.timeout.ms", "message.timeout.ms"),
    ("auto.commit.enable", "enable.auto.commit"),
    ("sasl.mechanisms", "sasl.mechanism"),
    ("fetch.message.max.bytes", "fetch.max.bytes"),
];

/// The property `name` sets.
pub(crate) fn canonical(name: &str) -> &str {
    let name = name.strip_prefix("topic.").unwrap_or(name);
    ALIASES.iter().find(|(alias, _)| *alias == name).map_or(name, |(_, property)| property)
}

/// Whether `name` (a setting name, possibly a password's) holds a secret.
pub(crate) fn is_secret(name: &str) -> bool {
    let name = canonical(name);
    name.contains("password")
        || name.contains("secret")
        || name.ends_with(".pem")
        || name.contains("sasl.oauthbearer.config")
}

/// `settings` for `Debug` and logs: secrets' values replaced.
pub(crate) fn redacted(
    settings: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<&str, &str> {
    settings.iter().map(|(k, v)| (k.as_str(), if is_secret(k) { "(redacted)" } else { v.as_str() })).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_and_topic_prefixes_name_the_property() {
        assert_eq!(canonical("acks"), "request.required.acks");
        assert_eq!(canonical("topic.acks"), "request.required.acks");
        assert_eq!(canonical("topic.request.required.acks"), "request.required.acks");
        assert_eq!(canonical("delivery.timeout.ms"), "message.timeout.ms");
        assert_eq!(canonical("topic.message.timeout.ms"), "message.timeout.ms");
        assert_eq!(canonical("max.in.flight.requests.per.connection"), "max.in.flight");
        assert_eq!(canonical("auto.commit.enable"), "enable.auto.commit");
        assert_eq!(canonical("compression.type"), "compression.type");
        assert!(
            is_secret("sasl.password")
                && is_secret("ssl.key.password")
                && is_secret("sasl.oauthbearer.client.secret")
        );
        assert!(!is_secret("linger.ms"));
    }
}
