//! The consumer's librdkafka context: statistics into the lag gauge, rebalances (a revoke
//! commits the revoked partitions' finished offsets before it completes), commit results.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::statistics::Statistics;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{info, warn};

use super::{places, Shared};

/// The Kafka client context: rebalances, commit results, and the consumer lag from
/// librdkafka's statistics.
pub(crate) struct InboxContext {
    pub(super) shared: Arc<Shared>,
}

impl ClientContext for InboxContext {
    fn stats(&self, statistics: Statistics) {
        for (topic, t) in statistics.topics {
            for (partition, p) in t.partitions {
                // -1 is librdkafka's internal partition; a negative lag means unknown.
                if partition >= 0 && p.consumer_lag >= 0 {
                    #[allow(clippy::cast_precision_loss)]
                    metrics::gauge!(crate::metrics::INBOX_LAG, "consumer" => self.shared.consumer.clone(),
                                    "topic" => topic.clone(), "partition" => partition.to_string())
                    .set(p.consumer_lag as f64);
                }
            }
        }
    }
}

impl ConsumerContext for InboxContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(list) => {
                let revoked = places(list);
                let mut commit = TopicPartitionList::new();
                {
                    let mut state = self.shared.lock();
                    for place in &revoked {
                        state.assigned.remove(place);
                        if let Some(p) = state.partitions.remove(place) {
                            // Stops the worker before its next record; queued ones are dropped.
                            p.stop.cancel();
                            if let Some(next) = p.finished.filter(|n| p.committed != Some(*n)) {
                                let _ = commit.add_partition_offset(&place.0, place.1, Offset::Offset(next));
                            }
                        }
                    }
                }
                let committed = if self.shared.live.load(Ordering::SeqCst) { commit.count() } else { 0 };
                if committed > 0 {
                    // A broker may refuse it while the group rebalances (librdkafka's mock
                    // cluster does, Kafka accepts it): the records come back and are absorbed.
                    if let Err(error) = consumer.commit(&commit, CommitMode::Sync) {
                        warn!(consumer = %self.shared.consumer, stage = "rebalance", %error,
                              "commit of revoked partitions failed; their last records may be redelivered and absorbed");
                    }
                }
                info!(consumer = %self.shared.consumer, stage = "rebalance", revoked = revoked.len(), committed,
                      "partitions revoked: their workers stopped, finished offsets committed");
            }
            Rebalance::Assign(_) => {}
            Rebalance::Error(error) => {
                warn!(consumer = %self.shared.consumer, stage = "rebalance", %error, "rebalance error");
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            let assigned = places(list);
            self.shared.lock().assigned.extend(assigned.iter().cloned());
            // A partition paused by an earlier owner of this process starts unpaused.
            let _ = consumer.resume(list);
            info!(consumer = %self.shared.consumer, stage = "rebalance", assigned = assigned.len(), "partitions assigned");
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(error) = result {
            let mut state = self.shared.lock();
            for place in places(offsets) {
                if let Some(p) = state.partitions.get_mut(&place) {
                    p.committed = None; // committed again at the next tick
                }
            }
            warn!(consumer = %self.shared.consumer, stage = "commit", %error,
                  "offset commit failed; it is tried again, and meanwhile records may be redelivered and absorbed");
        }
    }
}
