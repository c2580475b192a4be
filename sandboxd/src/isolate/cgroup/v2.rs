//! cgroup v2: one hierarchy, one directory per run, `cgroup.kill` always there.

use super::CPU_PERIOD_US;
use super::{
    cpu_quota_us, join_rel, read, write, write_if_present, Error, Layout, Limits, MemoryFile, PidsFile, Version,
};
use crate::mountinfo::Mount;
use std::fs;
use std::path::{Path, PathBuf};

/// The controllers a run's cgroup needs.
pub const CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];

/// Run cgroups below `base` (`<the daemon's cgroup>/<instance>`).
#[derive(Debug, Clone)]
pub struct V2 {
    base: PathBuf,
}

impl V2 {
    /// The cgroup2 hierarchy, when it is mounted, this process is in it and it has
    /// all of [`CONTROLLERS`]; the daemon's own cgroup is then delegated (see
    /// [`delegate`]). `None` when v2 cannot serve (the caller falls back to v1).
    pub fn detect(mounts: &[Mount], own: &[(Vec<String>, String)], instance: &str) -> Result<Option<V2>, Error> {
        let mount = mounts.iter().find(|m| m.fstype == "cgroup2").map(|m| &m.mount_point);
        let path = own.iter().find(|(c, _)| c.is_empty()).map(|(_, p)| p);
        let (Some(mount), Some(path)) = (mount, path) else { return Ok(None) };
        let controllers = fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
        let have: Vec<&str> = controllers.split_whitespace().collect();
        if !CONTROLLERS.iter().all(|c| have.contains(c)) {
            return Ok(None);
        }
        Ok(Some(V2 { base: delegate(&join_rel(mount, path), instance)? }))
    }

    /// Run cgroups directly below `base`, which exists and has the controllers enabled.
    pub fn at(base: PathBuf) -> V2 {
        V2 { base }
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.base.join(id)
    }
}

/// v2 delegation: a cgroup with processes cannot hand controllers to children, so
/// the daemon moves itself into a leaf (`<own>/daemon`) and enables the controllers
/// for `<own>/<instance>`. This is what systemd expects of a `Delegate=yes` service.
pub fn delegate(own: &Path, instance: &str) -> Result<PathBuf, Error> {
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

impl Layout for V2 {
    fn version(&self) -> Version {
        Version::V2
    }

    fn describe(&self) -> String {
        format!("cgroup v2 at {}", self.base.display())
    }

    fn bases(&self) -> Vec<PathBuf> {
        vec![self.base.clone()]
    }

    fn set_limits(&self, id: &str, limits: &Limits) -> Result<(), Error> {
        let d = self.dir(id);
        write(&d.join("memory.max"), &limits.memory_bytes.to_string())?;
        write_if_present(&d.join("memory.swap.max"), "0")?;
        write_if_present(&d.join("memory.oom.group"), "1")?;
        write(&d.join("cpu.max"), &format!("{} {CPU_PERIOD_US}", cpu_quota_us(limits.cpus)))?;
        write(&d.join("pids.max"), &limits.pids.to_string())
    }

    fn set_idle(&self, id: &str, idle: bool) -> Result<(), Error> {
        write(&self.dir(id).join("cpu.weight"), if idle { "1" } else { "100" })
    }

    fn memory_file(&self, id: &str, file: MemoryFile) -> PathBuf {
        self.dir(id).join(match file {
            MemoryFile::Current => "memory.current",
            MemoryFile::Peak => "memory.peak",
            MemoryFile::Events => "memory.events",
        })
    }

    fn pids_file(&self, id: &str, file: PidsFile) -> PathBuf {
        self.dir(id).join(match file {
            PidsFile::Current => "pids.current",
            PidsFile::Peak => "pids.peak",
        })
    }

    fn cpu_usage_ns(&self, id: &str) -> Option<u64> {
        let text = fs::read_to_string(self.dir(id).join("cpu.stat")).ok()?;
        let usec =
            text.lines().find_map(|l| l.strip_prefix("usage_usec ")).and_then(|v| v.trim().parse::<u64>().ok())?;
        Some(usec.saturating_mul(1000))
    }

    fn procs(&self, id: &str) -> PathBuf {
        self.dir(id).join("cgroup.procs")
    }

    fn kill_file(&self, id: &str) -> Option<PathBuf> {
        Some(self.dir(id).join("cgroup.kill"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::Tree;
    use super::super::{parse_proc_cgroup, Cgroups};
    use super::*;
    use crate::mountinfo;

    /// A v2 host: cgroup2 at `root` (with a space in its path, escaped in the
    /// mount table), the daemon in `/system.slice/sandboxd.service`.
    fn host(tree: &Tree, controllers: &str) -> Result<Cgroups, Error> {
        tree.put("cg root/cgroup.controllers", controllers);
        tree.mkdir("cg root/system.slice/sandboxd.service");
        let table = tree.mount(30, "proc", "proc", "rw") + &tree.mount(31, "cg root", "cgroup2", "rw,nsdelegate");
        let own = parse_proc_cgroup("0::/system.slice/sandboxd.service\n");
        Cgroups::detect_in(&mountinfo::parse(&table), &own, "sandboxd-test")
    }

    const SERVICE: &str = "cg root/system.slice/sandboxd.service";

    #[test]
    fn detects_and_delegates() {
        let tree = Tree::new();
        let cg = host(&tree, "cpuset cpu io memory hugetlb pids rdma misc\n").unwrap();
        assert_eq!(cg.version(), Version::V2);
        let base = tree.path(&format!("{SERVICE}/sandboxd-test"));
        assert_eq!(cg.bases(), vec![base.clone()]);
        assert_eq!(cg.describe(), format!("cgroup v2 at {}", base.display()));
        // The controllers are handed down to the instance's directory.
        assert_eq!(tree.get(&format!("{SERVICE}/cgroup.subtree_control")), "+memory +cpu +pids");
        assert_eq!(tree.get(&format!("{SERVICE}/sandboxd-test/cgroup.subtree_control")), "+memory +cpu +pids");
    }

    #[test]
    fn without_all_three_controllers_v2_is_not_used() {
        let tree = Tree::new();
        // No v1 hierarchy either: the error names the first controller v1 lacks.
        let err = host(&tree, "cpu io pids\n").unwrap_err();
        assert!(matches!(err, Error::MissingController("memory")), "{err}");
        assert!(!tree.path(&format!("{SERVICE}/sandboxd-test")).exists());
    }

    #[test]
    fn a_run_cgroup_from_create_to_remove() {
        let tree = Tree::new();
        let cg = host(&tree, "cpu memory pids").unwrap();
        let run = cg.create("run-1").unwrap();
        let rel = |f: &str| format!("{SERVICE}/sandboxd-test/run-1/{f}");
        let dir = tree.path(&rel(""));
        assert!(dir.is_dir());
        // Creating it twice fails and leaves the first.
        assert!(matches!(cg.create("run-1"), Err(Error::Create(..))));
        assert!(dir.is_dir());

        // The files the kernel makes in a new cgroup (the optional ones included).
        for f in ["memory.swap.max", "memory.oom.group"] {
            tree.put(&rel(f), "max\n");
        }
        run.set_limits(&Limits { memory_bytes: 64 << 20, cpus: 1.5, pids: 32 }).unwrap();
        assert_eq!(tree.get(&rel("memory.max")), (64u64 << 20).to_string());
        assert_eq!(tree.get(&rel("memory.swap.max")), "0");
        assert_eq!(tree.get(&rel("memory.oom.group")), "1");
        assert_eq!(tree.get(&rel("cpu.max")), "150000 100000");
        assert_eq!(tree.get(&rel("pids.max")), "32");
        assert_eq!(tree.get(&rel("cpu.weight")), "100");
        run.set_idle(true).unwrap();
        assert_eq!(tree.get(&rel("cpu.weight")), "1");

        // A process joins through the files the slot writes its pid to.
        assert_eq!(run.procs_files(), vec![tree.path(&rel("cgroup.procs"))]);
        std::fs::write(&run.procs_files()[0], "4242\n4243\n").unwrap();
        assert_eq!(run.pids(), vec![4242, 4243]);

        // Usage and OOM counters.
        tree.put(&rel("memory.current"), "123456\n");
        tree.put(&rel("memory.peak"), "999999\n");
        tree.put(&rel("memory.events"), "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 1\n");
        assert_eq!(run.memory_current(), Some(123456));
        assert_eq!(run.memory_peak(), Some(999999));
        assert_eq!(run.oom_kills(), 2);
        assert!(run.reset_peak().is_some());
        assert_eq!(tree.get(&rel("memory.peak")), "0");
        tree.put(&rel("cpu.stat"), "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n");
        tree.put(&rel("pids.current"), "2\n");
        tree.put(&rel("pids.peak"), "9\n");
        assert_eq!((run.cpu_usage_ns(), run.pids_current(), run.pids_peak()), (Some(2_500_000), Some(2), Some(9)));

        // Killing uses cgroup.kill (no signal is sent to the fake pids).
        run.kill();
        assert_eq!(tree.get(&rel("cgroup.kill")), "1");

        // rmdir on cgroupfs ignores interface files; the fake tree has real ones.
        Tree::clear_files(&dir);
        run.remove().unwrap();
        assert!(!dir.exists());
        // Removing what is already gone is fine.
        run.remove().unwrap();
    }

    #[test]
    fn counters_of_a_missing_cgroup_read_as_nothing() {
        let run = Cgroups::with_layout(std::sync::Arc::new(V2::at("/nonexistent/sandboxd".into()))).run_cgroup("x");
        assert_eq!((run.memory_current(), run.memory_peak(), run.oom_kills(), run.pids()), (None, None, 0, vec![]));
    }
}
