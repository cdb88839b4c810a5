//! `cargo xtask asyncapi`: the committed AsyncAPI document matches the registered events
//! and the committed schemas, says what a consumer needs (every topic, every event type
//! and version, the CloudEvents headers, `$ref`s that resolve), and is valid AsyncAPI 3.0
//! by the AsyncAPI initiative's own parser (`@asyncapi/parser`, run by `.ci/run`).

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn xtask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask")).args(args).output().expect("xtask runs")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn committed() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../asyncapi.json")
}

#[test]
fn the_committed_document_is_current_and_a_stale_one_fails_the_check() {
    let out = xtask(&["asyncapi", "--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    let dir = tempfile::tempdir().expect("tempdir");
    let stale = dir.path().join("asyncapi.json");
    let mut doc: Value =
        serde_json::from_str(&std::fs::read_to_string(committed()).expect("committed")).expect("json");
    doc["info"]["version"] = Value::from("0.0.1");
    std::fs::write(&stale, serde_json::to_string_pretty(&doc).expect("json")).expect("write");
    let out = xtask(&["asyncapi", "--check", "--out", stale.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("is stale"), "{}", text(&out));

    let missing = dir.path().join("none.json");
    let out = xtask(&["asyncapi", "--check", "--out", missing.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let no_schemas = dir.path().join("no-schemas");
    let out = xtask(&[
        "asyncapi",
        "--schemas",
        no_schemas.to_str().expect("utf-8"),
        "--out",
        missing.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(2), "a missing schema is bad input: {}", text(&out));
    assert!(text(&out).contains("order."), "names the event: {}", text(&out));
}

/// `#/a/b` resolved in `doc`.
fn resolve<'d>(doc: &'d Value, reference: &str) -> Option<&'d Value> {
    reference.strip_prefix('#')?.split('/').skip(1).try_fold(doc, |node, part| node.get(part))
}

fn refs<'d>(node: &'d Value, found: &mut Vec<&'d str>) {
    match node {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => found.push(r),
                    _ => refs(v, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, found)),
        _ => {}
    }
}

#[test]
fn the_document_describes_every_event_with_its_headers_and_payload() {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(committed()).expect("committed")).expect("json");
    assert_eq!(doc["asyncapi"], "3.0.0");
    let channel = &doc["channels"]["orders"];
    assert_eq!(channel["address"], "orders");
    let names: Vec<&String> = channel["messages"].as_object().expect("messages").keys().collect();
    assert_eq!(names, ["order_confirmed_v1", "order_confirmed_v2", "order_placed_v1"]);
    for name in names {
        let message = &doc["components"]["messages"][name];
        let schema = &message["payload"]["schema"];
        assert_eq!(message["payload"]["schemaFormat"], "application/schema+json;version=draft-2020-12");
        assert!(
            schema["$id"].as_str().is_some_and(|id| id.starts_with("urn:outbox:schemas/order.")),
            "{name}"
        );
        assert_eq!(
            message["x-outbox"]["dataschema"], schema["$id"],
            "{name}: dataschema is the schema's $id"
        );
        let required: Vec<&str> = message["headers"]["required"]
            .as_array()
            .expect("required")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for header in ["ce_id", "ce_type", "ce_source", "ce_specversion", "ce_dataschema", "ce_schemaversion"]
        {
            assert!(required.contains(&header), "{name} requires {header}");
        }
    }
    let mut found = Vec::new();
    refs(&doc, &mut found);
    assert!(found.len() >= 6, "{found:?}");
    let dangling: Vec<&&str> =
        found.iter().filter(|r| r.starts_with('#') && resolve(&doc, r).is_none()).collect();
    assert!(dangling.is_empty(), "references that resolve to nothing: {dangling:?}");
}

/// The AsyncAPI initiative's parser, not ours: `OUTBOX_ASYNCAPI_NODE_PATH` is a
/// `node_modules` with `@asyncapi/parser` (3.x); `.ci/run` installs it.
#[test]
#[ignore = "needs node and OUTBOX_ASYNCAPI_NODE_PATH (node_modules with @asyncapi/parser); .ci/run runs it"]
fn the_asyncapi_parser_accepts_the_document() {
    let node_path = std::env::var("OUTBOX_ASYNCAPI_NODE_PATH").expect("OUTBOX_ASYNCAPI_NODE_PATH");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/interop/asyncapi_validate.js");
    let out = Command::new("node")
        .arg(script)
        .arg(committed())
        .env("NODE_PATH", node_path)
        .output()
        .expect("node runs");
    eprintln!("{}", text(&out));
    assert_eq!(out.status.code(), Some(0), "the parser found errors: {}", text(&out));
    assert!(text(&out).contains("0 error(s)"), "{}", text(&out));
}
