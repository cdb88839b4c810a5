//! `cargo xtask schema ...` as a user runs it: exit codes and what it prints.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

mod common;

use common::{committed, copy_dir, text};

fn xtask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask")).args(args).output().expect("xtask runs")
}

fn write(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    fs::write(&path, body).expect("write");
    path.display().to_string()
}

#[test]
fn check_passes_on_the_committed_schemas() {
    let out = xtask(&["schema", "check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("schemas ok: 4 event schema(s)"), "{}", text(&out));
}

#[test]
fn check_fails_naming_event_field_and_rule_when_a_field_type_changes() {
    let dir = tempfile::tempdir().expect("tmp");
    copy_dir(&committed(), dir.path());
    let v2 = dir.path().join("order.confirmed/v2.json");
    let mut doc: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&v2).expect("read")).expect("json");
    doc["properties"]["total_cents"] = serde_json::json!({ "type": "string" });
    fs::write(&v2, serde_json::to_string_pretty(&doc).expect("json")).expect("write");

    let out = xtask(&["schema", "check", "--dir", &dir.path().display().to_string()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = text(&out);
    assert!(report.contains("order.confirmed v2 (outbox_examples::events::OrderConfirmed) changed incompatibly without a version bump; bump schema_version and keep the old file"), "{report}");
    assert!(report.contains("order.confirmed v2 $.total_cents: the writer writes string; the reader accepts only integer [type-changed"), "{report}");
}

#[test]
fn check_exits_2_naming_a_committed_file_that_is_not_json() {
    let dir = tempfile::tempdir().expect("tmp");
    copy_dir(&committed(), dir.path());
    let bad = write(&dir.path().join("order.placed"), "v1.json", "{ oops");
    let out = xtask(&["schema", "check", "--dir", &dir.path().display().to_string()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains(&format!("{bad}: not JSON")), "{}", text(&out));
}

#[test]
fn compat_exit_codes_follow_the_verdict() {
    let v1 = committed().join("order.confirmed/v1.json").display().to_string();
    let v2 = committed().join("order.confirmed/v2.json").display().to_string();

    let forward = xtask(&["schema", "compat", &v1, &v2, "--mode", "forward"]);
    assert_eq!(forward.status.code(), Some(0), "{}", text(&forward));
    assert!(text(&forward).starts_with("compatible (forward)"), "{}", text(&forward));

    let backward = xtask(&["schema", "compat", &v1, &v2, "--mode", "backward"]);
    assert_eq!(backward.status.code(), Some(1), "{}", text(&backward));
    let report = text(&backward);
    assert!(report.contains("$.currency: the reader requires property `currency`; the writer does not write it [required-added"), "{report}");
    assert!(report.contains("$.payment:"), "{report}");
}

#[test]
fn compat_exits_2_on_bad_input_naming_the_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let good = write(dir.path(), "good.json", r#"{ "type": "string" }"#);
    let cases = [
        (dir.path().join("absent.json").display().to_string(), "cannot read"),
        (write(dir.path(), "text.json", "hello"), "not JSON"),
        (write(dir.path(), "array.json", "[1, 2]"), "not a JSON Schema"),
        (write(dir.path(), "ref.json", r##"{ "$ref": "#/$defs/Gone" }"##), "unresolvable $ref"),
    ];
    for (path, what) in &cases {
        let out = xtask(&["schema", "compat", &good, path, "--mode", "full"]);
        assert_eq!(out.status.code(), Some(2), "{path}: {}", text(&out));
        assert!(text(&out).contains(&format!("{path}: {what}")), "{}", text(&out));
    }
    let out = xtask(&["schema", "compat", &good, &good, "--mode", "sideways"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("unknown compatibility mode \"sideways\""), "{}", text(&out));
}

#[test]
fn compat_judges_by_the_semantics_and_policy_asked_for() {
    let dir = tempfile::tempdir().expect("tmp");
    // An optional property added to an open content model: serde's writer never writes
    // it; a JSON Schema instance may hold it with any value (Confluent STRICT refuses,
    // LENIENT accepts).
    let old =
        write(dir.path(), "old.json", r#"{ "type": "object", "properties": { "a": { "type": "string" } } }"#);
    let new = write(
        dir.path(),
        "new.json",
        r#"{ "type": "object", "properties": { "a": { "type": "string" }, "b": { "type": "integer" } } }"#,
    );
    let run = |extra: &[&str]| {
        let mut args = vec!["schema", "compat", old.as_str(), new.as_str(), "--mode", "backward"];
        args.extend_from_slice(extra);
        xtask(&args)
    };
    let serde = run(&[]);
    assert_eq!(serde.status.code(), Some(0), "{}", text(&serde));
    assert_eq!(text(&serde), format!("compatible (backward): {old} -> {new}\n"));

    let strict = run(&["--semantics", "json-schema"]);
    assert_eq!(strict.status.code(), Some(1), "{}", text(&strict));
    assert!(text(&strict).contains("[json-schema semantics, strict policy]"), "{}", text(&strict));
    assert!(text(&strict).contains("$.b:"), "{}", text(&strict));

    let lenient = run(&["--semantics", "json-schema", "--policy", "lenient"]);
    assert_eq!(lenient.status.code(), Some(0), "{}", text(&lenient));
    assert!(text(&lenient).contains("[json-schema semantics, lenient policy]"), "{}", text(&lenient));

    // Bad settings are exit 2 naming them.
    let out = run(&["--semantics", "avro"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("unknown semantics \"avro\""), "{}", text(&out));
    let out = run(&["--semantics", "json-schema", "--policy", "loose"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("unknown policy \"loose\""), "{}", text(&out));
    let out = run(&["--policy", "lenient"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--policy lenient predicts a schema registry's verdict"), "{}", text(&out));
}

/// Under json-schema semantics a file without `$schema` is draft-07, as a registry reads
/// it (a tuple `items` is fine there, and not in 2020-12); and a change no value breaks
/// but the registry's diff refuses is refused, naming the registry's rule.
#[test]
fn compat_reads_and_refuses_as_a_registry_does_under_json_schema_semantics() {
    let dir = tempfile::tempdir().expect("tmp");
    let tuple = write(dir.path(), "tuple.json", r#"{ "type": "array", "items": [ { "type": "string" } ] }"#);
    let out = xtask(&["schema", "compat", &tuple, &tuple, "--semantics", "json-schema"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = xtask(&["schema", "compat", &tuple, &tuple]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("tuple.json") && text(&out).contains("prefixItems"), "{}", text(&out));

    let old = write(dir.path(), "int.json", r#"{ "type": "integer" }"#);
    let new = write(dir.path(), "int64.json", r#"{ "type": "integer", "format": "int64" }"#);
    for policy in ["strict", "lenient"] {
        let out = xtask(&["schema", "compat", &old, &new, "--semantics", "json-schema", "--policy", policy]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let said = text(&out);
        assert!(
            said.contains("TYPE_CHANGED at #/") && said.contains("[registry-refuses, backward"),
            "{said}"
        );
    }
    // Said to be 2020-12, the registry drops `format`: nothing is refused.
    let in_2020 = |name: &str, body: &str| {
        write(
            dir.path(),
            name,
            &body.replacen('{', r#"{ "$schema": "https://json-schema.org/draft/2020-12/schema","#, 1),
        )
    };
    let (old, new) = (
        in_2020("int-2020.json", r#"{ "type": "integer" }"#),
        in_2020("int64-2020.json", r#"{ "type": "integer", "format": "int64" }"#),
    );
    let out = xtask(&["schema", "compat", &old, &new, "--semantics", "json-schema"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn check_with_json_schema_semantics_refuses_what_a_registry_would() {
    // A committed file whose model is closed; the code's schema is open (schemars' default):
    // serde semantics pass it (the writer writes only its fields), JSON Schema semantics
    // refuse FORWARD (an old reader that is closed cannot read an open writer's values).
    let dir = tempfile::tempdir().expect("tmp");
    copy_dir(&committed(), dir.path());
    let v1 = dir.path().join("order.placed/v1.json");
    let mut doc: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&v1).expect("read")).expect("json");
    doc["additionalProperties"] = serde_json::json!(false);
    fs::write(&v1, serde_json::to_string_pretty(&doc).expect("json")).expect("write");
    let dir_arg = dir.path().display().to_string();

    let serde = xtask(&["schema", "check", "--dir", &dir_arg]);
    assert_eq!(serde.status.code(), Some(1), "stale, compatible: {}", text(&serde));
    assert!(
        text(&serde)
            .contains("differs from the schema of outbox_examples::events::OrderPlaced, compatibly (FULL)"),
        "{}",
        text(&serde)
    );
    assert!(!text(&serde).contains("incompatibly"), "{}", text(&serde));

    let registry = xtask(&["schema", "check", "--dir", &dir_arg, "--semantics", "json-schema"]);
    assert_eq!(registry.status.code(), Some(1), "{}", text(&registry));
    assert!(
        text(&registry)
            .contains("order.placed v1 (outbox_examples::events::OrderPlaced) changed incompatibly"),
        "{}",
        text(&registry)
    );
    assert!(text(&registry).contains("[closed-reader"), "{}", text(&registry));
}
