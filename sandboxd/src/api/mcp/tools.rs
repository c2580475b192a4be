//! The tools: their arguments (typed; optional ones declared as plain types with
//! defaults, see `render::plain_schema`) and what each does.

use super::call::{failure, session_arg, Failure};
use super::images::{fit_image_off_runtime, image_budget, images, MAX_IMAGE_BYTES};
use super::render::{describe_run, made_note};
use super::SandboxMcp;
use crate::model::run::{Language, RunRequest, Status};
use crate::model::session::{CreateSessionRequest, Mode};
use crate::service;
use base64::Engine;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam};
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_router, RoleServer};
use serde::Deserialize;
use std::time::{Duration, Instant};

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

#[tool_router(vis = "pub(super)")]
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
        let call = match self.call(&ctx) {
            Ok(c) => c,
            Err(e) => return Ok(failure(e)),
        };
        if let Some(Err(e)) = p.session_id.as_deref().map(session_arg) {
            return Ok(failure(e));
        }
        if let Err(e) = crate::workspace::validate(&p.path) {
            return Ok(failure(service::Error::from(e).into()));
        }
        let bytes = match base64::engine::general_purpose::STANDARD.decode(p.content_base64.trim()) {
            Ok(b) => b,
            Err(e) => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "error invalid_request: content_base64 is not valid base64 ({e}); encode the file's bytes with standard base64"
                ))]))
            }
        };
        let (sid, made) = match p.session_id {
            Some(id) => (id, None),
            None => {
                // Checked against the new session's policy first: a refused upload makes no session.
                let size = bytes.len() as u64;
                let fits = |policy: &crate::model::policy::Policy| match policy.upload_bytes() {
                    limit if size > limit => Err(service::Error::UploadTooLarge { limit }),
                    _ => Ok(()),
                };
                match call.new_session(fits).await {
                    Ok(info) => (info.id.clone(), Some(info)),
                    Err(e) => return Ok(failure(e)),
                }
            }
        };
        Ok(match call.upload(&sid, &p.path, p.overwrite.unwrap_or(false), bytes).await {
            Ok(f) => {
                let mut text = format!("uploaded {} ({} bytes) to session {sid}\n", f.path, f.size_bytes);
                text.push_str(&made.as_ref().map(made_note).unwrap_or_default());
                CallToolResult::success(vec![ContentBlock::text(text)])
            }
            Err(e) => {
                if let Some(made) = &made {
                    call.discard(made).await;
                }
                failure(e)
            }
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

impl SandboxMcp {
    /// A run of `code`, in `session_id` or in a session made for it (after the
    /// request passed the policy that session gets, so a refused run makes
    /// nothing; closed again if the run is refused or cancelled after all, and
    /// named in the result when it is kept).
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
        // 0, the schema's default, is the session policy's limit.
        let timeout_s = timeout_s.filter(|t| *t != 0.0);
        let mut req = RunRequest { code, session_id, language, timeout_s, ..RunRequest::default() };
        let (sid, made) = match req.session_id.clone() {
            Some(id) => (id, None),
            None => {
                match call.new_session(|policy| crate::run::validate(&req, policy).map(drop).map_err(Into::into)).await
                {
                    Ok(info) => (info.id.clone(), Some(info)),
                    Err(e) => return failure(e),
                }
            }
        };
        req.session_id = Some(sid.clone());
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
                    // The client gave up: stop the run so nothing is left running
                    // (closing a session made for it stops it too).
                    match &made {
                        Some(info) => call.discard(info).await,
                        None => drop(call.cancel_run(&sid).await),
                    }
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
                text.push_str(&made.as_ref().map(made_note).unwrap_or_default());
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
            Err(e) => {
                if let Some(info) = &made {
                    call.discard(info).await;
                }
                failure(e)
            }
        }
    }
}
