//! The checker against serde (see `serde_tests`) for enums: internally tagged variants
//! whose struct is a `$ref`, adjacently and externally tagged and untagged enums, enums
//! flattened into a struct, and what restricts undeclared properties beside them.

#![allow(dead_code)] // The types exist for their schemas and serde impls.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::serde_tests::{case, Reads};

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
