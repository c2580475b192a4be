//! MCP: sandboxd's tools for LLM clients (rmcp, the official Rust SDK), served
//! over streamable HTTP at `/mcp` on both listeners (HTTP and the Unix socket;
//! `sandboxctl mcp` bridges stdio clients to it, [`crate::bridge`]).
//!
//! [`SandboxMcp`] is an adapter over the tool registry ([`crate::tools`]):
//! `tools/list` lists the registry's tools and `tools/call` calls them, as the
//! caller the API's auth layer found for the request, with the request's
//! cancellation and progress token. A failed tool call is a tool result with
//! `isError` and the error code, never a protocol error; an unknown tool's name
//! is a protocol error (invalid params), as in rmcp's own router.
//!
//! [`protocol`] holds the protocol sessions of `/mcp`: bounded, bound to their token.

pub mod protocol;

use crate::service::Caller;
use crate::tools::{Hints, Part, Registry, Spec, ToolOutput, Watch};
use base64::Engine;
pub use protocol::SessionLimits;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use std::sync::Arc;

/// What every `/mcp` service of the daemon shares: the tools, the protocol
/// sessions' places and rmcp's session manager (reaped by one task).
pub struct McpState {
    pub tools: Arc<Registry>,
    pub sessions: Arc<protocol::Registry>,
    pub manager: Arc<protocol::Bound>,
}

impl McpState {
    /// Made once; starts [`protocol::reap`] on the current runtime, until `shutdown`.
    pub fn new(
        service: &Arc<dyn crate::service::Operations>,
        limits: SessionLimits,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> McpState {
        let default = service.policy(None).map(|p| crate::model::policy::PolicyLimits::from(&*p)).ok();
        let tools = Arc::new(Registry::new(service.clone(), default.as_ref()));
        let sessions = protocol::Registry::new(limits);
        let manager = protocol::Bound::new(sessions.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(protocol::reap(sessions.clone(), manager.sessions(), shutdown.child_token()));
        }
        McpState { tools, sessions, manager: Arc::new(manager) }
    }
}

#[derive(Clone)]
pub struct SandboxMcp {
    tools: Arc<Registry>,
    /// The tools as MCP lists them, made once.
    listed: Arc<Vec<Tool>>,
}

impl SandboxMcp {
    pub fn new(tools: Arc<Registry>) -> SandboxMcp {
        let listed = tools.specs().iter().map(tool).collect();
        SandboxMcp { tools, listed: Arc::new(listed) }
    }
}

/// A registry tool as MCP lists it.
pub(crate) fn tool(spec: &Spec) -> Tool {
    let Hints { read_only, destructive, idempotent, open_world } = spec.hints;
    let annotations = ToolAnnotations::from_raw(
        Some(spec.title.to_string()),
        Some(read_only),
        Some(destructive),
        Some(idempotent),
        Some(open_world),
    );
    Tool::new(spec.name, spec.description.clone(), Arc::new(spec.input_schema.clone())).annotate(annotations)
}

/// A registry result as MCP content (images in base64).
pub(crate) fn result(out: ToolOutput) -> CallToolResult {
    let content = out
        .parts
        .into_iter()
        .map(|p| match p {
            Part::Text(t) => ContentBlock::text(t),
            Part::Image { mime, data, .. } => {
                ContentBlock::image(base64::engine::general_purpose::STANDARD.encode(&data), mime)
            }
        })
        .collect();
    if out.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    }
}

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

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items((*self.listed).clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.listed.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // The caller the API's auth layer found for this request.
        let caller =
            ctx.extensions.get::<axum::http::request::Parts>().and_then(|p| p.extensions.get::<Caller>()).cloned();
        let Some(caller) = caller else {
            return Ok(CallToolResult::error(vec![ContentBlock::text(
                "error unauthorized: the request carries no caller: send `Authorization: Bearer <token>` to /mcp",
            )])
            .into());
        };
        let progress = ctx.meta.get_progress_token().map(|token| {
            let peer = ctx.peer.clone();
            let report: crate::tools::Progress = Arc::new(move |secs, message| {
                let (peer, note) =
                    (peer.clone(), ProgressNotificationParam::new(token.clone(), secs).with_message(message));
                Box::pin(async move {
                    let _ = peer.notify_progress(note).await;
                })
            });
            report
        });
        let watch = Watch { cancelled: ctx.ct.clone(), progress };
        let args = request.arguments.map(serde_json::Value::Object).unwrap_or(serde_json::Value::Null);
        match self.tools.call_watched(&caller, &request.name, args, &watch).await {
            Ok(out) => Ok(result(out).into()),
            Err(unknown) => Err(ErrorData::invalid_params(unknown.to_string(), None)),
        }
    }
}
