//! The tools a conversation offers its model: the registry's tools that act in
//! one session (run, install, upload, list, read), without a `session_id`
//! argument, because a conversation is bound to its session. A call naming
//! another session (a prompt injected into a file the model read may try) is
//! refused as a tool result, and touches nothing; a call naming no tool of these,
//! or with arguments that are no JSON object, is a result the model can act on.
//! Pure functions of the registry's [`Spec`]s and the model's words.

use crate::tools::{arguments, error_output, llm_schema, no_such_tool, Spec, ToolOutput};
use serde_json::{json, Map, Value};

/// The registry's tools that act in one session: what a conversation offers.
pub const SESSION_TOOLS: [&str; 6] =
    ["run_python", "run_shell", "install_packages", "upload_file", "list_files", "read_file"];

fn offered(specs: &[Spec]) -> Vec<Spec> {
    specs.iter().filter(|s| SESSION_TOOLS.contains(&s.name)).cloned().collect()
}

/// The offered tools in OpenAI's Chat Completions shape, without `session_id`.
pub fn openai_tools(specs: &[Spec]) -> Vec<Value> {
    offered(specs)
        .iter()
        .map(|s| {
            let mut parameters = llm_schema(s);
            if let Some(props) = parameters.get_mut("properties").and_then(Value::as_object_mut) {
                props.remove("session_id");
            }
            if let Some(required) = parameters.get_mut("required").and_then(Value::as_array_mut) {
                required.retain(|r| r != "session_id");
            }
            json!({"type": "function", "function": {
                "name": s.name, "description": s.description, "parameters": parameters, "strict": false}})
        })
        .collect()
}

/// A model's call of `name` with `raw` arguments (its JSON text), bound to
/// `session`: the arguments to call the registry with (`session_id` set), or the
/// result to hand back instead.
pub fn bind(session: &str, name: &str, raw: &str, specs: &[Spec]) -> Result<Value, ToolOutput> {
    if !SESSION_TOOLS.contains(&name) {
        return Err(no_such_tool(name, &offered(specs)));
    }
    let mut args = match arguments(raw.as_bytes())? {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    match args.get("session_id") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == session => {}
        Some(other) => {
            return Err(error_output(&format!(
                "forbidden: this conversation is bound to session {session}, and acts in no other (session_id {other} refused): omit session_id"
            )))
        }
    }
    args.insert("session_id".into(), Value::String(session.to_string()));
    Ok(Value::Object(args))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Hints;

    fn spec(name: &'static str) -> Spec {
        let schema = json!({"type": "object", "$schema": "x",
            "properties": {"code": {"type": "string"}, "session_id": {"type": "string"}},
            "required": ["code", "session_id"]});
        Spec {
            name,
            title: name,
            description: format!("{name}."),
            input_schema: schema.as_object().cloned().unwrap_or_default(),
            hints: Hints { read_only: false, destructive: false, idempotent: false, open_world: false },
        }
    }

    fn specs() -> Vec<Spec> {
        vec![spec("run_python"), spec("create_session"), spec("close_session"), spec("read_file")]
    }

    #[test]
    fn a_conversation_offers_its_sessions_tools_without_session_id() {
        let tools = openai_tools(&specs());
        let names: Vec<&str> = tools.iter().filter_map(|t| t["function"]["name"].as_str()).collect();
        assert_eq!(names, ["run_python", "read_file"]);
        assert_eq!(
            tools[0]["function"]["parameters"],
            json!({"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]})
        );
    }

    #[test]
    fn calls_are_bound_to_the_conversations_session() {
        let s = specs();
        assert_eq!(bind("S1", "run_python", r#"{"code": "1"}"#, &s).unwrap(), json!({"code": "1", "session_id": "S1"}));
        assert_eq!(bind("S1", "run_python", r#"{"code": "1", "session_id": "S1"}"#, &s).unwrap()["session_id"], "S1");
        assert_eq!(bind("S1", "read_file", "", &s).unwrap(), json!({"session_id": "S1"}));
        let other = bind("S1", "run_python", r#"{"code": "1", "session_id": "S2"}"#, &s).unwrap_err();
        assert!(other.is_error);
        assert_eq!(
            other.text_of(),
            "error forbidden: this conversation is bound to session S1, and acts in no other (session_id \"S2\" refused): omit session_id"
        );
        assert!(bind("S1", "run_python", r#"{"session_id": 7}"#, &s).unwrap_err().text_of().contains("refused"));
        let closing = bind("S1", "close_session", "{}", &s).unwrap_err();
        assert_eq!(
            closing.text_of(),
            "error not_found: there is no tool \"close_session\": call one of run_python, read_file"
        );
        let broken = bind("S1", "run_python", "{\"code\": ", &s).unwrap_err();
        assert!(
            broken.text_of().starts_with("error invalid_request: the arguments are not JSON"),
            "{}",
            broken.text_of()
        );
    }
}
