//! The host check as callers get it (`GET /v1/check`, `sandboxctl doctor`): each
//! requirement and how the host meets it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = CheckStatus)]
pub enum Status {
    /// Met.
    Ok,
    /// Met in part: sandboxd runs, with less than it could.
    Warn,
    /// Not met: the daemon refuses to start.
    Fail,
}

/// One requirement and how the host meets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Item {
    pub name: String,
    pub status: Status,
    /// What was found on this host.
    pub found: String,
    /// What to do; empty when the requirement is met.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fix: String,
}

/// Every item; `ok` is false when one of them failed.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Report {
    pub ok: bool,
    pub items: Vec<Item>,
}
