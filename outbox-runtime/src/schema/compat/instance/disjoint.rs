//! Whether two schemas share no value: what `not`, `oneOf` and `if` need proved.

use serde_json::Value;

use super::shapes::{items_at, property, range_of};
use super::values::{accepts, finite, forms, Tri, Work};
use super::{step, Side, Step, Ty, ALL_TYPES};
use crate::schema::compat::range::Range;

/// Whether no value is accepted by both `a` and `b` (of type `ty` when given): `Yes` only
/// when proven, `No` with a value both accept, `Unknown` otherwise.
pub(crate) fn disjoint(a: &Side<'_>, b: &Side<'_>, ty: Option<Ty>, work: &mut Work, depth: usize) -> Tri {
    if depth > 24 || !work.spend() {
        return Tri::Unknown;
    }
    let common = a.types() & b.types() & ty.map_or(ALL_TYPES, Ty::bit);
    if common == 0 {
        return Tri::Yes;
    }
    for (x, y) in [(a, b), (b, a)] {
        if let Some(values) = finite(x) {
            let mut out = Tri::Yes;
            // Every form of every value: an instance is one form.
            for v in values.iter().flat_map(|v| forms(v)).filter(|v| common & Ty::of(v).bit() != 0) {
                match (accepts(x, &v, work), accepts(y, &v, work)) {
                    (Tri::No, _) | (_, Tri::No) => {}
                    (Tri::Yes, Tri::Yes) => return Tri::No,
                    _ => out = Tri::Unknown,
                }
            }
            return out;
        }
    }
    // Applicators: widening either side keeps a proof of disjointness sound.
    for (x, y) in [(a, b), (b, a)] {
        if let Some(s) = step(x) {
            return match s {
                Step::Same(x) => disjoint(&x, y, ty, work, depth + 1),
                Step::Union { rest, variants, .. } => {
                    if disjoint(&rest, y, ty, work, depth + 1) == Tri::Yes {
                        return Tri::Yes;
                    }
                    let all = variants.iter().all(|v| {
                        disjoint(&rest.and(v.parts.iter().map(|p| p.value)), y, ty, work, depth + 1)
                            == Tri::Yes
                    });
                    if all {
                        Tri::Yes
                    } else {
                        Tri::Unknown
                    }
                }
                Step::Cond { rest, cond, then, otherwise } => {
                    let first = rest.and(cond.parts.iter().chain(&then.parts).map(|p| p.value));
                    let second = rest.and(otherwise.parts.iter().map(|p| p.value));
                    if disjoint(&first, y, ty, work, depth + 1) == Tri::Yes
                        && disjoint(&second, y, ty, work, depth + 1) == Tri::Yes
                    {
                        Tri::Yes
                    } else {
                        Tri::Unknown
                    }
                }
                Step::Not { rest, .. } | Step::Deps { rest, .. } | Step::Dynamic { rest, .. } => {
                    disjoint(&rest, y, ty, work, depth + 1)
                }
            };
        }
    }
    // Leaves: every type both may have must be shown disjoint.
    for t in Ty::ALL.into_iter().filter(|t| common & t.bit() != 0) {
        let proven = match t {
            Ty::Int | Ty::Frac => ranges_apart(a, b, t) || range_empty(a, t) || range_empty(b, t),
            Ty::Obj => {
                objects_apart(a, b, work, depth)
                    || counts_empty(a, "minProperties", "maxProperties")
                    || counts_empty(b, "minProperties", "maxProperties")
            }
            Ty::Str => {
                counts_apart(a, b, "minLength", "maxLength")
                    || counts_empty(a, "minLength", "maxLength")
                    || counts_empty(b, "minLength", "maxLength")
            }
            Ty::Arr => {
                counts_apart(a, b, "minItems", "maxItems")
                    || counts_empty(a, "minItems", "maxItems")
                    || counts_empty(b, "minItems", "maxItems")
                    || arrays_apart(a, b, work, depth)
            }
            Ty::Null | Ty::Bool => false,
        };
        if !proven {
            return Tri::Unknown;
        }
    }
    Tri::Yes
}

fn ranges_apart(a: &Side<'_>, b: &Side<'_>, t: Ty) -> bool {
    let (ra, rb) = (range_of(a, t), range_of(b, t));
    let below = |x: &Range, y: &Range| match (x.max, y.min) {
        (Some(hi), Some(lo)) => match hi.value.cmp(lo.value) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Equal => hi.exclusive || lo.exclusive,
            std::cmp::Ordering::Greater => false,
        },
        _ => false,
    };
    below(&ra, &rb) || below(&rb, &ra)
}

/// A side whose numbers of type `t` are none: its minimum above its maximum.
pub(crate) fn range_empty(side: &Side<'_>, t: Ty) -> bool {
    let r = range_of(side, t);
    match (r.min, r.max) {
        (Some(lo), Some(hi)) => match lo.value.cmp(hi.value) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Equal => lo.exclusive || hi.exclusive,
            std::cmp::Ordering::Less => false,
        },
        _ => false,
    }
}

/// A side whose counts (`minLength` above `maxLength`, ...) admit nothing.
pub(crate) fn counts_empty(side: &Side<'_>, min: &str, max: &str) -> bool {
    let lo = side.parts.iter().filter_map(|p| p.get(min)?.as_u64()).max().unwrap_or(0);
    side.parts.iter().filter_map(|p| p.get(max)?.as_u64()).min().is_some_and(|hi| hi < lo)
}

fn counts_apart(a: &Side<'_>, b: &Side<'_>, min: &str, max: &str) -> bool {
    let lo = |s: &Side<'_>| s.parts.iter().filter_map(|p| p.get(min)?.as_u64()).max().unwrap_or(0);
    let hi = |s: &Side<'_>| s.parts.iter().filter_map(|p| p.get(max)?.as_u64()).min();
    hi(a).is_some_and(|h| h < lo(b)) || hi(b).is_some_and(|h| h < lo(a))
}

/// A property one side requires whose schemas on the two sides share no value.
fn objects_apart(a: &Side<'_>, b: &Side<'_>, work: &mut Work, depth: usize) -> bool {
    for (x, y) in [(a, b), (b, a)] {
        let required: Vec<&str> = x
            .parts
            .iter()
            .filter_map(|p| p.get("required")?.as_array())
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        for name in required {
            if disjoint(&property(x, name), &property(y, name), None, work, depth + 1) == Tri::Yes {
                return true;
            }
        }
    }
    false
}

/// An item position both sides must have whose schemas share no value.
fn arrays_apart(a: &Side<'_>, b: &Side<'_>, work: &mut Work, depth: usize) -> bool {
    let min = |s: &Side<'_>| s.parts.iter().filter_map(|p| p.get("minItems")?.as_u64()).max().unwrap_or(0);
    let both = min(a).max(min(b)).min(8);
    (0..both).any(|i| {
        let i = usize::try_from(i).unwrap_or(usize::MAX);
        disjoint(&items_at(a, i), &items_at(b, i), None, work, depth + 1) == Tri::Yes
    })
}
