//! Running one program in a fresh sandbox.
//!
//! The daemon's side, from the bottom up (every arrow points down):
//!
//! - [`process`] (pidfds, signals, pipes) and [`channel`] (the one channel type,
//!   bounded lines, fd passing; [`fdstream`]: a helper's lines with the fds sent
//!   along) carry the typed messages of [`message`];
//! - [`drive`]: timeout → ask → grace → kill, and cancel, for every run ([`drive::Drive`]);
//! - [`supervise`]: have a slot fork a run's helper, then drive the run (output
//!   capped, timeout, grace, cancel) and complete its [`Outcome`] in one place;
//! - [`sandboxes`]: the slot pool ([`Sandboxes`], slots: [`slot`]) and a cold run;
//! - [`pooled`]: the daemon's handle on a pooled template ([`PooledTemplate`]),
//!   which forks once per run, each fork entering a sandbox of its own.
//!
//! The processes' side: [`slot`] (a resident process per cgroup) forks the run's
//! [`helper`], which clones [`init`] (pid 1 in the sandbox); a template's forks
//! run [`fork`] (`sandboxd_enter`). One file per mechanism: [`namespaces`],
//! [`netns`] (the egress proxy's listener, made in the sandbox's network namespace),
//! [`mounts`] (built inside), [`attach`] (mounted from outside), [`devfs`] (the
//! shared `/dev`), [`cgroup`], [`caps`], [`rlimits`], [`landlock`], [`seccomp`].

pub mod attach;
pub mod caps;
pub mod cgroup;
pub mod channel;
pub mod cost;
pub mod devfs;
pub mod drive;
pub mod fdstream;
pub mod fork;
pub mod helper;
pub mod init;
pub mod landlock;
pub mod message;
pub mod mounts;
pub mod namespaces;
pub mod netns;
pub mod output;
pub mod pooled;
pub mod process;
pub mod rlimits;
pub mod sandboxes;
pub mod seccomp;
pub mod slot;
pub mod spec;
pub mod supervise;

pub use pooled::{Forked, PooledTemplate, Running};
pub use sandboxes::Sandboxes;
pub use slot::HELPER_ARG;
pub use supervise::{Baseline, Bounds, Error, Outcome, Run, Started, PIDS_KEEP};
