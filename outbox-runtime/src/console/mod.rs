//! The operator console (feature `console`): a server-rendered web console over the
//! operator API ([`Ops`], [`InboxAdmin`]), every page also JSON. `outbox console` serves
//! it; a service can mount [`Console::router`] in its own server instead.
//!
//! Safe by default: it binds 127.0.0.1 unless told otherwise, and any other address needs
//! a token ([`ConsoleConfig::token`]), compared in constant time and never logged; it
//! answers only requests whose `Host` is its own (a page of another site cannot reach it
//! by rebinding a name to 127.0.0.1); every write is a POST checked against cross-site
//! requests (`Sec-Fetch-Site`, `Origin`) and carrying a CSRF token; a read-only console
//! refuses every write on the server; payloads are hidden unless allowed, and shown through
//! a redaction hook, size-capped; pages carry a content security policy with no inline
//! script, and every asset is served from the binary.

mod actions;
mod assets;
mod inbox_pages;
mod lag;
mod live;
mod pages;
mod redact;
mod render;
mod security;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::routing::get;
use axum::Router;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::inbox::{InboxAdmin, LagReader};
use crate::ops::Ops;
use crate::Outbox;

pub use redact::redact_keys;

/// The address the console binds unless told otherwise.
pub const DEFAULT_BIND: &str = "127.0.0.1:8089";

/// The largest payload shown, in bytes, unless told otherwise.
pub const DEFAULT_PAYLOAD_LIMIT: usize = 64 * 1024;

/// Counts on the overview stop at this many rows per state unless told otherwise.
pub const DEFAULT_COUNT_CAP: u32 = 10_000;

/// A payload redaction: given the event type and the payload's JSON text, the text to show.
pub type Redactor = Arc<dyn Fn(&str, &str) -> String + Send + Sync>;

/// How the console runs.
#[derive(Clone)]
pub struct ConsoleConfig {
    bind: SocketAddr,
    token: Option<String>,
    read_only: bool,
    show_payloads: bool,
    payload_limit: usize,
    redactor: Option<Redactor>,
    inbox: Option<(String, String)>,
    count_cap: u32,
    actor: String,
    hosts: Vec<String>,
    lag: Option<Arc<LagReader>>,
}

impl std::fmt::Debug for ConsoleConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("ConsoleConfig")
            .field("bind", &self.bind)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("read_only", &self.read_only)
            .field("show_payloads", &self.show_payloads)
            .field("payload_limit", &self.payload_limit)
            .field("redactor", &self.redactor.as_ref().map(|_| "<set>"))
            .field("inbox", &self.inbox)
            .field("count_cap", &self.count_cap)
            .field("actor", &self.actor)
            .field("hosts", &self.hosts)
            .field("lag", &self.lag)
            .finish()
    }
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            bind: DEFAULT_BIND.parse().expect("a socket address"),
            token: None,
            read_only: false,
            show_payloads: false,
            payload_limit: DEFAULT_PAYLOAD_LIMIT,
            redactor: None,
            inbox: None,
            count_cap: DEFAULT_COUNT_CAP,
            actor: "console".to_owned(),
            hosts: Vec::new(),
            lag: None,
        }
    }
}

impl ConsoleConfig {
    /// The address to listen on (default [`DEFAULT_BIND`]). Any address but a loopback one
    /// needs a [`token`](ConsoleConfig::token).
    #[must_use]
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// The token every request must carry (a cookie set by the login URL, or
    /// `Authorization: Bearer`); at least 16 characters.
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Refuse every write (retry, discard), on the server.
    #[must_use]
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Show payloads on event pages (hidden by default), through the redactor when one is
    /// set, cut at `limit` bytes.
    #[must_use]
    pub fn show_payloads(mut self, show: bool, limit: usize) -> Self {
        self.show_payloads = show;
        self.payload_limit = limit;
        self
    }

    /// The redaction applied to every payload shown: `(event type, JSON text) -> text`.
    /// [`redact_keys`] builds one that hides the values of given keys.
    #[must_use]
    pub fn redactor(mut self, redactor: Redactor) -> Self {
        self.redactor = Some(redactor);
        self
    }

    /// Also show the inbox `schema.table` (its consumers, records, parked messages).
    #[must_use]
    pub fn inbox(mut self, schema: impl Into<String>, table: impl Into<String>) -> Self {
        self.inbox = Some((schema.into(), table.into()));
        self
    }

    /// Where counts on the overview stop (they say "at least" past it).
    #[must_use]
    pub fn count_cap(mut self, cap: u32) -> Self {
        self.count_cap = cap;
        self
    }

    /// Who the audit records for actions taken through this console.
    #[must_use]
    pub fn actor(mut self, actor: impl Into<String>) -> Self {
        self.actor = actor.into();
        self
    }

    /// Another `Host` the console answers to (`name` or `name:port`), for a console behind
    /// a proxy or reached by a DNS name.
    #[must_use]
    pub fn allow_host(mut self, host: impl Into<String>) -> Self {
        self.hosts.push(host.into());
        self
    }

    /// Show each inbox consumer's lag on the overview, read by `reader` from the brokers
    /// (at most once per 5 s; its settings never reach a page).
    #[must_use]
    pub fn lag(mut self, reader: LagReader) -> Self {
        self.lag = Some(Arc::new(reader));
        self
    }

    /// The address it listens on.
    pub fn get_bind(&self) -> SocketAddr {
        self.bind
    }
}

/// A console over one outbox (and optionally one inbox), ready to serve.
#[derive(Clone, Debug)]
pub struct Console {
    state: Arc<State>,
}

/// Actions remembered by their form's key, for a double submit to find its first result.
const REMEMBERED_ACTIONS: usize = 256;

pub(crate) struct State {
    pub(crate) pool: PgPool,
    pub(crate) ops: Ops,
    pub(crate) config: ConsoleConfig,
    /// The secret every form carries back.
    pub(crate) csrf: String,
    pub(crate) hosts: Vec<String>,
    /// Actions by their form's key: running (`None`) or done.
    pub(crate) done: Mutex<VecDeque<(String, Option<Arc<actions::Outcome>>)>>,
    /// The consumers' lag last read.
    pub(crate) lag_cache: lag::LagCache,
    /// The overview the live streams last sent, and when it was read.
    pub(crate) live_overview: live::Shared,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Console {
    /// A console over `outbox`'s tables in `pool`. Refuses ([`Error::Config`]) a bind
    /// address that is not a loopback one without a token, and a token shorter than 16
    /// characters.
    pub fn new(pool: PgPool, outbox: &Outbox, config: ConsoleConfig) -> Result<Console> {
        if let Some(token) = &config.token {
            if token.chars().count() < 16 {
                return Err(Error::Config("the console's token: shorter than 16 characters".to_owned()));
            }
            // It travels in a cookie and a URL: letters, digits and `-._~` only.
            if !token.chars().all(|c| c.is_ascii_alphanumeric() || "-._~".contains(c)) {
                return Err(Error::Config(
                    "the console's token: only letters, digits and - . _ ~ (it travels in a cookie)"
                        .to_owned(),
                ));
            }
        } else if !config.bind.ip().is_loopback() {
            return Err(Error::Config(format!(
                "the console's bind address {}: not a loopback address, and no token: anyone who can reach it \
                 could act on the outbox. Give a token (--token-file or OUTBOX_CONSOLE_TOKEN), or bind 127.0.0.1",
                config.bind
            )));
        }
        if let Some((schema, table)) = &config.inbox {
            InboxAdmin::new(pool.clone(), schema, table, "")?;
        }
        if config.count_cap < 1 {
            return Err(Error::Config("the console's count cap: below 1".to_owned()));
        }
        let port = config.bind.port();
        let mut hosts = vec![config.bind.to_string(), format!("localhost:{port}")];
        if config.bind.ip().is_unspecified() || config.bind.ip().is_loopback() {
            hosts.extend([format!("127.0.0.1:{port}"), format!("[::1]:{port}")]);
        }
        hosts.extend(config.hosts.iter().cloned());
        Ok(Console {
            state: Arc::new(State {
                pool,
                ops: outbox.ops(),
                csrf: random_secret(),
                hosts,
                done: Mutex::new(VecDeque::new()),
                lag_cache: lag::LagCache::default(),
                live_overview: live::Shared::default(),
                config,
            }),
        })
    }

    /// The URL to open: with a token, the login URL that carries it (print it once, to the
    /// operator; it is never logged).
    pub fn url(&self) -> String {
        let base = format!("http://{}", self.state.config.bind);
        match &self.state.config.token {
            Some(token) => format!("{base}/login?token={}", security::url_encode(token)),
            None => format!("{base}/"),
        }
    }

    /// The console's routes: GET for pages, POST for writes (see [`WRITE_ROUTES`]).
    pub fn router(&self) -> Router {
        let state = self.state.clone();
        let mut router = Router::new()
            .route("/", get(pages::overview))
            .route("/events", get(pages::events))
            .route("/events/{event_id}", get(pages::event))
            .route("/failures", get(pages::failures))
            .route("/inbox/{consumer}", get(inbox_pages::applied))
            .route("/inbox/{consumer}/parked", get(inbox_pages::parked))
            .route("/inbox/{consumer}/parked/{id}", get(inbox_pages::parked_one))
            .route("/audit", get(pages::audit))
            .route("/live", get(live::stream))
            .route("/login", get(security::login))
            .route("/assets/{name}", get(assets::serve));
        for (path, kind) in WRITE_ROUTES {
            router = router.route(path, actions::route(kind));
        }
        router
            .fallback(pages::not_found)
            .layer(axum::middleware::from_fn_with_state(state.clone(), security::guard))
            .layer(axum::extract::DefaultBodyLimit::max(64 * 1024))
            .with_state(state)
    }

    /// Serves on `listener` until `stop` is cancelled.
    pub async fn serve(self, listener: tokio::net::TcpListener, stop: CancellationToken) -> Result<()> {
        let router = self.router();
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .map_err(|e| Error::Config(format!("the console's listener: {e}")))
    }
}

/// What a write route does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteRoute {
    /// Retry failed outbox events.
    OutboxRetry,
    /// Discard failed outbox events.
    OutboxDiscard,
    /// Publish published outbox events again, with their ids.
    OutboxReplay,
    /// Ask a consumer to retry parked messages.
    InboxRetry,
    /// Discard parked messages.
    InboxDiscard,
}

/// Every route that writes, with what it does: the read-only mode and the cross-site
/// checks cover each (the tests walk this list).
pub const WRITE_ROUTES: [(&str, WriteRoute); 5] = [
    ("/actions/outbox/retry", WriteRoute::OutboxRetry),
    ("/actions/outbox/discard", WriteRoute::OutboxDiscard),
    ("/actions/outbox/replay", WriteRoute::OutboxReplay),
    ("/actions/inbox/{consumer}/retry", WriteRoute::InboxRetry),
    ("/actions/inbox/{consumer}/discard", WriteRoute::InboxDiscard),
];

impl State {
    /// The inbox admin of `consumer`, when an inbox is configured.
    pub(crate) fn inbox(&self, consumer: &str) -> Option<InboxAdmin> {
        let (schema, table) = self.config.inbox.as_ref()?;
        InboxAdmin::new(self.pool.clone(), schema, table, consumer).ok()
    }

    /// The inbox admin of `consumer`, or the error page saying there is no inbox.
    pub(crate) fn inbox_admin(&self, consumer: &str) -> Result<InboxAdmin> {
        self.inbox(consumer).ok_or_else(|| {
            Error::NotFound(
                "this console shows no inbox: start it with --inbox-table (or ConsoleConfig::inbox)"
                    .to_owned(),
            )
        })
    }

    /// Claims the action submitted with form key `key`: `Ok(())` when it is new (it is
    /// then marked running), else what became of the first submit (`None`: still running).
    pub(crate) fn claim(&self, key: &str) -> std::result::Result<(), Option<Arc<actions::Outcome>>> {
        let mut done = self.done.lock().expect("not poisoned");
        if let Some((_, report)) = done.iter().find(|(k, _)| k == key) {
            return Err(report.clone());
        }
        if done.len() == REMEMBERED_ACTIONS {
            done.pop_front();
        }
        done.push_back((key.to_owned(), None));
        Ok(())
    }

    /// Records what the action of `key` did; a failed one is forgotten (it may be sent again).
    pub(crate) fn finish(&self, key: &str, report: Option<&actions::Outcome>) {
        let mut done = self.done.lock().expect("not poisoned");
        match report {
            Some(report) => {
                if let Some(entry) = done.iter_mut().find(|(k, _)| k == key) {
                    entry.1 = Some(Arc::new(report.clone()));
                }
            }
            None => done.retain(|(k, _)| k != key),
        }
    }
}

/// A new token for [`ConsoleConfig::token`]: 244 random bits from the operating system.
pub fn generate_token() -> String {
    random_secret()
}

/// 244 random bits from the operating system, as hex.
pub(crate) fn random_secret() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}
