//! Metrics read back in tests: a debugging recorder installed once per test binary (the
//! recorder is global: a binary whose tests read metrics runs one such test at a time).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// This binary's recorder, installed at the first call.
///
/// # Panics
/// When another recorder was installed first.
pub fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("the only recorder of this test binary");
        snapshotter
    })
}

/// One snapshot by metric name: gauges and counters as one number, histograms as their
/// samples. Labelled series are keyed `name{label=value,...}`. Taking it drains the
/// recorder: counters start again from 0, histograms empty, gauges read 0 until set again.
pub fn snapshot() -> BTreeMap<String, Vec<f64>> {
    let mut by_name: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (key, _, _, value) in snapshotter().snapshot().into_vec() {
        let labels: Vec<String> = key.key().labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        let name = if labels.is_empty() {
            key.key().name().to_owned()
        } else {
            format!("{}{{{}}}", key.key().name(), labels.join(","))
        };
        let values = by_name.entry(name).or_default();
        match value {
            DebugValue::Gauge(g) => values.push(g.into_inner()),
            #[allow(clippy::cast_precision_loss)]
            DebugValue::Counter(c) => values.push(c as f64),
            DebugValue::Histogram(h) => values.extend(h.into_iter().map(|v| v.into_inner())),
        }
    }
    by_name
}
