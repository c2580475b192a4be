"""The daemon's host state is root's and the session's alone, and nothing inside a
sandbox tells about the host: `/proc` masked as container runtimes mask it, no host
path (nor the session's id) in `/proc/self/mountinfo`, cold or pooled."""

import json
import os
import stat
import subprocess
import sys

import pytest

from conftest import new_session
from test_pool import pooled_run

NOBODY = 65534

# Reads what a sandbox could learn about the host from /proc; prints one JSON object.
PROBE = r'''
import errno, json, os
def attempt(f):
    try:
        return f()
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def write(path, data, flags=0):
    fd = os.open(path, os.O_WRONLY | flags)
    os.write(fd, data)
    return "written"
mountinfo = open("/proc/self/mountinfo").read()
print(json.dumps({
    "cmdline": attempt(lambda: open("/proc/cmdline", "rb").read().decode()),
    "kcore": attempt(lambda: len(open("/proc/kcore", "rb").read(4096))),
    "kallsyms": attempt(lambda: len(open("/proc/kallsyms", "rb").read())),
    "sysrq": attempt(lambda: write("/proc/sysrq-trigger", b"h")),
    "sysctl": attempt(lambda: write("/proc/sys/kernel/hostname", b"x")),
    "sysctl_trunc": attempt(lambda: write("/proc/sys/kernel/hostname", b"x", os.O_TRUNC)),
    "acpi": attempt(lambda: os.listdir("/proc/acpi")) if os.path.exists("/proc/acpi") else None,
    "mountinfo": mountinfo,
    "hostname": open("/proc/sys/kernel/hostname").read().strip(),
    "devices": {
        "null": attempt(lambda: write("/dev/null", b"x")),
        "zero": attempt(lambda: len(open("/dev/zero", "rb").read(16))),
        "full": attempt(lambda: write("/dev/full", b"x")),
        "urandom": attempt(lambda: len(open("/dev/urandom", "rb").read(16))),
    },
}))
'''


def probe(daemon, runner=None, **fields):
    result = runner(daemon, PROBE, **fields) if runner else daemon.run(PROBE, **fields)
    assert result["status"] == "ok", result
    return json.loads(result["stdout"].strip().splitlines()[-1])


def mounts(mountinfo):
    """{mount point: (root, options)} from a mountinfo text (the last mount wins)."""
    table = {}
    for line in mountinfo.splitlines():
        f = line.split(" ")
        table[f[4]] = (f[3], f[5].split(","))
    return table


def assert_host_hidden(out, daemon, sid):
    """What PROBE saw: /proc masked, and no host path in the mount table."""
    assert out["cmdline"] == "", out["cmdline"]
    # Where the host has /proc/kcore (0400 root: EACCES unmasked), masked it is
    # /dev/null, which reads empty; a kernel without it has none to mask (ENOENT).
    assert out["kcore"] == (0 if os.path.exists("/proc/kcore") else "ENOENT"), out["kcore"]
    # /proc/kallsyms (0444, every symbol of the host's kernel): empty.
    assert os.path.exists("/proc/kallsyms") and out["kallsyms"] == 0, out["kallsyms"]
    # The sandbox user owns neither the host's 0200 root /proc/sysrq-trigger nor a
    # sysctl: the kernel refuses the open (EACCES) before the read-only mount would
    # (EROFS; these mounts are checked "ro" below). A kernel without magic SysRq has
    # no /proc/sysrq-trigger (ENOENT), as this test host.
    assert out["sysrq"] == ("EACCES" if os.path.exists("/proc/sysrq-trigger") else "ENOENT"), out["sysrq"]
    assert out["sysctl"] == "EACCES", out["sysctl"]
    # With O_TRUNC the kernel checks the mount first: /proc/sys is read-only.
    assert out["sysctl_trunc"] == "EROFS", out["sysctl_trunc"]
    if os.path.exists("/proc/acpi"):
        assert out["acpi"] == [], out["acpi"]
    info = out["mountinfo"]
    for secret in (str(daemon.state), str(daemon.base), "/var/", sid, os.path.realpath(daemon.state)):
        assert secret not in info, (secret, info)
    table = mounts(info)
    # No host uid in any mount's options: the sandbox's tmpfs mounts belong to host
    # root (the kernel names any other owner's host uid, even inside), and nothing of
    # the host's devtmpfs (its size says the host's memory): /dev is the daemon's
    # small tree, read-only, its devices usable.
    host_uids = {str(daemon.session_uid(sid))} | {
        str(u) for u in range(daemon.uid_base + daemon.max_sessions(), daemon.uid_base + daemon.max_sessions() + 256)}
    for line in info.splitlines():
        options = line.split(" - ", 1)[1].split(" ")[2].split(",") + line.split(" ")[5].split(",")
        assert not [o for o in options if o.startswith(("uid=", "gid="))], line
        assert not [o for o in options if o.split("=")[-1] in host_uids], line
    assert "devtmpfs" not in info, info
    for host_line in open("/proc/self/mountinfo").read().splitlines():
        if " - devtmpfs " in host_line:
            size = [o for o in host_line.split(" - ", 1)[1].split(" ")[2].split(",") if o.startswith("size=")]
            assert not size or size[0] not in info, (size, info)
    assert table["/dev"][0] == "/" and "ro" in table["/dev"][1], table["/dev"]
    assert out["devices"] == {"null": "written", "zero": 16, "full": "ENOSPC", "urandom": 16}, out["devices"]
    # The rootfs and the workspace are each the root of a filesystem of their own.
    assert table["/"][0] == "/" and "ro" in table["/"][1], table["/"]
    assert table["/mnt/data"][0] == "/", table["/mnt/data"]
    # /proc: files masked by /dev/null, the rest that could change the host read-only.
    for masked in ("/proc/cmdline", "/proc/kcore", "/proc/kallsyms", "/proc/keys", "/proc/timer_list"):
        if os.path.exists(masked):
            assert masked in table, (masked, info)
    for ro in ("/proc/sys", "/proc/sysrq-trigger", "/proc/bus", "/proc/fs", "/proc/irq"):
        if os.path.exists(ro):
            assert ro in table and "ro" in table[ro][1], (ro, info)
    assert out["hostname"] == "sandbox"


def python_for_others():
    """An interpreter any user may run: the test's own may live under root's 0700
    home (pyenv, a venv in /root); the host's /usr/bin/python3 is the fallback."""
    def others_may_run(path):
        for p in {os.path.abspath(path), os.path.realpath(path)}:
            parts = p.split("/")
            dirs = ["/".join(parts[:i]) or "/" for i in range(1, len(parts))]
            if not all(os.stat(d).st_mode & 0o001 for d in dirs) or not os.stat(p).st_mode & 0o001:
                return False
        return True
    for candidate in (sys.executable, "/usr/bin/python3"):
        if others_may_run(candidate):
            return candidate
    pytest.fail("no Python interpreter that other users may execute: install python3")


def as_user(uid, code):
    """Run Python `code` as `uid` (its own gid, no other group); returns its stdout."""
    out = subprocess.run([python_for_others(), "-I", "-c", code], user=uid, group=uid, extra_groups=[],
                         capture_output=True, text=True, timeout=30, cwd="/")
    assert out.returncode == 0, out
    return json.loads(out.stdout)


TRY_AS_USER = r'''
import errno, json, os
def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
'''


def tries(uid, reads, lists):
    code = TRY_AS_USER + f"reads = {json.dumps(reads)}\nlists = {json.dumps(lists)}\n" + r'''
print(json.dumps({
    **{p: attempt(lambda p=p: open(p, "rb").read(1)) for p in reads},
    **{p: attempt(lambda p=p: os.listdir(p)) for p in lists},
}))
'''
    return as_user(uid, code)


def mode_owner(path):
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def check_modes(d, sid, uid):
    state, sdir = d.state, d.state / "sessions" / sid
    assert mode_owner(state) == (0o711, 0, 0)
    assert mode_owner(state / "sessions") == (0o711, 0, 0)
    assert mode_owner(sdir) == (0o710, 0, uid)
    assert mode_owner(sdir / "session.json") == (0o600, 0, 0)
    assert mode_owner(sdir / "workspace.img") == (0o600, 0, 0)
    assert mode_owner(sdir / "data") == (0o700, uid, uid)
    assert mode_owner(sdir / "data" / "up.txt") in ((0o600, uid, uid), (0o644, uid, uid))
    # The rootfs images: root's alone. The mounted rootfs: public content, read-only.
    images = state / "rootfs"
    assert mode_owner(os.path.realpath(images)) == (0o700, 0, 0)
    for image in (p for p in os.listdir(images) if p.endswith(".img")):
        assert mode_owner(images / image) == (0o600, 0, 0), image
    assert mode_owner(state / "mnt") == (0o711, 0, 0)
    assert mode_owner(state / "mnt" / "rootfs") == (0o755, 0, 0)
    # The blank images new ones are copied from: root's alone.
    blanks = state / "blank-images"
    assert mode_owner(blanks) == (0o700, 0, 0)
    assert os.listdir(blanks) and all(mode_owner(blanks / b) == (0o600, 0, 0) for b in os.listdir(blanks))
    # Nothing else below the state directory is for others: no file readable or
    # writable by them, no directory listable (the workspaces' and the rootfs's
    # contents are behind 0700 and public, respectively).
    for root, dirs, files in os.walk(state):
        here = os.path.relpath(root, state)
        if here == "mnt" or (here.startswith("sessions/") and here.endswith("/data")):
            dirs[:] = []
            continue
        for name in dirs + files:
            if os.path.islink(os.path.join(root, name)):  # the harness's link to the shared images
                continue
            mode = mode_owner(os.path.join(root, name))[0]
            assert mode & 0o006 == 0, (os.path.join(here, name), oct(mode))


def test_state_files_are_root_and_the_sessions_alone(fresh_daemon):
    d = fresh_daemon(args=["--pool-size", "0"])
    with d.http() as c:
        sid = new_session(c)
        other = new_session(c)
        assert c.put(f"/v1/sessions/{sid}/files/up.txt", content=b"secret").status_code in (200, 201)
    uid, other_uid = d.session_uid(sid), d.session_uid(other)
    check_modes(d, sid, uid)
    sdir = d.state / "sessions" / sid
    reads = [str(sdir / "session.json"), str(sdir / "workspace.img"), str(sdir / "data" / "up.txt")]
    lists = [str(d.state / "sessions"), str(d.state), str(sdir)]
    # User nobody, and another session's uid, knowing the id and every path: EACCES.
    for who in (NOBODY, other_uid):
        assert tries(who, reads, lists) == {p: "EACCES" for p in reads + lists}, who
    # The session's own uid passes through its directory to its workspace (as its
    # cold sandboxes do) and nothing more.
    own = tries(uid, reads, [str(sdir), str(sdir / "data")])
    assert own == {reads[0]: "EACCES", reads[1]: "EACCES", reads[2]: "ok",
                   str(sdir): "EACCES", str(sdir / "data"): "ok"}, own
    r = d.run("print(open('up.txt').read())", session_id=sid)
    assert r["status"] == "ok" and r["stdout"] == "secret\n", r


def test_a_new_sessions_images_are_their_own_empty_filesystems_holding_little_on_the_host(fresh_daemon):
    """Images are sparse copies of one blank per size: each session's is a filesystem
    of its own (a write in one is not in another, nor in the blank), its root the
    session's, empty, and it holds on the host what its filesystem wrote, not its
    journal's size."""
    d = fresh_daemon(args=["--pool-size", "0"])
    with d.http() as c:
        a, b = new_session(c), new_session(c)
        # Neither has an image before its first use.
        for sid in (a, b):
            assert sorted(os.listdir(d.state / "sessions" / sid)) == ["session.json"]
        assert c.put(f"/v1/sessions/{a}/files/only-a.txt", content=b"a").status_code in (200, 201)
        listing = c.get(f"/v1/sessions/{b}/files").json()
    assert listing == [], listing
    # A file operation makes the workspace; the first run, the package layer.
    assert sorted(os.listdir(d.state / "sessions" / a)) == ["data", "session.json", "workspace.img"]
    for sid in (a, b):
        assert d.run("print(1)", session_id=sid)["status"] == "ok"
    for sid in (a, b):
        sdir = d.state / "sessions" / sid
        uid = d.session_uid(sid)
        for image, root in (("workspace.img", "data"), ("packages.img", "packages")):
            st = os.stat(sdir / image)
            assert st.st_blocks * 512 < 4 << 20, (image, st.st_blocks * 512)
            assert mode_owner(sdir / root) == (0o700, uid, uid), (sid, root)
        # What the first run made there: the layer's empty current generation.
        assert os.listdir(sdir / "packages") == ["current"]
    assert os.listdir(d.state / "sessions" / b / "data") == []
    # The blanks: one per size, written by nothing since mkfs.
    blanks = sorted(os.listdir(d.state / "blank-images"))
    assert blanks == ["ext4-134217728.img", "ext4-67108864.img"], blanks
    r = d.run("import os; print(sorted(os.listdir('.')))", session_id=a)
    assert r["stdout"] == "['only-a.txt']\n", r
    # A blank that is not as the daemon makes them (another length, others may read
    # it, a second name) is never copied: it is made again.
    d.stop()
    blank = d.state / "blank-images" / "ext4-134217728.img"
    with open(blank, "r+b") as f:
        f.truncate(64 << 20)
    os.chmod(blank, 0o644)
    os.link(blank, d.state / "blank-images" / "second-name")
    os.chmod(d.state / "blank-images", 0o755)
    d.start()
    with d.http() as c:
        c_sid = new_session(c)
        assert c.get(f"/v1/sessions/{c_sid}/files").json() == []
    st = os.stat(blank)
    assert (stat.S_IMODE(st.st_mode), st.st_nlink, st.st_size) == (0o600, 1, 128 << 20)
    assert mode_owner(d.state / "blank-images") == (0o700, 0, 0)
    r = d.run("open('x', 'w').write('x' * 100_000); import os; print(os.statvfs('.').f_blocks * os.statvfs('.').f_frsize >> 20)",
              session_id=c_sid)
    assert r["status"] == "ok" and 100 <= int(r["stdout"]) <= 128, r


def test_wider_modes_left_by_an_earlier_version_are_fixed_at_start(fresh_daemon):
    d = fresh_daemon(args=["--pool-size", "0"])
    with d.http() as c:
        sid = new_session(c)
        assert c.put(f"/v1/sessions/{sid}/files/up.txt", content=b"x").status_code in (200, 201)
    uid = d.session_uid(sid)
    sdir = d.state / "sessions" / sid
    os.chmod(sdir / "data", 0o755)  # the workspace's root, in its image
    d.stop()
    # What the earlier version left: a searchable root-group directory, 0644 files.
    os.chown(sdir, 0, 0)
    os.chmod(sdir, 0o711)
    os.chmod(sdir / "session.json", 0o644)
    os.chmod(sdir / "workspace.img", 0o644)
    os.chmod(d.state / "sessions", 0o755)
    d.start()
    # The workspace's root is mounted (and its modes fixed) at the session's next use.
    with d.http() as c:
        assert c.get(f"/v1/sessions/{sid}/files").json()[0]["path"] == "up.txt"
    check_modes(d, sid, uid)
    r = d.run("print(open('up.txt').read())", session_id=sid)
    assert r["status"] == "ok" and r["stdout"] == "x\n", r


def test_a_cold_sandbox_sees_no_host_path_and_a_masked_proc(fresh_daemon):
    d = fresh_daemon(args=["--pool-size", "0"])
    with d.http() as c:
        sid = new_session(c)
    before = d.uds().get("/v1/health").json()["pool"]
    out = probe(d, session_id=sid)
    assert d.uds().get("/v1/health").json()["pool"]["hits"] == before["hits"] == 0
    assert_host_hidden(out, d, sid)
    d.stop()
    d.assert_clean()


def test_a_pooled_sandbox_sees_no_host_path_and_a_masked_proc(daemon):
    with daemon.http() as c:
        sid = new_session(c)
    # Run after run: each fork mounts (and masks) a fresh /proc of its own, which the
    # kernel allows because the template's own /proc stays fully visible.
    for _ in range(3):
        out = probe(daemon, runner=pooled_run, session_id=sid)
        assert_host_hidden(out, daemon, sid)
    daemon.assert_clean()


def test_a_kernel_sessions_proc_is_masked(daemon):
    with daemon.http() as c:
        sid = new_session(c, mode="kernel")
        try:
            r = c.post("/v1/runs", json={"code": "print(repr(open('/proc/cmdline').read()))", "session_id": sid})
            assert r.status_code == 200, (r.text, daemon.log_text())
            assert r.json()["status"] == "ok" and r.json()["stdout"] == "''\n", r.json()
        finally:
            c.delete(f"/v1/sessions/{sid}")
