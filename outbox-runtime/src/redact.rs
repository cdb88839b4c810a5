//! serde's messages without the values they quote of the input. Standard library only: the
//! consumer types `cargo xtask typegen` generates carry a copy of this file (it is read with
//! `include_str!`), so that their decode errors leave payload values out too without a
//! dependency of the consumer's on this crate. No tests here, for the same reason: they
//! are in `inbox/decode.rs` and with the generated types.

/// serde's message with what it quotes of the input left out: `invalid type: string
/// "someone@example.com", expected u64` becomes `invalid type: string, expected u64`,
/// `unknown variant `Bitcoin`, expected one of `Card`, `Iban`` becomes `unknown variant,
/// expected one of `Card`, `Iban``. What follows `expected` (outside a quoted value) comes
/// from the type, not the input, and is kept, as are the field names of `missing field` and
/// `duplicate field` (the type's own).
pub(crate) fn without_values(message: &str) -> String {
    if message.starts_with("missing field") || message.starts_with("duplicate field") {
        return message.to_owned();
    }
    // serde quotes an unknown variant or field in backticks without escaping it: the value
    // ends at the last "`, expected" or "`, there are no", whatever it holds.
    for kind in ["unknown variant", "unknown field"] {
        if message.starts_with(kind) {
            let tail = ["`, expected", "`, there are no"]
                .iter()
                .filter_map(|end| message.rfind(end).map(|at| &message[at + 1..]))
                .max_by_key(|tail| std::cmp::Reverse(tail.len()))
                .unwrap_or("");
            return format!("{kind}{tail}");
        }
    }
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with(", expected") {
            // The type's side, outside any value.
            out.push_str(rest);
            break;
        }
        rest = &rest[c.len_utf8()..];
        match c {
            '"' => {
                // A JSON string as serde_json renders it, escapes included.
                let mut chars = rest.char_indices();
                let mut end = rest.len();
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => {
                            end = i + 1;
                            break;
                        }
                        _ => {}
                    }
                }
                rest = &rest[end..];
                trim_space(&mut out);
            }
            '`' => {
                rest = rest.find('`').map_or("", |end| &rest[end + 1..]);
                trim_space(&mut out);
            }
            _ => out.push(c),
        }
    }
    out
}

/// Drops the space before a value left out.
fn trim_space(out: &mut String) {
    if out.ends_with(' ') {
        out.pop();
    }
}
