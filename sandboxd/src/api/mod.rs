//! The v1 API: one router, served on the Unix socket and on loopback HTTP.
//!
//! A request's path: [`crate::serve`] gives its connection a place and a write
//! timeout, [`surface::guard`] refuses foreign hosts and origins and
//! non-JSON bodies and times the body, [`auth`] decides who the caller is
//! ([`tokens`]) and claims the connection for it, a handler in [`runs`],
//! [`sessions`], [`files`] or [`tools`] reads the input and calls [`crate::service`], which
//! runs the code through [`crate::run`] and [`crate::isolate`]. [`chat`] runs a
//! model's tool loop over the same tools ([`crate::chat`]). The MCP tools
//! ([`crate::tools`], served by [`mcp`] at `/mcp`) call the same service. Every error is an
//! [`error::ApiError`]; the service's errors are mapped to them in `error.rs`.
//! [`console`] serves the web page (`GET /`) that calls this API from a browser.

pub mod chat;
pub mod console;
pub mod error;
pub mod files;
mod hold;
pub mod mcp;
pub mod openapi;
pub mod packages;
pub mod runs;
pub mod secrets;
pub mod sessions;
pub mod surface;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_holds;
pub mod tokens;
pub mod tools;

use crate::model::check::Report;
use crate::model::error::Code;
use crate::model::health::Health;
use crate::service::Operations;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use error::ApiError;
use std::sync::Arc;
pub use tokens::{Role, Tokens, Who};

/// Which listener a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Http,
    Unix,
}

/// What the router holds. Everything below the API is behind `service`, a trait
/// object: the handlers read the same with the real [`crate::service::Service`]
/// or the in-memory one of the router's unit tests, and the router is one type
/// (no generic parameter through every handler and OpenAPI path).
pub struct AppState {
    /// The operations every handler and MCP tool calls.
    pub service: Arc<dyn Operations>,
    /// The configured tokens (tenants' and operators'), by keyed owner id.
    pub tokens: Tokens,
    pub version: &'static str,
    pub rootfs_sha256: String,
    pub landlock_abi: i32,
    /// Cancelled at shutdown: ends MCP event streams, which would hold it up.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// How many MCP protocol sessions `/mcp` holds, and for how long.
    pub mcp_sessions: mcp::SessionLimits,
    /// What both listeners' `/mcp` share, made by the first router built.
    pub mcp: std::sync::OnceLock<mcp::McpState>,
    /// The chat's LLM settings and the conversations going on.
    pub chat: Arc<crate::chat::Engine>,
}

pub type Shared = Arc<AppState>;

pub use crate::service::Caller;

/// MCP over streamable HTTP: the tools call the service in-process, as the caller
/// the [`auth`] layer found for each request. Both listeners serve one set of
/// protocol sessions ([`mcp::McpState`], made by the first router), held within
/// `state.mcp_sessions` and bound to the token that made them ([`mcp::protocol`]);
/// each listener's service checks its own host names.
fn mcp_service(state: &Shared, surface: &surface::Surface) -> axum::routing::MethodRouter<Shared> {
    use rmcp::transport::streamable_http_server::StreamableHttpService;
    let shared = mcp_state(state);
    let mut config = rmcp::transport::StreamableHttpServerConfig::default();
    config.cancellation_token = state.shutdown.child_token();
    // The surface guard checked Host and Origin already; rmcp checks the names
    // again (none on the Unix socket, which no browser reaches).
    config = config.with_allowed_hosts(surface.host_names());
    let tools = shared.tools.clone();
    let service =
        StreamableHttpService::new(move || Ok(mcp::SandboxMcp::new(tools.clone())), shared.manager.clone(), config);
    axum::routing::any_service(service)
        .layer(axum::middleware::from_fn_with_state(shared.sessions.clone(), mcp::protocol::guard))
}

/// What both listeners' `/mcp` and `/v1/tools` share (the tool registry among it),
/// made by the first router built.
fn mcp_state(state: &Shared) -> &mcp::McpState {
    state.mcp.get_or_init(|| mcp::McpState::new(&state.service, state.mcp_sessions, &state.shutdown))
}

/// The router for one listener (the surface says which, and what it accepts).
/// MCP (`/mcp`) is served on both; stdio clients use `sandboxctl mcp`, which
/// bridges them to it.
pub fn router(state: Shared, surface: surface::Surface) -> Router {
    let listener = surface.listener();
    let api = Router::new()
        .route("/mcp", mcp_service(&state, &surface))
        .route("/v1/runs", post(runs::create_run))
        .route("/v1/sessions", post(sessions::create).get(sessions::list))
        .route("/v1/sessions/{id}", get(sessions::show).delete(sessions::close))
        .route("/v1/sessions/{id}/runs", post(runs::session_run).get(runs::list_runs))
        .route("/v1/sessions/{id}/runs/{run_id}", get(runs::get_run))
        .route("/v1/sessions/{id}/run", axum::routing::delete(sessions::cancel_run))
        .route("/v1/sessions/{id}/packages", post(packages::install))
        .route("/v1/sessions/{id}/secrets", get(secrets::list))
        .route("/v1/sessions/{id}/secrets/{name}", axum::routing::put(secrets::set).delete(secrets::remove))
        .route("/v1/policies", get(sessions::policies))
        .route("/v1/tools", get(tools::list))
        .route("/v1/tools/{name}", post(tools::call))
        .route("/v1/chat", post(chat::chat))
        .route("/v1/sessions/{id}/chat", axum::routing::delete(chat::stop))
        .route("/v1/sessions/{id}/chats", get(chat::list))
        .route("/v1/sessions/{id}/chats/{chat_id}", get(chat::show))
        .route("/metrics", get(metrics))
        .route("/v1/check", get(check_host))
        .route("/v1/sessions/{id}/files", get(files::list))
        .route("/v1/sessions/{id}/files/{*path}", get(files::download).put(files::upload).delete(files::remove))
        .layer(axum::middleware::from_fn_with_state((state.clone(), listener), auth));
    // The console is for a browser, which reaches the HTTP listener only. Its page
    // and assets need no token: the page asks the person for one.
    let console = match listener {
        Listener::Http => console::routes(),
        Listener::Unix => Router::new(),
    };
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/openapi.json", get(openapi::document))
        .merge(console)
        .merge(api)
        .route_layer(axum::middleware::from_fn(surface::json_type))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(Arc::new(surface), surface::guard))
        .with_state(state)
}

/// The router of the `metrics_listen` address: `GET /metrics` alone, without a
/// token (the surface guard still checks `Host`): the operator chose to expose it.
pub fn metrics_router(state: Shared, surface: surface::Surface) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .layer(axum::Extension(Who::Tokenless))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(Arc::new(surface), surface::guard))
        .with_state(state)
}

/// `GET /metrics`: the daemon's counters in the Prometheus text format.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "daemon", responses((status = 200, content_type = "text/plain", body = String, description = "The Prometheus text format (0.0.4): `sandboxd_runs_total{status,language,mode}`, the `sandboxd_run_queue_wait_seconds`, `sandboxd_run_setup_seconds` and `sandboxd_run_execution_seconds` histograms by mode, `sandboxd_run_workspace_walk_seconds{mode,when}` (the workspace walked before and after a run), `sandboxd_run_handling_seconds` (a run's whole time in the daemon), `sandboxd_pool_idle_templates{policy}`, `sandboxd_pool_hits_total`, `sandboxd_pool_misses_total`, `sandboxd_sessions{mode}`, `sandboxd_oom_kills_total`, `sandboxd_timeouts_total` and `sandboxd_api_errors_total{code}`: figures of every tenant. With tokens configured, only an operator token (`operator_tokens`) reads them (another token: 403 `forbidden`), or the Unix socket without a token, or the `metrics_listen` address, which serves this route alone without a token")))]
pub async fn metrics(State(state): State<Shared>, axum::Extension(who): axum::Extension<Who>) -> Response {
    if !who.is_operator() {
        return ApiError::new(
            Code::Forbidden,
            "GET /metrics shows every tenant's figures: it needs an operator token (the daemon's `operator_tokens`), or the Unix socket, or the `metrics_listen` address",
        )
        .into_response();
    }
    let text = crate::metrics::global().render(&state.service.metrics_live());
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}

/// Who the caller is ([`Tokens::who`]): a request without a known token where
/// one is needed is refused 401 (its body taken in first, so a kept-alive
/// connection stays usable); else the connection is claimed for the caller
/// ([`crate::serve::Connection::claim`]: 429 `max_connections`, and the
/// connection closed, past the token's share), and the handler sees the
/// [`Caller`] and [`Who`].
async fn auth(State((state, listener)): State<(Shared, Listener)>, mut req: Request, next: Next) -> Response {
    let who = match state.tokens.who(listener, req.headers()) {
        Ok(who) => who,
        Err(tokens::Unknown) => {
            let e = ApiError::new(
                Code::Unauthorized,
                "missing or unknown bearer token: send `Authorization: Bearer <token>` with a token from the daemon's `tokens` (or `operator_tokens`) setting",
            );
            return surface::refuse(req, e.into_response()).await;
        }
    };
    if let Some(conn) = req.extensions().get::<crate::serve::Connection>() {
        if let Err(full) = conn.claim(who.owner()) {
            let e = ApiError::new(
                Code::MaxConnections,
                format!(
                    "this token already has its maximum of {} connections open (token_max_connections): reuse them (keep-alive), or close some, then retry",
                    full.per_token
                ),
            );
            let mut answer = e.into_response();
            answer.headers_mut().insert(header::CONNECTION, axum::http::HeaderValue::from_static("close"));
            return surface::refuse(req, answer).await;
        }
    }
    req.extensions_mut().insert(Caller { owner: who.owner().map(str::to_string) });
    req.extensions_mut().insert(who);
    next.run(req).await
}

async fn method_not_allowed(req: Request) -> Response {
    let e = ApiError::new(
        Code::MethodNotAllowed,
        format!(
            "{} is not a method of {}: see GET /v1/openapi.json for the methods each route takes",
            req.method(),
            req.uri().path()
        ),
    );
    surface::refuse(req, e.into_response()).await
}

async fn not_found(req: Request) -> Response {
    let e = ApiError::new(
        Code::NotFound,
        format!("no route {} {}: see GET /v1/openapi.json for the API", req.method(), req.uri().path()),
    );
    surface::refuse(req, e.into_response()).await
}

/// `GET /v1/check`: the host check, as the daemon sees the host now.
#[utoipa::path(get, path = "/v1/check", operation_id = "check_host", tag = "daemon", responses((status = 200, body = Report, description = "every host requirement: status ok, warn or fail, what was found, and what to do")))]
pub async fn check_host(State(state): State<Shared>) -> Json<Report> {
    Json(state.service.check_host().await)
}

#[utoipa::path(get, path = "/v1/health", operation_id = "health", tag = "daemon", responses((status = 200, body = Health, description = "`status` is `ok`, or `degraded` with `problems` naming each thing that is wrong now (the rootfs not mounted, the run cgroup directories gone, a policy's pooled sandboxes failing to start, a host check item failing) and what to do. With tokens configured, a request over HTTP without a known token gets `status` and `version` only; any token (or the Unix socket) gets the whole report")))]
pub async fn health(
    State(state): State<Shared>,
    axum::Extension(listener): axum::Extension<Listener>,
    headers: axum::http::HeaderMap,
) -> Json<Health> {
    let now = state.service.condition().await;
    // Stopping: the listeners answer only this route until the runs end.
    let status = if state.shutdown.is_cancelled() { "draining" } else { crate::health::status(&now.problems) };
    let mut health = Health::short(status, state.version);
    if state.tokens.who(listener, &headers).is_ok() {
        health.problems = Some(now.problems);
        health.rootfs_sha256 = Some(state.rootfs_sha256.clone());
        health.cgroup = Some(now.cgroup);
        health.landlock_abi = Some(state.landlock_abi);
        health.sessions = Some(now.sessions);
        health.busy_sessions = Some(now.busy_sessions);
        health.pool = Some(now.pool);
        health.storage = Some(now.storage);
    }
    Json(health)
}

/// Read a JSON body of at most `limit` bytes into `T`, with errors that say what
/// is wrong. `too_large` is the code for an oversized body.
pub async fn read_json<T: serde::de::DeserializeOwned>(
    body: axum::body::Body,
    limit: usize,
    too_large: Code,
) -> Result<T, ApiError> {
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|e| {
        body_read_error(e, || {
            ApiError::new(
                too_large,
                format!("request body is larger than {limit} bytes: send less code, or upload data as a file"),
            )
        })
    })?;
    if bytes.is_empty() {
        return Err(ApiError::new(Code::InvalidRequest, "request body is empty: send a JSON object"));
    }
    // serde would read a struct from a JSON array too (its fields in order).
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::new(
            Code::InvalidRequest,
            "the request body is not a JSON object: send {\"field\": value, ...} with the fields GET /v1/openapi.json documents",
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| ApiError::new(Code::InvalidRequest, format!("invalid JSON body: {e}")))
}

/// The error for a request body that could not be read: `request_timeout` when it
/// stalled or came too slowly ([`surface::BodyTimeout`]), `too_large()` when it
/// passed a length limit, else `invalid_request`. Upload handlers can map their
/// body stream's errors with it too.
pub fn body_read_error(err: axum::Error, too_large: impl FnOnce() -> ApiError) -> ApiError {
    let inner = err.into_inner();
    if surface::is_body_timeout(&*inner) {
        return ApiError::new(Code::RequestTimeout, inner.to_string());
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&*inner);
    while let Some(e) = cur {
        if e.is::<http_body_util::LengthLimitError>() {
            return too_large();
        }
        cur = e.source();
    }
    ApiError::new(Code::InvalidRequest, format!("reading the request body failed: {inner}; send it again"))
}
