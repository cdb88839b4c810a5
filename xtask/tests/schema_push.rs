//! `cargo xtask schema push` against a stand-in for a Confluent-API schema registry
//! (`outbox_tests::registry_standin`: the documented endpoints and error codes only; no
//! registry server can be installed here).

use std::fs;
use std::process::{Command, Output};

mod common;

use common::{committed, copy_dir, text};

use outbox_tests::registry_standin::StandIn;

const SUBJECTS: [&str; 4] = [
    "orders-order.confirmed v1",
    "orders-order.confirmed v2",
    "orders-order.placed v1",
    "payments-payment.capture_requested v1",
];

fn push(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_xtask"));
    command
        .args(["schema", "push"])
        .args(args)
        .env_remove("OUTBOX_SCHEMA_REGISTRY_URL")
        .env_remove("OUTBOX_SCHEMA_REGISTRY_USER")
        .env_remove("OUTBOX_SCHEMA_REGISTRY_PASSWORD");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("xtask runs")
}

#[test]
fn every_committed_version_is_registered_in_order_and_a_second_push_registers_nothing() {
    let registry = StandIn::start();
    let out = push(&["--registry", registry.url()], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("4 file(s): 4 registered, 0 already registered, 0 refused"),
        "{}",
        text(&out)
    );
    {
        let held = registry.registry();
        assert_eq!(held.subjects.keys().map(String::as_str).collect::<Vec<_>>(), SUBJECTS);
        for subject in SUBJECTS {
            assert_eq!(held.subjects[subject].len(), 1, "{subject}");
            assert_eq!(held.configs[subject], ("FULL".to_owned(), None), "{subject}");
            // The level is set before the first registration.
            let put = held.requests.iter().position(|r| *r == format!("PUT /config/{subject}"));
            let post = held.requests.iter().position(|r| *r == format!("POST /subjects/{subject}/versions"));
            assert!(put.is_some() && put < post, "{subject}: {:?}", held.requests);
        }
        // Registered as committed, byte for byte, in order of event type and version.
        let v1 = fs::read_to_string(committed().join("order.confirmed/v1.json")).expect("read");
        assert_eq!(held.schemas[0], v1);
        assert_eq!(held.schemas.len(), 4);
    }
    let before = registry.registry().requests.len();
    let again = push(&["--registry", registry.url()], &[]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    assert!(text(&again).contains("0 registered, 4 already registered"), "{}", text(&again));
    assert!(
        text(&again).contains(
            "order.placed v1: already registered in subject \"orders-order.placed v1\" as id 3 (version 1)"
        ),
        "{}",
        text(&again)
    );
    let held = registry.registry();
    let writes: Vec<&String> =
        held.requests[before..].iter().filter(|r| r.starts_with("PUT") || r.ends_with("/versions")).collect();
    assert!(writes.is_empty(), "a second push wrote {writes:?}");
    assert_eq!(held.requests.len() - before, 4, "one lookup per file: {:?}", &held.requests[before..]);
}

#[test]
fn a_dry_run_looks_up_and_writes_nothing() {
    let registry = StandIn::start();
    let out = push(&["--registry", registry.url(), "--dry-run", "--policy", "lenient"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("order.placed v1: would create subject \"orders-order.placed v1\" (FULL, lenient policy) and register it"), "{}", text(&out));
    assert!(text(&out).contains("4 would register"), "{}", text(&out));
    let held = registry.registry();
    assert!(held.subjects.is_empty() && held.configs.is_empty(), "{held:?}");
    assert!(
        held.requests.iter().all(|r| r.starts_with("POST /subjects/") && !r.ends_with("/versions")),
        "{:?}",
        held.requests
    );
}

#[test]
fn a_change_the_registry_refuses_is_exit_1_with_both_verdicts() {
    let registry = StandIn::start();
    let dir = tempfile::tempdir().expect("tmp");
    copy_dir(&committed(), dir.path());
    let dir_arg = dir.path().display().to_string();
    let first = push(&["--registry", registry.url(), "--dir", &dir_arg, "--policy", "strict"], &[]);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    assert_eq!(
        registry.registry().configs["orders-order.placed v1"],
        ("FULL".to_owned(), Some("STRICT".to_owned()))
    );

    // An optional property added to an open content model, without a version bump: serde
    // semantics let it pass; a registry with the STRICT policy refuses it.
    let v1 = dir.path().join("order.placed/v1.json");
    let mut doc: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&v1).expect("read")).expect("json");
    doc["properties"]["note"] = serde_json::json!({ "type": "string" });
    fs::write(&v1, serde_json::to_string_pretty(&doc).expect("json")).expect("write");

    let dry = push(&["--registry", registry.url(), "--dir", &dir_arg, "--dry-run"], &[]);
    assert_eq!(dry.status.code(), Some(1), "{}", text(&dry));
    let out = push(&["--registry", registry.url(), "--dir", &dir_arg], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = text(&out);
    assert!(
        report.contains("order.placed v1: subject \"orders-order.placed v1\" (FULL) holds other versions"),
        "{report}"
    );
    assert!(
        report.contains(
            "our verdict (json-schema semantics, strict policy): incompatible (full) with version 1"
        ),
        "{report}"
    );
    assert!(report.contains("$.note:"), "{report}");
    assert!(report.contains("the registry's verdict: incompatible"), "{report}");
    assert!(report.contains("the registry refuses the schema as incompatible"), "{report}");
    assert!(report.contains("0 registered, 3 already registered, 1 refused"), "{report}");
    assert_eq!(registry.registry().subjects["orders-order.placed v1"].len(), 1, "nothing registered");
}

/// A schema the registry cannot load is refused (HTTP 422, 42201) already at lookup: the
/// registry answered as its API documents, and said no; the other files still go.
#[test]
fn a_schema_the_registry_cannot_load_is_refused_exit_1_naming_the_file() {
    let registry = StandIn::start();
    registry.registry().unloadable.insert("orders-order.placed v1".to_owned());
    let dir = tempfile::tempdir().expect("tmp");
    copy_dir(&committed(), dir.path());
    let out = push(&["--registry", registry.url(), "--dir", &dir.path().display().to_string()], &[]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains("order.placed/v1.json: order.placed v1:"), "{report}");
    assert!(report.contains("the registry refuses the schema as invalid"), "{report}");
    assert!(report.contains("3 registered, 0 already registered, 1 refused"), "{report}");
    assert!(!report.contains("did not answer as its API documents"), "{report}");
    assert!(!registry.registry().subjects.contains_key("orders-order.placed v1"));
}

#[test]
fn credentials_come_from_the_environment_and_are_never_printed() {
    let registry = StandIn::with_credentials("key", "s3cret-canary");
    let without = push(&["--registry", registry.url()], &[]);
    assert_eq!(without.status.code(), Some(3), "{}", text(&without));
    assert!(text(&without).contains("refused the credentials (HTTP 401)"), "{}", text(&without));

    let env = [("OUTBOX_SCHEMA_REGISTRY_USER", "key"), ("OUTBOX_SCHEMA_REGISTRY_PASSWORD", "s3cret-canary")];
    let with = push(&["--registry", registry.url()], &env);
    assert_eq!(with.status.code(), Some(0), "{}", text(&with));
    assert!(!text(&with).contains("s3cret-canary"), "{}", text(&with));

    let half = push(&["--registry", registry.url()], &env[..1]);
    assert_eq!(half.status.code(), Some(2), "{}", text(&half));
    assert!(text(&half).contains("OUTBOX_SCHEMA_REGISTRY_PASSWORD: not set"), "{}", text(&half));

    let in_url = registry.url().replace("http://", "http://key:s3cret-canary@");
    let refused = push(&["--registry", &in_url], &[]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(!text(&refused).contains("s3cret-canary"), "{}", text(&refused));
}

#[test]
fn bad_settings_are_exit_2_and_an_unreachable_registry_exit_3() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let gone = format!("http://127.0.0.1:{port}");
    let out = push(&["--registry", &gone], &[]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains(&format!("schema registry {gone} is unreachable")), "{}", text(&out));

    let registry = StandIn::start();
    let out = push(&["--registry", registry.url(), "--subject", "{topic}-{nope}"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("unknown placeholder {nope}"), "{}", text(&out));
    let out = push(&["--registry", "registry:8081"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let empty = tempfile::tempdir().expect("tmp");
    let out = push(&["--registry", registry.url(), "--dir", &empty.path().display().to_string()], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no committed schemas"), "{}", text(&out));
    let out = push(&["--registry", registry.url(), "--compatibility", "SIDEWAYS"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(registry.registry().requests.is_empty(), "{:?}", registry.registry().requests);
    // TopicNameStrategy puts every version of a topic in one subject: order.confirmed v2
    // is not FULL compatible with v1 (that is why it is v2), so the registry refuses it.
    let out = push(&["--registry", registry.url(), "--subject", "{topic}-value"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("refused"), "{}", text(&out));
}
