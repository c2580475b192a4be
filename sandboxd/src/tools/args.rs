//! Each tool's arguments, typed. Every struct refuses an argument it does not
//! declare (`deny_unknown_fields`, so a model that sends `policy` to run_python
//! learns it is not one), and declares optional arguments as plain types with
//! defaults in its schema (`render::plain_schema`). The doc comments are the
//! arguments' descriptions in the schema a model reads.

// schemars, as rmcp re-exports it: the schema generator the MCP SDK itself uses.
use rmcp::schemars;
use serde::Deserialize;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunPython {
    /// Python 3.11 source to run. numpy, pandas, scipy, scikit-learn, matplotlib, seaborn, pillow, openpyxl, pyarrow and reportlab are installed.
    pub code: String,
    /// Run in this session (its files persist between runs); omit to start a new session.
    pub session_id: Option<String>,
    /// Wall-clock limit in seconds; 0 (the default) means the session policy's limit, which is also the maximum (the tool description states the default policy's).
    pub timeout_s: Option<f64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunShell {
    /// A bash command line, run in the session's workspace.
    pub command: String,
    /// Run in this session; omit to start a new session.
    pub session_id: Option<String>,
    /// Wall-clock limit in seconds; 0 (the default) means the session policy's limit, which is also the maximum.
    pub timeout_s: Option<f64>,
}

// The arguments of `create_session` (not `service::CreateSessionRequest`, the API's
// request, which this becomes). A plain comment: a doc comment would be the schema's
// description, which models read.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSession {
    /// "script" (every run a fresh process; files persist) or "kernel" (one interpreter: variables persist between runs, and a final expression's value is returned).
    pub mode: Option<String>,
    /// Policy name (limits): "default" or "strict".
    pub policy: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRef {
    /// The session's id, as returned by create_session or a run.
    pub session_id: String,
}

/// No arguments at all.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UploadFile {
    /// Upload into this session; omit to start a new session.
    pub session_id: Option<String>,
    /// Relative path in the workspace, e.g. "data/input.csv".
    pub path: String,
    /// The file's bytes, base64-encoded.
    pub content_base64: String,
    /// Replace an existing file (default false).
    pub overwrite: Option<bool>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFile {
    /// The session's id, as returned by create_session or a run.
    pub session_id: String,
    /// Relative path in the workspace.
    pub path: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InstallPackages {
    /// Install into this session (its later runs import them); omit to start a new session.
    pub session_id: Option<String>,
    /// Requirements: a package name, optional [extras] and version specifiers, e.g. ["requests==2.32.3", "tabulate"].
    pub packages: Vec<String>,
}
