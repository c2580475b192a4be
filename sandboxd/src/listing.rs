//! Workspace listings (`GET /v1/sessions/{id}/files`, MCP's `list_files`,
//! `sandboxctl files ls`): one walk, bounded by the JSON it will make, kept
//! compact, encoded while the client reads it; and only a few at a time.
//!
//! Sandboxed code chooses a listing's size: hard links cost no space, and a name
//! of control bytes takes 6 bytes a byte in the entry's `path` and 3 in its `url`.
//! So the bound is on the answer as encoded: the walk counts each file's entry as
//! the JSON it will be and stops at [`MAX_JSON`] (the listing is then partial).
//! Bounding it up front, rather than writing the array while the walk goes, is
//! what lets the `sandboxd-listing-partial` header, and an exact `Content-Length`,
//! be known before the first byte; and a walk that waits for a slow client would
//! keep its blocking thread, its directory fds and the session (whose teardown
//! waits for it) for as long as the client likes. Sorting by path needs each
//! directory's names in memory anyway ([`crate::workspace`]'s walk).
//!
//! What a listing keeps between its walk and its answer is compact: the raw path
//! bytes and 24 bytes a file ([`Files`]), a fraction of the JSON (under half of it
//! for plain names, about an eighth for names of control bytes). It is encoded in
//! [`CHUNK`]-byte pieces as the connection asks for them, so a client that reads
//! slowly holds that, one piece, and the connection's buffer.
//!
//! [`Slots`]: at most [`IN_FLIGHT`] listings are walked or sent at once in the
//! daemon, and [`TOKEN_IN_FLIGHT`] per token, each from its walk's start until its
//! answer is sent or its client goes (or, in-process, until dropped). A listing
//! past either waits up to [`WAIT`] for one to end, then is refused ([`Busy`]).

use crate::model::files::FileEntry;
use crate::names;
use crate::workspace::{self, Walked, Workspace};
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A workspace listing: the files (compact, encoded as they are read), and
/// whether the workspace holds more (this module).
pub struct Listing {
    pub files: Files,
    pub partial: bool,
}

/// Largest listing, as the JSON it is sent as; a bigger workspace is listed partly.
pub const MAX_JSON: usize = 16 * 1024 * 1024;
/// Bytes of JSON encoded at a time while a listing is sent.
pub const CHUNK: usize = 64 * 1024;
/// Listings walked or sent at once, in the daemon.
pub const IN_FLIGHT: usize = 8;
/// Listings walked or sent at once, per token.
pub const TOKEN_IN_FLIGHT: usize = 2;
/// How long a listing waits for a slot before it is refused.
pub const WAIT: Duration = Duration::from_secs(5);
/// Latest time a `modified_at` can say (the end of year 9999, RFC 3339's last).
const LAST_SECOND: i64 = 253_402_300_799;

/// One listed file: where its path is in [`Files::paths`], its size and mtime.
#[derive(Debug, Clone, Copy)]
struct Entry {
    start: u32,
    len: u32,
    size: u64,
    mtime_s: i64,
}

/// The files of one listing, compact, and what their JSON array will take.
pub struct Files {
    /// `<public_url>/v1/sessions/<id>/files/`: each entry's `url` starts so.
    prefix: String,
    paths: Vec<u8>,
    entries: Vec<Entry>,
    /// Bytes of the JSON array of every entry, `[` and `]` included.
    json_len: usize,
    /// The listing's place among those in flight, given back when this goes.
    slot: Option<Slot>,
}

impl Files {
    /// No files yet; each entry's `url` will be `url_prefix` and the path's URL form.
    pub fn new(url_prefix: String) -> Files {
        Files { prefix: url_prefix, paths: vec![], entries: vec![], json_len: 2, slot: None }
    }

    /// Add the file at `raw` (its path's bytes), if its entry fits in [`MAX_JSON`]
    /// with those before it; false (and nothing added) if not.
    pub fn push(&mut self, raw: &[u8], size: u64, modified: SystemTime) -> bool {
        let mtime_s = match modified.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_secs()).unwrap_or(LAST_SECOND).min(LAST_SECOND),
            Err(_) => 0,
        };
        let (Ok(start), Ok(len)) = (u32::try_from(self.paths.len()), u32::try_from(raw.len())) else {
            return false;
        };
        let entry = Entry { start, len, size, mtime_s };
        let comma = usize::from(!self.entries.is_empty());
        let grown = self.json_len + comma + json_len(&self.entry_of(raw, &entry));
        if grown > MAX_JSON {
            return false;
        }
        self.paths.extend_from_slice(raw);
        self.entries.push(entry);
        self.json_len = grown;
        true
    }

    fn entry_of(&self, raw: &[u8], e: &Entry) -> FileEntry {
        let modified = SystemTime::UNIX_EPOCH + Duration::from_secs(e.mtime_s.max(0) as u64);
        FileEntry {
            path: names::text(raw),
            size_bytes: e.size,
            mime_type: crate::artifacts::mime_type(std::path::Path::new(std::ffi::OsStr::from_bytes(raw))),
            modified_at: crate::session::rfc3339(modified),
            url: format!("{}{}", self.prefix, names::url(raw)),
        }
    }

    fn get(&self, e: &Entry) -> FileEntry {
        let start = e.start as usize;
        let raw = self.paths.get(start..start + e.len as usize).unwrap_or_default();
        self.entry_of(raw, e)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries, in path order, made as they are asked for.
    pub fn iter(&self) -> impl Iterator<Item = FileEntry> + '_ {
        self.entries.iter().map(|e| self.get(e))
    }

    /// Bytes of the JSON array [`Files::into_chunks`] makes: exactly.
    pub fn json_len(&self) -> usize {
        self.json_len
    }

    /// Keep `slot` until this listing is dropped (sent, or its client gone).
    pub fn hold(&mut self, slot: Slot) {
        self.slot = Some(slot);
    }

    /// The JSON array of the entries, in pieces of about [`CHUNK`] bytes, each
    /// encoded when it is asked for.
    pub fn into_chunks(self) -> Chunks {
        Chunks { files: self, next: 0, started: false, done: false }
    }
}

/// A listing's JSON, a piece at a time ([`Files::into_chunks`]).
pub struct Chunks {
    files: Files,
    next: usize,
    started: bool,
    done: bool,
}

impl Iterator for Chunks {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        if self.done {
            return None;
        }
        let mut buf = Vec::with_capacity(CHUNK + 4096);
        if !self.started {
            buf.push(b'[');
            self.started = true;
        }
        while buf.len() < CHUNK {
            let Some(e) = self.files.entries.get(self.next) else { break };
            if self.next > 0 {
                buf.push(b',');
            }
            // A struct of strings and numbers always serializes.
            let _ = serde_json::to_writer(&mut buf, &self.files.get(e));
            self.next += 1;
        }
        if self.next == self.files.entries.len() {
            buf.push(b']');
            self.done = true;
        }
        Some(buf)
    }
}

/// Bytes of `entry` as JSON.
fn json_len(entry: &FileEntry) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, entry);
    count.0
}

/// Walk `ws` into a listing whose entries' URLs start with `url_prefix`: every
/// regular file in path order until [`MAX_JSON`] (or the walk's own bounds).
pub fn walk(ws: &Workspace, url_prefix: String) -> Result<(Files, Walked), workspace::Error> {
    let mut files = Files::new(url_prefix);
    let walked = ws.walk(|found| {
        let raw = found.path.as_os_str().as_bytes();
        if files.push(raw, found.stat.size, found.stat.modified()) {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(())
        }
    })?;
    Ok((files, walked))
}

/// A listing past its limits, after waiting [`WAIT`] for a place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Busy {
    #[error("this token already has {0} listings being walked or sent (the most at once): each stays until its answer is read to the end or its connection closes; finish or close those, then retry")]
    Token(usize),
    #[error("the daemon is walking or sending {0} listings (the most at once): retry in a few seconds")]
    Daemon(usize),
}

/// The places of listings in flight ([`IN_FLIGHT`] in all, [`TOKEN_IN_FLIGHT`] a token).
pub struct Slots {
    all: Arc<Semaphore>,
    in_flight: usize,
    per_token: usize,
    wait: Duration,
    /// One semaphore per token that listed (tokens are configured: a few).
    tokens: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// A listing's place; given back when dropped.
#[derive(Debug)]
pub struct Slot {
    _token: Option<OwnedSemaphorePermit>,
    _all: OwnedSemaphorePermit,
}

impl Slots {
    pub fn new(in_flight: usize, per_token: usize, wait: Duration) -> Slots {
        Slots { all: Arc::new(Semaphore::new(in_flight)), in_flight, per_token, wait, tokens: Mutex::default() }
    }

    /// A place for a listing by `owner` (a token's identity; None: no per-token
    /// limit), waiting up to the slots' wait for one.
    pub async fn take(&self, owner: Option<&str>) -> Result<Slot, Busy> {
        let deadline = tokio::time::Instant::now() + self.wait;
        let token = match owner {
            Some(owner) => {
                let sem = {
                    let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
                    tokens.entry(owner.to_string()).or_insert_with(|| Arc::new(Semaphore::new(self.per_token))).clone()
                };
                match tokio::time::timeout_at(deadline, sem.acquire_owned()).await {
                    Ok(Ok(permit)) => Some(permit),
                    _ => return Err(Busy::Token(self.per_token)),
                }
            }
            None => None,
        };
        match tokio::time::timeout_at(deadline, self.all.clone().acquire_owned()).await {
            Ok(Ok(all)) => Ok(Slot { _token: token, _all: all }),
            _ => Err(Busy::Daemon(self.in_flight)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    /// What is sent is exactly what `Json(Vec<FileEntry>)` would have been, and
    /// exactly as long as counted.
    #[test]
    fn the_chunks_are_the_json_array_counted_up_front() {
        for count in [0usize, 1, 2, 700, 5000] {
            let mut files = Files::new("http://127.0.0.1:8181/v1/sessions/s/files/".into());
            for i in 0..count {
                let name = format!("d{}/\x01\"\\ \u{e9}-{i}.png", i % 7);
                let mut raw = name.into_bytes();
                if i % 5 == 0 {
                    raw.push(0xff);
                }
                assert!(files.push(&raw, i as u64, at(1_700_000_000 + i as u64)));
            }
            let expected = serde_json::to_vec(&files.iter().collect::<Vec<_>>()).unwrap();
            assert_eq!(files.json_len(), expected.len(), "{count}");
            let chunks: Vec<Vec<u8>> = files.into_chunks().collect();
            assert!(chunks.iter().all(|c| c.len() < CHUNK + 4096));
            assert_eq!(chunks.concat(), expected, "{count}");
        }
    }

    #[test]
    fn an_entry_says_its_path_as_text_and_its_url_as_raw_bytes() {
        let mut files = Files::new("http://h/v1/sessions/s/files/".into());
        assert!(files.push(b"out/a\xffb.png", 3, at(0)));
        assert!(files.push(b"out/a\\xffb.png", 4, at(u64::MAX / 4)));
        let got: Vec<FileEntry> = files.iter().collect();
        assert_eq!(got[0].path, "out/a\\xffb.png");
        assert_eq!(got[0].url, "http://h/v1/sessions/s/files/out/a%FFb.png");
        assert_eq!((got[0].mime_type.as_str(), got[0].modified_at.as_str()), ("image/png", "1970-01-01T00:00:00Z"));
        assert_eq!(got[1].path, "out/a\\\\xffb.png");
        assert_eq!(got[1].url, "http://h/v1/sessions/s/files/out/a%5Cxffb.png");
        // An mtime past what RFC 3339 can say is its last second, not a panic.
        assert_eq!(got[1].modified_at, "9999-12-31T23:59:59Z");
    }

    /// Names of control bytes: the bound counts them as the JSON they become.
    #[test]
    fn a_listing_stops_at_its_encoded_size() {
        let mut files = Files::new("http://127.0.0.1:8181/v1/sessions/0123456789abcdef/files/".into());
        let mut n = 0u32;
        while files.push(format!("{}{n:06}", "\x01".repeat(200)).as_bytes(), 0, at(0)) {
            n += 1;
        }
        assert!(files.json_len() <= MAX_JSON && files.json_len() > MAX_JSON - 4096, "{}", files.json_len());
        let raw_kept = files.paths.len() + files.entries.len() * std::mem::size_of::<Entry>();
        assert!(raw_kept * 8 < files.json_len(), "kept {raw_kept} for {}", files.json_len());
        let sent: usize = files.into_chunks().map(|c| c.len()).sum();
        assert!(sent <= MAX_JSON);
    }

    #[tokio::test]
    async fn slots_are_bounded_per_token_and_in_all_and_given_back() {
        let slots = Slots::new(3, 2, Duration::from_millis(300));
        let a1 = slots.take(Some("a")).await.unwrap();
        let _a2 = slots.take(Some("a")).await.unwrap();
        assert_eq!(slots.take(Some("a")).await.unwrap_err(), Busy::Token(2));
        // Another token is not held up by the first one's.
        let b1 = slots.take(Some("b")).await.unwrap();
        assert_eq!(slots.take(Some("b")).await.unwrap_err(), Busy::Daemon(3));
        assert_eq!(slots.take(None).await.unwrap_err(), Busy::Daemon(3));
        // A listing that waits gets the place one gives back within the wait.
        let waiting = tokio::spawn(async move {
            let slot = slots.take(Some("a")).await;
            (slots, slot)
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(a1);
        let (slots, slot) = waiting.await.unwrap();
        assert!(slot.is_ok());
        drop(b1);
        assert!(slots.take(None).await.is_ok());
    }
}
