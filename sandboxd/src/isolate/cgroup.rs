//! Per-run cgroups with memory (no swap), cpu and pids limits.
//!
//! cgroup v2 first (production hosts: systemd with `Delegate=yes`), and the v1 /
//! hybrid layout as the fallback (memory, cpu and pids as v1 controllers, plus the
//! controller-less cgroup2 hierarchy, when mounted, for `cgroup.kill`). Run cgroups
//! are created only below the cgroup the daemon itself is in, inside one directory
//! named after the daemon instance, so a restart can find and remove what an
//! earlier instance left.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V2,
    V1,
}

/// Where run cgroups are made, found once at start-up.
#[derive(Debug, Clone)]
pub struct Cgroups {
    pub version: Version,
    /// `(controller, directory below which run cgroups are created)`; in v2 all three
    /// are the same directory.
    memory: PathBuf,
    cpu: PathBuf,
    pids: PathBuf,
    /// A cgroup2 directory for the same runs (v2 itself, or hybrid's controller-less
    /// hierarchy): gives `cgroup.kill`.
    unified: Option<PathBuf>,
}

/// One run's cgroup(s).
#[derive(Debug)]
pub struct RunCgroup {
    version: Version,
    dirs: Vec<PathBuf>,
    memory: PathBuf,
    cpu: PathBuf,
    pids: PathBuf,
    unified: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct MountInfo {
    mount_point: PathBuf,
    fstype: String,
    super_options: Vec<String>,
}

fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            let mut r = right.split(' ');
            let fstype = r.next()?.to_string();
            let _source = r.next()?;
            let super_options = r.next().unwrap_or("").split(',').map(str::to_string).collect();
            Some(MountInfo { mount_point: PathBuf::from(unescape_octal(mount_point)), fstype, super_options })
        })
        .collect()
}

fn unescape_octal(s: &str) -> String {
    s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
}

/// `/proc/self/cgroup` as `(controllers, path)`; the v2 line has no controllers.
fn parse_proc_cgroup(text: &str) -> Vec<(Vec<String>, String)> {
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

fn join_rel(base: &Path, cgroup_path: &str) -> PathBuf {
    base.join(cgroup_path.trim_start_matches('/'))
}

fn read(path: &Path) -> Result<String, Error> {
    fs::read_to_string(path).map_err(|e| Error::Read(path.into(), e))
}

fn write(path: &Path, value: &str) -> Result<(), Error> {
    fs::write(path, value).map_err(|e| Error::Write(path.into(), e))
}

impl Cgroups {
    /// Find the hierarchies and this process's place in them; `instance` names the
    /// directory (below the daemon's own cgroup) that holds the run cgroups.
    pub fn detect(instance: &str) -> Result<Self, Error> {
        let mounts = parse_mountinfo(&read(Path::new("/proc/self/mountinfo"))?);
        let own = parse_proc_cgroup(&read(Path::new("/proc/self/cgroup"))?);
        let v2_path = own.iter().find(|(c, _)| c.is_empty()).map(|(_, p)| p.clone());
        let v2_mount = mounts.iter().find(|m| m.fstype == "cgroup2").map(|m| m.mount_point.clone());

        if let (Some(mount), Some(path)) = (&v2_mount, &v2_path) {
            let controllers = fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
            let have: Vec<&str> = controllers.split_whitespace().collect();
            if ["memory", "cpu", "pids"].iter().all(|c| have.contains(c)) {
                let own_dir = join_rel(mount, path);
                let base = delegate_v2(&own_dir, instance)?;
                return Ok(Cgroups {
                    version: Version::V2,
                    memory: base.clone(),
                    cpu: base.clone(),
                    pids: base.clone(),
                    unified: Some(base),
                });
            }
        }

        let v1_base = |controller: &'static str| -> Result<PathBuf, Error> {
            let mount = mounts
                .iter()
                .find(|m| m.fstype == "cgroup" && m.super_options.iter().any(|o| o == controller))
                .ok_or(Error::MissingController(controller))?;
            let path =
                own.iter().find(|(c, _)| c.iter().any(|x| x == controller)).map(|(_, p)| p.as_str()).unwrap_or("/");
            let base = join_rel(&mount.mount_point, path).join(instance);
            fs::create_dir_all(&base).map_err(|e| Error::Create(base.clone(), e))?;
            Ok(base)
        };
        let memory = v1_base("memory")?;
        let cpu = v1_base("cpu")?;
        let pids = v1_base("pids")?;
        if let Ok(hierarchy) = read(&memory.join("memory.use_hierarchy")) {
            if hierarchy.trim() == "0" {
                // Without hierarchy the parent's limits do not bind the runs; harmless
                // to set on our own fresh directory.
                let _ = write(&memory.join("memory.use_hierarchy"), "1");
            }
        }
        let unified = match (&v2_mount, &v2_path) {
            (Some(mount), Some(path)) => {
                let base = join_rel(mount, path).join(instance);
                fs::create_dir_all(&base).ok().map(|_| base)
            }
            _ => None,
        };
        Ok(Cgroups { version: Version::V1, memory, cpu, pids, unified })
    }

    fn bases(&self) -> Vec<&PathBuf> {
        let mut v = vec![&self.memory, &self.cpu, &self.pids];
        if let Some(u) = &self.unified {
            v.push(u);
        }
        v.sort();
        v.dedup();
        v
    }

    /// A short description for logs and the health route.
    pub fn describe(&self) -> String {
        match self.version {
            Version::V2 => format!("cgroup v2 at {}", self.memory.display()),
            Version::V1 => format!(
                "cgroup v1 (memory {}, cpu {}, pids {}; cgroup.kill {})",
                self.memory.display(),
                self.cpu.display(),
                self.pids.display(),
                self.unified.as_ref().map(|u| u.display().to_string()).unwrap_or_else(|| "unavailable".into())
            ),
        }
    }

    /// Create the cgroup(s) for run `id`, without limits yet (see [`RunCgroup::set_limits`]).
    pub fn create(&self, id: &str) -> Result<RunCgroup, Error> {
        let mut run = self.run_cgroup(id);
        for base in self.bases() {
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
        RunCgroup {
            version: self.version,
            dirs: vec![],
            memory: self.memory.join(id),
            cpu: self.cpu.join(id),
            pids: self.pids.join(id),
            unified: self.unified.as_ref().map(|u| u.join(id)),
        }
    }

    /// Kill and remove every run cgroup an earlier instance left behind.
    /// Returns how many were removed.
    pub fn remove_stale(&self) -> Result<usize, Error> {
        let mut ids: Vec<String> = vec![];
        for base in self.bases() {
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
            run.dirs = self.bases().iter().map(|b| b.join(id)).filter(|d| d.is_dir()).collect();
            run.kill();
            run.remove()?;
        }
        Ok(ids.len())
    }
}

/// v2 delegation: a cgroup with processes cannot hand controllers to children, so
/// the daemon moves itself into a leaf (`<own>/daemon`) and enables the controllers
/// for `<own>/<instance>`. This is what systemd expects of a `Delegate=yes` service.
fn delegate_v2(own: &Path, instance: &str) -> Result<PathBuf, Error> {
    let enable = |dir: &Path| write(&dir.join("cgroup.subtree_control"), "+memory +cpu +pids");
    if enable(own).is_err() {
        let leaf = own.join("daemon");
        fs::create_dir_all(&leaf).map_err(|e| Error::Create(leaf.clone(), e))?;
        for pid in read(&own.join("cgroup.procs"))?.lines() {
            // A process may exit between the read and the write: ignore those.
            let _ = fs::write(leaf.join("cgroup.procs"), pid);
        }
        enable(own)?;
    }
    let base = own.join(instance);
    fs::create_dir_all(&base).map_err(|e| Error::Create(base.clone(), e))?;
    enable(&base)?;
    Ok(base)
}

fn write_if_present(path: &Path, value: &str) -> Result<(), Error> {
    if path.exists() {
        write(path, value)
    } else {
        Ok(())
    }
}

impl RunCgroup {
    /// Set (or change) the run's limits, with the default CPU weight.
    pub fn set_limits(&self, limits: &Limits) -> Result<(), Error> {
        self.set_idle(false)?;
        let quota = ((limits.cpus * CPU_PERIOD_US as f64).round() as u64).max(1000);
        match self.version {
            Version::V2 => {
                let d = &self.memory;
                write(&d.join("memory.max"), &limits.memory_bytes.to_string())?;
                write_if_present(&d.join("memory.swap.max"), "0")?;
                write_if_present(&d.join("memory.oom.group"), "1")?;
                write(&d.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
                write(&d.join("pids.max"), &limits.pids.to_string())
            }
            Version::V1 => {
                let m = &self.memory;
                // memory+swap must stay >= memory: order the two writes so each is valid.
                let memsw = m.join("memory.memsw.limit_in_bytes");
                let current: u64 = fs::read_to_string(m.join("memory.limit_in_bytes"))
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(u64::MAX);
                let value = limits.memory_bytes.to_string();
                if limits.memory_bytes < current {
                    write(&m.join("memory.limit_in_bytes"), &value)?;
                    write_if_present(&memsw, &value)?;
                } else {
                    write_if_present(&memsw, &value)?;
                    write(&m.join("memory.limit_in_bytes"), &value)?;
                }
                write(&self.cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                write(&self.cpu.join("cpu.cfs_quota_us"), &quota.to_string())?;
                write(&self.pids.join("pids.max"), &limits.pids.to_string())
            }
        }
    }

    /// Give the cgroup the least CPU weight (`idle`), so a pooled sandbox warming up
    /// only uses CPU that runs leave free, or the default weight back.
    pub fn set_idle(&self, idle: bool) -> Result<(), Error> {
        match self.version {
            Version::V2 => write(&self.memory.join("cpu.weight"), if idle { "1" } else { "100" }),
            Version::V1 => write(&self.cpu.join("cpu.shares"), if idle { "2" } else { "1024" }),
        }
    }

    /// Memory charged to the cgroup now, bytes.
    pub fn memory_current(&self) -> Option<u64> {
        let file = match self.version {
            Version::V2 => "memory.current",
            Version::V1 => "memory.usage_in_bytes",
        };
        fs::read_to_string(self.memory.join(file)).ok()?.trim().parse().ok()
    }

    /// The `cgroup.procs` files a process writes its pid to, to join this run.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// How many processes the kernel's OOM killer has killed in this cgroup so far.
    pub fn oom_kills(&self) -> u64 {
        let file = match self.version {
            Version::V2 => "memory.events",
            Version::V1 => "memory.oom_control",
        };
        fs::read_to_string(self.memory.join(file)).map(|text| parse_counter(&text, "oom_kill")).unwrap_or(0)
    }

    /// Start measuring peak memory afresh (a slot's cgroup serves many runs).
    pub fn reset_peak(&self) {
        let file = match self.version {
            Version::V2 => "memory.peak",
            Version::V1 => "memory.max_usage_in_bytes",
        };
        // Kernels before 6.12 cannot reset memory.peak: the peak then spans runs.
        let _ = fs::write(self.memory.join(file), "0");
    }

    /// The processes in the cgroup now.
    pub fn pids(&self) -> Vec<i32> {
        let procs = match self.version {
            Version::V2 => self.memory.join("cgroup.procs"),
            Version::V1 => self.pids.join("cgroup.procs"),
        };
        let text = fs::read_to_string(procs).unwrap_or_default();
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

    /// Peak memory use in bytes, when the kernel reports it.
    pub fn memory_peak(&self) -> Option<u64> {
        let file = match self.version {
            Version::V2 => "memory.peak",
            Version::V1 => "memory.max_usage_in_bytes",
        };
        fs::read_to_string(self.memory.join(file)).ok()?.trim().parse().ok()
    }

    /// Kill every process in the run: `cgroup.kill` where there is one, else SIGKILL
    /// to each pid listed until none is left.
    pub fn kill(&self) {
        if let Some(u) = &self.unified {
            if fs::write(u.join("cgroup.kill"), "1").is_ok() {
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

fn parse_counter(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hybrid_mountinfo() {
        let text = "35 25 0:30 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory\n\
                    36 25 0:31 / /sys/fs/cgroup/unified rw,relatime shared:15 - cgroup2 cgroup2 rw\n\
                    37 25 0:32 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].mount_point, PathBuf::from("/sys/fs/cgroup/memory"));
        assert!(m[0].super_options.contains(&"memory".to_string()));
        assert_eq!(m[1].fstype, "cgroup2");
        assert!(m[2].super_options.contains(&"cpu".to_string()));
    }

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
}
