//! The registry over the in-memory [`Operations`] of the router's tests
//! (`service::fake`): schemas, descriptions, argument refusal, rendering.

use super::{Part, Registry, ToolOutput, UnknownTool};
use crate::model::policy::Policy;
use crate::model::policy::PolicyLimits;
use crate::service::fake::Memory;
use crate::service::Caller;
use serde_json::{json, Value};
use std::sync::Arc;

fn registry() -> (Arc<Memory>, Registry) {
    let memory = Arc::new(Memory::default());
    let limits = PolicyLimits::from(&Policy { timeout_s: 17, output_kb: 33, upload_mb: 9, ..Policy::default() });
    (memory.clone(), Registry::new(memory, Some(&limits)))
}

const ANYONE: Caller = Caller { owner: None };

async fn call(r: &Registry, name: &str, args: Value) -> ToolOutput {
    r.call(&ANYONE, name, args).await.unwrap()
}

#[test]
fn every_tool_is_listed_once_with_a_plain_object_schema() {
    let (_, r) = registry();
    let names: Vec<&str> = r.specs().iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        [
            "run_python",
            "run_shell",
            "create_session",
            "list_sessions",
            "close_session",
            "install_packages",
            "upload_file",
            "list_files",
            "read_file"
        ]
    );
    for spec in r.specs() {
        let schema = &spec.input_schema;
        assert_eq!(schema["type"], "object", "{}", spec.name);
        assert_eq!(
            schema.get("additionalProperties"),
            Some(&json!(false)),
            "{}: unknown arguments are refused",
            spec.name
        );
        for (arg, prop) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
            let declared = prop.to_string();
            assert!(!declared.contains("null") && prop.get("anyOf").is_none(), "{}.{arg}: {declared}", spec.name);
            assert!(prop["type"].is_string(), "{}.{arg}: {declared}", spec.name);
        }
        assert!(!spec.title.is_empty() && !spec.description.is_empty());
    }
    let run = &r.specs()[0];
    assert_eq!(run.input_schema["required"], json!(["code"]));
    assert_eq!(run.input_schema["properties"]["timeout_s"]["default"], 0);
    assert!(!run.hints.read_only && run.hints.destructive);
    let upload = r.specs().iter().find(|s| s.name == "upload_file").unwrap();
    assert_eq!(upload.input_schema["properties"]["overwrite"]["default"], false);
    assert!(r.specs().iter().find(|s| s.name == "list_files").unwrap().hints.read_only);
}

#[test]
fn descriptions_state_the_default_policys_limits() {
    let (_, r) = registry();
    let text = |name: &str| r.specs().iter().find(|s| s.name == name).unwrap().description.clone();
    for name in ["run_python", "run_shell"] {
        assert!(text(name).contains("17 s") && text(name).contains("33 KiB of output"), "{}", text(name));
    }
    assert!(text("upload_file").contains("Up to 9 MiB by default"), "{}", text("upload_file"));
    assert!(text("read_file").contains("MiB by default"), "{}", text("read_file"));
    let unknown = Registry::new(Arc::new(Memory::default()), None);
    assert!(unknown.specs()[0].description.contains("the session policy's"));
}

#[tokio::test]
async fn bad_arguments_are_error_results_that_name_them() {
    let (memory, r) = registry();
    let unknown = call(&r, "run_python", json!({"code": "1", "policy": "strict"})).await;
    assert!(unknown.is_error);
    assert!(
        unknown.text_of().starts_with("error invalid_request: invalid arguments: unknown field `policy`"),
        "{}",
        unknown.text_of()
    );
    let missing = call(&r, "run_python", json!({})).await;
    assert!(missing.is_error && missing.text_of().contains("missing field `code`"), "{}", missing.text_of());
    let typed = call(&r, "upload_file", json!({"path": "a", "content_base64": "eA==", "overwrite": "yes"})).await;
    assert!(typed.is_error && typed.text_of().contains("invalid type"), "{}", typed.text_of());
    let extra = call(&r, "list_sessions", json!({"all": true})).await;
    assert!(extra.is_error && extra.text_of().contains("unknown field `all`"), "{}", extra.text_of());
    assert_eq!(memory.calls(), 0, "nothing reached the service");
    assert!(matches!(r.call(&ANYONE, "rm_rf", json!({})).await, Err(UnknownTool(n)) if n == "rm_rf"));
    // No arguments at all is an empty object.
    assert!(!call(&r, "list_sessions", Value::Null).await.is_error);
}

#[tokio::test]
async fn a_session_id_is_checked_before_anything_is_touched() {
    let (memory, r) = registry();
    let out = call(&r, "close_session", json!({"session_id": "s1/files/x"})).await;
    assert!(out.is_error);
    assert!(
        out.text_of().starts_with("error invalid_session_id: invalid session id \"s1/files/x\""),
        "{}",
        out.text_of()
    );
    assert!(out.text_of().ends_with(" Next: pass a session_id exactly as create_session or a run returned it."));
    assert_eq!(memory.calls(), 0);
    let gone = call(&r, "list_files", json!({"session_id": "nosuch"})).await;
    assert!(gone.is_error && gone.text_of().starts_with("error session_not_found: "), "{}", gone.text_of());
    assert!(gone.text_of().ends_with("Next: call create_session, or omit session_id to start a new session."));
}

#[tokio::test]
async fn tools_render_what_the_service_answers() {
    let (_, r) = registry();
    let made = call(&r, "create_session", json!({"mode": "script"})).await;
    assert!(!made.is_error);
    assert_eq!(made.text_of(), "session_id: s1\nmode: script\npolicy: default\nttl_s: 600");
    let bad_mode = call(&r, "create_session", json!({"mode": "repl"})).await;
    assert!(bad_mode.is_error && bad_mode.text_of().contains("use \"script\" or \"kernel\""));

    let up = call(&r, "upload_file", json!({"session_id": "s1", "path": "d/a.txt", "content_base64": "aGk="})).await;
    assert_eq!(up.text_of(), "uploaded d/a.txt (2 bytes) to session s1\n");
    let again = call(&r, "upload_file", json!({"session_id": "s1", "path": "d/a.txt", "content_base64": "aGk="})).await;
    assert!(
        again.is_error && again.text_of().ends_with("Next: pass overwrite=true to replace it."),
        "{}",
        again.text_of()
    );
    let listed = call(&r, "list_files", json!({"session_id": "s1"})).await;
    assert!(listed.text_of().contains("\"path\": \"d/a.txt\""), "{}", listed.text_of());
    let read = call(&r, "read_file", json!({"session_id": "s1", "path": "d/a.txt"})).await;
    assert_eq!(read.parts, vec![Part::Text("hi".into())]);
    let binary = call(&r, "upload_file", json!({"session_id": "s1", "path": "b.bin", "content_base64": "/wA="})).await;
    assert!(!binary.is_error);
    let read = call(&r, "read_file", json!({"session_id": "s1", "path": "b.bin"})).await;
    assert!(
        read.text_of().starts_with("binary file b.bin (application/octet-stream, 2 bytes), base64:\n/wA="),
        "{}",
        read.text_of()
    );

    let ran = call(&r, "run_python", json!({"session_id": "s1", "code": "print(1)"})).await;
    assert!(!ran.is_error);
    assert!(ran.text_of().starts_with("status: ok (exit code 0)\nsession_id: s1\n"), "{}", ran.text_of());
    assert!(ran.text_of().contains("--- stdout ---\nran print(1)\n"), "{}", ran.text_of());
    // A run without a session makes one and says so.
    let fresh = call(&r, "run_shell", json!({"command": "ls"})).await;
    assert!(fresh.text_of().contains("note: this call made session s2"), "{}", fresh.text_of());

    let sessions = call(&r, "list_sessions", json!({})).await;
    assert!(sessions.text_of().contains("\"id\": \"s2\""));
    let closed = call(&r, "close_session", json!({"session_id": "s2"})).await;
    assert_eq!(closed.text_of(), "session s2 closed");
}

#[tokio::test]
async fn a_refused_call_makes_no_session() {
    let (memory, r) = registry();
    let big = "x".repeat(Policy::default().code_bytes() + 1);
    let out = call(&r, "run_python", json!({"code": big})).await;
    assert!(out.is_error && out.text_of().starts_with("error code_too_large"), "{}", &out.text_of()[..80]);
    let bad = call(&r, "upload_file", json!({"path": "a", "content_base64": "***"})).await;
    assert!(bad.is_error && bad.text_of().starts_with("error invalid_request: content_base64 is not valid base64"));
    assert!(memory.sessions.lock().unwrap().is_empty());
}

/// Bytes of `out` as an MCP result's JSON (images in base64), near enough.
fn json_size(out: &ToolOutput) -> usize {
    out.parts
        .iter()
        .map(|p| match p {
            Part::Text(t) => super::fit::escaped_len(t) + 40,
            Part::Image { mime, data, .. } => super::images::base64_len(data.len()) + mime.len() + 60,
        })
        .sum()
}

const ONE_MIB: usize = 1024 * 1024;

async fn upload(r: &Registry, path: &str, bytes: &[u8]) {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
    let up = call(r, "upload_file", json!({"session_id": "s1", "path": path, "content_base64": b64})).await;
    assert!(!up.is_error, "{}", up.text_of());
}

#[tokio::test]
async fn read_file_inlines_what_fits_and_says_how_to_fetch_the_rest() {
    let (_, r) = registry();
    call(&r, "create_session", json!({})).await;
    let text: String = (0..200_000).map(|i| format!("line {i}\n")).collect();
    upload(&r, "big.txt", text.as_bytes()).await;
    let out = call(&r, "read_file", json!({"session_id": "s1", "path": "big.txt"})).await;
    assert!(!out.is_error && json_size(&out) < ONE_MIB, "{}", json_size(&out));
    let Part::Text(shown) = &out.parts[0] else { panic!() };
    assert!(text.starts_with(shown.as_str()) && shown.len() > 800 * 1024);
    let note = out.text_of();
    assert!(note.contains(&format!("of big.txt's {} bytes shown", text.len())), "{note}");
    assert!(note.contains("/v1/sessions/s1/files/big.txt") && note.contains("sandboxctl files get s1"), "{note}");

    let binary: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8 | 0x80).collect();
    upload(&r, "big.bin", &binary).await;
    let out = call(&r, "read_file", json!({"session_id": "s1", "path": "big.bin"})).await;
    assert!(
        out.is_error && out.text_of().starts_with("error artifact_too_large: big.bin is 2000000 bytes"),
        "{}",
        out.text_of()
    );
    assert!(out.text_of().contains("sandboxctl files get s1"), "{}", out.text_of());
    // A binary file whose base64 fits is inlined whole.
    upload(&r, "small.bin", &binary[..600_000]).await;
    let out = call(&r, "read_file", json!({"session_id": "s1", "path": "small.bin"})).await;
    assert!(!out.is_error && json_size(&out) < ONE_MIB && out.text_of().starts_with("binary file small.bin"));
}

#[tokio::test]
async fn list_files_shows_what_fits_and_how_many_more() {
    let (_, r) = registry();
    call(&r, "create_session", json!({})).await;
    let name = "d".repeat(200);
    for i in 0..6000 {
        upload(&r, &format!("{name}/{i:05}.txt"), b"x").await;
    }
    let out = call(&r, "list_files", json!({"session_id": "s1"})).await;
    assert!(!out.is_error && json_size(&out) < ONE_MIB, "{}", json_size(&out));
    let Part::Text(json) = &out.parts[0] else { panic!() };
    let shown: Vec<Value> = serde_json::from_str(json).unwrap();
    assert!(shown.len() > 1000 && shown.len() < 6000, "{}", shown.len());
    let note = out.text_of();
    assert!(
        note.contains(&format!("{} of 6000 files shown, {} more not shown", shown.len(), 6000 - shown.len())),
        "{note}"
    );
}

#[test]
fn a_run_with_big_output_is_cut_to_fit_and_says_what_was_cut() {
    let mut run: crate::model::run::RunResult =
        serde_json::from_value(json!({"run_id": "r", "status": "ok", "exit_code": 0,
        "signal": null, "session_id": "s1", "duration_ms": 5, "stdout": "", "stderr": "", "stdout_truncated": false,
        "stderr_truncated": false, "artifacts": [], "artifacts_truncated": false}))
        .unwrap();
    run.stdout = "o\"\n".repeat(700_000);
    run.stderr = "small\n".into();
    let text = super::render::describe_run_within(&run, super::fit::MAX_RUN_TEXT);
    assert!(super::fit::escaped_len(&text) <= super::fit::MAX_RUN_TEXT, "{}", text.len());
    assert!(text.contains("--- stdout (cut: the first "), "{}", &text[..200]);
    assert!(text.contains(" of its 2100000 bytes shown"), "{}", &text[..200]);
    assert!(text.contains("--- stderr ---\nsmall\n"));
    // A small run is as it was.
    run.stdout = "hi\n".into();
    assert_eq!(super::render::describe_run_within(&run, super::fit::MAX_RUN_TEXT), super::render::describe_run(&run));
}
