//! A stand-in for a Confluent-API schema registry, for tests: no registry server can be
//! installed on these machines. It implements only the endpoints the documentation gives
//! and the error codes it lists (40401 subject not found, 40403 schema not found, 40901
//! incompatible, 42201 invalid schema, 42203 invalid compatibility level, 401), keeps
//! everything in memory, gives each schema a GUID (as Confluent 8 does), and judges
//! compatibility with this crate's own checker (JSON
//! Schema semantics, the subject's policy): it tests our client and the bytes, not the
//! registry's verdicts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use outbox_runtime::schema::{compare_with, Judge, Level, Policy, SchemaDoc, Semantics};
use serde_json::{json, Value};

/// What the stand-in holds.
#[derive(Debug, Default)]
pub struct Registry {
    /// Every schema registered, by id - 1.
    pub schemas: Vec<String>,
    /// Each subject's versions, as ids, in order.
    pub subjects: BTreeMap<String, Vec<u32>>,
    /// Each subject's compatibility level and policy, as set.
    pub configs: BTreeMap<String, (String, Option<String>)>,
    /// Every request, as `METHOD /path`.
    pub requests: Vec<String>,
    /// The `Authorization` header every request must carry, when set.
    pub authorization: Option<String>,
    /// Subjects whose every schema is refused as invalid (HTTP 422, error code 42201), at
    /// lookup, check and registration alike: fault injection for a registry whose loader
    /// cannot read a schema ours reads (Confluent's reads one without `$schema` as
    /// draft-07, and refuses a `$ref` its loader does not resolve).
    pub unloadable: std::collections::BTreeSet<String>,
}

type Shared = Arc<Mutex<Registry>>;

/// A running stand-in on 127.0.0.1 (a thread of its own; stopped when dropped).
#[derive(Debug)]
pub struct StandIn {
    url: String,
    state: Shared,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The level of a subject without one of its own.
pub const GLOBAL_LEVEL: &str = "BACKWARD";

impl StandIn {
    /// Starts one with no credentials required.
    pub fn start() -> StandIn {
        StandIn::start_with(None)
    }

    /// Starts one that requires HTTP basic authentication with `user` and `password`.
    pub fn with_credentials(user: &str, password: &str) -> StandIn {
        use base64::Engine as _;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        StandIn::start_with(Some(format!("Basic {token}")))
    }

    fn start_with(authorization: Option<String>) -> StandIn {
        let state: Shared = Arc::new(Mutex::new(Registry { authorization, ..Registry::default() }));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the stand-in");
        listener.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = router(state.clone());
        let thread = std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().expect("stand-in runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .expect("stand-in serves");
            });
        });
        StandIn { url, state, stop: Some(stop), thread: Some(thread) }
    }

    /// Its URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What it holds now.
    pub fn registry(&self) -> MutexGuard<'_, Registry> {
        lock(&self.state)
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock(state: &Shared) -> MutexGuard<'_, Registry> {
    state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn router(state: Shared) -> Router {
    Router::new()
        .route("/subjects", get(list_subjects))
        .route("/subjects/{subject}", post(lookup))
        .route("/subjects/{subject}/versions", post(register).get(versions))
        .route("/subjects/{subject}/versions/latest", get(latest))
        .route("/config/{subject}", get(get_config).put(put_config))
        .route("/compatibility/subjects/{subject}/versions/latest", post(check_latest))
        .route("/schemas/ids/{id}", get(schema_by_id))
        .route("/schemas/guids/{guid}", get(schema_by_guid))
        .with_state(state)
}

/// An error answer as the API documents it: `{"error_code": ..., "message": ...}`.
#[derive(Debug)]
struct Refusal(StatusCode, i64, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error_code": self.1, "message": self.2 }))).into_response()
    }
}

fn error(status: StatusCode, code: i64, message: impl Into<String>) -> Refusal {
    Refusal(status, code, message.into())
}

type Answer = Result<Json<Value>, Refusal>;

/// The log line and the credentials check of every request.
fn enter<'a>(
    state: &'a Shared,
    headers: &HeaderMap,
    line: String,
) -> Result<MutexGuard<'a, Registry>, Refusal> {
    let mut registry = lock(state);
    registry.requests.push(line);
    if let Some(expected) = &registry.authorization {
        let given = headers.get("authorization").and_then(|v| v.to_str().ok());
        if given != Some(expected.as_str()) {
            return Err(error(StatusCode::UNAUTHORIZED, 401, "Unauthorized"));
        }
    }
    Ok(registry)
}

/// The schema of a request body for `subject`: `{"schema": "...", "schemaType": "JSON"}`.
fn schema_of(registry: &Registry, subject: &str, body: &Value) -> Result<String, Refusal> {
    let invalid = |m: &str| error(StatusCode::UNPROCESSABLE_ENTITY, 42201, format!("Invalid schema: {m}"));
    if registry.unloadable.contains(subject) {
        return Err(invalid("this stand-in was told it cannot load the schemas of this subject"));
    }
    if body.get("schemaType").and_then(Value::as_str) != Some("JSON") {
        return Err(invalid("only schemaType JSON is served here"));
    }
    let text = body.get("schema").and_then(Value::as_str).ok_or_else(|| invalid("no schema"))?;
    SchemaDoc::from_str("schema", text).map_err(|e| invalid(&e.to_string()))?;
    Ok(text.to_owned())
}

/// The GUID of schema `id` (registries since Confluent 8.0 give each schema one).
pub fn guid_of(id: u32) -> String {
    format!("00000000-0000-4000-8000-{id:012x}")
}

fn same(a: &str, b: &str) -> bool {
    serde_json::from_str::<Value>(a).ok() == serde_json::from_str::<Value>(b).ok()
}

fn level_of(registry: &Registry, subject: &str) -> (String, Policy) {
    match registry.configs.get(subject) {
        Some((level, policy)) => (
            level.clone(),
            if policy.as_deref() == Some("LENIENT") { Policy::Lenient } else { Policy::Strict },
        ),
        None => (GLOBAL_LEVEL.to_owned(), Policy::Strict),
    }
}

/// Why `schema` may not follow the subject's versions under its level (empty: it may).
fn incompatibilities(registry: &Registry, subject: &str, schema: &str, latest_only: bool) -> Vec<String> {
    let (level, policy) = level_of(registry, subject);
    let Some(Level { mode: Some(mode), transitive, .. }) = Level::from_name(&level) else {
        return Vec::new();
    };
    let ids = registry.subjects.get(subject).cloned().unwrap_or_default();
    let against: Vec<u32> =
        if latest_only || !transitive { ids.last().copied().into_iter().collect() } else { ids };
    let Ok(new) = SchemaDoc::from_str("new", schema) else { return vec!["invalid schema".to_owned()] };
    let judge = Judge::new(Semantics::JsonSchema, policy);
    let mut out = Vec::new();
    for id in against {
        let Some(Ok(old)) = registry.schemas.get(id as usize - 1).map(|t| SchemaDoc::from_str("old", t))
        else {
            continue;
        };
        out.extend(compare_with(&old, &new, mode, judge).incompatibilities.iter().map(|i| i.to_string()));
    }
    out
}

fn no_subject(subject: &str) -> Refusal {
    error(StatusCode::NOT_FOUND, 40401, format!("Subject '{subject}' not found."))
}

async fn list_subjects(State(state): State<Shared>, headers: HeaderMap) -> Answer {
    let registry = enter(&state, &headers, "GET /subjects".to_owned())?;
    Ok(Json(json!(registry.subjects.keys().collect::<Vec<_>>())))
}

async fn lookup(
    State(state): State<Shared>,
    Path(subject): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Answer {
    let registry = enter(&state, &headers, format!("POST /subjects/{subject}"))?;
    let schema = schema_of(&registry, &subject, &body)?;
    let ids = registry.subjects.get(&subject).ok_or_else(|| no_subject(&subject))?;
    for (i, id) in ids.iter().enumerate() {
        let text = &registry.schemas[*id as usize - 1];
        if same(text, &schema) {
            return Ok(Json(json!({
                "subject": subject, "id": id, "guid": guid_of(*id), "version": i + 1, "schema": text,
            })));
        }
    }
    Err(error(StatusCode::NOT_FOUND, 40403, "Schema not found"))
}

async fn register(
    State(state): State<Shared>,
    Path(subject): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Answer {
    let mut registry = enter(&state, &headers, format!("POST /subjects/{subject}/versions"))?;
    let schema = schema_of(&registry, &subject, &body)?;
    let existing = registry.subjects.get(&subject).cloned().unwrap_or_default();
    if let Some(id) = existing.iter().find(|id| same(&registry.schemas[**id as usize - 1], &schema)) {
        return Ok(Json(json!({ "id": id, "guid": guid_of(*id) })));
    }
    let problems = incompatibilities(&registry, &subject, &schema, false);
    if !problems.is_empty() {
        return Err(error(
            StatusCode::CONFLICT,
            40901,
            format!(
                "Schema being registered is incompatible with an earlier schema for subject \"{subject}\", details: [{}]",
                problems.join(", ")
            ),
        ));
    }
    let id = match registry.schemas.iter().position(|s| same(s, &schema)) {
        Some(i) => i as u32 + 1,
        None => {
            registry.schemas.push(schema);
            registry.schemas.len() as u32
        }
    };
    registry.subjects.entry(subject).or_default().push(id);
    Ok(Json(json!({ "id": id, "guid": guid_of(id) })))
}

async fn versions(State(state): State<Shared>, Path(subject): Path<String>, headers: HeaderMap) -> Answer {
    let registry = enter(&state, &headers, format!("GET /subjects/{subject}/versions"))?;
    let ids = registry.subjects.get(&subject).ok_or_else(|| no_subject(&subject))?;
    Ok(Json(json!((1..=ids.len()).collect::<Vec<_>>())))
}

async fn latest(State(state): State<Shared>, Path(subject): Path<String>, headers: HeaderMap) -> Answer {
    let registry = enter(&state, &headers, format!("GET /subjects/{subject}/versions/latest"))?;
    let ids = registry.subjects.get(&subject).ok_or_else(|| no_subject(&subject))?;
    let id = *ids.last().ok_or_else(|| no_subject(&subject))?;
    Ok(Json(json!({
        "subject": subject, "id": id, "guid": guid_of(id), "version": ids.len(), "schemaType": "JSON",
        "schema": registry.schemas[id as usize - 1],
    })))
}

async fn get_config(
    State(state): State<Shared>,
    Path(subject): Path<String>,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Answer {
    let registry = enter(&state, &headers, format!("GET /config/{subject}"))?;
    match registry.configs.get(&subject) {
        Some((level, policy)) => {
            let mut answer = json!({ "compatibilityLevel": level });
            if let Some(policy) = policy {
                answer["compatibilityPolicy"] = json!(policy);
            }
            Ok(Json(answer))
        }
        None if query.get("defaultToGlobal").map(String::as_str) == Some("true") => {
            Ok(Json(json!({ "compatibilityLevel": GLOBAL_LEVEL })))
        }
        None => Err(error(
            StatusCode::NOT_FOUND,
            40408,
            format!("Subject '{subject}' does not have subject-level compatibility configured"),
        )),
    }
}

async fn put_config(
    State(state): State<Shared>,
    Path(subject): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Answer {
    let mut registry = enter(&state, &headers, format!("PUT /config/{subject}"))?;
    let level = body.get("compatibility").and_then(Value::as_str).unwrap_or_default().to_owned();
    if Level::from_name(&level).is_none() {
        return Err(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            42203,
            format!("Invalid compatibility level {level:?}"),
        ));
    }
    let policy = body.get("compatibilityPolicy").and_then(Value::as_str).map(str::to_owned);
    if policy.as_deref().is_some_and(|p| p != "STRICT" && p != "LENIENT") {
        return Err(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            42203,
            format!("Invalid compatibility policy {policy:?}"),
        ));
    }
    registry.configs.insert(subject, (level.clone(), policy));
    Ok(Json(json!({ "compatibility": level })))
}

async fn check_latest(
    State(state): State<Shared>,
    Path(subject): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Answer {
    let registry =
        enter(&state, &headers, format!("POST /compatibility/subjects/{subject}/versions/latest"))?;
    let schema = schema_of(&registry, &subject, &body)?;
    if !registry.subjects.contains_key(&subject) {
        // Nothing to be incompatible with.
        return Ok(Json(json!({ "is_compatible": true })));
    }
    let messages = incompatibilities(&registry, &subject, &schema, true);
    Ok(Json(json!({ "is_compatible": messages.is_empty(), "messages": messages })))
}

async fn schema_by_id(State(state): State<Shared>, Path(id): Path<u32>, headers: HeaderMap) -> Answer {
    let registry = enter(&state, &headers, format!("GET /schemas/ids/{id}"))?;
    match id.checked_sub(1).and_then(|i| registry.schemas.get(i as usize)) {
        Some(text) => Ok(Json(json!({ "schemaType": "JSON", "schema": text }))),
        None => Err(error(StatusCode::NOT_FOUND, 40403, "Schema not found")),
    }
}

async fn schema_by_guid(State(state): State<Shared>, Path(guid): Path<String>, headers: HeaderMap) -> Answer {
    let registry = enter(&state, &headers, format!("GET /schemas/guids/{guid}"))?;
    let found = (1..=registry.schemas.len() as u32).find(|id| guid_of(*id) == guid);
    match found {
        Some(id) => Ok(Json(json!({ "schemaType": "JSON", "schema": registry.schemas[id as usize - 1] }))),
        None => Err(error(StatusCode::NOT_FOUND, 40403, "Schema not found")),
    }
}
