//! What a sandbox is made of: the [`SandboxSpec`] the daemon sends a run's helper,
//! and the [`ChildSpec`] each fork of a pooled template makes itself from. The
//! messages that carry them, and every other, are in [`super::message`].

use super::seccomp::Program;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The uid and gid the sandboxed program runs as, inside its user namespace.
pub const SANDBOX_UID: u32 = 1000;
pub const SANDBOX_GID: u32 = 1000;

/// Where a sandbox with network reaches the daemon's egress proxy, on its own
/// loopback (the proxy's listening socket is made in the sandbox's network
/// namespace: [`super::netns`]).
pub const EGRESS_PORT: u16 = 3128;
/// Where the session's package layer is mounted (read-write) in a sandbox.
pub const PACKAGES_DIR: &str = "/opt/packages";
/// The CA bundle a sandbox with network trusts: the host's, and the proxy's own
/// CA (bound read-only over the rootfs's bundle).
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Longest [`SandboxSpec`] line the helper reads: the largest code a policy allows
/// ([`crate::policy::MAX_CODE_KB`], as the program's stdin or argv), each byte at
/// most 6 in JSON, plus 1 MiB for the rest (the seccomp filter is at most 4096
/// instructions, the environment and paths are the daemon's).
pub const MAX_SPEC_LINE: usize = crate::policy::MAX_CODE_KB as usize * 1024 * 6 + 1024 * 1024;

/// Everything the helper needs to build one sandbox and run one program in it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The unpacked rootfs, mounted read-only as `/`.
    pub rootfs: PathBuf,
    /// The daemon's shared `/dev` tree ([`super::devfs`]), bound read-only at `/dev`.
    pub dev: PathBuf,
    /// The session workspace, mounted read-write at `/mnt/data`. `None` for a pooled
    /// sandbox: its program starts with a socket as stdin, and the workspace is
    /// attached later, when a run takes the sandbox ([`super::message::Attach`]).
    pub workspace: Option<PathBuf>,
    /// Program and arguments; `argv[0]` is an absolute path inside the rootfs.
    pub argv: Vec<String>,
    /// The whole environment of the program (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Bytes the program reads on stdin; `None` gives it `/dev/null`.
    pub stdin: Option<String>,
    /// Host uid/gid that the sandbox uid/gid map to.
    pub host_uid: u32,
    pub host_gid: u32,
    pub tmp_size_bytes: u64,
    pub shm_size_bytes: u64,
    pub rlimits: Rlimits,
    pub hostname: String,
    /// The program is a pooled template interpreter (its forks: [`super::fork`]): it gets
    /// neither the seccomp filter nor Landlock, which each of its forks applies to
    /// itself once it is in its own namespaces. It never runs user code.
    #[serde(default)]
    pub template: bool,
    /// The seccomp filter the init loads, compiled once by the daemon
    /// ([`super::seccomp::filter`]): the sandbox never compiles one.
    pub seccomp: Program,
    /// The egress proxy, for a policy with network: the helper makes its listening
    /// socket in the sandbox's network namespace, Landlock allows connecting to
    /// that one port, and the CA bundle is bound over [`CA_BUNDLE`]. `None`: no
    /// network at all.
    #[serde(default)]
    pub egress: Option<Egress>,
    /// The session's package layer (a host directory), mounted read-write at
    /// [`PACKAGES_DIR`]; a pooled sandbox's comes with its workspace
    /// ([`super::message::Attach`]).
    #[serde(default)]
    pub packages: Option<PathBuf>,
}

/// How a sandbox reaches the egress proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Egress {
    /// The port the proxy listens on, on the sandbox's `127.0.0.1`.
    pub port: u16,
    /// The host's CA bundle with the proxy's CA, bound over [`CA_BUNDLE`].
    pub ca_bundle: PathBuf,
}

/// What a fork of a template needs to become a sandbox of its own; sent to the
/// template with each run, and handed by it to `sandboxd_enter`. (Its `/tmp` and
/// `/dev/shm`, sized as the template's, come from the template's helper:
/// [`super::attach::furnish`].)
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildSpec {
    pub rlimits: Rlimits,
    /// The daemon's seccomp filter, which the fork's init loads (the library links
    /// no libseccomp).
    pub seccomp: Program,
    /// The egress proxy's port, which Landlock lets the fork connect to (its
    /// listener comes from the template's helper with the fork's `/tmp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_port: Option<u16>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Rlimits {
    /// Largest file the program may write (RLIMIT_FSIZE), bytes.
    pub file_size_bytes: u64,
    /// Open files (RLIMIT_NOFILE).
    pub open_files: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A spec's bytes past its code stay far below the 1 MiB [`MAX_SPEC_LINE`]
    /// leaves them, with the largest filter, and the code takes at most 6 bytes a
    /// byte: the largest spec a policy can make fits the bound.
    #[test]
    fn the_largest_spec_fits_the_bound_the_helper_reads_it_with() {
        let code = "\u{1}".repeat(1 << 20);
        let workspace = "/w".repeat(2048);
        let policy = crate::model::policy::Policy::default();
        let argv = vec![crate::plan::PYTHON.into(), crate::plan::RUNNER.into(), "0".repeat(32), "1".into()];
        let at = crate::plan::Where {
            rootfs: Path::new("/rootfs"),
            workspace: Some(Path::new(&workspace)),
            packages: Some(Path::new(&workspace)),
            ca_bundle: Some(Path::new(&workspace)),
        };
        let mut spec = crate::plan::sandbox_spec(&at, 1, &policy, argv, Some(code.clone()));
        spec.seccomp = Program::from_bytes(&[0u8; 4096 * 8]).unwrap();
        let line = super::super::channel::encode(&spec).unwrap();
        let rest = line.len() - code.len() * 6;
        assert!(rest < 256 * 1024, "{rest} bytes besides the code");
        assert!(MAX_SPEC_LINE >= crate::policy::MAX_CODE_KB as usize * 1024 * 6 + rest);
    }
}
