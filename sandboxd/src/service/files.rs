//! What the file operations share: a session's workspace opened for one
//! operation, a file's URL, and [`Upload`], the real [`FileUpload`].

use super::{Caller, Error, FileUpload, Service};
use crate::artifacts;
use crate::model::files::FileEntry;
use crate::model::session::SessionInfo;
use crate::names;
use crate::session;
use crate::workspace::{self, Workspace};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

impl Service {
    /// The session's workspace, mounted and opened for one file operation while
    /// the session is ready; the [`session::Use`] holds its teardown (and an idle
    /// unmount) off until dropped.
    pub(super) async fn open_workspace(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<(Workspace, SessionInfo, session::Use), Error> {
        let opened = self.sessions.open_mounted(id, caller.owner()).await?;
        let ws = Workspace::open(&opened.workspace, opened.info.uid)?;
        Ok((ws, opened.info, opened.hold))
    }

    /// Where the API serves the workspace file `rel` of session `id`.
    pub(super) fn file_url(&self, id: &str, rel: &Path) -> String {
        format!("{}/v1/sessions/{id}/files/{}", self.ctx.public_url, names::url(rel.as_os_str().as_bytes()))
    }
}

/// A workspace file being written, within the policy's upload limit (the real
/// [`FileUpload`]).
pub struct Upload {
    ws: Workspace,
    rel: PathBuf,
    writer: std::io::BufWriter<std::fs::File>,
    written: u64,
    limit: u64,
    url: String,
    /// The session stays up while the file is written; a teardown stops it.
    hold: session::Use,
}

impl Upload {
    /// `file`, just made at `rel` in `ws`, to be written up to `limit` bytes.
    pub(super) fn new(
        ws: Workspace,
        rel: PathBuf,
        file: std::fs::File,
        limit: u64,
        url: String,
        hold: session::Use,
    ) -> Upload {
        let writer = std::io::BufWriter::with_capacity(256 * 1024, file);
        Upload { ws, rel, writer, written: 0, limit, url, hold }
    }
}

impl FileUpload for Upload {
    fn write(&mut self, chunk: &[u8]) -> Result<(), Error> {
        self.hold.check()?;
        self.written += chunk.len() as u64;
        if self.written > self.limit {
            return Err(Error::UploadTooLarge { limit: self.limit });
        }
        self.writer.write_all(chunk).map_err(|e| Error::from(workspace::Error::Io(self.rel.display().to_string(), e)))
    }

    fn finish(mut self: Box<Self>) -> Result<FileEntry, Error> {
        let flushed =
            self.writer.flush().map_err(|e| Error::from(workspace::Error::Io(self.rel.display().to_string(), e)));
        if let Err(err) = flushed.and_then(|()| Ok(self.hold.check()?)) {
            self.abort();
            return Err(err);
        }
        Ok(FileEntry {
            path: names::text(self.rel.as_os_str().as_bytes()),
            size_bytes: self.written,
            mime_type: artifacts::mime_type(&self.rel),
            modified_at: session::rfc3339(std::time::SystemTime::now()),
            url: self.url,
        })
    }

    fn abort(self: Box<Self>) {
        let Upload { ws, rel, writer, .. } = *self;
        drop(writer);
        let _ = ws.remove(&rel);
    }

    fn closed(&self) -> Option<tokio_util::sync::CancellationToken> {
        Some(self.hold.cut())
    }
}
