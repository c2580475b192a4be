//! The tools over HTTP (`GET /v1/tools`, `POST /v1/tools/{name}`): the LLM APIs'
//! formats they are listed and answered in. The tools themselves are
//! [`crate::tools`]'s, the same MCP serves.

use serde::{Deserialize, Serialize};

/// An LLM API's tool format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub enum ToolFormat {
    /// OpenAI's Chat Completions (`tools: [{"type": "function", "function": ...}]`).
    #[serde(rename = "openai")]
    OpenAi,
    /// OpenAI's Responses API (`tools: [{"type": "function", "name": ...}]`).
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    /// Anthropic's Messages API (`tools: [{"name", "description", "input_schema"}]`).
    #[serde(rename = "anthropic")]
    Anthropic,
    /// MCP's `tools/list` and `tools/call` shapes.
    #[default]
    #[serde(rename = "mcp")]
    Mcp,
}

impl ToolFormat {
    pub const ALL: [ToolFormat; 4] =
        [ToolFormat::OpenAi, ToolFormat::OpenAiResponses, ToolFormat::Anthropic, ToolFormat::Mcp];

    pub fn as_str(self) -> &'static str {
        match self {
            ToolFormat::OpenAi => "openai",
            ToolFormat::OpenAiResponses => "openai-responses",
            ToolFormat::Anthropic => "anthropic",
            ToolFormat::Mcp => "mcp",
        }
    }

    pub fn parse(s: &str) -> Option<ToolFormat> {
        ToolFormat::ALL.into_iter().find(|f| f.as_str() == s)
    }
}

/// The query of both tool routes.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct FormatQuery {
    /// The API whose format the tools are listed, or a call's result answered,
    /// in: `openai` (Chat Completions), `openai-responses`, `anthropic` or `mcp`
    /// (the default).
    #[param(value_type = Option<ToolFormat>)]
    pub format: Option<String>,
}
