//! Per-run cgroups with memory (no swap), cpu and pids limits.
//!
//! cgroup v2 first (production hosts: systemd with `Delegate=yes`), and the v1 /
//! hybrid layout as the fallback (memory, cpu and pids as v1 controllers, plus the
//! controller-less cgroup2 hierarchy, when mounted, for `cgroup.kill`). Run cgroups
//! are created only below the cgroup the daemon itself is in, inside one directory
//! named after the daemon instance, so a restart can find and remove what an
//! earlier instance left.
//!
//! What differs between the two is behind [`Layout`] ([`v2::V2`], [`v1::V1`]):
//! where a run's directories are, and which files hold its limits and counters.
//! Everything else -- creating, killing, removing, listing processes -- is plain
//! directory and file work, the same for both, here. Both are unit-tested against
//! a fake cgroup tree in a temporary directory (see the tests below).

pub mod v1;
pub mod v2;

use crate::mountinfo::{self, Mount};
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {0}: {1}")]
    Read(PathBuf, io::Error),
    #[error("writing {0}: {1}")]
    Write(PathBuf, io::Error),
    #[error("creating cgroup {0}: {1}")]
    Create(PathBuf, io::Error),
    #[error("removing cgroup {0}: {1}")]
    Remove(PathBuf, io::Error),
    #[error("no cgroup hierarchy with the {0} controller is mounted; mount cgroup2 (or the v1 {0} controller) under /sys/fs/cgroup")]
    MissingController(&'static str),
}

/// The limits one run's cgroup enforces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub memory_bytes: u64,
    /// CPU time as a number of cores (1.0 = one core).
    pub cpus: f64,
    pub pids: u64,
}

pub const CPU_PERIOD_US: u64 = 100_000;

/// The CFS quota for `cpus` cores per [`CPU_PERIOD_US`] (at least 1 ms).
pub fn cpu_quota_us(cpus: f64) -> u64 {
    ((cpus * CPU_PERIOD_US as f64).round() as u64).max(1000)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V2,
    V1,
}

/// A memory-controller file of one run, named differently in v1 and v2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryFile {
    /// Bytes charged now.
    Current,
    /// Peak bytes (writable with "0" to reset, where the kernel allows).
    Peak,
    /// The counters that include `oom_kill`.
    Events,
}

/// A pids-controller file of one run, named alike in v1 and v2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidsFile {
    /// Tasks (processes and threads) in the cgroup now.
    Current,
    /// The most tasks at once since the cgroup was made (the kernel cannot reset it).
    Peak,
}

/// What differs between cgroup v1 and v2, for the run cgroups named `id`.
pub trait Layout: fmt::Debug + Send + Sync {
    fn version(&self) -> Version;
    /// A short description for logs and the health route.
    fn describe(&self) -> String;
    /// The directories run cgroups are made in: one per hierarchy, sorted, no
    /// duplicates. A run has one directory of its name below each.
    fn bases(&self) -> Vec<PathBuf>;
    /// Write the memory, cpu and pids limits (the CPU weight is left alone).
    fn set_limits(&self, id: &str, limits: &Limits) -> Result<(), Error>;
    /// The least CPU weight (`idle`), or the default one.
    fn set_idle(&self, id: &str, idle: bool) -> Result<(), Error>;
    fn memory_file(&self, id: &str, file: MemoryFile) -> PathBuf;
    fn pids_file(&self, id: &str, file: PidsFile) -> PathBuf;
    /// CPU time used by the cgroup's tasks so far, nanoseconds (None: no cpu
    /// accounting, or it could not be read).
    fn cpu_usage_ns(&self, id: &str) -> Option<u64>;
    /// The `cgroup.procs` that lists every process of the run.
    fn procs(&self, id: &str) -> PathBuf;
    /// The run's `cgroup.kill`, where there is a cgroup2 hierarchy.
    fn kill_file(&self, id: &str) -> Option<PathBuf>;
}

/// Where run cgroups are made, found once at start-up.
#[derive(Debug, Clone)]
pub struct Cgroups {
    layout: Arc<dyn Layout>,
}

/// One run's cgroup(s). A clone reads the same counters; only the owner removes it.
#[derive(Debug, Clone)]
pub struct RunCgroup {
    layout: Arc<dyn Layout>,
    id: String,
    /// The directories made for it (removed by [`RunCgroup::remove`]).
    dirs: Vec<PathBuf>,
}

/// `/proc/self/cgroup` as `(controllers, path)`; the v2 line has no controllers.
pub(crate) fn parse_proc_cgroup(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let ctrls = parts.next()?;
            let path = parts.next()?.to_string();
            let ctrls = if ctrls.is_empty() { vec![] } else { ctrls.split(',').map(str::to_string).collect() };
            Some((ctrls, path))
        })
        .collect()
}

pub(crate) fn join_rel(base: &Path, cgroup_path: &str) -> PathBuf {
    base.join(cgroup_path.trim_start_matches('/'))
}

pub(crate) fn read(path: &Path) -> Result<String, Error> {
    fs::read_to_string(path).map_err(|e| Error::Read(path.into(), e))
}

pub(crate) fn write(path: &Path, value: &str) -> Result<(), Error> {
    fs::write(path, value).map_err(|e| Error::Write(path.into(), e))
}

pub(crate) fn write_if_present(path: &Path, value: &str) -> Result<(), Error> {
    if path.exists() {
        write(path, value)
    } else {
        Ok(())
    }
}

impl Cgroups {
    /// Find the hierarchies and this process's place in them; `instance` names the
    /// directory (below the daemon's own cgroup) that holds the run cgroups.
    pub fn detect(instance: &str) -> Result<Self, Error> {
        let mounts = mountinfo::parse(&read(Path::new(mountinfo::SELF))?);
        let own = parse_proc_cgroup(&read(Path::new("/proc/self/cgroup"))?);
        Self::detect_in(&mounts, &own, instance)
    }

    /// [`Cgroups::detect`] over a given mount table and `/proc/self/cgroup`: v2
    /// when its hierarchy has the memory, cpu and pids controllers, else v1.
    pub fn detect_in(mounts: &[Mount], own: &[(Vec<String>, String)], instance: &str) -> Result<Self, Error> {
        let layout: Arc<dyn Layout> = match v2::V2::detect(mounts, own, instance)? {
            Some(v2) => Arc::new(v2),
            None => Arc::new(v1::V1::detect(mounts, own, instance)?),
        };
        Ok(Cgroups { layout })
    }

    /// Run cgroups laid out by `layout` (tests build a layout over a fake tree).
    pub fn with_layout(layout: Arc<dyn Layout>) -> Self {
        Cgroups { layout }
    }

    pub fn version(&self) -> Version {
        self.layout.version()
    }

    /// A short description for logs and the health route.
    pub fn describe(&self) -> String {
        self.layout.describe()
    }

    /// The directories run cgroups are made in; each must exist for a run to start.
    pub fn bases(&self) -> Vec<PathBuf> {
        self.layout.bases()
    }

    /// Create the cgroup(s) for run `id`, without limits yet (see [`RunCgroup::set_limits`]).
    pub fn create(&self, id: &str) -> Result<RunCgroup, Error> {
        let mut run = self.run_cgroup(id);
        for base in self.layout.bases() {
            let dir = base.join(id);
            if let Err(e) = fs::create_dir(&dir) {
                let _ = run.remove();
                return Err(Error::Create(dir, e));
            }
            run.dirs.push(dir);
        }
        Ok(run)
    }

    fn run_cgroup(&self, id: &str) -> RunCgroup {
        RunCgroup { layout: self.layout.clone(), id: id.to_string(), dirs: vec![] }
    }

    /// Kill and remove every run cgroup an earlier instance left behind.
    /// Returns how many were removed.
    pub fn remove_stale(&self) -> Result<usize, Error> {
        let bases = self.layout.bases();
        let mut ids: Vec<String> = vec![];
        for base in &bases {
            let entries = fs::read_dir(base).map_err(|e| Error::Read(base.clone(), e))?;
            for entry in entries.flatten() {
                if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if !ids.contains(&name) {
                        ids.push(name);
                    }
                }
            }
        }
        for id in &ids {
            let mut run = self.run_cgroup(id);
            run.dirs = bases.iter().map(|b| b.join(id)).filter(|d| d.is_dir()).collect();
            run.kill();
            run.remove()?;
        }
        Ok(ids.len())
    }
}

impl Cgroups {
    /// Remove every run cgroup still there, then the instance's own directories
    /// (one per hierarchy): a clean stop leaves no cgroup behind. Returns how
    /// many run cgroups were still there.
    pub fn remove_all(&self) -> Result<usize, Error> {
        let left = self.remove_stale()?;
        for base in self.layout.bases() {
            match fs::remove_dir(&base) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::Remove(base, e)),
            }
        }
        Ok(left)
    }
}

impl RunCgroup {
    /// Set (or change) the run's limits, with the default CPU weight.
    pub fn set_limits(&self, limits: &Limits) -> Result<(), Error> {
        self.set_idle(false)?;
        self.layout.set_limits(&self.id, limits)
    }

    /// Give the cgroup the least CPU weight (`idle`), so a pooled sandbox warming up
    /// only uses CPU that runs leave free, or the default weight back.
    pub fn set_idle(&self, idle: bool) -> Result<(), Error> {
        self.layout.set_idle(&self.id, idle)
    }

    fn read_number(&self, file: MemoryFile) -> Option<u64> {
        fs::read_to_string(self.layout.memory_file(&self.id, file)).ok()?.trim().parse().ok()
    }

    /// Memory charged to the cgroup now, bytes.
    pub fn memory_current(&self) -> Option<u64> {
        self.read_number(MemoryFile::Current)
    }

    /// Peak memory use in bytes, when the kernel reports it.
    pub fn memory_peak(&self) -> Option<u64> {
        self.read_number(MemoryFile::Peak)
    }

    /// Start measuring peak memory afresh (a slot's cgroup serves many runs): the
    /// returned file reads the peak since now. v1 resets the cgroup's
    /// `memory.max_usage_in_bytes` to the current charge; v2 (6.12 and later) resets
    /// `memory.peak` for this open file only, so the peak must be read through it.
    /// None when the kernel cannot reset it (v2 before 6.12).
    pub fn reset_peak(&self) -> Option<fs::File> {
        let path = self.layout.memory_file(&self.id, MemoryFile::Peak);
        let mut file = fs::OpenOptions::new().read(true).write(true).truncate(true).open(path).ok()?;
        io::Write::write_all(&mut file, b"0").ok()?;
        Some(file)
    }

    /// The peak read through a file [`RunCgroup::reset_peak`] returned.
    pub fn peak_since_reset(file: &fs::File) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 64];
        let n = file.read_at(&mut buf, 0).ok()?;
        std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
    }

    /// CPU time the cgroup's tasks have used so far, nanoseconds.
    pub fn cpu_usage_ns(&self) -> Option<u64> {
        self.layout.cpu_usage_ns(&self.id)
    }

    fn read_pids(&self, file: PidsFile) -> Option<u64> {
        fs::read_to_string(self.layout.pids_file(&self.id, file)).ok()?.trim().parse().ok()
    }

    /// Tasks (processes and threads) in the cgroup now.
    pub fn pids_current(&self) -> Option<u64> {
        self.read_pids(PidsFile::Current)
    }

    /// The most tasks the cgroup had at once since it was made.
    pub fn pids_peak(&self) -> Option<u64> {
        self.read_pids(PidsFile::Peak)
    }

    /// How many processes the kernel's OOM killer has killed in this cgroup so far.
    pub fn oom_kills(&self) -> u64 {
        fs::read_to_string(self.layout.memory_file(&self.id, MemoryFile::Events))
            .map(|text| parse_counter(&text, "oom_kill"))
            .unwrap_or(0)
    }

    /// The `cgroup.procs` files a process writes its pid to, to join this run.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// The processes in the cgroup now.
    pub fn pids(&self) -> Vec<i32> {
        let text = fs::read_to_string(self.layout.procs(&self.id)).unwrap_or_default();
        text.lines().filter_map(|l| l.trim().parse().ok()).collect()
    }

    /// SIGKILL every process in the cgroup but `keep` (the slot process itself).
    pub fn kill_except(&self, keep: Option<u32>) {
        // Usually only the run's helper is still there, a moment from gone: poll fast.
        for _ in 0..2000 {
            let pids: Vec<i32> = self.pids().into_iter().filter(|p| Some(*p as u32) != keep).collect();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Kill every process in the run: `cgroup.kill` where there is one, else SIGKILL
    /// to each pid listed until none is left.
    pub fn kill(&self) {
        if let Some(file) = self.layout.kill_file(&self.id) {
            if fs::write(file, "1").is_ok() {
                return;
            }
        }
        self.kill_except(None);
    }

    /// Remove the run's directories; retries while the last processes finish exiting.
    pub fn remove(&self) -> Result<(), Error> {
        for dir in &self.dirs {
            let mut tries = 0;
            loop {
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e) if tries < 200 && e.raw_os_error() == Some(libc::EBUSY) => {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => return Err(Error::Remove(dir.clone(), e)),
                }
            }
        }
        Ok(())
    }
}

/// The value of `key` in a flat-keyed file (`memory.events`, `memory.oom_control`).
pub(crate) fn parse_counter(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
pub(crate) mod fake {
    //! A fake cgroup tree in a temporary directory: directories stand for cgroups,
    //! plain files for their interface files. What the kernel would create or
    //! fill in (control files of a new cgroup, counters) the tests write themselves.

    use std::path::{Path, PathBuf};

    pub struct Tree {
        pub dir: tempfile::TempDir,
    }

    impl Tree {
        pub fn new() -> Tree {
            Tree { dir: tempfile::tempdir().unwrap() }
        }
        pub fn path(&self, rel: &str) -> PathBuf {
            self.dir.path().join(rel)
        }
        /// Write `text` to `rel`, making its directories.
        pub fn put(&self, rel: &str, text: &str) {
            let p = self.path(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        pub fn get(&self, rel: &str) -> String {
            std::fs::read_to_string(self.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
        }
        pub fn mkdir(&self, rel: &str) {
            std::fs::create_dir_all(self.path(rel)).unwrap();
        }
        /// A mountinfo line mounting `fstype` with `super_options` at `rel`.
        pub fn mount(&self, id: u32, rel: &str, fstype: &str, super_options: &str) -> String {
            let at = self.path(rel).display().to_string().replace(' ', "\\040");
            format!("{id} 25 0:{id} / {at} rw,nosuid,nodev,noexec,relatime shared:{id} - {fstype} {fstype} {super_options}\n")
        }
        /// Empty a fake cgroup of its "interface files", as rmdir on cgroupfs ignores them.
        pub fn clear_files(dir: &Path) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                if e.file_type().unwrap().is_file() {
                    std::fs::remove_file(e.path()).unwrap();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_cgroup() {
        let own = parse_proc_cgroup("4:memory:/a/b\n1:cpu,cpuacct:/\n0::/x.service\n");
        assert_eq!(own[0], (vec!["memory".to_string()], "/a/b".to_string()));
        assert_eq!(own[1].0, vec!["cpu".to_string(), "cpuacct".to_string()]);
        assert_eq!(own[2], (vec![], "/x.service".to_string()));
        assert_eq!(join_rel(Path::new("/sys/fs/cgroup/memory"), "/a/b"), PathBuf::from("/sys/fs/cgroup/memory/a/b"));
    }

    #[test]
    fn reads_oom_kill_counters() {
        assert_eq!(parse_counter("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"), 3);
        assert_eq!(parse_counter("low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\noom_group_kill 0\n", "oom_kill"), 1);
        assert_eq!(parse_counter("oom_kill_disable 0\n", "oom_kill"), 0);
    }

    #[test]
    fn cpu_quota_is_cores_times_the_period_and_at_least_a_millisecond() {
        assert_eq!(cpu_quota_us(1.0), 100_000);
        assert_eq!(cpu_quota_us(1.5), 150_000);
        assert_eq!(cpu_quota_us(0.001), 1000);
    }

    #[test]
    fn no_controller_anywhere_is_a_clear_error() {
        let mounts = mountinfo::parse("22 1 0:21 / /proc rw - proc proc rw\n");
        let err = Cgroups::detect_in(&mounts, &[], "i").unwrap_err();
        assert!(matches!(err, Error::MissingController("memory")), "{err}");
    }
}
