//! A workspace's files as callers see them: a listing's entries, and the raw
//! bytes an upload or a download carries.

use serde::{Deserialize, Serialize};

/// A file in a session's workspace.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileEntry {
    /// Its path below the workspace, `/` between the parts, as text: the name's
    /// UTF-8, except that each byte that is not UTF-8 is `\xHH` and a backslash is
    /// `\\`; so each path names one file (`a\xffb` is the bytes `61 ff 62`, and a
    /// file literally named so is `a\\xffb`). MCP tools and `sandboxctl` take paths
    /// in this form; HTTP routes take the raw bytes in the URL (see `url`).
    pub path: String,
    pub size_bytes: u64,
    pub mime_type: String,
    /// When it was last modified (RFC 3339, UTC, seconds).
    pub modified_at: String,
    /// Where it is downloaded (and deleted): the path's raw bytes percent-encoded,
    /// every byte but ASCII letters, digits, `-_.~` and the `/` between parts as
    /// `%XX`.
    pub url: String,
}

/// A file's raw bytes, as uploaded or downloaded (documentation only).
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct FileBytes(#[allow(dead_code)] Vec<u8>);
