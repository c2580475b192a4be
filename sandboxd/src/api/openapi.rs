//! `GET /v1/openapi.json`: generated from the handlers' annotations and the
//! request/response types, never written by hand. What the derive cannot say is
//! added here, in one place ([`document_for`]): the error answers each route can
//! give (from [`ERRORS`]), the rules the daemon enforces that depend on its
//! policies (`timeout_s`'s maximum, the policy names, the code's size), the
//! session-id pattern of path parameters, the optional session body, the kernel
//! fields of a run result, the policy's `name`, and the optional bearer token.

use super::Shared;
use crate::model::policy::Policy;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Map, Value};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandboxd",
        description = "Run untrusted Python in native Linux sandboxes. Every POST takes a JSON object sent with `Content-Type: application/json` (else 415 `unsupported_media_type`). Over HTTP, a `Host` the daemon does not serve or a foreign `Origin` is refused with 403 `forbidden`. A body that stalls, or a JSON body slower than `body_timeout_s`, gets 408 `request_timeout`. A method a route does not take gets 405 `method_not_allowed` with `Allow`. A request with more than one `Host` header gets 400 `invalid_request`. A response whose client takes no bytes for `send_timeout_s` loses its connection. With tokens, each token has its own session id space and quotas (429 `max_sessions`, `max_runs`, `max_connections`); `GET /v1/health` without a token says only `status` and `version`, and `GET /metrics` needs an operator token. Every error is `{\"error\":{\"code\",\"message\"}}`, the message saying what to do."
    ),
    paths(
        super::health,
        super::metrics,
        super::runs::create_run,
        super::runs::session_run,
        super::runs::list_runs,
        super::runs::get_run,
        super::sessions::create,
        super::sessions::list,
        super::sessions::show,
        super::sessions::close,
        super::sessions::cancel_run,
        super::sessions::policies,
        super::packages::install,
        super::secrets::set,
        super::secrets::list,
        super::secrets::remove,
        super::files::list,
        super::files::download,
        super::files::upload,
        super::files::remove,
        super::check_host,
        super::tools::list,
        super::tools::call,
        super::chat::chat,
        super::chat::stop,
        super::chat::list,
        super::chat::show,
    ),
    components(schemas(
        crate::model::health::Problem,
        crate::model::error::Code,
        crate::model::error::ErrorBody,
        crate::model::run::Language,
        crate::model::run::KernelFields,
        crate::model::session::Mode,
        crate::model::tools::ToolFormat
    ))
)]
pub struct ApiDoc;

/// A session id as a path parameter: a caller without a token may also name a
/// token's session by its key, `<tenant>.<id>` ([`crate::session::key`]).
pub const SESSION_ID_PATTERN: &str = r"^([0-9a-f]{16}\.)?[A-Za-z0-9_-]{1,64}$";

/// What each error status means, for the document.
fn error_description(status: u16) -> &'static str {
    match status {
        400 => "`invalid_request` (a body that is not a JSON object of the documented fields, a bad value, more than one `Host` header), `invalid_session_id`, `invalid_path` or `policy_not_found`: the message says what to change",
        401 => "`unauthorized`: tokens are configured and the request has no `Authorization: Bearer <token>` with one of them",
        403 => "`forbidden`: over HTTP, a `Host` the daemon does not serve, or a foreign `Origin`; `GET /metrics` with a token that is not an operator token; `POST /v1/chat` when the chat is off (`llm_url = \"off\"`)",
        404 => "`session_not_found` (closed, expired, never made, or another token's), `run_not_found` (a run the session does not keep) or `not_found` (no such file, secret or conversation of the session's own)",
        408 => "`request_timeout`: the body stalled, or a JSON body did not arrive within `body_timeout_s`",
        409 => "`session_busy` (a run is going on in it; for `POST /v1/chat`, a conversation is), `session_exists`, `file_exists` (pass `overwrite=true`) or `file_busy` (a lease or lock from the session's code)",
        413 => "`code_too_large` (more code than the policy's `code_kb`), `upload_too_large` (more than `upload_mb`, or the workspace is full)",
        415 => "`unsupported_media_type`: a JSON body without `Content-Type: application/json`",
        422 => "`package_install_failed`: the installer ran and failed (an unknown package, a version that does not exist, conflicting pins, no wheel, the index unreachable, the layer full, the install's time limit); the message has its own words, and the session's package layer is as it was",
        429 => "`max_sessions` (the daemon's or the token's sessions are all taken, those still being closed included), `max_runs` (the token's runs at once), `max_listings` (the token's listings walked or sent at once: read or close them first) or `max_connections` (the token's connections at once: this connection is closed after the answer)",
        500 => "`internal`: a host failure; the daemon log has the cause",
        503 => "`unavailable`: the daemon is shutting down, or (a listing) walking or sending its most listings at once; retry after `Retry-After`",
        507 => "`insufficient_storage`: the state directory's filesystem could not hold every session's workspace and package layer filled up, a new one included; close sessions, free disk space or use a policy with a smaller `workspace_mb` or `packages_mb`",
        _ => "an error",
    }
}

/// The error statuses each operation can answer, beyond 400 (more than one
/// `Host`), 403 (every HTTP request) and 500, and 429 `max_connections` wherever
/// 401 is: what its handler, the auth layer (401, 429) and the surface guard (415
/// and 408 for bodies) can refuse it with.
pub const ERRORS: &[(&str, &[u16])] = &[
    ("health", &[]),
    ("metrics", &[401]),
    ("check_host", &[401]),
    ("list_policies", &[401]),
    ("run", &[400, 401, 404, 408, 409, 413, 415, 422, 429, 503, 507]),
    ("run_in_session", &[400, 401, 404, 408, 409, 413, 415, 422, 429, 503]),
    ("create_session", &[400, 401, 408, 409, 415, 429, 507]),
    ("list_sessions", &[401]),
    ("get_session", &[400, 401, 404]),
    ("close_session", &[400, 401, 404]),
    ("cancel_run", &[400, 401, 404]),
    ("list_runs", &[400, 401, 404]),
    ("get_run", &[400, 401, 404]),
    ("list_files", &[400, 401, 404, 429, 503]),
    ("download_file", &[400, 401, 404, 409, 413]),
    ("upload_file", &[400, 401, 404, 408, 409, 413]),
    ("delete_file", &[400, 401, 404, 409]),
    ("install_packages", &[400, 401, 404, 408, 409, 415, 422, 503, 507]),
    ("set_secret", &[400, 401, 404, 408, 415]),
    ("list_secrets", &[400, 401, 404]),
    ("delete_secret", &[400, 401, 404]),
    ("list_tools", &[400, 401]),
    ("call_tool", &[400, 401, 408, 415]),
    ("chat", &[400, 401, 404, 408, 409, 413, 415]),
    ("stop_chat", &[400, 401, 404]),
    ("list_chats", &[400, 401, 404]),
    ("get_chat", &[400, 401, 404]),
];

/// The limits of the daemon's policies that the document states.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub policy_names: Vec<String>,
    /// The largest `timeout_s` of any policy.
    pub max_timeout_s: u64,
    /// The largest code of any policy, in bytes.
    pub max_code_bytes: usize,
}

impl Limits {
    pub fn of(policies: &[Policy]) -> Limits {
        Limits {
            policy_names: policies.iter().map(|p| p.name.clone()).collect(),
            max_timeout_s: policies.iter().map(|p| p.timeout_s).max().unwrap_or(0),
            max_code_bytes: policies.iter().map(|p| p.code_bytes()).max().unwrap_or(0),
        }
    }
}

pub async fn document(State(state): State<Shared>) -> Json<Value> {
    Json(document_for(&Limits::of(&state.service.policies())))
}

fn obj(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    match v {
        Value::Object(m) => m,
        _ => unreachable!("made an object above"),
    }
}

/// The document, with what the derive cannot say added.
pub fn document_for(limits: &Limits) -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_else(|_| json!({}));
    let error_ref = json!({"$ref": "#/components/schemas/ErrorBody"});
    let schemas = obj(obj(&mut doc["components"]).entry("schemas").or_insert(json!({})));

    // A run result: the kernel fields are flattened in, present for kernel cells only.
    let kernel = schemas.remove("KernelFields").unwrap_or_default();
    if let Some(props) = schemas.get_mut("RunResult").map(|r| obj(&mut r["properties"])) {
        if let Some(Value::Object(k)) = kernel.get("properties") {
            for (name, schema) in k {
                props.insert(name.clone(), schema.clone());
            }
        }
    }
    // The policy's name is served (the derive skips it: never read from the file);
    // every field is always sent.
    if let Some(policy) = schemas.get_mut("Policy") {
        obj(&mut policy["properties"]).insert(
            "name".into(),
            json!({"type": "string", "description": "The policy's name.", "example": "default"}),
        );
        let mut names: Vec<Value> = obj(&mut policy["properties"]).keys().map(|k| json!(k)).collect();
        names.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
        policy["required"] = Value::Array(names);
    }
    // Rules that depend on the configured policies.
    let mut names: Vec<Value> = limits.policy_names.iter().map(|n| json!(n)).collect();
    names.push(Value::Null);
    if let Some(req) = schemas.get_mut("RunRequest") {
        req["properties"]["timeout_s"]["maximum"] = json!(limits.max_timeout_s);
        req["properties"]["code"]["maxLength"] = json!(limits.max_code_bytes);
        req["properties"]["policy"]["enum"] = Value::Array(names.clone());
    }
    if let Some(req) = schemas.get_mut("CreateSession") {
        req["properties"]["policy"]["enum"] = Value::Array(names);
    }

    // The chat's events, one by one: a name and its JSON (as server-sent events
    // are read: `event` and `data`).
    let chat_events = &mut doc["paths"]["/v1/chat"]["post"]["responses"]["200"]["content"]["text/event-stream"];
    if chat_events.is_object() {
        chat_events["schema"] = json!({"type": "object", "required": ["event", "data"], "properties": {
            "event": {"type": "string", "enum": ["chat", "text", "assistant", "tool_call", "tool_result", "notice", "error", "done"]},
            "data": {"type": "string", "description": "the event's fields, as a JSON object"}}});
    }

    // The optional bearer token.
    obj(&mut doc["components"]).insert(
        "securitySchemes".into(),
        json!({"bearer": {"type": "http", "scheme": "bearer",
            "description": "Needed over HTTP when the daemon has `tokens`; a Unix-socket caller without one acts as the operator."}}),
    );

    let Some(Value::Object(paths)) = doc.get_mut("paths") else { return doc };
    for (path, item) in paths.iter_mut() {
        let Value::Object(item) = item else { continue };
        for (_method, op) in item.iter_mut() {
            let op_id = op["operationId"].as_str().unwrap_or_default().to_string();
            let own = ERRORS.iter().find(|(id, _)| *id == op_id).map(|(_, s)| *s).unwrap_or(&[]);
            let responses = obj(&mut op["responses"]);
            let authed = own.contains(&401).then_some(429);
            for status in own.iter().copied().chain([400, 403, 500]).chain(authed) {
                responses.insert(
                    status.to_string(),
                    json!({"description": error_description(status), "content": {"application/json": {"schema": error_ref}}}),
                );
            }
            if own.contains(&401) {
                op["security"] = json!([{}, {"bearer": []}]);
            }
            if let Some(Value::Array(params)) = op.get_mut("parameters") {
                for p in params.iter_mut() {
                    match (p["in"].as_str(), p["name"].as_str()) {
                        (Some("path"), Some("id")) => p["schema"]["pattern"] = json!(SESSION_ID_PATTERN),
                        (Some("path"), Some("path")) => {
                            p["schema"]["minLength"] = json!(1);
                            p["schema"]["maxLength"] = json!(crate::workspace::MAX_PATH);
                        }
                        (Some("query"), Some("overwrite")) => {
                            p["schema"] = json!({"type": "string", "enum": ["true", "false", "1", "0"]})
                        }
                        _ => {}
                    }
                }
            }
            // No body: a session with the defaults; an empty file.
            if op_id == "create_session" || op_id == "upload_file" {
                op["requestBody"]["required"] = json!(false);
            }
            if op_id == "list_files" {
                let header = &mut op["responses"]["200"]["headers"][super::files::LISTING_PARTIAL];
                header["required"] = json!(true);
                header["schema"] = json!({"type": "string", "enum": ["true", "false"]});
            }
        }
        let _ = path;
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn doc() -> Value {
        let strict = Policy { name: "strict".into(), timeout_s: 15, code_kb: 50, ..Policy::default() };
        document_for(&Limits::of(&[Policy::default(), strict]))
    }

    fn operations(doc: &Value) -> Vec<(String, String, &Value)> {
        let mut out = vec![];
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                out.push((path.clone(), method.clone(), op));
            }
        }
        out
    }

    fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("$ref", Value::String(r)) => out.push(r),
                        _ => refs(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }

    fn resolve<'a>(doc: &'a Value, r: &str) -> Option<&'a Value> {
        doc.pointer(r.strip_prefix('#')?)
    }

    /// No field the patching indexed into by mistake (serde_json makes it null).
    fn no_stray_nulls(v: &Value, at: &str) {
        match v {
            Value::Null => panic!("null at {at}"),
            Value::Object(m) => m.iter().for_each(|(k, v)| no_stray_nulls(v, &format!("{at}/{k}"))),
            Value::Array(a) if !at.ends_with("/enum") => a.iter().for_each(|v| no_stray_nulls(v, at)),
            _ => {}
        }
    }

    #[test]
    fn the_document_has_no_stray_nulls() {
        no_stray_nulls(&doc(), "");
    }

    #[test]
    fn operation_ids_are_unique_and_every_route_has_one() {
        let doc = doc();
        let mut seen = BTreeSet::new();
        for (path, method, op) in operations(&doc) {
            let id = op["operationId"].as_str().unwrap_or_else(|| panic!("{method} {path} has no operationId"));
            assert!(seen.insert(id.to_string()), "operationId {id:?} is used twice");
            assert!(ERRORS.iter().any(|(e, _)| *e == id), "{id} is missing from ERRORS");
            assert!(op["tags"].as_array().is_some_and(|t| t.len() == 1 && !t[0].as_str().unwrap().contains(':')));
        }
        assert_eq!(seen.len(), ERRORS.len(), "ERRORS names an operation that does not exist");
    }

    #[test]
    fn every_ref_resolves_and_every_schema_is_used() {
        let doc = doc();
        let mut found = vec![];
        refs(&doc, &mut found);
        assert!(!found.is_empty());
        for r in &found {
            assert!(resolve(&doc, r).is_some(), "{r} does not resolve");
        }
        let used: BTreeSet<&str> = found.iter().map(|r| r.rsplit('/').next().unwrap()).collect();
        for name in doc["components"]["schemas"].as_object().unwrap().keys() {
            // `Code` is reached through ErrorDetail; Problem and Mode through others.
            assert!(used.contains(name.as_str()), "schema {name} is never referenced");
        }
    }

    #[test]
    fn every_path_parameter_is_declared_and_constrained() {
        let doc = doc();
        for (path, method, op) in operations(&doc) {
            let in_template: BTreeSet<&str> =
                path.split('/').filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}'))).collect();
            let declared: BTreeSet<&str> = op["parameters"]
                .as_array()
                .map(|ps| ps.iter().filter(|p| p["in"] == "path").map(|p| p["name"].as_str().unwrap()).collect())
                .unwrap_or_default();
            assert_eq!(in_template, declared, "{method} {path}");
            for p in op["parameters"].as_array().into_iter().flatten() {
                assert_eq!(p["required"], json!(p["in"] == "path"), "{method} {path} {p}");
                if p["name"] == "id" {
                    assert_eq!(p["schema"]["pattern"], json!(SESSION_ID_PATTERN), "{method} {path}");
                }
            }
        }
    }

    #[test]
    fn every_route_documents_its_error_answers_in_the_envelope() {
        let doc = doc();
        for (path, method, op) in operations(&doc) {
            let responses = op["responses"].as_object().unwrap();
            let mut want: BTreeSet<u16> = [400, 403, 500].into();
            if path != "/v1/health" {
                want.extend([401, 429]);
            }
            if method == "post" {
                want.extend([400, 408, 415]);
            }
            if method == "put" && path.contains("/files/") {
                want.extend([400, 408, 413]);
            }
            if method == "put" && path.contains("/secrets/") {
                want.extend([400, 408, 415]);
            }
            if path.contains("{id}") {
                want.extend([400, 404]);
            }
            for status in want {
                let r = &responses.get(&status.to_string()).unwrap_or_else(|| panic!("{method} {path}: no {status}"));
                assert_eq!(
                    r["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/ErrorBody",
                    "{method} {path} {status}"
                );
            }
            for (status, r) in responses {
                assert!(!r["description"].as_str().unwrap_or_default().is_empty(), "{method} {path} {status}");
            }
            if responses.contains_key("401") {
                assert_eq!(op["security"], json!([{}, {"bearer": []}]), "{method} {path}");
            }
        }
        let codes = &doc["components"]["schemas"]["Code"]["enum"];
        for code in [
            "method_not_allowed",
            "unsupported_media_type",
            "request_timeout",
            "forbidden",
            "max_runs",
            "max_connections",
        ] {
            assert!(codes.as_array().unwrap().contains(&json!(code)), "{code}");
        }
    }

    #[test]
    fn the_enforced_rules_are_in_the_schemas() {
        let doc = doc();
        let s = &doc["components"]["schemas"];
        let run = &s["RunRequest"]["properties"];
        assert_eq!(run["timeout_s"]["exclusiveMinimum"].as_f64(), Some(0.0));
        assert_eq!(run["timeout_s"]["maximum"], json!(60));
        assert_eq!(run["code"]["maxLength"], json!(100 * 1024));
        assert_eq!(run["policy"]["enum"], json!(["default", "strict", null]));
        assert_eq!(run["session_id"]["pattern"], json!(SESSION_ID_PATTERN));
        assert_eq!(s["RunRequest"]["additionalProperties"], json!(false));
        let create = &s["CreateSession"]["properties"];
        assert_eq!(create["id"]["pattern"], json!(r"^[A-Za-z0-9_-]{1,64}$"));
        assert_eq!((&create["ttl_s"]["minimum"], &create["ttl_s"]["maximum"]), (&json!(1), &json!(2592000)));
        assert_eq!(create["policy"]["enum"], json!(["default", "strict", null]));
        let post = &doc["paths"]["/v1/sessions"]["post"];
        assert_eq!(post["requestBody"]["required"], json!(false));
        // The upload body is bytes, not an array of numbers.
        let put = &doc["paths"]["/v1/sessions/{id}/files/{path}"]["put"];
        assert_eq!(put["requestBody"]["required"], json!(false));
        let body = &put["requestBody"]["content"]["application/octet-stream"]["schema"];
        let body = resolve(&doc, body["$ref"].as_str().unwrap_or("#")).unwrap_or(body);
        assert_eq!((&body["type"], &body["format"]), (&json!("string"), &json!("binary")), "{body}");
        let overwrite = put["parameters"].as_array().unwrap().iter().find(|p| p["name"] == "overwrite").unwrap();
        assert_eq!(overwrite["schema"]["enum"], json!(["true", "false", "1", "0"]));
        let list = &doc["paths"]["/v1/sessions/{id}/files"]["get"]["responses"]["200"]["headers"];
        assert_eq!(list[super::super::files::LISTING_PARTIAL]["schema"]["enum"], json!(["true", "false"]));
        // A schema per name: two types of one name would make one silently win.
        assert_eq!(s["RunStatus"]["enum"], json!(["ok", "error", "timeout", "oom", "killed"]));
        assert_eq!(s["CheckStatus"]["enum"], json!(["ok", "warn", "fail"]));
        assert!(s.get("Status").is_none());
    }

    /// Two types that share a schema name: the document would hold one of them.
    #[test]
    fn no_two_types_share_a_schema_name() {
        use utoipa::ToSchema;
        let mut all = vec![];
        crate::model::run::RunRequest::schemas(&mut all);
        crate::model::run::RunResult::schemas(&mut all);
        crate::model::session::CreateSessionRequest::schemas(&mut all);
        crate::model::session::SessionInfo::schemas(&mut all);
        crate::model::policy::Policy::schemas(&mut all);
        crate::model::check::Report::schemas(&mut all);
        crate::model::health::Health::schemas(&mut all);
        crate::model::error::ErrorBody::schemas(&mut all);
        let mut by_name: BTreeMap<String, String> = BTreeMap::new();
        for (name, schema) in all {
            let text = serde_json::to_string(&schema).unwrap();
            if let Some(before) = by_name.insert(name.clone(), text.clone()) {
                assert_eq!(before, text, "two schemas named {name}");
            }
        }
        let doc = doc();
        for name in by_name.keys() {
            assert!(doc["components"]["schemas"].get(name).is_some(), "{name} is not in the document");
        }
    }

    /// A small JSON-schema check, strict about objects: every property the server
    /// sends must be documented (unless `additionalProperties` is a schema).
    fn conforms(doc: &Value, schema: &Value, v: &Value, at: &str) -> Result<(), String> {
        if let Some(r) = schema["$ref"].as_str() {
            return conforms(doc, resolve(doc, r).ok_or(format!("{at}: {r}"))?, v, at);
        }
        if let Some(options) = schema["oneOf"].as_array() {
            let ok = options.iter().filter(|o| conforms(doc, o, v, at).is_ok()).count();
            return if ok == 1 { Ok(()) } else { Err(format!("{at}: {ok} of oneOf match {v}")) };
        }
        for part in schema["allOf"].as_array().into_iter().flatten() {
            conforms(doc, part, v, at)?;
        }
        let type_name = match v {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        let types: Vec<&str> = match &schema["type"] {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !types.is_empty() && !types.iter().any(|t| *t == type_name || (*t == "number" && type_name == "integer")) {
            return Err(format!("{at}: {v} is not {types:?}"));
        }
        if let Some(options) = schema["enum"].as_array() {
            if !options.contains(v) {
                return Err(format!("{at}: {v} is not one of {options:?}"));
            }
        }
        match v {
            Value::Object(m) => {
                for req in schema["required"].as_array().into_iter().flatten() {
                    if !m.contains_key(req.as_str().unwrap()) {
                        return Err(format!("{at}: {req} is missing"));
                    }
                }
                for (k, item) in m {
                    match schema["properties"].get(k) {
                        Some(p) => conforms(doc, p, item, &format!("{at}.{k}"))?,
                        None if schema["additionalProperties"].is_object() => {
                            conforms(doc, &schema["additionalProperties"], item, &format!("{at}.{k}"))?
                        }
                        None if schema.get("properties").is_some() => {
                            return Err(format!("{at}: {k} is sent but not documented"))
                        }
                        None => {}
                    }
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    conforms(doc, &schema["items"], item, &format!("{at}[{i}]"))?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn schema(name: &str) -> Value {
        json!({"$ref": format!("#/components/schemas/{name}")})
    }

    #[test]
    fn what_the_server_sends_conforms_to_its_schema() {
        use crate::model::run::{Artifact, ArtifactKind, KernelException, KernelFields, RunResult, RunUsage, Status};
        let doc = doc();
        let script = RunResult {
            run_id: "r".into(),
            session_id: "s".into(),
            status: Status::Timeout,
            exit_code: None,
            signal: Some("SIGKILL".into()),
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: true,
            duration_ms: 3,
            artifacts: vec![Artifact {
                path: "a.png".into(),
                size_bytes: 1,
                mime_type: "image/png".into(),
                kind: ArtifactKind::Figure,
                url: "http://x/a.png".into(),
            }],
            artifacts_truncated: false,
            usage: RunUsage {
                cpu_ms: Some(12),
                memory_peak_bytes: Some(1 << 20),
                pids_peak: None,
                net: None,
                disk_full: None,
            },
            kernel: None,
        };
        let value = serde_json::to_value(&script).unwrap();
        conforms(&doc, &schema("RunResult"), &value, "script").unwrap();
        let mut cell = script.clone();
        cell.status = Status::Error;
        cell.kernel = Some(KernelFields {
            result: None,
            exception: Some(KernelException {
                name: "ZeroDivisionError".into(),
                value: "x".into(),
                traceback: "t".into(),
            }),
            kernel_restarted: true,
        });
        conforms(&doc, &schema("RunResult"), &serde_json::to_value(&cell).unwrap(), "cell").unwrap();
        for policy in [Policy::default(), Policy { name: "strict".into(), ..Policy::default() }] {
            conforms(&doc, &schema("Policy"), &serde_json::to_value(&policy).unwrap(), "policy").unwrap();
        }
        let info = crate::model::session::SessionInfo {
            id: "s".into(),
            mode: crate::model::session::Mode::Kernel,
            policy: "default".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            last_used_at: "2026-01-01T00:00:00Z".into(),
            ttl_s: 5,
            owner: Some("ab".into()),
            uid: 7,
            busy: true,
            disk_bytes: 0,
        };
        conforms(&doc, &schema("SessionInfo"), &serde_json::to_value(&info).unwrap(), "session").unwrap();
        let err = super::super::error::ApiError::new(crate::model::error::Code::MethodNotAllowed, "m");
        conforms(&doc, &schema("ErrorBody"), &err.body(), "error").unwrap();
        let done = crate::model::session::StatusAnswer { status: "deleted".into(), path: Some("a".into()) };
        conforms(&doc, &schema("Done"), &serde_json::to_value(&done).unwrap(), "done").unwrap();
        // Health, both ways: status and version only (no known token), and whole.
        let mut health = crate::model::health::Health::short("ok", "1");
        conforms(&doc, &schema("Health"), &serde_json::to_value(&health).unwrap(), "short health").unwrap();
        health.problems = Some(vec![]);
        health.rootfs_sha256 = Some("ab".into());
        health.cgroup = Some("cgroup v2".into());
        health.landlock_abi = Some(6);
        health.sessions = Some(2);
        health.busy_sessions = Some(1);
        health.pool = Some(crate::model::health::PoolStats::default());
        health.storage = Some(crate::model::health::StorageStats { free_bytes: Some(1), ..Default::default() });
        conforms(&doc, &schema("Health"), &serde_json::to_value(&health).unwrap(), "health").unwrap();
        assert_eq!(doc["components"]["schemas"]["Health"]["required"], json!(["status", "version"]));
        // And a script result is not taken for anything else.
        assert!(conforms(&doc, &schema("RunResult"), &json!({"run_id": "r"}), "x").is_err());
        assert!(conforms(&doc, &schema("Policy"), &json!({"nope": 1}), "x").is_err());
    }
}
