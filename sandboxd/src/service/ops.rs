//! The real operations: [`Operations`] implemented on [`Service`], each
//! operation written once, here (sessions, runs, files, run records, the
//! daemon's condition, the host check). What the file operations share is in
//! `files.rs`, the way to the run records in `records.rs`.

use super::files::Upload;
use super::records::{self, blocking};
use super::{Caller, Condition, Error, FileUpload, OpenFile, Operations, RunDone, Service};
use crate::artifacts;
use crate::check;
use crate::isolate::output::Chunk;
use crate::listing::{self, Listing};
use crate::model::chat::{Chat, ChatList};
use crate::model::check::Report;
use crate::model::packages::{InstallRequest, InstallResult};
use crate::model::policy::Policy;
use crate::model::records::{RunPage, RunRecord};
use crate::model::run::RunRequest;
use crate::model::secrets::{SecretInfo, SecretRequest};
use crate::model::session::{CreateSessionRequest, Mode, SessionInfo, StatusAnswer};
use crate::names;
use crate::run;
use crate::session::Taken;
use crate::workspace;
use futures_util::future::BoxFuture;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

impl Operations for Service {
    fn policy(&self, name: Option<&str>) -> Result<Arc<Policy>, Error> {
        Ok(self.sessions.policy(name)?)
    }

    fn policies(&self) -> Vec<Policy> {
        self.sessions.policies().map(|p| (**p).clone()).collect()
    }

    fn max_code_bytes(&self) -> Option<usize> {
        self.sessions.policies().map(|p| p.code_bytes()).max()
    }

    fn create_session<'a>(
        &'a self,
        caller: &'a Caller,
        req: CreateSessionRequest,
    ) -> BoxFuture<'a, Result<SessionInfo, Error>> {
        Box::pin(async move {
            Ok(self
                .sessions
                .create(req.id, req.policy.as_deref(), req.mode.unwrap_or_default(), req.ttl_s, caller.owner())
                .await?)
        })
    }

    fn get_session(&self, caller: &Caller, id: &str) -> Result<SessionInfo, Error> {
        Ok(self.sessions.get(id, caller.owner())?)
    }

    fn list_sessions(&self, caller: &Caller) -> Vec<SessionInfo> {
        self.sessions.list(caller.owner())
    }

    fn close_session<'a>(&'a self, caller: &'a Caller, id: &'a str) -> BoxFuture<'a, Result<StatusAnswer, Error>> {
        Box::pin(async move {
            self.sessions.close(id, caller.owner()).await?;
            Ok(StatusAnswer::status("closed"))
        })
    }

    fn cancel_run(&self, caller: &Caller, id: &str) -> Result<StatusAnswer, Error> {
        let cancelled = self.sessions.cancel_run(id, caller.owner())?;
        Ok(StatusAnswer::status(if cancelled { "cancelled" } else { "idle" }))
    }

    fn start_run<'a>(
        &'a self,
        caller: &'a Caller,
        req: RunRequest,
        chunks: Option<mpsc::Sender<Chunk>>,
    ) -> BoxFuture<'a, Result<RunDone, Error>> {
        Box::pin(async move {
            let began = std::time::Instant::now();
            let owner = caller.owner();
            // The session made for this run, if it had none: the caller learns its id
            // only from a result.
            let mut made = None;
            let taken = match &req.session_id {
                Some(id) => {
                    let taken = self.sessions.lease(id, owner)?;
                    check_policy(&req, &taken)?;
                    taken
                }
                None => {
                    let policy = self.sessions.policy(req.policy.as_deref())?;
                    run::validate(&req, &policy)?;
                    if let Some(packages) = &req.packages {
                        crate::packages::check(&policy, packages)?;
                    }
                    // Refuse before a session is made for a run the token may not start.
                    self.sessions.check_run_quota(owner)?;
                    let info = self.sessions.create(None, req.policy.as_deref(), Mode::Script, None, owner).await?;
                    made = Some(info.id.clone());
                    match self.sessions.lease(&info.id, owner) {
                        Ok(taken) => taken,
                        Err(e) => {
                            // Another run of the token's took the last place meanwhile.
                            close_unnamed(&self.sessions, &info.id, owner).await;
                            return Err(e.into());
                        }
                    }
                }
            };
            let mounted = async {
                if self.draining.load(Ordering::SeqCst) {
                    return Err(Error::ShuttingDown);
                }
                // Taken before the drain began: the drain waits for it from here on.
                Ok(taken.mount().await?)
            };
            let lease = match mounted.await {
                Ok(lease) => lease,
                Err(e) => {
                    if let Some(id) = &made {
                        close_unnamed(&self.sessions, id, owner).await;
                    }
                    return Err(e);
                }
            };
            // The run is accepted: from here on it has a record, written beside the
            // sandbox's start rather than before it.
            let run_id = run::new_run_id();
            let records = self.sessions.records(&lease.id);
            let record = RunRecord::accepted(&run_id, req.language, lease.mode, &req.code);
            let begun = blocking(records.clone(), move |r| r.begin(record));
            let (done_tx, done_rx) = oneshot::channel();
            let ctx = self.ctx.clone();
            let (sessions, owner) = (self.sessions.clone(), owner.map(str::to_string));
            tokio::spawn(async move {
                let ran = async {
                    // The run's packages first, in its sandbox's session: the code
                    // runs only once they are there.
                    let installed = match &req.packages {
                        Some(packages) => Some(crate::packages::install(&ctx, &lease, packages).await?),
                        None => None,
                    };
                    let mut result = run::execute(&ctx, &lease, &req, &run_id, chunks).await.map_err(Error::from)?;
                    // The install's network use is the run's too.
                    if let (Some(installed), Some(net)) = (&installed, result.usage.net.as_mut()) {
                        net.add_before(&installed.net);
                    }
                    Ok(result)
                };
                let (result, begun) = tokio::join!(ran, begun);
                match begun {
                    Ok(mut pending) => {
                        pending.record.ended(result.as_ref().map_err(record_error));
                        // Written while the lease still holds the session (its teardown
                        // waits), and before the caller hears of the result.
                        if let Err(e) = blocking(records, move |r| r.finish(&pending)).await {
                            tracing::warn!(session_id = %lease.id, run_id = %run_id, error = %e, "could not keep the run's record");
                        }
                    }
                    // The run went on without one: the host's disk is the operator's to fix.
                    Err(e) => {
                        tracing::warn!(session_id = %lease.id, run_id = %run_id, error = %e, "could not keep the run's record")
                    }
                }
                drop(lease);
                if result.is_ok() {
                    crate::metrics::global().run_handled(began.elapsed());
                }
                // A run that made its session and ended in an error (its packages
                // failed to install, say) names that session nowhere: it goes, rather
                // than stay unknown to its caller until its TTL.
                if let (Err(_), Some(id)) = (&result, &made) {
                    close_unnamed(&sessions, id, owner.as_deref()).await;
                }
                let _ = done_tx.send(result);
            });
            Ok(done_rx)
        })
    }

    fn listing<'a>(&'a self, caller: &'a Caller, id: &'a str) -> BoxFuture<'a, Result<Listing, Error>> {
        Box::pin(async move {
            // An unknown session is told so at once, not after a wait for a place.
            self.sessions.get(id, caller.owner())?;
            let slot = self.listings.take(caller.owner()).await?;
            let (ws, _, hold) = self.open_workspace(caller, id).await?;
            let prefix = format!("{}/v1/sessions/{id}/files/", self.ctx.public_url);
            let (mut files, walked, slot) = tokio::task::spawn_blocking(move || {
                // The place goes with the walk: a client that leaves meanwhile does
                // not free it while the walk still holds its memory.
                let listed = listing::walk(&ws, prefix);
                drop(hold);
                listed.map(|(files, walked)| (files, walked, slot))
            })
            .await
            .map_err(|e| Error::internal("listing files", e))??;
            files.hold(slot);
            Ok(Listing { files, partial: walked.partial })
        })
    }

    fn open_file<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<OpenFile, Error>> {
        Box::pin(async move {
            let rel = workspace::path_of_text(path)?;
            let (ws, _, hold) = self.open_workspace(caller, id).await?;
            let (file, meta) = ws.open_read(&rel)?;
            let name = rel.file_name().map(|n| n.to_os_string()).unwrap_or_default();
            Ok(OpenFile { file, size: meta.size, mime_type: artifacts::mime_type(&rel), name, hold: Some(hold) })
        })
    }

    fn create_file<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        path: &'a str,
        overwrite: bool,
    ) -> BoxFuture<'a, Result<Box<dyn FileUpload>, Error>> {
        Box::pin(async move {
            let rel = workspace::path_of_text(path)?;
            let (ws, info, hold) = self.open_workspace(caller, id).await?;
            let limit = self.sessions.policy(Some(&info.policy))?.upload_bytes();
            let file = ws.create(&rel, overwrite)?;
            let url = self.file_url(id, &rel);
            Ok(Box::new(Upload::new(ws, rel, file, limit, url, hold)) as Box<dyn FileUpload>)
        })
    }

    fn delete_file<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<StatusAnswer, Error>> {
        Box::pin(async move {
            let rel = workspace::path_of_text(path)?;
            let (ws, _, _hold) = self.open_workspace(caller, id).await?;
            ws.remove(&rel)?;
            Ok(StatusAnswer { status: "deleted".into(), path: Some(names::text(rel.as_os_str().as_bytes())) })
        })
    }

    fn condition(&self) -> BoxFuture<'_, Condition> {
        Box::pin(async move {
            let ctx = &self.ctx;
            let facts = crate::health::Facts::gather(
                &ctx.rootfs,
                &ctx.sandboxes.cgroups,
                ctx.pool.start_errors(),
                self.check_host().await,
            );
            Condition {
                problems: facts.problems(),
                cgroup: ctx.sandboxes.cgroups.describe(),
                sessions: self.sessions.count(),
                busy_sessions: self.sessions.busy_count(),
                storage: self.sessions.storage_stats(),
                pool: ctx.pool.stats(),
            }
        })
    }

    fn check_host(&self) -> BoxFuture<'_, Report> {
        Box::pin(check::now((*self.check).clone()))
    }

    fn install_packages<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        req: InstallRequest,
    ) -> BoxFuture<'a, Result<InstallResult, Error>> {
        Box::pin(async move {
            let taken = self.sessions.lease(id, caller.owner())?;
            crate::packages::check(taken.policy(), &req.packages)?;
            if self.draining.load(Ordering::SeqCst) {
                return Err(Error::ShuttingDown);
            }
            let lease = taken.mount().await?;
            let ctx = self.ctx.clone();
            // In a task of its own, as a run: a caller that goes away does not
            // abort the install halfway (the layer is swapped whole or not at all).
            let installed = tokio::spawn(async move {
                let result = crate::packages::install(&ctx, &lease, &req.packages).await;
                drop(lease);
                result
            });
            Ok(installed.await.map_err(|e| Error::internal("installing packages", e))??)
        })
    }

    fn set_secret(&self, caller: &Caller, id: &str, name: &str, req: SecretRequest) -> Result<SecretInfo, Error> {
        Ok(self.sessions.set_secret(id, caller.owner(), name, req.value, req.hosts, req.substitute_in)?)
    }

    fn list_secrets(&self, caller: &Caller, id: &str) -> Result<Vec<SecretInfo>, Error> {
        Ok(self.sessions.list_secrets(id, caller.owner())?)
    }

    fn delete_secret(&self, caller: &Caller, id: &str, name: &str) -> Result<StatusAnswer, Error> {
        self.sessions.delete_secret(id, caller.owner(), name)?;
        Ok(StatusAnswer::status("deleted"))
    }

    fn metrics_live(&self) -> crate::metrics::Live {
        let pool = self.ctx.pool.stats();
        crate::metrics::Live {
            pool_idle: pool.ready_by_policy.into_iter().collect(),
            pool_hits: pool.hits,
            pool_misses: pool.misses,
            sessions: self.sessions.count_by_mode().into_iter().map(|(m, n)| (m.name().to_string(), n)).collect(),
            ready_sandboxes: self.ctx.sandboxes.idle_slots(),
        }
    }

    fn list_runs<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        before: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<RunPage, Error>> {
        Box::pin(async move {
            let wanted = before.map(str::to_string);
            let page = records::read(&self.sessions, caller, id, "reading the session's run records", move |r| {
                r.page(wanted.as_deref(), limit)
            })
            .await?;
            page.ok_or_else(|| Error::RunNotFound {
                session: id.to_string(),
                run_id: before.unwrap_or_default().into(),
            })
        })
    }

    fn get_run<'a>(
        &'a self,
        caller: &'a Caller,
        id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<RunRecord, Error>> {
        Box::pin(async move {
            let wanted = run_id.to_string();
            let record =
                records::read(&self.sessions, caller, id, "reading a run record", move |r| r.get(&wanted)).await?;
            record.ok_or_else(|| Error::RunNotFound { session: id.to_string(), run_id: run_id.to_string() })
        })
    }

    fn list_chats<'a>(&'a self, caller: &'a Caller, id: &'a str) -> BoxFuture<'a, Result<ChatList, Error>> {
        Box::pin(async move {
            let chats = self.chats(caller, id, "reading the session's conversations", |c| c.list()).await?;
            Ok(ChatList { chats })
        })
    }

    fn get_chat<'a>(&'a self, caller: &'a Caller, id: &'a str, chat_id: &'a str) -> BoxFuture<'a, Result<Chat, Error>> {
        Box::pin(async move {
            let wanted = chat_id.to_string();
            let chat = self.chats(caller, id, "reading a conversation", move |c| c.get(&wanted)).await?;
            chat.ok_or_else(|| Error::ChatNotFound { session: id.to_string(), chat_id: chat_id.to_string() })
        })
    }

    fn save_chat<'a>(&'a self, caller: &'a Caller, id: &'a str, chat: &'a Chat) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let mut kept = chat.clone();
            // The session's own id (an operator names a tenant's session by its key).
            kept.session_id = id.rsplit_once('.').map_or(id, |(_, own)| own).to_string();
            self.chats(caller, id, "keeping a conversation", move |c| c.save(&kept)).await
        })
    }
}

impl Service {
    /// Call `f` with session `id`'s conversations on a blocking thread, the
    /// session held until it is done.
    async fn chats<T: Send + 'static>(
        &self,
        caller: &Caller,
        id: &str,
        what: &str,
        f: impl FnOnce(&crate::conversations::Chats) -> std::io::Result<T> + Send + 'static,
    ) -> Result<T, Error> {
        let opened = self.sessions.open(id, caller.owner.as_deref())?;
        let chats = opened.chats.clone();
        let done = tokio::task::spawn_blocking(move || {
            let r = f(&chats);
            drop(opened);
            r
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
        match done {
            Err(e) if crate::conversations::is_full(&e) => {
                Err(Error::InvalidRequest(crate::conversations::Full.to_string()))
            }
            Err(e) => Err(Error::internal(what, e)),
            Ok(v) => Ok(v),
        }
    }
}

/// What a run's record says of the error that stopped it: what its caller was
/// told, without a host failure's details (those are in the daemon's log).
/// Close the session made for a run that will not answer with a result (the only
/// place its id would be named).
async fn close_unnamed(sessions: &std::sync::Arc<crate::session::Manager>, id: &str, owner: Option<&str>) {
    if let Err(e) = sessions.close(id, owner).await {
        tracing::warn!(session_id = %id, error = %e, "could not close the session made for a run that failed");
    }
}

fn record_error(e: &Error) -> String {
    match e {
        Error::Internal { context, .. }
        | Error::Run(run::Error::Internal { context, .. })
        | Error::Packages(crate::packages::Error::Internal { context, .. }) => {
            format!("{context} failed on the server; the daemon log has the cause")
        }
        other => other.to_string(),
    }
}

/// A run in an existing session keeps the session's policy.
fn check_policy(req: &RunRequest, taken: &Taken) -> Result<(), Error> {
    let policy = taken.policy();
    match &req.policy {
        Some(p) if *p != policy.name => Err(Error::InvalidRequest(format!(
            "session {:?} uses policy {:?}; a session's policy is fixed: create a new session for policy {p:?}",
            taken.key(),
            policy.name
        ))),
        _ => {
            run::validate(req, policy)?;
            if let Some(packages) = &req.packages {
                crate::packages::check(policy, packages)?;
            }
            Ok(())
        }
    }
}
