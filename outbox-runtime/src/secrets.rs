//! Keeping secrets out of `Debug` output, logs and error messages: Kafka settings that
//! hold a secret, and passwords in URLs (`user:password@`, `?password=`).

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

/// `text` with the password of every URL in it replaced: the password of `user:password@`
/// and the value of every query parameter that names a secret (`?password=`,
/// `sslpassword=`, `access_token=`, ...). Text without `://` is returned as it is.
pub(crate) fn redact_urls(text: &str) -> Cow<'_, str> {
    if !text.contains("://") {
        return Cow::Borrowed(text);
    }
    // URLs end at whitespace or at a comma between brokers; redact each word.
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    for c in text.chars() {
        if c.is_whitespace() || c == ',' || c == '"' || c == '\'' {
            out.push_str(&redact_url(&word));
            word.clear();
            out.push(c);
        } else {
            word.push(c);
        }
    }
    out.push_str(&redact_url(&word));
    Cow::Owned(out)
}

fn redact_url(word: &str) -> String {
    let Some(scheme_end) = word.find("://") else {
        return word.to_owned();
    };
    let (scheme, rest) = word.split_at(scheme_end + 3);
    // The authority ends at the first '/', '?' or '#'; its userinfo at its last '@'.
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rfind('@') {
        Some(at) => {
            let (userinfo, host) = authority.split_at(at);
            match userinfo.split_once(':') {
                Some((user, _password)) => format!("{user}:{REDACTED}{host}"),
                None => authority.to_owned(),
            }
        }
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let (query, fragment) = query.split_once('#').map_or((query, None), |(q, f)| (q, Some(f)));
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) if is_secret(name) => format!("{name}={REDACTED}"),
                    _ => pair.to_owned(),
                })
                .collect();
            let fragment = fragment.map(|f| format!("#{f}")).unwrap_or_default();
            format!("{path}?{}{fragment}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}{authority}{tail}")
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
            ("no url here: password=hunter2", "no url here: password=hunter2"),
            ("", ""),
        ];
        for (text, expected) in cases {
            assert_eq!(redact_urls(text), expected, "{text}");
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
