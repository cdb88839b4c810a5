//! Strings, numbers and bounds: each keyword added, removed, raised or lowered
//! (CONFLUENT.md §4.2, §4.3).

use serde_json::Number;

use super::{at, here, Diff};
use crate::schema::compat::registry::load::{Num, Str};
use crate::schema::compat::registry::Kind;

/// A bound's kinds: (added, removed, increased, decreased).
pub(super) type Bound = [Kind; 4];
pub(super) const MAX_LENGTH: Bound =
    [Kind::MaxLengthAdded, Kind::MaxLengthRemoved, Kind::MaxLengthIncreased, Kind::MaxLengthDecreased];
pub(super) const MIN_LENGTH: Bound =
    [Kind::MinLengthAdded, Kind::MinLengthRemoved, Kind::MinLengthIncreased, Kind::MinLengthDecreased];
pub(super) const MAXIMUM: Bound =
    [Kind::MaximumAdded, Kind::MaximumRemoved, Kind::MaximumIncreased, Kind::MaximumDecreased];
pub(super) const MINIMUM: Bound =
    [Kind::MinimumAdded, Kind::MinimumRemoved, Kind::MinimumIncreased, Kind::MinimumDecreased];
pub(super) const EXCLUSIVE_MINIMUM: Bound = [
    Kind::ExclusiveMinimumAdded,
    Kind::ExclusiveMinimumRemoved,
    Kind::ExclusiveMinimumIncreased,
    Kind::ExclusiveMinimumDecreased,
];
pub(super) const MAX_PROPERTIES: Bound = [
    Kind::MaxPropertiesAdded,
    Kind::MaxPropertiesRemoved,
    Kind::MaxPropertiesIncreased,
    Kind::MaxPropertiesDecreased,
];
pub(super) const MIN_PROPERTIES: Bound = [
    Kind::MinPropertiesAdded,
    Kind::MinPropertiesRemoved,
    Kind::MinPropertiesIncreased,
    Kind::MinPropertiesDecreased,
];
pub(super) const MAX_ITEMS: Bound =
    [Kind::MaxItemsAdded, Kind::MaxItemsRemoved, Kind::MaxItemsIncreased, Kind::MaxItemsDecreased];
pub(super) const MIN_ITEMS: Bound =
    [Kind::MinItemsAdded, Kind::MinItemsRemoved, Kind::MinItemsIncreased, Kind::MinItemsDecreased];
pub(super) const MAX_CONTAINS: Bound = [
    Kind::MaxContainsAdded,
    Kind::MaxContainsRemoved,
    Kind::MaxContainsIncreased,
    Kind::MaxContainsDecreased,
];
pub(super) const MIN_CONTAINS: Bound = [
    Kind::MinContainsAdded,
    Kind::MinContainsRemoved,
    Kind::MinContainsIncreased,
    Kind::MinContainsDecreased,
];

/// A numeric keyword compared as the registry does: equal values (by Java's `equals`, so
/// `10` and `10.0` differ) say nothing, else added, removed, or compared as doubles.
pub(super) fn bound(
    o: &Option<Number>,
    u: &Option<Number>,
    segment: &str,
    kinds: Bound,
    out: &mut Vec<Diff>,
) {
    let [added, removed, increased, decreased] = kinds;
    let kind = match (o, u) {
        (a, b) if a == b => return,
        (None, Some(_)) => added,
        (Some(_), None) => removed,
        (Some(a), Some(b)) => {
            let (a, b) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
            if a < b {
                increased
            } else if a > b {
                decreased
            } else {
                return;
            }
        }
        (None, None) => return,
    };
    out.push(at(kind, segment));
}

pub(super) fn strings(o: &Str, u: &Str, out: &mut Vec<Diff>) {
    bound(&o.max_length, &u.max_length, "maxLength", MAX_LENGTH, out);
    bound(&o.min_length, &u.min_length, "minLength", MIN_LENGTH, out);
    match (&o.pattern, &u.pattern) {
        (None, Some(_)) => out.push(at(Kind::PatternAdded, "pattern")),
        (Some(_), None) => out.push(at(Kind::PatternRemoved, "pattern")),
        (Some(a), Some(b)) if a != b => out.push(at(Kind::PatternChanged, "pattern")),
        _ => {}
    }
}

pub(super) fn numbers(o: &Num, u: &Num, out: &mut Vec<Diff>) {
    bound(&o.maximum, &u.maximum, "maximum", MAXIMUM, out);
    bound(&o.minimum, &u.minimum, "minimum", MINIMUM, out);
    // The registry's decreased-exclusiveMaximum branch compares with the update's
    // `maximum`: mostly nothing when it has one, and a NullPointerException (HTTP 500)
    // when it has none, which is read here as nothing (see CONFLUENT.md §10).
    match (&o.exclusive_maximum, &u.exclusive_maximum) {
        (a, b) if a == b => {}
        (None, Some(_)) => out.push(at(Kind::ExclusiveMaximumAdded, "exclusiveMaximum")),
        (Some(_), None) => out.push(at(Kind::ExclusiveMaximumRemoved, "exclusiveMaximum")),
        (Some(a), Some(b)) => {
            let (a, b) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
            if a < b {
                out.push(at(Kind::ExclusiveMaximumIncreased, "exclusiveMaximum"));
            } else {
                if u.maximum.as_ref().and_then(Number::as_f64).is_some_and(|maximum| a > maximum) {
                    out.push(at(Kind::ExclusiveMaximumDecreased, "exclusiveMaximum"));
                }
            }
        }
        (None, None) => {}
    }
    bound(&o.exclusive_minimum, &u.exclusive_minimum, "exclusiveMinimum", EXCLUSIVE_MINIMUM, out);
    match (&o.multiple_of, &u.multiple_of) {
        (None, None) => {}
        (None, Some(_)) => out.push(at(Kind::MultipleOfAdded, "multipleOf")),
        (Some(_), None) => out.push(at(Kind::MultipleOfRemoved, "multipleOf")),
        (Some(a), Some(b)) => {
            let (a, b) = (decimal(a), decimal(b));
            if a != b {
                let kind = if divides(a, b) {
                    Kind::MultipleOfExpanded
                } else if divides(b, a) {
                    Kind::MultipleOfReduced
                } else {
                    Kind::MultipleOfChanged
                };
                out.push(at(kind, "multipleOf"));
            }
        }
    }
    match (o.integer, u.integer) {
        (true, false) => out.push(here(Kind::TypeExtended)),
        (false, true) => out.push(here(Kind::TypeNarrowed)),
        _ => {}
    }
}

/// A JSON number as a decimal (mantissa, power of ten), normalized so that equal values
/// are equal (BigDecimal's `compareTo`); `None` past what i128 holds.
pub(super) fn decimal(n: &Number) -> Option<(i128, i32)> {
    let text = n.to_string();
    let (digits, exp) = match text.split_once(['e', 'E']) {
        Some((d, e)) => (d.to_owned(), e.parse::<i32>().ok()?),
        None => (text, 0),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((&digits, ""));
    let mut mantissa: i128 = format!("{int}{frac}").parse().ok()?;
    let mut exp = exp - i32::try_from(frac.len()).ok()?;
    while mantissa != 0 && mantissa % 10 == 0 {
        mantissa /= 10;
        exp += 1;
    }
    Some((mantissa, exp))
}

/// `b % a == 0`: `a` divides `b` (both positive decimals).
pub(super) fn divides(a: Option<(i128, i32)>, b: Option<(i128, i32)>) -> bool {
    let (Some((am, ae)), Some((bm, be))) = (a, b) else { return false };
    if am == 0 {
        return false;
    }
    let scale = ae.min(be);
    let lift =
        |m: i128, e: i32| 10i128.checked_pow(u32::try_from(e - scale).ok()?).and_then(|p| m.checked_mul(p));
    match (lift(am, ae), lift(bm, be)) {
        (Some(a), Some(b)) => b % a == 0,
        _ => false,
    }
}
