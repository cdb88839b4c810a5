//! The kit's test events, and the CloudEvents headers the relay writes, for records tests
//! produce by hand.
//!
//! `cargo xtask` links this crate but leaves these events out of its contract commands (see
//! `xtask/src/main.rs`): they have no committed schemas.

use outbox_runtime::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A test event: step `n` of aggregate `id`, on topic `outbox-test-steps`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "test.step", schema_version = 1, aggregate = "test", topic = "outbox-test-steps")]
pub struct Step {
    /// The aggregate.
    #[outbox(aggregate_id)]
    pub id: String,
    /// Its step number, also given as aggregate_version.
    pub n: i64,
    /// Filler.
    pub data: String,
}

/// A test event for inboxes: credit `amount` to `account`. Tests produce its records by
/// hand ([`Credit::json`], [`event_headers`]) to topics of their own, hence no topic.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "test.credit", schema_version = 1, aggregate = "account", topic = "unused")]
pub struct Credit {
    /// The aggregate.
    #[outbox(aggregate_id)]
    pub account: String,
    /// The amount credited.
    pub amount: i64,
}

impl Credit {
    /// The JSON payload of a credit, as the relay would write it.
    pub fn json(account: &str, amount: i64) -> Vec<u8> {
        serde_json::to_vec(&Credit { account: account.to_owned(), amount }).expect("json")
    }
}

/// The CloudEvents headers the relay writes for event `event_id` of type `event_type`
/// (schema version 1) of an `account` aggregate: `ce_subject` when `subject` is given,
/// `ce_aggregateversion` when `version` is.
pub fn event_headers(
    event_id: Uuid,
    event_type: &str,
    version: Option<i64>,
    subject: Option<&str>,
) -> Vec<(String, String)> {
    let mut h = vec![
        ("ce_specversion".to_owned(), "1.0".to_owned()),
        ("ce_id".to_owned(), event_id.to_string()),
        ("ce_type".to_owned(), event_type.to_owned()),
        ("ce_source".to_owned(), "/tests".to_owned()),
        ("ce_schemaversion".to_owned(), "1".to_owned()),
        ("ce_aggregatetype".to_owned(), "account".to_owned()),
    ];
    if let Some(s) = subject {
        h.push(("ce_subject".to_owned(), s.to_owned()));
    }
    if let Some(v) = version {
        h.push(("ce_aggregateversion".to_owned(), v.to_string()));
    }
    h
}
