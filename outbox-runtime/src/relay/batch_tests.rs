//! The batch's chains against a broker that is down: nothing sent once the batch is over.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use rdkafka::mocking::MockCluster;
use uuid::Uuid;

use super::Sender;
use crate::relay::claim::Row;
use crate::relay::topics::Topics;
use crate::relay::{publish, RelayConfig, RelayStats};

fn row(id: i64, topic: &str) -> Row {
    Row {
        id,
        event_id: Uuid::new_v4(),
        aggregate_type: "order".into(),
        aggregate_id: "a".into(),
        aggregate_version: Some(id),
        event_type: "order.placed".into(),
        schema_version: 1,
        topic: topic.into(),
        payload: "{}".into(),
        headers: "{}".into(),
        created_at: "2026-12-03T08:00:00.000000Z".into(),
        attempts: 0,
        work_partition: 0,
    }
}

/// librdkafka times nothing out itself, so a record sent once the batch is over waits
/// for nothing but the broker. A chain whose batch was already purged (another chain
/// reached the deadline) or whose deadline passed sends nothing more and ends at once;
/// before, it sent its next run, and with the broker down waited for ever.
#[tokio::test]
async fn a_chain_sends_nothing_once_its_batch_is_purged_or_past_its_deadline() {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("one", 1, 1).expect("topic");
    let producer = publish::producer(&mock.bootstrap_servers(), &BTreeMap::new()).expect("producer");
    mock.broker_down(-1).expect("down");
    let config = RelayConfig::new(mock.bootstrap_servers());
    let (topics, stats) = (Topics::new(Duration::from_secs(60), None), RelayStats::default());
    let sender = Sender {
        producer: &producer,
        config: &config,
        topics: &topics,
        stats: &stats,
        relay_id: Uuid::nil(),
    };
    let chain = [row(1, "one"), row(2, "one")];
    let later = tokio::time::Instant::now() + Duration::from_secs(60);
    for (deadline, purged) in [(later, true), (tokio::time::Instant::now(), false)] {
        let purged = AtomicBool::new(purged);
        let ended =
            tokio::time::timeout(Duration::from_secs(10), sender.chain(&chain, |_| true, deadline, &purged))
                .await
                .expect("the chain ends at once");
        assert!(ended.is_empty(), "nothing sent, no outcome: the rows stay as they are");
    }
}
