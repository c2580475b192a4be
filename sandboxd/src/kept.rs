//! Files the daemon keeps for a session beside its images (run records,
//! conversations): written whole through a rename, root's and 0600, so a reader
//! sees a whole file or none; read back bounded.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Write `bytes` to `path` through a temporary file beside it and a rename (0600).
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    file.write_all(bytes)?;
    drop(file);
    fs::rename(&tmp, path)
}

/// Remove the oldest of `files` (path and size, oldest first) until at most
/// `max_count` of them and `max_bytes` remain; never `keep`. A file gone
/// meanwhile counts as removed.
pub fn prune(files: &[(std::path::PathBuf, u64)], keep: &Path, max_count: usize, max_bytes: u64) -> io::Result<()> {
    let mut count = files.len();
    let mut bytes: u64 = files.iter().map(|f| f.1).sum();
    for (path, size) in files {
        if count <= max_count && bytes <= max_bytes {
            break;
        }
        if path == keep {
            continue;
        }
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        count -= 1;
        bytes = bytes.saturating_sub(*size);
    }
    Ok(())
}

/// The JSON value in `path`, read up to `max` bytes; `None` if there is no such
/// file. A file that is no `T` (none the daemon writes is past `max`) is
/// `InvalidData`, naming `what` it should have been.
pub fn read<T: serde::de::DeserializeOwned>(path: &Path, max: usize, what: &str) -> io::Result<Option<T>> {
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = vec![];
    file.take(max as u64 + 1).read_to_end(&mut bytes)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: not {what}: {e}")))
}
