//! What each tool does: its arguments parsed, the service's operations called
//! as the caller, and what came back rendered for a model.

use super::args::{InstallPackages, NewSession, NoArgs, ReadFile, RunPython, RunShell, SessionRef, UploadFile};
use super::failure::{session_arg, ToolError};
use super::fit::{self, escaped_len, MAX_RUN_TEXT, MAX_TEXT};
use super::images::{base64_len, fit_image_off_runtime, image_budget, images, MAX_IMAGE_BYTES, MAX_SOURCE_IMAGE_BYTES};
use super::render::{describe_run_within, made_note};
use super::{parse, Part, Registry, ToolOutput, Watch};
use crate::model::error::Code;
use crate::model::files::FileEntry;
use crate::model::policy::Policy;
use crate::model::run::{Language, RunRequest, Status};
use crate::model::session::CreateSessionRequest;
use crate::model::session::{Mode, SessionInfo};
use crate::service::{self, Caller, OpenFile};
use base64::Engine;
use serde_json::Value;
use std::io::Read;
use std::time::{Duration, Instant};

/// The output of a call that either failed or rendered what it got.
fn done(result: Result<ToolOutput, ToolError>) -> ToolOutput {
    result.unwrap_or_else(|e| ToolOutput::error(&e))
}

pub(super) async fn run_python(r: &Registry, caller: &Caller, args: Value, watch: &Watch) -> ToolOutput {
    match parse::<RunPython>(args) {
        Ok(a) => run(r, caller, watch, Language::Python, a.code, a.session_id, a.timeout_s).await,
        Err(out) => out,
    }
}

pub(super) async fn run_shell(r: &Registry, caller: &Caller, args: Value, watch: &Watch) -> ToolOutput {
    match parse::<RunShell>(args) {
        Ok(a) => run(r, caller, watch, Language::Shell, a.command, a.session_id, a.timeout_s).await,
        Err(out) => out,
    }
}

pub(super) async fn create_session(r: &Registry, caller: &Caller, args: Value) -> ToolOutput {
    let a = match parse::<NewSession>(args) {
        Ok(a) => a,
        Err(out) => return out,
    };
    let made = async {
        let mode = match a.mode.as_deref() {
            None => None,
            Some("script") => Some(Mode::Script),
            Some("kernel") => Some(Mode::Kernel),
            Some(other) => {
                return Err(ToolError::new(
                    Code::InvalidRequest,
                    format!("mode {other:?}: use \"script\" or \"kernel\""),
                ))
            }
        };
        let req = CreateSessionRequest { mode, policy: a.policy, ..CreateSessionRequest::default() };
        let s = r.ops.create_session(caller, req).await?;
        Ok(ToolOutput::text(format!(
            "session_id: {}\nmode: {}\npolicy: {}\nttl_s: {}",
            s.id,
            if s.mode == Mode::Kernel { "kernel" } else { "script" },
            s.policy,
            s.ttl_s
        )))
    };
    done(made.await)
}

pub(super) async fn list_sessions(r: &Registry, caller: &Caller, args: Value) -> ToolOutput {
    if let Err(out) = parse::<NoArgs>(args) {
        return out;
    }
    ToolOutput::text(serde_json::to_string_pretty(&r.ops.list_sessions(caller)).unwrap_or_default())
}

pub(super) async fn close_session(r: &Registry, caller: &Caller, args: Value) -> ToolOutput {
    let a = match parse::<SessionRef>(args) {
        Ok(a) => a,
        Err(out) => return out,
    };
    let closed = async {
        r.ops.close_session(caller, session_arg(&a.session_id)?).await?;
        Ok(ToolOutput::text(format!("session {} closed", a.session_id)))
    };
    done(closed.await)
}

pub(super) async fn install_packages(r: &Registry, caller: &Caller, args: Value, watch: &Watch) -> ToolOutput {
    let a = match parse::<InstallPackages>(args) {
        Ok(a) => a,
        Err(out) => return out,
    };
    let installed = async {
        let req = crate::model::packages::InstallRequest { packages: a.packages };
        let (sid, made) = match a.session_id {
            Some(id) => (session_arg(&id)?.to_string(), None),
            None => {
                // Checked first: a refused install makes no session.
                let check = |p: &Policy| crate::packages::check(p, &req.packages).map_err(service::Error::from);
                let info = new_session(r, caller, check).await?;
                (info.id.clone(), Some(info))
            }
        };
        let install = async {
            match r.ops.install_packages(caller, &sid, req).await {
                Ok(result) => {
                    let note = made.as_ref().map(made_note).unwrap_or_default();
                    Ok(ToolOutput::text(format!("{note}{}", super::render::describe_install(&result))))
                }
                Err(e) => {
                    if let Some(m) = &made {
                        discard(r, caller, m).await;
                    }
                    Err(e.into())
                }
            }
        };
        unless_given_up(r, caller, watch, made.as_ref(), &sid, install).await
    };
    done(installed.await)
}

pub(super) async fn upload_file(r: &Registry, caller: &Caller, args: Value, watch: &Watch) -> ToolOutput {
    let a = match parse::<UploadFile>(args) {
        Ok(a) => a,
        Err(out) => return out,
    };
    done(upload(r, caller, a, watch).await)
}

async fn upload(r: &Registry, caller: &Caller, a: UploadFile, watch: &Watch) -> Result<ToolOutput, ToolError> {
    if let Some(id) = a.session_id.as_deref() {
        session_arg(id)?;
    }
    crate::workspace::validate(&a.path).map_err(service::Error::from)?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(a.content_base64.trim()).map_err(|e| {
        ToolError::new(
            Code::InvalidRequest,
            format!("content_base64 is not valid base64 ({e}); encode the file's bytes with standard base64"),
        )
    })?;
    let (sid, made) = match a.session_id {
        Some(id) => (id, None),
        None => {
            // Checked against the new session's policy first: a refused upload makes no session.
            let size = bytes.len() as u64;
            let fits = |policy: &Policy| match policy.upload_bytes() {
                limit if size > limit => Err(service::Error::UploadTooLarge { limit }),
                _ => Ok(()),
            };
            let info = new_session(r, caller, fits).await?;
            (info.id.clone(), Some(info))
        }
    };
    let written = async {
        match write_file(r, caller, &sid, &a.path, a.overwrite.unwrap_or(false), bytes).await {
            Ok(f) => {
                let mut text = format!("uploaded {} ({} bytes) to session {sid}\n", f.path, f.size_bytes);
                text.push_str(&made.as_ref().map(made_note).unwrap_or_default());
                Ok(ToolOutput::text(text))
            }
            Err(e) => {
                if let Some(made) = &made {
                    discard(r, caller, made).await;
                }
                Err(e)
            }
        }
    };
    unless_given_up(r, caller, watch, made.as_ref(), &sid, written).await
}

pub(super) async fn list_files(r: &Registry, caller: &Caller, args: Value) -> ToolOutput {
    let a = match parse::<SessionRef>(args) {
        Ok(a) => a,
        Err(out) => return out,
    };
    let listed = async {
        let sid = session_arg(&a.session_id)?;
        let listing = r.ops.listing(caller, sid).await?;
        // As many entries as fit a result, in path order.
        let mut shown: Vec<FileEntry> = vec![];
        let mut used = 0;
        for entry in listing.files.iter() {
            let size = serde_json::to_string_pretty(&entry).map(|j| escaped_len(&j)).unwrap_or(0) + 64;
            if used + size > MAX_TEXT {
                break;
            }
            used += size;
            shown.push(entry);
        }
        let mut parts = vec![Part::Text(serde_json::to_string_pretty(&shown).unwrap_or_default())];
        let total = listing.files.len();
        let whole = format!("list them all with GET /v1/sessions/{sid}/files or `sandboxctl files ls {sid}`");
        if shown.len() < total {
            parts.push(Part::Text(format!(
                "note: {} of {total} files shown, {} more not shown: a tool result carries at most 1 MiB; {whole}",
                shown.len(),
                total - shown.len()
            )));
        } else if listing.partial {
            parts.push(Part::Text(format!(
                "note: the workspace holds more files than one listing shows (the first {total} in path order are here)"
            )));
        }
        Ok(ToolOutput { parts, is_error: false })
    };
    done(listed.await)
}

pub(super) async fn read_file(r: &Registry, caller: &Caller, args: Value) -> ToolOutput {
    let a = match parse::<ReadFile>(args) {
        Ok(a) => a,
        Err(out) => return out,
    };
    done(read(r, caller, a).await)
}

async fn read(r: &Registry, caller: &Caller, a: ReadFile) -> Result<ToolOutput, ToolError> {
    let sid = session_arg(&a.session_id)?;
    let limit = inline_limit(r, caller, sid)?;
    let path = a.path.as_str();
    let opened = r.ops.open_file(caller, sid, path).await?;
    let (size, mime) = (opened.size, opened.mime_type.clone());
    let image = mime == "image/png" || mime == "image/jpeg";
    let fetch = || {
        format!("download it from GET /v1/sessions/{sid}/files/{path} or with `sandboxctl files get {sid} {path:?} -o FILE`, or read a part of it with run_python")
    };
    let too_large =
        |what: &str| ToolError::new(Code::ArtifactTooLarge, format!("{path} is {size} bytes, {what}; {}", fetch()));
    if size > limit {
        return Err(too_large(&format!("more than the {limit} bytes that can be inlined")));
    }
    // What is read: an image whole (it is downscaled to fit), anything else as
    // much as could be shown.
    let want = if image { MAX_SOURCE_IMAGE_BYTES as u64 } else { MAX_TEXT as u64 };
    let (bytes, whole) = read_head(opened, want.min(limit))
        .await
        .map_err(|e| ToolError::from(service::Error::from(crate::workspace::Error::Io(path.to_string(), e))))?;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let fits_base64 = |n: usize| base64_len(n) + 256 <= MAX_TEXT;
    if image && whole {
        let max_bytes = (MAX_TEXT / 4 * 3).min(MAX_IMAGE_BYTES);
        return match fit_image_off_runtime(bytes.clone(), mime.clone(), max_bytes).await {
            Ok((data, mime)) => Ok(ToolOutput {
                parts: vec![Part::Image { mime, data, path: Some(path.to_string()) }],
                is_error: false,
            }),
            Err(_) if fits_base64(bytes.len()) => Ok(ToolOutput::text(b64(&bytes))),
            Err(_) => Err(too_large("an image that does not fit a tool result (1 MiB) even downscaled")),
        };
    }
    if image {
        return Err(too_large(&format!(
            "more than the {MAX_SOURCE_IMAGE_BYTES} bytes of image that are read to be shown"
        )));
    }
    // Text: whole, or its start (a character cut at the end of what was read is
    // no sign of a binary file).
    let text = match std::str::from_utf8(&bytes) {
        Ok(t) => Some(t),
        Err(e) if e.error_len().is_none() && !whole => std::str::from_utf8(&bytes[..e.valid_up_to()]).ok(),
        Err(_) => None,
    };
    if let Some(text) = text {
        let kept = fit::cut(text, MAX_TEXT);
        if whole && kept.len() == text.len() {
            return Ok(ToolOutput::text(text));
        }
        let note = format!(
            "note: cut: the first {} of {path}'s {size} bytes shown, a tool result carries at most 1 MiB; for the rest, {}",
            kept.len(),
            fetch()
        );
        return Ok(ToolOutput { parts: vec![Part::Text(kept.to_string()), Part::Text(note)], is_error: false });
    }
    if whole && fits_base64(bytes.len()) {
        return Ok(ToolOutput::text(format!(
            "binary file {path} ({mime}, {} bytes), base64:\n{}",
            bytes.len(),
            b64(&bytes)
        )));
    }
    Err(too_large("a binary file whose base64 does not fit a tool result (1 MiB)"))
}

/// The first `limit` bytes of an opened file, read on a blocking thread, and
/// whether that is all of it.
async fn read_head(opened: OpenFile, limit: u64) -> Result<(Vec<u8>, bool), std::io::Error> {
    tokio::task::spawn_blocking(move || {
        let mut bytes = vec![];
        (&opened.file).take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
        let whole = bytes.len() as u64 <= limit;
        bytes.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok((bytes, whole))
    })
    .await
    .map_err(std::io::Error::other)?
}

/// A run of `code`, in `session_id` or in a session made for it (after the
/// request passed the policy that session gets, so a refused run makes nothing;
/// closed again if the run is refused or cancelled after all, and named in the
/// result when it is kept).
async fn run(
    r: &Registry,
    caller: &Caller,
    watch: &Watch,
    language: Language,
    code: String,
    session_id: Option<String>,
    timeout_s: Option<f64>,
) -> ToolOutput {
    if let Some(Err(e)) = session_id.as_deref().map(session_arg) {
        return ToolOutput::error(&e);
    }
    // 0, the schema's default, is the session policy's limit.
    let timeout_s = timeout_s.filter(|t| *t != 0.0);
    let mut req = RunRequest { code, session_id, language, timeout_s, ..RunRequest::default() };
    let (sid, made) = match req.session_id.clone() {
        Some(id) => (id, None),
        None => match new_session(r, caller, |policy| crate::run::validate(&req, policy).map(drop).map_err(Into::into))
            .await
        {
            Ok(info) => (info.id.clone(), Some(info)),
            Err(e) => return ToolOutput::error(&e),
        },
    };
    req.session_id = Some(sid.clone());
    let request = r.ops.run(caller, req);
    tokio::pin!(request);
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let result = loop {
        tokio::select! {
            res = &mut request => break res,
            _ = watch.cancelled.cancelled() => {
                // The client gave up: stop the run so nothing is left running
                // (closing a session made for it stops it too).
                if made.is_none() {
                    drop(r.ops.cancel_run(caller, &sid));
                }
                return given_up(r, caller, made.as_ref(), &sid).await;
            }
            _ = tick.tick() => {
                if let Some(progress) = &watch.progress {
                    let secs = started.elapsed().as_secs_f64().floor();
                    progress(secs, format!("running for {secs} s")).await;
                }
            }
        }
    };
    match result {
        Ok(run) => {
            // Fitting figures takes a while: a client that gave up meanwhile
            // stops it, and a session made for the call goes.
            let rendered = async {
                let mut text = describe_run_within(&run, MAX_RUN_TEXT);
                text.push_str(&made.as_ref().map(made_note).unwrap_or_default());
                let (images, left_out) = images(&*r.ops, caller, &run, image_budget(&text, &run)).await;
                for line in left_out {
                    text.push_str(&format!("note: image {line}\n"));
                }
                let mut parts = vec![Part::Text(text)];
                parts.extend(images);
                Ok(ToolOutput { parts, is_error: run.status != Status::Ok })
            };
            done(unless_given_up(r, caller, watch, made.as_ref(), &sid, rendered).await)
        }
        Err(e) => {
            if let Some(info) = &made {
                discard(r, caller, info).await;
            }
            ToolOutput::error(&e.into())
        }
    }
}

/// The session policy's limit for inlining file content, in bytes.
fn inline_limit(r: &Registry, caller: &Caller, id: &str) -> Result<u64, ToolError> {
    let policy = r.ops.get_session(caller, id)?.policy;
    Ok(r.ops.policy(Some(&policy))?.mcp_inline_mb * 1024 * 1024)
}

/// A session made for this call alone, once `check` has passed the call against
/// the policy it will have (the daemon's default): a call that would be refused
/// makes nothing. The call keeps it (and names it in its result) or
/// [`discard`]s it.
async fn new_session(
    r: &Registry,
    caller: &Caller,
    check: impl FnOnce(&Policy) -> Result<(), service::Error>,
) -> Result<SessionInfo, ToolError> {
    let policy = r.ops.policy(None)?;
    check(&policy)?;
    Ok(r.ops.create_session(caller, CreateSessionRequest::default()).await?)
}

/// The answer to a call whose client gave up: a session made for it is closed
/// (which stops whatever it still did).
async fn given_up(r: &Registry, caller: &Caller, made: Option<&SessionInfo>, sid: &str) -> ToolOutput {
    if let Some(info) = made {
        discard(r, caller, info).await;
    }
    ToolOutput {
        parts: vec![Part::Text(format!("error cancelled: the call in session {sid} was stopped"))],
        is_error: true,
    }
}

/// `work`, unless the client gives up first (see [`given_up`]).
async fn unless_given_up(
    r: &Registry,
    caller: &Caller,
    watch: &Watch,
    made: Option<&SessionInfo>,
    sid: &str,
    work: impl std::future::Future<Output = Result<ToolOutput, ToolError>>,
) -> Result<ToolOutput, ToolError> {
    tokio::select! {
        out = work => match out {
            // Done as the client left: it will not read that a session was made.
            Ok(_) if watch.cancelled.is_cancelled() => Ok(given_up(r, caller, made, sid).await),
            out => out,
        },
        _ = watch.cancelled.cancelled() => Ok(given_up(r, caller, made, sid).await),
    }
}

/// Close a session this call made, whose call failed: nothing of a refused call
/// stays behind. (A close that fails leaves it to its TTL; it is logged.)
async fn discard(r: &Registry, caller: &Caller, made: &SessionInfo) {
    if let Err(e) = r.ops.close_session(caller, &made.id).await {
        tracing::warn!(session_id = %made.id, error = %e, "could not close the session made for a failed tool call");
    }
}

/// Write `data` to `path` in session `id`, on a blocking thread.
async fn write_file(
    r: &Registry,
    caller: &Caller,
    id: &str,
    path: &str,
    overwrite: bool,
    data: Vec<u8>,
) -> Result<FileEntry, ToolError> {
    let mut upload = r.ops.create_file(caller, id, path, overwrite).await?;
    let written = tokio::task::spawn_blocking(move || {
        if let Err(e) = upload.write(&data) {
            upload.abort();
            return Err(e);
        }
        upload.finish()
    })
    .await
    .map_err(|e| ToolError::new(Code::Internal, format!("the upload failed: {e}")))?;
    Ok(written?)
}
