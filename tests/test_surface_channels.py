"""The daemon's own surface: every channel that user code can write to the daemon
is untrusted. A kernel cell shares its process (and so its socket) with kernel.py,
a pooled run shares its process (and its socket) with the runner: what they write
there is read bounded, parsed strictly, matched to the cell, capped by the daemon,
and never decides how a run ended."""

import json
import os
import re
import threading
import time

import pytest

from conftest import new_session

# Finds the kernel's channel from inside a cell: the one socket of the process.
FIND_SOCKET = r'''
import os, socket
def is_socket(fd):
    try:
        return os.readlink("/proc/self/fd/" + fd).startswith("socket:")
    except OSError:  # the listing's own fd, closed since
        return False
fds = [int(f) for f in os.listdir("/proc/self/fd") if is_socket(f)]
assert len(fds) == 1, fds
'''


def log_mark(daemon):
    """Where the daemon's log ends now: the suite's daemon is shared, and what
    other tests logged before is not this test's."""
    return daemon.log_path.stat().st_size


def log_since(daemon, since):
    """What the daemon logged after `since` (log_mark), colours taken out."""
    with open(daemon.log_path, "rb") as f:
        f.seek(since)
        return re.sub(r"\x1b\[[0-9;]*m", "", f.read().decode(errors="replace"))


def error_lines_with(daemon, word, since):
    """ERROR lines naming `word` that the daemon logged after `since` (log_mark)."""
    return [line for line in log_since(daemon, since).splitlines() if "ERROR" in line and word in line]


class PeakRss:
    """Samples the daemon's VmRSS while in use; `peak_kib` is the highest seen."""

    def __init__(self, daemon):
        self.daemon, self.peak_kib, self.samples = daemon, 0, 0
        self.stop = threading.Event()

    def _sample(self):
        while not self.stop.is_set():
            self.peak_kib = max(self.peak_kib, self.daemon.rss_kib())
            self.samples += 1
            time.sleep(0.02)

    def __enter__(self):
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def test_a_cell_flooding_the_kernel_socket_without_a_newline_costs_the_daemon_nothing(daemon, kernel):
    sid = kernel()
    assert daemon.run("kept = 1", session_id=sid)["status"] == "ok"
    before = daemon.rss_kib()
    flood = FIND_SOCKET + r'''
s = socket.socket(fileno=os.dup(fds[0]))
chunk = b"x" * (1 << 20)
sent = 0
try:
    for _ in range(2048):  # 2 GiB, no newline
        s.sendall(chunk)
        sent += 1
except OSError:
    pass
print("sent", sent)
'''
    with PeakRss(daemon) as rss:
        t = time.time()
        r = daemon.run(flood, session_id=sid)
        took = time.time() - t
    assert rss.samples > 0
    grew_mib = (rss.peak_kib - before) / 1024
    assert grew_mib < 64, f"the daemon grew by {grew_mib:.0f} MiB"
    assert took < 30, took
    assert r["kernel_restarted"] is True and r["status"] == "error", r
    assert r["signal"] == "SIGKILL"
    assert r["stderr"].endswith(
        "sandboxd: the kernel broke the protocol (a line longer than 1048576 bytes) and was killed; "
        "the kernel was restarted and its variables are gone\n"), r["stderr"]
    # The kernel was killed before the flood was through: it never printed.
    assert "sent" not in r["stdout"]
    after = daemon.run("print('kept' in globals())", session_id=sid)
    assert after["status"] == "ok" and after["stdout"] == "False\n" and after["kernel_restarted"] is False


# A cell that forges its own end: 3 MiB of "stdout" (in 512 KiB chunks under the
# line limit) with the cell's nonce, read from the kernel's frame, then a reply.
# The cell's real output and its real reply follow, and reach the daemon during
# the next cell.
FORGE = r'''
import sys
frame = sys._getframe(1)
channel, nonce = frame.f_locals["channel"], frame.f_locals["nonce"]
for _ in range(6):
    channel.send({"kind": "chunk", "nonce": nonce, "stream": "stdout", "text": "F" * (512 * 1024)})
channel.send({"kind": "reply", "nonce": nonce, "result": {"text/plain": "'forged'"}, "exception": None,
              "exit_code": 0, "stdout_truncated": False, "stderr_truncated": False})
print("real output of the forging cell")
"real result of the forging cell"
'''


def test_a_forged_reply_is_capped_and_ends_only_its_own_cell(daemon, kernel):
    sid = kernel()
    forged = daemon.run(FORGE, session_id=sid)
    cap = 100 * 1024  # the default policy's output_kb
    assert forged["status"] == "ok" and forged["result"] == {"text/plain": "'forged'"}, forged
    assert forged["stdout"] == "F" * cap and forged["stdout_truncated"] is True
    assert forged["kernel_restarted"] is False
    # Each later cell gets its own output and result, not the one before it.
    for i in range(3):
        r = daemon.run(f"print('cell {i}')\n{i} * 10", session_id=sid)
        assert r["stdout"] == f"cell {i}\n", (i, r)
        assert r["result"] == {"text/plain": str(i * 10)}, (i, r)
        assert r["status"] == "ok" and r["kernel_restarted"] is False
    # The forging cell's real reply did come back, one cell late, and was dropped:
    # the kernel never stopped serving (its state is intact).
    assert daemon.run("print(frame is not None)", session_id=sid)["stdout"] == "True\n"


def test_a_cell_writing_garbage_on_its_socket_restarts_the_kernel_with_a_clear_error(daemon, kernel):
    mark = log_mark(daemon)
    sid = kernel()
    garbage = FIND_SOCKET + r'''
os.write(fds[0], b'{"failed": {"step": "x", "error": "evil"}}\n')
import time
time.sleep(5)
'''
    r = daemon.run(garbage, session_id=sid)
    assert r["status"] == "error" and r["kernel_restarted"] is True, r
    assert "sandboxd: the kernel broke the protocol (an unreadable message" in r["stderr"], r["stderr"]
    assert r["duration_ms"] < 5000
    assert error_lines_with(daemon, "evil", mark) == []
    assert daemon.run("print(1)", session_id=sid)["stdout"] == "1\n"


def test_a_kernel_sees_no_host_path_and_nothing_at_run(daemon, kernel):
    sid = kernel()
    r = daemon.run(FIND_SOCKET + r'''
print(open("/proc/self/mountinfo").read())
print("run:", sorted(os.listdir("/run")) if os.path.isdir("/run") else None)
print("fd0:", os.readlink("/proc/self/fd/0"))
''', session_id=sid)
    assert r["status"] == "ok", r
    mountinfo, _, rest = r["stdout"].partition("\nrun:")
    assert sid not in r["stdout"]
    assert str(daemon.state) not in r["stdout"] and str(daemon.base) not in r["stdout"]
    points = [line.split(" ")[4] for line in mountinfo.strip().splitlines()]
    assert "/mnt/data" in points and "/" in points
    assert not [p for p in points if p == "/run" or p.startswith("/run/")], points
    # /run is the rootfs's own (read-only) directory, as the daemon mounted it.
    rootfs = daemon.state / "mnt" / "rootfs"
    assert os.path.ismount(rootfs)
    assert rest.startswith(f" {sorted(os.listdir(rootfs / 'run'))}\n"), rest
    # The user's code has /dev/null as stdin, not the kernel's channel.
    assert "fd0: /dev/null" in rest
    # And the host has no socket directory for the kernel.
    assert not (daemon.state / "kernels").exists()


EVERY_FD = r'''
import os
lines = [b'{"failed":{"step":"x","error":"evil"}}\n', b'{"signal":9}\n', b'{"exit_code":7,"evil":1}\n',
         b'{"entered":true}\n', b'{"ready":{"failed":["evil"]}}\n', b'{"reaped":1}\n', b'evil' * 5000 + b'\n']
hit = []
for fd in sorted(int(f) for f in os.listdir("/proc/self/fd")):
    for line in lines:
        try:
            os.write(fd, line)
            hit.append(fd)
        except OSError:
            pass
print("wrote to", sorted(set(hit)))
'''


@pytest.mark.parametrize("ending,status,exit_code,signal", [
    ("", "ok", 0, None),
    ("raise SystemExit(3)", "error", 3, None),
    ("import signal\nos.kill(os.getpid(), signal.SIGKILL)", "killed", None, "SIGKILL"),
])
def test_a_pooled_run_forging_messages_on_every_fd_ends_as_it_really_did(daemon, ending, status, exit_code, signal):
    mark = log_mark(daemon)
    daemon.wait_pool_ready()
    before = daemon.pool()
    with daemon.http() as c:
        r = c.post("/v1/runs", json={"code": EVERY_FD + ending})
    after = daemon.pool()
    assert after["hits"] == before["hits"] + 1 and after["misses"] == before["misses"], (before, after)
    assert r.status_code == 200, r.text
    res = r.json()
    assert (res["status"], res["exit_code"], res["signal"]) == (status, exit_code, signal), res
    wrote = json.loads(res["stdout"].rsplit("wrote to ", 1)[1].splitlines()[0])
    assert 1 in wrote and 2 in wrote and len(wrote) >= 3, wrote  # stdout, stderr and the run's socket
    assert error_lines_with(daemon, "evil", mark) == []
    log = log_since(daemon, mark)
    assert "building the sandbox" not in log
    # The forged line was read, refused, and said so at info, escaped and short.
    noted = [line for line in log.splitlines()
             if "a pooled run's socket broke the protocol" in line and res["run_id"] in line]
    assert len(noted) == 1 and " INFO " in noted[0] and len(noted[0]) < 600, noted
    # The pool serves on.
    assert daemon.run("print(1)")["stdout"] == "1\n"
    daemon.wait_pool_ready()
    daemon.assert_clean()


# Makes kernel.py stop reading its channel after this cell's reply: its main thread
# sleeps for good (SIGINT ignored), as code in a cell can make it.
STOP_READING = r'''
import gc, signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
channel = [o for o in gc.get_objects() if type(o).__name__ == "Channel" and hasattr(o, "conn")][0]
original = type(channel).send
def send(message):
    original(channel, message)
    if message.get("kind") == "reply":
        while True:
            try:
                time.sleep(3600)
            except BaseException:
                pass
channel.send = send
'''


def test_a_kernel_that_stops_reading_cannot_hold_a_run_past_its_limit_nor_the_close(daemon, kernel):
    sid = kernel()
    assert daemon.run(STOP_READING, session_id=sid)["status"] == "ok"
    assert daemon.run("print('small')", session_id=sid)["stdout"] == "small\n"
    # Now nothing reads the socket: a cell bigger than its buffer (100,001 bytes of
    # code, 600 KB as JSON) cannot be written whole. The write is under the cell's
    # own time limit.
    started = time.monotonic()
    r = daemon.run("#" + "\x01" * 100_000, session_id=sid, timeout_s=3)
    took = time.monotonic() - started
    assert r["status"] == "timeout" and r["kernel_restarted"] is True, r
    assert took < 15, took
    # The session is free again, and a new kernel serves it.
    assert daemon.run("print(2)", session_id=sid)["stdout"] == "2\n"
    # The same, ended by closing the session instead of the limit.
    assert daemon.run(STOP_READING, session_id=sid)["status"] == "ok"
    assert daemon.run("print('small')", session_id=sid)["stdout"] == "small\n"
    outcome = {}

    def big_cell():
        with daemon.http(timeout=60) as c:
            outcome["run"] = c.post(f"/v1/sessions/{sid}/runs", json={"code": "#" + "\x01" * 100_000, "timeout_s": 60})
    t = threading.Thread(target=big_cell)
    t.start()
    time.sleep(1.5)
    started = time.monotonic()
    with daemon.http(timeout=30) as c:
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200
    t.join(30)
    assert not t.is_alive() and time.monotonic() - started < 15
    # Closing the session kills its kernel: the run says so.
    ended = outcome["run"]
    assert ended.status_code == 200 and ended.json()["status"] == "killed", ended.text
    assert ended.json()["kernel_restarted"] is True


def test_workspace_files_do_not_replace_the_modules_kernel_py_imports(daemon, kernel):
    mark = log_mark(daemon)
    sid = kernel()
    with daemon.http() as c:
        for name in ("threading.py", "json.py", "socket.py", "codecs.py"):
            r = c.put(f"/v1/sessions/{sid}/files/{name}", content=b'raise SystemExit("FORGED: shadowed")\n')
            assert r.status_code == 201, r.text
        assert c.put(f"/v1/sessions/{sid}/files/mymod.py", content=b"VALUE = 42\n").status_code == 201
    # The kernel starts with those files in its working directory (a first run, then
    # a restart after a crash): both times it serves, and the user's own module
    # still imports from the workspace.
    for _ in range(2):
        r = daemon.run("import mymod\nprint(mymod.VALUE)", session_id=sid)
        assert r["status"] == "ok" and r["stdout"] == "42\n", r
        crashed = daemon.run("import os\nos._exit(1)", session_id=sid)
        assert crashed["kernel_restarted"] is True, crashed
    assert error_lines_with(daemon, "FORGED", mark) == []
