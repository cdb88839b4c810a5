//! Typo hints: a name the operator gave that matches nothing, against the names that do
//! exist ("did you mean `billing`?").

use outbox_runtime::inbox::InboxAdmin;
use outbox_runtime::sqlx::PgPool;

use crate::{fail, Fail};

/// A table that does not exist, as the library named it (`"schema"."table"`), and what
/// creates it.
pub(crate) struct Missing {
    pub(crate) table: String,
    /// An inbox's table (else the outbox's).
    pub(crate) inbox: bool,
    pub(crate) fix: String,
}

impl From<Missing> for Fail {
    fn from(missing: Missing) -> Self {
        Fail {
            code: 2,
            message: format!("table {} does not exist: {}", missing.table, missing.fix),
            missing: Some(missing),
        }
    }
}

/// Levenshtein distance, by characters.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb)).min(row[j] + 1).min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The known name closest to `name`, when it is close enough to be a typo of it (at most a
/// third of its characters differ, at least one may).
pub(crate) fn closest<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    known
        .into_iter()
        .map(|k| (edit_distance(name, k), k))
        .filter(|(d, k)| *d > 0 && *d <= (k.chars().count() / 3).max(1))
        .min()
        .map(|(_, k)| k)
}

/// Refuses a consumer with no row in the inbox's tables (exit 2), naming the consumers
/// there are and the closest one: a misspelled `--consumer` would otherwise find nothing
/// parked and say so.
pub(crate) async fn known_consumer(admin: &InboxAdmin) -> Result<(), Fail> {
    let known = admin.consumers().await?;
    let consumer = admin.consumer();
    if known.iter().any(|k| k == consumer) {
        return Ok(());
    }
    let mut message = format!("unknown consumer `{consumer}`: it has no row in this inbox's tables");
    if known.is_empty() {
        message.push_str(" and neither has any other consumer (a consumer's rows appear once it applies or parks a message)");
    } else {
        if let Some(close) = closest(consumer, known.iter().map(String::as_str)) {
            message.push_str(&format!("; did you mean `{close}`?"));
        }
        message.push_str(&format!(" (consumers in this inbox: {})", known.join(", ")));
    }
    Err(fail(2, message))
}

/// `fail` with, for a missing table, the outbox (or inbox) tables this database does hold
/// and the flags naming the closest one.
pub(crate) async fn explain(pool: &PgPool, mut fail: Fail) -> Fail {
    let Some(missing) = &fail.missing else { return fail };
    // An outbox has `<table>_leases` beside it, an inbox `<table>_parked`.
    let (sibling, schema_flag, table_flag, what) = if missing.inbox {
        ("_parked", "--inbox-schema", "--inbox-table", "inbox")
    } else {
        ("_leases", "--schema", "--table", "outbox")
    };
    let table = &missing.table;
    let existing: Vec<(String, String)> = match sqlx::query_as(
        "SELECT schemaname::text, left(tablename, -length($1))::text FROM pg_catalog.pg_tables s \
         WHERE right(tablename, length($1)) = $1 AND EXISTS (SELECT 1 FROM pg_catalog.pg_tables t \
           WHERE t.schemaname = s.schemaname AND t.tablename = left(s.tablename, -length($1))) \
         ORDER BY 1, 2",
    )
    .bind(sibling)
    .fetch_all(pool)
    .await
    {
        Ok(rows) => rows,
        Err(_) => return fail,
    };
    // `"schema"."table"` as the library quotes it; our names never hold a quote.
    let given = table.replace('"', "");
    let qualified: Vec<String> = existing.iter().map(|(s, t)| format!("{s}.{t}")).collect();
    if qualified.is_empty() {
        fail.message.push_str(&format!("; this database holds no {what} table yet"));
        return fail;
    }
    if let Some(close) = closest(&given, qualified.iter().map(String::as_str)) {
        let (schema, name) = close.split_once('.').unwrap_or(("", close));
        let given_schema = given.split_once('.').map_or("", |(s, _)| s);
        let flags = if schema == given_schema {
            format!("{table_flag} {name}")
        } else {
            format!("{schema_flag} {schema} {table_flag} {name}")
        };
        fail.message = format!(
            "table {table} does not exist: did you mean `{flags}`? ({what} tables in this database: {}); \
             if not, {}",
            qualified.join(", "),
            missing.fix
        );
    } else {
        fail.message.push_str(&format!(" ({what} tables in this database: {})", qualified.join(", ")));
    }
    fail
}

#[cfg(test)]
mod tests {
    use super::{closest, edit_distance};

    #[test]
    fn close_names_are_hinted_and_far_ones_are_not() {
        assert_eq!(edit_distance("bilingg", "billing"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("outbox", "outbox"), 0);
        assert_eq!(closest("bilingg", ["shipping", "billing"]), Some("billing"));
        assert_eq!(closest("outbx", ["outbox"]), Some("outbox"));
        assert_eq!(closest("payments", ["billing", "shipping"]), None);
        assert_eq!(closest("billing", ["billing"]), None, "the same name is no typo");
    }
}
