//! Finding the files a run created or changed in its workspace.
//!
//! Before a run, every regular file is stamped (inode, size, mtime and ctime in
//! nanoseconds); files changed in the last seconds before the run are also hashed,
//! because file timestamps are coarse (one jiffy) and a rewrite with the same size
//! in the same tick would otherwise look unchanged. After the run, a file is an
//! artifact when it is new, its stamp differs, or its hash does. Every walk and
//! every read goes through [`crate::workspace`] (by fd, never by name): links,
//! FIFOs, sockets and devices are never followed, opened or reported.

use crate::workspace::{self, Found, Stat, Workspace};
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Files changed this recently before a run are hashed too.
const RECENT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    hash: Option<[u8; 32]>,
}

impl Stamp {
    fn of(stat: &Stat) -> Stamp {
        Stamp { ino: stat.ino, size: stat.size, mtime_ns: stat.mtime_ns, ctime_ns: stat.ctime_ns, hash: None }
    }
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

impl Snapshot {
    /// Stamp every regular file of `ws`, hashing those changed in the last
    /// seconds (at most [`workspace::MAX_HASH_TOTAL`] bytes in all).
    pub fn take(ws: &Workspace) -> Result<Snapshot, workspace::Error> {
        let now = SystemTime::now();
        let mut budget = workspace::MAX_HASH_TOTAL;
        let mut files = HashMap::new();
        ws.walk(|found: &Found| {
            let mut s = Stamp::of(&found.stat);
            let recent = now.duration_since(found.stat.modified()).map_or(true, |age| age < RECENT);
            if recent {
                s.hash = found.sha256(&mut budget);
            }
            files.insert(found.path.to_path_buf(), s);
            ControlFlow::Continue(())
        })?;
        Ok(Snapshot { files })
    }

    /// Files of `ws` that are new or changed since the snapshot, in path order (the walk's).
    pub fn changed(&self, ws: &Workspace) -> Result<Vec<Entry>, workspace::Error> {
        let mut budget = workspace::MAX_HASH_TOTAL;
        let mut out = vec![];
        ws.walk(|found: &Found| {
            let changed = match self.files.get(found.path) {
                None => true,
                Some(before) => {
                    if Stamp::of(&found.stat) != (Stamp { hash: None, ..before.clone() }) {
                        true
                    } else {
                        // Same stamp: only a hash taken before can tell (one that
                        // cannot be taken now counts as a change).
                        before.hash.is_some_and(|h| found.sha256(&mut budget) != Some(h))
                    }
                }
            };
            if changed {
                out.push(Entry {
                    path: found.path.to_path_buf(),
                    size: found.stat.size,
                    modified: found.stat.modified(),
                });
            }
            ControlFlow::Continue(())
        })?;
        Ok(out)
    }
}

/// The mime type for a file name.
pub fn mime_type(path: &Path) -> String {
    mime_guess::from_path(path).first_or_octet_stream().essence_str().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn finds_new_changed_and_nested_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::write(root.join("old.txt"), b"same").unwrap();
        fs::write(root.join("keep.txt"), b"aaaa").unwrap();
        let ws = Workspace::open(root, nix::unistd::getuid().as_raw()).unwrap();
        let snap = Snapshot::take(&ws).unwrap();
        fs::create_dir_all(root.join("sub/deeper")).unwrap();
        fs::write(root.join("sub/deeper/new.csv"), b"1,2").unwrap();
        // Same size, same tick: only the hash can tell.
        fs::write(root.join("keep.txt"), b"bbbb").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        let got: Vec<_> = snap.changed(&ws).unwrap().into_iter().map(|e| e.path).collect();
        assert_eq!(got, vec![PathBuf::from("keep.txt"), PathBuf::from("sub/deeper/new.csv")]);
    }

    #[test]
    fn names_mime_types() {
        assert_eq!(mime_type(Path::new("x.png")), "image/png");
        assert_eq!(mime_type(Path::new("x.unknownext")), "application/octet-stream");
    }
}
