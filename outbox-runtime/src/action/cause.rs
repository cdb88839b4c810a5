//! The cause of a failure: the key failed events and parked messages are grouped by, and
//! what an action's `cause` filter takes.

/// The cause of a failure, from its reason (an SQL expression of text): the reason with
/// the values of one occurrence left out, so that failures of one cause on different
/// events, offsets, attempts or payloads group together, at most 300 characters. In this
/// order: quoted text (`"…"`, `` `…` ``, and `'…'` not inside a word) becomes `<s>`, e-mail
/// addresses `<email>`, UUIDs `<id>`, runs of 8 or more hex digits with a letter and a digit
/// (after `_` too) `<hex>`, runs of 20 or more base64 characters (letters, digits, `+` and
/// `/`, with a letter and a digit) `<token>`, and numbers `<n>`.
pub(crate) fn cause_sql(reason: &str) -> String {
    // The first 2,000 characters: the key keeps 300, and what a pattern costs grows with
    // the length of a run (a reason has no limit of its own).
    let mut sql = format!("left(coalesce({reason}, ''), 2000)");
    for (pattern, placeholder) in CAUSE_VALUES {
        sql = format!("regexp_replace({sql}, '{pattern}', '{placeholder}', 'g')");
    }
    format!("left({sql}, 300)")
}

/// [`cause_sql`]'s replacements, as PostgreSQL advanced regular expressions (in SQL string
/// literals, read with `standard_conforming_strings` on, PostgreSQL's default since 9.1: a
/// quote is doubled, a backslash is itself), applied in this order.
const CAUSE_VALUES: [(&str, &str); 6] = [
    (r#""(?:[^"\\]|\\.)*"|`[^`]*`|(?<![A-Za-z0-9])''(?:[^''\\]|\\.)*''(?![A-Za-z0-9])"#, "<s>"),
    (r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+", "<email>"),
    (r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", "<id>"),
    (r"(?<![A-Za-z0-9])(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}(?![A-Za-z0-9])", "<hex>"),
    (
        r"(?<![A-Za-z0-9+/])(?=[A-Za-z0-9+/]*[0-9])(?=[A-Za-z0-9+/]*[A-Za-z])[A-Za-z0-9+/]{20,}={0,2}",
        "<token>",
    ),
    ("[0-9]+", "<n>"),
];
