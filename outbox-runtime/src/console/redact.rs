//! Payload redaction by key: the values of chosen object keys replaced, at any depth, on
//! the JSON text itself, so that everything else (big integers included) stays exact.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::Redactor;

/// What a redacted value becomes.
pub(crate) const REDACTED: &str = "\"[redacted]\"";

/// A [`Redactor`] that replaces the value of every object key in `keys` (compared as
/// written in the payload, after JSON unescaping), at any depth, by `"[redacted]"`.
/// Text that is not JSON is shown as `[not JSON: hidden]`.
pub fn redact_keys(keys: impl IntoIterator<Item = impl Into<String>>) -> Redactor {
    let keys: BTreeSet<String> = keys.into_iter().map(Into::into).collect();
    Arc::new(move |_event_type: &str, text: &str| redact(text, &keys))
}

/// `text` with the values of `keys` redacted.
pub(crate) fn redact(text: &str, keys: &BTreeSet<String>) -> String {
    // A payload cut at the console's limit is not whole JSON: hide it all rather than
    // guess where its values end.
    if serde_json::from_str::<serde::de::IgnoredAny>(text).is_err() {
        return "[not JSON: hidden]".to_owned();
    }
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    // Whether the next string in an object is a key.
    let mut stack: Vec<u8> = Vec::new();
    let mut expect_key = false;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'{' | b'[' => {
                stack.push(b);
                expect_key = b == b'{';
                out.push(b as char);
                i += 1;
            }
            b'}' | b']' => {
                stack.pop();
                expect_key = false;
                out.push(b as char);
                i += 1;
            }
            b',' => {
                expect_key = stack.last() == Some(&b'{');
                out.push(',');
                i += 1;
            }
            b'"' => {
                let end = string_end(bytes, i);
                let literal = &text[i..end];
                out.push_str(literal);
                i = end;
                if expect_key {
                    expect_key = false;
                    let key: String = serde_json::from_str(literal).unwrap_or_default();
                    if keys.contains(&key) {
                        // The colon, then the value, skipped whole.
                        while i < bytes.len() && bytes[i] != b':' {
                            out.push(bytes[i] as char);
                            i += 1;
                        }
                        out.push(':');
                        i += 1;
                        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                            out.push(bytes[i] as char);
                            i += 1;
                        }
                        i = value_end(bytes, i);
                        out.push_str(REDACTED);
                    }
                }
            }
            _ => {
                // Whitespace, colons, numbers, literals: copied as they are (ASCII here;
                // every other character is inside a string).
                out.push(b as char);
                i += 1;
            }
        }
    }
    out
}

/// The index just past the string starting at `start` (a `"`).
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// The index just past the value starting at `start`.
fn value_end(bytes: &[u8], start: usize) -> usize {
    match bytes.get(start) {
        Some(b'"') => string_end(bytes, start),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut i = start;
            while i < bytes.len() {
                match bytes[i] {
                    b'"' => {
                        i = string_end(bytes, i);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return i + 1;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            bytes.len()
        }
        _ => {
            let mut i = start;
            while i < bytes.len()
                && !matches!(bytes[i], b',' | b'}' | b']')
                && !bytes[i].is_ascii_whitespace()
            {
                i += 1;
            }
            i
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(k: &[&str]) -> BTreeSet<String> {
        k.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn values_of_the_keys_are_redacted_at_any_depth_and_the_rest_is_kept_byte_for_byte() {
        let text = r#"{"card": "4111 1111", "total": 123456789012345678901234567890, "nested": {"card": {"a": [1, "}"]}, "ok": "é\"card\""}, "list": [{"card": null}, 2.50]}"#;
        let out = redact(text, &keys(&["card"]));
        assert_eq!(
            out,
            r#"{"card": "[redacted]", "total": 123456789012345678901234567890, "nested": {"card": "[redacted]", "ok": "é\"card\""}, "list": [{"card": "[redacted]"}, 2.50]}"#
        );
        assert!(serde_json::from_str::<serde_json::Value>(&out).is_ok());
    }

    #[test]
    fn a_key_written_with_escapes_is_matched_and_text_that_is_not_json_is_hidden() {
        assert_eq!(
            redact(r#"{"c\u0061rd":1,"b":2}"#, &keys(&["card"])),
            r#"{"c\u0061rd":"[redacted]","b":2}"#
        );
        assert_eq!(redact(r#"{"card": "41"#, &keys(&["card"])), "[not JSON: hidden]");
        assert_eq!(redact("[1, 2]", &keys(&["card"])), "[1, 2]");
    }

    #[test]
    fn generated_documents_stay_json_and_lose_every_redacted_value() {
        let seed = std::env::var("OUTBOX_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| fastrand::u64(..));
        eprintln!("redact: OUTBOX_TEST_SEED={seed}");
        let mut rng = fastrand::Rng::with_seed(seed);
        fn value(rng: &mut fastrand::Rng, depth: u32) -> serde_json::Value {
            match if depth > 3 { rng.u8(0..3) } else { rng.u8(0..5) } {
                0 => serde_json::json!(rng.i64(..)),
                1 => serde_json::json!(["secret", "x\"y", "}", "ü"][rng.usize(0..4)]),
                2 => serde_json::Value::Null,
                3 => (0..rng.usize(0..4)).map(|_| value(rng, depth + 1)).collect(),
                _ => (0..rng.usize(0..4))
                    .map(|_| {
                        (["secret", "plain", "se\"cret"][rng.usize(0..3)].to_owned(), value(rng, depth + 1))
                    })
                    .collect::<serde_json::Map<_, _>>()
                    .into(),
            }
        }
        fn no_secret_left(v: &serde_json::Value) -> bool {
            match v {
                serde_json::Value::Object(m) => {
                    m.iter().all(|(k, v)| (k != "secret" || v == "[redacted]") && no_secret_left(v))
                }
                serde_json::Value::Array(a) => a.iter().all(no_secret_left),
                _ => true,
            }
        }
        for round in 0..500 {
            let doc = value(&mut rng, 0);
            let text =
                if rng.bool() { serde_json::to_string_pretty(&doc) } else { serde_json::to_string(&doc) }
                    .expect("text");
            let out = redact(&text, &keys(&["secret"]));
            let back: serde_json::Value = serde_json::from_str(&out)
                .unwrap_or_else(|e| panic!("round {round}, seed {seed}: {e}: {out}"));
            assert!(no_secret_left(&back), "round {round}, seed {seed}: {out}");
            if !text.contains("\"secret\"") {
                assert_eq!(out, text, "round {round}, seed {seed}: nothing to redact, nothing changed");
            }
        }
    }
}
