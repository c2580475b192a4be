//! `sandboxd __seccomp-load-bench`: what loading the filter costs, against an
//! allow-all one (`bench/bench.py` runs it).

use super::{apply, program, Program};

/// The hidden first argument of `sandboxd` that measures loading the filter
/// ([`bench_main`]); `bench/bench.py` runs it.
pub const BENCH_ARG: &str = "__seccomp-load-bench";

/// `sandboxd __seccomp-load-bench [LOADS]`: fork children that each load a
/// one-instruction allow-all filter or the real one, timing the `seccomp` call
/// itself (the kernel checks the program, runs it for every syscall number to
/// cache the calls always allowed, and compiles it), and exit. The kinds take
/// turns, round after round, so that whatever else the machine does weighs on
/// all alike. Prints one JSON object: the median milliseconds per load of each
/// kind and the real filter's length. Needs no privilege (each child sets
/// no-new-privs). Never returns.
pub fn bench_main() -> ! {
    let loads: usize = std::env::args().nth(2).and_then(|n| n.parse().ok()).unwrap_or(200);
    let fail = |e: &dyn std::fmt::Display| -> ! {
        eprintln!("sandboxd: {e}");
        std::process::exit(1)
    };
    let program = program().unwrap_or_else(|e| fail(&e));
    let allow_all = Program::allow_all();
    let kinds: Vec<(&str, &Program)> = vec![("allow_all", &allow_all), ("filter", &program)];
    const ROUNDS: usize = 10;
    let per_round = loads.div_ceil(ROUNDS);
    let mut samples: Vec<Vec<u64>> = vec![vec![]; kinds.len()];
    for _ in 0..ROUNDS {
        for (i, (_, prog)) in kinds.iter().enumerate() {
            for _ in 0..per_round {
                samples[i].push(time_load(prog).unwrap_or_else(|e| fail(&e)));
            }
        }
    }
    let ms: serde_json::Map<String, serde_json::Value> = kinds
        .iter()
        .zip(&mut samples)
        .map(|((name, _), s)| {
            s.sort_unstable();
            (name.to_string(), (s[s.len() / 2] as f64 / 1e6).into())
        })
        .collect();
    println!(
        "{}",
        serde_json::json!({"loads": per_round * ROUNDS, "instructions": program.0.len(), "ms_per_load": ms})
    );
    std::process::exit(0)
}

/// In a fork: set no-new-privs, then time loading `program`. The nanoseconds it
/// took, as the child reports them on a pipe.
fn time_load(program: &Program) -> Result<u64, std::io::Error> {
    use nix::unistd::{fork, ForkResult};
    use std::io::{Read, Write};
    let (r, w) = nix::unistd::pipe()?;
    // SAFETY: called from `main` before any thread exists; the child makes a few
    // syscalls and leaves through _exit.
    match unsafe { fork() }? {
        ForkResult::Child => {
            drop(r);
            let ok = nix::sys::prctl::set_no_new_privs().is_ok();
            let start = std::time::Instant::now();
            let ok = ok && apply(program).is_ok();
            let ns = start.elapsed().as_nanos() as u64;
            let ok = ok && std::fs::File::from(w).write_all(&ns.to_ne_bytes()).is_ok();
            // SAFETY: leave the child at once, without destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) }
        }
        ForkResult::Parent { child } => {
            drop(w);
            let mut bytes = [0u8; 8];
            let read = std::fs::File::from(r).read_exact(&mut bytes);
            let status = nix::sys::wait::waitpid(child, None)?;
            match (read, status) {
                (Ok(()), nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(u64::from_ne_bytes(bytes)),
                _ => Err(std::io::Error::other("a child could not load the filter")),
            }
        }
    }
}
