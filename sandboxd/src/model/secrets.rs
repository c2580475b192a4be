//! A session's secrets as callers set and see them: names and hosts, never a
//! value (`PUT /v1/sessions/{id}/secrets/{name}` takes one; no route answers one).

pub use super::policy::SecretPlace;
use serde::{Deserialize, Serialize};

/// The body of `PUT /v1/sessions/{id}/secrets/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretRequest {
    /// The real value: 1 to 8192 bytes, no line break. No route returns it.
    pub value: String,
    /// The hosts (patterns as in a policy's `allow_hosts`, and allowed by it) whose
    /// requests get the value in place of the placeholder.
    pub hosts: Vec<String>,
    /// Where in a request the placeholder becomes the value: `headers` (the
    /// default), `url`, `body` (see the policy field of the same name).
    #[serde(default = "SecretPlace::default_places")]
    pub substitute_in: Vec<SecretPlace>,
}

/// Where a secret comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SecretSource {
    /// The session's policy (`[[secrets]]`).
    Policy,
    /// Set on the session through the API.
    Session,
}

/// A secret as routes show it: its variable's name and its hosts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SecretInfo {
    pub name: String,
    pub hosts: Vec<String>,
    pub substitute_in: Vec<SecretPlace>,
    pub source: SecretSource,
}
