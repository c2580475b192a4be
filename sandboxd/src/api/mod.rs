//! The v1 API: one router, served on the Unix socket and on loopback HTTP.
//!
//! A request's path: [`surface::guard`] refuses foreign hosts and origins and
//! non-JSON bodies and times the body, [`auth`] decides who the caller is, a handler in [`runs`],
//! [`sessions`] or [`files`] reads the input and calls [`crate::service`], which
//! runs the code through [`crate::run`] and [`crate::isolate`]. The MCP tools
//! ([`mcp`], at `/mcp`) call the same service. Every error is an
//! [`error::ApiError`]; the service's errors are mapped to them in `error.rs`.

pub mod error;
pub mod files;
pub mod mcp;
pub mod openapi;
pub mod runs;
pub mod sessions;
pub mod surface;
#[cfg(test)]
mod tests;

use crate::service::Operations;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use error::{ApiError, Code};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::sync::Arc;

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
    /// sha256 of each configured token, hex.
    pub token_hashes: Vec<String>,
    pub version: &'static str,
    pub rootfs_sha256: String,
    pub landlock_abi: i32,
    /// Cancelled at shutdown: ends MCP event streams, which would hold it up.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// How many MCP protocol sessions `/mcp` holds, and for how long.
    pub mcp_sessions: mcp::SessionLimits,
}

pub type Shared = Arc<AppState>;

pub use crate::service::Caller;

pub fn token_hash(token: &str) -> String {
    crate::rootfs::hex(&Sha256::digest(token.as_bytes()))[..32].to_string()
}

/// MCP over streamable HTTP: the tools call the service in-process, as the caller
/// the [`auth`] layer found for each request. Protocol sessions are held within
/// `state.mcp_sessions` and bound to the token that made them ([`mcp::protocol`]).
fn mcp_service(state: &Shared, surface: &surface::Surface) -> axum::routing::MethodRouter<Shared> {
    use rmcp::transport::streamable_http_server::StreamableHttpService;
    let backend = mcp::Backend::Local(state.service.clone());
    let limits = state.service.policy(None).map(|p| crate::service::PolicyLimits::from(&*p)).ok();
    let mut config = rmcp::transport::StreamableHttpServerConfig::default();
    config.cancellation_token = state.shutdown.child_token();
    // The surface guard checked Host and Origin already; rmcp checks the names again.
    config = config.with_allowed_hosts(surface.host_names());
    let sessions = mcp::protocol::Registry::new(state.mcp_sessions);
    let manager = mcp::protocol::Bound::new(sessions.clone());
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(mcp::protocol::reap(sessions.clone(), manager.sessions(), state.shutdown.child_token()));
    }
    let service = StreamableHttpService::new(
        move || Ok(mcp::SandboxMcp::new(backend.clone(), limits.as_ref())),
        manager.into(),
        config,
    );
    axum::routing::any_service(service).layer(axum::middleware::from_fn_with_state(sessions, mcp::protocol::guard))
}

/// The router for one listener (the surface says which, and what it accepts).
/// MCP (`/mcp`) is served on HTTP only; stdio clients use `sandboxctl mcp`, which
/// talks to the socket.
pub fn router(state: Shared, surface: surface::Surface) -> Router {
    let listener = surface.listener();
    let mut api = Router::new();
    if listener == Listener::Http {
        api = api.route("/mcp", mcp_service(&state, &surface));
    }
    let api = api
        .route("/v1/runs", post(runs::create_run))
        .route("/v1/sessions", post(sessions::create).get(sessions::list))
        .route("/v1/sessions/{id}", get(sessions::show).delete(sessions::close))
        .route("/v1/sessions/{id}/runs", post(runs::session_run).get(runs::list_runs))
        .route("/v1/sessions/{id}/runs/{run_id}", get(runs::get_run))
        .route("/v1/sessions/{id}/run", axum::routing::delete(sessions::cancel_run))
        .route("/v1/policies", get(sessions::policies))
        .route("/metrics", get(metrics))
        .route("/v1/check", get(crate::check::route))
        .route("/v1/sessions/{id}/files", get(files::list))
        .route("/v1/sessions/{id}/files/{*path}", get(files::download).put(files::upload).delete(files::remove))
        .layer(axum::middleware::from_fn_with_state((state.clone(), listener), auth));
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/openapi.json", get(openapi::document))
        .merge(api)
        .route_layer(axum::middleware::from_fn(surface::json_type))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(Arc::new(surface), surface::guard))
        .with_state(state)
}

/// The router of the `metrics_listen` address: `GET /metrics` alone, without a
/// token (the surface guard still checks `Host`).
pub fn metrics_router(state: Shared, surface: surface::Surface) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(Arc::new(surface), surface::guard))
        .with_state(state)
}

/// `GET /metrics`: the daemon's counters in the Prometheus text format.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "daemon", responses((status = 200, content_type = "text/plain", body = String, description = "The Prometheus text format (0.0.4): `sandboxd_runs_total{status,language,mode}`, the `sandboxd_run_queue_wait_seconds`, `sandboxd_run_setup_seconds` and `sandboxd_run_execution_seconds` histograms by mode, `sandboxd_pool_idle_templates{policy}`, `sandboxd_pool_hits_total`, `sandboxd_pool_misses_total`, `sandboxd_sessions{mode}`, `sandboxd_oom_kills_total`, `sandboxd_timeouts_total` and `sandboxd_api_errors_total{code}`. With `tokens`, HTTP needs one (or use the `metrics_listen` address, which serves this route alone without a token)")))]
pub async fn metrics(State(state): State<Shared>) -> Response {
    let text = crate::metrics::global().render(&state.service.metrics_live());
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}

async fn auth(State((state, listener)): State<(Shared, Listener)>, mut req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| token_hash(t.trim()));
    let owner = if state.token_hashes.is_empty() {
        None
    } else {
        match (presented, listener) {
            (Some(h), _) if state.token_hashes.contains(&h) => Some(h),
            (None, Listener::Unix) => None,
            _ => {
                return ApiError::new(Code::Unauthorized, "missing or unknown bearer token: send `Authorization: Bearer <token>` with a token from the daemon's `tokens` setting").into_response();
            }
        }
    };
    req.extensions_mut().insert(Caller { owner });
    next.run(req).await
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        Code::MethodNotAllowed,
        format!(
            "{} is not a method of {}: see GET /v1/openapi.json for the methods each route takes",
            req.method(),
            req.uri().path()
        ),
    )
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        Code::NotFound,
        format!("no route {} {}: see GET /v1/openapi.json for the API", req.method(), req.uri().path()),
    )
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok`, or `degraded` when `problems` lists something; `draining` while the
    /// daemon stops (every other route answers 503 `unavailable` then).
    #[schema(example = "ok")]
    pub status: &'static str,
    /// What is degraded now and what to do (empty when `ok`); see [`crate::health`].
    pub problems: Vec<crate::health::Problem>,
    pub version: &'static str,
    pub rootfs_sha256: String,
    pub cgroup: String,
    pub landlock_abi: i32,
    pub sessions: usize,
    pub busy_sessions: usize,
    /// Template interpreters for one-shot Python runs.
    pub pool: crate::pool::Stats,
}

#[utoipa::path(get, path = "/v1/health", operation_id = "health", tag = "daemon", responses((status = 200, body = Health, description = "`status` is `ok`, or `degraded` with `problems` naming each thing that is wrong now (the rootfs not mounted, the run cgroup directories gone, a policy's pooled sandboxes failing to start, a host check item failing) and what to do")))]
pub async fn health(State(state): State<Shared>) -> Json<Health> {
    let now = state.service.condition().await;
    Json(Health {
        // Stopping: the listeners answer only this route until the runs end.
        status: if state.shutdown.is_cancelled() { "draining" } else { crate::health::status(&now.problems) },
        problems: now.problems,
        version: state.version,
        rootfs_sha256: state.rootfs_sha256.clone(),
        cgroup: now.cgroup,
        landlock_abi: state.landlock_abi,
        sessions: now.sessions,
        busy_sessions: now.busy_sessions,
        pool: now.pool,
    })
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
