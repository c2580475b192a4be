//! MCP: sandboxd's tools for LLM clients (rmcp, the official Rust SDK).
//!
//! One tool server, [`SandboxMcp`], served two ways: over streamable HTTP at `/mcp`
//! on the daemon's HTTP listener, and over stdio by `sandboxctl mcp` (for clients
//! that start a command). Either way the tools talk to the daemon's own API (its
//! Unix socket, or `--url`), so they behave exactly as the API does, with the
//! caller's token. A failed tool call is a tool result with `isError` and the error
//! code, never a protocol error.

use crate::client::{Client, ClientError};
use base64::Engine;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_handler, tool_router, RoleServer, ServerHandler};
use serde::Deserialize;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Most images returned with one run, and their size after downscaling.
pub const MAX_IMAGES: usize = 4;
pub const MAX_IMAGE_BYTES: usize = 1024 * 1024;
pub const MAX_IMAGES_TOTAL: usize = 3 * 1024 * 1024;
/// Longest side of an image sent to a model.
pub const MAX_IMAGE_SIDE: u32 = 1568;
/// Largest image file read to be shown to a model (before downscaling). A run's
/// files are written by sandboxed code: a bigger one (even a sparse file that takes
/// no disk) is named in the text, never read.
pub const MAX_SOURCE_IMAGE_BYTES: usize = 32 * 1024 * 1024;
/// Largest width or height, and memory, an image may decode to.
const MAX_DECODED_SIDE: u32 = 16_384;
const MAX_DECODE_ALLOC: u64 = 256 * 1024 * 1024;

/// Where the tools send their API calls.
#[derive(Debug, Clone)]
pub struct Target {
    pub socket: PathBuf,
    pub url: Option<String>,
    /// A fixed token (stdio); over HTTP the caller's own bearer token is used.
    pub token: Option<String>,
}

#[derive(Clone)]
pub struct SandboxMcp {
    target: Target,
    tool_router: ToolRouter<Self>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RunPython {
    /// Python 3.11 source to run. numpy, pandas, scipy, scikit-learn, matplotlib, seaborn, pillow, openpyxl, pyarrow and reportlab are installed.
    pub code: String,
    /// Run in this session (its files persist between runs); omit to start a new session.
    pub session_id: Option<String>,
    /// Wall-clock limit in seconds (default and maximum: the session policy's, 60 s by default).
    pub timeout_s: Option<f64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RunShell {
    /// A bash command line, run in the session's workspace.
    pub command: String,
    /// Run in this session; omit to start a new session.
    pub session_id: Option<String>,
    /// Wall-clock limit in seconds.
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

fn failure(e: ClientError) -> CallToolResult {
    let text = match e {
        ClientError::Api { code, message, .. } => {
            let hint = match code.as_str() {
                "session_not_found" => " Next: call create_session, or omit session_id to start a new session.",
                "session_busy" => " Next: wait for that run to finish, or use another session.",
                "file_exists" => " Next: pass overwrite=true to replace it.",
                "invalid_path" => " Next: use a relative path such as data/input.csv.",
                _ => "",
            };
            format!("error {code}: {message}.{hint}").replace("..", ".")
        }
        other => format!("error unavailable: {other}"),
    };
    CallToolResult::error(vec![ContentBlock::text(text)])
}

fn url_path(path: &str) -> String {
    crate::artifacts::url_path(std::path::Path::new(path))
}

impl SandboxMcp {
    pub fn new(target: Target) -> SandboxMcp {
        SandboxMcp { target, tool_router: Self::tool_router() }
    }

    /// A client for this call: over HTTP, with the caller's own bearer token.
    fn client(&self, ctx: &RequestContext<RoleServer>) -> Client {
        let from_http = ctx
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.headers.get(axum::http::header::AUTHORIZATION))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|t| t.trim().to_string());
        Client::new(
            self.target.socket.clone(),
            self.target.url.clone(),
            from_http.or_else(|| self.target.token.clone()),
        )
    }

    async fn session_or_new(client: &Client, session_id: Option<String>) -> Result<String, ClientError> {
        match session_id {
            Some(id) => Ok(id),
            None => {
                let s = client.json("POST", "/v1/sessions", Some(json!({}))).await?;
                Ok(s["id"].as_str().unwrap_or_default().to_string())
            }
        }
    }

    async fn run(
        &self,
        ctx: RequestContext<RoleServer>,
        language: &str,
        code: String,
        session_id: Option<String>,
        timeout_s: Option<f64>,
    ) -> CallToolResult {
        let client = self.client(&ctx);
        let sid = match Self::session_or_new(&client, session_id).await {
            Ok(s) => s,
            Err(e) => return failure(e),
        };
        let mut body = json!({"code": code, "language": language});
        if let Some(t) = timeout_s {
            body["timeout_s"] = t.into();
        }
        let path = format!("/v1/sessions/{sid}/runs");
        let request = client.json("POST", &path, Some(body));
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
                    let _ = client.json("DELETE", &format!("/v1/sessions/{sid}/run"), None).await;
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
                let (images, left_out) = self.images(&client, &r).await;
                let mut text = describe_run(&r);
                for line in left_out {
                    text.push_str(&format!("note: image {line}\n"));
                }
                let mut content = vec![ContentBlock::text(text)];
                content.extend(images);
                let ok = r["status"] == "ok";
                if ok {
                    CallToolResult::success(content)
                } else {
                    CallToolResult::error(content)
                }
            }
            Err(e) => failure(e),
        }
    }

    /// This run's images, downscaled and bounded so a client's message limit holds,
    /// and a line of text for each image left out and why.
    async fn images(&self, client: &Client, run: &Value) -> (Vec<ContentBlock>, Vec<String>) {
        let sid = run["session_id"].as_str().unwrap_or_default();
        let mut arts: Vec<&Value> = run["artifacts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| matches!(a["mime_type"].as_str(), Some("image/png") | Some("image/jpeg")))
            .collect();
        // Auto-saved figures first, then images the code saved itself.
        arts.sort_by_key(|a| a["kind"] != "figure");
        let mut out = vec![];
        let mut left_out = vec![];
        let mut total = 0;
        let many = arts.len() > MAX_IMAGES;
        for a in arts.into_iter().take(MAX_IMAGES) {
            let Some(path) = a["path"].as_str() else { continue };
            let url = a["url"].as_str().unwrap_or_default();
            // The listed size is checked first, and the read is bounded anyway (the
            // file may have grown since it was listed).
            let size = a["size_bytes"].as_u64().unwrap_or(u64::MAX);
            let read = if size > MAX_SOURCE_IMAGE_BYTES as u64 {
                Err(ClientError::TooLarge(MAX_SOURCE_IMAGE_BYTES))
            } else {
                client
                    .bytes_limited(&format!("/v1/sessions/{sid}/files/{}", url_path(path)), MAX_SOURCE_IMAGE_BYTES)
                    .await
            };
            let bytes = match read {
                Ok(b) => b,
                Err(ClientError::TooLarge(limit)) => {
                    left_out.push(format!("{path}: larger than {limit} bytes, not shown; download it from {url}"));
                    continue;
                }
                Err(e) => {
                    left_out.push(format!("{path}: not shown ({e})"));
                    continue;
                }
            };
            let Some((data, mime)) = fit_image(&bytes, a["mime_type"].as_str().unwrap_or("image/png")) else {
                left_out
                    .push(format!("{path}: not a readable image within the decoding limits; download it from {url}"));
                continue;
            };
            if total + data.len() > MAX_IMAGES_TOTAL {
                left_out.push(format!("{path}: over this result's image budget, not shown; download it from {url}"));
                continue;
            }
            total += data.len();
            out.push(ContentBlock::image(base64::engine::general_purpose::STANDARD.encode(&data), mime));
        }
        if many {
            left_out.push(format!(
                "more than {MAX_IMAGES} images: only the first {MAX_IMAGES} are considered; see list_files"
            ));
        }
        (out, left_out)
    }
}

/// The run result as text a model reads well.
pub fn describe_run(r: &Value) -> String {
    let mut s = format!(
        "status: {}{}\nsession_id: {}\nduration_ms: {}\n",
        r["status"].as_str().unwrap_or("?"),
        match (r["exit_code"].as_i64(), r["signal"].as_str()) {
            (Some(c), _) => format!(" (exit code {c})"),
            (None, Some(sig)) => format!(" (signal {sig})"),
            _ => String::new(),
        },
        r["session_id"].as_str().unwrap_or(""),
        r["duration_ms"],
    );
    match r["status"].as_str() {
        Some("timeout") => {
            s.push_str("note: the run hit its time limit; shorten the work or pass a larger timeout_s\n")
        }
        Some("oom") => s.push_str("note: the run ran out of memory; use less data at once\n"),
        _ => {}
    }
    for (name, flag) in [("stdout", "stdout_truncated"), ("stderr", "stderr_truncated")] {
        let text = r[name].as_str().unwrap_or("");
        if !text.is_empty() {
            s.push_str(&format!("--- {name}{} ---\n{text}", if r[flag] == true { " (truncated)" } else { "" }));
            if !text.ends_with('\n') {
                s.push('\n');
            }
        }
    }
    if let Some(text) = r["result"]["text/plain"].as_str() {
        s.push_str(&format!("--- result ---\n{text}\n"));
    }
    if r["kernel_restarted"] == true {
        s.push_str("note: the kernel was restarted: variables from earlier runs are gone\n");
    }
    let arts = r["artifacts"].as_array().cloned().unwrap_or_default();
    if !arts.is_empty() {
        s.push_str("--- files created or changed (in the session's working directory) ---\n");
        for a in &arts {
            s.push_str(&format!(
                "{} ({}, {} bytes{}) {}\n",
                a["path"].as_str().unwrap_or(""),
                a["mime_type"].as_str().unwrap_or(""),
                a["size_bytes"],
                if a["kind"] == "figure" { ", figure" } else { "" },
                a["url"].as_str().unwrap_or("")
            ));
        }
        if r["artifacts_truncated"] == true {
            s.push_str("(more files changed than listed; see list_files)\n");
        }
    }
    s
}

/// Make an image fit the bounds: as it is when small enough, else downscaled to
/// MAX_IMAGE_SIDE and re-encoded (PNG, or JPEG if PNG is still too big).
pub fn fit_image(bytes: &[u8], mime: &str) -> Option<(Vec<u8>, String)> {
    use image::ImageReader;
    let reader = ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format().ok()?;
    let (w, h) = reader.into_dimensions().ok()?;
    if bytes.len() <= MAX_IMAGE_BYTES && w <= MAX_IMAGE_SIDE && h <= MAX_IMAGE_SIDE {
        return Some((bytes.to_vec(), mime.to_string()));
    }
    // A small file may claim a huge picture (a decompression bomb): refused by size
    // before anything is decoded, and the decoder is held to the same limits.
    if w > MAX_DECODED_SIDE || h > MAX_DECODED_SIDE || u64::from(w) * u64::from(h) * 4 > MAX_DECODE_ALLOC {
        return None;
    }
    let mut reader = ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format().ok()?;
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_DECODED_SIDE);
    limits.max_image_height = Some(MAX_DECODED_SIDE);
    limits.max_alloc = Some(MAX_DECODE_ALLOC);
    reader.limits(limits);
    let img = reader.decode().ok()?;
    let img =
        if w > MAX_IMAGE_SIDE || h > MAX_IMAGE_SIDE { img.thumbnail(MAX_IMAGE_SIDE, MAX_IMAGE_SIDE) } else { img };
    let mut png = vec![];
    img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).ok()?;
    if png.len() <= MAX_IMAGE_BYTES {
        return Some((png, "image/png".into()));
    }
    let mut jpeg = vec![];
    let rgb = image::DynamicImage::ImageRgb8(img.to_rgb8());
    rgb.write_to(&mut std::io::Cursor::new(&mut jpeg), image::ImageFormat::Jpeg).ok()?;
    (jpeg.len() <= MAX_IMAGE_BYTES).then(|| (jpeg, "image/jpeg".into()))
}

#[tool_router]
impl SandboxMcp {
    #[tool(
        description = "Run Python 3.11 code in a fresh, isolated Linux sandbox (no network) and return its status, exit code, stdout, stderr and the files it created or changed. The working directory is the session's workspace: files persist between runs of the same session (pass session_id; omit it to start a new session, whose id is returned). numpy, pandas, scipy, scikit-learn, matplotlib, seaborn, pillow, openpyxl, pyarrow and reportlab are installed. Open matplotlib figures are saved automatically and returned as images; plt.show() saves instead of blocking. Limits per run (default policy): 60 s, 512 MiB memory, 1 CPU, 100 KiB of output per stream.",
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
        Ok(self.run(ctx, "python", p.code, p.session_id, p.timeout_s).await)
    }

    #[tool(
        description = "Run a bash command in the same kind of isolated sandbox as run_python (no network), in the session's workspace, and return status, exit code, stdout, stderr and changed files. Useful for ls, head, wc, or running a script written by run_python.",
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
        Ok(self.run(ctx, "shell", p.command, p.session_id, p.timeout_s).await)
    }

    #[tool(
        description = "Create a session: a workspace whose files persist across runs until it is closed or idle for 30 minutes. Returns the session_id to pass to the other tools.",
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
        let mut body = json!({});
        if let Some(m) = p.mode {
            body["mode"] = m.into();
        }
        if let Some(pol) = p.policy {
            body["policy"] = pol.into();
        }
        Ok(match self.client(&ctx).json("POST", "/v1/sessions", Some(body)).await {
            Ok(s) => CallToolResult::success(vec![ContentBlock::text(format!(
                "session_id: {}\nmode: {}\npolicy: {}",
                s["id"].as_str().unwrap_or(""),
                s["mode"].as_str().unwrap_or(""),
                s["policy"].as_str().unwrap_or("")
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
        Ok(match self.client(&ctx).json("GET", "/v1/sessions", None).await {
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
        Ok(match self.client(&ctx).json("DELETE", &format!("/v1/sessions/{}", p.session_id), None).await {
            Ok(_) => CallToolResult::success(vec![ContentBlock::text(format!("session {} closed", p.session_id))]),
            Err(e) => failure(e),
        })
    }

    #[tool(
        description = "Upload a file (base64) into a session's workspace so code can read it by its relative path. Omit session_id to start a new session. Up to 50 MiB by default.",
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
        let bytes = match base64::engine::general_purpose::STANDARD.decode(p.content_base64.trim()) {
            Ok(b) => b,
            Err(e) => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "error invalid_request: content_base64 is not valid base64 ({e}); encode the file's bytes with standard base64"
                ))]))
            }
        };
        let client = self.client(&ctx);
        let sid = match Self::session_or_new(&client, p.session_id).await {
            Ok(s) => s,
            Err(e) => return Ok(failure(e)),
        };
        let query = if p.overwrite.unwrap_or(false) { "?overwrite=true" } else { "" };
        Ok(
            match client.json_raw("PUT", &format!("/v1/sessions/{sid}/files/{}{query}", url_path(&p.path)), bytes).await
            {
                Ok(f) => CallToolResult::success(vec![ContentBlock::text(format!(
                    "uploaded {} ({} bytes) to session {sid}",
                    f["path"].as_str().unwrap_or(""),
                    f["size_bytes"]
                ))]),
                Err(e) => failure(e),
            },
        )
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
        Ok(match self.client(&ctx).json("GET", &format!("/v1/sessions/{}/files", p.session_id), None).await {
            Ok(list) => CallToolResult::success(vec![ContentBlock::text(
                serde_json::to_string_pretty(&list).unwrap_or_default(),
            )]),
            Err(e) => failure(e),
        })
    }

    #[tool(
        description = "Read a file from a session's workspace: text files as text, PNG/JPEG images as images, other files as base64. Files larger than the policy's inline limit (10 MiB by default) are refused; use their download URL instead.",
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
        let client = self.client(&ctx);
        let limit = match inline_limit(&client, &p.session_id).await {
            Ok(l) => l,
            Err(e) => return Ok(failure(e)),
        };
        let listing = match client.json("GET", &format!("/v1/sessions/{}/files", p.session_id), None).await {
            Ok(l) => l,
            Err(e) => return Ok(failure(e)),
        };
        let entry = listing.as_array().into_iter().flatten().find(|f| f["path"] == p.path.as_str()).cloned();
        if let Some(f) = &entry {
            let size = f["size_bytes"].as_u64().unwrap_or(0);
            if size > limit {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "error artifact_too_large: {} is {size} bytes, more than the {limit} bytes that can be inlined; download it from {} or read a part of it with run_python",
                    p.path,
                    f["url"].as_str().unwrap_or("")
                ))]));
            }
        }
        // Bounded whatever the listing said: the file may have grown since.
        let path = format!("/v1/sessions/{}/files/{}", p.session_id, url_path(&p.path));
        let bytes = match client.bytes_limited(&path, usize::try_from(limit).unwrap_or(usize::MAX)).await {
            Ok(b) => b,
            Err(ClientError::TooLarge(_)) => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "error artifact_too_large: {} is more than the {limit} bytes that can be inlined; download it, or read a part of it with run_python",
                    p.path
                ))]))
            }
            Err(e) => return Ok(failure(e)),
        };
        let mime =
            entry.as_ref().and_then(|f| f["mime_type"].as_str()).unwrap_or("application/octet-stream").to_string();
        let block = if mime == "image/png" || mime == "image/jpeg" {
            match fit_image(&bytes, &mime) {
                Some((data, m)) => ContentBlock::image(base64::engine::general_purpose::STANDARD.encode(&data), m),
                None => ContentBlock::text(base64::engine::general_purpose::STANDARD.encode(&bytes)),
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

/// The session policy's limit for inlining file content, in bytes.
async fn inline_limit(client: &Client, session_id: &str) -> Result<u64, ClientError> {
    let session = client.json("GET", &format!("/v1/sessions/{session_id}"), None).await?;
    let policies = client.json("GET", "/v1/policies", None).await?;
    let mb = policies
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == session["policy"])
        .and_then(|p| p["mcp_inline_mb"].as_u64())
        .unwrap_or(10);
    Ok(mb * 1024 * 1024)
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
        let r = json!({"status": "error", "exit_code": 1, "signal": null, "session_id": "s1", "duration_ms": 5,
            "stdout": "hi", "stderr": "boom\n", "stdout_truncated": false, "stderr_truncated": true,
            "artifacts": [{"path": "a.png", "mime_type": "image/png", "size_bytes": 3, "kind": "figure", "url": "http://x/a.png"}],
            "artifacts_truncated": false});
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
