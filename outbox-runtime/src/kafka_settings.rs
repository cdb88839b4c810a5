//! librdkafka setting names as librdkafka reads them: a `topic.` prefix is dropped and an
//! alias is the property it stands for, so that a setting the outbox fixes cannot be
//! changed through another name ([invariant 12](crate::guarantees#i12)).

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
    }
}
