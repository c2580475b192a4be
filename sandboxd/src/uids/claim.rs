//! The host-wide claim on a daemon's uids, held for as long as it runs.
//!
//! Two daemons on one host whose uid ranges overlap would run sandboxes of
//! different tenants as one host uid: a user namespace is owned by its creator's
//! uid, so a sandbox of one daemon would hold every capability over the other's
//! namespaces (enter its mounts, read its workspace), and both would be charged
//! to one set of per-user counters. Nothing in either daemon's own state shows
//! it, so each daemon says which uids it uses where every other one looks: a
//! listening abstract Unix socket (in the daemon's network namespace, no file
//! anywhere, gone with the process however it ends) named
//! `sandboxd-uids/<nonce>/<first>-<end>,<first>-<end>…`. A daemon binds its own
//! name, then reads the names in `/proc/net/unix` and refuses to start on one
//! that overlaps, naming the daemon that holds it. Two that start at once each
//! see the other and both refuse: safe, and the operator's fix is the same.
//!
//! Any host process can bind such a name, and the kernel prints names raw (a name
//! with a newline in it forges a line of the table), so a name counts only once
//! the daemon has connected to exactly that name and the kernel said who listens
//! there (`SO_PEERCRED`: the credentials of the process that called `listen`):
//! root. A name nobody listens on, or one an unprivileged user listens on (even
//! from a setuid program it then ran), is no claim. The nonce keeps anyone from
//! taking a daemon's name before it binds it.

use nix::errno::Errno;
use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, UnixAddr};
use std::ops::Range;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What every claim's name starts with.
const PREFIX: &str = "sandboxd-uids/";
/// The longest abstract socket name (`sun_path` less its leading NUL).
const NAME_MAX: usize = 107;
/// How long a check waits between tries on a full backlog (the claim's thread
/// takes each connection as it comes), and in all; and how long the claim's thread
/// waits before it accepts again after an error (no fd left, say).
const ACCEPT_EVERY: Duration = Duration::from_millis(20);
const CHECK_PATIENCE: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "another sandboxd (pid {pid}) runs sandboxes as host uids {}, which overlap this daemon's ({}): \
         give one of them a uid_base whose range does not overlap the other's (a daemon uses max_sessions + 256 \
         uids from its uid_base); two daemons on one uid would share their sandboxes' user namespaces",
        super::describe(theirs),
        super::describe(ours)
    )]
    Overlap { pid: i32, theirs: Vec<Range<u32>>, ours: Vec<Range<u32>> },
    #[error("claiming host uids {} (abstract socket {name:?}): {source}", super::describe(ours))]
    Bind { name: String, ours: Vec<Range<u32>>, source: std::io::Error },
    #[error("reading /proc/net/unix to find other daemons' uids: {0}")]
    Read(std::io::Error),
}

/// This daemon's claim; dropping it releases the uids.
#[derive(Debug)]
pub struct Claim {
    name: String,
    stop: Arc<AtomicBool>,
    /// Shared with the thread that waits in `accept` on it: shut down to wake it.
    listener: Arc<UnixListener>,
    accepter: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // A listening socket shut down wakes its `accept`, which then fails.
        let _ = socket::shutdown(std::os::fd::AsRawFd::as_raw_fd(&*self.listener), socket::Shutdown::Both);
        if let Some(t) = self.accepter.take() {
            let _ = t.join();
        }
    }
}

/// Claim `spans` (ascending, disjoint) for this process, or say which other
/// daemon holds some of them.
pub fn claim(spans: &[Range<u32>]) -> Result<Claim, Error> {
    let ours = fit(spans);
    let (name, listener) = bind(&ours)?;
    let table = std::fs::read_to_string("/proc/net/unix").map_err(Error::Read)?;
    for (other, theirs) in claims(&table) {
        if other == name || !overlap(&ours, &theirs) {
            continue;
        }
        if let Some(pid) = root_listens_on(&other) {
            return Err(Error::Overlap { pid, theirs, ours });
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let listener = Arc::new(listener);
    let theirs = listener.clone();
    let accepter = std::thread::Builder::new()
        .name("uid-claim".into())
        .spawn(move || accept_until(&theirs, &stopped))
        .map_err(|source| Error::Bind { name: name.clone(), ours: ours.clone(), source })?;
    Ok(Claim { name, stop, listener, accepter: Some(accepter) })
}

impl Claim {
    /// The abstract name this claim listens on.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Listen on a fresh name for `ours` (a new nonce if one is taken).
fn bind(ours: &[Range<u32>]) -> Result<(String, UnixListener), Error> {
    let mut last = None;
    for _ in 0..8 {
        let name = name(&nonce(), ours);
        let bound = SocketAddr::from_abstract_name(name.as_bytes()).and_then(|a| UnixListener::bind_addr(&a));
        match bound {
            Ok(l) => return Ok((name, l)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some((name, e)),
            Err(source) => return Err(Error::Bind { name, ours: ours.to_vec(), source }),
        }
    }
    let (name, source) = last.unwrap_or_else(|| (String::new(), std::io::ErrorKind::AddrInUse.into()));
    Err(Error::Bind { name, ours: ours.to_vec(), source })
}

/// Take the connections other daemons make to check this claim, and drop them:
/// asleep in `accept` in between (an idle daemon wakes for nothing), until the
/// claim is dropped.
fn accept_until(listener: &UnixListener, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) if stop.load(Ordering::Relaxed) => return,
            Err(_) => std::thread::sleep(ACCEPT_EVERY),
        }
    }
}

/// The pid of the root process listening on abstract `name`, if one does; `None`
/// when nobody listens there (a forged line), someone else does, or it cannot be
/// told within [`CHECK_PATIENCE`].
fn root_listens_on(name: &str) -> Option<i32> {
    let addr = UnixAddr::new_abstract(name.as_bytes()).ok()?;
    let deadline = std::time::Instant::now() + CHECK_PATIENCE;
    loop {
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )
        .ok()?;
        match socket::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr) {
            Ok(()) => {
                let peer = socket::getsockopt(&fd, sockopt::PeerCredentials).ok()?;
                return (peer.uid() == 0).then_some(peer.pid());
            }
            // A full backlog: the holder's thread takes them every few ms.
            Err(Errno::EAGAIN) if std::time::Instant::now() < deadline => std::thread::sleep(ACCEPT_EVERY),
            Err(e) => {
                if e == Errno::EAGAIN {
                    tracing::warn!(name, "a uid claim could not be checked (its backlog stayed full): not counted");
                }
                return None;
            }
        }
    }
}

fn nonce() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    if std::fs::File::open("/dev/urandom").and_then(|mut r| r.read_exact(&mut bytes)).is_err() {
        // Without randomness the time still differs between starts; a taken name
        // is retried anyway.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        bytes = (t.as_nanos() as u64 ^ u64::from(std::process::id())).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `spans` in a name that fits: while it does not, the two spans with the
/// narrowest gap between them become one (a claim may cover more uids than the
/// daemon uses, never fewer).
fn fit(spans: &[Range<u32>]) -> Vec<Range<u32>> {
    let mut spans = spans.to_vec();
    while spans.len() > 1 && name("0000000000000000", &spans).len() > NAME_MAX {
        let narrowest = (1..spans.len()).min_by_key(|&i| spans[i].start.saturating_sub(spans[i - 1].end));
        if let Some(i) = narrowest {
            let next = spans.remove(i);
            spans[i - 1].end = next.end;
        }
    }
    spans
}

fn name(nonce: &str, spans: &[Range<u32>]) -> String {
    let spans: Vec<String> = spans.iter().map(|r| format!("{}-{}", r.start, r.end)).collect();
    format!("{PREFIX}{nonce}/{}", spans.join(","))
}

/// Every claim's name (without its `@`) and spans in `/proc/net/unix`'s text. A
/// name that does not parse is no claim; one that does is checked before it counts.
fn claims(table: &str) -> Vec<(String, Vec<Range<u32>>)> {
    table
        .lines()
        .filter_map(|line| {
            let name = line.split_whitespace().nth(7)?.strip_prefix('@')?;
            Some((name.to_string(), parse(name)?))
        })
        .collect()
}

/// `sandboxd-uids/<nonce>/<a>-<b>,…` with `a < b` in each span.
fn parse(name: &str) -> Option<Vec<Range<u32>>> {
    let rest = name.strip_prefix(PREFIX)?;
    let (_nonce, spans) = rest.split_once('/')?;
    spans
        .split(',')
        .map(|s| {
            let (a, b) = s.split_once('-')?;
            let r: Range<u32> = a.parse().ok()?..b.parse().ok()?;
            (r.start < r.end).then_some(r)
        })
        .collect()
}

fn overlap(a: &[Range<u32>], b: &[Range<u32>]) -> bool {
    a.iter().any(|x| b.iter().any(|y| x.start < y.end && y.start < x.end))
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // one span is a list of spans here
mod tests {
    use super::*;

    #[test]
    fn claims_read_back_from_the_table_as_the_kernel_shows_them() {
        let ours = [600_000..600_288, 700_004..700_005];
        let mine = name("00112233aabbccdd", &ours);
        let table = format!(
            "Num       RefCount Protocol Flags    Type St Inode Path\n\
             0000000000000000: 00000002 00000000 00010000 0001 01 123456 @{mine}\n\
             0000000000000000: 00000002 00000000 00010000 0001 01 99 /run/sandboxd/sandboxd.sock\n\
             0000000000000000: 00000002 00000000 00000000 0002 01 97 @sandboxd-uids/7/1-\n\
             0000000000000000: 00000002 00000000 00000000 0002 01 96 @sandboxd-uids/7/10-5\n\
             0000000000000000: 00000003 00000000 00000000 0001 03 95\n"
        );
        assert_eq!(claims(&table), [(mine, ours.to_vec())]);
    }

    #[test]
    fn spans_overlap_when_they_share_one_uid() {
        assert!(overlap(&[10..20], &[19..30]));
        assert!(!overlap(&[10..20], &[20..30]));
        assert!(overlap(&[0..1, 50..60], &[5..6, 55..56]));
        assert!(!overlap(&[0..1, 50..60], &[5..6, 60..70]));
    }

    #[test]
    fn a_name_fits_by_covering_the_narrowest_gaps() {
        let many: Vec<Range<u32>> = (0..20).map(|i| 600_000 + i * 1000..600_001 + i * 1000).collect();
        let fitted = fit(&many);
        assert!(name(&nonce(), &fitted).len() <= NAME_MAX);
        for r in &many {
            assert!(fitted.iter().any(|f| f.start <= r.start && r.end <= f.end), "{r:?} lost in {fitted:?}");
        }
        assert_eq!(fit(&[1..2, 5..6]), [1..2, 5..6]);
    }

    #[test]
    fn an_overlap_names_the_other_daemon_and_what_to_do() {
        let e = Error::Overlap { pid: 77, theirs: vec![600_000..600_288], ours: vec![600_100..600_101] };
        let text = e.to_string();
        assert!(text.contains("pid 77") && text.contains("600000 to 600287") && text.contains("(600100)"), "{text}");
        assert!(text.contains("uid_base"), "{text}");
    }

    #[test]
    fn a_second_claim_on_an_overlapping_range_is_refused_and_a_released_one_frees_it() {
        let first = claim(&[3_100_000..3_100_010]);
        let Ok(first) = first else { panic!("{first:?}") };
        assert!(std::fs::read_to_string("/proc/net/unix").unwrap_or_default().contains(first.name()));
        // Apart: both hold.
        let apart = claim(&[3_100_010..3_100_020]);
        assert!(apart.is_ok(), "{apart:?}");
        if nix::unistd::geteuid().is_root() {
            match claim(&[3_100_005..3_100_006]) {
                Err(Error::Overlap { pid, .. }) => assert_eq!(pid, std::process::id() as i32),
                other => panic!("{other:?}"),
            }
        }
        let name = first.name().to_string();
        drop(first);
        assert!(!std::fs::read_to_string("/proc/net/unix").unwrap_or_default().contains(&name));
        let again = claim(&[3_100_005..3_100_006]);
        assert!(again.is_ok(), "{again:?}");
        // Nobody listens on a forged name: no claim.
        assert_eq!(root_listens_on("sandboxd-uids/0000000000000000/3100000-3100010"), None);
    }
}
