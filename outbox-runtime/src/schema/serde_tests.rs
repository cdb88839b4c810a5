//! The checker against serde itself: for pairs of Rust types (old, new), sample values of
//! the writer type are serialized with serde_json and read with the reader type, and the
//! checker's verdict must be serde's, in both directions. Every "incompatible" verdict is
//! shown by a sample serde cannot read, and every "compatible" one by serde reading every
//! sample. The shapes are those that schemars splits over several schema objects or that
//! its two contracts tell apart: defaults, `skip_serializing_if`, renames, maps, tuples,
//! recursion and integer widths here; tagged and untagged enums and flatten in
//! `serde_enum_tests`, with this file's `case`.

#![allow(dead_code)] // The types exist for their schemas and serde impls.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::compat::{compare_each, Judge};
use super::{document, Mode, SchemaDoc};
use crate::registry::{json_schema_of, json_writer_schema_of, EventDescriptor};

/// The committed document of `T`, both contracts, as `schema generate` writes it.
fn contract<T: JsonSchema>(name: &'static str) -> SchemaDoc {
    let d = EventDescriptor::from_parts("t.t", 1, "t", "t", name, json_schema_of::<T>)
        .with_writer_schema(json_writer_schema_of::<T>);
    SchemaDoc::from_value(name, document(&d)).expect("a schema")
}

/// Samples serde cannot read as `R`, with its error.
fn unreadable<W: Serialize, R: DeserializeOwned>(samples: &[W]) -> Vec<String> {
    samples
        .iter()
        .filter_map(|s| {
            let v = serde_json::to_value(s).expect("serializes");
            serde_json::from_value::<R>(v.clone()).err().map(|e| format!("{v} -> {e}"))
        })
        .collect()
}

/// What a case expects serde (and so the checker) to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reads {
    /// New reads old, and old reads new.
    Both,
    /// Only BACKWARD holds: new reads old, old cannot read new.
    OnlyBackward,
    /// Only FORWARD holds: old reads new, new cannot read old.
    OnlyForward,
    Neither,
}

pub(super) fn case<Old, New>(name: &'static str, old: &[Old], new: &[New], expected: Reads)
where
    Old: Serialize + DeserializeOwned + JsonSchema,
    New: Serialize + DeserializeOwned + JsonSchema,
{
    let (old_doc, new_doc) = (contract::<Old>("old"), contract::<New>("new"));
    let backward_serde = unreadable::<Old, New>(old);
    let forward_serde = unreadable::<New, Old>(new);
    let serde_says = match (backward_serde.is_empty(), forward_serde.is_empty()) {
        (true, true) => Reads::Both,
        (true, false) => Reads::OnlyBackward,
        (false, true) => Reads::OnlyForward,
        (false, false) => Reads::Neither,
    };
    // The samples are the ground truth; the expectation only guards the samples.
    assert_eq!(serde_says, expected, "{name}: serde: backward {backward_serde:?}, forward {forward_serde:?}");
    // What serde reads, even of a type with itself (which `compare` calls compatible:
    // no change is to blame for a type that cannot read its own output).
    let backward = compare_each(&old_doc, &new_doc, Mode::Backward, Judge::default());
    let forward = compare_each(&old_doc, &new_doc, Mode::Forward, Judge::default());
    assert_eq!(
        backward.is_compatible(),
        backward_serde.is_empty(),
        "{name}: BACKWARD (new reads old): checker says {:?}; serde could not read {backward_serde:?}\nold: {}\nnew: {}",
        backward.incompatibilities.iter().map(ToString::to_string).collect::<Vec<_>>(),
        old_doc.root(),
        new_doc.root()
    );
    assert_eq!(
        forward.is_compatible(),
        forward_serde.is_empty(),
        "{name}: FORWARD (old reads new): checker says {:?}; serde could not read {forward_serde:?}\nold: {}\nnew: {}",
        forward.incompatibilities.iter().map(ToString::to_string).collect::<Vec<_>>(),
        old_doc.root(),
        new_doc.root()
    );
}

mod defaults {
    use super::*;

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Defaulted {
        #[serde(default)]
        pub(super) n: u32,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Required {
        pub(super) n: u32,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Skipped {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(super) c: Option<String>,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Plain {
        pub(super) c: String,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Nullable {
        pub(super) c: Option<String>,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct A {
        pub(super) a: u32,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct AWithDefaultB {
        pub(super) a: u32,
        #[serde(default)]
        pub(super) b: String,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct AWithB {
        pub(super) a: u32,
        pub(super) b: String,
    }
    #[derive(Serialize, Deserialize, JsonSchema, Default)]
    #[serde(default)]
    pub(super) struct AllDefault {
        pub(super) a: u32,
        pub(super) b: u32,
    }
}

#[test]
fn a_defaulted_field_is_always_written_so_requiring_it_later_is_compatible() {
    use defaults::*;
    // Before: the writer was judged by the deserialize contract, where `n` is optional,
    // and BACKWARD was refused with required-added, although serde reads every document.
    case(
        "defaulted -> required",
        &[Defaulted { n: 0 }, Defaulted { n: 7 }],
        &[Required { n: 3 }],
        Reads::Both,
    );
}

#[test]
fn defaults_skips_and_nulls_are_judged_as_serde_reads_them() {
    use defaults::*;
    case(
        "skipped -> plain",
        &[Skipped { c: None }, Skipped { c: Some("x".into()) }],
        &[Plain { c: "y".into() }],
        Reads::OnlyForward,
    );
    case(
        "nullable -> plain",
        &[Nullable { c: None }, Nullable { c: Some("x".into()) }],
        &[Plain { c: "y".into() }],
        Reads::OnlyForward,
    );
    case(
        "plain -> skipped",
        &[Plain { c: "y".into() }],
        &[Skipped { c: None }, Skipped { c: Some("x".into()) }],
        Reads::OnlyBackward,
    );
    case("field added with a default", &[A { a: 1 }], &[AWithDefaultB { a: 1, b: "b".into() }], Reads::Both);
    case("field added, required", &[A { a: 1 }], &[AWithB { a: 1, b: "b".into() }], Reads::OnlyForward);
    case("container default", &[A { a: 1 }], &[AllDefault { a: 1, b: 2 }], Reads::Both);
}

mod renames {
    use super::*;

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Renamed {
        #[serde(rename = "amount")]
        pub(super) cents: i64,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Amount {
        pub(super) amount: i64,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct Camel {
        pub(super) total_cents: i64,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Snake {
        pub(super) total_cents: i64,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Id(pub(super) u64);
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct WithNewtype {
        pub(super) id: Id,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct WithU64 {
        pub(super) id: u64,
    }
}

#[test]
fn renames_and_newtypes_are_judged_by_the_json_they_make() {
    use renames::*;
    case("rename to the same name", &[Renamed { cents: 5 }], &[Amount { amount: 5 }], Reads::Both);
    case(
        "rename_all changes every name",
        &[Camel { total_cents: 5 }],
        &[Snake { total_cents: 5 }],
        Reads::Neither,
    );
    case("newtype to its inner type", &[WithNewtype { id: Id(9) }], &[WithU64 { id: 9 }], Reads::Both);
}

mod shapes {
    use super::*;

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Map32 {
        pub(super) m: BTreeMap<String, u32>,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Map64 {
        pub(super) m: BTreeMap<String, u64>,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Pair {
        pub(super) t: (u32, String),
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Triple {
        pub(super) t: (u32, String, bool),
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Node32 {
        pub(super) v: u32,
        pub(super) children: Vec<Node32>,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Node64 {
        pub(super) v: u64,
        pub(super) children: Vec<Node64>,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct U8 {
        pub(super) n: u8,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct I8 {
        pub(super) n: i8,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct I32 {
        pub(super) n: i32,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct I64 {
        pub(super) n: i64,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct F64 {
        pub(super) n: f64,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct AB {
        pub(super) a: u32,
        pub(super) b: u32,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub(super) struct OnlyA {
        pub(super) a: u32,
    }
}

#[test]
fn maps_tuples_recursion_and_integer_widths_follow_serde() {
    use shapes::*;
    let m = |v: u64| BTreeMap::from([("k".to_owned(), v)]);
    case(
        "map values widened",
        &[Map32 { m: BTreeMap::from([("k".to_owned(), 1)]) }],
        &[Map64 { m: m(1) }, Map64 { m: m(5_000_000_000) }],
        Reads::OnlyBackward,
    );
    case(
        "tuple grew",
        &[Pair { t: (1, "a".into()) }],
        &[Triple { t: (1, "a".into(), true) }],
        Reads::Neither,
    );
    let deep = |v: u64| Node64 {
        v: 1,
        children: vec![Node64 { v: 2, children: vec![Node64 { v, children: vec![] }] }],
    };
    case(
        "recursive type widened",
        &[Node32 { v: 1, children: vec![Node32 { v: 2, children: vec![] }] }],
        &[deep(3), deep(u64::MAX)],
        Reads::OnlyBackward,
    );
    case("u8 to i8", &[U8 { n: 1 }, U8 { n: 200 }], &[I8 { n: 1 }, I8 { n: -1 }], Reads::Neither);
    case("i32 to i64", &[I32 { n: -5 }], &[I64 { n: -5 }, I64 { n: i64::MAX }], Reads::OnlyBackward);
    case("integer to float", &[I64 { n: 3 }], &[F64 { n: 0.5 }], Reads::OnlyBackward);
    let old = [crate::schema::serde_tests::defaults::AWithDefaultB { a: 1, b: "b".into() }];
    case("closed reader", &old, &[OnlyA { a: 1 }], Reads::OnlyForward);
}
