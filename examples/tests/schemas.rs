//! The committed schemas match the example events, so a plain `cargo test` fails on stale
//! or incompatibly changed schemas, exactly as `cargo xtask schema check` does.

use std::path::PathBuf;

use outbox_examples as _;
use outbox_runtime::{registry, schema};

fn schemas_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../schemas")
}

#[test]
fn committed_schemas_match_the_code() {
    let events = registry::events();
    assert!(events.len() >= 3, "the example events are registered: {events:?}");
    let report = schema::check(&schemas_dir(), &events);
    assert!(report.is_ok(), "\n{report}\nrun `cargo xtask schema generate` and commit the files");
}
