//! Policies as callers see them: every field (`GET /v1/policies`), and the limits
//! a client states to its user.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// The policy's name (its file name, without `.toml`); served, never read
    /// from the file (the OpenAPI document adds it: `skip_deserializing` hides it
    /// from the derive).
    #[serde(skip_deserializing)]
    pub name: String,
    pub description: String,
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: u64,
    pub timeout_s: u64,
    pub grace_s: u64,
    pub output_kb: u64,
    pub code_kb: u64,
    pub upload_mb: u64,
    pub mcp_inline_mb: u64,
    pub tmp_mb: u64,
    pub shm_mb: u64,
    pub workspace_mb: u64,
    pub file_size_mb: u64,
    pub open_files: u64,
    #[schema(value_type = String, example = "none")]
    pub network: NoNetwork,
    pub autosave_figures: bool,
    pub max_artifacts: usize,
    /// Modules a pooled sandbox imports before its run arrives.
    pub preload: Vec<String>,
    /// Runs one pooled template serves before it is replaced. Its forks share the
    /// template's Python hash secret and memory layout (ASLR), so this bounds how
    /// many runs share them; 1 gives every run a template of its own.
    pub template_runs: u64,
}

/// A sandbox has no network: its own network namespace with only `lo`, TCP bind
/// and connect denied by Landlock. Not a choice today, so nothing to hold; a
/// policy file may still say `network = "none"` (the only value accepted), and the
/// policy is shown with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NoNetwork;

impl NoNetwork {
    const VALUE: &'static str = "none";
}

impl Serialize for NoNetwork {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(Self::VALUE)
    }
}

impl<'de> Deserialize<'de> for NoNetwork {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = String::deserialize(d)?;
        if value == Self::VALUE {
            Ok(NoNetwork)
        } else {
            Err(serde::de::Error::custom(format!(
                "network is {value:?}; allowed: \"none\" (sandboxes have no network)"
            )))
        }
    }
}

/// The limits of a policy a client states to its user (e.g. in MCP tool
/// descriptions): a subset of `GET /v1/policies`' entries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyLimits {
    pub name: String,
    pub timeout_s: u64,
    pub memory_mb: u64,
    pub cpus: f64,
    pub output_kb: u64,
    /// Most code a run may send (KiB): MCP checks a run against it before it makes
    /// a session for the run.
    pub code_kb: u64,
    pub upload_mb: u64,
    pub mcp_inline_mb: u64,
}

impl From<&Policy> for PolicyLimits {
    fn from(p: &Policy) -> Self {
        PolicyLimits {
            name: p.name.clone(),
            timeout_s: p.timeout_s,
            memory_mb: p.memory_mb,
            cpus: p.cpus,
            output_kb: p.output_kb,
            code_kb: p.code_kb,
            upload_mb: p.upload_mb,
            mcp_inline_mb: p.mcp_inline_mb,
        }
    }
}
