//! The tool registry: every tool a model can call, defined once. MCP (`api/mcp/`)
//! lists and calls them from here, and so will every other surface that offers
//! tools (tool formats over HTTP, a chat): each is an adapter over [`Registry`].
//!
//! A tool is one entry of [`TOOLS`]: its name, title and hints, its description
//! (stating the limits of the daemon's loaded default policy), its arguments (a
//! typed struct in `args.rs`, whose JSON schema is made plain by
//! `render::plain_schema`) and the function that calls the service's
//! [`Operations`] and renders what it got as a [`ToolOutput`]: format-neutral
//! text and image parts and an is-error flag. Adding a tool touches only this
//! module.
//!
//! Arguments are checked as typed values first: an argument a tool does not
//! declare, a missing one or one of the wrong type is an error result naming it;
//! a `session_id` that is not a session id is refused with `invalid_session_id`
//! before anything is touched; a call that would make a session (a run or an
//! upload without `session_id`) is checked against the policy first, so a refused
//! call makes nothing. A failed call is an error result the model can act on
//! (`error <code>: <message>. Next: ...`), never a transport error.
//!
//! By role: `args` (the arguments), `calls` (what each tool does), `failure`
//! (errors as a model reads them), `render` (run results, descriptions,
//! schemas) and [`images`] (figures fitted to a result).

mod args;
mod calls;
mod failure;
mod fit;
mod given;
pub mod images;
mod render;
#[cfg(test)]
mod tests;

use crate::model::policy::PolicyLimits;
use crate::service::{Caller, Operations};
pub use failure::next_step;
use futures_util::future::BoxFuture;
pub use given::{arguments, error_output, llm_schema, no_such_tool};
pub use images::{fit_image, fit_image_within, Unfit, MAX_IMAGES, MAX_IMAGE_BYTES, MAX_IMAGE_SIDE, MAX_RESULT_BYTES};
pub use render::describe_run;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// What a tool is, as a client lists it.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: &'static str,
    /// A human-readable title.
    pub title: &'static str,
    /// What it does, with the default policy's limits.
    pub description: String,
    /// The JSON schema of its arguments (an object).
    pub input_schema: Map<String, Value>,
    pub hints: Hints,
}

/// What a tool does to its world, as MCP's tool annotations say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hints {
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
    pub open_world: bool,
}

/// One part of a tool's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Text(String),
    /// An image's bytes (a transport encodes them as it needs, e.g. base64), and
    /// the workspace file it was read from (a figure a run made, a file read).
    Image {
        mime: String,
        data: Vec<u8>,
        path: Option<String>,
    },
}

/// A tool's result: what the model reads, and whether the call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub parts: Vec<Part>,
    pub is_error: bool,
}

impl ToolOutput {
    fn text(text: impl Into<String>) -> ToolOutput {
        ToolOutput { parts: vec![Part::Text(text.into())], is_error: false }
    }

    fn error(e: &failure::ToolError) -> ToolOutput {
        ToolOutput { parts: vec![Part::Text(failure::error_text(e))], is_error: true }
    }

    /// The text parts, joined.
    pub fn text_of(&self) -> String {
        let texts: Vec<&str> = self
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                Part::Image { .. } => None,
            })
            .collect();
        texts.join("\n")
    }
}

/// Reports a long call's progress: seconds so far and a line saying what it does.
pub type Progress = Arc<dyn Fn(f64, String) -> BoxFuture<'static, ()> + Send + Sync>;

/// What a caller lets a call know while it runs: when the client gave up
/// (cancelled: a run is stopped, and nothing it made is left behind), and where
/// progress goes.
#[derive(Clone, Default)]
pub struct Watch {
    pub cancelled: CancellationToken,
    pub progress: Option<Progress>,
}

/// A name that is no tool.
#[derive(Debug, Clone, thiserror::Error)]
#[error("no tool {0:?}: list the tools to see their names")]
pub struct UnknownTool(pub String);

/// One tool's definition.
struct Def {
    name: &'static str,
    title: &'static str,
    hints: Hints,
    /// Its description, with the default policy's limits when known.
    describe: fn(Option<&PolicyLimits>) -> String,
    /// The schema of its arguments, as generated from their type.
    schema: fn() -> Map<String, Value>,
    call: for<'a> fn(&'a Registry, &'a Caller, Value, &'a Watch) -> BoxFuture<'a, ToolOutput>,
}

const fn hints(read_only: bool, destructive: bool, idempotent: bool) -> Hints {
    Hints { read_only, destructive, idempotent, open_world: false }
}

fn schema<T: rmcp::schemars::JsonSchema + 'static>() -> Map<String, Value> {
    (*rmcp::handler::server::common::schema_for_type::<T>()).clone()
}

/// Every tool, in the order they are listed.
const TOOLS: &[Def] = &[
    Def {
        name: "run_python",
        title: "Run Python",
        hints: hints(false, true, false),
        describe: render::run_python,
        schema: schema::<args::RunPython>,
        call: |r, c, a, w| Box::pin(calls::run_python(r, c, a, w)),
    },
    Def {
        name: "run_shell",
        title: "Run shell command",
        hints: hints(false, true, false),
        describe: render::run_shell,
        schema: schema::<args::RunShell>,
        call: |r, c, a, w| Box::pin(calls::run_shell(r, c, a, w)),
    },
    Def {
        name: "create_session",
        title: "Create session",
        hints: hints(false, false, false),
        describe: render::create_session,
        schema: schema::<args::NewSession>,
        call: |r, c, a, _| Box::pin(calls::create_session(r, c, a)),
    },
    Def {
        name: "list_sessions",
        title: "List sessions",
        hints: hints(true, false, true),
        describe: |_| "List the open sessions (id, mode, policy, created and last used, busy).".into(),
        schema: schema::<args::NoArgs>,
        call: |r, c, a, _| Box::pin(calls::list_sessions(r, c, a)),
    },
    Def {
        name: "close_session",
        title: "Close session",
        hints: hints(false, true, true),
        describe: |_| "Close a session: stop its running code and delete its files. This cannot be undone.".into(),
        schema: schema::<args::SessionRef>,
        call: |r, c, a, _| Box::pin(calls::close_session(r, c, a)),
    },
    Def {
        name: "install_packages",
        title: "Install packages",
        hints: Hints { read_only: false, destructive: false, idempotent: true, open_world: true },
        describe: render::install_packages,
        schema: schema::<args::InstallPackages>,
        call: |r, c, a, w| Box::pin(calls::install_packages(r, c, a, w)),
    },
    Def {
        name: "upload_file",
        title: "Upload file",
        hints: hints(false, true, true),
        describe: render::upload_file,
        schema: schema::<args::UploadFile>,
        call: |r, c, a, w| Box::pin(calls::upload_file(r, c, a, w)),
    },
    Def {
        name: "list_files",
        title: "List files",
        hints: hints(true, false, true),
        describe: |_| "List every file in a session's workspace, recursively, with size, type and download URL.".into(),
        schema: schema::<args::SessionRef>,
        call: |r, c, a, _| Box::pin(calls::list_files(r, c, a)),
    },
    Def {
        name: "read_file",
        title: "Read file",
        hints: hints(true, false, true),
        describe: render::read_file,
        schema: schema::<args::ReadFile>,
        call: |r, c, a, _| Box::pin(calls::read_file(r, c, a)),
    },
];

/// The tools, over the daemon's operations.
pub struct Registry {
    ops: Arc<dyn Operations>,
    specs: Vec<Spec>,
}

impl Registry {
    /// The tools over `ops`; `default` is the daemon's default policy, whose
    /// limits the descriptions state.
    pub fn new(ops: Arc<dyn Operations>, default: Option<&PolicyLimits>) -> Registry {
        let specs = TOOLS
            .iter()
            .map(|d| {
                let mut input_schema = (d.schema)();
                render::plain_schema(&mut input_schema);
                Spec { name: d.name, title: d.title, description: (d.describe)(default), input_schema, hints: d.hints }
            })
            .collect();
        Registry { ops, specs }
    }

    /// Every tool, in order.
    pub fn specs(&self) -> &[Spec] {
        &self.specs
    }

    /// Call tool `name` with `args` (a JSON object; null is no arguments) as
    /// `caller`: its result, a failure included, or [`UnknownTool`].
    pub async fn call(&self, caller: &Caller, name: &str, args: Value) -> Result<ToolOutput, UnknownTool> {
        self.call_watched(caller, name, args, &Watch::default()).await
    }

    /// [`Registry::call`], cancelled by `watch` and reporting progress to it.
    pub async fn call_watched(
        &self,
        caller: &Caller,
        name: &str,
        args: Value,
        watch: &Watch,
    ) -> Result<ToolOutput, UnknownTool> {
        let def = TOOLS.iter().find(|d| d.name == name).ok_or_else(|| UnknownTool(name.to_string()))?;
        Ok((def.call)(self, caller, args, watch).await)
    }
}

/// A tool's arguments as its type, or the error result that names what is wrong.
fn parse<T: DeserializeOwned>(args: Value) -> Result<T, ToolOutput> {
    let args = if args.is_null() { Value::Object(Map::new()) } else { args };
    serde_json::from_value(args).map_err(|e| {
        ToolOutput::error(&failure::ToolError::new(
            crate::model::error::Code::InvalidRequest,
            format!("invalid arguments: {e}; pass only the arguments the tool's input schema lists, with their types"),
        ))
    })
}
