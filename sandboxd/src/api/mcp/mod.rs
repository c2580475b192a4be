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
//! is touched, and a call that would make a session (a run or an upload without
//! `session_id`) is checked against the policy first, so a refused call makes
//! nothing. A failed tool call is a tool result with `isError` and the error
//! code, never a protocol error. Tool descriptions state the limits of the
//! daemon's default policy, read when the server starts.
//!
//! By role: [`tools`] (the tools and their arguments), `call` (one call's way to
//! either backend, and its failures), `render` (what a model reads: run results,
//! descriptions, schemas), [`images`] (figures fitted to a result) and
//! [`protocol`] (the protocol sessions of `/mcp`: bounded, bound to their token).

mod call;
pub mod images;
pub mod protocol;
mod render;
pub mod tools;

use crate::client::Client;
use crate::model::policy::PolicyLimits;
use crate::service::{Caller, Operations};
use call::{Call, Failure};
pub use images::{fit_image, fit_image_within, Unfit, MAX_IMAGES, MAX_IMAGE_BYTES, MAX_IMAGE_SIDE, MAX_RESULT_BYTES};
pub use protocol::SessionLimits;
pub use render::describe_run;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool_handler, RoleServer, ServerHandler};
use std::sync::Arc;

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

impl SandboxMcp {
    /// The tool server over `backend`; `default` is the daemon's default policy,
    /// whose limits the tool descriptions state.
    pub fn new(backend: Backend, default: Option<&PolicyLimits>) -> SandboxMcp {
        let mut tool_router = Self::tool_router();
        for (name, text) in render::descriptions(default) {
            if let Some(route) = tool_router.map.get_mut(name) {
                route.attr.description = Some(text.into());
            }
        }
        for route in tool_router.map.values_mut() {
            let mut schema = (*route.attr.input_schema).clone();
            render::plain_schema(&mut schema);
            route.attr.input_schema = Arc::new(schema);
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
