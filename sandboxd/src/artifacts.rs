//! Finding the files a run created or changed in its workspace.
//!
//! Before a run, every regular file is stamped (inode, size, mtime and ctime in
//! nanoseconds); files changed in the last seconds before the run are also hashed,
//! because file timestamps are coarse (one jiffy) and a rewrite with the same size
//! in the same tick would otherwise look unchanged. After the run, a file is an
//! artifact when it is new, its stamp differs, or its hash does. Symlinks are never
//! followed and never reported.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Most entries looked at in one walk; a bigger workspace is walked partly.
pub const MAX_WALK: usize = 200_000;
/// Files changed this recently before a run are hashed too.
const RECENT: Duration = Duration::from_secs(3);
/// Largest file hashed for the same-tick check.
const MAX_HASH: u64 = 64 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    hash: Option<[u8; 32]>,
}

/// A file found by a walk.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: PathBuf,
    pub size: u64,
    pub modified: SystemTime,
}

#[derive(Debug, Default)]
pub struct Snapshot {
    files: HashMap<PathBuf, Stamp>,
}

fn ns(secs: i64, nsec: i64) -> i128 {
    secs as i128 * 1_000_000_000 + nsec as i128
}

fn stamp(meta: &fs::Metadata) -> Stamp {
    Stamp {
        ino: meta.ino(),
        size: meta.size(),
        mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
        ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        hash: None,
    }
}

fn hash_file(path: &Path) -> Option<[u8; 32]> {
    let mut file = fs::File::open(path).ok()?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Some(hasher.finalize().into())
}

/// Every regular file below `root`, without following symlinks, as relative paths.
pub fn walk(root: &Path) -> Vec<(PathBuf, fs::Metadata)> {
    let mut out = vec![];
    let mut stack = vec![PathBuf::new()];
    let mut seen = 0usize;
    while let Some(rel) = stack.pop() {
        let Ok(entries) = fs::read_dir(root.join(&rel)) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > MAX_WALK {
                return out;
            }
            // DirEntry::metadata does not follow symlinks.
            let Ok(meta) = entry.metadata() else { continue };
            let path = rel.join(entry.file_name());
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                out.push((path, meta));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

impl Snapshot {
    pub fn take(root: &Path) -> Snapshot {
        let now = SystemTime::now();
        let files = walk(root)
            .into_iter()
            .map(|(path, meta)| {
                let mut s = stamp(&meta);
                let recent =
                    meta.modified().ok().and_then(|m| now.duration_since(m).ok()).is_none_or(|age| age < RECENT);
                if recent && meta.size() <= MAX_HASH {
                    s.hash = hash_file(&root.join(&path));
                }
                (path, s)
            })
            .collect();
        Snapshot { files }
    }

    /// Files under `root` that are new or changed since the snapshot.
    pub fn changed(&self, root: &Path) -> Vec<Entry> {
        walk(root)
            .into_iter()
            .filter(|(path, meta)| match self.files.get(path) {
                None => true,
                Some(before) => {
                    let mut now = stamp(meta);
                    if now != (Stamp { hash: None, ..before.clone() }) {
                        return true;
                    }
                    match before.hash {
                        Some(h) => {
                            now.hash = hash_file(&root.join(path));
                            now.hash != Some(h)
                        }
                        None => false,
                    }
                }
            })
            .map(|(path, meta)| Entry {
                size: meta.size(),
                modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                path,
            })
            .collect()
    }
}

/// The mime type for a file name.
pub fn mime_type(path: &Path) -> String {
    mime_guess::from_path(path).first_or_octet_stream().essence_str().to_string()
}

/// Percent-encode a relative path for a URL, keeping the slashes.
pub fn url_path(path: &Path) -> String {
    let mut out = String::new();
    for (i, part) in path.to_string_lossy().split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        for b in part.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_new_changed_and_nested_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::write(root.join("old.txt"), b"same").unwrap();
        fs::write(root.join("keep.txt"), b"aaaa").unwrap();
        let snap = Snapshot::take(root);
        fs::create_dir_all(root.join("sub/deeper")).unwrap();
        fs::write(root.join("sub/deeper/new.csv"), b"1,2").unwrap();
        // Same size, same tick: only the hash can tell.
        fs::write(root.join("keep.txt"), b"bbbb").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        let mut got: Vec<_> = snap.changed(root).into_iter().map(|e| e.path).collect();
        got.sort();
        assert_eq!(got, vec![PathBuf::from("keep.txt"), PathBuf::from("sub/deeper/new.csv")]);
    }

    #[test]
    fn encodes_urls() {
        assert_eq!(url_path(Path::new("a b/c#d.png")), "a%20b/c%23d.png");
        assert_eq!(mime_type(Path::new("x.png")), "image/png");
        assert_eq!(mime_type(Path::new("x.unknownext")), "application/octet-stream");
    }
}
