"""Kernel sessions: one interpreter per session, its state kept across runs."""

import os
import subprocess
import time

import pytest

from conftest import new_session, stream_run


def cell(daemon, sid, code, **kw):
    return daemon.run(code, session_id=sid, **kw)


def test_a_cell_streams_its_output_and_late_output_stays_out(daemon, kernel):
    sid = kernel()
    with daemon.http() as c:
        # A background process of this cell writes only after the next cell started.
        first = stream_run(c, session_id=sid, code=(
            "import subprocess, sys, time\nsubprocess.Popen(['sh', '-c', 'sleep 2; echo late'])\n"
            "for i in range(3):\n    print(f'line {i}', flush=True)\n    time.sleep(0.3)\n"
            "print('oops', file=sys.stderr)\n'é' * 2"))
        second = stream_run(c, session_id=sid, code="import time\ntime.sleep(2)\nprint('second')")
    out = "".join(e["text"] for n, e in first if n == "stdout")
    err = "".join(e["text"] for n, e in first if n == "stderr")
    assert out == "line 0\nline 1\nline 2\n" and err == "oops\n"
    assert [n for n, _ in first].count("stdout") >= 3  # in pieces, as printed
    name, result = first[-1]
    assert name == "result" and result["status"] == "ok" and result["stdout"] == out
    assert result["result"] == {"text/plain": "'éé'"}
    # "late" went to the first cell's pipe, which nobody streams any more.
    assert {n for n, _ in second[:-1]} == {"stdout"} and "".join(e["text"] for _, e in second[:-1]) == "second\n"
    assert second[-1][0] == "result" and second[-1][1]["stdout"] == "second\n"


def test_state_persists_and_final_expressions_are_returned(daemon, kernel):
    sid = kernel()
    with daemon.http() as c:
        assert c.get(f"/v1/sessions/{sid}").json()["mode"] == "kernel"
    first = cell(daemon, sid, "x = 21 * 2")
    assert first["status"] == "ok" and first["result"] is None and first["exception"] is None
    assert first["kernel_restarted"] is False
    second = cell(daemon, sid, "print(x)\nx + 1")
    assert second["stdout"] == "42\n" and second["result"] == {"text/plain": "43"}
    df = cell(daemon, sid, "import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    assert "<table" in df["result"]["text/html"] and "a" in df["result"]["text/plain"]
    # Output from C code and subprocesses is captured per cell too.
    sub = cell(daemon, sid, "import os, sys\nos.system('echo from-shell')\nsys.stderr.write('err\\n')")
    assert sub["stdout"] == "from-shell\n" and sub["stderr"] == "err\n"


def test_exceptions_keep_cell_line_numbers(daemon, kernel):
    sid = kernel()
    r = cell(daemon, sid, "a = 1\nb = 0\na / b\n")
    assert r["status"] == "error"
    exc = r["exception"]
    assert exc["name"] == "ZeroDivisionError" and exc["value"] == "division by zero"
    assert 'line 3' in exc["traceback"] and "a / b" in exc["traceback"] and "kernel.py" not in exc["traceback"]
    assert "ZeroDivisionError" in r["stderr"]
    assert cell(daemon, sid, "print(a)")["stdout"] == "1\n"


def test_timeout_interrupts_and_keeps_state(daemon, kernel):
    sid = kernel()
    r = cell(daemon, sid, "import time\ny = 5\ntime.sleep(60)", timeout_s=2)
    assert r["status"] == "timeout" and r["kernel_restarted"] is False
    assert r["exception"]["name"] == "KeyboardInterrupt"
    assert cell(daemon, sid, "print(y)")["stdout"] == "5\n"


def test_code_ignoring_the_interrupt_is_killed_and_the_kernel_restarted(daemon, kernel):
    sid = kernel()
    cell(daemon, sid, "kept = 1")
    r = cell(daemon, sid, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass", timeout_s=2)
    assert r["status"] == "timeout" and r["kernel_restarted"] is True
    after = cell(daemon, sid, "print('kept' in globals())")
    assert after["stdout"] == "False\n" and after["kernel_restarted"] is False


def test_oom_restarts_the_kernel(daemon, kernel):
    sid = kernel(policy="tiny")
    r = cell(daemon, sid, "blocks = []\nwhile True:\n    blocks.append(b'x' * (16 << 20))")
    assert r["status"] == "oom" and r["kernel_restarted"] is True
    assert cell(daemon, sid, "print('alive')")["stdout"] == "alive\n"


def test_a_kernel_that_ends_on_its_own_is_reported_as_it_ended_not_as_killed(daemon, kernel):
    sid = kernel()
    cell(daemon, sid, "kept = 1")
    # An exit of the kernel's own (70 is kernel.py's own failure): that exit code, no signal.
    for code in (70, 3):
        r = cell(daemon, sid, f"import os\nos._exit({code})")
        assert (r["status"], r["exit_code"], r["signal"], r["kernel_restarted"]) == ("error", code, None, True), r
        assert r["stderr"] == (f"sandboxd: the kernel exited with code {code}; "
                               "the kernel was restarted and its variables are gone\n"), r
    # A signal it sent itself: that signal.
    r = cell(daemon, sid, "import os, signal\nos.kill(os.getpid(), signal.SIGUSR1)")
    assert (r["status"], r["exit_code"], r["signal"], r["kernel_restarted"]) == ("killed", None, "SIGUSR1", True), r
    assert r["stderr"].endswith("sandboxd: the kernel was killed by SIGUSR1; "
                                "the kernel was restarted and its variables are gone\n"), r
    # Each time a new kernel serves the next cell, without the old one's variables.
    after = cell(daemon, sid, "print('kept' in globals())")
    assert (after["status"], after["stdout"], after["kernel_restarted"]) == ("ok", "False\n", False), after


def test_figures_are_artifacts_of_their_cell(daemon, kernel):
    sid = kernel()
    r = cell(daemon, sid, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])")
    figs = [a for a in r["artifacts"] if a["kind"] == "figure"]
    assert len(figs) == 1 and figs[0]["path"].startswith(f"figure-{r['run_id'][:8]}-")
    again = cell(daemon, sid, "1 + 1")
    assert again["artifacts"] == [] and again["result"] == {"text/plain": "2"}


def test_shell_runs_beside_the_kernel_and_closing_ends_it(daemon, kernel):
    sid = kernel()
    with daemon.http() as c:
        cell(daemon, sid, "open('from_kernel.txt', 'w').write('k')\nz = 3")
        sh = daemon.run("cat from_kernel.txt", language="shell", session_id=sid)
        assert sh["stdout"] == "k" and "kernel_restarted" not in sh
        pid, uid = daemon.kernel_process(sid)
        assert cell(daemon, sid, "print(z)")["stdout"] == "3\n", "the kernel lives between runs"
        assert os.path.exists(f"/proc/{pid}")
        assert c.delete(f"/v1/sessions/{sid}").json() == {"status": "closed"}
    # Nothing of its uid is left: the kernel, and the template it may have started in.
    assert processes_left(uid) == b""
    daemon.assert_clean()


def processes_left(uid, within=10.0):
    """What `pgrep -u uid` finds once the processes killed with a sandbox are gone
    (those killed a moment ago may still be zombies waiting for their parent)."""
    deadline = time.time() + within
    while True:
        left = subprocess.run(["pgrep", "-u", str(uid)], capture_output=True).stdout
        if not left or time.time() > deadline:
            return left
        time.sleep(0.05)


PRELOAD = ("numpy", "pandas", "matplotlib")
# A first cell that asks for the preload: what was imported before its own import.
FIRST = f"import sys\nbefore = [m for m in {PRELOAD!r} if m in sys.modules]\nimport pandas\nbefore"


# What the kernel's process sees around it: the processes of its pid namespace, its
# working directory, and whether the sandbox's support directory is on sys.path.
SANDBOX = ("import os, sys\n"
           "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.getcwd(), '/opt/sandboxd' in sys.path)")


def test_a_new_kernel_starts_in_a_template_that_imported_the_preload(daemon, kernel):
    sid = kernel()
    pool_before = daemon.pool()
    first = cell(daemon, sid, "x = 1\n" + FIRST)
    assert (first["status"], first["result"]) == ("ok", {"text/plain": repr(list(PRELOAD))}), first
    # The same sandbox as a cold kernel's: its own pid namespace (the init and the
    # kernel, nothing of the template's), the session's workspace, its state kept.
    sandbox = cell(daemon, sid, SANDBOX)
    assert sandbox["stdout"] == "[1, 2] /mnt/data False\n", sandbox
    assert cell(daemon, sid, "x + 1")["result"] == {"text/plain": "2"}
    pid, uid = daemon.kernel_process(sid)
    # It runs as its template's uid, from the pool's range, not a session's.
    assert uid != daemon.session_uid(sid)
    # The template left the pool for good, and the pool made another; health
    # counts it apart while the kernel lives.
    daemon.wait_pool_ready(count=pool_before["ready_by_policy"]["default"])
    pool = daemon.pool()
    assert (pool["busy"], pool["kernel_templates"]) == (0, pool_before["kernel_templates"] + 1), (pool_before, pool)
    with daemon.http() as c:
        assert c.delete(f"/v1/sessions/{sid}").json() == {"status": "closed"}
    # Closing the session ends the kernel and its template: nothing of its uid is left.
    assert processes_left(uid) == b""
    assert not os.path.exists(f"/proc/{pid}")
    assert daemon.pool()["kernel_templates"] == pool_before["kernel_templates"]


def test_a_kernel_starts_cold_when_the_pool_has_no_template_for_it(fresh_daemon):
    d = fresh_daemon(args=["--pool-size", "0"])
    with d.http() as c:
        sid = new_session(c, mode="kernel")
    first = cell(d, sid, FIRST)
    assert (first["status"], first["result"]) == ("ok", {"text/plain": "[]"}), first
    sandbox = cell(d, sid, SANDBOX)
    assert sandbox["stdout"] == "[1, 2] /mnt/data False\n", sandbox
    assert d.kernel_process(sid)[1] == d.session_uid(sid)


def test_a_cell_cancelled_while_its_kernel_starts_is_stopped_and_the_session_lives_on(fresh_daemon):
    # Without a pool the kernel starts cold (a new interpreter): the cancel comes
    # while it starts, or just after, in its first cell; either way the cell is
    # stopped, never answered as if its session were gone.
    import threading

    d = fresh_daemon(args=["--pool-size", "0"])
    with d.http() as c:
        sid = new_session(c, mode="kernel")
    results = []
    cell_thread = threading.Thread(target=lambda: results.append(cell(d, sid, "import time\ntime.sleep(30)")))
    cell_thread.start()
    with d.http() as c:
        deadline = time.time() + 10
        while not c.get(f"/v1/sessions/{sid}").json()["busy"] and time.time() < deadline:
            time.sleep(0.005)
        assert c.delete(f"/v1/sessions/{sid}/run").json() == {"status": "cancelled"}
    cell_thread.join(60)
    r = results[0]
    assert (r["status"], r["signal"], r["exit_code"]) == ("killed", "SIGKILL", None), r
    assert r["stderr"] in (
        "sandboxd: the run was stopped before its kernel started; nothing of it ran\n",
        "sandboxd: the run was stopped; the kernel was restarted and its variables are gone\n",
    ), r
    # The session lives on, and its next cell starts a kernel.
    with d.http() as c:
        assert c.get(f"/v1/sessions/{sid}").status_code == 200
    after = cell(d, sid, "print('alive')")
    assert (after["status"], after["stdout"]) == ("ok", "alive\n"), after
