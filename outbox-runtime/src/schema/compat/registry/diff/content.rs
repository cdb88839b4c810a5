//! Objects and arrays: properties and items against open, partially open and closed
//! content models (CONFLUENT.md §4.7, §4.8).

use std::collections::BTreeSet;

use super::values::{
    bound, MAX_CONTAINS, MAX_ITEMS, MAX_PROPERTIES, MIN_CONTAINS, MIN_ITEMS, MIN_PROPERTIES,
};
use super::{at, under, Diff, Pass};
use crate::schema::compat::registry::load::{Arr, Graph, Id, Obj, Shape};
use crate::schema::compat::registry::Kind;
use serde_json::Number;

impl Pass<'_> {
    pub(super) fn objects(&mut self, o: &Obj, u: &Obj, out: &mut Vec<Diff>) {
        let required = |x: &Obj, k: &str| x.required.iter().any(|r| r == k);
        for k in o.properties.keys().filter(|k| u.properties.contains_key(*k)) {
            let segment = format!("required/{k}");
            match (required(o, k), required(u, k)) {
                (true, false) => {
                    out.push(Diff { kind: Kind::RequiredAttributeRemoved, path: split(&segment) })
                }
                (false, true) => {
                    let kind = if self.u().node(u.properties[k]).common.default.is_some() {
                        Kind::RequiredAttributeWithDefaultAdded
                    } else {
                        Kind::RequiredAttributeAdded
                    };
                    out.push(Diff { kind, path: split(&segment) });
                }
                _ => {}
            }
        }
        let names: BTreeSet<&String> = o.properties.keys().chain(u.properties.keys()).collect();
        for k in names {
            let path = split(&format!("properties/{k}"));
            let mark = |kind| Diff { kind, path: path.clone() };
            match (o.properties.get(k), u.properties.get(k)) {
                (Some(&a), Some(&b)) => {
                    let sub = self.compare(Some(a), Some(b));
                    out.extend(prefixed(&path, sub));
                }
                (Some(&a), None) => {
                    let (open, partial) = (open_object(self.u(), u), partial_object(self.u(), u, k));
                    self.removed(a, open, partial, &path, &PROPERTY_REMOVED, out);
                }
                (None, Some(&b)) => {
                    let has_default = self.u().node(b).common.default.is_some();
                    if open_object(self.o(), o) {
                        out.push(mark(if self.u().node(b).shape.is_empty() {
                            Kind::PropertyWithEmptySchemaAddedToOpenContentModel
                        } else if !required(u, k) {
                            Kind::OptionalPropertyAddedToOpenContentModel
                        } else if has_default {
                            Kind::RequiredPropertyWithDefaultAddedToOpenContentModel
                        } else {
                            Kind::RequiredPropertyAddedToOpenContentModel
                        }));
                    } else {
                        if let Some(s) = partial_object(self.o(), o, k) {
                            let covered = [
                                Kind::PropertyAddedIsCoveredByPartiallyOpenContentModel,
                                Kind::PropertyAddedNotCoveredByPartiallyOpenContentModel,
                            ];
                            self.covered(s, b, &path, covered, out);
                        }
                        out.push(mark(if !required(u, k) {
                            Kind::OptionalPropertyAddedToUnopenContentModel
                        } else if has_default {
                            Kind::RequiredPropertyWithDefaultAddedToUnopenContentModel
                        } else {
                            Kind::RequiredPropertyAddedToUnopenContentModel
                        }));
                    }
                }
                (None, None) => {}
            }
        }
        let deps: BTreeSet<&String> =
            o.property_dependencies.keys().chain(u.property_dependencies.keys()).collect();
        for k in deps {
            let kind = match (o.property_dependencies.get(k), u.property_dependencies.get(k)) {
                (Some(_), None) => Kind::DependencyArrayRemoved,
                (None, Some(_)) => Kind::DependencyArrayAdded,
                (Some(a), Some(b)) => {
                    let (b_has_a, a_has_b) =
                        (a.iter().all(|n| b.contains(n)), b.iter().all(|n| a.contains(n)));
                    match (b_has_a, a_has_b) {
                        (true, true) => continue,
                        (true, false) => Kind::DependencyArrayExtended,
                        (false, true) => Kind::DependencyArrayNarrowed,
                        (false, false) => Kind::DependencyArrayChanged,
                    }
                }
                (None, None) => continue,
            };
            out.push(Diff { kind, path: vec!["dependencies".to_owned(), k.clone()] });
        }
        let deps: BTreeSet<&String> =
            o.schema_dependencies.keys().chain(u.schema_dependencies.keys()).collect();
        for k in deps {
            let path = vec!["dependencies".to_owned(), k.clone()];
            match (o.schema_dependencies.get(k), u.schema_dependencies.get(k)) {
                (Some(_), None) => out.push(Diff { kind: Kind::DependencySchemaRemoved, path }),
                (None, Some(_)) => out.push(Diff { kind: Kind::DependencySchemaAdded, path }),
                (Some(&a), Some(&b)) => {
                    let sub = self.compare(Some(a), Some(b));
                    out.extend(prefixed(&path, sub));
                }
                (None, None) => {}
            }
        }
        let (before, after) = ((o.permits_additional, o.additional), (u.permits_additional, u.additional));
        self.additional(before, after, "additionalProperties", ADDITIONAL_PROPERTIES, out);
        let unevaluated =
            self.unevaluated(o.unevaluated, u.unevaluated, "unevaluatedProperties", UNEVALUATED_PROPERTIES);
        out.extend(unevaluated);
        bound(&o.max_properties, &u.max_properties, "maxProperties", MAX_PROPERTIES, out);
        bound(&o.min_properties, &u.min_properties, "minProperties", MIN_PROPERTIES, out);
    }

    /// A property or tuple item the update no longer declares: what stands for it now.
    fn removed(
        &mut self,
        a: Id,
        open: bool,
        partial: Option<Id>,
        path: &[String],
        kinds: &Removed,
        out: &mut Vec<Diff>,
    ) {
        let kind = if open {
            kinds.from_open
        } else if let Some(s) = partial {
            return self.covered(a, s, path, kinds.covered, out);
        } else if matches!(self.o().node(a).shape, Shape::False) {
            kinds.false_one
        } else {
            kinds.from_closed
        };
        out.push(Diff { kind, path: path.to_vec() });
    }

    /// A member checked against the partially open model that covers it: the check's
    /// differences, then whether it covered (`kinds`: covered, not covered).
    fn covered(&mut self, o: Id, u: Id, path: &[String], kinds: [Kind; 2], out: &mut Vec<Diff>) {
        let sub = self.compare(Some(o), Some(u));
        let kind = if self.ok(&sub) { kinds[0] } else { kinds[1] };
        out.extend(prefixed(path, sub));
        out.push(Diff { kind, path: path.to_vec() });
    }

    /// `additionalProperties`/`additionalItems`, each side as (permitted, schema); kinds
    /// are (added, removed, extended, narrowed).
    fn additional(
        &mut self,
        (o_permits, o_schema): (bool, Option<Id>),
        (u_permits, u_schema): (bool, Option<Id>),
        segment: &str,
        kinds: [Kind; 4],
        out: &mut Vec<Diff>,
    ) {
        let [added, removed, extended, narrowed] = kinds;
        match (o_schema, u_schema) {
            _ if o_permits != u_permits => out.push(at(if u_permits { added } else { removed }, segment)),
            (None, Some(_)) => out.push(at(narrowed, segment)),
            (Some(_), None) => out.push(at(extended, segment)),
            (Some(a), Some(b)) => {
                let sub = self.compare(Some(a), Some(b));
                out.extend(under(segment, sub));
            }
            (None, None) => {}
        }
    }

    /// `unevaluatedProperties`/`unevaluatedItems`: kinds are (added, removed, extended, narrowed).
    fn unevaluated(&mut self, o: Option<Id>, u: Option<Id>, segment: &str, kinds: [Kind; 4]) -> Vec<Diff> {
        let [added, removed, extended, narrowed] = kinds;
        // `instanceof` on the schema as written: a `$ref` to `false` is not `false` here.
        let shape = |g: &Graph, id: Id| g.node(id).shape.clone();
        let kind = match (o, u) {
            (None, None) => return Vec::new(),
            (None, Some(b)) => {
                if shape(self.u(), b) == Shape::False {
                    removed
                } else {
                    narrowed
                }
            }
            (Some(a), None) => {
                if shape(self.o(), a) == Shape::False {
                    added
                } else {
                    extended
                }
            }
            (Some(a), Some(b)) => {
                let (sa, sb) = (shape(self.o(), a), shape(self.u(), b));
                if sa == Shape::False && sb != Shape::False {
                    added
                } else if sa != Shape::False && sb == Shape::False {
                    removed
                } else if sa.is_empty() && !sb.is_empty() {
                    narrowed
                } else if !sa.is_empty() && sb.is_empty() {
                    extended
                } else {
                    return under(segment, self.compare(Some(a), Some(b))).collect();
                }
            }
        };
        vec![at(kind, segment)]
    }

    pub(super) fn arrays(&mut self, o: &Arr, u: &Arr, out: &mut Vec<Diff>) {
        let items = self.compare(o.all_items, u.all_items);
        out.extend(under("items", items));
        let (os, us) =
            (o.item_schemas.clone().unwrap_or_default(), u.item_schemas.clone().unwrap_or_default());
        for i in 0..os.len().max(us.len()) {
            let path = vec!["items".to_owned(), i.to_string()];
            match (os.get(i), us.get(i)) {
                (Some(&a), Some(&b)) => {
                    let sub = self.compare(Some(a), Some(b));
                    out.extend(prefixed(&path, sub));
                }
                (Some(&a), None) => {
                    let (open, partial) = (open_array(self.u(), u), partial_array(self.u(), u));
                    self.removed(a, open, partial, &path, &ITEM_REMOVED, out);
                }
                (None, Some(&b)) => {
                    if open_array(self.o(), o) {
                        let kind = if self.u().node(b).shape.is_empty() {
                            Kind::ItemWithEmptySchemaAddedToOpenContentModel
                        } else {
                            Kind::ItemAddedToOpenContentModel
                        };
                        out.push(Diff { kind, path });
                    } else if let Some(s) = partial_array(self.o(), o) {
                        let covered = [
                            Kind::ItemAddedIsCoveredByPartiallyOpenContentModel,
                            Kind::ItemAddedNotCoveredByPartiallyOpenContentModel,
                        ];
                        self.covered(s, b, &path, covered, out);
                    } else {
                        out.push(Diff { kind: Kind::ItemAddedToClosedContentModel, path });
                    }
                }
                (None, None) => {}
            }
        }
        let (before, after) = ((o.permits_additional, o.additional), (u.permits_additional, u.additional));
        self.additional(before, after, "additionalItems", ADDITIONAL_ITEMS, out);
        let unevaluated =
            self.unevaluated(o.unevaluated, u.unevaluated, "unevaluatedItems", UNEVALUATED_ITEMS);
        out.extend(unevaluated);
        bound(&o.max_items, &u.max_items, "maxItems", MAX_ITEMS, out);
        bound(&o.min_items, &u.min_items, "minItems", MIN_ITEMS, out);
        match (o.unique_items, u.unique_items) {
            (true, false) => out.push(at(Kind::UniqueItemsRemoved, "uniqueItems")),
            (false, true) => out.push(at(Kind::UniqueItemsAdded, "uniqueItems")),
            _ => {}
        }
        // Compared by intValue.
        let int = |n: &Option<Number>| n.as_ref().map(|n| Number::from(n.as_f64().unwrap_or(0.0) as i64));
        bound(&int(&o.max_contains), &int(&u.max_contains), "maxContains", MAX_CONTAINS, out);
        bound(&int(&o.min_contains), &int(&u.min_contains), "minContains", MIN_CONTAINS, out);
    }
}

/// `diffs` below `path`.
fn prefixed(path: &[String], diffs: Vec<Diff>) -> Vec<Diff> {
    diffs
        .into_iter()
        .map(|mut d| {
            d.path.splice(0..0, path.iter().cloned());
            d
        })
        .collect()
}

/// The kinds of a member the update no longer declares.
struct Removed {
    from_open: Kind,
    /// Covered and not covered by a partially open model.
    covered: [Kind; 2],
    false_one: Kind,
    from_closed: Kind,
}

const PROPERTY_REMOVED: Removed = Removed {
    from_open: Kind::PropertyRemovedFromOpenContentModel,
    covered: [
        Kind::PropertyRemovedIsCoveredByPartiallyOpenContentModel,
        Kind::PropertyRemovedNotCoveredByPartiallyOpenContentModel,
    ],
    false_one: Kind::PropertyWithFalseRemovedFromClosedContentModel,
    from_closed: Kind::PropertyRemovedFromClosedContentModel,
};

const ITEM_REMOVED: Removed = Removed {
    from_open: Kind::ItemRemovedFromOpenContentModel,
    covered: [
        Kind::ItemRemovedIsCoveredByPartiallyOpenContentModel,
        Kind::ItemRemovedNotCoveredByPartiallyOpenContentModel,
    ],
    false_one: Kind::ItemWithFalseRemovedFromClosedContentModel,
    from_closed: Kind::ItemRemovedFromClosedContentModel,
};

const ADDITIONAL_PROPERTIES: [Kind; 4] = [
    Kind::AdditionalPropertiesAdded,
    Kind::AdditionalPropertiesRemoved,
    Kind::AdditionalPropertiesExtended,
    Kind::AdditionalPropertiesNarrowed,
];
const ADDITIONAL_ITEMS: [Kind; 4] = [
    Kind::AdditionalItemsAdded,
    Kind::AdditionalItemsRemoved,
    Kind::AdditionalItemsExtended,
    Kind::AdditionalItemsNarrowed,
];

const UNEVALUATED_PROPERTIES: [Kind; 4] = [
    Kind::UnevaluatedPropertiesAdded,
    Kind::UnevaluatedPropertiesRemoved,
    Kind::UnevaluatedPropertiesExtended,
    Kind::UnevaluatedPropertiesNarrowed,
];
const UNEVALUATED_ITEMS: [Kind; 4] = [
    Kind::UnevaluatedItemsAdded,
    Kind::UnevaluatedItemsRemoved,
    Kind::UnevaluatedItemsExtended,
    Kind::UnevaluatedItemsNarrowed,
];

fn split(path: &str) -> Vec<String> {
    let (head, tail) = path.split_once('/').unwrap_or((path, ""));
    vec![head.to_owned(), tail.to_owned()]
}

fn open_object(g: &Graph, x: &Obj) -> bool {
    x.permits_additional
        && x.additional.is_none()
        && x.pattern_properties.is_empty()
        && x.unevaluated.is_none_or(|e| g.node(e).shape.is_empty())
}

fn partial_object(g: &Graph, x: &Obj, name: &str) -> Option<Id> {
    for (pattern, schema) in &x.pattern_properties {
        if crate::schema::document::ecma_regex(pattern).is_ok_and(|re| re.find(name).is_some()) {
            return Some(*schema);
        }
    }
    if x.additional.is_some() {
        return x.additional;
    }
    let uneval = x.unevaluated?;
    let shape = &g.node(uneval).shape;
    (x.permits_additional && !shape.is_empty() && *shape != Shape::False).then_some(uneval)
}

fn open_array(g: &Graph, x: &Arr) -> bool {
    x.permits_additional && x.additional.is_none() && x.unevaluated.is_none_or(|e| g.node(e).shape.is_empty())
}

fn partial_array(g: &Graph, x: &Arr) -> Option<Id> {
    if x.additional.is_some() {
        return x.additional;
    }
    let uneval = x.unevaluated?;
    let shape = &g.node(uneval).shape;
    (x.permits_additional && !shape.is_empty() && *shape != Shape::False).then_some(uneval)
}
