//! Consumers' lag on the overview, read from the brokers when the console was given them.
//! A page never waits for a broker: it shows the last read, and a read older than
//! [`LAG_TTL`] starts one more in the background (one at a time, however many consoles
//! watch), bounded by the reader's timeout.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::State;

/// How long one read of the lag serves every page and stream.
pub(crate) const LAG_TTL: Duration = Duration::from_secs(5);

/// One consumer's lag as the overview shows it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LagCell {
    /// Messages behind; `None` until read, or when it could not be read.
    pub(crate) messages: Option<i64>,
    /// Partitions read.
    pub(crate) partitions: usize,
    /// Whether some partitions were left out (`messages` is then a lower bound).
    pub(crate) partial: bool,
    /// Why it could not be read (secrets in URLs redacted).
    pub(crate) error: Option<String>,
    /// When it was read (RFC 3339, UTC); `None` while the first read runs.
    pub(crate) read_at: Option<String>,
}

#[derive(Default)]
struct Cached {
    cells: BTreeMap<String, LagCell>,
    read: Option<Instant>,
    reading: bool,
}

/// The last read, by consumer.
#[derive(Default, Clone)]
pub(crate) struct LagCache(Arc<Mutex<Cached>>);

impl State {
    /// The lag of `consumers` as last read (empty without brokers); starts a read when the
    /// last is older than [`LAG_TTL`] or misses one of them.
    pub(crate) fn lag(&self, consumers: &[String]) -> BTreeMap<String, LagCell> {
        let Some(reader) = &self.config.lag else { return BTreeMap::new() };
        let mut cached = self.lag_cache.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let stale = cached.read.is_none_or(|at| at.elapsed() >= LAG_TTL)
            || consumers.iter().any(|c| !cached.cells.contains_key(c));
        if stale && !cached.reading {
            cached.reading = true;
            let (reader, cache, consumers) = (reader.clone(), self.lag_cache.clone(), consumers.to_vec());
            tokio::spawn(async move {
                let mut cells = BTreeMap::new();
                for consumer in consumers {
                    let cell = match reader.read(&consumer).await {
                        Ok(lag) => LagCell {
                            messages: Some(lag.messages),
                            partitions: lag.partitions.len(),
                            partial: lag.partial,
                            error: None,
                            read_at: Some(now()),
                        },
                        Err(e) => {
                            let error = crate::secrets::redact_urls(&e.to_string()).into_owned();
                            metrics::counter!(crate::metrics::CONSOLE_READ_ERRORS, "stage" => "lag")
                                .increment(1);
                            tracing::warn!(consumer = %consumer, stage = "console-lag", error = %error, "cannot read the consumer's lag");
                            LagCell {
                                messages: None,
                                partitions: 0,
                                partial: true,
                                error: Some(error),
                                read_at: Some(now()),
                            }
                        }
                    };
                    cells.insert(consumer, cell);
                }
                let mut cached = cache.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                *cached = Cached { cells, read: Some(Instant::now()), reading: false };
            });
        }
        consumers
            .iter()
            .map(|c| {
                let cell = cached.cells.get(c).cloned().unwrap_or(LagCell {
                    messages: None,
                    partitions: 0,
                    partial: true,
                    error: None,
                    read_at: None,
                });
                (c.clone(), cell)
            })
            .collect()
    }
}

fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
