//! The checker against serde itself: for pairs of Rust types (old, new), sample values of
//! the writer type are serialized with serde_json and read with the reader type, and the
//! checker's verdict must be serde's, in both directions. Every "incompatible" verdict is
//! shown by a sample serde cannot read, and every "compatible" one by serde reading every
//! sample. The shapes are those that schemars splits over several schema objects or that
//! its two contracts tell apart: tagged and untagged enums, flatten, defaults,
//! `skip_serializing_if`, renames, maps, tuples, recursion and integer widths.

#![allow(dead_code)] // The types exist for their schemas and serde impls.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{compare, document, Mode, SchemaDoc};
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
enum Reads {
    /// New reads old, and old reads new.
    Both,
    /// Only BACKWARD holds: new reads old, old cannot read new.
    OnlyBackward,
    /// Only FORWARD holds: old reads new, new cannot read old.
    OnlyForward,
    Neither,
}

fn case<Old, New>(name: &'static str, old: &[Old], new: &[New], expected: Reads)
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
    let backward = compare(&old_doc, &new_doc, Mode::Backward);
    let forward = compare(&old_doc, &new_doc, Mode::Forward);
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

mod tagged {
    use super::*;

    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct CardV1 {
        pub(super) last4: String,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct CardV2 {
        pub(super) last4: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(super) brand: Option<String>,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "kind")]
    pub(super) enum PayV1 {
        Card(CardV1),
        Cash,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "kind")]
    pub(super) enum PayV2 {
        Card(CardV2),
        Cash,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "kind")]
    pub(super) enum PayV3 {
        Card(CardV2),
        Cash,
        Voucher { code: String },
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Order<P> {
        pub(super) id: u64,
        pub(super) payment: P,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "type", content = "data")]
    pub(super) enum AdjacentV1 {
        Paid(u64),
        Refunded { cents: i64 },
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "type", content = "data")]
    pub(super) enum AdjacentV2 {
        Paid(u64),
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) enum ExternalV1 {
        A,
        B(u32),
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) enum ExternalV2 {
        A,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(untagged)]
    pub(super) enum NumOrText {
        N(i64),
        S(String),
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Untagged {
        pub(super) v: NumOrText,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Number {
        pub(super) v: i64,
    }
}

#[test]
fn internally_tagged_variants_whose_struct_is_a_ref_keep_their_tag() {
    use tagged::*;
    // Before: the tag beside the variant's `$ref` was lost, and BACKWARD said
    // required-added for `kind`, although serde reads every document.
    let v1 = [
        Order { id: 1, payment: PayV1::Card(CardV1 { last4: "4242".into() }) },
        Order { id: 2, payment: PayV1::Cash },
    ];
    let v2 = [
        Order { id: 1, payment: PayV2::Card(CardV2 { last4: "4242".into(), brand: Some("visa".into()) }) },
        Order { id: 2, payment: PayV2::Card(CardV2 { last4: "1111".into(), brand: None }) },
        Order { id: 3, payment: PayV2::Cash },
    ];
    case("optional field in a tagged variant's struct", &v1, &v2, Reads::Both);
    let v3 = [
        Order { id: 1, payment: PayV3::Cash },
        Order { id: 2, payment: PayV3::Voucher { code: "X".into() } },
    ];
    case("variant added", &v2, &v3, Reads::OnlyBackward);
}

#[test]
fn adjacent_external_and_untagged_enums_follow_serde() {
    use tagged::*;
    case(
        "adjacent variant removed",
        &[AdjacentV1::Paid(1), AdjacentV1::Refunded { cents: 5 }],
        &[AdjacentV2::Paid(1)],
        Reads::OnlyForward,
    );
    case(
        "external variant removed",
        &[ExternalV1::A, ExternalV1::B(3)],
        &[ExternalV2::A],
        Reads::OnlyForward,
    );
    case(
        "untagged narrowed",
        &[Untagged { v: NumOrText::N(1) }, Untagged { v: NumOrText::S("x".into()) }],
        &[Number { v: 1 }],
        Reads::OnlyForward,
    );
}

mod flatten {
    use super::*;

    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "method")]
    pub(super) enum Method {
        Card { last4: String },
        Cash,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct PaymentV1 {
        pub(super) id: u64,
        #[serde(flatten)]
        pub(super) method: Method,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct PaymentV2 {
        pub(super) id: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(super) note: Option<String>,
        #[serde(flatten)]
        pub(super) method: Method,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct PaymentV3 {
        pub(super) id: u64,
        pub(super) note: String,
        #[serde(flatten)]
        pub(super) method: Method,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Meta {
        pub(super) a: u32,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Flat {
        pub(super) id: u64,
        #[serde(flatten)]
        pub(super) meta: Meta,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Inline {
        pub(super) id: u64,
        pub(super) a: u32,
    }
}

#[test]
fn a_flattened_enum_keeps_the_structs_own_properties() {
    use flatten::*;
    let v1 = [
        PaymentV1 { id: 1, method: Method::Card { last4: "4242".into() } },
        PaymentV1 { id: 2, method: Method::Cash },
    ];
    let v2 = [
        PaymentV2 { id: 1, note: Some("n".into()), method: Method::Cash },
        PaymentV2 { id: 2, note: None, method: Method::Card { last4: "1".into() } },
    ];
    case("optional field beside a flattened enum", &v1, &v2, Reads::Both);
    let v3 = [PaymentV3 { id: 1, note: "n".into(), method: Method::Cash }];
    case("required field beside a flattened enum", &v1, &v3, Reads::OnlyForward);
    case(
        "flattened struct to inline fields",
        &[Flat { id: 1, meta: Meta { a: 2 } }],
        &[Inline { id: 1, a: 2 }],
        Reads::Both,
    );
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

mod closed {
    use super::*;

    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "method")]
    pub(super) enum Method {
        Card { last4: String },
        Cash,
    }
    /// A flattened tagged enum beside a flattened map of integers: serde hands the map
    /// the tag and the variant's fields too, and cannot read its own output.
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct WithMap {
        pub(super) id: u64,
        #[serde(flatten)]
        pub(super) method: Method,
        #[serde(flatten)]
        pub(super) extra: BTreeMap<String, u32>,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Card {
        pub(super) last4: String,
    }
    /// `deny_unknown_fields` on an internally tagged variant's struct: serde takes the
    /// tag off first, so the struct never sees it.
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "kind")]
    pub(super) enum Pay {
        Card(Card),
        Cash,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    pub(super) struct Order {
        pub(super) id: u64,
        pub(super) pay: Pay,
    }
}

#[test]
fn what_restricts_undeclared_properties_is_not_merged_away() {
    use closed::*;
    // Each type against itself: the checker must not call a type compatible with itself
    // when serde cannot read its own output, nor refuse one serde reads.
    let with_map = [WithMap { id: 1, method: Method::Cash, extra: BTreeMap::from([("n".to_owned(), 1)]) }];
    case("flattened enum beside a flattened map", &with_map, &with_map, Reads::Neither);
    let orders =
        [Order { id: 1, pay: Pay::Card(Card { last4: "4242".into() }) }, Order { id: 2, pay: Pay::Cash }];
    case("deny_unknown_fields on a tagged variant", &orders, &orders, Reads::Both);
}
