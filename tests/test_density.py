"""Density: a session costs nothing until it is used (no image, no mount), an idle
session's workspace is unmounted and mounted again at its next use with its files,
the sessions' images may be overcommitted (`workspace_overcommit`), and ten thousand
sessions of the default policy are held by one daemon."""

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


def test_workspace_overcommit_holds_that_many_times_what_the_disk_has_free():
    counts = {}
    for overcommit in ("1", "4"):
        base = scratch_dir("overcommit-")
        state = base / "d" / "state"
        state.mkdir(parents=True)
        # 700 MiB free, less what the daemon itself keeps there: each session may
        # take 200 MiB of workspace and 9 MiB of run records. Reserved whole, two or
        # three fit; overcommitted 4 times, four times as many.
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=700m,mode=0711", "sandboxd-test-overcommit", str(state)],
                       check=True)
        d = Daemon(base / "d", policies={"default": OVERCOMMIT_POLICY},
                   args=["--workspace-overcommit", overcommit, "--max-sessions", "100", "--pool-size", "0"])
        try:
            d.start()
            with d.http() as c:
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
        finally:
            d.stop()
            subprocess.run(["umount", "-l", str(state)], check=False)
            shutil.rmtree(base, ignore_errors=True)
    assert 2 <= counts["1"] <= 3, counts
    assert 4 * counts["1"] - 1 <= counts["4"] <= 4 * counts["1"] + 4, counts


def test_a_full_disk_at_a_sessions_first_use_is_507_and_harms_nothing():
    """The host disk full when a session's workspace is made (the first blank of
    its size, by mkfs; or a later one's sparse copy): that use is answered 507
    with what to do, the session stays, and once there is room it is made."""
    base = scratch_dir("full-")
    state = base / "d" / "state"
    state.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600m,mode=0711", "sandboxd-test-full", str(state)], check=True)
    d = Daemon(base / "d", policies={"default": OVERCOMMIT_POLICY},
               args=["--workspace-overcommit", "100", "--pool-size", "0"])
    filler = state / "filler"

    def fill():
        """Take all but 64 KiB of what the state's filesystem has free."""
        fs = os.statvfs(state)
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.posix_fallocate(fd, os.fstat(fd).st_size, fs.f_bavail * fs.f_frsize - 64 * 1024)
        finally:
            os.close(fd)

    try:
        d.start()
        with d.http() as c:
            first, second = new_session(c), new_session(c)
            for sid, what in ((first, "the first blank of its size (mkfs)"), (second, "a copy of the blank")):
                fill()
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
    finally:
        d.stop()
        subprocess.run(["umount", "-l", str(state)], check=False)
        shutil.rmtree(base, ignore_errors=True)


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
