//! Installing packages into a session's package layer, as callers ask and see it.

use super::run::NetUsage;
use serde::{Deserialize, Serialize};

/// The body of `POST /v1/sessions/{id}/packages`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InstallRequest {
    /// Requirements: a name, optional `[extras]` and version specifiers
    /// (`"requests==2.32.3"`, `"tabulate"`, `"pandas>=2,<3"`); 1 to 32 of them.
    pub packages: Vec<String>,
}

/// A distribution the install put in the layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InstalledPackage {
    pub name: String,
    pub version: String,
}

/// What an install did. Packages in the layer are importable by every later run
/// of the session (script, pooled and kernel runs alike); no other session sees
/// them.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InstallResult {
    pub session_id: String,
    /// What was installed now, dependencies included.
    pub installed: Vec<InstalledPackage>,
    /// Requirements already met (by the rootfs or the layer): nothing to do.
    pub unchanged: Vec<String>,
    pub duration_ms: u64,
    /// What the session's package layer holds now, and the most it may (the
    /// policy's `packages_mb`).
    pub layer_bytes: u64,
    pub layer_limit_bytes: u64,
    /// The installer's use of the network (the index, through the egress proxy;
    /// `cached_bytes` came from the daemon's package cache).
    pub net: NetUsage,
}
