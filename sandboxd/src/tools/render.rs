//! What a model reads: a run's result as text, the tools' descriptions (with the
//! default policy's limits) and their argument schemas.

use super::fit::{cut, escaped_len, shares};
use crate::model::policy::PolicyLimits;
use crate::model::run::{ArtifactKind, RunResult, Status};
use crate::model::session::SessionInfo;

/// What a sandbox of `default` (the daemon's default policy) may reach, said for a model.
fn network(default: Option<&PolicyLimits>) -> String {
    use crate::model::policy::Network;
    match default {
        Some(p) if p.network == Network::Allowlist && p.packages_mb > 0 => format!(
            "Network: only {} (through a proxy); install missing packages with install_packages (or pip install in the code) before importing them",
            p.allow_hosts.join(", ")
        ),
        Some(p) if p.network == Network::Allowlist => format!("Network: only {} (through a proxy)", p.allow_hosts.join(", ")),
        Some(_) => "No network".to_string(),
        None => "Network: as the session's policy allows".to_string(),
    }
}

/// The limits of a run under `default` (the daemon's default policy), when known.
fn run_limits(default: Option<&PolicyLimits>) -> String {
    match default {
        Some(p) => format!(
            "Limits per run (policy {:?}, the default): {} s, {} MiB memory, {} CPU, {} KiB of output per stream.",
            p.name, p.timeout_s, p.memory_mb, p.cpus, p.output_kb
        ),
        None => "Limits per run: the session policy's (time, memory, CPU, output per stream).".to_string(),
    }
}

pub(super) fn run_python(default: Option<&PolicyLimits>) -> String {
    format!("Run Python 3.11 code in a fresh, isolated Linux sandbox and return its status, exit code, stdout, stderr and the files it created or changed. The working directory is the session's workspace: files persist between runs of the same session (pass session_id; omit it to start a new session, whose id is returned). numpy, pandas, scipy, scikit-learn, matplotlib, seaborn, pillow, openpyxl, pyarrow and reportlab are installed. {}. Open matplotlib figures are saved automatically and returned as images; plt.show() saves instead of blocking. {}", network(default), run_limits(default))
}

pub(super) fn run_shell(default: Option<&PolicyLimits>) -> String {
    format!("Run a bash command in the same kind of isolated sandbox as run_python, in the session's workspace, and return status, exit code, stdout, stderr and changed files. Useful for ls, head, wc, or running a script written by run_python. {}. {}", network(default), run_limits(default))
}

pub(super) fn install_packages(default: Option<&PolicyLimits>) -> String {
    let room = match default {
        Some(p) if p.packages_mb > 0 => format!(" A session holds up to {} MiB of packages.", p.packages_mb),
        Some(_) => " The default policy installs no packages: use a session of a policy that does.".to_string(),
        None => String::new(),
    };
    format!("Install Python packages (wheels from the package index) into a session, so that its later run_python calls can import them; other sessions do not see them. Give requirements such as \"requests\" or \"tabulate==0.9.0\"; their dependencies come too, and packages already installed (numpy, pandas, ...) are kept as they are. Omit session_id to start a new session, whose id is returned.{room}")
}

/// What an install did, for a model.
pub(super) fn describe_install(r: &crate::model::packages::InstallResult) -> String {
    let mut text = String::new();
    if r.installed.is_empty() {
        text.push_str("nothing to install: already there\n");
    } else {
        let names: Vec<String> = r.installed.iter().map(|p| format!("{}=={}", p.name, p.version)).collect();
        text.push_str(&format!("installed: {}\n", names.join(", ")));
    }
    if !r.unchanged.is_empty() {
        text.push_str(&format!("already there: {}\n", r.unchanged.join(", ")));
    }
    text.push_str(&format!(
        "session_id: {}\nthe session's packages take {} MiB of {} MiB; import them in run_python calls with this session_id\n",
        r.session_id,
        r.layer_bytes / (1024 * 1024),
        r.layer_limit_bytes / (1024 * 1024)
    ));
    text
}

pub(super) fn create_session(_: Option<&PolicyLimits>) -> String {
    "Create a session: a workspace whose files persist across runs until it is closed or idle for longer than its ttl_s (returned). Returns the session_id to pass to the other tools.".to_string()
}

pub(super) fn upload_file(default: Option<&PolicyLimits>) -> String {
    // rmcp refuses an HTTP request body over 4 MiB: the base64 of about 2.9 MiB.
    let transport = "a tool call over MCP's HTTP transport carries at most 4 MiB (about 2.9 MiB of file): upload bigger files with PUT /v1/sessions/ID/files/PATH";
    let upload = match default {
        Some(p) => format!("Up to {} MiB by default; {transport}.", p.upload_mb),
        None => format!("Up to the session policy's upload limit; {transport}."),
    };
    format!("Upload a file (base64) into a session's workspace so code can read it by its relative path. Omit session_id to start a new session. {upload}")
}

pub(super) fn read_file(default: Option<&PolicyLimits>) -> String {
    let inline = match default {
        Some(p) => format!("the policy's inline limit ({} MiB by default)", p.mcp_inline_mb),
        None => "the policy's inline limit".to_string(),
    };
    format!("Read a file from a session's workspace: text files as text, PNG/JPEG images as images, other files as base64. Files larger than {inline} are refused; use their download URL instead. A result carries at most 1 MiB: of a longer text file it shows the start, and says where the rest is; a binary file whose base64 does not fit is refused the same way.")
}

/// Declare each optional argument as its plain type with its default, never as
/// "X or null": clients that build arguments from the schema (the MCP Inspector)
/// send a value of a union type as a string, which the tool then refuses.
/// Defaults: `timeout_s` 0 (the session policy's limit), `overwrite` false.
pub(super) fn plain_schema(schema: &mut serde_json::Map<String, serde_json::Value>) {
    use serde_json::Value;
    let Some(Value::Object(props)) = schema.get_mut("properties") else { return };
    for (name, prop) in props.iter_mut() {
        let Value::Object(prop) = prop else { continue };
        if let Some(Value::Array(types)) = prop.get("type") {
            let kept: Vec<Value> = types.iter().filter(|t| t.as_str() != Some("null")).cloned().collect();
            if let [one] = kept.as_slice() {
                prop.insert("type".into(), one.clone());
            }
        }
        if let Some(Value::Array(any)) = prop.get("anyOf") {
            let kept: Vec<Value> =
                any.iter().filter(|a| a.get("type").and_then(Value::as_str) != Some("null")).cloned().collect();
            if let [Value::Object(one)] = kept.as_slice() {
                let one = one.clone();
                prop.remove("anyOf");
                for (k, v) in one {
                    prop.entry(k).or_insert(v);
                }
            }
        }
        match name.as_str() {
            "timeout_s" => {
                prop.insert("default".into(), Value::from(0));
                prop.insert("minimum".into(), Value::from(0));
            }
            "overwrite" => {
                prop.insert("default".into(), Value::from(false));
            }
            _ => {}
        }
    }
}

fn status_name(s: Status) -> &'static str {
    match s {
        Status::Ok => "ok",
        Status::Error => "error",
        Status::Timeout => "timeout",
        Status::Oom => "oom",
        Status::Killed => "killed",
    }
}

/// The run result as text a model reads well.
pub fn describe_run(r: &RunResult) -> String {
    describe_run_within(r, usize::MAX)
}

/// [`describe_run`] in at most about `max` bytes of JSON string: past that, the
/// files changed are listed as far as a quarter of it goes, and stdout, stderr
/// and a kernel's result share the rest, each cut to its share and saying so.
pub fn describe_run_within(r: &RunResult, max: usize) -> String {
    let mut head = format!(
        "status: {}{}\nsession_id: {}\nduration_ms: {}\n",
        status_name(r.status),
        match (r.exit_code, &r.signal) {
            (Some(c), _) => format!(" (exit code {c})"),
            (None, Some(sig)) => format!(" (signal {sig})"),
            _ => String::new(),
        },
        r.session_id,
        r.duration_ms,
    );
    match r.status {
        Status::Timeout => {
            head.push_str("note: the run hit its time limit; shorten the work or pass a larger timeout_s\n")
        }
        Status::Oom => head.push_str("note: the run ran out of memory; use less data at once\n"),
        _ => {}
    }
    let kernel = r.kernel.as_ref();
    let restarted = match kernel.is_some_and(|k| k.kernel_restarted) {
        true => "note: the kernel was restarted: variables from earlier runs are gone\n",
        false => "",
    };
    // Room for the streams' headers and cut notes.
    let fixed = escaped_len(&head) + escaped_len(restarted) + 3 * 256;
    let files = files_changed(r, max.saturating_sub(fixed) / 4);
    let result = kernel.and_then(|k| k.result.as_ref()).and_then(|v| v.plain()).unwrap_or("");
    let streams = [
        ("stdout", r.stdout.as_str(), r.stdout_truncated),
        ("stderr", &r.stderr, r.stderr_truncated),
        ("result", result, false),
    ];
    let wants: Vec<usize> = streams.iter().map(|(_, t, _)| escaped_len(t)).collect();
    let budget = max.saturating_sub(fixed + escaped_len(&files));
    let shares = shares(&wants, budget);
    let mut s = head;
    for ((name, text, truncated), share) in streams.into_iter().zip(shares) {
        if text.is_empty() {
            continue;
        }
        let kept = cut(text, share);
        let mut notes = vec![];
        if truncated {
            notes.push("truncated".to_string());
        }
        if kept.len() < text.len() {
            notes.push(format!(
                "cut: the first {} of its {} bytes shown, a tool result carries at most 1 MiB; write big output to a file and read parts of it",
                kept.len(),
                text.len()
            ));
        }
        let notes = if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) };
        if name == "result" {
            s.push_str(&format!("--- result{notes} ---\n{kept}\n"));
            continue;
        }
        s.push_str(&format!("--- {name}{notes} ---\n{kept}"));
        if !kept.ends_with('\n') {
            s.push('\n');
        }
    }
    s.push_str(restarted);
    s.push_str(&files);
    s
}

/// The run's files created or changed, one line each, as many as fit `max`
/// bytes of JSON string.
fn files_changed(r: &RunResult, max: usize) -> String {
    if r.artifacts.is_empty() {
        return String::new();
    }
    let mut s = "--- files created or changed (in the session's working directory) ---\n".to_string();
    let mut used = escaped_len(&s);
    for (i, a) in r.artifacts.iter().enumerate() {
        let line = format!(
            "{} ({}, {} bytes{}) {}\n",
            a.path,
            a.mime_type,
            a.size_bytes,
            if a.kind == ArtifactKind::Figure { ", figure" } else { "" },
            a.url
        );
        used += escaped_len(&line);
        if used > max {
            s.push_str(&format!(
                "(and {} more files not listed here, a tool result carries at most 1 MiB; see list_files)\n",
                r.artifacts.len() - i
            ));
            return s;
        }
        s.push_str(&line);
    }
    if r.artifacts_truncated {
        s.push_str("(more files changed than listed; see list_files)\n");
    }
    s
}

/// The line a result adds when its call made the session it used and keeps it: the
/// model learns the id, and that the session holds resources until it is closed.
pub(super) fn made_note(s: &SessionInfo) -> String {
    format!(
        "note: this call made session {id} (policy {policy}); pass session_id {id} to use its files again; \
         close it with close_session when done (it closes itself after {ttl} s unused)\n",
        id = s.id,
        policy = s.policy,
        ttl = s.ttl_s
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_a_run_for_a_model() {
        let r: RunResult = serde_json::from_value(serde_json::json!({"run_id": "r", "status": "error", "exit_code": 1, "signal": null, "session_id": "s1", "duration_ms": 5,
            "stdout": "hi", "stderr": "boom\n", "stdout_truncated": false, "stderr_truncated": true,
            "artifacts": [{"path": "a.png", "mime_type": "image/png", "size_bytes": 3, "kind": "figure", "url": "http://x/a.png"}],
            "artifacts_truncated": false}))
        .unwrap();
        assert!(r.kernel.is_none());
        let text = describe_run(&r);
        assert!(text.starts_with("status: error (exit code 1)\nsession_id: s1\n"), "{text}");
        assert!(text.contains("--- stdout ---\nhi\n--- stderr (truncated) ---\nboom\n"), "{text}");
        assert!(text.contains("a.png (image/png, 3 bytes, figure) http://x/a.png"), "{text}");
    }

    #[test]
    fn a_made_session_is_named_with_what_to_do() {
        let info: SessionInfo =
            serde_json::from_value(serde_json::json!({"id": "s9", "mode": "script", "policy": "default",
            "created_at": "t", "last_used_at": "t", "ttl_s": 1800, "busy": false}))
            .unwrap();
        let note = made_note(&info);
        assert!(note.starts_with("note: this call made session s9 (policy default); pass session_id s9"), "{note}");
        assert!(note.contains("close_session") && note.contains("1800 s") && note.ends_with('\n'), "{note}");
    }
}
