"""Density: a session costs nothing until it is used (no image, no mount), an idle
session's workspace is unmounted and mounted again at its next use with its files,
the sessions' images may be overcommitted (`workspace_overcommit`), and ten thousand
sessions of the default policy are held by one daemon."""

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from conftest import error_code, new_session
from harness import Daemon, _uids_in_use, scratch_dir

REPO = Path(__file__).resolve().parent.parent
DEFAULT_POLICY = (REPO / "policies" / "default.toml").read_text()


def mounted_below(d, path):
    """Mount points below `path` in the daemon's mount table."""
    prefix = str(path) + "/"
    return [line.split(" ")[4] for line in d.mountinfo().splitlines() if line.split(" ")[4].startswith(prefix)]


def loop_devices_of(image):
    """Loop devices bound to `image` now."""
    bound = []
    for dev in Path("/sys/block").glob("loop*"):
        try:
            if (dev / "loop" / "backing_file").read_text().strip() == str(image):
                bound.append(dev.name)
        except FileNotFoundError:
            pass
    return bound


def storage(d):
    return d.uds().get("/v1/health").json()["storage"]


def wait_for(what, check, timeout=30):
    deadline = time.time() + timeout
    while not check():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_session_costs_nothing_until_used_and_an_idle_one_is_unmounted_keeping_its_files(fresh_daemon):
    d = fresh_daemon(args=["--pool-size", "0", "--workspace-idle-unmount-s", "1"])
    sessions = d.state / "sessions"
    with d.http() as c:
        sid = new_session(c)
        sdir = sessions / sid
        # Held, not used: its description alone, nothing mounted, no loop device.
        assert sorted(os.listdir(sdir)) == ["session.json"]
        assert mounted_below(d, sdir) == []
        assert storage(d)["workspaces_mounted"] == 0
        # Listing it, or reading a file, is what a new workspace answers.
        assert c.get(f"/v1/sessions/{sid}/files").json() == []
        r = c.get(f"/v1/sessions/{sid}/files/nothing.txt")
        assert (r.status_code, error_code(r)) == (404, "not_found"), r.text
        assert mounted_below(d, sdir) == [str(sdir / "data")], "a file operation mounts it"
        assert c.put(f"/v1/sessions/{sid}/files/kept.txt", content=b"kept").status_code == 201
        image = sdir / "workspace.img"
        assert len(loop_devices_of(image)) == 1
        assert storage(d)["workspaces_mounted"] == 1
        # Idle past workspace_idle_unmount_s: unmounted, its loop device let go.
        wait_for("the idle unmount", lambda: storage(d)["workspaces_mounted"] == 0)
        assert mounted_below(d, sdir) == []
        wait_for("the loop device to be let go", lambda: loop_devices_of(image) == [], timeout=10)
        assert image.is_file()
        # Its next use mounts the same image again, files and all, and a run writes.
        r = d.run("print(open('kept.txt').read()); open('more.txt', 'w').write('more')", session_id=sid)
        assert (r["status"], r["stdout"]) == ("ok", "kept\n"), r
        assert len(loop_devices_of(image)) == 1
        wait_for("the second idle unmount", lambda: storage(d)["workspaces_mounted"] == 0)
        paths = sorted(f["path"] for f in c.get(f"/v1/sessions/{sid}/files").json())
        assert paths == ["kept.txt", "more.txt"]
        # A restart finds it unmounted and mounts it at its next use.
        d.stop()
        d.start()
        assert mounted_below(d, sdir) == []
    r = d.run("import os; print(sorted(os.listdir('.')))", session_id=sid)
    assert r["stdout"] == "['kept.txt', 'more.txt']\n", r
    with d.http() as c:
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200
    assert not sdir.exists() and loop_devices_of(image) == []


def test_a_session_whose_kernel_lives_keeps_its_workspace_mounted(fresh_daemon):
    d = fresh_daemon(args=["--workspace-idle-unmount-s", "1"])
    with d.http() as c:
        sid = new_session(c, mode="kernel")
        cell = c.post(f"/v1/sessions/{sid}/runs", json={"code": "x = 41; open('k.txt', 'w').write('k')"}).json()
        assert cell["status"] == "ok", cell
        # Well past the idle time, its kernel (and its variables) still have it.
        time.sleep(3)
        assert storage(d)["workspaces_mounted"] == 1
        cell = c.post(f"/v1/sessions/{sid}/runs", json={"code": "print(x + 1, open('k.txt').read())"}).json()
        assert (cell["status"], cell["stdout"]) == ("ok", "42 k\n"), cell
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200
    assert storage(d)["workspaces_mounted"] == 0


OVERCOMMIT_POLICY = DEFAULT_POLICY.replace("workspace_mb = 1024", "workspace_mb = 200").replace(
    "packages_mb = 512", "packages_mb = 0")


@contextlib.contextmanager
def on_small_disk(name, size_mb, overcommit, *args):
    """A daemon (started) whose state directory is a tmpfs of `size_mb`, its
    sessions of 200 MiB workspaces overcommitted `overcommit` times: the daemon,
    and its state directory."""
    base = scratch_dir(f"{name}-")
    state = base / "d" / "state"
    state.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0711", f"sandboxd-test-{name}", str(state)],
                   check=True)
    d = Daemon(base / "d", policies={"default": OVERCOMMIT_POLICY},
               args=["--workspace-overcommit", str(overcommit), "--pool-size", "0", *args])
    try:
        d.start()
        yield d, state
    finally:
        d.stop()
        subprocess.run(["umount", "-l", str(state)], check=False)
        shutil.rmtree(base, ignore_errors=True)


def fill(state, leave):
    """Take all but `leave` bytes of what the state directory's filesystem has
    free (something else on the host filling it): the file that does."""
    fs = os.statvfs(state)
    filler = state / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, fs.f_bavail * fs.f_frsize - leave)
    finally:
        os.close(fd)
    return filler


def test_workspace_overcommit_holds_that_many_times_what_the_disk_has_free():
    counts = {}
    for overcommit in ("1", "4"):
        # 700 MiB free, less what the daemon itself keeps there: each session may
        # take 200 MiB of workspace and 14 MiB of run records and conversations. Reserved whole, two or
        # three fit; overcommitted 4 times, four times as many.
        with on_small_disk("overcommit", 700, overcommit, "--max-sessions", "100") as (d, _), d.http() as c:
            made = []
            while True:
                r = c.post("/v1/sessions", json={})
                if r.status_code != 201:
                    break
                made.append(r.json()["id"])
            assert (r.status_code, error_code(r)) == (507, "insufficient_storage"), r.text
            message = r.json()["error"]["message"]
            assert "raise workspace_overcommit" in message, message
            assert ("workspace_overcommit)" in message) == (overcommit != "1"), message
            held = storage(d)
            assert held["workspace_overcommit"] == float(overcommit)
            assert held["held_bytes"] <= held["free_bytes"] * float(overcommit)
            # Each one runs, its image made at its first use.
            for sid in made[:2]:
                r = c.post(f"/v1/sessions/{sid}/runs", json={"code": "print('ran')"}).json()
                assert r["stdout"] == "ran\n", r
            for sid in made:
                assert c.delete(f"/v1/sessions/{sid}").status_code == 200
        counts[overcommit] = len(made)
    assert 2 <= counts["1"] <= 3, counts
    assert 4 * counts["1"] - 1 <= counts["4"] <= 4 * counts["1"] + 4, counts


def test_a_full_disk_at_a_sessions_first_use_is_507_and_harms_nothing():
    """The host disk full when a session's workspace is made (the first blank of
    its size, by mkfs; or a later one's sparse copy): that use is answered 507
    with what to do, the session stays, and once there is room it is made."""
    with on_small_disk("full", 600, 100) as (d, state), d.http() as c:
        first, second = new_session(c), new_session(c)
        for sid, what in ((first, "the first blank of its size (mkfs)"), (second, "a copy of the blank")):
            filler = fill(state, 64 * 1024)
            r = c.put(f"/v1/sessions/{sid}/files/a.txt", content=b"x")
            assert (r.status_code, error_code(r)) == (507, "insufficient_storage"), (what, r.text)
            assert "free disk space" in r.json()["error"]["message"], r.text
            r = c.post(f"/v1/sessions/{sid}/runs", json={"code": "print(1)"})
            assert (r.status_code, error_code(r)) == (507, "insufficient_storage"), (what, r.text)
            # Nothing half made left behind; the session is still there.
            assert not [p.name for p in (d.state / "sessions").glob(f"*{sid}/workspace.img*")], what
            assert not [m for m in mounted_below(d, state / "sessions") if sid in m], what
            assert c.get(f"/v1/sessions/{sid}").status_code == 200
            filler.unlink()
            r = c.post(f"/v1/sessions/{sid}/runs", json={"code": "open('a.txt','w').write('ok'); print(1)"}).json()
            assert r["stdout"] == "1\n", (what, r)
            assert c.get(f"/v1/sessions/{sid}/files/a.txt").content == b"ok"
        assert d.uds().get("/v1/health").status_code == 200


def test_a_package_layer_left_unmounted_is_mounted_again_with_what_was_installed(fresh_daemon):
    """A session's package layer unmounted while its workspace stays mounted (a
    daemon stopped between the two mounts, an unmount that failed halfway): the
    next run mounts the same layer again, never makes a second one or fails."""
    d = fresh_daemon(args=["--pool-size", "0"])
    with d.http() as c:
        sid = new_session(c)
        r = c.post(f"/v1/sessions/{sid}/runs",
                   json={"code": "open('/opt/packages/kept.txt','w').write('installed'); print('ok')"}).json()
        assert r["stdout"] == "ok\n", r
        [sdir] = (d.state / "sessions").glob(f"*{sid}")
        assert sorted(mounted_below(d, sdir)) == [str(sdir / "data"), str(sdir / "packages")]
        subprocess.run(["nsenter", "-t", str(d.proc.pid), "-m", "umount", str(sdir / "packages")], check=True)
        assert mounted_below(d, sdir) == [str(sdir / "data")]
        r = c.post(f"/v1/sessions/{sid}/runs", json={"code": "print(open('/opt/packages/kept.txt').read())"})
        assert r.status_code == 200, r.text
        assert r.json()["stdout"] == "installed\n", r.json()
        assert sorted(mounted_below(d, sdir)) == [str(sdir / "data"), str(sdir / "packages")]
        assert len(loop_devices_of(sdir / "packages.img")) == 1


WRITE = """
import errno, os
written, err = 0, None
try:
    with open({name!r}, "wb") as f:
        for _ in range({mib}):
            f.write(b"x" * (1 << 20))
            written += 1
        f.flush()
        os.fsync(f.fileno())
except OSError as e:
    err = e.errno
st = os.statvfs(".")
print(written, err, st.f_bavail * st.f_frsize, st.f_bfree * st.f_frsize)
"""


def write(c, sid, name, mib):
    """Write `mib` MiB to `name` in session `sid`: (MiB written, errno or None, result)."""
    r = c.post(f"/v1/sessions/{sid}/runs", json={"code": WRITE.format(name=name, mib=mib)}, timeout=120).json()
    written, err, *_ = r["stdout"].split()
    return int(written), None if err == "None" else int(err), r


def test_a_host_disk_that_fills_is_enospc_to_the_session_writing_and_harms_no_other():
    """Overcommitted workspaces on a host disk that really fills: the session that
    writes gets ENOSPC (never an I/O error), and a result that says which room ran
    out; the other sessions keep their files and their share; freed, it writes
    again. Its own size full is told apart."""
    with on_small_disk("share", 700, 4) as (d, state), d.http() as c:
        a, b = new_session(c), new_session(c)
        for sid in (a, b):
            assert write(c, sid, "kept.bin", 20)[:2] == (20, None)
        # The host left with about 150 MiB free: the margin (64 MiB), what the
        # two images' journals, inode tables and reserves may still take (~23 MiB
        # each), and about 20 MiB each to share.
        filler = fill(state, 150 * 1024 * 1024)
        # The daemon shares the disk every second: health shows the share.
        wait_for("the disk shared", lambda: storage(d).get("disk_share_bytes", 1 << 40) < 60 << 20)
        # Preallocating is no way past it (fallocate is EOPNOTSUPP in the
        # sandbox: glibc's posix_fallocate writes the blocks, each counted).
        r = c.post(f"/v1/sessions/{a}/runs", json={"code": (
            "import os\nfd = os.open('pre.bin', os.O_CREAT | os.O_WRONLY)\n"
            "try:\n    os.posix_fallocate(fd, 0, 150 << 20)\nexcept OSError as e:\n    print(e.errno)\n"
            "os.remove('pre.bin')")}).json()
        assert r["stdout"] == "28\n", r
        written, err, r = write(c, a, "big.bin", 300)
        assert err == 28 and written < 100, (written, err, r["stderr"])
        assert r["usage"]["disk_full"] == "host", r["usage"]
        assert "the host's disk is nearly full" in r["stderr"], r["stderr"]
        assert os.statvfs(state).f_bavail > 0, "the host disk itself never filled"
        # The other session keeps its files, and room of its own to write.
        r = c.post(f"/v1/sessions/{b}/runs",
                   json={"code": "print(open('kept.bin','rb').read() == b'x' * (20 << 20))"}).json()
        assert r["stdout"] == "True\n", r
        assert write(c, b, "small.bin", 2)[:2] == (2, None)
        # Freed, the session writes again; its own size full says so instead.
        filler.unlink()
        c.post(f"/v1/sessions/{a}/runs", json={"code": "import os; os.remove('big.bin')"})
        wait_for("the share lifted", lambda: "disk_share_bytes" not in storage(d))
        written, err, r = write(c, a, "big.bin", 30)
        assert (written, err) == (30, None), r["stderr"]
        assert "disk_full" not in r["usage"], r["usage"]
        written, err, r = write(c, a, "bigger.bin", 300)
        assert err == 28 and 100 < written < 200, (written, err)
        assert r["usage"]["disk_full"] == "workspace", r["usage"]
        assert "the session's workspace is full (its 200 MiB" in r["stderr"], r["stderr"]
        # Nothing was lost in either session.
        for sid in (a, b):
            r = c.post(f"/v1/sessions/{sid}/runs",
                       json={"code": "print(open('kept.bin','rb').read() == b'x' * (20 << 20))"}).json()
            assert r["stdout"] == "True\n", r


def test_workspaces_mounted_at_once_on_a_nearly_full_host_lose_nothing():
    """Sessions used for the first time at once while the host has less free than
    they write together: each is counted in the sharing before it is handed out,
    so each write either lands or is ENOSPC, none is an I/O error, and what each
    was told it wrote is there."""
    import threading
    with on_small_disk("burst", 700, 4) as (d, state):
        with d.http() as c:
            sids = [new_session(c) for _ in range(4)]
        fill(state, 400 * 1024 * 1024)
        results = {}

        def one(sid):
            with d.http() as c:
                results[sid] = write(c, sid, "big.bin", 180)

        threads = [threading.Thread(target=one, args=(sid,)) for sid in sids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert os.statvfs(state).f_bavail > 0, "the host disk itself never filled"
        with d.http() as c:
            for sid, (written, err, r) in results.items():
                assert err in (None, 28), (sid, written, err, r["stderr"])
                assert (err is None) == (written == 180), (written, err)
                # What the session was told it wrote is there, and it writes on.
                r = c.post(f"/v1/sessions/{sid}/runs", json={"code": (
                    "import os\nprint(os.path.getsize('big.bin') >> 20)\nos.remove('big.bin')\n"
                    "open('after.txt', 'w').write('ok')\nprint(open('after.txt').read())")}).json()
                assert r["stdout"].split() == [str(written), "ok"], (sid, written, r)


DENSITY = 10_000


def dense_uid_base():
    """A uid base with room for DENSITY sessions and the pool, above the harness's."""
    for base in range(3_000_000, 4_000_000, 20_000):
        if not _uids_in_use(base, DENSITY + 256):
            return base
    raise RuntimeError("no free uid range for 10,000 sessions")


def test_ten_thousand_sessions_of_the_default_policy_are_held_and_each_runs():
    # 10,000 default sessions may each take 1.5 GiB filled up: overcommitted.
    d = Daemon(scratch_dir("density-"), policies={"default": DEFAULT_POLICY},
               args=["--max-sessions", str(DENSITY), "--workspace-overcommit", "1000"])
    d.uid_base = dense_uid_base()
    sessions = d.state / "sessions"
    made = []
    try:
        d.start()
        with d.http() as c:
            for _ in range(DENSITY):
                r = c.post("/v1/sessions", json={})
                assert r.status_code == 201, (len(made), r.text)
                made.append(r.json()["id"])
            r = c.post("/v1/sessions", json={})
            assert (r.status_code, error_code(r)) == (429, "max_sessions"), r.text
            health = c.get("/v1/health").json()
            assert health["sessions"] == DENSITY
            assert health["storage"]["workspaces_mounted"] == 0
            assert mounted_below(d, sessions) == []
            # The daemon holds them in less than 100 MB.
            assert d.rss_kib() < 100 * 1024, d.rss_kib()
            # A run in the last one made, and in the first, as in any.
            for sid in (made[-1], made[0]):
                r = c.post(f"/v1/sessions/{sid}/runs", json={"code": "print('dense')"}).json()
                assert (r["status"], r["stdout"]) == ("ok", "dense\n"), r
            assert len(mounted_below(d, sessions)) == 4  # two workspaces, two package layers
        # A restart takes them all back.
        d.stop()
        d.start()
        with d.http() as c:
            assert c.get("/v1/health").json()["sessions"] == DENSITY
            r = c.post(f"/v1/sessions/{made[DENSITY // 2]}/runs", json={"code": "print('back')"}).json()
            assert r["stdout"] == "back\n", r
    finally:
        d.stop()
        shutil.rmtree(d.base, ignore_errors=True)
