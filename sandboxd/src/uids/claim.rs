//! The host-wide claim on a daemon's uids, held for as long as it runs.
//!
//! Two daemons on one host whose uid ranges overlap would run sandboxes of
//! different tenants as one host uid: a user namespace is owned by its creator's
//! uid, so a sandbox of one daemon would hold every capability over the other's
//! namespaces (enter its mounts, read its workspace), and both would be charged
//! to one set of per-user counters. Nothing in either daemon's own state shows
//! it, so each daemon says which uids it uses where every other one looks: an
//! abstract Unix socket (in the daemon's network namespace, no file anywhere, gone
//! with the process however it ends) named
//! `sandboxd-uids/<pid>/<first>-<end>,<first>-<end>…`. A daemon binds its own
//! name, then reads `/proc/net/unix` for the others' and refuses to start on an
//! overlap, naming the other daemon. Two that start at once each see the other
//! and both refuse: safe, and the operator's fix is the same. Any host process
//! can bind such a name, so a claim counts only when the pid it names is a root
//! process that holds that very socket (its inode among the pid's open files),
//! and when that inode is on no other line of the table: the kernel prints a
//! socket's name raw, so a name with a newline in it can forge a line, but a
//! forged line can only borrow an inode that has its own line already. So an
//! unprivileged user cannot keep a daemon from starting by squatting a name or
//! forging one.

use std::ops::Range;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// What every claim's name starts with.
const PREFIX: &str = "sandboxd-uids/";
/// The longest abstract socket name (`sun_path` less its leading NUL).
const NAME_MAX: usize = 107;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "another sandboxd (pid {pid}) runs sandboxes as host uids {}, which overlap this daemon's ({}): \
         give one of them a uid_base whose range does not overlap the other's (a daemon uses max_sessions + 256 \
         uids from its uid_base); two daemons on one uid would share their sandboxes' user namespaces",
        show(theirs),
        show(ours)
    )]
    Overlap { pid: u32, theirs: Vec<Range<u32>>, ours: Vec<Range<u32>> },
    #[error("claiming host uids {} (abstract socket {name:?}): {source}", show(ours))]
    Bind { name: String, ours: Vec<Range<u32>>, source: std::io::Error },
    #[error("reading /proc/net/unix to find other daemons' uids: {0}")]
    Read(std::io::Error),
}

/// This daemon's claim; dropping it releases the uids.
#[derive(Debug)]
pub struct Claim {
    _socket: UnixDatagram,
}

/// Claim `spans` (ascending, disjoint) for this process, or say which other
/// daemon holds some of them.
pub fn claim(spans: &[Range<u32>]) -> Result<Claim, Error> {
    let pid = std::process::id();
    let ours = fit(spans);
    let name = name(pid, &ours);
    let bound = SocketAddr::from_abstract_name(name.as_bytes()).and_then(|addr| UnixDatagram::bind_addr(&addr));
    let socket = bound.map_err(|source| Error::Bind { name: name.clone(), ours: ours.clone(), source })?;
    let table = std::fs::read_to_string("/proc/net/unix").map_err(Error::Read)?;
    for (other, inode, theirs) in claims(&table) {
        if other != pid && overlap(&ours, &theirs) && held_by_root(other, inode) {
            return Err(Error::Overlap { pid: other, theirs, ours });
        }
    }
    Ok(Claim { _socket: socket })
}

/// Whether `pid` is a root process with socket `inode` open.
fn held_by_root(pid: u32, inode: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    let proc = std::path::PathBuf::from(format!("/proc/{pid}"));
    if std::fs::metadata(&proc).map(|m| m.uid()).ok() != Some(0) {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(proc.join("fd")) else { return false };
    let want = format!("socket:[{inode}]");
    fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
}

/// `spans` in a name that fits: while it does not, the two spans with the
/// narrowest gap between them become one (a claim may cover more uids than the
/// daemon uses, never fewer).
fn fit(spans: &[Range<u32>]) -> Vec<Range<u32>> {
    let mut spans = spans.to_vec();
    while spans.len() > 1 && name(u32::MAX, &spans).len() > NAME_MAX {
        let narrowest = (1..spans.len()).min_by_key(|&i| spans[i].start.saturating_sub(spans[i - 1].end));
        if let Some(i) = narrowest {
            let next = spans.remove(i);
            spans[i - 1].end = next.end;
        }
    }
    spans
}

fn name(pid: u32, spans: &[Range<u32>]) -> String {
    let spans: Vec<String> = spans.iter().map(|r| format!("{}-{}", r.start, r.end)).collect();
    format!("{PREFIX}{pid}/{}", spans.join(","))
}

/// Every claim in `/proc/net/unix`'s text: the pid it names, its socket's inode and
/// its spans. A name that does not parse is no claim, and neither is a line whose
/// inode another line shows too (one of them is forged).
fn claims(table: &str) -> Vec<(u32, u64, Vec<Range<u32>>)> {
    let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    let mut seen = std::collections::HashMap::<&str, usize>::new();
    for fields in &lines {
        if let Some(inode) = fields.get(6) {
            *seen.entry(inode).or_default() += 1;
        }
    }
    lines
        .iter()
        .filter_map(|fields| {
            let inode_text = fields.get(6)?;
            if seen.get(inode_text) != Some(&1) {
                return None;
            }
            let (pid, spans) = parse(fields.get(7)?)?;
            Some((pid, inode_text.parse().ok()?, spans))
        })
        .collect()
}

/// `@sandboxd-uids/<pid>/<a>-<b>,…` (an abstract name, as `/proc/net/unix` shows it).
fn parse(path: &str) -> Option<(u32, Vec<Range<u32>>)> {
    let rest = path.strip_prefix('@')?.strip_prefix(PREFIX)?;
    let (pid, spans) = rest.split_once('/')?;
    let spans = spans
        .split(',')
        .map(|s| {
            let (a, b) = s.split_once('-')?;
            Some(a.parse().ok()?..b.parse().ok()?)
        })
        .collect::<Option<Vec<Range<u32>>>>()?;
    Some((pid.parse().ok()?, spans))
}

fn overlap(a: &[Range<u32>], b: &[Range<u32>]) -> bool {
    a.iter().any(|x| b.iter().any(|y| x.start < y.end && y.start < x.end))
}

fn show(spans: &[Range<u32>]) -> String {
    let spans: Vec<String> = spans
        .iter()
        .map(|r| match r.end.saturating_sub(r.start) {
            1 => r.start.to_string(),
            _ => format!("{} to {}", r.start, r.end.saturating_sub(1)),
        })
        .collect();
    spans.join(", ")
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // one span is a list of spans here
mod tests {
    use super::*;

    #[test]
    fn a_claim_reads_back_from_the_table_as_the_kernel_shows_it() {
        let ours = [600_000..600_288, 700_004..700_005];
        let line = format!("0000000000000000: 00000002 00000000 00000000 0002 01 123456 @{}", name(4242, &ours));
        let table = format!(
            "Num       RefCount Protocol Flags    Type St Inode Path\n{line}\n\
             0000000000000000: 00000002 00000000 00010000 0001 01 99 /run/sandboxd/sandboxd.sock\n\
             0000000000000000: 00000002 00000000 00000000 0002 01 98 @sandboxd-uids/x/1-2\n\
             0000000000000000: 00000002 00000000 00000000 0002 01 97 @sandboxd-uids/7/1-\n\
             0000000000000000: 00000003 00000000 00000000 0001 03 96\n"
        );
        assert_eq!(claims(&table), [(4242, 123456, ours.to_vec())]);
        // A name with a newline forges a line that borrows a real socket's inode
        // (here 99, the daemon's listening socket): neither line counts.
        let forged = format!(
            "{table}0000000000000000: 00000002 00000000 00000000 0002 01 95 @x\n\
             0000000000000000: 00000002 00000000 00000000 0002 01 99 @sandboxd-uids/1/0-4294967295\n"
        );
        assert_eq!(claims(&forged), [(4242, 123456, ours.to_vec())]);
    }

    #[test]
    fn a_claim_counts_only_from_a_root_process_holding_its_socket() {
        let spans = [3_000_000..3_000_010];
        let claim = claim(&spans);
        if nix::unistd::geteuid().is_root() {
            let Ok(_held) = claim else { panic!("{claim:?}") };
            let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
            let mine = claims(&table).into_iter().find(|c| c.0 == std::process::id());
            let Some((pid, inode, found)) = mine else { panic!("no claim of ours in the table") };
            assert_eq!(found, spans);
            assert!(held_by_root(pid, inode));
            // The same pid with another socket's inode: not a claim it holds.
            assert!(!held_by_root(pid, inode + 1_000_000_007));
        }
        // pid 1's own sockets aside, no process holds inode 0.
        assert!(!held_by_root(1, 0));
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
        assert!(name(u32::MAX, &fitted).len() <= NAME_MAX);
        // Whatever was claimed is still covered.
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
}
