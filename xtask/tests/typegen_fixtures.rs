//! Consumer type generation on a fixture schema holding every construct it must express:
//! the generated file is committed, compiled here, current, deterministic, and maps each
//! construct to the Rust type a consumer expects.

use std::path::PathBuf;
use std::process::Command;

use outbox_runtime::typegen::{generate, write_or_check, Status};

#[rustfmt::skip]
#[path = "fixtures/generated.rs"]
mod generated;

use generated::fixture_kitchen_sink_v1::{Address, FixtureKitchenSinkV1Colour, Shape};
use generated::{decode, Event, FixtureKitchenSink, FixtureKitchenSinkV1};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[test]
fn committed_fixture_code_is_current_and_generation_is_deterministic() {
    let status = write_or_check(&fixtures().join("schemas"), &fixtures().join("generated.rs"), true)
        .expect("generate");
    assert_eq!(status, Status::UpToDate, "regenerate: cargo xtask typegen --schemas xtask/tests/fixtures/schemas --out xtask/tests/fixtures/generated.rs");
    let (a, b) = (generate(&fixtures().join("schemas")), generate(&fixtures().join("schemas")));
    assert_eq!(a.expect("first"), b.expect("second"), "same schemas, same bytes");
}

#[test]
fn each_construct_maps_to_the_expected_rust_type() {
    let json = serde_json::json!({
        "id": "0190d5a2-8f7e-7a1c-9d5e-3f2b1a0c9e8d",
        "at": "2026-11-30T01:02:03Z",
        "name": "kitchen sink",
        "delta": -7,
        "big": 18_446_744_073_709_551_615u64,
        "ratio": 0.5,
        "nickname": null,
        "colour": "green",
        "shape": { "kind": "circle", "radius": 2.0 },
        "address": { "street": "Main St" },
        "tags": ["a", "b"],
        "counts": { "x": 1 }
    });
    let event = match decode("fixture.kitchen_sink", 1, json.to_string().as_bytes()).expect("decodes") {
        Event::FixtureKitchenSink(FixtureKitchenSink::V1(e)) => e,
    };
    // Each `let` states the Rust type the schema construct must become.
    let _: uuid::Uuid = event.id; // format uuid
    let _: chrono::DateTime<chrono::Utc> = event.at; // format date-time
    let retries: u8 = event.retries; // uint8 with a default, absent from the payload
    let _: i32 = event.delta; // int32
    let big: u64 = event.big; // uint64 keeps its full range
    let _: f64 = event.ratio;
    let nickname: Option<String> = event.nickname.clone(); // nullable
    let _: Vec<String> = event.tags.clone();
    let _: &std::collections::HashMap<String, i64> = &event.counts; // map
    assert_eq!((retries, big, nickname), (3, u64::MAX, None));
    assert_eq!(event.colour, FixtureKitchenSinkV1Colour::Green); // string enum
    assert_eq!(event.shape, Shape::Circle { radius: 2.0 }); // tagged variants
    assert_eq!(event.address, Some(Address { street: "Main St".into(), zip: None })); // nested definition, optional field
    let back = serde_json::to_value(&event).expect("serializes");
    let again: FixtureKitchenSinkV1 = serde_json::from_value(back).expect("round trip");
    assert_eq!(again, event);
}

#[test]
fn a_stale_file_fails_check_mode_with_a_hint() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("types.rs");
    std::fs::write(&out, "// old\n").expect("write");
    let run = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["typegen", "--check", "--schemas"])
        .arg(fixtures().join("schemas"))
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run");
    assert_eq!(run.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("is stale (first difference at line 1)") && stderr.contains("cargo xtask typegen"),
        "{stderr}"
    );
    let bad = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["typegen", "--schemas", "/nonexistent"])
        .output()
        .expect("run");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("/nonexistent: cannot read directory"));
}
