//! A blocking client of the Confluent Schema Registry REST API: only the endpoints this
//! crate needs, each answer checked against what the API documents.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::{json, Value};
use ureq::http;

use super::error::{RegistryError, AUTH_PASSWORD_VAR, AUTH_USER_VAR};
use crate::schema::Policy;

const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";
/// How long one call may take, connection included.
const TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer read (a schema with its references is far smaller).
const MAX_ANSWER: u64 = 16 << 20;
/// Escaped in a subject within a path: everything but unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// A schema as registered under a subject.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Registered {
    /// The subject.
    pub subject: String,
    /// The schema's global id (what the prefix form of the wire format carries).
    pub id: u32,
    /// The schema's GUID (what the header form carries), from registries that give one
    /// (Confluent 8.0 and later).
    pub guid: Option<[u8; 16]>,
    /// Its version within the subject.
    pub version: u32,
    /// The schema as the registry keeps it.
    pub schema: String,
}

/// Whether a subject holds a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Lookup {
    /// It does.
    Registered(Registered),
    /// The subject does not exist (error 40401).
    NoSubject,
    /// The subject exists without this schema (error 40403).
    NotInSubject,
}

/// The registry's compatibility verdict on a schema against a subject's latest version.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Compatibility {
    /// `is_compatible`.
    pub is_compatible: bool,
    /// `messages` (with `verbose=true`): why not.
    pub messages: Vec<String>,
}

/// A Confluent-API schema registry.
#[derive(Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
    authorization: Option<String>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("authenticated", &self.authorization.is_some())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// The registry at `url` (`http://` or `https://`, perhaps with a path prefix), without
    /// credentials. A URL with credentials in it (`https://key:secret@...`) is refused, so
    /// that no message ever prints them: use [`Client::basic_auth`] or [`Client::from_env`].
    pub fn new(url: &str) -> Result<Client, RegistryError> {
        let bad = |reason: &str| RegistryError::BadUrl { url: redact(url), reason: reason.to_owned() };
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .ok_or_else(|| bad("expected http://HOST[:PORT][/PATH] or https://..."))?;
        let authority = rest.split('/').next().unwrap_or("");
        if authority.is_empty() {
            return Err(bad("no host"));
        }
        if authority.contains('@') {
            return Err(bad(&format!(
                "credentials in the URL are refused (they would be printed); set {AUTH_USER_VAR} and {AUTH_PASSWORD_VAR}"
            )));
        }
        if rest.contains(['?', '#']) {
            return Err(bad("a query or fragment has no meaning here"));
        }
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(TIMEOUT))
            .max_redirects(0)
            .build();
        Ok(Client { base: url.trim_end_matches('/').to_owned(), agent: config.into(), authorization: None })
    }

    /// [`Client::new`] with the credentials of [`AUTH_USER_VAR`] and [`AUTH_PASSWORD_VAR`]
    /// when the first is set (the second must be then).
    pub fn from_env(url: &str) -> Result<Client, RegistryError> {
        let client = Client::new(url)?;
        match (std::env::var(AUTH_USER_VAR), std::env::var(AUTH_PASSWORD_VAR)) {
            (Ok(user), Ok(password)) => Ok(client.basic_auth(&user, &password)),
            (Ok(_), Err(_)) => Err(RegistryError::Config {
                setting: AUTH_PASSWORD_VAR,
                reason: format!("not set (or not UTF-8) while {AUTH_USER_VAR} is"),
            }),
            (Err(_), Ok(_)) => Err(RegistryError::Config {
                setting: AUTH_USER_VAR,
                reason: format!("not set (or not UTF-8) while {AUTH_PASSWORD_VAR} is"),
            }),
            (Err(_), Err(_)) => Ok(client),
        }
    }

    /// HTTP basic authentication (Confluent Cloud: API key and secret).
    pub fn basic_auth(mut self, user: &str, password: &str) -> Client {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        self.authorization = Some(format!("Basic {token}"));
        self
    }

    /// The registry's URL (never with credentials).
    pub fn url(&self) -> &str {
        &self.base
    }

    /// Whether `schema` is registered under `subject` (`POST /subjects/{subject}`).
    pub fn lookup(&self, subject: &str, schema: &str) -> Result<Lookup, RegistryError> {
        let what = format!("looking up a schema in subject {subject:?}");
        let body = json!({ "schemaType": "JSON", "schema": schema });
        match self.call("POST", &format!("/subjects/{}", segment(subject)), Some(&body), &what)? {
            (200, answer) => Ok(Lookup::Registered(registered(&answer, subject, &what)?)),
            (404, answer) => match error_code(&answer) {
                Some(40401) => Ok(Lookup::NoSubject),
                Some(40403) => Ok(Lookup::NotInSubject),
                _ => Err(api_error(&what, 404, &answer)),
            },
            (status, answer) => Err(self.refusal(subject, &what, status, &answer)),
        }
    }

    /// Registers `schema` under `subject` (`POST /subjects/{subject}/versions`) and returns
    /// its id; registering a schema the subject holds returns its id again.
    pub fn register(&self, subject: &str, schema: &str) -> Result<u32, RegistryError> {
        let what = format!("registering a schema in subject {subject:?}");
        let body = json!({ "schemaType": "JSON", "schema": schema });
        match self.call("POST", &format!("/subjects/{}/versions", segment(subject)), Some(&body), &what)? {
            (200, answer) => id_of(&answer, "id", &what),
            (status, answer) => Err(self.refusal(subject, &what, status, &answer)),
        }
    }

    /// Sets the compatibility level of `subject` (`PUT /config/{subject}`), and its
    /// compatibility policy when `policy` is given (`compatibilityPolicy`, which registries
    /// without policies ignore).
    pub fn set_compatibility(
        &self,
        subject: &str,
        level: &str,
        policy: Option<Policy>,
    ) -> Result<(), RegistryError> {
        let what = format!("setting the compatibility of subject {subject:?}");
        let mut body = json!({ "compatibility": level });
        if let Some(policy) = policy {
            body["compatibilityPolicy"] = json!(policy.to_string().to_uppercase());
        }
        match self.call("PUT", &format!("/config/{}", segment(subject)), Some(&body), &what)? {
            (200, _) => Ok(()),
            (status, answer) => Err(self.refusal(subject, &what, status, &answer)),
        }
    }

    /// The compatibility level in force for `subject` (its own, else the registry's):
    /// `GET /config/{subject}?defaultToGlobal=true`.
    pub fn compatibility(&self, subject: &str) -> Result<String, RegistryError> {
        let what = format!("reading the compatibility of subject {subject:?}");
        match self.call("GET", &format!("/config/{}?defaultToGlobal=true", segment(subject)), None, &what)? {
            (200, answer) => answer
                .get("compatibilityLevel")
                .or_else(|| answer.get("compatibility"))
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| protocol(&what, "no compatibilityLevel")),
            (status, answer) => Err(self.refusal(subject, &what, status, &answer)),
        }
    }

    /// The registry's verdict on `schema` against the latest version of `subject`, with
    /// its reasons (`POST /compatibility/subjects/{subject}/versions/latest?verbose=true`).
    pub fn check_latest(&self, subject: &str, schema: &str) -> Result<Compatibility, RegistryError> {
        let what = format!("checking a schema against subject {subject:?}");
        let body = json!({ "schemaType": "JSON", "schema": schema });
        let path = format!("/compatibility/subjects/{}/versions/latest?verbose=true", segment(subject));
        match self.call("POST", &path, Some(&body), &what)? {
            (200, answer) => {
                let is_compatible = answer
                    .get("is_compatible")
                    .and_then(Value::as_bool)
                    .ok_or_else(|| protocol(&what, "no is_compatible"))?;
                let messages = answer
                    .get("messages")
                    .and_then(Value::as_array)
                    .map(|m| {
                        m.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned)).collect()
                    })
                    .unwrap_or_default();
                Ok(Compatibility { is_compatible, messages })
            }
            (status, answer) => Err(self.refusal(subject, &what, status, &answer)),
        }
    }

    /// The latest version registered under `subject` (`GET /subjects/{subject}/versions/latest`).
    pub fn latest(&self, subject: &str) -> Result<Registered, RegistryError> {
        let what = format!("reading the latest schema of subject {subject:?}");
        match self.call("GET", &format!("/subjects/{}/versions/latest", segment(subject)), None, &what)? {
            (200, answer) => registered(&answer, subject, &what),
            (status, answer) => Err(self.refusal(subject, &what, status, &answer)),
        }
    }

    /// The schema of a global id (`GET /schemas/ids/{id}`), as a deserializer finds it.
    pub fn schema_by_id(&self, id: u32) -> Result<String, RegistryError> {
        let what = format!("reading schema id {id}");
        match self.call("GET", &format!("/schemas/ids/{id}"), None, &what)? {
            (200, answer) => answer
                .get("schema")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| protocol(&what, "no schema")),
            (status, answer) => Err(api_error(&what, status, &answer)),
        }
    }

    fn refusal(&self, subject: &str, what: &str, status: u16, answer: &Value) -> RegistryError {
        match (status, error_code(answer)) {
            (401 | 403, _) => RegistryError::Unauthorized { url: self.base.clone(), status },
            (409, _) => RegistryError::Incompatible {
                subject: subject.to_owned(),
                messages: message(answer).into_iter().collect(),
            },
            (422, Some(42201)) => RegistryError::InvalidSchema {
                subject: subject.to_owned(),
                message: message(answer).unwrap_or_default(),
            },
            _ => api_error(what, status, answer),
        }
    }

    /// One call: the status and the JSON answer (`null` for an empty body).
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        what: &str,
    ) -> Result<(u16, Value), RegistryError> {
        let url = format!("{}{path}", self.base);
        let mut request = http::Request::builder()
            .method(method)
            .uri(&url)
            .header("Accept", format!("{CONTENT_TYPE}, application/json"));
        if let Some(auth) = &self.authorization {
            request = request.header("Authorization", auth);
        }
        let unreachable = |error: String| RegistryError::Unreachable { url: self.base.clone(), error };
        let response = match body {
            Some(body) => {
                let request = request
                    .header("Content-Type", CONTENT_TYPE)
                    .body(body.to_string().into_bytes())
                    .map_err(|e| protocol(what, &e.to_string()))?;
                self.agent.run(request)
            }
            None => {
                let request = request.body(()).map_err(|e| protocol(what, &e.to_string()))?;
                self.agent.run(request)
            }
        };
        let mut response = response.map_err(|e| unreachable(e.to_string()))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER)
            .read_to_string()
            .map_err(|e| unreachable(e.to_string()))?;
        if text.trim().is_empty() {
            return Ok((status, Value::Null));
        }
        match serde_json::from_str(&text) {
            Ok(answer) => Ok((status, answer)),
            // An error page from a proxy in front of the registry, say: its status tells.
            Err(_) if status >= 400 => Ok((status, json!({ "message": excerpt(&text) }))),
            Err(e) => Err(protocol(what, &format!("HTTP {status} with a body that is not JSON ({e})"))),
        }
    }
}

fn segment(subject: &str) -> String {
    utf8_percent_encode(subject, SEGMENT).to_string()
}

fn excerpt(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_owned(),
    }
}

/// `url` without what is between `://` and `@` (for messages about a refused URL).
fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***{}", &url[..s], &url[at..]),
        _ => url.to_owned(),
    }
}

fn error_code(answer: &Value) -> Option<i64> {
    answer.get("error_code").and_then(Value::as_i64)
}

fn message(answer: &Value) -> Option<String> {
    answer.get("message").and_then(Value::as_str).map(str::to_owned)
}

fn api_error(what: &str, status: u16, answer: &Value) -> RegistryError {
    RegistryError::Api {
        what: what.to_owned(),
        status,
        error_code: error_code(answer).unwrap_or(i64::from(status)),
        message: message(answer).unwrap_or_else(|| "(no message)".to_owned()),
    }
}

fn protocol(what: &str, reason: &str) -> RegistryError {
    RegistryError::Protocol { what: what.to_owned(), reason: reason.to_owned() }
}

fn id_of(answer: &Value, field: &str, what: &str) -> Result<u32, RegistryError> {
    answer
        .get(field)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| protocol(what, &format!("no {field} (a number up to 2^32-1)")))
}

fn registered(answer: &Value, subject: &str, what: &str) -> Result<Registered, RegistryError> {
    Ok(Registered {
        subject: answer.get("subject").and_then(Value::as_str).unwrap_or(subject).to_owned(),
        id: id_of(answer, "id", what)?,
        // A GUID the registry gives is what the header form carries: one that does not
        // parse is an answer we cannot use, not a reason to fall back on the id.
        guid: match answer.get("guid") {
            None | Some(Value::Null) => None,
            Some(guid) => Some(guid.as_str().and_then(super::framing::parse_guid).ok_or_else(|| {
                protocol(what, &format!("guid {guid} is not a GUID (8-4-4-4-12 hex digits)"))
            })?),
        },
        version: id_of(answer, "version", what)?,
        schema: answer.get("schema").and_then(Value::as_str).unwrap_or_default().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_with_credentials_or_without_a_scheme_are_refused_without_printing_secrets() {
        let err = Client::new("https://key:s3cret@registry.example").unwrap_err().to_string();
        assert!(!err.contains("s3cret") && !err.contains("key:"), "{err}");
        assert!(err.contains(AUTH_USER_VAR), "{err}");
        assert!(Client::new("registry.example:8081").unwrap_err().to_string().contains("expected http://"));
        assert!(Client::new("http:///x").is_err());
        assert!(Client::new("http://h:8081/?x=1").is_err());
        let client = Client::new("http://127.0.0.1:8081/prefix/").expect("url");
        assert_eq!(client.url(), "http://127.0.0.1:8081/prefix");
        let debug = format!("{:?}", client.basic_auth("key", "s3cret"));
        assert!(!debug.contains("s3cret") && !debug.contains("Basic"), "{debug}");
    }

    #[test]
    fn subjects_are_escaped_as_one_path_segment() {
        assert_eq!(segment("orders-order.placed v1"), "orders-order.placed%20v1");
        assert_eq!(segment("a/b?c#d%"), "a%2Fb%3Fc%23d%25");
    }

    #[test]
    fn a_guid_that_does_not_parse_is_refused_not_dropped() {
        let answer = |guid: Value| json!({"id": 3, "version": 1, "guid": guid});
        let ok = registered(&answer(json!("5a2b2ee4-1f5e-4b8f-9b3a-0e2d9c6a7f10")), "s", "looking up")
            .expect("a GUID");
        assert_eq!(ok.guid.map(|g| g[0]), Some(0x5a));
        assert_eq!(registered(&json!({"id": 3, "version": 1}), "s", "x").expect("no GUID").guid, None);
        for bad in [json!("5a2b2ee4"), json!(17), json!("zz2b2ee4-1f5e-4b8f-9b3a-0e2d9c6a7f10")] {
            let err = registered(&answer(bad.clone()), "s", "looking up a schema").expect_err("malformed");
            assert!(matches!(err, RegistryError::Protocol { .. }), "{bad}: {err}");
            assert!(err.to_string().contains("is not a GUID"), "{err}");
        }
    }

    #[test]
    fn an_unreachable_registry_is_said_so() {
        // A port nothing listens on: bind one, then drop it.
        let port =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let client = Client::new(&format!("http://127.0.0.1:{port}")).expect("url");
        let err = client.lookup("s", "{}").unwrap_err();
        assert!(matches!(err, RegistryError::Unreachable { .. }), "{err}");
        assert!(!err.is_refusal());
    }
}
