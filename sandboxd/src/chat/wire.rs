//! What an OpenAI-compatible endpoint answers, as far as the chat reads it: the
//! model list, a streamed chunk, a whole answer, an error. Typed, so that the
//! fields nobody reads are skipped as they are parsed (a chunk of a million
//! numbers is passed over, not built into a tree of them).

use serde::de::{DeserializeOwned, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

/// `bytes` as a `T`.
pub fn read<T: DeserializeOwned>(bytes: &[u8]) -> serde_json::Result<T> {
    serde_json::from_slice(bytes)
}

/// `GET /models`.
#[derive(Debug, Default, Deserialize)]
pub struct Models {
    #[serde(default)]
    pub data: Vec<Model>,
}

#[derive(Debug, Deserialize)]
pub struct Model {
    pub id: String,
}

/// One chunk of a streamed answer.
#[derive(Debug, Deserialize)]
pub struct Chunk {
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    pub error: Option<ErrorField>,
}

#[derive(Debug, Deserialize)]
pub struct ChunkChoice {
    pub delta: Option<Delta>,
}

#[derive(Debug, Deserialize)]
pub struct Delta {
    pub content: Option<String>,
    pub tool_calls: Option<Vec<CallPiece>>,
}

/// A tool call, or a piece of one (streamed: its name first, its arguments in pieces).
#[derive(Debug, Deserialize)]
pub struct CallPiece {
    pub index: Option<u64>,
    pub id: Option<String>,
    pub function: Option<Function>,
}

#[derive(Debug, Deserialize)]
pub struct Function {
    pub name: Option<String>,
    /// Text, as the API gives it; some servers give an object.
    pub arguments: Option<Value>,
}

impl Function {
    /// The arguments as text.
    pub fn arguments_text(&self) -> String {
        match &self.arguments {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => String::new(),
            Some(other) => other.to_string(),
        }
    }
}

/// A whole answer (`application/json`).
#[derive(Debug, Deserialize)]
pub struct Whole {
    #[serde(default)]
    pub choices: Vec<WholeChoice>,
    pub error: Option<ErrorField>,
}

#[derive(Debug, Deserialize)]
pub struct WholeChoice {
    pub message: Option<Message>,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub content: Option<String>,
    pub tool_calls: Option<Vec<CallPiece>>,
}

/// An answer's `error`: OpenAI's `{"message": ...}`, or a plain string; what it
/// says (anything else says nothing).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ErrorField(pub Option<String>);

impl<'de> Deserialize<'de> for ErrorField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ErrorField, D::Error> {
        struct Said;
        impl<'de> Visitor<'de> for Said {
            type Value = ErrorField;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an error")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<ErrorField, E> {
                Ok(ErrorField(Some(s.to_string())))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ErrorField, A::Error> {
                let mut said = None;
                while let Some(key) = map.next_key::<String>()? {
                    match (key.as_str(), &said) {
                        ("message", None) => said = map.next_value::<Option<String>>()?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(ErrorField(said))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ErrorField, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ErrorField(None))
            }
            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<ErrorField, E> {
                Ok(ErrorField(None))
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<ErrorField, E> {
                Ok(ErrorField(None))
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<ErrorField, E> {
                Ok(ErrorField(None))
            }
            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<ErrorField, E> {
                Ok(ErrorField(None))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<ErrorField, E> {
                Ok(ErrorField(None))
            }
        }
        d.deserialize_any(Said)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_nobody_reads_are_passed_over() {
        let huge = format!(
            r#"{{"choices": [{{"delta": {{"content": "hi"}}, "logprobs": [{}0]}}], "usage": {{}}}}"#,
            "0,".repeat(1000)
        );
        let c: Chunk = read(huge.as_bytes()).unwrap();
        assert_eq!(c.choices[0].delta.as_ref().and_then(|d| d.content.as_deref()), Some("hi"));
        let nulls: Chunk = read(br#"{"choices": [{"delta": null}], "error": null}"#).unwrap();
        assert!(nulls.choices[0].delta.is_none() && nulls.error.is_none());
        let m: Models = read(br#"{"object": "list", "data": [{"id": "a", "owned_by": "x"}]}"#).unwrap();
        assert_eq!(m.data[0].id, "a");
        assert!(read::<Chunk>(b"[1, 2]").is_err());
    }

    #[test]
    fn an_error_says_its_message_whatever_its_shape() {
        let said = |json: &str| read::<Chunk>(json.as_bytes()).unwrap().error.unwrap_or_default().0;
        assert_eq!(said(r#"{"error": {"code": 1, "message": "boom", "x": [1]}}"#).as_deref(), Some("boom"));
        assert_eq!(said(r#"{"error": "plain"}"#).as_deref(), Some("plain"));
        assert_eq!(said(r#"{"error": [1, {"a": 2}]}"#), None);
        assert_eq!(said(r#"{"error": 7}"#), None);
    }
}
