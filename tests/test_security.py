"""The security suite: what code inside a sandbox can and cannot do.

Each case asserts the exact outcome (errno, status, signal) and, through the
autouse fixture, that nothing is left on the host afterwards: no processes of the
sandbox's host uids, no run cgroups, no mounts.
"""

import errno
import json
import os
import signal
import socket
import subprocess
import threading
import time
import uuid

import pytest

from conftest import new_session, require

# Helpers every probe uses inside the sandbox: call something, print its errno name.
PRELUDE = r'''
import ctypes, errno, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
def err(f, *a):
    try:
        f(*a)
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def sc(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
'''


def probe(daemon, body, **fields):
    """Run PRELUDE + body; the body prints one JSON object; return it with the result."""
    result = daemon.run(PRELUDE + body, **fields)
    assert result["status"] == "ok", result
    return json.loads(result["stdout"].strip().splitlines()[-1]), result


@pytest.fixture(autouse=True)
def nothing_left_behind(daemon):
    yield
    daemon.assert_clean()


def test_identity_capabilities_no_new_privs_and_seccomp(daemon):
    out, _ = probe(daemon, r'''
import json
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
print(json.dumps({k: status[k].strip() for k in
    ["Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"]}))
''')
    assert out["Uid"].split() == ["1000"] * 4
    assert out["Gid"].split() == ["1000"] * 4
    assert out["Groups"] == ""
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]:
        assert out[cap] == "0000000000000000", cap
    assert out["NoNewPrivs"] == "1"
    assert out["Seccomp"] == "2"


def test_sandbox_uid_maps_to_an_unprivileged_host_uid(daemon):
    """A cold sandbox runs as its session's own host uid; a pooled one (a fork of a
    template made before the session was known) as a pool uid above every
    session's, through a user namespace nested in its template's, with the workspace
    idmapped to the session's uid (test_pool checks the files' owner). Inside, no
    host uid shows: every sandboxed process is in a user namespace that maps the
    sandbox user to itself."""
    with daemon.http() as c:
        sid = new_session(c)
    host_uid = daemon.session_uid(sid)
    assert host_uid >= daemon.uid_base and host_uid not in (0, os.getuid())
    cold = daemon.run(
        "cat /proc/self/uid_map /proc/self/gid_map /proc/1/uid_map; touch mine; grep -h '' /proc/self/status /proc/1/status",
        language="shell", session_id=sid)
    assert cold["status"] == "ok", cold
    lines = cold["stdout"].splitlines()
    assert [l.split() for l in lines[:3]] == [["1000", "1000", "1"]] * 3, lines[:3]
    assert str(host_uid) not in cold["stdout"], cold["stdout"]
    # On the host, what the run made belongs to the session's own uid.
    st = os.stat(daemon.state / "sessions" / sid / "data" / "mine")
    assert (st.st_uid, st.st_gid) == (host_uid, host_uid)
    hits = daemon.wait_pool_ready()["hits"]
    out, _ = probe(daemon, r'''
import json
print(json.dumps({"uid_map": open("/proc/self/uid_map").read().split(), "gid_map": open("/proc/self/gid_map").read().split()}))
''', session_id=sid)
    # Inside, only the sandbox user, mapped to the template's sandbox user...
    assert out["uid_map"] == out["gid_map"] == ["1000", "1000", "1"]
    assert daemon.pool()["hits"] == hits + 1
    # ...which the template's namespace maps to one pool uid; every pooled process
    # on the host runs as such a uid.
    first = daemon.uid_base + daemon.max_sessions()
    pooled = [p for p in os.listdir("/proc") if p.isdigit() and daemon.is_pooled_python(p)]
    assert pooled
    for pid in pooled:
        try:
            uid_map = open(f"/proc/{pid}/uid_map").read().split()
            uids = open(f"/proc/{pid}/status").read().split("Uid:")[1].split()[:4]
        except OSError:
            continue  # gone since it was listed
        assert len(set(uids)) == 1 and first <= int(uids[0]) < first + 256, (pid, uids)
        assert uid_map in (["1000", uids[0], "1"], ["1000", "1000", "1"]), (pid, uid_map)


def test_fork_bomb_is_held_at_the_pids_limit(daemon):
    out, _ = probe(daemon, r'''
import json, time
children, failure = [], None
for _ in range(1000):
    try:
        pid = os.fork()
    except OSError as e:
        failure = errno.errorcode[e.errno]
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.kill(pid, 9)
print(json.dumps({"forked": len(children), "failure": failure}))
''', policy="tiny")
    assert out["failure"] == "EAGAIN"
    # The tiny policy allows 32 tasks: python itself and the init count too.
    assert 20 <= out["forked"] < 32


def test_memory_bomb_is_reported_as_oom(daemon):
    result = daemon.run("blocks = []\nwhile True:\n    blocks.append(b'x' * (16 << 20))\n", policy="tiny")
    assert result["status"] == "oom", result
    assert result["signal"] == "SIGKILL"
    assert result["exit_code"] is None


def test_huge_mmap_is_refused_and_touching_too_much_is_oom(daemon):
    out, _ = probe(daemon, r'''
import json, mmap
print(json.dumps({"one_tib": err(mmap.mmap, -1, 1 << 40)}))
''', policy="tiny")
    assert out["one_tib"] == "ENOMEM"
    touched = daemon.run(
        "import mmap\nm = mmap.mmap(-1, 2 << 30)\nfor i in range(0, len(m), 4096):\n    m[i] = 1\n", policy="tiny"
    )
    assert touched["status"] == "oom", touched


def test_timeout_kills_the_whole_tree_including_a_setsid_grandchild(daemon):
    with daemon.http() as c:
        sid = new_session(c)
    host_uid = daemon.session_uid(sid)
    started = time.time()
    result = daemon.run(r'''
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open("/mnt/data/grandchild.pid", "w").write(str(os.getpid()))
        while True:
            pass
    os._exit(0)
while True:
    pass
''', session_id=sid, timeout_s=2)
    assert result["status"] == "timeout", result
    # SIGTERM first (the program may save its work), SIGKILL after the grace period.
    assert result["signal"] in ("SIGTERM", "SIGKILL") and result["exit_code"] is None, result
    assert time.time() - started < 15
    assert (daemon.state / "sessions" / sid / "data" / "grandchild.pid").exists()
    left = subprocess.run(["pgrep", "-u", str(host_uid)], capture_output=True, text=True)
    assert left.stdout.strip() == "", "the grandchild survived the timeout"


def test_writes_outside_the_workspace_and_tmp_are_refused(daemon):
    out, _ = probe(daemon, r'''
import json
print(json.dumps({
    "etc": err(open, "/etc/evil", "w"),
    "site_packages": err(open, "/opt/py/lib/python3.11/site-packages/evil.py", "w"),
    "usr_bin": err(os.mkdir, "/usr/bin/evil"),
    "root": err(open, "/evil", "w"),
    "proc_sys": err(open, "/proc/sys/kernel/hostname", "w"),
    "dev": err(open, "/dev/evil", "w"),
    "workspace": err(lambda: open("/mnt/data/ok.txt", "w").write("fine")),
    "tmp": err(lambda: open("/tmp/ok.txt", "w").write("fine")),
    "shm": err(lambda: open("/dev/shm/ok", "w").write("fine")),
    "devnull": err(lambda: open("/dev/null", "w").write("fine")),
}))
''')
    assert out == {
        "etc": "EROFS",
        "site_packages": "EROFS",
        "usr_bin": "EROFS",
        "root": "EROFS",
        # /proc/sys is a read-only mount: open(..., "w") truncates, and the kernel
        # checks the mount (EROFS) before the file's owner (EACCES).
        "proc_sys": "EROFS",
        "dev": "EROFS",
        "workspace": "ok",
        "tmp": "ok",
        "shm": "ok",
        "devnull": "ok",
    }


def test_links_to_host_files_lead_nowhere(daemon, tmp_path):
    with daemon.http() as c:
        sid = new_session(c)
        out, _ = probe(daemon, r'''
import json
os.symlink("/etc/shadow", "/mnt/data/shadow-link")
print(json.dumps({
    "hardlink": err(os.link, "/etc/passwd", "/mnt/data/passwd-link"),
    "symlink_read": err(lambda: open("/mnt/data/shadow-link").read()),
}))
''', session_id=sid)
        # Hard links cannot cross into the workspace mount; the symlink resolves inside
        # the sandbox, whose /etc/shadow is the rootfs's and unreadable to uid 1000.
        assert out == {"hardlink": "EXDEV", "symlink_read": "EACCES"}
        r = c.get(f"/v1/sessions/{sid}/files/shadow-link")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_path"
        # A file with a second hard link may be linked from anywhere: it is never served.
        # (The workspace is its own filesystem, so no host file can be linked into it.)
        data = daemon.state / "sessions" / sid / "data"
        (data / "real").write_text("secret")
        outside = tmp_path / "outside"
        outside.write_text("host file")
        with pytest.raises(OSError) as cross:
            os.link(outside, data / "from-host")
        assert cross.value.errno == errno.EXDEV
        os.link(data / "real", data / "hard")
        for name in ("hard", "real"):
            r = c.get(f"/v1/sessions/{sid}/files/{name}")
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_path"
            assert "secret" not in r.text


def test_mknod_of_a_device_is_refused(daemon):
    out, _ = probe(daemon, r'''
import json, stat
print(json.dumps({
    "char": err(os.mknod, "/mnt/data/mem", 0o600 | stat.S_IFCHR, os.makedev(1, 1)),
    "block": err(os.mknod, "/tmp/sda", 0o600 | stat.S_IFBLK, os.makedev(8, 0)),
    "fifo": err(os.mkfifo, "/tmp/fifo"),
}))
''')
    assert out == {"char": "EPERM", "block": "EPERM", "fifo": "ok"}


def test_a_copied_setuid_binary_gains_nothing(daemon):
    with daemon.http() as c:
        sid = new_session(c)
    # Its first use makes and mounts its workspace.
    assert daemon.run("pass", session_id=sid)["status"] == "ok"
    workspace = daemon.state / "sessions" / sid / "data"
    # A setuid-root `id` placed in the workspace by the host...
    with daemon.http() as c:
        sha = c.get("/v1/health").json()["rootfs_sha256"]
    assert (daemon.state / "rootfs" / f"{sha}.img").is_file()
    rootfs_id = daemon.state / "mnt/rootfs/usr/bin/id"
    target = workspace / "id"
    target.write_bytes(rootfs_id.read_bytes())
    os.chown(target, 0, 0)
    os.chmod(target, 0o4755)
    result = daemon.run(
        "/mnt/data/id -u; /mnt/data/id -ru; cp /usr/bin/id /tmp/id2; chmod u+s /tmp/id2; /tmp/id2 -u;"
        " grep -E '^(CapEff|NoNewPrivs)' /proc/self/status",
        language="shell",
        session_id=sid,
    )
    assert result["status"] == "ok", result
    lines = result["stdout"].split("\n")
    assert lines[:3] == ["1000", "1000", "1000"]
    assert "CapEff:\t0000000000000000" in result["stdout"]
    assert "NoNewPrivs:\t1" in result["stdout"]


def test_dangerous_syscalls_are_denied(daemon):
    out, _ = probe(daemon, r'''
import json
N = dict(ptrace=101, process_vm_readv=310, process_vm_writev=311, unshare=272, setns=308,
         mount=165, umount2=166, pivot_root=155, chroot=161, bpf=321, perf_event_open=298,
         userfaultfd=323, keyctl=250, add_key=248, request_key=249, io_uring_setup=425,
         kexec_load=246, init_module=175, finit_module=313, open_by_handle_at=304, clone3=435)
res = {
    "ptrace": sc(N["ptrace"], 0, 0, 0, 0),
    "process_vm_readv": sc(N["process_vm_readv"], 1, 0, 0, 0, 0, 0),
    "process_vm_writev": sc(N["process_vm_writev"], 1, 0, 0, 0, 0, 0),
    "unshare_user": sc(N["unshare"], 0x10000000),
    "unshare_ns": sc(N["unshare"], 0x00020000),
    "setns": sc(N["setns"], 0, 0),
    "mount": sc(N["mount"], 0, 0, 0, 0, 0),
    "umount2": sc(N["umount2"], 0, 0),
    "pivot_root": sc(N["pivot_root"], 0, 0),
    "chroot": sc(N["chroot"], 0),
    "bpf": sc(N["bpf"], 0, 0, 0),
    "perf_event_open": sc(N["perf_event_open"], 0, 0, -1, -1, 0),
    "userfaultfd": sc(N["userfaultfd"], 0),
    "keyctl": sc(N["keyctl"], 0, 0),
    "add_key": sc(N["add_key"], 0, 0, 0, 0, 0),
    "request_key": sc(N["request_key"], 0, 0, 0, 0),
    "io_uring_setup": sc(N["io_uring_setup"], 1, 0),
    "kexec_load": sc(N["kexec_load"], 0, 0, 0, 0),
    "init_module": sc(N["init_module"], 0, 0, 0),
    "finit_module": sc(N["finit_module"], -1, 0, 0),
    "open_by_handle_at": sc(N["open_by_handle_at"], -1, 0, 0),
    "clone3": sc(N["clone3"], 0, 0),
    "fallocate": sc(285, 1, 0, 0, 4096),
    # clone(CLONE_NEWUSER | SIGCHLD) and clone(CLONE_NEWNET | SIGCHLD)
    "clone_newuser": sc(56, 0x10000000 | 17, 0, 0, 0, 0),
    "clone_newnet": sc(56, 0x40000000 | 17, 0, 0, 0, 0),
}
print(json.dumps(res))
''')
    expected = {k: "EPERM" for k in out}
    expected["clone3"] = "ENOSYS"
    # EOPNOTSUPP (ENOTSUP): preallocated blocks would be holes on the host that
    # a later write fills past the session's share of the host disk.
    expected["fallocate"] = "ENOTSUP"
    assert out == expected
    # posix_fallocate still works: glibc writes the blocks itself.
    r = daemon.run("import os\nfd = os.open('pre.bin', os.O_CREAT | os.O_WRONLY)\nos.posix_fallocate(fd, 0, 1 << 20)\n"
                   "print(os.fstat(fd).st_size, os.fstat(fd).st_blocks * 512)\nos.remove('pre.bin')")
    assert r["stdout"] == f"{1 << 20} {1 << 20}\n", r
    # And the same from a shell tool: nested namespaces fail.
    result = daemon.run("unshare -U true; echo rc=$?", language="shell")
    assert "rc=1" in result["stdout"], result


def test_threads_and_subprocesses_still_work(daemon):
    out, _ = probe(daemon, r'''
import json, subprocess, threading
box = []
t = threading.Thread(target=lambda: box.append(1)); t.start(); t.join()
p = subprocess.run(["/bin/echo", "hi"], capture_output=True, text=True)
print(json.dumps({"thread": box, "subprocess": p.stdout.strip()}))
''')
    assert out == {"thread": [1], "subprocess": "hi"}


@pytest.mark.parametrize("policy", ["strict", "default"])
def test_no_network(daemon, policy):
    """`strict` has no network; `default` has its egress proxy on 127.0.0.1:3128 and
    nothing else (tests/test_egress.py checks what goes through it)."""
    with daemon.http() as c:
        abi = c.get("/v1/health").json()["landlock_abi"]
    # EACCES on TCP connect and bind is Landlock's answer (ABI 4+); without it the
    # empty network namespace would answer ENETUNREACH / ECONNREFUSED instead.
    require(abi >= 4, f"Landlock ABI 4 (TCP rules) is needed; this kernel has {abi}")
    out, _ = probe(daemon, f'''
import json
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    socket.getaddrinfo("example.com", 80)
    dns = "resolved"
except socket.gaierror as e:
    dns = e.errno
ifaces = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
print(json.dumps({{
    "public": err(socket.create_connection, ("1.1.1.1", 80), 3),
    "public6": err(socket.create_connection, ("2606:4700:4700::1111", 80), 3),
    "host_loopback_daemon_port": err(socket.create_connection, ("127.0.0.1", {daemon.port}), 3),
    "udp_dns": err(udp.sendto, b"x", ("8.8.8.8", 53)),
    "dns": dns,
    "bind": err(socket.socket().bind, ("127.0.0.1", 8080)),
    "proxy": err(socket.create_connection, ("127.0.0.1", 3128), 3),
    "interfaces": ifaces,
}}))
''', policy=policy)
    assert out == {
        "public": "EACCES",
        "public6": "EACCES",
        "host_loopback_daemon_port": "EACCES",
        "udp_dns": "ENETUNREACH",
        "dns": socket.EAI_AGAIN,
        "bind": "EACCES",
        "proxy": "EACCES" if policy == "strict" else "ok",
        "interfaces": ["lo"],
    }


def test_host_unix_sockets_are_unreachable(daemon):
    name = f"sandboxd-test-{uuid.uuid4().hex[:8]}"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind("\0" + name)
    listener.listen(1)
    try:
        out, _ = probe(daemon, f'''
import json
print(json.dumps({{
    "abstract": err(socket.socket(socket.AF_UNIX).connect, "\\0{name}"),
    "daemon_socket": err(socket.socket(socket.AF_UNIX).connect, "{daemon.socket}"),
    "default_socket": err(socket.socket(socket.AF_UNIX).connect, "/run/sandboxd/sandboxd.sock"),
}}))
''')
    finally:
        listener.close()
    assert out == {"abstract": "ECONNREFUSED", "daemon_socket": "ENOENT", "default_socket": "ENOENT"}


def test_other_socket_families_are_refused(daemon):
    out, _ = probe(daemon, r'''
import json
print(json.dumps({
    "netlink": err(socket.socket, socket.AF_NETLINK, socket.SOCK_RAW, 0),
    "packet": err(socket.socket, socket.AF_PACKET, socket.SOCK_RAW, 0),
    "vsock": err(socket.socket, socket.AF_VSOCK, socket.SOCK_STREAM, 0),
    "unix": err(socket.socket, socket.AF_UNIX, socket.SOCK_STREAM, 0),
    "inet6": err(socket.socket, socket.AF_INET6, socket.SOCK_STREAM, 0),
    "socketpair_netlink": err(socket.socketpair, socket.AF_NETLINK),
}))
''')
    assert out == {"netlink": "EPERM", "packet": "EPERM", "vsock": "EPERM", "unix": "ok", "inet6": "ok", "socketpair_netlink": "EPERM"}


def test_tiocsti_is_refused(daemon):
    out, _ = probe(daemon, r'''
import fcntl, json, termios
print(json.dumps({
    "tiocsti_stdin": err(fcntl.ioctl, 0, termios.TIOCSTI, b"x"),
    "tiocsti_stdout": err(fcntl.ioctl, 1, termios.TIOCSTI, b"x"),
    "tioclinux": err(fcntl.ioctl, 0, 0x541C, b"\x0b"),
    "other_ioctl": err(fcntl.ioctl, os.pipe()[0], termios.FIONREAD, b"\0\0\0\0"),
}))
''')
    assert out == {"tiocsti_stdin": "EPERM", "tiocsti_stdout": "EPERM", "tioclinux": "EPERM", "other_ioctl": "ok"}


def test_proc_shows_only_the_sandbox_and_kill_minus_one_reaches_nothing_outside(daemon):
    with daemon.http() as c:
        sid = new_session(c)
    host_uid = daemon.session_uid(sid)
    # A canary on the host running as the very same host uid as the sandbox.
    canary = subprocess.Popen(["setpriv", f"--reuid={host_uid}", f"--regid={host_uid}", "--clear-groups", "sleep", "60"])
    try:
        out, _ = probe(daemon, r'''
import json, signal, subprocess
child = subprocess.Popen(["sleep", "30"])
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
os.kill(-1, signal.SIGKILL)
child.wait()
print(json.dumps({"pids": pids, "me": os.getpid(), "child_status": child.returncode}))
''', session_id=sid)
        assert len(out["pids"]) == 3 and out["pids"][0] == 1 and out["me"] in out["pids"]
        assert out["child_status"] == -signal.SIGKILL
        assert canary.poll() is None, "kill(-1) from the sandbox reached a host process"
    finally:
        canary.kill()
        canary.wait()


def test_output_flood_is_capped_and_the_daemon_stays_flat(daemon):
    daemon.run("print('warm')")
    before = daemon.rss_kib()
    result = daemon.run(
        "import sys\nchunk = 'y' * 65536\nfor _ in range(3000):\n    sys.stdout.write(chunk)\n    sys.stderr.write(chunk)\n",
        policy="tiny",
    )
    after = daemon.rss_kib()
    assert result["status"] == "ok", result["status"]
    assert result["stdout_truncated"] and result["stderr_truncated"]
    assert len(result["stdout"]) == 64 * 1024 and len(result["stderr"]) == 64 * 1024
    # ~190 MiB per stream went through; the daemon keeps only the caps.
    assert after - before < 20 * 1024, (before, after)


def test_filling_tmp_gives_enospc(daemon):
    out, _ = probe(daemon, r'''
import json
def fill():
    with open("/tmp/fill", "wb") as f:
        for _ in range(80):
            f.write(b"\0" * (1 << 20))
            f.flush()
def fill_shm():
    with open("/dev/shm/fill", "wb") as f:
        for _ in range(80):
            f.write(b"\0" * (1 << 20))
            f.flush()
print(json.dumps({"tmp": err(fill), "shm": err(fill_shm)}))
''')
    assert out == {"tmp": "ENOSPC", "shm": "ENOSPC"}


def test_workspace_quota_is_enforced_by_the_kernel(daemon):
    out, _ = probe(daemon, r'''
import json
def fill():
    for i in range(64):
        with open(f"/mnt/data/part{i}", "wb") as f:
            f.write(b"\1" * (512 << 10))
st = os.statvfs("/mnt/data")
print(json.dumps({"fill": err(fill), "total_mb": st.f_blocks * st.f_frsize >> 20}))
''', policy="tiny")
    assert out["fill"] == "ENOSPC"
    assert out["total_mb"] <= 16


def test_file_size_limit(daemon):
    out, _ = probe(daemon, r'''
import json
def big():
    with open("/mnt/data/big", "wb") as f:
        f.write(b"\0" * (2 << 20))
print(json.dumps({"big": err(big), "size": os.path.getsize("/mnt/data/big")}))
''', policy="tiny")
    assert out == {"big": "EFBIG", "size": 1 << 20}


def test_fd_exhaustion(daemon):
    out, _ = probe(daemon, r'''
import json, resource
fds = []
failure = None
while True:
    try:
        fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        failure = errno.errorcode[e.errno]
        break
print(json.dumps({"failure": failure, "limit": resource.getrlimit(resource.RLIMIT_NOFILE), "highest": max(fds)}))
''', policy="tiny")
    assert out["failure"] == "EMFILE"
    assert out["limit"] == [64, 64]
    assert out["highest"] == 63


def test_inherited_fds_are_only_stdio(daemon):
    # What any program started in the sandbox inherits: a child that keeps every
    # inheritable fd (close_fds=False) lists its own.
    out, _ = probe(daemon, r'''
import json, subprocess, sys
child = subprocess.run([sys.executable, "-c", "import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd')))"],
                       close_fds=False, capture_output=True, text=True)
print(json.dumps(json.loads(child.stdout)))
''')
    # 0-2, plus the fd listdir itself holds open while it reads.
    assert out[:3] == [0, 1, 2] and len(out) == 4


BASE_ENV = {
    "PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR", "MPLBACKEND", "MPLCONFIGDIR",
    "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
}
# With network: every client's proxy and CA bundle, and pip's index and manners.
NETWORK_ENV = {
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "NO_PROXY", "no_proxy",
    "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "PIP_INDEX_URL", "UV_INDEX_URL",
    "PIP_ONLY_BINARY", "PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK",
}


@pytest.mark.parametrize("policy", ["strict", "default"])
def test_environment_is_the_allow_list(daemon, policy):
    out, _ = probe(daemon, "import json\nprint(json.dumps(dict(os.environ)))\n", policy=policy)
    assert set(out) == (BASE_ENV if policy == "strict" else BASE_ENV | NETWORK_ENV)
    assert out["LANG"] == "C.UTF-8" and out["MPLBACKEND"] == "Agg" and out["HOME"] == "/tmp"
    if policy == "default":
        assert out["PATH"] == "/opt/packages/current/bin:/opt/py/bin:/usr/local/bin:/usr/bin:/bin"
        assert out["HTTPS_PROXY"] == "http://127.0.0.1:3128" and out["PIP_INDEX_URL"] == "https://pypi.org/simple"


def test_32bit_syscall_entry_kills_and_x32_is_refused(daemon):
    # int 0x80 with eax=20 (getpid on i386): another architecture's entry point.
    result = daemon.run(r'''
import ctypes, mmap
code = bytes([0xb8, 0x14, 0, 0, 0, 0xcd, 0x80, 0xc3])  # mov eax,20; int 0x80; ret
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
print("before", flush=True)
ctypes.CFUNCTYPE(ctypes.c_long)(addr)()
print("after")
''')
    assert result["status"] == "killed", result
    assert result["signal"] == "SIGSYS"
    assert result["stdout"] == "before\n"
    out, _ = probe(daemon, "import json\nprint(json.dumps({'x32_getpid': sc(0x40000000 | 39), 'x32_write': sc(0x40000000 | 1, 1, 0, 0)}))\n")
    assert out == {"x32_getpid": "EPERM", "x32_write": "EPERM"}


def test_concurrent_sandboxes_cannot_see_each_other(daemon):
    with daemon.http() as c:
        a, b = new_session(c), new_session(c)
    results = {}

    def run_a():
        results["a"] = daemon.run(
            "import time\nopen('/mnt/data/secret-a', 'w').write('a')\nopen('/tmp/tmp-a', 'w').write('a')\ntime.sleep(4)\nprint('done')",
            session_id=a,
        )

    t = threading.Thread(target=run_a)
    t.start()
    time.sleep(1.5)
    out, _ = probe(daemon, r'''
import json, glob
cmdlines = [open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace") for p in os.listdir("/proc") if p.isdigit()]
print(json.dumps({"files": sorted(os.listdir("/mnt/data")), "tmp": sorted(os.listdir("/tmp")), "pids": len(cmdlines),
                  "sees_sleep": any("time.sleep" in c for c in cmdlines),
                  "other_workspaces": glob.glob("/var/lib/sandboxd/**/secret-a", recursive=True)}))
''', session_id=b)
    t.join()
    assert results["a"]["stdout"] == "done\n"
    assert "secret-a" not in out["files"]
    assert "tmp-a" not in out["tmp"]
    assert out["pids"] == 2 and not out["sees_sleep"]
    assert out["other_workspaces"] == []


def test_every_rootfs_package_imports_and_plots(daemon):
    result = daemon.run(r'''
import importlib, json
mods = ["numpy", "pandas", "scipy", "sklearn", "matplotlib", "seaborn", "PIL", "openpyxl", "pyarrow", "reportlab",
        "scipy.stats", "sklearn.ensemble", "pyarrow.parquet", "reportlab.pdfgen.canvas", "matplotlib.pyplot"]
versions = {m: getattr(importlib.import_module(m), "__version__", "?") for m in mods}
import matplotlib.pyplot as plt, numpy as np, pandas as pd
df = pd.DataFrame({"x": np.arange(10), "y": np.arange(10) ** 2})
df.plot(x="x", y="y")
plt.savefig("/mnt/data/plot.png")
df.to_parquet("/mnt/data/df.parquet")
df.to_excel("/mnt/data/df.xlsx")
print(json.dumps(versions))
''')
    assert result["status"] == "ok", result["stderr"]
    assert result["stderr"] == "", result["stderr"]
    versions = json.loads(result["stdout"])
    assert versions["numpy"].startswith("2.") and versions["pandas"].startswith("2.")
    paths = sorted(a["path"] for a in result["artifacts"])
    assert paths == ["df.parquet", "df.xlsx", "plot.png"]


def test_sandbox_dies_with_the_daemon(fresh_daemon):
    d = fresh_daemon()
    with d.http() as c:
        sid = new_session(c)
    host_uid = d.session_uid(sid)
    def long_run():
        try:
            with d.http() as c:
                c.post("/v1/runs", json={"code": "sleep 600", "language": "shell", "session_id": sid})
        except Exception:  # the daemon is killed under this request
            pass

    t = threading.Thread(target=long_run, daemon=True)
    t.start()
    deadline = time.time() + 10
    while time.time() < deadline and not subprocess.run(["pgrep", "-u", str(host_uid)], capture_output=True).stdout:
        time.sleep(0.1)
    assert subprocess.run(["pgrep", "-u", str(host_uid)], capture_output=True).stdout, "the run never started"
    d.proc.kill()
    d.proc.wait()
    deadline = time.time() + 5
    while time.time() < deadline and subprocess.run(["pgrep", "-u", str(host_uid)], capture_output=True).stdout:
        time.sleep(0.1)
    assert subprocess.run(["pgrep", "-u", str(host_uid)], capture_output=True).stdout == b""
    # The next start removes the cgroups the killed daemon left.
    d.start()
    d.assert_clean()
