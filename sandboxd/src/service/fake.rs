//! A small in-memory [`Operations`] for unit tests (no root, no kernel): the
//! router's tests (`api/tests.rs`) and the tool registry's (`tools/tests.rs`)
//! drive their real code over it. A run's stdout is `ran <code>`.

use crate::isolate::output::{Chunk, Stream};
use crate::model::chat::{Chat, ChatList};
use crate::model::check;
use crate::model::files::FileEntry;
use crate::model::health::Problem;
use crate::model::packages::{InstallRequest, InstallResult, InstalledPackage};
use crate::model::policy::Policy;
use crate::model::records::{RunPage, RunRecord};
use crate::model::run::{RunRequest, RunResult, Status};
use crate::model::secrets::{SecretInfo, SecretRequest, SecretSource};
use crate::model::session::{CreateSessionRequest, Mode, SessionInfo, StatusAnswer};
use crate::run;
use crate::service::{self, Caller, Condition, FileUpload, Listing, OpenFile, Operations, RunDone};
use crate::session;
use crate::workspace;
use futures_util::future::BoxFuture;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

/// Each file's bytes, by session key and path.
type Files = Arc<Mutex<BTreeMap<(String, String), Vec<u8>>>>;

/// Sessions and files in memory. Session ids go through the real
/// [`session::key`] (the same rules as the daemon's session manager); `fail`
/// makes the next operation fail with that error; `calls` counts the operations
/// that reached it and `owners` records whose they were.
#[derive(Default)]
pub(crate) struct Memory {
    pub(crate) sessions: Mutex<BTreeMap<String, SessionInfo>>,
    pub(crate) files: Files,
    pub(crate) fail: Mutex<Option<service::Error>>,
    pub(crate) calls: Mutex<usize>,
    pub(crate) owners: Mutex<Vec<Option<String>>>,
    pub(crate) problems: Vec<Problem>,
    /// A run's result is this error instead.
    pub(crate) run_fails: bool,
}

impl Memory {
    /// Count the call and fail it if a failure is set.
    fn enter(&self, caller: &Caller) -> Result<(), service::Error> {
        *self.calls.lock().unwrap() += 1;
        self.owners.lock().unwrap().push(caller.owner.clone());
        match self.fail.lock().unwrap().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub(crate) fn calls(&self) -> usize {
        *self.calls.lock().unwrap()
    }

    fn session(&self, caller: &Caller, id: &str) -> Result<(String, SessionInfo), service::Error> {
        let key = session::key(id, caller.owner.as_deref())?;
        let info = self.sessions.lock().unwrap().get(&key).cloned();
        Ok((key, info.ok_or_else(|| session::Error::NotFound(id.to_string()))?))
    }

    fn insert(&self, caller: &Caller, id: Option<String>) -> Result<SessionInfo, service::Error> {
        let id = id.unwrap_or_else(|| format!("s{}", self.sessions.lock().unwrap().len() + 1));
        let key = session::key(&id, caller.owner.as_deref())?;
        let info = SessionInfo {
            id: id.clone(),
            mode: Mode::Script,
            policy: "default".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            last_used_at: "2026-01-01T00:00:00Z".into(),
            ttl_s: 600,
            owner: caller.owner.clone(),
            uid: 0,
            busy: false,
            disk_bytes: 0,
        };
        let mut sessions = self.sessions.lock().unwrap();
        if sessions.contains_key(&key) {
            return Err(session::Error::Exists(id).into());
        }
        sessions.insert(key, info.clone());
        Ok(info)
    }

    fn entry(id: &str, path: &str, size: u64) -> FileEntry {
        FileEntry {
            path: path.into(),
            size_bytes: size,
            mime_type: crate::artifacts::mime_type(std::path::Path::new(path)),
            modified_at: "2026-01-01T00:00:00Z".into(),
            url: format!("http://localhost/v1/sessions/{id}/files/{path}"),
        }
    }
}

struct MemoryUpload {
    files: Files,
    key: (String, String),
    id: String,
    bytes: Vec<u8>,
}

impl FileUpload for MemoryUpload {
    fn write(&mut self, chunk: &[u8]) -> Result<(), service::Error> {
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }
    fn finish(self: Box<Self>) -> Result<FileEntry, service::Error> {
        let entry = Memory::entry(&self.id, &self.key.1, self.bytes.len() as u64);
        self.files.lock().unwrap().insert(self.key, self.bytes);
        Ok(entry)
    }
    fn abort(self: Box<Self>) {}
}

impl Operations for Memory {
    fn policy(&self, name: Option<&str>) -> Result<Arc<Policy>, service::Error> {
        match name {
            None | Some("default") => Ok(Arc::new(Policy::default())),
            Some(n) => Err(session::Error::PolicyNotFound { name: n.into(), known: vec!["default".into()] }.into()),
        }
    }
    fn policies(&self) -> Vec<Policy> {
        vec![Policy::default()]
    }
    fn max_code_bytes(&self) -> Option<usize> {
        Some(Policy::default().code_bytes())
    }
    fn create_session<'a>(
        &'a self,
        caller: &'a Caller,
        req: CreateSessionRequest,
    ) -> BoxFuture<'a, Result<SessionInfo, service::Error>> {
        Box::pin(async move {
            self.enter(caller)?;
            self.policy(req.policy.as_deref())?;
            self.insert(caller, req.id)
        })
    }
    fn get_session(&self, caller: &Caller, id: &str) -> Result<SessionInfo, service::Error> {
        self.enter(caller)?;
        Ok(self.session(caller, id)?.1)
    }
    fn list_sessions(&self, caller: &Caller) -> Vec<SessionInfo> {
        let _ = self.enter(caller);
        self.sessions.lock().unwrap().values().filter(|s| s.owner == caller.owner).cloned().collect()
    }
    fn close_session<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
    ) -> BoxFuture<'a, Result<StatusAnswer, service::Error>> {
        Box::pin(async move {
            self.enter(caller)?;
            let (key, _) = self.session(caller, id)?;
            self.sessions.lock().unwrap().remove(&key);
            Ok(StatusAnswer { status: "closed".into(), path: None })
        })
    }
    fn cancel_run(&self, caller: &Caller, id: &str) -> Result<StatusAnswer, service::Error> {
        self.enter(caller)?;
        self.session(caller, id)?;
        Ok(StatusAnswer { status: "idle".into(), path: None })
    }
    fn start_run<'a>(
        &'a self,
        caller: &'a Caller,
        req: RunRequest,
        chunks: Option<mpsc::Sender<Chunk>>,
    ) -> BoxFuture<'a, Result<RunDone, service::Error>> {
        Box::pin(async move {
            self.enter(caller)?;
            run::validate(&req, &Policy::default())?;
            let session_id = match &req.session_id {
                Some(id) => self.session(caller, id)?.1.id,
                None => {
                    self.policy(req.policy.as_deref())?;
                    self.insert(caller, None)?.id
                }
            };
            let (tx, rx) = oneshot::channel();
            let fails = self.run_fails;
            tokio::spawn(async move {
                if let Some(chunks) = chunks {
                    for (stream, text) in [(Stream::Stdout, "out\n"), (Stream::Stderr, "err\n")] {
                        let _ = chunks.send(Chunk { stream, text: text.into() }).await;
                    }
                }
                let result = if fails {
                    Err(run::Error::Internal { context: "starting the sandbox".into(), error: "/host/path".into() }
                        .into())
                } else {
                    Ok(RunResult {
                        run_id: "r1".into(),
                        session_id,
                        status: Status::Ok,
                        exit_code: Some(0),
                        signal: None,
                        stdout: format!("ran {}", req.code),
                        stderr: String::new(),
                        stdout_truncated: false,
                        stderr_truncated: false,
                        duration_ms: 5,
                        artifacts: vec![],
                        artifacts_truncated: false,
                        usage: Default::default(),
                        kernel: None,
                    })
                };
                let _ = tx.send(result);
            });
            Ok(rx)
        })
    }
    fn listing<'a>(&'a self, caller: &'a Caller, id: &'a str) -> BoxFuture<'a, Result<Listing, service::Error>> {
        Box::pin(async move {
            self.enter(caller)?;
            let (key, info) = self.session(caller, id)?;
            let mut listed = crate::listing::Files::new(format!("http://localhost/v1/sessions/{}/files/", info.id));
            let modified = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_767_225_600);
            for ((_, p), b) in self.files.lock().unwrap().iter().filter(|((k, _), _)| *k == key) {
                listed.push(p.as_bytes(), b.len() as u64, modified);
            }
            Ok(Listing { files: listed, partial: false })
        })
    }
    fn open_file<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<OpenFile, service::Error>> {
        Box::pin(async move {
            self.enter(caller)?;
            let rel = workspace::validate(path)?;
            let (key, _) = self.session(caller, id)?;
            let bytes = self.files.lock().unwrap().get(&(key, path.to_string())).cloned();
            let bytes = bytes.ok_or_else(|| workspace::Error::NotFound(path.to_string()))?;
            let mut file = tempfile::tempfile().unwrap();
            std::io::Write::write_all(&mut file, &bytes).unwrap();
            std::io::Seek::rewind(&mut file).unwrap();
            let name = rel.file_name().unwrap().to_string_lossy().into_owned();
            Ok(OpenFile {
                file,
                size: bytes.len() as u64,
                mime_type: crate::artifacts::mime_type(&rel),
                name: name.into(),
                hold: None,
            })
        })
    }
    fn create_file<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        path: &'a str,
        overwrite: bool,
    ) -> BoxFuture<'a, Result<Box<dyn FileUpload>, service::Error>> {
        Box::pin(async move {
            self.enter(caller)?;
            workspace::validate(path)?;
            let (key, info) = self.session(caller, id)?;
            let key = (key, path.to_string());
            if !overwrite && self.files.lock().unwrap().contains_key(&key) {
                return Err(workspace::Error::Exists(path.into()).into());
            }
            Ok(Box::new(MemoryUpload { files: self.files.clone(), key, id: info.id, bytes: vec![] })
                as Box<dyn FileUpload>)
        })
    }
    fn delete_file<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<StatusAnswer, service::Error>> {
        Box::pin(async move {
            self.enter(caller)?;
            let (key, _) = self.session(caller, id)?;
            match self.files.lock().unwrap().remove(&(key, path.to_string())) {
                Some(_) => Ok(StatusAnswer { status: "deleted".into(), path: Some(path.into()) }),
                None => Err(workspace::Error::NotFound(path.into()).into()),
            }
        })
    }
    fn list_runs<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        before: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<RunPage, service::Error>> {
        Box::pin(async move {
            self.enter(caller)?;
            self.session(caller, id)?;
            match before {
                Some(b) => Err(service::Error::RunNotFound { session: id.into(), run_id: b.into() }),
                None => Ok(RunPage { runs: vec![], next: Some(format!("{limit}")) }),
            }
        })
    }
    fn get_run<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<RunRecord, service::Error>> {
        Box::pin(async move {
            self.enter(caller)?;
            self.session(caller, id)?;
            Err(service::Error::RunNotFound { session: id.into(), run_id: run_id.into() })
        })
    }
    /// The fake keeps no conversations: each session has none.
    fn list_chats<'a>(&'a self, caller: &'a Caller, id: &'a str) -> BoxFuture<'a, Result<ChatList, service::Error>> {
        Box::pin(async move {
            self.enter(caller)?;
            self.session(caller, id)?;
            Ok(ChatList { chats: vec![] })
        })
    }
    fn get_chat<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        chat_id: &'a str,
    ) -> BoxFuture<'a, Result<Chat, service::Error>> {
        Box::pin(async move {
            self.enter(caller)?;
            self.session(caller, id)?;
            Err(service::Error::ChatNotFound { session: id.into(), chat_id: chat_id.into() })
        })
    }
    fn save_chat<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        _chat: &'a Chat,
    ) -> BoxFuture<'a, Result<(), service::Error>> {
        Box::pin(async move {
            self.enter(caller)?;
            self.session(caller, id)?;
            Ok(())
        })
    }
    /// The host as the fake finds it: one requirement met, one not.
    fn install_packages<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        req: InstallRequest,
    ) -> BoxFuture<'a, Result<InstallResult, service::Error>> {
        Box::pin(async move {
            self.enter(caller)?;
            let (_, info) = self.session(caller, id)?;
            crate::packages::check(&Policy::default(), &req.packages)?;
            Ok(InstallResult {
                session_id: info.id,
                installed: req
                    .packages
                    .iter()
                    .map(|p| InstalledPackage { name: p.clone(), version: "1.0".into() })
                    .collect(),
                unchanged: vec![],
                duration_ms: 5,
                layer_bytes: 1024,
                layer_limit_bytes: 1 << 30,
                net: Default::default(),
            })
        })
    }

    fn set_secret(
        &self,
        caller: &Caller,
        id: &str,
        name: &str,
        req: SecretRequest,
    ) -> Result<SecretInfo, service::Error> {
        self.enter(caller)?;
        self.session(caller, id)?;
        Ok(SecretInfo {
            name: name.to_string(),
            hosts: req.hosts,
            substitute_in: req.substitute_in,
            source: SecretSource::Session,
        })
    }

    fn list_secrets(&self, caller: &Caller, id: &str) -> Result<Vec<SecretInfo>, service::Error> {
        self.enter(caller)?;
        self.session(caller, id)?;
        Ok(vec![])
    }

    fn delete_secret(&self, caller: &Caller, id: &str, _name: &str) -> Result<StatusAnswer, service::Error> {
        self.enter(caller)?;
        self.session(caller, id)?;
        Ok(StatusAnswer::status("deleted"))
    }

    fn check_host(&self) -> BoxFuture<'_, check::Report> {
        Box::pin(async move {
            check::Report::new(vec![
                check::Item::ok("kernel", "6.12.0"),
                check::Item::new("loop devices", check::Status::Fail, "no /dev/loop-control", "modprobe loop"),
            ])
        })
    }
    fn condition(&self) -> BoxFuture<'_, Condition> {
        Box::pin(async move {
            Condition {
                problems: self.problems.clone(),
                cgroup: "v2 (test)".into(),
                sessions: self.sessions.lock().unwrap().len(),
                ..Condition::default()
            }
        })
    }
}
