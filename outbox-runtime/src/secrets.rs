//! Keeping secrets out of `Debug` output, logs and error messages: Kafka settings that
//! hold a secret, and passwords in URLs (`user:password@`, `?password=`). The crate's own
//! `Debug` and logs use it; [`redact_urls`] is public for a service's own messages.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::kafka_settings::canonical;

/// What a secret is shown as.
pub(crate) const REDACTED: &str = "(redacted)";

/// Whether `name` (a librdkafka setting name, or a URL query parameter) holds a secret.
pub(crate) fn is_secret(name: &str) -> bool {
    let name = canonical(name).to_ascii_lowercase();
    name.contains("password")
        || name.contains("secret")
        || name.contains("passphrase")
        || (name.contains("token") && !name.ends_with("url"))
        || name.ends_with(".pem")
        || name.contains("sasl.oauthbearer.config")
}

/// `settings` for `Debug` and logs: secrets' values replaced, passwords in URL values too.
pub(crate) fn redacted(settings: &BTreeMap<String, String>) -> BTreeMap<&str, Cow<'_, str>> {
    settings
        .iter()
        .map(|(k, v)| (k.as_str(), if is_secret(k) { Cow::Borrowed(REDACTED) } else { redact_urls(v) }))
        .collect()
}

/// `text` with every password in it replaced: the password of a URL's `user:password@`
/// (whatever characters it holds: the userinfo runs to the last `@` before the next
/// whitespace or quote), and the value of every `name=value` whose name holds a secret,
/// in a URL's query (`?password=`, `sslpassword=`, `client_secret=`), in a keyword/value
/// connection string (`host=db password=...`, quoted or not) or in a message.
pub fn redact_urls(text: &str) -> Cow<'_, str> {
    if !text.contains("://") && !text.contains('=') {
        return Cow::Borrowed(text);
    }
    let text = redact_userinfo(text);
    Cow::Owned(redact_secret_values(&text))
}

fn is_word_end(c: char) -> bool {
    c.is_whitespace() || c == '"' || c == '\''
}

fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at_scheme) = rest.find("://") {
        out.push_str(&rest[..at_scheme + 3]);
        rest = &rest[at_scheme + 3..];
        // To the end of the word, not to a next "://", which a password may hold: several
        // URLs in one word ("a://u:p@h1,b://v:q@h2") are redacted as one, hosts between
        // included. Hiding too much is the safe side.
        let end = rest.find(is_word_end).unwrap_or(rest.len());
        let segment = &rest[..end];
        match segment.rfind('@').and_then(|at| segment[..at].find(':').map(|colon| (colon, at))) {
            Some((colon, at)) => {
                out.push_str(&segment[..=colon]);
                out.push_str(REDACTED);
                out.push_str(&segment[at..]);
            }
            None => out.push_str(segment),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn redact_secret_values(text: &str) -> String {
    let is_space = |c: char| c == ' ' || c == '\t';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        // libpq allows spaces around '=' (`password = s3cret`), and a URL's query may
        // percent-encode the name (`?pass%77ord=`), which sqlx decodes.
        let before = rest[..eq].trim_end_matches(is_space);
        let name_start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '%')))
            .map_or(0, |i| i + before[i..].chars().next().map_or(1, char::len_utf8));
        let name = percent_encoding::percent_decode_str(&before[name_start..]).decode_utf8_lossy();
        out.push_str(&rest[..=eq]);
        rest = &rest[eq + 1..];
        if name.is_empty() || !is_secret(&name) {
            continue;
        }
        let spaces = rest.len() - rest.trim_start_matches(is_space).len();
        out.push_str(&rest[..spaces]);
        rest = &rest[spaces..];
        // In a URL's query a value ends at '&' or '#'; elsewhere (a keyword/value string,
        // where '&' may be part of a password) only at whitespace or a quote.
        let in_query = before[..name_start].ends_with(['?', '&']);
        let value_end = match rest.chars().next() {
            Some(quote @ ('\'' | '"')) => rest[1..].find(quote).map_or(rest.len(), |i| i + 2),
            _ => rest
                .find(|c: char| {
                    c.is_whitespace() || matches!(c, '"' | '\'') || (in_query && matches!(c, '&' | '#'))
                })
                .unwrap_or(rest.len()),
        };
        out.push_str(REDACTED);
        rest = &rest[value_end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_settings_are_named_as_secrets() {
        assert!(
            is_secret("sasl.password")
                && is_secret("ssl.key.password")
                && is_secret("sasl.oauthbearer.client.secret")
                && is_secret("ssl.key.pem")
                && is_secret("sasl.oauthbearer.config")
                && is_secret("password")
                && is_secret("sslpassword")
                && is_secret("access_token")
                && is_secret("sasl.oauthbearer.assertion.private.key.passphrase")
        );
        assert!(!is_secret("linger.ms") && !is_secret("sslmode") && !is_secret("user"));
    }

    #[test]
    fn passwords_in_urls_are_replaced_and_nothing_else_changes() {
        let cases = [
            ("postgres://app:s3cret@db:5432/x", "postgres://app:(redacted)@db:5432/x"),
            ("postgres://app@db/x", "postgres://app@db/x"),
            ("postgres://db/x", "postgres://db/x"),
            (
                "postgres://db/x?user=app&password=s3cret&sslmode=require",
                "postgres://db/x?user=app&password=(redacted)&sslmode=require",
            ),
            ("postgres://a:p%40ss@h1:5432,h2:5432/x", "postgres://a:(redacted)@h1:5432,h2:5432/x"),
            (
                "postgresql://u:p@[::1]:5432/x?sslpassword=k#frag",
                "postgresql://u:(redacted)@[::1]:5432/x?sslpassword=(redacted)#frag",
            ),
            (
                "cannot connect to postgres://u:pw@db/x: refused",
                "cannot connect to postgres://u:(redacted)@db/x: refused",
            ),
            (
                "https://idp/token?client_secret=abc&scope=x",
                "https://idp/token?client_secret=(redacted)&scope=x",
            ),
            // Passwords holding '/', '?', '#', '@', ',' or ':' (base64 ones hold '/').
            ("postgres://app:pa/ss@db/x", "postgres://app:(redacted)@db/x"),
            ("postgres://app:a?b#c@db/x", "postgres://app:(redacted)@db/x"),
            ("postgres://app:p@ss@db/x", "postgres://app:(redacted)@db/x"),
            ("postgres://u:pa,ss@h/x", "postgres://u:(redacted)@h/x"),
            ("postgres://u:a:b@h/x", "postgres://u:(redacted)@h/x"),
            ("sasl_ssl://u:p1@h1:9093,sasl_ssl://v:p2@h2:9093", "sasl_ssl://u:(redacted)@h2:9093"),
            ("\"postgres://u:pw@db/x\"", "\"postgres://u:(redacted)@db/x\""),
            // Keyword/value connection strings and settings in messages.
            ("host=db user=app password=s3cret dbname=x", "host=db user=app password=(redacted) dbname=x"),
            ("host=db password='s3 cret' dbname=x", "host=db password=(redacted) dbname=x"),
            ("sasl.password=hunter2 is wrong", "sasl.password=(redacted) is wrong"),
            ("a = b, linger.ms=5, x==y", "a = b, linger.ms=5, x==y"),
            // Spaces around '=' (libpq accepts them) and percent-encoded names (sqlx
            // decodes them): both leaked before.
            ("host=db password = s3cret dbname=x", "host=db password = (redacted) dbname=x"),
            ("host=db password\t=\t's3 cret'", "host=db password\t=\t(redacted)"),
            (
                "postgres://db/x?pass%77ord=s3cret&sslmode=require",
                "postgres://db/x?pass%77ord=(redacted)&sslmode=require",
            ),
            ("postgres://db/x?%70assword=s3cret", "postgres://db/x?%70assword=(redacted)"),
            ("no secret here", "no secret here"),
            ("", ""),
        ];
        for (text, expected) in cases {
            assert_eq!(redact_urls(text), expected, "{text}");
        }
    }

    /// Any text around any password: the password never comes out, and nothing panics.
    /// The seed is printed; `SECRETS_SEED=n` repeats a run.
    #[test]
    fn no_generated_password_survives_in_any_surrounding_text() {
        let seed = std::env::var("SECRETS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
        eprintln!("secrets seed {seed}");
        let mut state = seed | 1;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            usize::try_from(state % n as u64).unwrap_or(0)
        };
        // Password characters: anything a URL password may hold unencoded or encoded,
        // but no whitespace or quote (those end a URL in text).
        const PW: &[char] =
            &['a', 'Z', '9', '/', '?', '#', '@', ',', ':', '%', '&', '=', ';', '+', '!', 'é', '€'];
        const AROUND: &[&str] = &[
            "",
            " ",
            "cannot connect to ",
            "\"",
            "'",
            ": refused",
            ",",
            "?x=1",
            "/db",
            "\n",
            "é",
            "=",
            "password",
        ];
        const SPACES: &[&str] = &["", " ", "\t "];
        const ENCODED: &[&str] = &["password", "pass%77ord", "%70assword", "PASSWORD", "sslpass%77ord"];
        for round in 0..5000 {
            let password: String = (0..4 + next(12)).map(|_| PW[next(PW.len())]).collect();
            // In a query, '&' and '#' end a value: a password holds them percent-encoded.
            let query_password = password.replace('&', "%26").replace('#', "%23");
            let (before, after) = (AROUND[next(AROUND.len())], AROUND[next(AROUND.len())]);
            let texts = [
                format!("{before}postgres://app:{password}@db:5432/x{after}"),
                format!("{before}postgres://db/x?user=app&password={query_password}{after}"),
                format!("{before}host=db password={password}{after}"),
                format!("{before}sasl_ssl://u:{password}@h1:9093,sasl_ssl://v:{password}@h2:9093{after}"),
                // libpq's spaces around '=', and a percent-encoded name in a query.
                format!("{before}host=db password{}={}{password}{after}", SPACES[next(3)], SPACES[next(3)]),
                format!("{before}postgres://db/x?{}={query_password}{after}", ENCODED[next(ENCODED.len())]),
            ];
            for (i, text) in texts.iter().enumerate() {
                let password = if i == 1 || i == 5 { query_password.as_str() } else { password.as_str() };
                let shown = redact_urls(text);
                let rest = text.replacen(password, "", usize::MAX);
                // Only meaningful when the password is not also part of the text around it.
                if !rest.contains(password) && password.chars().any(char::is_alphanumeric) {
                    assert!(
                        !shown.contains(password),
                        "seed {seed} round {round}: {password:?} shown in {shown:?} (from {text:?})"
                    );
                }
            }
        }
    }

    #[test]
    fn redacted_settings_hide_secret_values_and_url_passwords() {
        let settings: BTreeMap<String, String> = [
            ("sasl.password", "hunter2"),
            ("ssl.key.password", "hunter3"),
            ("sasl.oauthbearer.token.endpoint.url", "https://svc:hunter4@idp/token"),
            ("linger.ms", "5"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let shown = format!("{:?}", redacted(&settings));
        for secret in ["hunter2", "hunter3", "hunter4"] {
            assert!(!shown.contains(secret), "{secret} shown: {shown}");
        }
        assert!(
            shown.contains("\"linger.ms\": \"5\"") && shown.contains("https://svc:(redacted)@idp/token"),
            "{shown}"
        );
    }
}
