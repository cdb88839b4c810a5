//! `generate` and `check` against a real directory, one test per problem they report.

use std::fs;

use schemars::JsonSchema;
use serde::Serialize;

use serde_json::Value;

use crate::registry::EventDescriptor;
use crate::schema::*;
use crate::OutboxEvent;

/// Version 1 as committed.
#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "parcel.sent", schema_version = 1, aggregate = "parcel", topic = "parcels")]
struct ParcelSent {
    #[outbox(aggregate_id)]
    parcel_id: u64,
    weight_grams: u32,
}

mod changed_type {
    use super::*;
    /// Version 1 with `weight_grams` turned into a string: incompatible.
    #[derive(Serialize, JsonSchema, OutboxEvent)]
    #[outbox(event_type = "parcel.sent", schema_version = 1, aggregate = "parcel", topic = "parcels")]
    pub(super) struct ParcelSent {
        #[outbox(aggregate_id)]
        pub(super) parcel_id: u64,
        pub(super) weight_grams: String,
    }
}

mod added_optional {
    use super::*;
    /// Version 1 with an optional field added: FULL compatible.
    #[derive(Serialize, JsonSchema, OutboxEvent)]
    #[outbox(event_type = "parcel.sent", schema_version = 1, aggregate = "parcel", topic = "parcels")]
    pub(super) struct ParcelSent {
        #[outbox(aggregate_id)]
        pub(super) parcel_id: u64,
        pub(super) weight_grams: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(super) carrier: Option<String>,
    }
}

/// Version 2, a breaking change with a bump.
#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "parcel.sent", schema_version = 2, aggregate = "parcel", topic = "parcels")]
struct ParcelSentV2 {
    #[outbox(aggregate_id)]
    parcel_id: u64,
    weight_grams: u32,
    carrier: String,
}

fn d<T: OutboxEvent>(name: &'static str) -> EventDescriptor {
    EventDescriptor::of::<T>(name)
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

fn only_problem(report: &CheckReport) -> &Problem {
    assert_eq!(report.problems.len(), 1, "{report}");
    &report.problems[0]
}

#[test]
fn generate_then_check_is_clean_and_byte_identical() {
    let dir = tmp();
    let (v1, v2) = (d::<ParcelSent>("ParcelSent"), d::<ParcelSentV2>("ParcelSentV2"));
    let done = generate(dir.path(), &[&v1, &v2], false).expect("generate");
    assert!(done.iter().all(|s| matches!(s, FileStatus::Created(_))), "{done:?}");
    let first = fs::read(schema_path(dir.path(), "parcel.sent", 1)).expect("written");

    let again = generate(dir.path(), &[&v1, &v2], false).expect("generate again");
    assert!(again.iter().all(|s| matches!(s, FileStatus::Unchanged(_))), "{again:?}");
    assert_eq!(fs::read(schema_path(dir.path(), "parcel.sent", 1)).expect("still there"), first);

    let report = check(dir.path(), &[&v1, &v2]);
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.checked, 2);
}

#[test]
fn rendered_file_is_draft_2020_12_with_generated_comment_and_metadata() {
    let v1 = d::<ParcelSent>("ParcelSent");
    let text = render(&v1);
    assert!(text.ends_with("}\n"));
    let value: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(value["$schema"], "https://json-schema.org/draft/2020-12/schema");
    assert!(value["$comment"].as_str().is_some_and(|c| c.contains("Do not edit")));
    assert_eq!(value["title"], "parcel.sent v1");
    assert_eq!(value["x-outbox"]["topic"], "parcels");
    assert_eq!(render(&v1), text, "rendering is deterministic");
}

#[test]
fn missing_file_is_reported() {
    let dir = tmp();
    let v1 = d::<ParcelSent>("ParcelSent");
    let report = check(dir.path(), &[&v1]);
    assert!(matches!(only_problem(&report), Problem::Missing { .. }), "{report}");
    assert!(report.to_string().contains("no committed schema for ParcelSent"), "{report}");
}

#[test]
fn compatible_difference_asks_to_regenerate() {
    let dir = tmp();
    generate(dir.path(), &[&d::<ParcelSent>("ParcelSent")], false).expect("generate");
    let report = check(dir.path(), &[&d::<added_optional::ParcelSent>("added_optional::ParcelSent")]);
    assert!(matches!(only_problem(&report), Problem::Stale { .. }), "{report}");
    assert!(report.to_string().contains("regenerate and commit"), "{report}");
}

#[test]
fn changed_field_type_names_event_field_and_rule() {
    let dir = tmp();
    generate(dir.path(), &[&d::<ParcelSent>("ParcelSent")], false).expect("generate");
    let report = check(dir.path(), &[&d::<changed_type::ParcelSent>("changed_type::ParcelSent")]);
    assert!(matches!(only_problem(&report), Problem::Incompatible { .. }), "{report}");
    let text = report.to_string();
    assert!(text.contains("bump schema_version and keep the old file"), "{text}");
    assert!(text.contains("parcel.sent v1 $.weight_grams: the writer writes integer; the reader accepts only string [type-changed, backward (new reads old)]"), "{text}");
    assert!(text.contains("[type-changed, forward (old reads new)]"), "{text}");
}

#[test]
fn generate_refuses_an_incompatible_overwrite_unless_forced() {
    let dir = tmp();
    generate(dir.path(), &[&d::<ParcelSent>("ParcelSent")], false).expect("generate");
    let before = fs::read(schema_path(dir.path(), "parcel.sent", 1)).expect("written");
    let changed = d::<changed_type::ParcelSent>("changed_type::ParcelSent");
    let err = generate(dir.path(), &[&changed], false).expect_err("refused");
    assert!(err.to_string().contains("without a version bump"), "{err}");
    assert_eq!(fs::read(schema_path(dir.path(), "parcel.sent", 1)).expect("kept"), before, "nothing written");
    let done = generate(dir.path(), &[&changed], true).expect("forced");
    assert!(matches!(done[0], FileStatus::Updated(_)));
}

#[test]
fn deleted_version_is_reported_while_the_event_type_exists() {
    let dir = tmp();
    let (v1, v2) = (d::<ParcelSent>("ParcelSent"), d::<ParcelSentV2>("ParcelSentV2"));
    generate(dir.path(), &[&v1, &v2], false).expect("generate");
    fs::remove_file(schema_path(dir.path(), "parcel.sent", 1)).expect("delete v1");
    // The v1 struct is gone too: only the file could have told about v1 events.
    let report = check(dir.path(), &[&v2]);
    assert!(matches!(only_problem(&report), Problem::Deleted { version: 1, .. }), "{report}");
}

#[test]
fn version_going_down_is_reported() {
    let dir = tmp();
    let (v1, v2) = (d::<ParcelSent>("ParcelSent"), d::<ParcelSentV2>("ParcelSentV2"));
    generate(dir.path(), &[&v1, &v2], false).expect("generate");
    let report = check(dir.path(), &[&v1]);
    assert!(
        matches!(only_problem(&report), Problem::VersionWentDown { code: 1, committed: 2, .. }),
        "{report}"
    );
}

#[test]
fn two_types_claiming_one_version_are_reported_and_not_generated() {
    let dir = tmp();
    let a = d::<ParcelSent>("a::ParcelSent");
    let b = d::<added_optional::ParcelSent>("b::ParcelSent");
    let err = generate(dir.path(), &[&a, &b], false).expect_err("refused");
    assert!(
        err.to_string().contains("parcel.sent v1 is claimed by 2 types: a::ParcelSent, b::ParcelSent"),
        "{err}"
    );
    assert!(!schema_path(dir.path(), "parcel.sent", 1).exists());
    let report = check(dir.path(), &[&a, &b]);
    assert!(report.problems.iter().any(|p| matches!(p, Problem::Duplicate { .. })), "{report}");
}

#[test]
fn unreadable_committed_file_names_the_file() {
    let dir = tmp();
    let v1 = d::<ParcelSent>("ParcelSent");
    let path = schema_path(dir.path(), "parcel.sent", 1);
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(&path, "{ not json").expect("write");
    let report = check(dir.path(), &[&v1]);
    assert!(matches!(only_problem(&report), Problem::BadFile(InputError::NotJson { .. })), "{report}");
    assert!(report.to_string().contains(&format!("{}: not JSON", path.display())), "{report}");
}

#[test]
fn files_outside_the_layout_are_reported() {
    let dir = tmp();
    let v1 = d::<ParcelSent>("ParcelSent");
    generate(dir.path(), &[&v1], false).expect("generate");
    fs::write(dir.path().join("parcel.sent").join("version2.json"), "{}").expect("write");
    let report = check(dir.path(), &[&v1]);
    assert!(matches!(only_problem(&report), Problem::UnexpectedFile(_)), "{report}");
}

/// Another event type, for checks where `parcel.sent` is retired.
#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "parcel.lost", schema_version = 1, aggregate = "parcel", topic = "parcels")]
struct ParcelLost {
    #[outbox(aggregate_id)]
    parcel_id: u64,
}

#[test]
fn schemas_of_retired_event_types_are_kept_with_a_note() {
    let dir = tmp();
    let lost = d::<ParcelLost>("ParcelLost");
    generate(dir.path(), &[&d::<ParcelSent>("ParcelSent"), &lost], false).expect("generate");
    let report = check(dir.path(), &[&lost]);
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.notes.len(), 1, "{report}");
    assert!(report.notes[0].contains("parcel.sent"), "{report}");
}

#[test]
fn no_registered_events_is_bad_input_not_a_pass() {
    // Before: `check(dir, &[])` said "schemas ok: 0 event schema(s)" whatever the files held.
    let dir = tmp();
    generate(dir.path(), &[&d::<ParcelSent>("ParcelSent")], false).expect("generate");
    let report = check(dir.path(), &[]);
    assert!(matches!(only_problem(&report), Problem::NoEvents), "{report}");
    assert!(report.is_bad_input(), "{report}");
    assert!(report.to_string().contains("link the crate that defines them"), "{report}");
    assert!(matches!(generate(dir.path(), &[], false), Err(GenerateError::NoEvents)));
}

#[test]
fn pinned_events_must_all_be_registered() {
    let dir = tmp();
    let sent = d::<ParcelSent>("ParcelSent");
    let v2 = d::<ParcelSentV2>("ParcelSentV2");
    let lost = d::<ParcelLost>("ParcelLost");
    generate(dir.path(), &[&sent, &v2, &lost], false).expect("generate");
    // Two versions of parcel.sent count once.
    let all = CheckOptions::new().expect_events(2).expect_types(["parcel.sent", "parcel.lost"]);
    assert!(check_with(dir.path(), &[&sent, &v2, &lost], &all).is_ok());
    let report = check_with(dir.path(), &[&sent, &v2], &all);
    match only_problem(&report) {
        Problem::Unexpected { expected_count, registered, missing } => {
            assert_eq!((*expected_count, *registered), (Some(2), 1));
            assert_eq!(missing, &["parcel.lost".to_owned()]);
        }
        other => panic!("{other}"),
    }
    assert!(report.is_bad_input(), "{report}");
    // Unpinned, the same events pass (parcel.lost's file is a retired type's, noted).
    assert!(check(dir.path(), &[&sent, &v2]).is_ok());
}

/// A field that is always written but optional to read.
#[derive(Serialize, serde::Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "parcel.weighed", schema_version = 1, aggregate = "parcel", topic = "parcels")]
struct ParcelWeighed {
    #[outbox(aggregate_id)]
    parcel_id: u64,
    #[serde(default)]
    grams: u32,
}

#[test]
fn the_writers_contract_is_committed_beside_the_readers_when_they_differ() {
    let weighed = document(&d::<ParcelWeighed>("ParcelWeighed"));
    assert_eq!(weighed["required"], serde_json::json!(["parcel_id"]), "a reader may omit grams: {weighed}");
    assert_eq!(
        weighed["x-outbox"]["writer"]["required"],
        serde_json::json!(["parcel_id", "grams"]),
        "{weighed}"
    );
    assert_eq!(weighed["x-outbox"]["writer"].get("$schema"), None);
    let doc = SchemaDoc::from_value("weighed", weighed).expect("schema");
    assert_eq!(doc.writer().root()["required"], serde_json::json!(["parcel_id", "grams"]));
    // Where the contracts agree, the file holds one schema.
    let sent = document(&d::<ParcelSent>("ParcelSent"));
    assert_eq!(sent["x-outbox"].get("writer"), None, "{sent}");
    let sent = SchemaDoc::from_value("sent", sent).expect("schema");
    assert!(std::ptr::eq(sent.writer(), &sent), "a one-schema document is its own writer");
}

#[test]
fn a_committed_writer_part_that_is_not_a_schema_is_bad_input_naming_it() {
    // Foreign or hand-edited files: `x-outbox.writer` must be a schema whose `$ref`s
    // resolve inside it, or the file is refused (exit 2) rather than judged by half.
    for (writer, expect) in [
        (serde_json::json!(5), "a schema is an object or a boolean"),
        (serde_json::json!({ "type": "strng" }), "type must be one of"),
        (serde_json::json!({ "$ref": "#/$defs/Gone" }), "unresolvable $ref"),
    ] {
        let doc = serde_json::json!({ "type": "object", "x-outbox": { "writer": writer } });
        let err = SchemaDoc::from_value("v1.json", doc).expect_err("not a schema");
        let text = err.to_string();
        assert!(text.starts_with("v1.json (x-outbox.writer): "), "{text}");
        assert!(text.contains(expect), "{text}");
    }
}
