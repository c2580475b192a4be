//! Sessions as callers see them: how one is asked for, how it is shown, and the
//! short answer of an operation that only reports what it did.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every run is a fresh sandbox over the session's workspace.
    #[default]
    Script,
    /// One interpreter stays alive across runs: variables persist ([`crate::kernel`]).
    Kernel,
}

impl Mode {
    /// The mode's name, as the API writes it (`script`, `kernel`).
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Script => "script",
            Mode::Kernel => "kernel",
        }
    }
}

/// What is stored of a session, and what the API shows.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionInfo {
    pub id: String,
    pub mode: Mode,
    pub policy: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub last_used_at: String,
    pub ttl_s: u64,
    /// The token identity that owns the session (a hash, never the token); absent
    /// for sessions made without a token.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub owner: Option<String>,
    /// The host uid the session's code runs as.
    #[serde(default)]
    pub uid: u32,
    /// Always stored as false: only the live state says a session is busy.
    #[serde(default)]
    pub busy: bool,
    /// Bytes of the host disk its workspace and package layer take, as last
    /// measured (after its last run or file operation); 0 before its first use.
    #[serde(default)]
    pub disk_bytes: u64,
}

/// The body of `POST /v1/sessions`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CreateSession)]
pub struct CreateSessionRequest {
    /// Caller-chosen id (`^[A-Za-z0-9_-]{1,64}$`); made up when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = r"^[A-Za-z0-9_-]{1,64}$")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Idle time before the session is closed, seconds (1 to 30 days; default:
    /// the daemon's `session_ttl_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 2592000)]
    pub ttl_s: Option<u64>,
}

/// The answer of an operation that only reports what it did:
/// `{"status":"closed"}`, `{"status":"cancelled"|"idle"}`,
/// `{"status":"deleted","path":...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = Done)]
pub struct StatusAnswer {
    #[schema(example = "closed")]
    pub status: String,
    /// The file deleted (`DELETE .../files/{path}` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub path: Option<String>,
}

impl StatusAnswer {
    /// The answer that says `status` alone.
    pub fn status(status: &str) -> StatusAnswer {
        StatusAnswer { status: status.to_string(), path: None }
    }
}
