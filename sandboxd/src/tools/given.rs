//! What a model gave as a call: its arguments as the bytes it wrote, read as
//! strictly as a run request, and a name that may be no tool; and a tool's
//! argument schema as the LLM APIs take it. Every surface that takes a model's
//! own words (`POST /v1/tools/{name}`, the chat's tool loop) reads them here.

use super::{Part, Spec, ToolOutput};
use serde_json::Value;

/// The result for a name that is no tool of `specs`: one the model can act on.
pub fn no_such_tool(name: &str, specs: &[Spec]) -> ToolOutput {
    let names: Vec<&str> = specs.iter().map(|s| s.name).collect();
    error_output(&format!("not_found: there is no tool {name:?}: call one of {}", names.join(", ")))
}

/// A call's error result, as a model reads it: `error <code>: <what to do>`.
pub fn error_output(text: &str) -> ToolOutput {
    ToolOutput { parts: vec![Part::Text(format!("error {text}"))], is_error: true }
}

/// A call's arguments from its body: a JSON object, a JSON string holding one
/// (OpenAI's `arguments` as the API gives it), or nothing. Read as strictly as a
/// run request: one object, each argument once. What is not that is a tool
/// result saying so, for the model.
pub fn arguments(body: &[u8]) -> Result<Value, ToolOutput> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    let bad = |e: serde_json::Error| {
        error_output(&format!(
            "invalid_request: the arguments are not JSON of one object, each argument once ({e}): send one JSON object with the arguments the tool's input schema lists"
        ))
    };
    // A string is read as one; anything else straight as the object (an array
    // of a million empty objects is refused, not built).
    let inner = match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'"') => match serde_json::from_slice::<String>(body).map_err(bad)? {
            inner if inner.trim().is_empty() => return Ok(Value::Null),
            inner => std::borrow::Cow::Owned(inner.into_bytes()),
        },
        _ => std::borrow::Cow::Borrowed(body),
    };
    serde_json::from_slice::<Unique>(&inner).map(|u| Value::Object(u.0)).map_err(bad)
}

/// A JSON object whose keys are each given once (a `Value` would keep the last
/// of a repeated key, silently).
struct Unique(serde_json::Map<String, Value>);

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Unique, D::Error> {
        struct Keys;
        impl<'de> serde::de::Visitor<'de> for Keys {
            type Value = Unique;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("one JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
                let mut out = serde_json::Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if out.contains_key(&key) {
                        return Err(serde::de::Error::custom(format!("the argument {key:?} is given twice")));
                    }
                    let value: Value = map.next_value()?;
                    out.insert(key, value);
                }
                Ok(Unique(out))
            }
        }
        d.deserialize_map(Keys)
    }
}

/// A tool's argument schema as the LLM APIs take it: without the dialect's
/// `$schema` and without the number formats (`double`, `int64`, ...) that the
/// generator writes and JSON Schema does not define (strict validators refuse them).
pub fn llm_schema(spec: &Spec) -> Value {
    fn clean(v: &mut Value) {
        match v {
            Value::Object(m) => {
                let numeric = m.get("format").and_then(Value::as_str).is_some_and(|f| {
                    matches!(
                        f,
                        "double"
                            | "float"
                            | "int8"
                            | "int16"
                            | "int32"
                            | "int64"
                            | "uint"
                            | "uint8"
                            | "uint16"
                            | "uint32"
                            | "uint64"
                    )
                });
                if numeric {
                    m.remove("format");
                }
                m.values_mut().for_each(clean);
            }
            Value::Array(a) => a.iter_mut().for_each(clean),
            _ => {}
        }
    }
    let mut schema = spec.input_schema.clone();
    schema.remove("$schema");
    let mut schema = Value::Object(schema);
    clean(&mut schema);
    schema
}
