//! How the operations reach a session's run records ([`crate::records`]): they
//! are files, so every read and write goes to a blocking thread.

use super::{Caller, Error};
use crate::records::Records;
use crate::session::Manager;
use std::sync::Arc;

/// Call `f` with the session's records on a blocking thread.
pub(super) async fn blocking<T: Send + 'static>(
    records: Records,
    f: impl FnOnce(&Records) -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(move || f(&records)).await.map_err(std::io::Error::other)?
}

/// Read session `id`'s records with `f`, the session held (its teardown waits)
/// until `f` is done; a failure to read is [`Error::Internal`] in step `what`.
pub(super) async fn read<T: Send + 'static>(
    sessions: &Arc<Manager>,
    caller: &Caller,
    id: &str,
    what: &str,
    f: impl FnOnce(&Records) -> std::io::Result<T> + Send + 'static,
) -> Result<T, Error> {
    let opened = sessions.open(id, caller.owner())?;
    let records = opened.records.clone();
    blocking(records, move |r| {
        let read = f(r);
        drop(opened);
        read
    })
    .await
    .map_err(|e| Error::internal(what, e))
}
