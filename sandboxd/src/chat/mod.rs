//! The chat: a person talks to the operator's LLM, and the daemon runs the
//! model's tool loop itself, in one session. The API's `POST /v1/chat`
//! (`api/chat.rs`) checks the request and streams what [`Turn::run`] emits; the
//! console's chat page shows it.
//!
//! One message of the person is one [`Turn`]: the model is asked ([`llm`]) with
//! the conversation so far and the session's tools ([`bound`]: the registry's
//! own, the same MCP and `/v1/tools` offer, bound to the session); each tool call
//! it makes runs through the [`crate::tools::Registry`] as the caller, and its
//! result goes back to the model; until the model answers without a tool call,
//! or the turn limit is reached, or the person stops it (`DELETE
//! /v1/sessions/{id}/chat`, or the stream's client goes away). Every step is an
//! [`Event`] as it happens, and the conversation is kept after each step
//! ([`crate::conversations`]), so what happened survives a stop, a lost client and a restart.
//!
//! A session has one conversation going at a time ([`Engine::claim`]); the
//! model's failures (the endpoint down, slow, refusing tools, malformed
//! arguments) are messages in the conversation, never a hang.

pub mod bound;
pub mod llm;
mod wire;

use crate::model::chat::{Chat, ChatFigure, ChatMessage, ToolCall};
use crate::model::error::Code;
use crate::model::session::{Mode, SessionInfo};
use crate::service::{self, Caller, Operations};
use crate::tools::{Part, Registry, Watch};
use base64::Engine as _;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How the daemon reaches its LLM, from its config.
pub struct Settings {
    /// None: the chat is off (`llm_url = "off"`).
    pub endpoint: Option<llm::Endpoint>,
    /// The model asked when a request names none (None: the first the endpoint lists).
    pub model: Option<String>,
    /// The most model answers one message of the person may take.
    pub max_turns: u32,
    /// Show the model the figures its tool calls made (for models that take images).
    pub images: bool,
}

/// Longest the endpoint's model list is waited for, when no model is configured.
const MODELS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Most bytes of one message of the person.
pub const MAX_MESSAGE: usize = 64 * 1024;

/// What a conversation streams, step by step (the event's name, and its JSON).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// First: which conversation this is, and the model asked.
    Chat { chat_id: String, session_id: String, model: Option<String> },
    /// A piece of the model's text, as it comes.
    Text(String),
    /// A call the model made, about to run.
    ToolCall(ToolCall),
    /// A message as kept: the model's whole answer (`assistant`), a tool's result
    /// (`tool_result`), or a notice for the person (`notice`).
    Message(ChatMessage),
    /// What stopped the turn early, in the API's error envelope.
    Error { code: Code, message: String },
    /// Last: why the turn ended (`answered`, `turn_limit`, `stopped`, `error`)
    /// and how many model answers it took.
    Done { reason: &'static str, turns: u32 },
}

impl Event {
    pub fn name(&self) -> &'static str {
        match self {
            Event::Chat { .. } => "chat",
            Event::Text(_) => "text",
            Event::ToolCall(_) => "tool_call",
            Event::Message(ChatMessage::Tool { .. }) => "tool_result",
            Event::Message(ChatMessage::Notice { .. }) => "notice",
            Event::Message(ChatMessage::Assistant { .. }) => "assistant",
            Event::Message(ChatMessage::User { .. }) => "user",
            Event::Error { .. } => "error",
            Event::Done { .. } => "done",
        }
    }

    pub fn data(&self) -> Value {
        match self {
            Event::Chat { chat_id, session_id, model } => {
                json!({"chat_id": chat_id, "session_id": session_id, "model": model})
            }
            Event::Text(text) => json!({ "text": text }),
            Event::ToolCall(call) => serde_json::to_value(call).unwrap_or(Value::Null),
            Event::Message(m) => serde_json::to_value(m).unwrap_or(Value::Null),
            Event::Error { code, message } => json!({"error": {"code": code.as_str(), "message": message}}),
            Event::Done { reason, turns } => json!({"reason": reason, "turns": turns}),
        }
    }
}

/// The chat's settings and the conversations going on now.
pub struct Engine {
    settings: Settings,
    /// By session (its key, the same whoever names it, and its creation: a session
    /// made again under the same id is another): the stop of the conversation
    /// going on in it.
    active: Mutex<HashMap<(String, String), CancellationToken>>,
}

/// A session's one conversation going on: dropped when its turn ends.
pub struct Active {
    engine: Arc<Engine>,
    key: (String, String),
    pub stop: CancellationToken,
}

impl Drop for Active {
    fn drop(&mut self) {
        let mut active = self.engine.active.lock().unwrap_or_else(|p| p.into_inner());
        active.remove(&self.key);
    }
}

impl Engine {
    pub fn new(settings: Settings) -> Engine {
        Engine { settings, active: Mutex::new(HashMap::new()) }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The place for a conversation going on in the session whose key is
    /// `session_key`, made at `created_at`; None if one is going on.
    pub fn claim(self: &Arc<Self>, session_key: &str, created_at: &str) -> Option<Active> {
        let key = (session_key.to_string(), created_at.to_string());
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        if active.contains_key(&key) {
            return None;
        }
        let stop = CancellationToken::new();
        active.insert(key.clone(), stop.clone());
        Some(Active { engine: self.clone(), key, stop })
    }

    /// Stop the conversations going on in sessions of key `session_key` (one, and
    /// any left by an earlier session of that key); false if none is.
    pub fn stop(&self, session_key: &str) -> bool {
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        let mut stopped = false;
        for ((key, _), stop) in active.iter() {
            if key == session_key {
                stop.cancel();
                stopped = true;
            }
        }
        stopped
    }
}

/// Now, as the conversations write it.
pub fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// One message of the person, and the model's answers and tool calls after it.
pub struct Turn {
    pub engine: Arc<Engine>,
    pub tools: Arc<Registry>,
    pub ops: Arc<dyn Operations>,
    pub caller: Caller,
    /// The conversation, the person's message last.
    pub chat: Chat,
    pub session: SessionInfo,
    pub endpoint: llm::Endpoint,
    pub max_turns: u32,
    pub active: Active,
}

/// Why a turn ended early.
struct Ended {
    reason: &'static str,
    code: Code,
    message: String,
}

impl Turn {
    /// Run the turn to its end, sending each step to `events` (a client gone
    /// stops nothing here: the API's stream stops the turn when it is dropped).
    pub async fn run(mut self, events: mpsc::Sender<Event>) {
        let emit = |e: Event| {
            let events = events.clone();
            async move {
                let _ = events.send(e).await;
            }
        };
        let stop = self.active.stop.clone();
        if self.chat.model.is_none() {
            // The first model the endpoint lists; one that cannot say is asked
            // without a model (a local server answers with the one it has loaded).
            let listed = tokio::select! {
                _ = stop.cancelled() => None,
                l = tokio::time::timeout(MODELS_WAIT, self.endpoint.models()) => l.ok().and_then(Result::ok),
            };
            self.chat.model = listed.and_then(|m| m.into_iter().next());
        }
        emit(Event::Chat {
            chat_id: self.chat.chat_id.clone(),
            session_id: self.chat.session_id.clone(),
            model: self.chat.model.clone(),
        })
        .await;
        let mut turns = 0;
        let ended = self.answer(&emit, &stop, &mut turns).await;
        let reason = match ended {
            Ok(reason) => reason,
            Err(e) => {
                emit(Event::Error { code: e.code, message: e.message.clone() }).await;
                e.reason
            }
        };
        let notice = match reason {
            "turn_limit" => Some(format!(
                "The model used its {} answers for this message: send another message to let it go on.",
                self.max_turns
            )),
            "stopped" => Some("Stopped.".to_string()),
            _ => None,
        };
        if let Some(content) = notice {
            let m = ChatMessage::Notice { content, at: now() };
            self.chat.messages.push(m.clone());
            emit(Event::Message(m)).await;
            // A conversation too full to note it in keeps what it had.
            let _ = self.save().await;
        }
        emit(Event::Done { reason, turns }).await;
    }

    async fn answer<F, Fut>(
        &mut self,
        emit: &F,
        stop: &CancellationToken,
        turns: &mut u32,
    ) -> Result<&'static str, Ended>
    where
        F: Fn(Event) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let tools = bound::openai_tools(self.tools.specs());
        let system = system_prompt(&self.session);
        let mut images: Vec<(String, Vec<u8>)> = vec![];
        while *turns < self.max_turns {
            if stop.is_cancelled() {
                return Ok("stopped");
            }
            self.session_still_there()?;
            *turns += 1;
            let mut request = json!({
                "messages": request_messages(&system, &self.chat.messages, &images),
                "tools": tools,
                "tool_choice": "auto",
            });
            if let Some(model) = &self.chat.model {
                request["model"] = Value::String(model.clone());
            }
            images.clear();
            let (text_tx, mut text_rx) = mpsc::channel::<String>(64);
            let forward = async {
                while let Some(text) = text_rx.recv().await {
                    emit(Event::Text(text)).await;
                }
            };
            let asked = async { tokio::join!(self.endpoint.complete(request, text_tx), forward).0 };
            let completion = tokio::select! {
                _ = stop.cancelled() => return Ok("stopped"),
                c = asked => c,
            };
            let completion = match completion {
                Ok(c) => c,
                Err(e) => {
                    let message = e.to_string();
                    self.chat.messages.push(ChatMessage::Notice { content: message.clone(), at: now() });
                    let _ = self.save().await;
                    return Err(Ended { reason: "error", code: Code::Unavailable, message });
                }
            };
            let answer = ChatMessage::Assistant {
                content: completion.text.clone(),
                tool_calls: completion.tool_calls.clone(),
                at: now(),
            };
            self.chat.messages.push(answer.clone());
            self.save().await?;
            emit(Event::Message(answer)).await;
            if completion.calls_dropped > 0 {
                let m = ChatMessage::Notice {
                    content: format!(
                        "The model made {} tool calls more than the {} one answer may make; they were not run.",
                        completion.calls_dropped,
                        llm::MAX_CALLS
                    ),
                    at: now(),
                };
                self.chat.messages.push(m.clone());
                emit(Event::Message(m)).await;
            }
            if completion.tool_calls.is_empty() {
                return Ok("answered");
            }
            for call in completion.tool_calls {
                if stop.is_cancelled() {
                    return Ok("stopped");
                }
                emit(Event::ToolCall(call.clone())).await;
                let (message, shown) = self.call(&call, stop).await;
                self.chat.messages.push(message.clone());
                self.save().await?;
                emit(Event::Message(message)).await;
                if self.engine.settings.images {
                    images.extend(shown);
                }
            }
        }
        Ok("turn_limit")
    }

    /// Run one tool call, bound to the session; its result as kept, and the
    /// images it showed.
    async fn call(&self, call: &ToolCall, stop: &CancellationToken) -> (ChatMessage, Vec<(String, Vec<u8>)>) {
        let out = match bound::bind(&self.session.id, &call.name, &call.arguments, self.tools.specs()) {
            Err(refused) => refused,
            Ok(args) => {
                let watch = Watch { cancelled: stop.child_token(), progress: None };
                match self.tools.call_watched(&self.caller, &call.name, args, &watch).await {
                    Ok(out) => out,
                    Err(unknown) => crate::tools::error_output(&format!("not_found: {unknown}")),
                }
            }
        };
        let mut figures = vec![];
        let mut images = vec![];
        for part in &out.parts {
            if let Part::Image { mime, data, path } = part {
                if let Some(path) = path {
                    figures.push(ChatFigure { path: path.clone(), mime_type: mime.clone() });
                }
                images.push((mime.clone(), data.clone()));
            }
        }
        let message = ChatMessage::Tool {
            tool_call_id: call.id.clone(),
            name: call.name.clone(),
            content: crate::conversations::kept_tool_text(&out.text_of()),
            is_error: out.is_error,
            figures,
            at: now(),
        };
        (message, images)
    }

    /// The session the turn runs in is still the one it began in (not closed, not
    /// expired, not made again under its id): else the turn ends.
    fn session_still_there(&self) -> Result<(), Ended> {
        match self.ops.get_session(&self.caller, &self.session.id) {
            Ok(s) if s.created_at == self.session.created_at => Ok(()),
            _ => Err(Ended {
                reason: "error",
                code: Code::SessionNotFound,
                message: format!(
                    "session {} was closed: the conversation ends with it; start one in another session",
                    self.session.id
                ),
            }),
        }
    }

    /// Keep the conversation as it is now.
    async fn save(&mut self) -> Result<(), Ended> {
        self.chat.updated_at = now();
        match self.ops.save_chat(&self.caller, &self.session.id, &self.chat).await {
            Ok(()) => Ok(()),
            Err(service::Error::InvalidRequest(message)) => {
                Err(Ended { reason: "error", code: Code::InvalidRequest, message })
            }
            Err(e) => {
                // A session closed meanwhile ends the turn as such.
                self.session_still_there()?;
                tracing::warn!(session_id = %self.session.id, chat_id = %self.chat.chat_id, error = %e, "could not keep a conversation");
                Err(Ended {
                    reason: "error",
                    code: Code::Internal,
                    message: format!(
                        "the conversation could not be kept ({e}): the daemon's log says why; start a new conversation"
                    ),
                })
            }
        }
    }
}

/// What the model is told of its situation.
fn system_prompt(session: &SessionInfo) -> String {
    let mode = match session.mode {
        Mode::Kernel => "It is a kernel session: run_python calls share one Python interpreter, so variables persist between them, and a final expression's value is returned.",
        Mode::Script => "It is a script session: each run_python call is a fresh Python process; files persist between calls.",
    };
    format!(
        "You are an assistant with a Linux sandbox for running code, served by sandboxd. Use run_python to compute, analyse data and plot (matplotlib figures are saved and shown to the user automatically), and run_shell for shell commands. Every call runs in session {id} (policy {policy}), whose workspace is the working directory; the user's uploaded files are there. {mode} The session is chosen for you: never pass session_id. Call a tool when running code would help; answer in plain text when you are done.",
        id = session.id,
        policy = session.policy,
    )
}

/// The conversation as a Chat Completions request's `messages`: the system
/// prompt, then every message but notices; `images` (figures of the last tool
/// calls, for a model that takes images) in a user message after them.
fn request_messages(system: &str, messages: &[ChatMessage], images: &[(String, Vec<u8>)]) -> Vec<Value> {
    let mut out = vec![json!({"role": "system", "content": system})];
    // The calls of the last assistant message still without a result: a call
    // stopped before it ran (or cut off by a restart) is answered as such, since
    // the APIs refuse an assistant message whose calls are not all answered.
    let mut unanswered: Vec<String> = vec![];
    let answer_missing = |out: &mut Vec<Value>, unanswered: &mut Vec<String>| {
        for id in unanswered.drain(..) {
            out.push(json!({"role": "tool", "tool_call_id": id,
                "content": "error cancelled: this call was not run (the person stopped the turn)"}));
        }
    };
    for m in crate::conversations::for_model(messages) {
        match m {
            ChatMessage::Tool { tool_call_id, .. } => unanswered.retain(|id| id != tool_call_id),
            _ => answer_missing(&mut out, &mut unanswered),
        }
        if let ChatMessage::Assistant { tool_calls, .. } = m {
            unanswered = tool_calls.iter().map(|c| c.id.clone()).collect();
        }
        out.push(match m {
            ChatMessage::User { content, .. } => json!({"role": "user", "content": content}),
            ChatMessage::Assistant { content, tool_calls, .. } if tool_calls.is_empty() => {
                json!({"role": "assistant", "content": content})
            }
            ChatMessage::Assistant { content, tool_calls, .. } => {
                let calls: Vec<Value> = tool_calls
                    .iter()
                    .map(|c| {
                        // Servers that read the arguments back as JSON (to apply
                        // a chat template) fail on a malformed one: it was
                        // answered as an error already, and goes back as `{}`.
                        let arguments = match serde_json::from_str::<Value>(&c.arguments) {
                            Ok(Value::Object(_)) => c.arguments.clone(),
                            _ => "{}".to_string(),
                        };
                        json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": arguments}})
                    })
                    .collect();
                let content = if content.is_empty() { Value::Null } else { Value::String(content.clone()) };
                json!({"role": "assistant", "content": content, "tool_calls": calls})
            }
            ChatMessage::Tool { tool_call_id, content, .. } => {
                json!({"role": "tool", "tool_call_id": tool_call_id, "content": content})
            }
            ChatMessage::Notice { .. } => continue,
        });
    }
    answer_missing(&mut out, &mut unanswered);
    if !images.is_empty() {
        let mut parts = vec![json!({"type": "text", "text": "The figures the tool calls above made:"})];
        for (mime, data) in images {
            let url = format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(data));
            parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
        }
        out.push(json!({"role": "user", "content": parts}));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conversation_goes_to_the_model_without_notices_and_with_sound_arguments() {
        let messages = vec![
            ChatMessage::User { content: "plot".into(), at: "t".into() },
            ChatMessage::Assistant {
                content: String::new(),
                tool_calls: vec![
                    ToolCall { id: "a".into(), name: "run_python".into(), arguments: "{\"code\": \"1\"}".into() },
                    ToolCall { id: "b".into(), name: "run_python".into(), arguments: "{\"code\": ".into() },
                ],
                at: "t".into(),
            },
            ChatMessage::Tool {
                tool_call_id: "a".into(),
                name: "run_python".into(),
                content: "status: ok".into(),
                is_error: false,
                figures: vec![],
                at: "t".into(),
            },
            ChatMessage::Notice { content: "Stopped.".into(), at: "t".into() },
            ChatMessage::Assistant { content: "done".into(), tool_calls: vec![], at: "t".into() },
        ];
        let out = request_messages("sys", &messages, &[("image/png".into(), vec![1, 2, 3])]);
        assert_eq!(out.len(), 7);
        assert_eq!(out[0], json!({"role": "system", "content": "sys"}));
        assert_eq!(out[2]["content"], Value::Null);
        assert_eq!(out[2]["tool_calls"][0]["function"]["arguments"], "{\"code\": \"1\"}");
        assert_eq!(out[2]["tool_calls"][1]["function"]["arguments"], "{}");
        assert_eq!(out[3], json!({"role": "tool", "tool_call_id": "a", "content": "status: ok"}));
        // The call stopped before it ran is answered as such.
        assert_eq!(out[4]["tool_call_id"], "b");
        assert_eq!(out[5], json!({"role": "assistant", "content": "done"}));
        assert_eq!(out[6]["content"][1]["image_url"]["url"], "data:image/png;base64,AQID");
    }

    #[test]
    fn a_call_left_without_a_result_is_answered_as_not_run() {
        let call = |id: &str| ToolCall { id: id.into(), name: "run_shell".into(), arguments: "{}".into() };
        let result = |id: &str| ChatMessage::Tool {
            tool_call_id: id.into(),
            name: "run_shell".into(),
            content: "status: ok".into(),
            is_error: false,
            figures: vec![],
            at: "t".into(),
        };
        let messages = vec![
            ChatMessage::User { content: "go".into(), at: "t".into() },
            ChatMessage::Assistant { content: String::new(), tool_calls: vec![call("a"), call("b")], at: "t".into() },
            result("a"),
            ChatMessage::Notice { content: "Stopped.".into(), at: "t".into() },
            ChatMessage::User { content: "again".into(), at: "t".into() },
            ChatMessage::Assistant { content: String::new(), tool_calls: vec![call("c")], at: "t".into() },
        ];
        let out = request_messages("sys", &messages, &[]);
        let roles: Vec<(&str, &str)> =
            out.iter().map(|m| (m["role"].as_str().unwrap_or(""), m["tool_call_id"].as_str().unwrap_or(""))).collect();
        assert_eq!(
            roles,
            [
                ("system", ""),
                ("user", ""),
                ("assistant", ""),
                ("tool", "a"),
                ("tool", "b"),
                ("user", ""),
                ("assistant", ""),
                ("tool", "c")
            ]
        );
        assert!(out[4]["content"].as_str().unwrap_or("").starts_with("error cancelled: this call was not run"));
    }

    #[test]
    fn a_session_has_one_conversation_going_at_a_time() {
        let engine = Arc::new(Engine::new(Settings { endpoint: None, model: None, max_turns: 3, images: false }));
        let first = engine.claim("aaaa.s", "t1").unwrap();
        assert!(engine.claim("aaaa.s", "t1").is_none());
        // Another owner's session of the same id is another session; so is one
        // made again under the same key (a closed session's turn holds it up not).
        let other = engine.claim("bbbb.s", "t1").unwrap();
        let again = engine.claim("aaaa.s", "t2").unwrap();
        assert!(!engine.stop("aaaa.t"));
        // A stop reaches every turn of the key, the closed session's included.
        assert!(engine.stop("aaaa.s"));
        assert!(first.stop.is_cancelled() && again.stop.is_cancelled() && !other.stop.is_cancelled());
        drop(first);
        assert!(engine.claim("aaaa.s", "t1").is_some());
    }

    #[test]
    fn events_are_named_as_the_api_documents_them() {
        let tool = ChatMessage::Tool {
            tool_call_id: "a".into(),
            name: "run_python".into(),
            content: "x".into(),
            is_error: true,
            figures: vec![ChatFigure { path: "figure-1.png".into(), mime_type: "image/png".into() }],
            at: "t".into(),
        };
        assert_eq!(Event::Message(tool.clone()).name(), "tool_result");
        assert_eq!(Event::Message(tool).data()["figures"][0]["path"], "figure-1.png");
        assert_eq!(Event::Text("hi".into()).data(), json!({"text": "hi"}));
        let e = Event::Error { code: Code::Unavailable, message: "down".into() };
        assert_eq!(e.data(), json!({"error": {"code": "unavailable", "message": "down"}}));
        assert_eq!(Event::Done { reason: "answered", turns: 2 }.data(), json!({"reason": "answered", "turns": 2}));
    }
}
