//! `GET /v1/tools` and `POST /v1/tools/{name}`: the tool registry
//! ([`crate::tools`], the one MCP serves) in each LLM API's own format, for
//! callers that run their own tool loop against OpenAI's or Anthropic's API.
//!
//! The listing is what the API takes as its `tools`; a call's answer is what the
//! API takes back as the tool's result (text, and figures as image parts where
//! the format carries them). Bad arguments, broken JSON included, are a tool
//! result with `is_error`, which the model can act on, as in MCP, and so is a
//! name that is no tool (the model chose it); only a format that is none is an
//! HTTP error. A call whose
//! client goes away is cancelled as an MCP call is: its run is stopped, and a
//! session made for it closed. The renderings are pure functions of the
//! registry's format-neutral [`Spec`] and [`ToolOutput`].

use super::error::{ApiError, Path, Query};
use super::{body_read_error, Caller, Shared};
use crate::model::error::Code;
use crate::model::tools::{FormatQuery, ToolFormat};
use crate::tools::{arguments, error_output, llm_schema, no_such_tool, Part, Registry, Spec, ToolOutput, Watch};
use axum::extract::State;
use axum::{Extension, Json};
use base64::Engine;
use serde_json::{json, Value};
use std::sync::Arc;

/// The most a call's arguments may be: what MCP's HTTP transport carries, so the
/// tools' descriptions (an upload's size) hold here too.
pub const MAX_ARGUMENTS: usize = 4 * 1024 * 1024;

#[utoipa::path(get, path = "/v1/tools", operation_id = "list_tools", tag = "tools",
    params(FormatQuery),
    description = "The tools a model can call (the same MCP lists at `/mcp`), in an LLM API's format: `tools` is what that API takes as its list of tools (`openai`: Chat Completions function tools; `openai-responses`: the Responses API's; `anthropic`: the Messages API's; `mcp`: MCP's `tools/list` result). Descriptions state the default policy's limits.",
    responses((status = 200, body = Object, description = "`{\"format\": ..., \"tools\": [...]}`")))]
pub async fn list(State(state): State<Shared>, Query(q): Query<FormatQuery>) -> Result<Json<Value>, ApiError> {
    let format = format_of(&q)?;
    Ok(Json(listing(format, registry(&state).specs())))
}

#[utoipa::path(post, path = "/v1/tools/{name}", operation_id = "call_tool", tag = "tools",
    params(("name" = String, Path, description = "the tool's name, as `GET /v1/tools` lists it"), FormatQuery),
    request_body(content = serde_json::Value, description = "the tool's arguments, as the model gave them (any JSON: what is not one of these is a result with `is_error`, for the model): one JSON object, each argument once, or a JSON string holding one (OpenAI's `arguments`); an empty body (sent, as every POST, with `Content-Type: application/json`) is no arguments"),
    description = "Call a tool with a model's arguments, as the caller, and answer what to hand back to the model in the format's own shape: `openai`: `{\"content\": text, \"is_error\", \"images\": [image_url parts for a user message after the tool message]}`; `openai-responses`: `{\"output\": text or [input_text and input_image items], \"is_error\"}`; `anthropic`: `{\"content\": [text and image blocks], \"is_error\"}` (a `tool_result` block's fields); `mcp`: a `tools/call` result. Arguments the tool does not take, broken JSON included, and a name that is no tool, are a result with `is_error` saying what to change (200), never an HTTP error. A call whose client goes away is cancelled: its run is stopped.",
    responses((status = 200, body = Object, description = "the tool's result in the format asked for")))]
pub async fn call(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<FormatQuery>,
    body: axum::body::Body,
) -> Result<Json<Value>, ApiError> {
    let bytes = axum::body::to_bytes(body, MAX_ARGUMENTS).await.map_err(|e| {
        body_read_error(e, || {
            ApiError::new(
                Code::InvalidRequest,
                format!(
                    "a tool call's arguments are at most {MAX_ARGUMENTS} bytes: upload bigger files with PUT /v1/sessions/ID/files/PATH"
                ),
            )
        })
    })?;
    let format = format_of(&q)?;
    let tools = registry(&state);
    // A name is the model's too: one that is no tool is a result it can act on.
    let out = if !tools.specs().iter().any(|s| s.name == name) {
        no_such_tool(&name, tools.specs())
    } else {
        match arguments(&bytes) {
            Ok(args) => called(tools, caller, name, args).await,
            Err(bad) => bad,
        }
    };
    Ok(Json(answer(format, out)))
}

/// The registry MCP serves.
fn registry(state: &Shared) -> Arc<Registry> {
    super::mcp_state(state).tools.clone()
}

fn format_of(q: &FormatQuery) -> Result<ToolFormat, ApiError> {
    match q.format.as_deref() {
        None => Ok(ToolFormat::default()),
        Some(s) => ToolFormat::parse(s).ok_or_else(|| {
            ApiError::new(
                Code::InvalidRequest,
                format!("format {s:?}: use openai, openai-responses, anthropic or mcp (the default)"),
            )
        }),
    }
}

/// Run the call in a task of its own, cancelled when this request is dropped
/// (its client went away): the run is stopped as an MCP client's cancel stops it.
async fn called(tools: Arc<Registry>, caller: Caller, name: String, args: Value) -> ToolOutput {
    let watch = Watch::default();
    let _cancel_on_drop = watch.cancelled.clone().drop_guard();
    let task = tokio::spawn(async move { tools.call_watched(&caller, &name, args, &watch).await });
    match task.await {
        Ok(Ok(out)) => out,
        // Checked above; a task that died is the daemon's fault, said as a tool error.
        Ok(Err(unknown)) => error_output(&unknown.to_string()),
        Err(e) => error_output(&format!("internal: the tool call failed ({e}); retry it")),
    }
}

/// The tools in `format`'s shape: `{"format", "tools": [...]}`.
pub fn listing(format: ToolFormat, specs: &[Spec]) -> Value {
    let tools: Vec<Value> = specs
        .iter()
        .map(|s| match format {
            ToolFormat::OpenAi => json!({"type": "function", "function": {
                "name": s.name, "description": s.description, "parameters": llm_schema(s), "strict": false}}),
            ToolFormat::OpenAiResponses => json!({"type": "function",
                "name": s.name, "description": s.description, "parameters": llm_schema(s), "strict": false}),
            ToolFormat::Anthropic => {
                json!({"name": s.name, "description": s.description, "input_schema": llm_schema(s)})
            }
            ToolFormat::Mcp => serde_json::to_value(super::mcp::tool(s)).unwrap_or(Value::Null),
        })
        .collect();
    json!({"format": format.as_str(), "tools": tools})
}

fn data_url(mime: &str, data: &[u8]) -> String {
    format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(data))
}

/// A tool's result in `format`'s shape (see [`call`]).
pub fn answer(format: ToolFormat, out: ToolOutput) -> Value {
    let is_error = out.is_error;
    match format {
        ToolFormat::OpenAi => {
            // A Chat Completions tool message carries text only: figures go in a
            // user message after it.
            let images: Vec<Value> = out
                .parts
                .iter()
                .filter_map(|p| match p {
                    Part::Image { mime, data, .. } => {
                        Some(json!({"type": "image_url", "image_url": {"url": data_url(mime, data)}}))
                    }
                    Part::Text(_) => None,
                })
                .collect();
            json!({"content": out.text_of(), "is_error": is_error, "images": images})
        }
        ToolFormat::OpenAiResponses => {
            let has_images = out.parts.iter().any(|p| matches!(p, Part::Image { .. }));
            let output = if has_images {
                Value::Array(
                    out.parts
                        .iter()
                        .map(|p| match p {
                            Part::Text(t) => json!({"type": "input_text", "text": t}),
                            Part::Image { mime, data, .. } => {
                                json!({"type": "input_image", "image_url": data_url(mime, data)})
                            }
                        })
                        .collect(),
                )
            } else {
                Value::String(out.text_of())
            };
            json!({"output": output, "is_error": is_error})
        }
        ToolFormat::Anthropic => {
            let content: Vec<Value> = out
                .parts
                .iter()
                .map(|p| match p {
                    Part::Text(t) => json!({"type": "text", "text": t}),
                    Part::Image { mime, data, .. } => json!({"type": "image", "source": {
                        "type": "base64", "media_type": mime,
                        "data": base64::engine::general_purpose::STANDARD.encode(data)}}),
                })
                .collect();
            json!({"content": content, "is_error": is_error})
        }
        ToolFormat::Mcp => serde_json::to_value(super::mcp::result(out)).unwrap_or(Value::Null),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Hints;
    use serde_json::Map;

    fn spec() -> Spec {
        let mut schema = Map::new();
        schema.insert("type".into(), json!("object"));
        schema.insert("$schema".into(), json!("https://json-schema.org/draft/2020-12/schema"));
        schema.insert(
            "properties".into(),
            json!({"code": {"type": "string"}, "timeout_s": {"type": "number", "format": "double", "minimum": 0}}),
        );
        schema.insert("required".into(), json!(["code"]));
        Spec {
            name: "run_python",
            title: "Run Python",
            description: "Run Python.".into(),
            input_schema: schema,
            hints: Hints { read_only: false, destructive: true, idempotent: false, open_world: false },
        }
    }

    fn figure() -> ToolOutput {
        ToolOutput {
            parts: vec![
                Part::Text("status: ok".into()),
                Part::Image { mime: "image/png".into(), data: vec![1, 2, 3], path: None },
            ],
            is_error: false,
        }
    }

    #[test]
    fn each_format_lists_a_tool_as_its_api_takes_it() {
        let s = [spec()];
        let schema = json!({"type": "object", "required": ["code"],
            "properties": {"code": {"type": "string"}, "timeout_s": {"type": "number", "minimum": 0}}});
        let openai = listing(ToolFormat::OpenAi, &s);
        assert_eq!(openai["format"], "openai");
        assert_eq!(
            openai["tools"][0],
            json!({"type": "function", "function": {"name": "run_python", "description": "Run Python.", "parameters": schema, "strict": false}})
        );
        assert_eq!(
            listing(ToolFormat::OpenAiResponses, &s)["tools"][0],
            json!({"type": "function", "name": "run_python", "description": "Run Python.", "parameters": schema, "strict": false})
        );
        assert_eq!(
            listing(ToolFormat::Anthropic, &s)["tools"][0],
            json!({"name": "run_python", "description": "Run Python.", "input_schema": schema})
        );
        let mcp = &listing(ToolFormat::Mcp, &s)["tools"][0];
        assert_eq!(mcp["name"], "run_python");
        // MCP lists the schema as the registry has it.
        assert_eq!(mcp["inputSchema"]["properties"]["timeout_s"]["format"], "double");
        assert_eq!(mcp["inputSchema"]["$schema"], "https://json-schema.org/draft/2020-12/schema");
        assert_eq!(mcp["annotations"]["destructiveHint"], true);
    }

    #[test]
    fn each_format_answers_text_and_figures_where_it_carries_them() {
        let png = "data:image/png;base64,AQID";
        assert_eq!(
            answer(ToolFormat::OpenAi, figure()),
            json!({"content": "status: ok", "is_error": false, "images": [{"type": "image_url", "image_url": {"url": png}}]})
        );
        assert_eq!(
            answer(ToolFormat::OpenAiResponses, figure()),
            json!({"output": [{"type": "input_text", "text": "status: ok"}, {"type": "input_image", "image_url": png}], "is_error": false})
        );
        assert_eq!(
            answer(ToolFormat::Anthropic, figure()),
            json!({"content": [{"type": "text", "text": "status: ok"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AQID"}}], "is_error": false})
        );
        let mcp = answer(ToolFormat::Mcp, figure());
        assert_eq!(mcp["content"][1], json!({"type": "image", "data": "AQID", "mimeType": "image/png"}));
        assert_eq!(mcp["isError"], false);
        // Text alone: the Responses API's output is a string.
        let failed = error_output("invalid_request: nope");
        assert_eq!(
            answer(ToolFormat::OpenAiResponses, failed.clone()),
            json!({"output": "error invalid_request: nope", "is_error": true})
        );
        assert_eq!(answer(ToolFormat::OpenAi, failed)["images"], json!([]));
    }

    #[test]
    fn arguments_are_an_object_a_string_holding_one_or_nothing() {
        assert_eq!(arguments(b"").unwrap(), Value::Null);
        assert_eq!(arguments(b" \n").unwrap(), Value::Null);
        assert_eq!(arguments(br#"{"code": "print(1)"}"#).unwrap(), json!({"code": "print(1)"}));
        assert_eq!(arguments(br#""{\"code\": \"print(1)\"}""#).unwrap(), json!({"code": "print(1)"}));
        assert_eq!(arguments(br#""""#).unwrap(), Value::Null);
        // As strictly as a run request: one object, each argument once.
        let twice = arguments(br#"{"code": "print(1)", "code": "print(2)"}"#).unwrap_err();
        assert!(twice.text_of().contains("the argument \"code\" is given twice"), "{}", twice.text_of());
        let inner_twice = br#""{\"code\": \"a\", \"code\": \"b\"}""#;
        assert!(arguments(inner_twice).unwrap_err().text_of().contains("given twice"));
        for broken in [&b"{\"code\": "[..], b"\"{\\\"code\\\"\"", b"\xff", b"[\"print(1)\"]", b"3", b"null"] {
            let out = arguments(broken).unwrap_err();
            assert!(out.is_error);
            assert!(
                out.text_of().starts_with("error invalid_request: the arguments are not JSON of one object"),
                "{}",
                out.text_of()
            );
        }
    }

    #[test]
    fn a_format_is_one_of_four() {
        for f in ToolFormat::ALL {
            assert_eq!(format_of(&FormatQuery { format: Some(f.as_str().into()) }).unwrap(), f);
            assert_eq!(serde_json::to_value(f).unwrap(), f.as_str());
        }
        assert_eq!(format_of(&FormatQuery::default()).unwrap(), ToolFormat::Mcp);
        let e = format_of(&FormatQuery { format: Some("gemini".into()) }).unwrap_err();
        assert_eq!(e.code, Code::InvalidRequest);
    }

    #[test]
    fn a_name_that_is_no_tool_is_a_result_naming_the_tools() {
        let out = no_such_tool("rm_rf", &[spec()]);
        assert!(out.is_error);
        assert_eq!(out.text_of(), "error not_found: there is no tool \"rm_rf\": call one of run_python");
    }
}
