//! The chat (`POST /v1/chat`, `GET /v1/sessions/{id}/chats`): a conversation
//! between a person and the operator's LLM, whose tool calls run in one session.

use serde::{Deserialize, Serialize};

/// `POST /v1/chat`: one message of the person, and the model's turns that follow.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    /// The session the conversation is bound to: every tool call runs in it, and
    /// no other.
    #[schema(pattern = r"^([0-9a-f]{16}\.)?[A-Za-z0-9_-]{1,64}$")]
    pub session_id: String,
    /// Go on with this conversation of the session (`chat_id` of its `chat`
    /// event); omit it to start a new one.
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub chat_id: Option<String>,
    /// What the person says (at most 64 KiB).
    #[schema(min_length = 1, max_length = 65536)]
    pub message: String,
    /// The model to ask (default: the daemon's `llm_model`, else the first the
    /// endpoint lists).
    pub model: Option<String>,
    /// The most model turns (answers) for this message, up to the daemon's
    /// `chat_max_turns`, which is also the default.
    #[schema(minimum = 1)]
    pub max_turns: Option<u32>,
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolCall {
    /// The call's id, as the model named it.
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them (JSON text, perhaps not valid).
    pub arguments: String,
}

/// A figure a tool result showed: a file of the session's workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatFigure {
    /// Its path in the workspace (download it from `GET /v1/sessions/{id}/files/{path}`).
    pub path: String,
    pub mime_type: String,
}

/// One message of a conversation, as kept. `user`, `assistant` and `tool` are
/// what the model is shown again on the next message; a `notice` (the turn limit
/// reached, the endpoint down, a stop) is for the person only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMessage {
    User {
        content: String,
        at: String,
    },
    Assistant {
        content: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        at: String,
    },
    Tool {
        tool_call_id: String,
        name: String,
        content: String,
        is_error: bool,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        figures: Vec<ChatFigure>,
        at: String,
    },
    Notice {
        content: String,
        at: String,
    },
}

/// A conversation: its messages, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Chat {
    pub chat_id: String,
    pub session_id: String,
    /// The start of its first message.
    pub title: String,
    pub created_at: String,
    pub updated_at: String,
    /// The model that answered last.
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
}

/// A conversation, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatSummary {
    pub chat_id: String,
    pub title: String,
    pub created_at: String,
    pub updated_at: String,
    pub model: Option<String>,
    pub messages: usize,
}

/// `GET /v1/sessions/{id}/chats`: the session's conversations, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatList {
    pub chats: Vec<ChatSummary>,
}
