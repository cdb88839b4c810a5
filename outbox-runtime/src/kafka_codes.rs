//! What a Kafka error means for a retry, by its error code, the way sqlx's
//! `DatabaseError::kind()` reads SQLSTATE classes: one table for the relay's delivery
//! reports, one for the inbox's receive loop, and [`is_transient`] for `Error::Kafka`.
//! A leaf: it knows rdkafka's errors, not this crate's.

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode as Code;

/// Delivery errors that repeat however often the same record is sent: the relay fails the
/// event ([invariant 6](crate::guarantees#i6)). Anything else in a delivery report (timeouts, leader changes, a
/// gapless error that only says an earlier record failed) is retried.
pub(crate) fn is_permanent_delivery(code: Code) -> bool {
    matches!(
        code,
        Code::MessageSizeTooLarge
            | Code::InvalidMessageSize
            | Code::InvalidTopic
            | Code::TopicAuthorizationFailed
            | Code::ClusterAuthorizationFailed
            | Code::InvalidRecord
            | Code::InvalidMessage
            | Code::UnsupportedForMessageFormat
            | Code::PolicyViolation
            | Code::InvalidRequiredAcks
    )
}

/// Receive errors after which a consumer cannot recover by itself.
pub(crate) fn is_fatal_receive(error: &KafkaError) -> bool {
    match error {
        KafkaError::MessageConsumptionFatal(_) => true,
        KafkaError::MessageConsumption(code) => matches!(
            code,
            Code::Fatal
                | Code::TopicAuthorizationFailed
                | Code::GroupAuthorizationFailed
                | Code::ClusterAuthorizationFailed
                | Code::SaslAuthenticationFailed
                | Code::InvalidGroupId
                | Code::Authentication
        ),
        _ => false,
    }
}

/// Codes that no retry of the same request fixes: a setting, a credential, a permission
/// or the request itself must change first.
fn is_permanent(code: Code) -> bool {
    is_permanent_delivery(code)
        || matches!(
            code,
            Code::GroupAuthorizationFailed
                | Code::TransactionalIdAuthorizationFailed
                | Code::DelegationTokenAuthorizationFailed
                | Code::SaslAuthenticationFailed
                | Code::Authentication
                | Code::UnsupportedSASLMechanism
                | Code::IllegalSASLState
                | Code::InvalidGroupId
                | Code::InvalidConfig
                | Code::InvalidPartitions
                | Code::InvalidReplicationFactor
                | Code::InvalidReplicaAssignment
                | Code::InvalidRequest
                | Code::UnsupportedVersion
                | Code::UnsupportedFeature
                | Code::UnsupportedCompressionType
                | Code::InvalidArgument
                | Code::InvalidType
                | Code::NotImplemented
                | Code::NotConfigured
                | Code::Fatal
        )
}

/// Whether retrying may succeed. Creating a client from a bad setting, a subscription to
/// a bad topic name, a fatal error or a refused permission repeat until something is
/// changed; timeouts, a broker down, a leader moving and codes we do not know pass.
pub(crate) fn is_transient(error: &KafkaError) -> bool {
    match error {
        KafkaError::ClientConfig(..)
        | KafkaError::ClientCreation(_)
        | KafkaError::Subscription(_)
        | KafkaError::AdminOpCreation(_)
        | KafkaError::Nul(_)
        | KafkaError::MessageConsumptionFatal(_) => false,
        KafkaError::Transaction(e) => e.is_retriable() && !e.is_fatal(),
        KafkaError::AdminOp(code) | KafkaError::MockCluster(code) => !is_permanent(*code),
        other => other.rdkafka_error_code().is_none_or(|code| !is_permanent(code)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::BaseProducer;

    #[test]
    fn a_setting_librdkafka_refuses_is_a_config_error_naming_it_without_a_secret() {
        for (key, value, shown) in [
            ("no.such.setting", "1", "no.such.setting = \"1\""),
            ("compression.type", "zip", "compression.type = \"zip\""),
            ("sasl.password.x", "hunter2", "sasl.password.x = (redacted)"),
        ] {
            let Err(error) = ClientConfig::new().set(key, value).create::<BaseProducer>() else {
                panic!("{key} accepted")
            };
            let error = crate::Error::kafka_client("RelayConfig::kafka_setting", error);
            let text = error.to_string();
            assert!(matches!(error, crate::Error::Config(_)), "{key}: {error:?}");
            assert!(text.contains(&format!("RelayConfig::kafka_setting {shown}")), "{key}: {text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    #[test]
    fn a_client_that_cannot_be_created_is_not_transient() {
        // librdkafka's own answer to an unknown setting, not a constructed error.
        let Err(error) = ClientConfig::new().set("no.such.setting", "1").create::<BaseProducer>() else {
            panic!("librdkafka refuses an unknown setting")
        };
        assert!(matches!(error, KafkaError::ClientConfig(..)), "{error:?}");
        assert!(!is_transient(&error));
        assert!(!crate::Error::Kafka(error).is_transient());
    }

    #[test]
    fn codes_are_classified_by_what_a_retry_can_change() {
        for code in
            [Code::MessageTimedOut, Code::AllBrokersDown, Code::NotLeaderForPartition, Code::RequestTimedOut]
        {
            assert!(is_transient(&KafkaError::MessageProduction(code)), "{code:?}");
            assert!(!is_permanent_delivery(code), "{code:?}");
        }
        for code in [Code::TopicAuthorizationFailed, Code::MessageSizeTooLarge, Code::InvalidTopic] {
            assert!(!is_transient(&KafkaError::MessageProduction(code)), "{code:?}");
            assert!(is_permanent_delivery(code), "{code:?}");
        }
        // A failed authentication repeats, but a delivery report never carries it for a
        // record: the relay's table stays the narrower one.
        assert!(!is_transient(&KafkaError::AdminOp(Code::SaslAuthenticationFailed)));
        assert!(is_transient(&KafkaError::AdminOp(Code::RequestTimedOut)));
        assert!(is_transient(&KafkaError::Canceled));
        assert!(!is_transient(&KafkaError::Subscription("^[".into())));
    }
}
