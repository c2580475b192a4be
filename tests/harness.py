"""Starts real sandboxd daemons (as root) and talks to them through their real
Unix socket and HTTP port. Shared by the tests (conftest.py) and bench/.

A daemon started with `hosts_file=PATH` (the egress tests: tests/egress_hosts.py)
resolves names through that file: it runs in a mount namespace of its own where PATH
is bind-mounted on /etc/hosts (hosts_file_launcher); nothing else on the host
changes. Its own mounts (workspaces, rootfs, /dev) then live in that namespace, not
the host's: `mountinfo()` reads them there, also after the daemon stopped.

Environment:
  SANDBOXD_BIN             the daemon binary (default target/release/sandboxd)
  SANDBOXD_ROOTFS_TARBALL  the rootfs tarball (default /var/cache/sandboxd/rootfs/current.tar.zst)
  CI=true                  a missing kernel feature fails a test instead of skipping it
"""

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("SANDBOXD_BIN", REPO / "target/release/sandboxd"))
CTL = Path(os.environ.get("SANDBOXCTL_BIN", REPO / "target/release/sandboxctl"))
TARBALL = Path(os.environ.get("SANDBOXD_ROOTFS_TARBALL", "/var/cache/sandboxd/rootfs/current.tar.zst"))
IN_CI = os.environ.get("CI") == "true"
# Unpacked once for the whole test run and shared by every test daemon.
SHARED_ROOTFS = Path(os.environ.get("SANDBOXD_TEST_ROOTFS_DIR", "/var/tmp/sandboxd-test-rootfs"))

TEST_POLICY = """
description = "Small limits that tests can reach quickly."
memory_mb = 256
cpus = 1.0
pids = 32
timeout_s = 20
grace_s = 1
output_kb = 64
tmp_mb = 8
shm_mb = 8
file_size_mb = 1
workspace_mb = 16
open_files = 64
upload_mb = 2
max_artifacts = 5
packages_mb = 64
"""


# Every daemon of a test run gets uids of its own: two daemons on one range would
# share their sandboxes' and templates' host uids, and one's leftover check would count
# the other's processes (a CI run failed so: two daemons drew the same random base).
UID_SPAN = 2000
_uid_bases_taken = set()


def _uids_in_use(first, span):
    """Whether any process on the host runs with a uid in [first, first + span), or
    a daemon (of another test run, say) claimed one (sandboxd/src/uids/claim.rs)."""
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) > 7 and fields[7].startswith("@sandboxd-uids/"):
            for claimed in fields[7].split("/")[-1].split(","):
                lo, _, hi = claimed.partition("-")
                if lo.isdigit() and hi.isdigit() and int(lo) < first + span and first < int(hi):
                    return True
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            uids = (p / "status").read_text().split("Uid:")[1].split()[:4]
        except (OSError, IndexError):
            continue
        if any(first <= int(u) < first + span for u in uids):
            return True
    return False


def pick_uid_base():
    """A uid base no daemon of this process has had and no host process is in."""
    bases = [700_000 + i * UID_SPAN for i in range(1000)]
    random.shuffle(bases)
    for base in bases:
        if base not in _uid_bases_taken and not _uids_in_use(base, UID_SPAN):
            _uid_bases_taken.add(base)
            return base
    raise RuntimeError("no free uid range for a test daemon")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cgroup_roots():
    """Where run cgroups of a daemon in this process's cgroups would live."""
    roots = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for ctrl in ctrls.split(",") if ctrls else ["unified"]:
            if ctrl in ("memory", "cpu", "cpuacct", "pids"):
                roots.append(Path("/sys/fs/cgroup") / ctrl / path.lstrip("/"))
            elif ctrl == "unified" and Path("/sys/fs/cgroup/unified").is_dir():
                roots.append(Path("/sys/fs/cgroup/unified") / path.lstrip("/"))
            elif ctrl == "unified" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
                roots.append(Path("/sys/fs/cgroup") / path.lstrip("/"))
    return roots


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _is_slot(pid, binary=None):
    """A daemon's slot process: our binary, run as `sandboxd __sandbox`, as root."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        uid = int(Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0])
    except (OSError, IndexError, ValueError):
        return False
    return exe == os.path.realpath(binary or BIN) and _cmdline(pid) == ["sandboxd", "__sandbox"] and uid == 0


def _unescape_mountinfo(field):
    """A mountinfo path field: spaces, tabs, newlines and backslashes are octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def hosts_file_launcher(hosts_file, own=None):
    """The command prefix that runs a program in a mount namespace of its own with
    `hosts_file` bind-mounted (read-only) on /etc/hosts: glibc's getaddrinfo, which
    reads /etc/hosts and then asks DNS, sees the file, and nothing else on the host
    changes. Its mounts are slaves of the host's: a mount or unmount of the host's
    reaches it, none of its own reaches the host (this host's mounts are private
    anyway; a systemd host's are shared). The copies of other test daemons' mounts
    (below TEST_BASE, outside `own`) are detached inside at once, so the namespace
    holds none of their workspaces or loop devices while it lives. `unshare` and
    `sh` exec: the program keeps the pid of the command."""
    for socket_path in ("/run/nscd/socket", "/var/run/nscd/socket"):
        if os.path.exists(socket_path):
            raise RuntimeError(f"nscd answers name lookups here ({socket_path}): it would bypass the hosts file")
    nsswitch = Path("/etc/nsswitch.conf")
    for line in nsswitch.read_text().splitlines() if nsswitch.exists() else []:
        sources = line.split("#", 1)[0].split()
        if sources[:1] == ["hosts:"] and sources[1:2] != ["files"]:
            raise RuntimeError(f"/etc/nsswitch.conf does not read /etc/hosts first ({line.strip()!r})")
    drop = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(_unescape_mountinfo(line.split(" ")[4]))
        if point.is_relative_to(TEST_BASE) and not (own and point.is_relative_to(own)):
            drop.append(str(point))
    drop.sort(key=lambda p: -p.count("/"))  # the deepest first
    script = (
        'hosts=$1; shift; while [ "$1" != -- ]; do umount -l -- "$1" 2>/dev/null; shift; done; shift; '
        'mount --bind -- "$hosts" /etc/hosts && mount -o remount,bind,ro /etc/hosts && exec "$@"'
    )
    return ["unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", script, "sh",
            str(hosts_file), *drop, "--"]


class Daemon:
    def __init__(self, base, policies=None, args=(), env=None, tokens=None, binary=None, hosts_file=None):
        self.base = Path(base)
        # Another build of the daemon (bench.py --vs), its libsandboxd.so beside it.
        self.binary = Path(binary or BIN)
        self.state = self.base / "state"
        self.socket = self.base / "sandboxd.sock"
        self.port = free_port()
        self.instance = "sdtest-%06x" % random.randrange(1 << 24)
        self.uid_base = pick_uid_base()
        self.policies = self.base / "policies"
        self.log_path = self.base / "daemon.log"
        self.tokens = tokens or []
        self.args = list(args)
        self.env = env or {}
        # Names resolved through this hosts file (see hosts_file_launcher).
        self.hosts_file = Path(hosts_file) if hosts_file else None
        self._mntns = None  # with hosts_file: the daemon's mount namespace, held (mountinfo())
        self.proc = None
        if not self.policies.exists():
            shutil.copytree(REPO / "policies", self.policies)
            # A daemon refuses a session (507) that its state filesystem could not
            # hold filled up, and a suite's shared daemon holds hundreds: the
            # default policy's workspaces and package layers are smaller here
            # (uploads, and the packages the tests install, still fit).
            default = self.policies / "default.toml"
            default.write_text(default.read_text().replace("workspace_mb = 1024", "workspace_mb = 128")
                               .replace("packages_mb = 512", "packages_mb = 64"))
            (self.policies / "tiny.toml").write_text(TEST_POLICY)
            for name, text in (policies or {}).items():
                (self.policies / f"{name}.toml").write_text(text)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def command(self):
        cmd = [
            str(self.binary),
            "--state-dir", str(self.state),
            "--socket", str(self.socket),
            "--http", f"127.0.0.1:{self.port}",
            "--policies-dir", str(self.policies),
            "--rootfs-tarball", str(TARBALL),
            "--instance", self.instance,
            "--uid-base", str(self.uid_base),
            "--shutdown-grace-s", "3",
        ]
        if not any(a.startswith("--max-sessions") for a in self.args):
            # Runs without a session_id each make a session: leave room for a suite.
            cmd += ["--max-sessions", "500"]
        if not any(a.startswith("--package-cache-dir") for a in self.args):
            # A package cache of its own: what a test's installs download does not
            # depend on what other daemons of the run fetched.
            cmd += ["--package-cache-dir", str(self.base / "package-cache")]
        if self.tokens:
            cmd += ["--tokens", ",".join(self.tokens)]
        return cmd + self.args

    def launch_command(self):
        """command(), in a mount namespace of its own where hosts_file is /etc/hosts."""
        if self.hosts_file is None:
            return self.command()
        return hosts_file_launcher(self.hosts_file, own=self.base) + self.command()

    def start(self, timeout=120):
        self.state.mkdir(parents=True, exist_ok=True)
        # The rootfs image is made once in SHARED_ROOTFS; each daemon mounts it itself.
        SHARED_ROOTFS.mkdir(parents=True, exist_ok=True)
        link = self.state / "rootfs"
        if not link.exists():
            link.symlink_to(SHARED_ROOTFS)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SANDBOXD_LOG": "info,sandboxd=debug"}
        env.update(self.env)
        self.release_namespace()  # a previous start's
        if self.hosts_file is not None and not self.hosts_file.is_file():
            raise FileNotFoundError(f"hosts_file {self.hosts_file} is missing")
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.launch_command(), stdout=self.log, stderr=self.log, env=env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sandboxd exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                if self.uds().get("/v1/health").status_code == 200:
                    if self.hosts_file is not None:
                        self._hold_namespace()
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"sandboxd did not become healthy:\n{self.log_text()}")

    def log_text(self):
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except OSError:
            return ""

    def http(self, token=None, timeout=120):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, timeout=timeout, headers=headers)

    def uds(self, token=None, timeout=120):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        transport = httpx.HTTPTransport(uds=str(self.socket))
        return httpx.Client(transport=transport, base_url="http://sandboxd", timeout=timeout, headers=headers)

    def run(self, code, client=None, expect=200, **fields):
        body = {"code": code, **fields}
        with client or self.http() as c:
            r = c.post("/v1/runs", json=body)
        assert r.status_code == expect, r.text
        return r.json()

    def session_uid(self, session_id):
        return json.loads((self.state / "sessions" / session_id / "session.json").read_text())["uid"]

    def kernel_process(self, session_id):
        """The host pid and uid of the kernel of a kernel session (started by this
        call's cell if it had none). A kernel runs as its session's uid when it
        started cold, as its template's (from the pool's range) when it started in
        a template's fork: found by a name the cell gives its own thread."""
        name = "k-" + session_id[-12:]
        code = f"import ctypes\nctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)"
        r = self.run(code, session_id=session_id)
        assert r["status"] == "ok", r
        for p in os.listdir("/proc"):
            try:
                if p.isdigit() and Path(f"/proc/{p}/comm").read_text().strip() == name:
                    status = Path(f"/proc/{p}/status").read_text()
                    return int(p), int(status.split("Uid:")[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
        raise AssertionError(f"no process named {name} on the host")

    def rss_kib(self):
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def max_sessions(self):
        value = 500
        for i, a in enumerate(self.args):
            if a == "--max-sessions" and i + 1 < len(self.args):
                value = int(self.args[i + 1])
            elif a.startswith("--max-sessions="):
                value = int(a.split("=", 1)[1])
        return value

    def is_pooled_python(self, pid, init=False):
        """A pooled template's interpreter, or a process of its fork waiting for a run:
        the pool's uids (above the sessions'), `runner.py --template`; with `init`,
        that sandbox's init."""
        try:
            uid = int(Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
        first = self.uid_base + self.max_sessions()
        want = ["sandboxd", "__sandbox"] if init else ["/opt/py/bin/python", "/opt/sandboxd/runner.py", "--template"]
        return first <= uid < first + 256 and _cmdline(pid)[: len(want)] == want

    def pool(self):
        return self.uds().get("/v1/health").json()["pool"]

    def wait_pool_ready(self, policy="default", count=None, timeout=120):
        """Wait until the pool holds `count` ready sandboxes of `policy` (default: its size)."""
        deadline = time.time() + timeout
        while True:
            pool = self.pool()
            want = pool["size_per_policy"] if count is None else count
            if pool["ready_by_policy"].get(policy, 0) >= want:
                return pool
            assert time.time() < deadline, f"the pool did not fill: {pool}\n{self.log_text()}"
            time.sleep(0.1)

    def _hold_namespace(self):
        """Keep the daemon's mount namespace open (an fd), so that what it left
        mounted there can still be read once it has stopped: a namespace goes, its
        mounts with it, when its last process and reference do."""
        fd = os.open(f"/proc/{self.proc.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        if os.fstat(fd).st_ino == os.stat("/proc/self/ns/mnt").st_ino:
            os.close(fd)
            raise RuntimeError("the daemon started with hosts_file runs in the host's mount namespace")
        self._mntns = fd

    def release_namespace(self):
        """Let the kernel drop a stopped daemon's mount namespace (and whatever it
        left mounted there). start() does it for the previous start; the module
        fixtures after their check."""
        if self._mntns is not None:
            os.close(self._mntns)
            self._mntns = None

    def __del__(self):
        if getattr(self, "_mntns", None) is not None:
            self.release_namespace()

    def mountinfo(self):
        """The mount table the daemon mounts in: the host's, or with hosts_file its
        own namespace's (while it runs, through its pid; once stopped, through the
        namespace start() holds)."""
        if self.hosts_file is None:
            return Path("/proc/self/mountinfo").read_text()
        if self.proc is not None and self.proc.poll() is None:
            try:
                return Path(f"/proc/{self.proc.pid}/mountinfo").read_text()
            except OSError:
                pass  # it has just exited
        if self._mntns is None:
            # Never started, or its namespace released: nothing of it is mounted anywhere.
            return ""
        r = subprocess.run(["nsenter", f"--mount=/proc/self/fd/{self._mntns}", "cat", "/proc/self/mountinfo"],
                           capture_output=True, text=True, pass_fds=(self._mntns,), check=True)
        return r.stdout

    def leftovers(self):
        """What a finished run must not leave on the host. While the daemon runs, its
        only cgroups are idle slots, each holding its one slot process; once it has
        stopped, nothing at all. (Mounts are read where the daemon mounts: with
        hosts_file, in its own mount namespace, see mountinfo().)"""
        running = self.proc is not None and self.proc.poll() is None
        found = {}
        procs = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                uid = int((p / "status").read_text().split("Uid:")[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if self.uid_base <= uid < self.uid_base + UID_SPAN:
                if running and (self.is_pooled_python(p.name) or self.is_pooled_python(p.name, init=True)):
                    continue
                procs.append((p.name, uid, _cmdline(p.name)[:4]))
        if procs:
            found["processes"] = procs
        groups = []
        for root in cgroup_roots():
            inst = root / self.instance
            try:
                entries = list(inst.iterdir())
            except FileNotFoundError:
                continue
            for d in entries:
                if not d.is_dir() or d.name == "daemon":
                    continue
                try:
                    members = (d / "cgroup.procs").read_text().split()
                except FileNotFoundError:  # removed since it was listed
                    continue
                slot = running and len(members) == 1 and _is_slot(members[0], self.binary)
                # A pooled template: the slot and the sandbox's helper (root), its init,
                # and the template interpreter, all the pool's uid; once ready, with its
                # fork waiting for the next run (outer process, the fork's init, its
                # program): 7 in all. While it still imports (a loaded machine), 4.
                pythons = sum(map(self.is_pooled_python, members))
                pooled = (running and len(members) in (4, 7) and sum(_is_slot(m, self.binary) for m in members) == 2
                          and sum(self.is_pooled_python(m, init=True) for m in members) == 1
                          and pythons == len(members) - 3)
                if not (slot or pooled):
                    groups.append((str(d), [(m, _cmdline(m)) for m in members]))
        if groups:
            found["cgroups"] = groups
        sessions = self.state / "sessions"
        mounts = []
        for line in self.mountinfo().splitlines():
            point = Path(line.split(" ")[4])
            if str(self.base) not in line:
                continue
            if self.hosts_file is not None and point == Path("/etc/hosts"):
                continue  # the launcher's own bind mount
            # A running daemon keeps each session's workspace image mounted on its data/
            # (and its package layer on packages/), its rootfs image (shared with other
            # test daemons) on mnt/rootfs, the sandboxes' /dev on mnt/dev, and their CA
            # bundle on mnt/egress.
            if running and point.parent.parent == sessions and point.name in ("data", "packages"):
                continue
            if running and point in (self.state / "mnt" / "rootfs", self.state / "mnt" / "dev", self.state / "mnt" / "egress"):
                continue
            mounts.append(line)
        if mounts:
            found["mounts"] = mounts
        return found

    def assert_clean(self, timeout=5):
        deadline = time.time() + timeout
        while True:
            left = self.leftovers()
            if not left or time.time() > deadline:
                break
            time.sleep(0.1)
        assert left == {}, f"left on the host: {left}"

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()



# Some tests act on the host as a session's uid (test_surface_host), which must pass
# through the state directory's parents: test daemons live below a world-searchable
# directory (pytest's tmp is 0700).
TEST_BASE = Path(os.environ.get("SANDBOXD_TEST_BASE", "/var/tmp/sandboxd-tests"))


def scratch_dir(prefix):
    """A fresh, world-searchable directory below TEST_BASE."""
    TEST_BASE.mkdir(parents=True, exist_ok=True)
    os.chmod(TEST_BASE, 0o711)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=TEST_BASE))
    os.chmod(path, 0o711)
    return path


