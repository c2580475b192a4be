//! cgroup v1 (and hybrid): memory, cpu and pids are separate hierarchies, so a
//! run has one directory in each; the controller-less cgroup2 hierarchy of a
//! hybrid host, when mounted, adds a fourth that gives `cgroup.kill`.

use super::CPU_PERIOD_US;
use super::{
    cpu_quota_us, join_rel, read, write, write_if_present, Error, Layout, Limits, MemoryFile, PidsFile, Version,
};
use crate::mountinfo::Mount;
use std::fs;
use std::path::PathBuf;

/// The directories (one per hierarchy) below which run cgroups are created.
#[derive(Debug, Clone)]
pub struct V1 {
    memory: PathBuf,
    cpu: PathBuf,
    /// The cpuacct hierarchy (the same directory as `cpu` where they are mounted
    /// together), for the CPU time used; None when it is not mounted.
    cpuacct: Option<PathBuf>,
    pids: PathBuf,
    /// A cgroup2 directory for the same runs (hybrid's controller-less hierarchy).
    unified: Option<PathBuf>,
}

impl V1 {
    /// Make `<the daemon's cgroup>/<instance>` in each v1 hierarchy (and in the
    /// cgroup2 one, if mounted). Fails when a controller is not mounted at all.
    pub fn detect(mounts: &[Mount], own: &[(Vec<String>, String)], instance: &str) -> Result<V1, Error> {
        let base = |controller: &'static str| -> Result<PathBuf, Error> {
            let mount = mounts
                .iter()
                .find(|m| m.fstype == "cgroup" && m.has_super_option(controller))
                .ok_or(Error::MissingController(controller))?;
            let path =
                own.iter().find(|(c, _)| c.iter().any(|x| x == controller)).map(|(_, p)| p.as_str()).unwrap_or("/");
            let base = join_rel(&mount.mount_point, path).join(instance);
            fs::create_dir_all(&base).map_err(|e| Error::Create(base.clone(), e))?;
            Ok(base)
        };
        let memory = base("memory")?;
        let cpu = base("cpu")?;
        let cpuacct = base("cpuacct").ok();
        let pids = base("pids")?;
        if let Ok(hierarchy) = read(&memory.join("memory.use_hierarchy")) {
            if hierarchy.trim() == "0" {
                // Without hierarchy the parent's limits do not bind the runs; harmless
                // to set on our own fresh directory.
                let _ = write(&memory.join("memory.use_hierarchy"), "1");
            }
        }
        let v2_mount = mounts.iter().find(|m| m.fstype == "cgroup2").map(|m| &m.mount_point);
        let v2_path = own.iter().find(|(c, _)| c.is_empty()).map(|(_, p)| p);
        let unified = match (v2_mount, v2_path) {
            (Some(mount), Some(path)) => {
                let base = join_rel(mount, path).join(instance);
                fs::create_dir_all(&base).ok().map(|_| base)
            }
            _ => None,
        };
        Ok(V1 { memory, cpu, cpuacct, pids, unified })
    }
}

impl Layout for V1 {
    fn version(&self) -> Version {
        Version::V1
    }

    fn describe(&self) -> String {
        format!(
            "cgroup v1 (memory {}, cpu {}, pids {}; cgroup.kill {})",
            self.memory.display(),
            self.cpu.display(),
            self.pids.display(),
            self.unified.as_ref().map(|u| u.display().to_string()).unwrap_or_else(|| "unavailable".into())
        )
    }

    fn bases(&self) -> Vec<PathBuf> {
        let mut v = vec![self.memory.clone(), self.cpu.clone(), self.pids.clone()];
        v.extend(self.cpuacct.clone());
        v.extend(self.unified.clone());
        v.sort();
        v.dedup();
        v
    }

    fn set_limits(&self, id: &str, limits: &Limits) -> Result<(), Error> {
        let m = self.memory.join(id);
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
        // Socket buffers: v1 counts them apart from memory, and only once a limit
        // is set (else they are charged to no cgroup, and UDP receive queues could
        // hold host memory outside the sandbox's limit): a quarter of it.
        write_if_present(&m.join("memory.kmem.tcp.limit_in_bytes"), &socket_limit(limits.memory_bytes).to_string())?;
        let cpu = self.cpu.join(id);
        write(&cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
        write(&cpu.join("cpu.cfs_quota_us"), &cpu_quota_us(limits.cpus).to_string())?;
        write(&self.pids.join(id).join("pids.max"), &limits.pids.to_string())
    }

    fn set_idle(&self, id: &str, idle: bool) -> Result<(), Error> {
        write(&self.cpu.join(id).join("cpu.shares"), if idle { "2" } else { "1024" })
    }

    fn memory_file(&self, id: &str, file: MemoryFile) -> PathBuf {
        self.memory.join(id).join(match file {
            MemoryFile::Current => "memory.usage_in_bytes",
            MemoryFile::Peak => "memory.max_usage_in_bytes",
            MemoryFile::Events => "memory.oom_control",
        })
    }

    fn pids_file(&self, id: &str, file: PidsFile) -> PathBuf {
        self.pids.join(id).join(match file {
            PidsFile::Current => "pids.current",
            PidsFile::Peak => "pids.peak",
        })
    }

    fn cpu_usage_ns(&self, id: &str) -> Option<u64> {
        let file = self.cpuacct.as_ref()?.join(id).join("cpuacct.usage");
        fs::read_to_string(file).ok()?.trim().parse().ok()
    }

    fn procs(&self, id: &str) -> PathBuf {
        self.pids.join(id).join("cgroup.procs")
    }

    fn kill_file(&self, id: &str) -> Option<PathBuf> {
        self.unified.as_ref().map(|u| u.join(id).join("cgroup.kill"))
    }
}

/// On cgroup v1, what a run's socket buffers may hold at once (TCP and UDP
/// alike, once a limit is set): a quarter of its memory limit. On v2 they count
/// inside the memory limit itself.
pub fn socket_limit(memory_bytes: u64) -> u64 {
    memory_bytes / 4
}

#[cfg(test)]
mod tests {
    use super::super::fake::Tree;
    use super::super::{parse_proc_cgroup, Cgroups, RunCgroup};
    use super::*;
    use crate::mountinfo;

    /// A hybrid host (what CI runs on): v1 memory, cpu,cpuacct and pids, and the
    /// controller-less cgroup2 at `unified` when `with_unified`.
    fn host(tree: &Tree, with_unified: bool) -> Cgroups {
        let mut table = tree.mount(35, "memory", "cgroup", "rw,memory")
            + &tree.mount(36, "cpu,cpuacct", "cgroup", "rw,cpu,cpuacct")
            + &tree.mount(37, "pids", "cgroup", "rw,pids")
            + &tree.mount(38, "blkio", "cgroup", "rw,blkio");
        if with_unified {
            table += &tree.mount(39, "unified", "cgroup2", "rw,nsdelegate");
            // Its root has no controllers: v2 must not be chosen.
            tree.put("unified/cgroup.controllers", "");
        }
        for d in ["memory/user.slice", "cpu,cpuacct/user.slice", "pids/user.slice/s", "unified/user.slice/s"] {
            tree.mkdir(d);
        }
        tree.put("memory/user.slice/sandboxd/memory.use_hierarchy", "0\n");
        let own = parse_proc_cgroup(
            "12:pids:/user.slice/s\n5:memory:/user.slice\n3:cpu,cpuacct:/user.slice\n0::/user.slice/s\n",
        );
        Cgroups::detect_in(&mountinfo::parse(&table), &own, "sandboxd").unwrap()
    }

    #[test]
    fn detects_one_directory_per_hierarchy() {
        let tree = Tree::new();
        let cg = host(&tree, true);
        assert_eq!(cg.version(), Version::V1);
        let bases: Vec<PathBuf> = [
            "cpu,cpuacct/user.slice/sandboxd",
            "memory/user.slice/sandboxd",
            "pids/user.slice/s/sandboxd",
            "unified/user.slice/s/sandboxd",
        ]
        .iter()
        .map(|r| tree.path(r))
        .collect();
        assert_eq!(cg.bases(), bases);
        assert!(bases.iter().all(|b| b.is_dir()));
        assert!(cg.describe().starts_with("cgroup v1 (memory "), "{}", cg.describe());
        assert!(cg.describe().ends_with(&format!("cgroup.kill {})", bases[3].display())));
        // Hierarchical accounting switched on for our own directory.
        assert_eq!(tree.get("memory/user.slice/sandboxd/memory.use_hierarchy"), "1");
        // The hierarchy without a controller we need is not touched.
        assert!(!tree.path("blkio/sandboxd").exists());
    }

    #[test]
    fn a_run_cgroup_from_create_to_remove() {
        let tree = Tree::new();
        let cg = host(&tree, true);
        let run = cg.create("r").unwrap();
        let mem = |f: &str| format!("memory/user.slice/sandboxd/r/{f}");
        let cpu = |f: &str| format!("cpu,cpuacct/user.slice/sandboxd/r/{f}");
        let pids = |f: &str| format!("pids/user.slice/s/sandboxd/r/{f}");
        let unified = |f: &str| format!("unified/user.slice/s/sandboxd/r/{f}");

        // Lowering the limit: memory first, then memory+swap (present here).
        tree.put(&mem("memory.limit_in_bytes"), "9223372036854771712\n");
        tree.put(&mem("memory.memsw.limit_in_bytes"), "9223372036854771712\n");
        tree.put(&mem("memory.kmem.tcp.limit_in_bytes"), "9223372036854771712\n");
        run.set_limits(&Limits { memory_bytes: 256 << 20, cpus: 0.5, pids: 100 }).unwrap();
        assert_eq!(tree.get(&mem("memory.limit_in_bytes")), (256u64 << 20).to_string());
        assert_eq!(tree.get(&mem("memory.memsw.limit_in_bytes")), (256u64 << 20).to_string());
        // Socket buffers: counted, and a quarter of the memory limit.
        assert_eq!(tree.get(&mem("memory.kmem.tcp.limit_in_bytes")), (64u64 << 20).to_string());
        assert_eq!(tree.get(&cpu("cpu.cfs_period_us")), "100000");
        assert_eq!(tree.get(&cpu("cpu.cfs_quota_us")), "50000");
        assert_eq!(tree.get(&cpu("cpu.shares")), "1024");
        assert_eq!(tree.get(&pids("pids.max")), "100");
        run.set_idle(true).unwrap();
        assert_eq!(tree.get(&cpu("cpu.shares")), "2");

        // A process joins every hierarchy; its pid is listed by the pids one.
        let files = run.procs_files();
        assert_eq!(files.len(), 4);
        for f in &files {
            std::fs::write(f, "77\n").unwrap();
        }
        assert_eq!(run.pids(), vec![77]);

        tree.put(&mem("memory.usage_in_bytes"), "4096\n");
        tree.put(&mem("memory.max_usage_in_bytes"), "8192\n");
        tree.put(&mem("memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n");
        assert_eq!((run.memory_current(), run.memory_peak(), run.oom_kills()), (Some(4096), Some(8192), 5));
        let peak = run.reset_peak().unwrap();
        assert_eq!(tree.get(&mem("memory.max_usage_in_bytes")), "0");
        // What the kernel does on that write: the peak starts again from the charge.
        tree.put(&mem("memory.max_usage_in_bytes"), "4096\n");
        assert_eq!(RunCgroup::peak_since_reset(&peak), Some(4096));

        // CPU time from cpuacct (nanoseconds), tasks from the pids hierarchy.
        tree.put(&cpu("cpuacct.usage"), "1234567\n");
        tree.put(&pids("pids.current"), "3\n");
        tree.put(&pids("pids.peak"), "24\n");
        assert_eq!((run.cpu_usage_ns(), run.pids_current(), run.pids_peak()), (Some(1234567), Some(3), Some(24)));

        // cgroup.kill of the cgroup2 hierarchy.
        run.kill();
        assert_eq!(tree.get(&unified("cgroup.kill")), "1");

        for f in [mem(""), cpu(""), pids(""), unified("")] {
            Tree::clear_files(&tree.path(&f));
        }
        run.remove().unwrap();
        assert!(!tree.path(&mem("")).exists() && !tree.path(&unified("")).exists());
    }

    #[test]
    fn cpuacct_mounted_apart_from_cpu_gets_its_own_directory() {
        let tree = Tree::new();
        let table = tree.mount(35, "memory", "cgroup", "rw,memory")
            + &tree.mount(36, "cpu", "cgroup", "rw,cpu")
            + &tree.mount(37, "cpuacct", "cgroup", "rw,cpuacct")
            + &tree.mount(38, "pids", "cgroup", "rw,pids");
        let own = parse_proc_cgroup("8:pids:/\n4:memory:/m\n2:cpuacct:/\n1:cpu:/\n");
        let cg = Cgroups::detect_in(&mountinfo::parse(&table), &own, "sd").unwrap();
        assert!(cg.bases().contains(&tree.path("cpuacct/sd")), "{:?}", cg.bases());
        let run = cg.create("r").unwrap();
        assert!(tree.path("cpuacct/sd/r").is_dir());
        assert_eq!(run.procs_files().len(), 4);
        assert_eq!(run.cpu_usage_ns(), None, "no counter file yet");
        tree.put("cpuacct/sd/r/cpuacct.usage", "5000000\n");
        assert_eq!(run.cpu_usage_ns(), Some(5_000_000));
    }

    #[test]
    fn raising_the_limit_writes_memory_and_swap_in_the_other_order() {
        let tree = Tree::new();
        let cg = host(&tree, false);
        let run = cg.create("r").unwrap();
        tree.put("memory/user.slice/sandboxd/r/memory.limit_in_bytes", "1048576\n");
        // No memsw file (swap accounting off): only the memory limit is written.
        run.set_limits(&Limits { memory_bytes: 2 << 20, cpus: 1.0, pids: 8 }).unwrap();
        assert_eq!(tree.get("memory/user.slice/sandboxd/r/memory.limit_in_bytes"), (2u64 << 20).to_string());
        assert!(!tree.path("memory/user.slice/sandboxd/r/memory.memsw.limit_in_bytes").exists());
    }

    #[test]
    fn without_cgroup2_kill_falls_back_and_stale_runs_are_removed() {
        let tree = Tree::new();
        let cg = host(&tree, false);
        assert!(cg.describe().ends_with("cgroup.kill unavailable)"), "{}", cg.describe());
        assert_eq!(cg.bases().len(), 3);
        for id in ["old-1", "old-2"] {
            cg.create(id).unwrap();
        }
        // No cgroup.kill and no process listed: killing sends nothing and returns.
        assert_eq!(cg.remove_stale().unwrap(), 2);
        for b in cg.bases() {
            assert_eq!(std::fs::read_dir(&b).unwrap().filter(|e| e.as_ref().unwrap().path().is_dir()).count(), 0);
        }
    }
}
