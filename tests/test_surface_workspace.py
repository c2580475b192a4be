"""The daemon's own surface: it never resolves a name the sandbox controls.

Each race is driven from a kernel session, whose interpreter keeps running
between cells: a background thread exchanges a directory (or file) and a
symlink to a HOST path with renameat2(RENAME_EXCHANGE) while the daemon lists,
snapshots, scans and writes the workspace. The symlinks point at root-only
host directories the test made: inside the sandbox those paths do not exist,
so only the daemon (root, on the host) could ever follow them. Each test shows
that the swap really happened (the swap counter grows, and the daemon itself
saw both states), then asserts the daemon never crossed the line.
"""

import errno
import os
import platform
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from conftest import new_session, require

# Runs in the kernel: starts a thread that swaps `a` and `b` for at most
# `seconds` or `limit` swaps (or until a file `stop` appears), publishing its
# count in `swaps` (atomically, through `swaps.tmp`) and writing `done` at the end.
# With `touch`, it keeps that file's mtime fresh through an fd opened beforehand,
# so that the daemon's pre-run snapshot always hashes it.
SWAPPER = r'''
import ctypes, os, threading, time
def _swapper(a, b, seconds, limit, touch):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(touch, os.O_RDONLY) if touch else None
    n, tries, end = 0, 0, time.monotonic() + seconds
    def publish(text):
        with open("swaps.tmp", "w") as f:
            f.write(text)
        os.replace("swaps.tmp", "swaps")
    publish("0")
    while n < limit and time.monotonic() < end:
        # renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE), x86_64 syscall 316
        if libc.syscall(316, -100, a.encode(), -100, b.encode(), 2) == 0:
            n += 1
        tries += 1
        if tries % 64 == 0:
            if fd is not None:
                os.utime(fd)
            publish(str(n))
            if os.path.exists("stop"):
                break
    publish(str(n))
    open("done", "w").close()
threading.Thread(target=_swapper, args=ARGS, daemon=True).start()
'''

# What the swapper itself writes in the workspace.
SWAPPER_FILES = {"swaps", "swaps.tmp", "done", "stop"}


@pytest.fixture(autouse=True)
def x86_64():
    require(platform.machine() == "x86_64", "the swapper calls renameat2 by its x86_64 syscall number")


@pytest.fixture
def host_dir():
    """Root-only (0700) host directories, removed after the test."""
    made = []

    def make(prefix="sdws-host-"):
        path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
        os.chmod(path, 0o700)
        made.append(path)
        return path

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def cell(daemon, sid, code, timeout_s=20):
    result = daemon.run(code, session_id=sid, timeout_s=timeout_s)
    assert result["status"] == "ok", result
    return result


def swaps(daemon, sid):
    return int(cell(daemon, sid, "print(open('swaps').read())")["stdout"])


def start_swapper(daemon, sid, a, b, seconds=60, limit=20_000_000, touch=None):
    cell(daemon, sid, SWAPPER.replace("ARGS", repr((a, b, seconds, limit, touch))))
    deadline = time.time() + 10
    while True:
        try:
            n = swaps(daemon, sid)
        except (AssertionError, ValueError):
            n = 0
        if n > 0:
            return n
        assert time.time() < deadline, "the swapper never swapped"
        time.sleep(0.1)


def stop_swapper(daemon, sid):
    with daemon.http() as c:
        assert c.put(f"/v1/sessions/{sid}/files/stop", content=b"").status_code == 201
    deadline = time.time() + 20
    while not cell(daemon, sid, "import os\nprint(os.path.exists('done'))")["stdout"].strip() == "True":
        assert time.time() < deadline, "the swapper did not stop"
        time.sleep(0.1)


def listing(client, sid):
    r = client.get(f"/v1/sessions/{sid}/files")
    assert r.status_code == 200, r.text
    return [f["path"] for f in r.json()]


def workspace(daemon, sid):
    return daemon.state / "sessions" / sid / "data"


def test_listings_and_artifact_scans_never_follow_a_swapped_symlink(daemon, kernel, host_dir):
    secret_dir = host_dir()
    (secret_dir / "host-secret").write_text("root only\n")
    os.chmod(secret_dir / "host-secret", 0o600)
    sid = kernel()
    # `d` is a real directory; `l` a symlink to the host directory; plus a FIFO
    # and a socket, which are never listed.
    cell(daemon, sid, (
        "import os, socket\nos.mkdir('d')\nopen('d/inside.txt', 'w').write('x')\n"
        f"os.symlink({str(secret_dir)!r}, 'l')\nos.mkfifo('pipe')\n"
        "s = socket.socket(socket.AF_UNIX)\ns.bind('sock')"))
    first = start_swapper(daemon, sid, "d", "l")
    allowed = {"d/inside.txt", "l/inside.txt"} | SWAPPER_FILES
    seen = set()
    with daemon.http(timeout=30) as c:
        # At least 300 listings; up to 1200 until one met each state.
        for i in range(1200):
            if i >= 300 and {"d/inside.txt", "l/inside.txt"} <= seen:
                break
            names = listing(c, sid)
            assert set(names) <= allowed, names
            seen.update(names)
    artifacts_seen = set()
    for i in range(20):
        result = cell(daemon, sid, f"open('out{i}.txt', 'w').write('{i}')")
        paths = {a["path"] for a in result["artifacts"]}
        assert f"out{i}.txt" in paths
        assert paths <= allowed | {f"out{i}.txt"}, paths
        artifacts_seen |= paths
    # Shell runs in the same session: a cold sandbox, the same snapshot and scan.
    for i in range(5):
        result = daemon.run(f"echo {i} > sh{i}.txt", session_id=sid, language="shell")
        assert result["status"] == "ok", result
        paths = {a["path"] for a in result["artifacts"]}
        assert f"sh{i}.txt" in paths and paths <= allowed | {f"sh{i}.txt"}, paths
    last = swaps(daemon, sid)
    # The race was on: the swapper kept swapping, and the daemon's own listings
    # met the real directory under both of its names.
    assert last > first > 0, (first, last)
    assert {"d/inside.txt", "l/inside.txt"} <= seen, seen
    assert not any("host-secret" in p for p in seen | artifacts_seen)
    assert (secret_dir / "host-secret").read_text() == "root only\n"


def test_the_snapshot_never_opens_a_host_fifo_through_a_swapped_symlink(daemon, kernel, host_dir):
    fifo_dir = host_dir()
    fifo = fifo_dir / "fifo"
    os.mkfifo(fifo, 0o600)

    def no_reader():
        # ENXIO: nobody has the FIFO open for reading.
        with pytest.raises(OSError) as e:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        assert e.value.errno == errno.ENXIO

    sid = kernel()
    # `f`: a regular file whose mtime the swapper keeps fresh (so every snapshot
    # hashes it); `p`: a symlink to the host's root-only FIFO. They swap.
    cell(daemon, sid, f"import os\nopen('f', 'w').write('abc')\nos.symlink({str(fifo)!r}, 'p')")
    first = start_swapper(daemon, sid, "f", "p", touch="f")
    seen = set()
    with daemon.http(timeout=30) as c:
        for i in range(25):
            started = time.monotonic()
            r = c.post(f"/v1/sessions/{sid}/runs", json={"code": f"print({i})", "timeout_s": 10})
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "ok" and r.json()["stdout"] == f"{i}\n", r.json()
            assert time.monotonic() - started < 15
            no_reader()
            seen.update(listing(c, sid))
        r = c.post(f"/v1/sessions/{sid}/runs", json={"code": "echo sh", "language": "shell", "timeout_s": 10})
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        no_reader()
    last = swaps(daemon, sid)
    assert last > first > 0, (first, last)
    # The daemon's listings met the regular file under both names.
    assert {"f", "p"} <= seen, seen
    no_reader()
    started = time.monotonic()
    with daemon.http(timeout=30) as c:
        r = c.delete(f"/v1/sessions/{sid}")
    assert r.status_code == 200, r.text
    assert time.monotonic() - started < 10
    no_reader()


def find_on_host(pattern):
    """Every path on the host's root filesystem (not the workspaces, which are
    mounts of their own) whose name matches `pattern`."""
    out = subprocess.run(["find", "/", "-xdev", "-name", pattern], capture_output=True, text=True, timeout=300)
    return [line for line in out.stdout.splitlines() if line]


def test_uploads_never_create_directories_through_a_swapped_symlink(daemon, kernel, host_dir):
    target = host_dir()
    sid = kernel()
    uid = daemon.session_uid(sid)
    cell(daemon, sid, f"import os\nos.mkdir('a')\nos.symlink({str(target)!r}, 'l')")
    first = start_swapper(daemon, sid, "a", "l")
    tag = "n" + uuid.uuid4().hex[:12]
    codes = {}
    with daemon.http(timeout=30) as c:
        # At least 200 uploads; up to 800 until the daemon has met both states.
        for i in range(800):
            if i >= 200 and codes.get(201) and codes.get(400):
                break
            r = c.put(f"/v1/sessions/{sid}/files/a/{tag}-{i}/x.txt", content=b"payload")
            if r.status_code == 201:
                codes[201] = codes.get(201, 0) + 1
                continue
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["code"] == "invalid_path", err
            # A link met by openat2; or, when it was exchanged back between the
            # refused open and the look that says why, "not a directory".
            assert err["message"] in (
                "a is a symbolic link, which the daemon never follows: name the real file or directory instead",
                "a is not a directory",
            ), err
            codes[400] = codes.get(400, 0) + 1
    last = swaps(daemon, sid)
    assert last > first > 0, (first, last)
    # The daemon met both states of `a`: a directory it wrote into, a link it refused.
    assert codes.get(201, 0) > 0 and codes.get(400, 0) > 0, codes
    assert os.listdir(target) == []
    assert find_on_host(f"{tag}-*") == []
    stop_swapper(daemon, sid)
    # What was made is in the workspace, owned by the session's user.
    made = []
    for top, dirs, files in os.walk(workspace(daemon, sid)):
        for name in dirs + files:
            st = os.lstat(os.path.join(top, name))
            assert st.st_uid == uid and st.st_gid == uid, (top, name, st.st_uid)
            if name.startswith(tag):
                made.append(name)
    assert len(made) == codes[201]
    assert os.listdir(target) == []


def test_an_upload_below_a_symlinked_directory_is_refused(daemon, host_dir):
    target = host_dir()
    with daemon.http() as c:
        sid = new_session(c)
        result = daemon.run(f"mkdir real && ln -s {target} link && ln -s {target} real/link",
                            session_id=sid, language="shell")
        assert result["status"] == "ok", result
        for path, link in [("link/x.txt", "link"), ("real/link/sub/x.txt", "real/link"), ("link", "link")]:
            r = c.put(f"/v1/sessions/{sid}/files/{path}", params={"overwrite": "true"}, content=b"data")
            assert r.status_code == 400, r.text
            assert r.json()["error"] == {
                "code": "invalid_path",
                "message": f"{link} is a symbolic link, which the daemon never follows: name the real file or directory instead",
            }
        assert os.listdir(target) == []
        assert listing(c, sid) == []
        # The workspace is intact: the links are still links, nothing was added.
        ws = workspace(daemon, sid)
        assert sorted(os.listdir(ws)) == ["link", "real"] and os.listdir(ws / "real") == ["link"]
        assert os.readlink(ws / "link") == str(target)
        c.delete(f"/v1/sessions/{sid}")


def test_a_file_under_a_lease_is_busy_not_a_server_error(daemon, kernel):
    """A lease taken by the session's code makes the daemon's non-blocking open fail
    (EWOULDBLOCK): 409 file_busy, nothing logged as an error, and the file's name
    (which the sandbox chose, newline and all) never reaches the log raw. (An
    upload with ?overwrite=true replaces the name, not the leased file: not busy.)"""
    sid = kernel()
    name = "fig\n2026-01-01T00:00:00Z ERROR sandboxd: FORGED.png"
    cell(daemon, sid, f'''
import fcntl, os
name = {name!r}
open(name, "wb").write(b"\\x89PNG\\r\\n\\x1a\\n")
held = os.open(name, os.O_WRONLY)
fcntl.fcntl(held, fcntl.F_SETLEASE, fcntl.F_WRLCK)
''')
    with daemon.http() as c:
        url = f"/v1/sessions/{sid}/files/" + name.replace("\n", "%0A")
        got = c.get(url)
        assert got.status_code == 409 and got.json()["error"]["code"] == "file_busy", got.text
        assert "lease or lock" in got.json()["error"]["message"]
    # Every line of the log is the daemon's own (a timestamp, then a level): the
    # name (and the cell's code, logged at debug level) never split a line.
    log = daemon.log_path.read_text(errors="replace")
    assert "\x1b[" not in log, "a log file carries no colour codes"
    assert not [line for line in log.splitlines() if "FORGED" in line and not line.startswith("20")], "a split log line"
    assert not [line for line in log.splitlines() if line.startswith("2026-01-01T00:00:00Z")], "a forged log line"
    # Released (or gone with its kernel: the break signal, SIGIO, ends a holder that
    # has no handler for it), the file is served.
    released = daemon.run("fcntl.fcntl(held, fcntl.F_SETLEASE, fcntl.F_UNLCK)\nos.close(held)", session_id=sid)
    assert released["status"] == "ok" or released["kernel_restarted"] is True, released
    with daemon.http() as c:
        assert c.get(url).content == b"\x89PNG\r\n\x1a\n"
