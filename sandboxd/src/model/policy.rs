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
    /// `none`: the sandbox's network namespace has only `lo`, and nothing listens
    /// there. `allowlist`: the daemon's egress proxy listens on `127.0.0.1:3128`
    /// inside it (the sandbox's `HTTP_PROXY` and `HTTPS_PROXY`) and reaches only
    /// `allow_hosts` on `allow_ports`.
    pub network: Network,
    /// Hosts an `allowlist` sandbox may reach through the proxy: exact names
    /// (`data.example.com`), suffix globs (`*.example.org`: any name below it, not
    /// the name itself) or IP literals. Whatever a name resolves to, loopback,
    /// private, link-local, unique-local and metadata addresses are refused.
    pub allow_hosts: Vec<String>,
    /// The ports those hosts may be reached on.
    pub allow_ports: Vec<u16>,
    /// The package index pip and the installer use (`PIP_INDEX_URL`); its host
    /// must be in `allow_hosts` when packages are on.
    pub index_url: String,
    /// Room for the session's installed packages (its package layer), MiB; 0
    /// turns packages off. Needs `network = "allowlist"` with the index allowed.
    pub packages_mb: u64,
    /// Install from source distributions too (their build scripts run inside the
    /// sandbox, like any code). `false`: wheels only, so installing runs no code of
    /// the packages'.
    pub source_builds: bool,
    /// The longest an install may take, in seconds.
    pub install_timeout_s: u64,
    /// Credentials the sandbox uses but never reads: it sees a placeholder in the
    /// variable `name`, which the egress proxy replaces by the real value only in
    /// requests to `hosts`.
    pub secrets: Vec<SecretRule>,
    pub autosave_figures: bool,
    pub max_artifacts: usize,
    /// Modules a pooled sandbox imports before its run arrives.
    pub preload: Vec<String>,
    /// Runs one pooled template serves before it is replaced. Its forks share the
    /// template's Python hash secret and memory layout (ASLR), so this bounds how
    /// many runs share them; 1 gives every run a template of its own.
    pub template_runs: u64,
}

impl Policy {
    /// Whether a session of this policy may install packages: a package layer, and
    /// a way to the index.
    pub fn packages_enabled(&self) -> bool {
        self.network == Network::Allowlist && self.packages_mb > 0
    }
}

/// Whether a sandbox reaches anything outside: see [`Policy::network`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Its own network namespace with only `lo`, TCP bind and connect denied by
    /// Landlock, and no proxy.
    None,
    /// Only through the daemon's egress proxy, to the policy's `allow_hosts`.
    #[default]
    Allowlist,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Allowlist => "allowlist",
        }
    }
}

impl<'de> Deserialize<'de> for Network {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = String::deserialize(d)?;
        match value.as_str() {
            "none" => Ok(Network::None),
            "allowlist" => Ok(Network::Allowlist),
            _ => Err(serde::de::Error::custom(format!(
                "network is {value:?}; allowed: \"none\" (no network) or \"allowlist\" (allow_hosts only, through the daemon's proxy)"
            ))),
        }
    }
}

/// One secret of a policy (`[[secrets]]` in its file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretRule {
    /// The environment variable that holds the placeholder in the sandbox.
    pub name: String,
    /// The hosts (patterns as in `allow_hosts`) whose requests get the real value.
    pub hosts: Vec<String>,
    /// Where the daemon reads the value when it starts: `env:VARIABLE` (its own
    /// environment) or `file:/absolute/path` (the file's first line).
    pub value_from: String,
    /// Where in a request the placeholder becomes the value (default: headers
    /// only). A placeholder anywhere else refuses the request.
    #[serde(default = "SecretPlace::default_places")]
    pub substitute_in: Vec<SecretPlace>,
}

/// A part of a request where a secret's placeholder may become its value.
///
/// The value reaches the host wherever it is put, and a host may hand back what
/// it received transformed (reversed, encoded, cut in parts) where the proxy
/// cannot recognize it: an API that echoes or stores a request's URL or body
/// (an LLM asked to repeat its prompt backwards) would give the value to the
/// sandbox. Headers, which APIs read credentials from and rarely show, are the
/// default; `url` and `body` are for hosts that need the value there and show
/// nothing of what they are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SecretPlace {
    /// Request headers (`Authorization`, `X-Api-Key`, cookies).
    Headers,
    /// The request's path and query.
    Url,
    /// The request's body.
    Body,
}

impl SecretPlace {
    pub fn default_places() -> Vec<SecretPlace> {
        vec![SecretPlace::Headers]
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SecretPlace::Headers => "headers",
            SecretPlace::Url => "url",
            SecretPlace::Body => "body",
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
    /// What the sandbox may reach (an older daemon's answer has none of these
    /// three: no network, no packages).
    #[serde(default = "no_network")]
    pub network: Network,
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// Room for installed packages, MiB (0: none).
    #[serde(default)]
    pub packages_mb: u64,
}

fn no_network() -> Network {
    Network::None
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
            network: p.network,
            allow_hosts: p.allow_hosts.clone(),
            packages_mb: if p.packages_enabled() { p.packages_mb } else { 0 },
        }
    }
}
