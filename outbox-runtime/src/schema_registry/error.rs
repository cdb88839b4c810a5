//! [`RegistryError`]: why a call to a schema registry failed.

/// The user name for HTTP basic authentication (Confluent Cloud: the API key).
pub const AUTH_USER_VAR: &str = "OUTBOX_SCHEMA_REGISTRY_USER";
/// The password for HTTP basic authentication (Confluent Cloud: the API secret).
pub const AUTH_PASSWORD_VAR: &str = "OUTBOX_SCHEMA_REGISTRY_PASSWORD";

/// Why a call to the registry failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The registry's URL cannot be used.
    #[error("schema registry URL {url:?}: {reason}")]
    BadUrl {
        /// The URL as given (never with credentials: a URL that has them is refused).
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting is incomplete (a user without a password, say).
    #[error("{setting}: {reason}")]
    Config {
        /// The setting.
        setting: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// No answer: connection refused, name not found, TLS failure, timeout.
    #[error("schema registry {url} is unreachable: {error}")]
    Unreachable {
        /// The registry.
        url: String,
        /// What the transport said.
        error: String,
    },
    /// HTTP 401 or 403.
    #[error("schema registry {url} refused the credentials (HTTP {status}): set {AUTH_USER_VAR} and {AUTH_PASSWORD_VAR}")]
    Unauthorized {
        /// The registry.
        url: String,
        /// 401 or 403.
        status: u16,
    },
    /// HTTP 409 (error code 409, or 40901 since Confluent 8.0.4): the schema is not compatible with the subject's registered versions
    /// under the subject's compatibility level.
    #[error("subject {subject:?}: the registry refuses the schema as incompatible{}", list(messages))]
    Incompatible {
        /// The subject.
        subject: String,
        /// The registry's reasons, when it gives them.
        messages: Vec<String>,
    },
    /// HTTP 422 with error code 42201: the registry cannot parse the schema.
    #[error("subject {subject:?}: the registry refuses the schema as invalid: {message}")]
    InvalidSchema {
        /// The subject.
        subject: String,
        /// The registry's message.
        message: String,
    },
    /// Any other error the API documents (`{"error_code": ..., "message": ...}`).
    #[error("{what}: HTTP {status}, error {error_code}: {message}")]
    Api {
        /// The call.
        what: String,
        /// The HTTP status.
        status: u16,
        /// The registry's error code (e.g. 40401), or the status when there is none.
        error_code: i64,
        /// The registry's message.
        message: String,
    },
    /// A committed schema is not registered under its subject (a relay that frames its
    /// records resolves every id before it starts).
    #[error("{file} is not registered in subject {subject:?}: register the committed schemas first (cargo xtask schema push)")]
    NotRegistered {
        /// The subject.
        subject: String,
        /// The committed file.
        file: String,
    },
    /// An answer the API does not document (not JSON, a field missing).
    #[error("{what}: not an answer of the schema registry API: {reason}")]
    Protocol {
        /// The call.
        what: String,
        /// What was wrong with the answer.
        reason: String,
    },
}

fn list(messages: &[String]) -> String {
    if messages.is_empty() {
        String::new()
    } else {
        format!(": {}", messages.join("; "))
    }
}

impl RegistryError {
    /// The registry answered and refused the schema (incompatible or invalid), as opposed
    /// to not answering or answering something else.
    pub fn is_refusal(&self) -> bool {
        matches!(self, RegistryError::Incompatible { .. } | RegistryError::InvalidSchema { .. })
    }
}
