//! `POST /v1/runs` and `POST /v1/sessions/{id}/runs`, as JSON or as server-sent
//! events (`Accept: text/event-stream`).

use super::error::{ApiError, Code};
use super::{read_json, Caller, Shared};
use crate::isolate::output::{Chunk, StreamKind};
use crate::run::{self, RunRequest, RunResult};
use crate::session::{Lease, Mode};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use tokio::sync::{mpsc, oneshot};

/// Bodies bigger than the largest code any policy allows, plus JSON overhead.
fn body_limit(state: &Shared) -> usize {
    state.sessions.policies().map(|p| p.code_bytes()).max().unwrap_or(100 * 1024) * 6 + 64 * 1024
}

#[utoipa::path(post, path = "/v1/runs", request_body = RunRequest,
    responses((status = 200, body = RunResult), (status = "4XX", body = super::error::ErrorBody)))]
pub async fn create_run(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let req: RunRequest = read_json(body, body_limit(&state), Code::CodeTooLarge).await?;
    let lease = match &req.session_id {
        Some(id) => {
            let lease = state.sessions.lease(id, caller.owner.as_deref())?;
            check_policy(&req, &lease)?;
            lease
        }
        None => {
            run::validate(&req, &*state.sessions.policy(req.policy.as_deref())?)?;
            // Refuse before a session is made for a run the token may not start.
            state.sessions.check_run_quota(caller.owner.as_deref())?;
            let info =
                state.sessions.create(None, req.policy.as_deref(), Mode::Script, None, caller.owner.as_deref()).await?;
            match state.sessions.lease(&info.id, caller.owner.as_deref()) {
                Ok(lease) => lease,
                Err(e) => {
                    // Another run of the token's took the last place meanwhile.
                    let _ = state.sessions.close(&info.id, caller.owner.as_deref()).await;
                    return Err(e);
                }
            }
        }
    };
    start(state, lease, req, &headers).await
}

#[utoipa::path(post, path = "/v1/sessions/{id}/runs", request_body = RunRequest, params(("id" = String, Path)),
    responses((status = 200, body = RunResult), (status = "4XX", body = super::error::ErrorBody)))]
pub async fn session_run(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let req: RunRequest = read_json(body, body_limit(&state), Code::CodeTooLarge).await?;
    if req.session_id.as_deref().is_some_and(|s| s != id) {
        return Err(ApiError::new(
            Code::InvalidRequest,
            "session_id in the body differs from the one in the path: drop it from the body",
        ));
    }
    let lease = state.sessions.lease(&id, caller.owner.as_deref())?;
    check_policy(&req, &lease)?;
    start(state, lease, req, &headers).await
}

fn check_policy(req: &RunRequest, lease: &Lease) -> Result<(), ApiError> {
    match &req.policy {
        Some(p) if *p != lease.policy.name => Err(ApiError::new(
            Code::InvalidRequest,
            format!(
                "session {:?} uses policy {:?}; a session's policy is fixed: create a new session for policy {p:?}",
                lease.id, lease.policy.name
            ),
        )),
        _ => run::validate(req, &lease.policy).map(|_| ()),
    }
}

fn wants_stream(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("text/event-stream"))
}

/// Run in a task of its own, so a client that goes away cannot abort a run halfway
/// (its cgroup and files are always cleaned up), and answer as JSON or as events.
async fn start(state: Shared, lease: Lease, req: RunRequest, headers: &HeaderMap) -> Result<Response, ApiError> {
    if state.draining.load(Ordering::SeqCst) {
        return Err(ApiError::new(Code::Unavailable, "the daemon is shutting down: retry in a moment"));
    }
    let stream = wants_stream(headers);
    let (chunk_tx, chunk_rx) = if stream {
        let (tx, rx) = mpsc::channel::<Chunk>(256);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let (done_tx, done_rx) = oneshot::channel();
    tokio::spawn(async move {
        let result = run::execute(&state.ctx, &lease, &req, chunk_tx).await;
        drop(lease);
        let _ = done_tx.send(result);
    });
    match chunk_rx {
        None => match done_rx.await {
            Ok(result) => Ok(Json(result?).into_response()),
            Err(e) => Err(ApiError::internal("waiting for the run", e)),
        },
        Some(rx) => Ok(event_stream(rx, done_rx).into_response()),
    }
}

enum StreamState {
    Output(mpsc::Receiver<Chunk>, oneshot::Receiver<Result<RunResult, ApiError>>),
    Finished,
}

fn event_stream(
    rx: mpsc::Receiver<Chunk>,
    done: oneshot::Receiver<Result<RunResult, ApiError>>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let stream = futures_util::stream::unfold(StreamState::Output(rx, done), |state| async move {
        match state {
            StreamState::Output(mut rx, done) => match rx.recv().await {
                Some(chunk) => {
                    let name = match chunk.stream {
                        StreamKind::Stdout => "stdout",
                        StreamKind::Stderr => "stderr",
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
    done: oneshot::Receiver<Result<RunResult, ApiError>>,
) -> Option<(Result<Event, Infallible>, StreamState)> {
    let event = match done.await {
        Ok(Ok(result)) => Event::default().event("result").data(serde_json::to_string(&result).unwrap_or_default()),
        Ok(Err(e)) => Event::default().event("error").data(e.body().to_string()),
        Err(_) => Event::default()
            .event("error")
            .data(ApiError::new(Code::Internal, "the run ended without a result").body().to_string()),
    };
    Some((Ok(event), StreamState::Finished))
}
