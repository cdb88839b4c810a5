//! What Confluent Schema Registry says of a JSON Schema change: an emulation of its
//! structural diff (`json-schema-provider`'s `SchemaDiff`), as `../CONFLUENT.md` writes it
//! up, so that `--semantics json-schema` can predict the registry's verdict, not only
//! judge the change by the values it lets through.
//!
//! The registry does not ask whether every value the old schema accepts, the new one
//! accepts. It loads both documents into a model of node kinds (a string, a number, an
//! object, a combination, ...), walks them side by side, and names each difference
//! (`OPTIONAL_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL at #/properties/b`); a change is
//! compatible when every difference is in its policy's set of compatible ones. That reads
//! some sound changes as breaking (a `format` beside `type: integer` is, to its draft-07
//! loader, an added string schema) and lets some breaking ones through (it never compares
//! `format` or `propertyNames`): the instance check answers the second, this the first.

use std::fmt;

use serde_json::Value;

mod diff;
mod load;

#[cfg(test)]
mod tests;

macro_rules! kinds {
    ($($kind:ident $name:literal $strict:literal $lenient:literal,)*) => {
        /// A difference type of the registry's diff, by its name there.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub(crate) enum Kind { $($kind,)* }

        impl Kind {
            /// The registry's name (`TYPE_CHANGED`).
            pub(crate) fn name(self) -> &'static str {
                match self { $(Kind::$kind => $name,)* }
            }

            /// In the policy's set of compatible changes.
            pub(crate) fn compatible(self, lenient: bool) -> bool {
                match self { $(Kind::$kind => if lenient { $lenient } else { $strict },)* }
            }

            #[cfg(test)]
            pub(crate) const ALL: &'static [Kind] = &[$(Kind::$kind,)*];
        }
    };
}

// Every type the diff emits, with its membership of COMPATIBLE_CHANGES_STRICT and
// COMPATIBLE_CHANGES_LENIENT (CONFLUENT.md §2; the reserved-field and deprecated types,
// which the diff never emits, are left out).
kinds! {
    IdChanged "ID_CHANGED" true true,
    DescriptionChanged "DESCRIPTION_CHANGED" true true,
    TitleChanged "TITLE_CHANGED" true true,
    DefaultChanged "DEFAULT_CHANGED" true true,
    SchemaAdded "SCHEMA_ADDED" false false,
    SchemaRemoved "SCHEMA_REMOVED" true true,
    TypeExtended "TYPE_EXTENDED" true true,
    TypeNarrowed "TYPE_NARROWED" false false,
    TypeChanged "TYPE_CHANGED" false false,
    MaxLengthAdded "MAX_LENGTH_ADDED" false false,
    MaxLengthRemoved "MAX_LENGTH_REMOVED" true true,
    MaxLengthIncreased "MAX_LENGTH_INCREASED" true true,
    MaxLengthDecreased "MAX_LENGTH_DECREASED" false false,
    MinLengthAdded "MIN_LENGTH_ADDED" false false,
    MinLengthRemoved "MIN_LENGTH_REMOVED" true true,
    MinLengthIncreased "MIN_LENGTH_INCREASED" false false,
    MinLengthDecreased "MIN_LENGTH_DECREASED" true true,
    PatternAdded "PATTERN_ADDED" false false,
    PatternRemoved "PATTERN_REMOVED" true true,
    PatternChanged "PATTERN_CHANGED" false false,
    MaximumAdded "MAXIMUM_ADDED" false false,
    MaximumRemoved "MAXIMUM_REMOVED" true true,
    MaximumIncreased "MAXIMUM_INCREASED" true true,
    MaximumDecreased "MAXIMUM_DECREASED" false false,
    MinimumAdded "MINIMUM_ADDED" false false,
    MinimumRemoved "MINIMUM_REMOVED" true true,
    MinimumIncreased "MINIMUM_INCREASED" false false,
    MinimumDecreased "MINIMUM_DECREASED" true true,
    ExclusiveMaximumAdded "EXCLUSIVE_MAXIMUM_ADDED" false false,
    ExclusiveMaximumRemoved "EXCLUSIVE_MAXIMUM_REMOVED" true true,
    ExclusiveMaximumIncreased "EXCLUSIVE_MAXIMUM_INCREASED" true true,
    ExclusiveMaximumDecreased "EXCLUSIVE_MAXIMUM_DECREASED" false false,
    ExclusiveMinimumAdded "EXCLUSIVE_MINIMUM_ADDED" false false,
    ExclusiveMinimumRemoved "EXCLUSIVE_MINIMUM_REMOVED" true true,
    ExclusiveMinimumIncreased "EXCLUSIVE_MINIMUM_INCREASED" false false,
    ExclusiveMinimumDecreased "EXCLUSIVE_MINIMUM_DECREASED" true true,
    MultipleOfAdded "MULTIPLE_OF_ADDED" false false,
    MultipleOfRemoved "MULTIPLE_OF_REMOVED" true true,
    MultipleOfExpanded "MULTIPLE_OF_EXPANDED" false false,
    MultipleOfReduced "MULTIPLE_OF_REDUCED" true true,
    MultipleOfChanged "MULTIPLE_OF_CHANGED" false false,
    RequiredAttributeAdded "REQUIRED_ATTRIBUTE_ADDED" false false,
    RequiredAttributeWithDefaultAdded "REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED" true true,
    RequiredAttributeRemoved "REQUIRED_ATTRIBUTE_REMOVED" true true,
    MaxPropertiesAdded "MAX_PROPERTIES_ADDED" false false,
    MaxPropertiesRemoved "MAX_PROPERTIES_REMOVED" true true,
    MaxPropertiesIncreased "MAX_PROPERTIES_INCREASED" true true,
    MaxPropertiesDecreased "MAX_PROPERTIES_DECREASED" false false,
    MinPropertiesAdded "MIN_PROPERTIES_ADDED" false false,
    MinPropertiesRemoved "MIN_PROPERTIES_REMOVED" true true,
    MinPropertiesIncreased "MIN_PROPERTIES_INCREASED" false false,
    MinPropertiesDecreased "MIN_PROPERTIES_DECREASED" true true,
    AdditionalPropertiesAdded "ADDITIONAL_PROPERTIES_ADDED" true true,
    AdditionalPropertiesRemoved "ADDITIONAL_PROPERTIES_REMOVED" false true,
    AdditionalPropertiesExtended "ADDITIONAL_PROPERTIES_EXTENDED" true true,
    AdditionalPropertiesNarrowed "ADDITIONAL_PROPERTIES_NARROWED" false true,
    DependencyArrayAdded "DEPENDENCY_ARRAY_ADDED" false false,
    DependencyArrayRemoved "DEPENDENCY_ARRAY_REMOVED" true true,
    DependencyArrayExtended "DEPENDENCY_ARRAY_EXTENDED" false false,
    DependencyArrayNarrowed "DEPENDENCY_ARRAY_NARROWED" true true,
    DependencyArrayChanged "DEPENDENCY_ARRAY_CHANGED" false false,
    DependencySchemaAdded "DEPENDENCY_SCHEMA_ADDED" false false,
    DependencySchemaRemoved "DEPENDENCY_SCHEMA_REMOVED" true true,
    RequiredPropertyAddedToOpenContentModel "REQUIRED_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL" false false,
    RequiredPropertyWithDefaultAddedToOpenContentModel "REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_OPEN_CONTENT_MODEL" false true,
    OptionalPropertyAddedToOpenContentModel "OPTIONAL_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL" false true,
    PropertyWithEmptySchemaAddedToOpenContentModel "PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL" true true,
    RequiredPropertyAddedToUnopenContentModel "REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL" false false,
    RequiredPropertyWithDefaultAddedToUnopenContentModel "REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL" true true,
    OptionalPropertyAddedToUnopenContentModel "OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL" true true,
    PropertyRemovedFromOpenContentModel "PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL" true true,
    PropertyWithFalseRemovedFromClosedContentModel "PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL" true true,
    PropertyRemovedFromClosedContentModel "PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL" false true,
    PropertyRemovedIsCoveredByPartiallyOpenContentModel "PROPERTY_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" true true,
    PropertyRemovedNotCoveredByPartiallyOpenContentModel "PROPERTY_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" false true,
    PropertyAddedIsCoveredByPartiallyOpenContentModel "PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" true true,
    PropertyAddedNotCoveredByPartiallyOpenContentModel "PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" false true,
    UnevaluatedPropertiesAdded "UNEVALUATED_PROPERTIES_ADDED" true true,
    UnevaluatedPropertiesRemoved "UNEVALUATED_PROPERTIES_REMOVED" false true,
    UnevaluatedPropertiesExtended "UNEVALUATED_PROPERTIES_EXTENDED" true true,
    UnevaluatedPropertiesNarrowed "UNEVALUATED_PROPERTIES_NARROWED" false true,
    MaxItemsAdded "MAX_ITEMS_ADDED" false false,
    MaxItemsRemoved "MAX_ITEMS_REMOVED" true true,
    MaxItemsIncreased "MAX_ITEMS_INCREASED" true true,
    MaxItemsDecreased "MAX_ITEMS_DECREASED" false false,
    MinItemsAdded "MIN_ITEMS_ADDED" false false,
    MinItemsRemoved "MIN_ITEMS_REMOVED" true true,
    MinItemsIncreased "MIN_ITEMS_INCREASED" false false,
    MinItemsDecreased "MIN_ITEMS_DECREASED" true true,
    MaxContainsAdded "MAX_CONTAINS_ADDED" false false,
    MaxContainsRemoved "MAX_CONTAINS_REMOVED" true true,
    MaxContainsIncreased "MAX_CONTAINS_INCREASED" true true,
    MaxContainsDecreased "MAX_CONTAINS_DECREASED" false false,
    MinContainsAdded "MIN_CONTAINS_ADDED" false false,
    MinContainsRemoved "MIN_CONTAINS_REMOVED" true true,
    MinContainsIncreased "MIN_CONTAINS_INCREASED" false false,
    MinContainsDecreased "MIN_CONTAINS_DECREASED" true true,
    UniqueItemsAdded "UNIQUE_ITEMS_ADDED" false false,
    UniqueItemsRemoved "UNIQUE_ITEMS_REMOVED" true true,
    AdditionalItemsAdded "ADDITIONAL_ITEMS_ADDED" true true,
    AdditionalItemsRemoved "ADDITIONAL_ITEMS_REMOVED" false false,
    AdditionalItemsExtended "ADDITIONAL_ITEMS_EXTENDED" true true,
    AdditionalItemsNarrowed "ADDITIONAL_ITEMS_NARROWED" false false,
    UnevaluatedItemsAdded "UNEVALUATED_ITEMS_ADDED" true true,
    UnevaluatedItemsRemoved "UNEVALUATED_ITEMS_REMOVED" false false,
    UnevaluatedItemsExtended "UNEVALUATED_ITEMS_EXTENDED" true true,
    UnevaluatedItemsNarrowed "UNEVALUATED_ITEMS_NARROWED" false false,
    ItemAddedToOpenContentModel "ITEM_ADDED_TO_OPEN_CONTENT_MODEL" false false,
    ItemWithEmptySchemaAddedToOpenContentModel "ITEM_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL" true true,
    ItemAddedToClosedContentModel "ITEM_ADDED_TO_CLOSED_CONTENT_MODEL" true true,
    ItemRemovedFromOpenContentModel "ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL" true true,
    ItemWithFalseRemovedFromClosedContentModel "ITEM_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL" true true,
    ItemRemovedFromClosedContentModel "ITEM_REMOVED_FROM_CLOSED_CONTENT_MODEL" false false,
    ItemRemovedIsCoveredByPartiallyOpenContentModel "ITEM_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" true true,
    ItemRemovedNotCoveredByPartiallyOpenContentModel "ITEM_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" false false,
    ItemAddedIsCoveredByPartiallyOpenContentModel "ITEM_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" true true,
    ItemAddedNotCoveredByPartiallyOpenContentModel "ITEM_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" false false,
    EnumArrayExtended "ENUM_ARRAY_EXTENDED" true true,
    EnumArrayNarrowed "ENUM_ARRAY_NARROWED" false false,
    EnumArrayChanged "ENUM_ARRAY_CHANGED" false false,
    CombinedTypeExtended "COMBINED_TYPE_EXTENDED" true true,
    CombinedTypeChanged "COMBINED_TYPE_CHANGED" false false,
    ProductTypeExtended "PRODUCT_TYPE_EXTENDED" false false,
    ProductTypeNarrowed "PRODUCT_TYPE_NARROWED" true true,
    SumTypeExtended "SUM_TYPE_EXTENDED" true true,
    SumTypeNarrowed "SUM_TYPE_NARROWED" false false,
    CombinedTypeSubschemasChanged "COMBINED_TYPE_SUBSCHEMAS_CHANGED" false false,
    NotTypeExtended "NOT_TYPE_EXTENDED" false false,
    NotTypeNarrowed "NOT_TYPE_NARROWED" true true,
}

/// One difference the registry's diff names, at a path in its notation (`#/properties/b`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Difference {
    pub(crate) kind: Kind,
    pub(crate) path: String,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}", self.kind.name(), self.path)
    }
}

/// Why no list of differences could be given: the emulation does not cover what the
/// documents use (a `$ref` that is not a local JSON pointer, a keyword of an unexpected
/// JSON type, a nesting past its bound).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unpredicted(pub(crate) String);

impl fmt::Display for Unpredicted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot predict the registry's verdict: {}", self.0)
    }
}

/// Every difference the registry names when `update` is checked against `original`
/// (BACKWARD: original = old, update = new; FORWARD swaps them), under its LENIENT
/// policy's sets when `lenient`, else STRICT's. Documents without `$schema` are read as
/// draft-07, as the registry reads them.
pub(crate) fn differences(
    original: &Value,
    update: &Value,
    lenient: bool,
) -> Result<Vec<Difference>, Unpredicted> {
    // The diff recurses once per level compared (up to its bound), on the caller's
    // thread when that is already the checker's deep one.
    let load = || {
        let original = load::Graph::load(original)?;
        let update = load::Graph::load(update)?;
        diff::run(&original, &update, lenient)
    };
    if std::thread::current().name() == Some(super::DEEP_STACK_THREAD) {
        load()
    } else {
        super::on_a_deep_stack(load)
    }
}

/// The differences the registry refuses under the policy (empty: it registers the change).
pub(crate) fn refusals(
    original: &Value,
    update: &Value,
    lenient: bool,
) -> Result<Vec<Difference>, Unpredicted> {
    let mut found = differences(original, update, lenient)?;
    found.retain(|d| !d.kind.compatible(lenient));
    found.sort();
    found.dedup();
    Ok(found)
}
