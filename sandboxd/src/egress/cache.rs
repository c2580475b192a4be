//! The package cache: files of the package index, kept by the daemon so that a
//! second session installing the same wheel downloads nothing.
//!
//! Content-addressed, and checked before it is kept: PyPI serves every file at
//! `/packages/<b2[0:2]>/<b2[2:4]>/<b2[4:64]>/<name>`, where `b2` is the BLAKE2b-256
//! digest of the file's bytes. The proxy, which terminates TLS for the cache's
//! hosts, serves such a path from the cache when it holds that digest, and
//! otherwise streams the index's answer to the sandbox while writing it here; the
//! file is kept only if the bytes that came hash to the digest the path names
//! ([`Cache::writer`], [`Writer::commit`]). A session can therefore never put
//! anything in the cache that another session would get instead of what the
//! index serves. Sandboxes never see this directory (root's, 0700): they get its
//! bytes through the proxy only. It is bounded (`package_cache_mb`): past the
//! bound, the files used longest ago go.

use blake2::{Blake2b256, Digest};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The digest a cached file is named by.
pub type Digest32 = [u8; 32];

pub struct Cache {
    dir: PathBuf,
    limit: u64,
    /// Bytes held now (files only; temporary files are counted when kept).
    held: AtomicU64,
    /// One eviction at a time.
    evicting: Mutex<()>,
    /// Files being downloaded, one download per digest: when it began, its
    /// length, and the flag that tells its writer it was given up.
    downloading: Mutex<HashMap<Digest32, Download>>,
}

struct Download {
    began: Instant,
    length: u64,
    given_up: Arc<AtomicBool>,
    /// Its part, open: given up, it is emptied and unlinked at once (a writer
    /// whose sandbox stopped reading may not write again for hours, and an
    /// unlinked file open is still on the disk).
    part: Option<(PathBuf, Arc<File>)>,
}

impl Download {
    /// Give it up: its writer stops at its next write, its part goes now.
    fn give_up(&self) {
        self.given_up.store(true, Ordering::Relaxed);
        if let Some((path, file)) = &self.part {
            let _ = file.set_len(0);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The most of the cache's size that downloads not yet whole may take together
/// (their lengths, as the index announced them).
const DOWNLOADING_SHARE: u64 = 2;
/// A download not whole after this long is given up (a sandbox that stopped
/// reading holds it): its part goes, its place is free.
const DOWNLOAD_FOR: Duration = Duration::from_secs(600);

/// The file names a digest path is the content of: distributions. PyPI serves
/// other files under the same digest (`<wheel>.metadata`, the wheel's METADATA
/// (PEP 658); `<file>.asc`), whose bytes are not the digest's: they pass by.
const DISTRIBUTIONS: [&str; 5] = [".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz"];

/// The digest a path of the index's file host names, if it is a distribution's
/// path of PyPI's form (`/packages/ab/cd/<60 hex>/<file name>`, no query).
pub fn digest_of(path: &str) -> Option<Digest32> {
    let rest = path.strip_prefix("/packages/")?;
    let mut parts = rest.split('/');
    let (a, b, c, name) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || a.len() != 2
        || b.len() != 2
        || c.len() != 60
        || name.contains('?')
        || !DISTRIBUTIONS.iter().any(|ext| name.len() > ext.len() && name.ends_with(ext))
    {
        return None;
    }
    let hex = format!("{a}{b}{c}");
    let mut digest = [0u8; 32];
    for (i, out) in digest.iter_mut().enumerate() {
        let pair = hex.get(i * 2..i * 2 + 2)?;
        if !pair.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return None;
        }
        *out = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(digest)
}

fn hex(d: &Digest32) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

impl Cache {
    /// The cache in `dir` (made, root's and 0700), holding at most `limit` bytes.
    pub fn open(dir: &Path, limit: u64) -> io::Result<Cache> {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let mut held = 0;
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let meta = entry.metadata()?;
            // What a killed writer left.
            if name.to_string_lossy().starts_with(".part-") || !meta.is_file() {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            held += meta.len();
        }
        let cache = Cache {
            dir: dir.to_path_buf(),
            limit,
            held: AtomicU64::new(held),
            evicting: Mutex::new(()),
            downloading: Mutex::new(HashMap::new()),
        };
        cache.evict();
        Ok(cache)
    }

    /// The cached file of `digest` and its length, if the cache holds it (its
    /// last use is now).
    pub fn get(&self, digest: &Digest32) -> Option<(File, u64)> {
        let path = self.dir.join(hex(digest));
        let file = File::options().read(true).custom_flags(libc::O_NOFOLLOW).open(&path).ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() {
            return None;
        }
        let _ = file.set_modified(std::time::SystemTime::now());
        Some((file, meta.len()))
    }

    /// Start keeping the file of `digest`, `length` bytes as the index announced,
    /// as it is downloaded. `None` (the file passes uncached) when its length is
    /// unknown or over a quarter of the cache, when it is being downloaded
    /// already (one download per file), or when the downloads going on would then
    /// announce more than half the cache: what downloads not yet whole take on
    /// the disk stays bounded, whoever starts them.
    pub fn writer(self: &Arc<Self>, digest: Digest32, length: Option<u64>) -> Option<Writer> {
        let length = length.filter(|n| *n <= self.limit / 4)?;
        let given_up = Arc::new(AtomicBool::new(false));
        {
            let mut downloading = self.downloading.lock().unwrap_or_else(|p| p.into_inner());
            downloading.retain(|_, d| {
                let keep = d.began.elapsed() < DOWNLOAD_FOR;
                if !keep {
                    d.give_up();
                }
                keep
            });
            let announced: u64 = downloading.values().map(|d| d.length).sum();
            if downloading.contains_key(&digest) || announced + length > self.limit / DOWNLOADING_SHARE {
                return None;
            }
            downloading
                .insert(digest, Download { began: Instant::now(), length, given_up: given_up.clone(), part: None });
        }
        let part = self.dir.join(format!(".part-{}", uuid::Uuid::new_v4().simple()));
        let file = File::options().write(true).create_new(true).mode(0o600).open(&part).ok().map(Arc::new);
        if let Some(file) = &file {
            let mut downloading = self.downloading.lock().unwrap_or_else(|p| p.into_inner());
            match downloading.get_mut(&digest).filter(|d| Arc::ptr_eq(&d.given_up, &given_up)) {
                Some(d) => d.part = Some((part.clone(), file.clone())),
                // Given up already (a clock that jumped): not started.
                None => {
                    let _ = std::fs::remove_file(&part);
                    return None;
                }
            }
        }
        Some(Writer {
            cache: self.clone(),
            digest,
            failed: file.is_none(),
            file,
            part,
            hasher: Blake2b256::new(),
            length,
            written: 0,
            given_up,
        })
    }

    /// Remove the files used longest ago until the cache holds at most its limit.
    fn evict(&self) {
        if self.held.load(Ordering::Relaxed) <= self.limit {
            return;
        }
        let Ok(_one) = self.evicting.try_lock() else { return };
        let mut files: Vec<(std::time::SystemTime, PathBuf, u64)> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, e.path(), meta.size()))
            })
            .collect();
        files.sort();
        for (_, path, size) in files {
            if self.held.load(Ordering::Relaxed) <= self.limit {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                self.held.fetch_sub(size.min(self.held.load(Ordering::Relaxed)), Ordering::Relaxed);
            }
        }
    }
}

/// A file being downloaded into the cache: kept by [`Writer::commit`] only if its
/// bytes hash to the digest its path named; dropped otherwise (or when the
/// download stops halfway, or takes so long the cache gave it up).
pub struct Writer {
    cache: Arc<Cache>,
    digest: Digest32,
    file: Option<Arc<File>>,
    part: PathBuf,
    hasher: Blake2b256,
    /// What the index announced; no more is written.
    length: u64,
    written: u64,
    failed: bool,
    given_up: Arc<AtomicBool>,
}

impl Writer {
    pub fn write(&mut self, chunk: &[u8]) {
        if self.failed {
            return;
        }
        self.written += chunk.len() as u64;
        self.hasher.update(chunk);
        let ok = self.written <= self.length
            && !self.given_up.load(Ordering::Relaxed)
            && self.file.as_deref().is_some_and(|mut f| f.write_all(chunk).is_ok());
        if !ok {
            // The part goes now, not when the download ends.
            self.failed = true;
            self.file = None;
            let _ = std::fs::remove_file(&self.part);
        }
    }

    /// Keep the file if it is whole and its digest is the one its path named.
    /// Whether it was kept.
    pub fn commit(mut self) -> bool {
        let digest: Digest32 = std::mem::take(&mut self.hasher).finalize().into();
        if self.failed || self.written != self.length || digest != self.digest || self.given_up.load(Ordering::Relaxed)
        {
            return false;
        }
        let Some(file) = self.file.take() else { return false };
        if file.sync_data().is_err() {
            return false;
        }
        // Out of the downloads before it is renamed into place: a give-up from
        // now on cannot empty the file kept.
        {
            let mut downloading = self.cache.downloading.lock().unwrap_or_else(|p| p.into_inner());
            let ours = downloading.get(&self.digest).is_some_and(|d| Arc::ptr_eq(&d.given_up, &self.given_up));
            if !ours || self.given_up.load(Ordering::Relaxed) {
                return false;
            }
            downloading.remove(&self.digest);
        }
        drop(file);
        let dest = self.cache.dir.join(hex(&self.digest));
        // A file of the digest already there (kept by an earlier download) is
        // replaced by the same bytes: it is not counted twice.
        let before = std::fs::symlink_metadata(&dest).map(|m| m.len()).unwrap_or(0);
        let kept = std::fs::rename(&self.part, &dest).is_ok();
        if kept {
            self.cache.held.fetch_add(self.written, Ordering::Relaxed);
            self.cache.held.fetch_sub(before.min(self.cache.held.load(Ordering::Relaxed)), Ordering::Relaxed);
            self.cache.evict();
        }
        kept
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Whatever was not renamed into place goes, and so does its place among
        // the downloads (unless the cache gave it up and another took it).
        let _ = std::fs::remove_file(&self.part);
        let mut downloading = self.cache.downloading.lock().unwrap_or_else(|p| p.into_inner());
        if downloading.get(&self.digest).is_some_and(|d| Arc::ptr_eq(&d.given_up, &self.given_up)) {
            downloading.remove(&self.digest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b2(bytes: &[u8]) -> Digest32 {
        Blake2b256::digest(bytes).into()
    }

    fn path_of(bytes: &[u8], name: &str) -> String {
        let h = hex(&b2(bytes));
        format!("/packages/{}/{}/{}/{name}", &h[..2], &h[2..4], &h[4..])
    }

    #[test]
    fn a_pypi_file_path_names_its_digest_and_nothing_else_does() {
        let p = path_of(b"wheel", "tabulate-0.9.0-py3-none-any.whl");
        assert_eq!(digest_of(&p), Some(b2(b"wheel")));
        // The digest of pip 25.1.1's wheel, as PyPI serves it.
        let pip =
            "/packages/29/a2/d40fb2460e883eca5199c62cfc2463fd261f760556ae6290f88488c362c0/pip-25.1.1-py3-none-any.whl";
        assert!(digest_of(pip).is_some());
        for bad in [
            "/simple/tabulate/",
            "/packages/29/a2/d40f/pip.whl",
            "/packages/29/a2/d40fb2460e883eca5199c62cfc2463fd261f760556ae6290f88488c362c0/",
            "/packages/29/a2/d40fb2460e883eca5199c62cfc2463fd261f760556ae6290f88488c362c0/a/b",
            "/packages/29/a2/D40FB2460E883ECA5199C62CFC2463FD261F760556AE6290F88488C362C0/pip.whl",
            "/packages/29/a2/x40fb2460e883eca5199c62cfc2463fd261f760556ae6290f88488c362c0/pip.whl",
            "/packages/29/a2/d40fb2460e883eca5199c62cfc2463fd261f760556ae6290f88488c362c0/pip.whl?x=1",
            // The same digest, other bytes: the wheel's metadata, its signature.
            "/packages/29/a2/d40fb2460e883eca5199c62cfc2463fd261f760556ae6290f88488c362c0/pip-25.1.1-py3-none-any.whl.metadata",
            "/packages/29/a2/d40fb2460e883eca5199c62cfc2463fd261f760556ae6290f88488c362c0/pip-25.1.1.tar.gz.asc",
            "/packages/29/a2/d40fb2460e883eca5199c62cfc2463fd261f760556ae6290f88488c362c0/.whl",
        ] {
            assert_eq!(digest_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_bytes_that_hash_to_their_digest_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(Cache::open(&dir.path().join("c"), 1 << 20).unwrap());
        let digest = b2(b"the wheel");
        let mut w = cache.writer(digest, Some(9)).unwrap();
        w.write(b"the ");
        w.write(b"wheel");
        assert!(w.commit());
        let (mut f, n) = cache.get(&digest).unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut f, &mut text).unwrap();
        assert_eq!((text.as_str(), n), ("the wheel", 9));
        // Other bytes under the same digest: not kept, nothing left behind.
        let other = b2(b"another");
        let mut w = cache.writer(other, Some(7)).unwrap();
        w.write(b"forgery");
        assert!(!w.commit());
        assert!(cache.get(&other).is_none());
        // A download that stops halfway leaves nothing either, nor one longer
        // than it was announced.
        let mut w = cache.writer(other, Some(7)).unwrap();
        w.write(b"anoth");
        drop(w);
        let mut w = cache.writer(other, Some(3)).unwrap();
        w.write(b"another");
        assert!(!w.commit());
        // Nor one of unknown length.
        assert!(cache.writer(other, None).is_none());
        let names: Vec<_> = std::fs::read_dir(dir.path().join("c")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [std::ffi::OsString::from(hex(&digest))]);
        let mode = std::fs::metadata(dir.path().join("c")).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn the_cache_keeps_to_its_limit_dropping_the_files_used_longest_ago() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(Cache::open(dir.path(), 4000).unwrap());
        let keep = |bytes: &[u8]| {
            let mut w = cache.writer(b2(bytes), Some(bytes.len() as u64)).unwrap();
            w.write(bytes);
            assert!(w.commit());
        };
        let (a, b, c) = (vec![1u8; 1000], vec![2u8; 1000], vec![3u8; 1000]);
        keep(&a);
        std::thread::sleep(std::time::Duration::from_millis(20));
        keep(&b);
        std::thread::sleep(std::time::Duration::from_millis(20));
        // `a` used again: `b` is now the oldest.
        assert!(cache.get(&b2(&a)).is_some());
        std::thread::sleep(std::time::Duration::from_millis(20));
        keep(&c);
        std::thread::sleep(std::time::Duration::from_millis(20));
        keep(&[4u8; 1000]);
        keep(&[5u8; 1000]);
        assert!(cache.get(&b2(&b)).is_none(), "the oldest went");
        assert!(cache.get(&b2(&a)).is_some());
        // Larger than a quarter of the cache: not kept at all.
        assert!(cache.writer(b2(b"big"), Some(1001)).is_none());
        // A new daemon counts what an old one kept.
        assert_eq!(Cache::open(dir.path(), 4000).unwrap().held.load(Ordering::Relaxed), 4000);
    }

    #[test]
    fn one_download_per_file_and_downloads_together_within_half_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(Cache::open(dir.path(), 4000).unwrap());
        let (a, b, c) = (b2(b"a"), b2(b"b"), b2(b"c"));
        let first = cache.writer(a, Some(1000)).unwrap();
        // The same file again while it downloads: passes uncached.
        assert!(cache.writer(a, Some(1000)).is_none());
        let second = cache.writer(b, Some(1000)).unwrap();
        // 2000 announced: half the cache. No more until one ends.
        assert!(cache.writer(c, Some(1)).is_none());
        let parts = || std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(parts(), 2);
        drop(first);
        assert_eq!(parts(), 1);
        let third = cache.writer(c, Some(1000)).unwrap();
        assert!(cache.writer(a, Some(1000)).is_none());
        drop((second, third));
        assert!(cache.writer(a, Some(1000)).is_some());
    }

    #[test]
    fn a_download_given_up_is_emptied_at_once_though_its_writer_writes_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(Cache::open(dir.path(), 4000).unwrap());
        let bytes = vec![7u8; 1000];
        let mut stalled = cache.writer(b2(&bytes), Some(1000)).unwrap();
        stalled.write(&bytes[..900]);
        // Older than DOWNLOAD_FOR: the next download gives it up.
        let long_ago = Instant::now().checked_sub(DOWNLOAD_FOR + Duration::from_secs(1)).unwrap();
        cache.downloading.lock().unwrap().values_mut().for_each(|d| d.began = long_ago);
        let next = cache.writer(b2(b"next"), Some(10)).unwrap();
        // Its part is gone from the disk while its writer, stalled, lives on.
        let held: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(held, std::slice::from_ref(&next.part));
        assert_eq!(stalled.file.as_ref().unwrap().metadata().unwrap().blocks(), 0, "emptied, not just unlinked");
        stalled.write(&bytes[900..]);
        assert!(!stalled.commit());
        drop(next);
    }

    #[test]
    fn a_download_given_up_stops_writing_and_frees_its_place() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(Cache::open(dir.path(), 4000).unwrap());
        let bytes = vec![7u8; 100];
        let mut w = cache.writer(b2(&bytes), Some(100)).unwrap();
        w.write(&bytes[..50]);
        // What `writer` does to a download older than DOWNLOAD_FOR.
        w.given_up.store(true, Ordering::Relaxed);
        cache.downloading.lock().unwrap().clear();
        w.write(&bytes[50..]);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "its part is gone at once");
        let again = cache.writer(b2(&bytes), Some(100)).unwrap();
        assert!(!w.commit());
        // The given-up writer's end does not free the new download's place.
        assert!(cache.writer(b2(&bytes), Some(100)).is_none());
        drop(again);
    }
}
