//! `POST /v1/runs` and `POST /v1/sessions/{id}/runs`, as JSON or as server-sent
//! events (`Accept: text/event-stream`).

use super::error::ApiError;
use super::error::{Path, Query};
use super::{read_json, Caller, Shared};
use crate::isolate::output::{Chunk, Stream};
use crate::model::error::Code;
use crate::model::records::{RunPage, RunRecord};
use crate::model::run::{RunRequest, RunResult};
use crate::service;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use std::convert::Infallible;
use tokio::sync::{mpsc, oneshot};

/// Bodies bigger than the largest code any policy allows, plus JSON overhead.
fn body_limit(state: &Shared) -> usize {
    state.service.max_code_bytes().unwrap_or(100 * 1024) * 6 + 64 * 1024
}

#[utoipa::path(post, path = "/v1/runs", operation_id = "run", tag = "runs", request_body = RunRequest,
    description = "Run code in a new session (or in `session_id`). A program that failed is a result (200), not an error.",
    responses((status = 200, description = "the run's result; with `Accept: text/event-stream`, server-sent events `stdout` and `stderr` (`{\"text\": ...}`), then `result` (a RunResult) or `error` (the error envelope)",
        content((RunResult = "application/json"), (String = "text/event-stream")))))]
pub async fn create_run(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let req: RunRequest = read_json(body, body_limit(&state), Code::CodeTooLarge).await?;
    start(&state, &caller, req, &headers).await
}

#[utoipa::path(post, path = "/v1/sessions/{id}/runs", operation_id = "run_in_session", tag = "runs", request_body = RunRequest,
    params(("id" = String, Path, description = "the session's id")),
    description = "Run code in session `id` (a `session_id` in the body must be the same).",
    responses((status = 200, description = "the run's result; with `Accept: text/event-stream`, server-sent events `stdout` and `stderr` (`{\"text\": ...}`), then `result` (a RunResult) or `error` (the error envelope)",
        content((RunResult = "application/json"), (String = "text/event-stream")))))]
pub async fn session_run(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let mut req: RunRequest = read_json(body, body_limit(&state), Code::CodeTooLarge).await?;
    if req.session_id.as_deref().is_some_and(|s| s != id) {
        return Err(ApiError::new(
            Code::InvalidRequest,
            "session_id in the body differs from the one in the path: drop it from the body",
        ));
    }
    req.session_id = Some(id);
    start(&state, &caller, req, &headers).await
}

/// The query of `GET /v1/sessions/{id}/runs`.
#[derive(Debug, Default, serde::Deserialize)]
pub struct RunsQuery {
    pub limit: Option<String>,
    pub before: Option<String>,
}

#[utoipa::path(get, path = "/v1/sessions/{id}/runs", operation_id = "list_runs", tag = "runs",
    params(("id" = String, Path, description = "the session's id"),
        ("limit" = Option<u32>, Query, description = "runs in the page: 1 to 100 (default 20)", minimum = 1, maximum = 100),
        ("before" = Option<String>, Query, description = "the page's runs are older than this run: the `next` of the page before", pattern = "^[0-9a-f]{32}$")),
    description = "The session's runs, newest first, one page at a time: each from the moment it was accepted (`running`) to how it ended. A run cut off by the daemon's end reads `interrupted`. A session keeps its newest 100 runs (at most 8 MiB of them), and its records go with it.",
    responses((status = 200, body = RunPage, description = "a page of runs, newest first")))]
pub async fn list_runs(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(q): Query<RunsQuery>,
) -> Result<Json<RunPage>, ApiError> {
    use crate::records::{valid_run_id, DEFAULT_PAGE, MAX_PAGE};
    let limit = match q.limit.as_deref() {
        None => DEFAULT_PAGE,
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
            _ => {
                return Err(ApiError::new(
                    Code::InvalidRequest,
                    format!("limit={l:?}: use a whole number from 1 to {MAX_PAGE}"),
                ))
            }
        },
    };
    if let Some(b) = q.before.as_deref().filter(|b| !valid_run_id(b)) {
        return Err(ApiError::new(
            Code::InvalidRequest,
            format!("before={b:?} is not a run id (32 lowercase hex digits): pass the `next` of the page before"),
        ));
    }
    Ok(Json(state.service.list_runs(&caller, &id, q.before.as_deref(), limit).await?))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/runs/{run_id}", operation_id = "get_run", tag = "runs",
    params(("id" = String, Path, description = "the session's id"),
        ("run_id" = String, Path, description = "the run's id (`run_id` of its result)", pattern = "^[0-9a-f]{32}$")),
    description = "One run of the session: its code, language, timestamps, status and (once it ended) its result.",
    responses((status = 200, body = RunRecord, description = "the run's record")))]
pub async fn get_run(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, run_id)): Path<(String, String)>,
) -> Result<Json<RunRecord>, ApiError> {
    Ok(Json(state.service.get_run(&caller, &id, &run_id).await?))
}

fn wants_stream(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("text/event-stream"))
}

/// Start the run through the service (it runs in a task of its own, so a client
/// that goes away cannot abort it halfway) and answer as JSON or as events.
async fn start(state: &Shared, caller: &Caller, req: RunRequest, headers: &HeaderMap) -> Result<Response, ApiError> {
    let (chunk_tx, chunk_rx) = if wants_stream(headers) {
        let (tx, rx) = mpsc::channel::<Chunk>(256);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let done_rx = state.service.start_run(caller, req, chunk_tx).await?;
    match chunk_rx {
        None => match done_rx.await {
            Ok(result) => Ok(Json(result?).into_response()),
            Err(e) => Err(ApiError::internal("waiting for the run", e)),
        },
        Some(rx) => Ok(event_stream(rx, done_rx).into_response()),
    }
}

enum StreamState {
    Output(mpsc::Receiver<Chunk>, oneshot::Receiver<Result<RunResult, service::Error>>),
    Finished,
}

fn event_stream(
    rx: mpsc::Receiver<Chunk>,
    done: oneshot::Receiver<Result<RunResult, service::Error>>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let stream = futures_util::stream::unfold(StreamState::Output(rx, done), |state| async move {
        match state {
            StreamState::Output(mut rx, done) => match rx.recv().await {
                Some(chunk) => {
                    let name = match chunk.stream {
                        Stream::Stdout => "stdout",
                        Stream::Stderr => "stderr",
                    };
                    let data = serde_json::json!({"text": chunk.text}).to_string();
                    Some((Ok(Event::default().event(name).data(data)), StreamState::Output(rx, done)))
                }
                None => final_event(done).await,
            },
            StreamState::Finished => None,
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

async fn final_event(
    done: oneshot::Receiver<Result<RunResult, service::Error>>,
) -> Option<(Result<Event, Infallible>, StreamState)> {
    let event = match done.await {
        Ok(Ok(result)) => Event::default().event("result").data(serde_json::to_string(&result).unwrap_or_default()),
        Ok(Err(e)) => Event::default().event("error").data(ApiError::from(e).body().to_string()),
        Err(_) => Event::default()
            .event("error")
            .data(ApiError::new(Code::Internal, "the run ended without a result").body().to_string()),
    };
    Some((Ok(event), StreamState::Finished))
}
