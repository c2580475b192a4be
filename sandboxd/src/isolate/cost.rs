//! `sandboxd __isolation-cost [ROUNDS]`: what each kernel mechanism a sandbox is
//! built of costs on this host, measured apart (`bench/bench.py` runs it and
//! prints the table). Each step runs alone in a fresh fork of this process, as
//! host root, exactly as far as the mechanism goes (a namespace made and left, a
//! filter loaded): how long the step's own calls take in the fork (wall), and
//! what the whole machine spends per fork, the kernel's later teardown of what the
//! fork made included (a network namespace is dismantled by a kernel worker after
//! its last process is gone), less what a bare fork and exit spends. Steps take
//! turns, round after round, so that whatever else the machine does weighs on all
//! alike.
//!
//! The sandbox itself goes through these steps in [`super::slot`],
//! [`super::init`] and [`super::fork`]; this measures the kernel's side of each,
//! not the daemon's code around it.

use nix::sched::{unshare, CloneFlags};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// The hidden first argument of `sandboxd` that runs [`cost_main`].
pub const COST_ARG: &str = "__isolation-cost";

/// Forks per step per round.
const BATCH: usize = 40;

/// One mechanism, as far as a sandbox takes it.
struct Step {
    name: &'static str,
    run: fn() -> Result<(), String>,
}

const STEPS: [Step; 8] = [
    Step { name: "fork and exit (the baseline)", run: nothing },
    Step { name: "user namespace, its uid and gid maps", run: user_namespace },
    Step { name: "a second user namespace nested in it", run: nested_user_namespace },
    Step { name: "network namespace (lo only)", run: network_namespace },
    Step { name: "pid namespace and its init", run: pid_namespace },
    Step { name: "mount namespace, /proc and /tmp mounted", run: mount_namespace },
    Step { name: "ipc, uts and cgroup namespaces", run: small_namespaces },
    Step { name: "seccomp filter, then Landlock", run: filters },
];

fn nothing() -> Result<(), String> {
    Ok(())
}

fn step(what: &str, r: nix::Result<()>) -> Result<(), String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// A user namespace mapping only this process's own ids (what an unprivileged
/// creator may map; the sandbox maps one user too).
fn own_user_namespace() -> Result<(), String> {
    let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
    step("unshare(CLONE_NEWUSER)", unshare(CloneFlags::CLONE_NEWUSER))?;
    let write = |file: &str, text: String| std::fs::write(file, text).map_err(|e| format!("{file}: {e}"));
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    write("/proc/self/gid_map", format!("{gid} {gid} 1"))
}

fn user_namespace() -> Result<(), String> {
    own_user_namespace()
}

fn nested_user_namespace() -> Result<(), String> {
    own_user_namespace()?;
    own_user_namespace()
}

fn network_namespace() -> Result<(), String> {
    step("unshare(CLONE_NEWNET)", unshare(CloneFlags::CLONE_NEWNET))?;
    super::namespaces::loopback_up().map_err(|e| e.to_string())
}

fn pid_namespace() -> Result<(), String> {
    step("unshare(CLONE_NEWPID)", unshare(CloneFlags::CLONE_NEWPID))?;
    // SAFETY: a single-threaded fork of this process; the child leaves at once.
    match unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))? {
        // SAFETY: leave the child at once, without destructors.
        nix::unistd::ForkResult::Child => unsafe { libc::_exit(0) },
        nix::unistd::ForkResult::Parent { child } => {
            nix::sys::wait::waitpid(child, None).map(drop).map_err(|e| format!("waitpid: {e}"))
        }
    }
}

fn mount_namespace() -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    step("unshare(CLONE_NEWNS)", unshare(CloneFlags::CLONE_NEWNS))?;
    step(
        "making / private",
        mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>),
    )?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    step("mounting /proc", mount(Some("proc"), "/proc", Some("proc"), flags, None::<&str>))?;
    step("mounting /tmp", mount(Some("tmpfs"), "/tmp", Some("tmpfs"), flags, Some("size=64m")))
}

fn small_namespaces() -> Result<(), String> {
    step(
        "unshare(CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP)",
        unshare(CloneFlags::CLONE_NEWIPC | CloneFlags::CLONE_NEWUTS | CloneFlags::CLONE_NEWCGROUP),
    )
}

/// The daemon's seccomp filter, compiled once before the forks (as the daemon does).
static FILTER: std::sync::OnceLock<super::seccomp::Program> = std::sync::OnceLock::new();

fn filters() -> Result<(), String> {
    step("no_new_privs", nix::sys::prctl::set_no_new_privs())?;
    let program = FILTER.get().ok_or("the filter was not compiled")?;
    super::seccomp::apply(program).map_err(|e| e.to_string())?;
    super::landlock::apply(None).map(drop).map_err(|e| e.to_string())
}

/// The machine's busy CPU time so far (all CPUs; `/proc/stat`, in ticks of 10 ms).
fn busy() -> Duration {
    let line = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> =
        line.lines().next().unwrap_or_default().split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Duration::from_millis(total.saturating_sub(idle) * 10)
}

/// Run `step` in a fork; the nanoseconds its calls took there.
fn once(step: &Step) -> Result<u64, String> {
    let (r, w) = nix::unistd::pipe().map_err(|e| e.to_string())?;
    // SAFETY: called from `main` before any thread exists; the child makes a few
    // syscalls and leaves through _exit.
    match unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))? {
        nix::unistd::ForkResult::Child => {
            drop(r);
            let start = Instant::now();
            let done = (step.run)();
            let ns = start.elapsed().as_nanos() as u64;
            let mut out = std::fs::File::from(w);
            let ok = match done {
                Ok(()) => out.write_all(&ns.to_ne_bytes()).is_ok(),
                Err(e) => {
                    let _ = out.write_all(e.as_bytes());
                    false
                }
            };
            // SAFETY: leave the child at once, without destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(w);
            let mut bytes = vec![];
            let read = std::fs::File::from(r).read_to_end(&mut bytes);
            let status = nix::sys::wait::waitpid(child, None).map_err(|e| e.to_string())?;
            match (read, status) {
                (Ok(8), nix::sys::wait::WaitStatus::Exited(_, 0)) => {
                    Ok(u64::from_ne_bytes(bytes.try_into().unwrap_or_default()))
                }
                _ => Err(format!("{}: {}", step.name, String::from_utf8_lossy(&bytes))),
            }
        }
    }
}

/// `sandboxd __isolation-cost [ROUNDS]` (needs root): prints one JSON object, the
/// steps in order with each one's median wall time in the fork (µs) and the
/// machine's CPU time per fork beyond a bare fork's (ms). Never returns.
pub fn cost_main() -> ! {
    let rounds: usize = std::env::args().nth(2).and_then(|n| n.parse().ok()).unwrap_or(8).max(1);
    let fail = |e: &dyn std::fmt::Display| -> ! {
        eprintln!("sandboxd: {e}");
        std::process::exit(1)
    };
    if let Err(e) = super::seccomp::program().map(|p| FILTER.set(p)) {
        fail(&e);
    }
    // What the machine spends idle, per second, to take off each batch's figure.
    let (b0, t0) = (busy(), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let background = (busy().saturating_sub(b0)).as_secs_f64() / t0.elapsed().as_secs_f64();
    let mut walls: Vec<Vec<u64>> = vec![vec![]; STEPS.len()];
    let mut cpu = vec![0f64; STEPS.len()];
    for _ in 0..rounds {
        for (i, s) in STEPS.iter().enumerate() {
            let (b, t) = (busy(), Instant::now());
            for _ in 0..BATCH {
                walls[i].push(once(s).unwrap_or_else(|e| fail(&e)));
            }
            // The kernel's teardown of what the forks made ends within moments.
            std::thread::sleep(Duration::from_millis(100));
            let spent = busy().saturating_sub(b).as_secs_f64() - background * t.elapsed().as_secs_f64();
            cpu[i] += spent.max(0.0);
        }
    }
    let forks = (rounds * BATCH) as f64;
    let base = cpu[0] / forks;
    let steps: Vec<serde_json::Value> = STEPS
        .iter()
        .zip(walls.iter_mut().zip(&cpu))
        .enumerate()
        .map(|(i, (s, (w, c)))| {
            w.sort_unstable();
            let per_fork = c / forks;
            serde_json::json!({
                "step": s.name,
                "wall_us": w[w.len() / 2] as f64 / 1e3,
                // The baseline as it is; every other step beyond it.
                "cpu_ms": if i == 0 { per_fork * 1e3 } else { (per_fork - base) * 1e3 },
            })
        })
        .collect();
    println!("{}", serde_json::json!({"forks_per_step": rounds * BATCH, "steps": steps}));
    std::process::exit(0)
}
