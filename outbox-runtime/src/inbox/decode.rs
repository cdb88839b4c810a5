//! Payloads decoded for typed handlers, with errors that say where in the payload and what
//! kind of mismatch, never a value of the payload: the reason is recorded, listed by
//! `outbox inbox parked` and shown by the console, where payloads are hidden.

use serde::de::DeserializeOwned;

use crate::redact::without_values;

/// `payload` as `T`, or why not: the JSON path, serde's message with the payload's values
/// left out, and the line and column.
pub(crate) fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, String> {
    // The common case without the path tracker (it allocates per field); only a payload that
    // fails is decoded again, to say where.
    if let Ok(value) = serde_json::from_slice(payload) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(payload);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| describe(&path(&e), e.inner()))?;
    // Trailing characters, as serde_json::from_slice refuses them.
    de.end().map_err(|e| describe(".", &e))?;
    Ok(value)
}

/// The error's path, with what of it may be the payload's own left out: a map's key that is
/// not a name (`<key>`: an e-mail address used as a key), and an unknown field (the last
/// segment of an `unknown field` error), which serde counts into the path.
fn path(error: &serde_path_to_error::Error<serde_json::Error>) -> String {
    use serde_path_to_error::Segment;
    let mut segments: Vec<&Segment> = error.path().iter().collect();
    if error.inner().to_string().starts_with("unknown field") {
        segments.pop();
    }
    let is_name = |key: &str| {
        key.len() <= 64
            && key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    let mut out = String::new();
    for segment in segments {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(if is_name(key) { key } else { "<key>" });
            }
            Segment::Unknown => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push('?');
            }
        }
    }
    out
}

/// `at <path>: <message without values> (line L, column C)`.
fn describe(path: &str, error: &serde_json::Error) -> String {
    let text = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    let message = text.strip_suffix(&position).unwrap_or(&text);
    // The path bare: the failure groups leave quoted text out as a value.
    let at = if path == "." || path.is_empty() { "the top level" } else { path };
    format!("at {at}: {} (line {}, column {})", without_values(message), error.line(), error.column())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Order {
        id: u64,
        customer: Customer,
        lines: Vec<Line>,
        payment: Payment,
        tags: BTreeMap<String, u32>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Customer {
        email: String,
        age: u8,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Line {
        sku: String,
        quantity: u32,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    enum Payment {
        Card,
        Iban,
    }

    const SECRET: &str = "someone.secret@example.com";

    fn order(customer: &str, lines: &str, payment: &str) -> String {
        format!(r#"{{"id":7,"customer":{customer},"lines":{lines},"payment":{payment},"tags":{{}}}}"#)
    }

    /// Each mismatch names its path and kind; none carries the value. serde_json's own
    /// message is the ground truth that it carried it before.
    #[test]
    fn decode_errors_name_the_path_and_the_kind_never_the_value() {
        let ok_customer = r#"{"email":"a@b.c","age":30}"#;
        let cases = [
            (
                order(&format!(r#"{{"email":"a@b.c","age":"{SECRET}"}}"#), "[]", r#""Card""#),
                "at customer.age: invalid type: string, expected u8",
            ),
            (
                order(ok_customer, &format!(r#"[{{"sku":"s","quantity":"{SECRET}"}}]"#), r#""Card""#),
                "at lines[0].quantity: invalid type: string, expected u32",
            ),
            (
                order(ok_customer, "[]", &format!(r#""{SECRET}""#)),
                "at payment: unknown variant, expected `Card` or `Iban`",
            ),
            (
                order(&format!(r#"{{"email":"a@b.c","age":3,"{SECRET}":1}}"#), "[]", r#""Card""#),
                "at customer: unknown field, expected `email` or `age`",
            ),
            (order(r#"{"email":"a@b.c"}"#, "[]", r#""Card""#), "at customer: missing field `age`"),
            (
                order(ok_customer, "[]", r#""Card""#).replace(r#""id":7"#, r#""id":-7"#),
                "at id: invalid value: integer, expected u64",
            ),
            (
                order(ok_customer, "[]", r#""Card""#)
                    .replace(r#""tags":{}"#, &format!(r#""tags":{{"t":"{SECRET}\"x"}}"#)),
                "at tags.t: invalid type: string, expected u32",
            ),
            (
                order(ok_customer, "[]", r#""Card""#)
                    .replace(r#""tags":{}"#, &format!(r#""tags":{{"{SECRET}":"x"}}"#)),
                "at tags.<key>: invalid type: string, expected u32",
            ),
            (
                format!("{} trailing", order(ok_customer, "[]", r#""Card""#)),
                "at the top level: trailing characters",
            ),
        ];
        let mut quoted_by_serde = 0;
        for (payload, expected) in cases {
            let truth =
                serde_json::from_str::<Order>(&payload).expect_err("serde_json refuses it too").to_string();
            let reason = decode::<Order>(payload.as_bytes()).expect_err("refused");
            assert!(reason.starts_with(expected), "{payload}\n  gave {reason}\n  not {expected}");
            assert!(reason.contains("(line 1, column "), "{reason}");
            assert!(!reason.contains("someone") && !reason.contains("-7"), "{reason} carries the value");
            // Only where serde itself quoted the value is there something to leave out.
            if truth.contains("someone") {
                quoted_by_serde += 1;
            }
        }
        assert!(quoted_by_serde >= 4, "serde_json's own messages carry the value: {quoted_by_serde}");
        assert!(decode::<Order>(order(ok_customer, "[]", r#""Iban""#).as_bytes()).is_ok());
    }
}
