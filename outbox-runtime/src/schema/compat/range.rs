//! Numbers and ranges: integer formats, minimum/maximum, exclusive ends.

use std::fmt;

use serde_json::Value;

use super::node::Node;

/// A bound: exact for integers, `f64` otherwise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    pub(super) fn of(v: &Value) -> Option<Num> {
        let n = v.as_number()?;
        if let Some(i) = n.as_i64() {
            Some(Num::Int(i.into()))
        } else if let Some(u) = n.as_u64() {
            Some(Num::Int(u.into()))
        } else {
            n.as_f64().map(Num::Float)
        }
    }

    pub(super) fn as_f64(self) -> f64 {
        match self {
            // Precision loss is fine here: only used against non-integer bounds.
            #[allow(clippy::cast_precision_loss)]
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }

    pub(super) fn cmp(self, other: Num) -> std::cmp::Ordering {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => a.cmp(&b),
            (a, b) => a.as_f64().total_cmp(&b.as_f64()),
        }
    }

    pub(super) fn is_multiple_of(self, of: &Num) -> bool {
        match (self, *of) {
            (Num::Int(a), Num::Int(b)) => b != 0 && a % b == 0,
            (a, b) => {
                let q = a.as_f64() / b.as_f64();
                q.is_finite() && (q - q.round()).abs() < 1e-9
            }
        }
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Int(i) => write!(f, "{i}"),
            Num::Float(x) => write!(f, "{x}"),
        }
    }
}

/// One end of a range: a value and whether it is exclusive.
#[derive(Debug, Clone, Copy)]
pub(super) struct End {
    pub(super) value: Num,
    pub(super) exclusive: bool,
}

impl End {
    /// As a lower bound, this admits no value below `other`.
    pub(super) fn at_least(&self, other: &End) -> bool {
        match self.value.cmp(other.value) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Equal => self.exclusive || !other.exclusive,
            std::cmp::Ordering::Less => false,
        }
    }

    /// As an upper bound, this admits no value above `other`.
    pub(super) fn at_most(&self, other: &End) -> bool {
        match self.value.cmp(other.value) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Equal => self.exclusive || !other.exclusive,
            std::cmp::Ordering::Greater => false,
        }
    }
}

/// The numbers a node admits: from its integer `format` and its min/max keywords.
#[derive(Debug, Default)]
pub(super) struct Range {
    pub(super) min: Option<End>,
    pub(super) max: Option<End>,
    pub(super) format: Option<String>,
}

/// Value ranges of the integer formats schemars emits.
pub(super) fn format_range(format: &str) -> Option<(Num, Num)> {
    let signed = |bits: u32| (Num::Int(-(1i128 << (bits - 1))), Num::Int((1i128 << (bits - 1)) - 1));
    let unsigned = |bits: u32| (Num::Int(0), Num::Int((1i128 << bits) - 1));
    Some(match format {
        "int8" => signed(8),
        "int16" => signed(16),
        "int32" => signed(32),
        "int64" | "int" => signed(64),
        "int128" => (Num::Int(i128::MIN), Num::Int(i128::MAX)),
        "uint8" => unsigned(8),
        "uint16" => unsigned(16),
        "uint32" => unsigned(32),
        "uint64" | "uint" => unsigned(64),
        "uint128" => (Num::Int(0), Num::Float(2f64.powi(128) - 1.0)),
        _ => return None,
    })
}

impl Range {
    pub(super) fn of(node: &Node<'_>, t: &str) -> Range {
        Range::of_value(node.value, t, true)
    }

    /// The range `schema` admits for type `t`; with `formats`, also from an integer
    /// `format` (serde's reading: schemars writes `int32` for an `i32`), which JSON Schema
    /// validators do not check.
    pub(super) fn of_value(schema: &Value, t: &str, formats: bool) -> Range {
        let mut range = Range::default();
        let tighter_min = |cur: Option<End>, new: End| match cur {
            Some(c) if c.at_least(&new) => Some(c),
            _ => Some(new),
        };
        let tighter_max = |cur: Option<End>, new: End| match cur {
            Some(c) if c.at_most(&new) => Some(c),
            _ => Some(new),
        };
        if t == "integer" && formats {
            if let Some(f) = schema.get("format").and_then(Value::as_str) {
                if let Some((lo, hi)) = format_range(f) {
                    range.min = Some(End { value: lo, exclusive: false });
                    range.max = Some(End { value: hi, exclusive: false });
                    range.format = Some(f.to_owned());
                }
            }
        }
        if let Some(v) = schema.get("minimum").and_then(Num::of) {
            range.min = tighter_min(range.min, End { value: v, exclusive: false });
        }
        if let Some(v) = schema.get("exclusiveMinimum").and_then(Num::of) {
            range.min = tighter_min(range.min, End { value: v, exclusive: true });
        }
        if let Some(v) = schema.get("maximum").and_then(Num::of) {
            range.max = tighter_max(range.max, End { value: v, exclusive: false });
        }
        if let Some(v) = schema.get("exclusiveMaximum").and_then(Num::of) {
            range.max = tighter_max(range.max, End { value: v, exclusive: true });
        }
        range
    }

    /// Whether every number this range admits, `outer` admits.
    pub(super) fn within(&self, outer: &Range) -> bool {
        let low = match (&outer.min, &self.min) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(o), Some(s)) => s.at_least(o),
        };
        let high = match (&outer.max, &self.max) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(o), Some(s)) => s.at_most(o),
        };
        low && high
    }

    pub(super) fn describe(&self, t: &str) -> String {
        let kind = if t == "integer" { "integers" } else { "numbers" };
        let end = |e: &Option<End>, unbounded: &str| match e {
            Some(End { value, exclusive: true }) => format!("{value} (exclusive)"),
            Some(End { value, .. }) => value.to_string(),
            None => unbounded.to_owned(),
        };
        let format = self.format.as_ref().map(|f| format!(" ({f})")).unwrap_or_default();
        format!("{kind} from {} to {}{format}", end(&self.min, "-infinity"), end(&self.max, "+infinity"))
    }
}
