//! The chat's routes: `POST /v1/chat` (a message of the person, and the model's
//! turn after it as server-sent events), `DELETE /v1/sessions/{id}/chat` (stop
//! it), and the session's kept conversations. What is checked before the stream
//! starts is an HTTP error; what goes wrong after (the model's endpoint down, a
//! stop) is an event of the stream and a notice of the conversation. The turn
//! itself is [`crate::chat::Turn`]'s.

use super::error::{ApiError, Path};
use super::{read_json, Caller, Shared};
use crate::chat::{self, Event, Turn};
use crate::conversations as store;
use crate::model::chat::{Chat, ChatList, ChatMessage, ChatRequest};
use crate::model::error::Code;
use crate::model::session::StatusAnswer;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use std::convert::Infallible;
use tokio::sync::mpsc;

#[utoipa::path(post, path = "/v1/chat", operation_id = "chat", tag = "chat", request_body = ChatRequest,
    description = "Say `message` to the daemon's LLM (its `llm_url`, an OpenAI-compatible API), in a conversation bound to session `session_id`: the daemon runs the model's tool loop itself, with the session's tools (the ones MCP and `/v1/tools` offer, without `session_id`: a call naming another session is refused), until the model answers without a tool call, `max_turns` answers were made, or the turn is stopped (`DELETE /v1/sessions/{id}/chat`, or this request's client goes away). The answer is server-sent events, each step as it happens: `chat` (`chat_id`, `session_id`, `model`), `text` (`{\"text\"}`: the model's words as they come), `assistant` (its whole answer, with `tool_calls`), `tool_call` (`id`, `name`, `arguments`, about to run), `tool_result` (`tool_call_id`, `name`, `content`, `is_error`, `figures`: workspace paths), `notice` (for the person: the turn limit, a stop, the endpoint's failure), `error` (the error envelope: `unavailable` when the model's endpoint failed) and last `done` (`reason`: `answered`, `turn_limit`, `stopped` or `error`; `turns`). The conversation is kept with the session after each step.",
    responses((status = 200, content_type = "text/event-stream", body = Object, description = "the turn's events: each an `event` name and its `data`, a JSON object")))]
pub async fn chat(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let req: ChatRequest = read_json(body, chat::MAX_MESSAGE * 6 + 4096, Code::CodeTooLarge).await?;
    let engine = state.chat.clone();
    let settings = engine.settings();
    let Some(endpoint) = settings.endpoint.clone() else {
        return Err(ApiError::new(
            Code::Forbidden,
            "the chat is off on this daemon (llm_url = \"off\"): its operator turns it on by setting llm_url",
        ));
    };
    if req.message.trim().is_empty() {
        return Err(ApiError::new(Code::InvalidRequest, "message is empty: say what the model should do"));
    }
    if req.message.len() > chat::MAX_MESSAGE {
        return Err(ApiError::new(
            Code::CodeTooLarge,
            format!(
                "message is more than {} KiB: upload long text as a file of the session and ask about it",
                chat::MAX_MESSAGE / 1024
            ),
        ));
    }
    let max_turns = match req.max_turns {
        None => settings.max_turns,
        Some(0) => return Err(ApiError::new(Code::InvalidRequest, "max_turns is 0: give 1 or more, or omit it")),
        Some(n) => n.min(settings.max_turns),
    };
    if let Some(id) = req.chat_id.as_deref().filter(|id| !store::valid_chat_id(id)) {
        return Err(ApiError::new(
            Code::InvalidRequest,
            format!("chat_id {id:?} is not a conversation id (32 lowercase hex digits): pass the chat_id of a `chat` event, or omit it to start one"),
        ));
    }
    let session = state.service.get_session(&caller, &req.session_id)?;
    let key = crate::session::key(&session.id, caller.owner.as_deref())
        .map_err(|e| ApiError::from(crate::service::Error::from(e)))?;
    let Some(active) = engine.claim(&key, &session.created_at) else {
        return Err(ApiError::new(
            Code::SessionBusy,
            format!("a conversation is going on in session {0}: wait for its `done` event, or stop it with DELETE /v1/sessions/{0}/chat", session.id),
        ));
    };
    let mut chat = match req.chat_id.as_deref() {
        Some(id) => state.service.get_chat(&caller, &session.id, id).await?,
        None => {
            let at = chat::now();
            Chat {
                chat_id: uuid::Uuid::new_v4().simple().to_string(),
                session_id: session.id.clone(),
                title: store::title_of(&req.message),
                created_at: at.clone(),
                updated_at: at,
                model: None,
                messages: vec![],
            }
        }
    };
    chat.model = req.model.filter(|m| !m.is_empty()).or_else(|| settings.model.clone()).or(chat.model);
    chat.messages.push(ChatMessage::User { content: req.message, at: chat::now() });
    chat.updated_at = chat::now();
    // Kept before the model is asked: a full conversation is refused here.
    state.service.save_chat(&caller, &session.id, &chat).await?;
    let stop_on_drop = active.stop.clone().drop_guard();
    let turn = Turn {
        engine: engine.clone(),
        tools: super::mcp_state(&state).tools.clone(),
        ops: state.service.clone(),
        caller,
        chat,
        session,
        endpoint,
        max_turns,
        active,
    };
    let (tx, rx) = mpsc::channel::<Event>(64);
    tokio::spawn(turn.run(tx));
    // The stream holds the stop's guard: a client that goes away stops the turn.
    let stream = futures_util::stream::unfold((rx, stop_on_drop), |(mut rx, guard)| async move {
        let event = rx.recv().await?;
        let sse = SseEvent::default().event(event.name()).data(event.data().to_string());
        Some((Ok::<_, Infallible>(sse), (rx, guard)))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

#[utoipa::path(delete, path = "/v1/sessions/{id}/chat", operation_id = "stop_chat", tag = "chat",
    params(("id" = String, Path, description = "the session's id")),
    description = "Stop the conversation going on in the session: its model answer is dropped and its tool call's run stopped; what happened so far is kept, with a notice. Its stream ends with `done` (`reason: stopped`).",
    responses((status = 200, body = StatusAnswer, description = "`{\"status\":\"stopped\"}`, or `{\"status\":\"idle\"}` when no conversation was going on")))]
pub async fn stop(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<StatusAnswer>, ApiError> {
    // A conversation outlives nothing: one whose session was closed meanwhile is
    // stopped by its key too (the key is the caller's own: another token's never).
    let key = crate::session::key(&id, caller.owner.as_deref())
        .map_err(|e| ApiError::from(crate::service::Error::from(e)))?;
    if state.chat.stop(&key) {
        return Ok(Json(StatusAnswer { status: "stopped".into(), path: None }));
    }
    state.service.get_session(&caller, &id)?;
    Ok(Json(StatusAnswer { status: "idle".into(), path: None }))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/chats", operation_id = "list_chats", tag = "chat",
    params(("id" = String, Path, description = "the session's id")),
    description = "The session's conversations, used most recently first. A session keeps its newest 50 conversations (at most 4 MiB of them, each at most 1 MiB), and they go with it.",
    responses((status = 200, body = ChatList, description = "the conversations")))]
pub async fn list(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<ChatList>, ApiError> {
    Ok(Json(state.service.list_chats(&caller, &id).await?))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/chats/{chat_id}", operation_id = "get_chat", tag = "chat",
    params(("id" = String, Path, description = "the session's id"),
        ("chat_id" = String, Path, description = "the conversation's id (`chat_id` of its `chat` event)", pattern = "^[0-9a-f]{32}$")),
    description = "One conversation: every message, oldest first (`user`, `assistant` with its `tool_calls`, `tool` results with their figures' workspace paths, and `notice`s for the person).",
    responses((status = 200, body = Chat, description = "the conversation")))]
pub async fn show(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((id, chat_id)): Path<(String, String)>,
) -> Result<Json<Chat>, ApiError> {
    Ok(Json(state.service.get_chat(&caller, &id, &chat_id).await?))
}
