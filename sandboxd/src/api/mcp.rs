//! MCP: sandboxd's tools for LLM clients (rmcp, the official Rust SDK).
//!
//! One tool server, [`SandboxMcp`], served two ways: over streamable HTTP at `/mcp`
//! on the daemon's HTTP listener, where the tools call [`crate::service`]
//! in-process as the caller the API's auth layer found ([`Backend::Local`]), and
//! over stdio by `sandboxctl mcp` (for clients that start a command), where they
//! call the daemon's API with the typed [`Client`] ([`Backend::Remote`]). Either
//! way they take and give the service's typed structs, so they behave exactly as
//! the API does. Tool arguments are checked as typed values first: a `session_id`
//! that is not a session id is refused with `invalid_session_id` before anything
//! is touched. A failed tool call is a tool result with `isError` and the error
//! code, never a protocol error. Tool descriptions state the limits of the
//! daemon's default policy, read when the server starts.

use super::error::ApiError;
use crate::client::{Client, ClientError};
use crate::run::{ArtifactKind, Language, RunRequest, RunResult, Status};
use crate::service::{self, Caller, CreateSession as CreateSessionRequest, Done, FileEntry, Operations, PolicyLimits};
use crate::session::{self, Mode, SessionInfo};
use base64::Engine;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_handler, tool_router, RoleServer, ServerHandler};
use serde::Deserialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most images returned with one run, and their size after downscaling.
pub const MAX_IMAGES: usize = 4;
pub const MAX_IMAGE_BYTES: usize = 1024 * 1024;
/// Most bytes of one run's tool result (its text and base64 images, as JSON):
/// below the 1 MiB message limit of the strictest official MCP SDK (Python's),
/// with room for the JSON-RPC envelope. Images share what the text leaves.
pub const MAX_RESULT_BYTES: usize = 900 * 1024;
/// Longest side of an image sent to a model.
pub const MAX_IMAGE_SIDE: u32 = 1568;
/// The sides an image is downscaled to, in turn, until it fits its share.
const IMAGE_SIDES: [u32; 5] = [MAX_IMAGE_SIDE, 1024, 768, 512, 384];
/// Largest image file read to be shown to a model (before downscaling). A run's
/// files are written by sandboxed code: a bigger one (even a sparse file that takes
/// no disk) is named in the text, never read.
pub const MAX_SOURCE_IMAGE_BYTES: usize = 32 * 1024 * 1024;
/// Largest width or height, and memory, an image may decode to.
const MAX_DECODED_SIDE: u32 = 16_384;
const MAX_DECODE_ALLOC: u64 = 256 * 1024 * 1024;

/// Where the tools' operations go.
#[derive(Clone)]
pub enum Backend {
    /// In the daemon: the service itself, as each request's caller.
    Local(Arc<dyn Operations>),
    /// In `sandboxctl mcp`: the daemon's API, with the client's token.
    Remote(Client),
}

#[derive(Clone)]
pub struct SandboxMcp {
    backend: Backend,
    tool_router: ToolRouter<Self>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RunPython {
    /// Python 3.11 source to run. numpy, pandas, scipy, scikit-learn, matplotlib, seaborn, pillow, openpyxl, pyarrow and reportlab are installed.
    pub code: String,
    /// Run in this session (its files persist between runs); omit to start a new session.
    pub session_id: Option<String>,
    /// Wall-clock limit in seconds; 0 (the default) means the session policy's limit, which is also the maximum (the tool description states the default policy's).
    pub timeout_s: Option<f64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RunShell {
    /// A bash command line, run in the session's workspace.
    pub command: String,
    /// Run in this session; omit to start a new session.
    pub session_id: Option<String>,
    /// Wall-clock limit in seconds; 0 (the default) means the session policy's limit, which is also the maximum.
    pub timeout_s: Option<f64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CreateSession {
    /// "script" (every run a fresh process; files persist) or "kernel" (one interpreter: variables persist between runs, and a final expression's value is returned).
    pub mode: Option<String>,
    /// Policy name (limits): "default" or "strict".
    pub policy: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SessionRef {
    /// The session's id, as returned by create_session or a run.
    pub session_id: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
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
pub struct ReadFile {
    pub session_id: String,
    /// Relative path in the workspace.
    pub path: String,
}

/// Why a tool's operation failed, from either backend.
#[derive(Debug)]
enum Failure {
    /// The API's error: its code and message.
    Api { code: String, message: String },
    /// A file larger than the caller reads (bytes).
    TooLarge(u64),
    /// The daemon could not be reached or answered nonsense (stdio only).
    Unavailable(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Api { code, message } => write!(f, "{message} ({code})"),
            Failure::TooLarge(limit) => write!(f, "the answer is larger than {limit} bytes"),
            Failure::Unavailable(m) => f.write_str(m),
        }
    }
}

impl From<service::Error> for Failure {
    fn from(e: service::Error) -> Self {
        match e {
            service::Error::FileTooLarge { limit, .. } => Failure::TooLarge(limit),
            e => {
                let e = ApiError::from(e);
                Failure::Api { code: e.code.as_str().to_string(), message: e.message }
            }
        }
    }
}

impl From<session::Error> for Failure {
    fn from(e: session::Error) -> Self {
        service::Error::from(e).into()
    }
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Api { code, message, .. } => Failure::Api { code, message },
            ClientError::TooLarge(limit) => Failure::TooLarge(limit as u64),
            other => Failure::Unavailable(other.to_string()),
        }
    }
}

fn failure(e: Failure) -> CallToolResult {
    let text = match e {
        Failure::Api { code, message } => {
            let hint = match code.as_str() {
                "session_not_found" => " Next: call create_session, or omit session_id to start a new session.",
                "session_busy" => " Next: wait for that run to finish, or use another session.",
                "file_exists" => " Next: pass overwrite=true to replace it.",
                "invalid_path" => " Next: use a relative path such as data/input.csv.",
                "invalid_session_id" => " Next: pass a session_id exactly as create_session or a run returned it.",
                _ => "",
            };
            // One period after the message, which is quoted as is (an id like
            // `../x` stays what the caller sent).
            format!("error {code}: {}.{hint}", message.trim_end_matches('.'))
        }
        Failure::TooLarge(limit) => format!("error artifact_too_large: the file is larger than {limit} bytes"),
        Failure::Unavailable(m) => format!("error unavailable: {m}"),
    };
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// A `session_id` argument, checked before it is used anywhere: an id, or (for a
/// caller without a token) a session key; never a path or anything else.
fn session_arg(id: &str) -> Result<&str, Failure> {
    session::key(id, None)?;
    Ok(id)
}

/// One tool call's way to the daemon: the backend, as the calling client.
struct Call<'a> {
    backend: &'a Backend,
    caller: Caller,
}

impl Call<'_> {
    async fn create_session(&self, req: CreateSessionRequest) -> Result<SessionInfo, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.create_session(&self.caller, req).await?),
            Backend::Remote(c) => Ok(c.create_session(&req).await?),
        }
    }

    async fn get_session(&self, id: &str) -> Result<SessionInfo, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.get_session(&self.caller, id)?),
            Backend::Remote(c) => Ok(c.get_session(id).await?),
        }
    }

    async fn list_sessions(&self) -> Result<Vec<SessionInfo>, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.list_sessions(&self.caller)),
            Backend::Remote(c) => Ok(c.list_sessions().await?),
        }
    }

    async fn close_session(&self, id: &str) -> Result<Done, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.close_session(&self.caller, id).await?),
            Backend::Remote(c) => Ok(c.close_session(id).await?),
        }
    }

    async fn cancel_run(&self, id: &str) -> Result<Done, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.cancel_run(&self.caller, id)?),
            Backend::Remote(c) => Ok(c.cancel_run(id).await?),
        }
    }

    async fn run(&self, req: RunRequest) -> Result<RunResult, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.run(&self.caller, req).await?),
            Backend::Remote(c) => Ok(c.run(&req).await?),
        }
    }

    async fn list_files(&self, id: &str) -> Result<Vec<FileEntry>, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.list_files(&self.caller, id).await?),
            Backend::Remote(c) => Ok(c.list_files(id).await?),
        }
    }

    /// A file's bytes, at most `limit` of them ([`Failure::TooLarge`] past it).
    async fn read_file(&self, id: &str, path: &str, limit: u64) -> Result<Vec<u8>, Failure> {
        match self.backend {
            Backend::Local(s) => Ok(s.read_file(&self.caller, id, path, limit).await?),
            Backend::Remote(c) => {
                Ok(c.read_file(id, path, usize::try_from(limit).unwrap_or(usize::MAX)).await?.to_vec())
            }
        }
    }

    async fn upload(&self, id: &str, path: &str, overwrite: bool, data: Vec<u8>) -> Result<FileEntry, Failure> {
        match self.backend {
            Backend::Local(s) => {
                let (s, caller, id, path) = (s.clone(), self.caller.clone(), id.to_string(), path.to_string());
                let written = tokio::task::spawn_blocking(move || {
                    let mut upload = s.create_file(&caller, &id, &path, overwrite)?;
                    if let Err(e) = upload.write(&data) {
                        upload.abort();
                        return Err(e);
                    }
                    upload.finish()
                })
                .await
                .map_err(|e| Failure::Unavailable(format!("the upload failed: {e}")))?;
                Ok(written?)
            }
            Backend::Remote(c) => Ok(c.upload(id, path, overwrite, data).await?),
        }
    }

    /// The session policy's limit for inlining file content, in bytes.
    async fn inline_limit(&self, id: &str) -> Result<u64, Failure> {
        let policy = self.get_session(id).await?.policy;
        let mb = match self.backend {
            Backend::Local(s) => s.policy(Some(&policy))?.mcp_inline_mb,
            Backend::Remote(c) => c
                .policies()
                .await?
                .into_iter()
                .find(|p| p.name == policy)
                .map(|p| p.mcp_inline_mb)
                .unwrap_or(crate::policy::Policy::default().mcp_inline_mb),
        };
        Ok(mb * 1024 * 1024)
    }

    async fn session_or_new(&self, session_id: Option<String>) -> Result<String, Failure> {
        match session_id {
            Some(id) => Ok(id),
            None => Ok(self.create_session(CreateSessionRequest::default()).await?.id),
        }
    }
}

/// The tools' descriptions, with the limits of `default` (the daemon's default
/// policy) when known.
fn descriptions(default: Option<&PolicyLimits>) -> [(&'static str, String); 5] {
    let run_limits = match default {
        Some(p) => format!(
            "Limits per run (policy {:?}, the default): {} s, {} MiB memory, {} CPU, {} KiB of output per stream.",
            p.name, p.timeout_s, p.memory_mb, p.cpus, p.output_kb
        ),
        None => "Limits per run: the session policy's (time, memory, CPU, output per stream).".to_string(),
    };
    let upload = match default {
        Some(p) => format!("Up to {} MiB by default.", p.upload_mb),
        None => "Up to the session policy's upload limit.".to_string(),
    };
    let inline = match default {
        Some(p) => format!("the policy's inline limit ({} MiB by default)", p.mcp_inline_mb),
        None => "the policy's inline limit".to_string(),
    };
    [
        (
            "run_python",
            format!("Run Python 3.11 code in a fresh, isolated Linux sandbox (no network) and return its status, exit code, stdout, stderr and the files it created or changed. The working directory is the session's workspace: files persist between runs of the same session (pass session_id; omit it to start a new session, whose id is returned). numpy, pandas, scipy, scikit-learn, matplotlib, seaborn, pillow, openpyxl, pyarrow and reportlab are installed. Open matplotlib figures are saved automatically and returned as images; plt.show() saves instead of blocking. {run_limits}"),
        ),
        (
            "run_shell",
            format!("Run a bash command in the same kind of isolated sandbox as run_python (no network), in the session's workspace, and return status, exit code, stdout, stderr and changed files. Useful for ls, head, wc, or running a script written by run_python. {run_limits}"),
        ),
        (
            "create_session",
            "Create a session: a workspace whose files persist across runs until it is closed or idle for longer than its ttl_s (returned). Returns the session_id to pass to the other tools.".to_string(),
        ),
        (
            "upload_file",
            format!("Upload a file (base64) into a session's workspace so code can read it by its relative path. Omit session_id to start a new session. {upload}"),
        ),
        (
            "read_file",
            format!("Read a file from a session's workspace: text files as text, PNG/JPEG images as images, other files as base64. Files larger than {inline} are refused; use their download URL instead."),
        ),
    ]
}

/// Declare each optional argument as its plain type with its default, never as
/// "X or null": clients that build arguments from the schema (the MCP Inspector)
/// send a value of a union type as a string, which the tool then refuses.
/// Defaults: `timeout_s` 0 (the session policy's limit), `overwrite` false.
fn plain_schema(schema: &mut serde_json::Map<String, serde_json::Value>) {
    use serde_json::Value;
    let Some(Value::Object(props)) = schema.get_mut("properties") else { return };
    for (name, prop) in props.iter_mut() {
        let Value::Object(prop) = prop else { continue };
        if let Some(Value::Array(types)) = prop.get("type") {
            let kept: Vec<Value> = types.iter().filter(|t| t.as_str() != Some("null")).cloned().collect();
            if let [one] = kept.as_slice() {
                prop.insert("type".into(), one.clone());
            }
        }
        if let Some(Value::Array(any)) = prop.get("anyOf") {
            let kept: Vec<Value> =
                any.iter().filter(|a| a.get("type").and_then(Value::as_str) != Some("null")).cloned().collect();
            if let [Value::Object(one)] = kept.as_slice() {
                let one = one.clone();
                prop.remove("anyOf");
                for (k, v) in one {
                    prop.entry(k).or_insert(v);
                }
            }
        }
        match name.as_str() {
            "timeout_s" => {
                prop.insert("default".into(), Value::from(0));
                prop.insert("minimum".into(), Value::from(0));
            }
            "overwrite" => {
                prop.insert("default".into(), Value::from(false));
            }
            _ => {}
        }
    }
}

fn status_name(s: Status) -> &'static str {
    match s {
        Status::Ok => "ok",
        Status::Error => "error",
        Status::Timeout => "timeout",
        Status::Oom => "oom",
        Status::Killed => "killed",
    }
}

impl SandboxMcp {
    /// The tool server over `backend`; `default` is the daemon's default policy,
    /// whose limits the tool descriptions state.
    pub fn new(backend: Backend, default: Option<&PolicyLimits>) -> SandboxMcp {
        let mut tool_router = Self::tool_router();
        for (name, text) in descriptions(default) {
            if let Some(route) = tool_router.map.get_mut(name) {
                route.attr.description = Some(text.into());
            }
        }
        for route in tool_router.map.values_mut() {
            let mut schema = (*route.attr.input_schema).clone();
            plain_schema(&mut schema);
            route.attr.input_schema = std::sync::Arc::new(schema);
        }
        SandboxMcp { backend, tool_router }
    }

    /// This call's way to the daemon. Over HTTP the caller is who the API's auth
    /// layer found for the request; over stdio, the client's token speaks.
    fn call(&self, ctx: &RequestContext<RoleServer>) -> Result<Call<'_>, Failure> {
        let caller = match &self.backend {
            Backend::Remote(_) => Caller { owner: None },
            Backend::Local(_) => ctx
                .extensions
                .get::<axum::http::request::Parts>()
                .and_then(|p| p.extensions.get::<Caller>())
                .cloned()
                .ok_or_else(|| Failure::Api {
                    code: "unauthorized".into(),
                    message: "the request carries no caller: send `Authorization: Bearer <token>` to /mcp".into(),
                })?,
        };
        Ok(Call { backend: &self.backend, caller })
    }

    async fn run(
        &self,
        ctx: RequestContext<RoleServer>,
        language: Language,
        code: String,
        session_id: Option<String>,
        timeout_s: Option<f64>,
    ) -> CallToolResult {
        let call = match self.call(&ctx) {
            Ok(c) => c,
            Err(e) => return failure(e),
        };
        if let Some(Err(e)) = session_id.as_deref().map(session_arg) {
            return failure(e);
        }
        let sid = match call.session_or_new(session_id).await {
            Ok(s) => s,
            Err(e) => return failure(e),
        };
        // 0, the schema's default, is the session policy's limit.
        let timeout_s = timeout_s.filter(|t| *t != 0.0);
        let req = RunRequest { code, session_id: Some(sid.clone()), language, timeout_s, ..RunRequest::default() };
        let request = call.run(req);
        tokio::pin!(request);
        let progress = ctx.meta.get_progress_token();
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let result = loop {
            tokio::select! {
                r = &mut request => break r,
                _ = ctx.ct.cancelled() => {
                    // The client gave up: stop the run so nothing is left running.
                    let _ = call.cancel_run(&sid).await;
                    return CallToolResult::error(vec![ContentBlock::text(format!("error cancelled: the run in session {sid} was stopped"))]);
                }
                _ = tick.tick() => {
                    if let Some(token) = &progress {
                        let secs = started.elapsed().as_secs_f64().floor();
                        let note = ProgressNotificationParam::new(token.clone(), secs).with_message(format!("running for {secs} s"));
                        let _ = ctx.peer.notify_progress(note).await;
                    }
                }
            }
        };
        match result {
            Ok(r) => {
                let mut text = describe_run(&r);
                let (images, left_out) = images(&call, &r, image_budget(&text, &r)).await;
                for line in left_out {
                    text.push_str(&format!("note: image {line}\n"));
                }
                let mut content = vec![ContentBlock::text(text)];
                content.extend(images);
                if r.status == Status::Ok {
                    CallToolResult::success(content)
                } else {
                    CallToolResult::error(content)
                }
            }
            Err(e) => failure(e),
        }
    }
}

/// Bytes of base64 image data a run's result can carry: [`MAX_RESULT_BYTES`] less
/// its text (as JSON) and room for a note on each image that could be left out.
fn image_budget(text: &str, run: &RunResult) -> usize {
    let json_len = |s: &str| serde_json::to_string(s).map(|j| j.len()).unwrap_or(s.len() * 6);
    let notes: usize = run
        .artifacts
        .iter()
        .filter(|a| is_image(&a.mime_type))
        .map(|a| json_len(&a.path) + json_len(&a.url) + 256)
        .sum();
    MAX_RESULT_BYTES.saturating_sub(json_len(text) + notes + 4096)
}

fn is_image(mime: &str) -> bool {
    matches!(mime, "image/png" | "image/jpeg")
}

/// This run's images, downscaled so that together they fit `budget` bytes of
/// base64 (each image gets an equal share of what is left), and a line of text
/// for each image left out, saying why and where to fetch it.
async fn images(call: &Call<'_>, run: &RunResult, budget: usize) -> (Vec<ContentBlock>, Vec<String>) {
    let mut arts: Vec<_> = run.artifacts.iter().filter(|a| is_image(&a.mime_type)).collect();
    // Auto-saved figures first, then images the code saved itself.
    arts.sort_by_key(|a| a.kind != ArtifactKind::Figure);
    let mut out = vec![];
    let mut left_out = vec![];
    let mut remaining = budget;
    let shown = arts.len().min(MAX_IMAGES);
    for (i, a) in arts.iter().enumerate() {
        let (path, url) = (&a.path, &a.url);
        let fetch = format!("download it from {url} (or read_file with path {path:?})");
        if i >= MAX_IMAGES {
            left_out.push(format!(
                "{path}: not shown (more than {MAX_IMAGES} images: a result shows the first {MAX_IMAGES}); {fetch}"
            ));
            continue;
        }
        // The listed size is checked first, and the read is bounded anyway (the
        // file may have grown since it was listed).
        let read = if a.size_bytes > MAX_SOURCE_IMAGE_BYTES as u64 {
            Err(Failure::TooLarge(MAX_SOURCE_IMAGE_BYTES as u64))
        } else {
            call.read_file(&run.session_id, path, MAX_SOURCE_IMAGE_BYTES as u64).await
        };
        let bytes = match read {
            Ok(b) => b,
            Err(Failure::TooLarge(limit)) => {
                left_out.push(format!("{path}: larger than {limit} bytes, not shown; {fetch}"));
                continue;
            }
            Err(e) => {
                left_out.push(format!("{path}: not shown ({e}); {fetch}"));
                continue;
            }
        };
        // base64 makes 4 bytes of 3: this image's share of the budget, raw.
        let share = (remaining / (shown - i)) / 4 * 3;
        let max_bytes = share.min(MAX_IMAGE_BYTES);
        match fit_image_off_runtime(bytes, a.mime_type.clone(), max_bytes).await {
            Ok((data, mime)) => {
                let encoded = base64::engine::general_purpose::STANDARD.encode(&data);
                remaining = remaining.saturating_sub(encoded.len());
                out.push(ContentBlock::image(encoded, mime));
            }
            Err(Unfit::Unreadable) => {
                left_out.push(format!("{path}: not a readable image within the decoding limits, not shown; {fetch}"))
            }
            Err(Unfit::TooLarge) => left_out.push(format!(
                "{path}: still more than {} KiB after downscaling to {} px (this result's share for it), not shown; {fetch}",
                max_bytes / 1024,
                IMAGE_SIDES[IMAGE_SIDES.len() - 1]
            )),
        }
    }
    (out, left_out)
}

/// The run result as text a model reads well.
pub fn describe_run(r: &RunResult) -> String {
    let mut s = format!(
        "status: {}{}\nsession_id: {}\nduration_ms: {}\n",
        status_name(r.status),
        match (r.exit_code, &r.signal) {
            (Some(c), _) => format!(" (exit code {c})"),
            (None, Some(sig)) => format!(" (signal {sig})"),
            _ => String::new(),
        },
        r.session_id,
        r.duration_ms,
    );
    match r.status {
        Status::Timeout => {
            s.push_str("note: the run hit its time limit; shorten the work or pass a larger timeout_s\n")
        }
        Status::Oom => s.push_str("note: the run ran out of memory; use less data at once\n"),
        _ => {}
    }
    for (name, text, truncated) in
        [("stdout", &r.stdout, r.stdout_truncated), ("stderr", &r.stderr, r.stderr_truncated)]
    {
        if !text.is_empty() {
            s.push_str(&format!("--- {name}{} ---\n{text}", if truncated { " (truncated)" } else { "" }));
            if !text.ends_with('\n') {
                s.push('\n');
            }
        }
    }
    let kernel = r.kernel.as_ref();
    if let Some(text) = kernel.and_then(|k| k.result.as_ref()).and_then(|v| v["text/plain"].as_str()) {
        s.push_str(&format!("--- result ---\n{text}\n"));
    }
    if kernel.is_some_and(|k| k.kernel_restarted) {
        s.push_str("note: the kernel was restarted: variables from earlier runs are gone\n");
    }
    if !r.artifacts.is_empty() {
        s.push_str("--- files created or changed (in the session's working directory) ---\n");
        for a in &r.artifacts {
            s.push_str(&format!(
                "{} ({}, {} bytes{}) {}\n",
                a.path,
                a.mime_type,
                a.size_bytes,
                if a.kind == ArtifactKind::Figure { ", figure" } else { "" },
                a.url
            ));
        }
        if r.artifacts_truncated {
            s.push_str("(more files changed than listed; see list_files)\n");
        }
    }
    s
}

/// Why an image could not be shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfit {
    /// Not an image the decoder reads within its limits.
    Unreadable,
    /// Larger than its byte bound even at the smallest side tried.
    TooLarge,
}

/// Images decoded at once: each may use up to [`MAX_DECODE_ALLOC`] and seconds of CPU.
static DECODES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// [`fit_image_within`] on a blocking thread, at most [`DECODES`] at a time, so
/// that figures being decoded never stall the daemon's other requests.
async fn fit_image_off_runtime(bytes: Vec<u8>, mime: String, max_bytes: usize) -> Result<(Vec<u8>, String), Unfit> {
    let _permit = DECODES.acquire().await.map_err(|_| Unfit::Unreadable)?;
    tokio::task::spawn_blocking(move || fit_image_within(&bytes, &mime, max_bytes))
        .await
        .unwrap_or(Err(Unfit::Unreadable))
}

/// [`fit_image_within`] the bound of one image ([`MAX_IMAGE_BYTES`]).
pub fn fit_image(bytes: &[u8], mime: &str) -> Option<(Vec<u8>, String)> {
    fit_image_within(bytes, mime, MAX_IMAGE_BYTES).ok()
}

/// Below this share an image is left out rather than squeezed (a 384-px JPEG of a
/// plot needs more).
const MIN_FIT_BYTES: usize = 16 * 1024;

/// Make an image fit `max_bytes` and [`MAX_IMAGE_SIDE`]: as it is when it does,
/// else downscaled to each of [`IMAGE_SIDES`] in turn and re-encoded (PNG, or
/// JPEG if PNG is too big) until it fits.
pub fn fit_image_within(bytes: &[u8], mime: &str, max_bytes: usize) -> Result<(Vec<u8>, String), Unfit> {
    use image::ImageReader;
    let unreadable = |_| Unfit::Unreadable;
    let reader = ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format().map_err(unreadable)?;
    let (w, h) = reader.into_dimensions().map_err(|_| Unfit::Unreadable)?;
    if bytes.len() <= max_bytes && w <= MAX_IMAGE_SIDE && h <= MAX_IMAGE_SIDE {
        return Ok((bytes.to_vec(), mime.to_string()));
    }
    // A small file may claim a huge picture (a decompression bomb): refused by size
    // before anything is decoded, and the decoder is held to the same limits.
    if w > MAX_DECODED_SIDE || h > MAX_DECODED_SIDE || u64::from(w) * u64::from(h) * 4 > MAX_DECODE_ALLOC {
        return Err(Unfit::Unreadable);
    }
    // A share too small for any useful picture is not worth a decode and ten
    // encodes (the text says the image was left out, and where it is).
    if max_bytes < MIN_FIT_BYTES {
        return Err(Unfit::TooLarge);
    }
    let mut reader = ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format().map_err(unreadable)?;
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_DECODED_SIDE);
    limits.max_image_height = Some(MAX_DECODED_SIDE);
    limits.max_alloc = Some(MAX_DECODE_ALLOC);
    reader.limits(limits);
    // Each smaller size is made from the one before (cheaper than from the full picture).
    let mut img = reader.decode().map_err(|_| Unfit::Unreadable)?;
    for side in IMAGE_SIDES {
        if img.width() > side || img.height() > side {
            img = img.thumbnail(side, side);
        }
        let mut png = vec![];
        img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).map_err(|_| Unfit::Unreadable)?;
        if png.len() <= max_bytes {
            return Ok((png, "image/png".into()));
        }
        let mut jpeg = vec![];
        let rgb = image::DynamicImage::ImageRgb8(img.to_rgb8());
        rgb.write_to(&mut std::io::Cursor::new(&mut jpeg), image::ImageFormat::Jpeg).map_err(|_| Unfit::Unreadable)?;
        if jpeg.len() <= max_bytes {
            return Ok((jpeg, "image/jpeg".into()));
        }
    }
    Err(Unfit::TooLarge)
}

#[tool_router]
impl SandboxMcp {
    // Descriptions here are replaced at start by [`descriptions`], which states the
    // loaded default policy's limits.
    #[tool(
        description = "Run Python 3.11 code in a fresh, isolated Linux sandbox (no network).",
        annotations(
            title = "Run Python",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn run_python(
        &self,
        Parameters(p): Parameters<RunPython>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        Ok(self.run(ctx, Language::Python, p.code, p.session_id, p.timeout_s).await)
    }

    #[tool(
        description = "Run a bash command in the same kind of isolated sandbox as run_python (no network).",
        annotations(
            title = "Run shell command",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn run_shell(
        &self,
        Parameters(p): Parameters<RunShell>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        Ok(self.run(ctx, Language::Shell, p.command, p.session_id, p.timeout_s).await)
    }

    #[tool(
        description = "Create a session: a workspace whose files persist across runs.",
        annotations(
            title = "Create session",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn create_session(
        &self,
        Parameters(p): Parameters<CreateSession>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let made = async {
            let mode = match p.mode.as_deref() {
                None => None,
                Some("script") => Some(Mode::Script),
                Some("kernel") => Some(Mode::Kernel),
                Some(other) => {
                    return Err(Failure::Api {
                        code: "invalid_request".into(),
                        message: format!("mode {other:?}: use \"script\" or \"kernel\""),
                    })
                }
            };
            let req = CreateSessionRequest { mode, policy: p.policy, ..CreateSessionRequest::default() };
            self.call(&ctx)?.create_session(req).await
        };
        Ok(match made.await {
            Ok(s) => CallToolResult::success(vec![ContentBlock::text(format!(
                "session_id: {}\nmode: {}\npolicy: {}\nttl_s: {}",
                s.id,
                if s.mode == Mode::Kernel { "kernel" } else { "script" },
                s.policy,
                s.ttl_s
            ))]),
            Err(e) => failure(e),
        })
    }

    #[tool(
        description = "List the open sessions (id, mode, policy, created and last used, busy).",
        annotations(
            title = "List sessions",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_sessions(&self, ctx: RequestContext<RoleServer>) -> Result<CallToolResult, rmcp::ErrorData> {
        let listed = async { self.call(&ctx)?.list_sessions().await };
        Ok(match listed.await {
            Ok(list) => CallToolResult::success(vec![ContentBlock::text(
                serde_json::to_string_pretty(&list).unwrap_or_default(),
            )]),
            Err(e) => failure(e),
        })
    }

    #[tool(
        description = "Close a session: stop its running code and delete its files. This cannot be undone.",
        annotations(
            title = "Close session",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn close_session(
        &self,
        Parameters(p): Parameters<SessionRef>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let closed = async { self.call(&ctx)?.close_session(session_arg(&p.session_id)?).await };
        Ok(match closed.await {
            Ok(_) => CallToolResult::success(vec![ContentBlock::text(format!("session {} closed", p.session_id))]),
            Err(e) => failure(e),
        })
    }

    #[tool(
        description = "Upload a file (base64) into a session's workspace so code can read it by its relative path.",
        annotations(
            title = "Upload file",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn upload_file(
        &self,
        Parameters(p): Parameters<UploadFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        if let Some(Err(e)) = p.session_id.as_deref().map(session_arg) {
            return Ok(failure(e));
        }
        let bytes = match base64::engine::general_purpose::STANDARD.decode(p.content_base64.trim()) {
            Ok(b) => b,
            Err(e) => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "error invalid_request: content_base64 is not valid base64 ({e}); encode the file's bytes with standard base64"
                ))]))
            }
        };
        let uploaded = async {
            let call = self.call(&ctx)?;
            let sid = call.session_or_new(p.session_id).await?;
            let f = call.upload(&sid, &p.path, p.overwrite.unwrap_or(false), bytes).await?;
            Ok::<_, Failure>((sid, f))
        };
        Ok(match uploaded.await {
            Ok((sid, f)) => CallToolResult::success(vec![ContentBlock::text(format!(
                "uploaded {} ({} bytes) to session {sid}",
                f.path, f.size_bytes
            ))]),
            Err(e) => failure(e),
        })
    }

    #[tool(
        description = "List every file in a session's workspace, recursively, with size, type and download URL.",
        annotations(
            title = "List files",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_files(
        &self,
        Parameters(p): Parameters<SessionRef>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let listed = async { self.call(&ctx)?.list_files(session_arg(&p.session_id)?).await };
        Ok(match listed.await {
            Ok(list) => CallToolResult::success(vec![ContentBlock::text(
                serde_json::to_string_pretty(&list).unwrap_or_default(),
            )]),
            Err(e) => failure(e),
        })
    }

    #[tool(
        description = "Read a file from a session's workspace: text files as text, PNG/JPEG images as images, other files as base64.",
        annotations(
            title = "Read file",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn read_file(
        &self,
        Parameters(p): Parameters<ReadFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let found = async {
            let call = self.call(&ctx)?;
            let sid = session_arg(&p.session_id)?;
            let limit = call.inline_limit(sid).await?;
            let entry = call.list_files(sid).await?.into_iter().find(|f| f.path == p.path);
            Ok::<_, Failure>((call, limit, entry))
        };
        let (call, limit, entry) = match found.await {
            Ok(v) => v,
            Err(e) => return Ok(failure(e)),
        };
        if let Some(f) = &entry {
            if f.size_bytes > limit {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "error artifact_too_large: {} is {} bytes, more than the {limit} bytes that can be inlined; download it from {} or read a part of it with run_python",
                    p.path, f.size_bytes, f.url
                ))]));
            }
        }
        // Bounded whatever the listing said: the file may have grown since.
        let bytes = match call.read_file(&p.session_id, &p.path, limit).await {
            Ok(b) => b,
            Err(Failure::TooLarge(_)) => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "error artifact_too_large: {} is more than the {limit} bytes that can be inlined; download it, or read a part of it with run_python",
                    p.path
                ))]))
            }
            Err(e) => return Ok(failure(e)),
        };
        let mime = entry.map(|f| f.mime_type).unwrap_or_else(|| "application/octet-stream".to_string());
        let block = if mime == "image/png" || mime == "image/jpeg" {
            match fit_image_off_runtime(bytes.clone(), mime.clone(), MAX_IMAGE_BYTES).await {
                Ok((data, m)) => ContentBlock::image(base64::engine::general_purpose::STANDARD.encode(&data), m),
                Err(_) => ContentBlock::text(base64::engine::general_purpose::STANDARD.encode(&bytes)),
            }
        } else {
            match std::str::from_utf8(&bytes) {
                Ok(text) => ContentBlock::text(text.to_string()),
                Err(_) => ContentBlock::text(format!(
                    "binary file {} ({mime}, {} bytes), base64:\n{}",
                    p.path,
                    bytes.len(),
                    base64::engine::general_purpose::STANDARD.encode(&bytes)
                )),
            }
        };
        Ok(CallToolResult::success(vec![block]))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(rmcp::model::Implementation::new("sandboxd", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "sandboxd runs Python and shell code in isolated, network-less Linux sandboxes. Use run_python for \
             analysis and plots; keep a session_id to reuse files between runs; upload inputs with upload_file \
             and fetch outputs with read_file.",
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_a_run_for_a_model() {
        let r: RunResult = serde_json::from_value(serde_json::json!({"run_id": "r", "status": "error", "exit_code": 1, "signal": null, "session_id": "s1", "duration_ms": 5,
            "stdout": "hi", "stderr": "boom\n", "stdout_truncated": false, "stderr_truncated": true,
            "artifacts": [{"path": "a.png", "mime_type": "image/png", "size_bytes": 3, "kind": "figure", "url": "http://x/a.png"}],
            "artifacts_truncated": false}))
        .unwrap();
        assert!(r.kernel.is_none());
        let text = describe_run(&r);
        assert!(text.starts_with("status: error (exit code 1)\nsession_id: s1\n"), "{text}");
        assert!(text.contains("--- stdout ---\nhi\n--- stderr (truncated) ---\nboom\n"), "{text}");
        assert!(text.contains("a.png (image/png, 3 bytes, figure) http://x/a.png"), "{text}");
    }

    #[test]
    fn big_images_are_downscaled() {
        let img = image::RgbImage::from_fn(4000, 3000, |x, y| {
            image::Rgb([(x % 251) as u8, (y % 241) as u8, ((x * y) % 239) as u8])
        });
        let mut png = vec![];
        image::DynamicImage::ImageRgb8(img)
            .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();
        let (out, _mime) = fit_image(&png, "image/png").unwrap();
        assert!(out.len() <= MAX_IMAGE_BYTES);
        let back = image::load_from_memory(&out).unwrap();
        assert!(back.width() <= MAX_IMAGE_SIDE && back.height() <= MAX_IMAGE_SIDE);
        assert!(fit_image(b"not an image", "image/png").is_none());
    }

    /// A PNG whose header claims `w` x `h` pixels, with no picture behind it.
    fn png_header_only(w: u32, h: u32) -> Vec<u8> {
        fn crc32(bytes: &[u8]) -> u32 {
            let mut crc = !0u32;
            for &b in bytes {
                crc ^= u32::from(b);
                for _ in 0..8 {
                    crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
                }
            }
            !crc
        }
        let mut ihdr = b"IHDR".to_vec();
        ihdr.extend(w.to_be_bytes());
        ihdr.extend(h.to_be_bytes());
        ihdr.extend([8, 6, 0, 0, 0]); // 8-bit RGBA
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        for chunk in [ihdr, b"IDAT".to_vec(), b"IEND".to_vec()] {
            png.extend(((chunk.len() - 4) as u32).to_be_bytes());
            png.extend(&chunk);
            png.extend(crc32(&chunk).to_be_bytes());
        }
        png
    }

    #[test]
    fn a_decompression_bomb_is_refused_before_decoding() {
        let bomb = png_header_only(100_000, 100_000);
        let reader = image::ImageReader::new(std::io::Cursor::new(&bomb)).with_guessed_format().unwrap();
        assert_eq!(reader.into_dimensions().unwrap(), (100_000, 100_000), "the header is read as a real one");
        assert!(fit_image(&bomb, "image/png").is_none());
        // Within each side's limit, but too much memory once decoded.
        assert!(fit_image(&png_header_only(16_000, 16_000), "image/png").is_none());
    }
}
