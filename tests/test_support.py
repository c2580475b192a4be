"""The Python support code (rootfs/support: sandboxd_outcome.py, shared by the runner
and the kernel) ends a run the same way in every mode: a script run in a cold
sandbox, a pooled run (a fork of a template with pyplot preloaded) and a kernel
session's cell give the same exit code for the same `sys.exit(x)` (the one Python
itself gives) and save the same figures; the support module cannot be replaced by
a workspace file; and when the runner's or the kernel's own machinery fails, the
run's stderr says why."""

import shutil

import pytest

from conftest import new_session
from harness import Daemon, scratch_dir

MODES = ["cold", "pooled", "kernel"]


@pytest.fixture(scope="module")
def cold_daemon():
    """A daemon without a pool: every run is a script run in a fresh sandbox."""
    d = Daemon(scratch_dir("support-cold-"), args=["--pool-size", "0"]).start()
    yield d
    d.stop()
    d.assert_clean()
    shutil.rmtree(d.base, ignore_errors=True)


@pytest.fixture
def modes(daemon, cold_daemon, kernel):
    """`modes(mode)` → run(code, files={name: bytes}, **fields): a run of `code` in a
    new session of that mode, with `files` in its workspace first; checks that the
    run really was cold, pooled or a kernel cell."""

    def for_mode(mode):
        d = cold_daemon if mode == "cold" else daemon
        with d.http() as c:
            sid = kernel() if mode == "kernel" else new_session(c)

        started = []

        def run(code, files=None, **fields):
            with d.http() as c:
                for name, data in (files or {}).items():
                    assert c.put(f"/v1/sessions/{sid}/files/{name}", content=data).status_code in (200, 201)
            if mode != "cold":
                d.wait_pool_ready()
            before = d.pool()
            result = d.run(code, session_id=sid, **fields)
            after = d.pool()
            hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
            # A kernel session's first cell starts its kernel in a template's fork.
            want = {"cold": (0, 0), "pooled": (1, 0), "kernel": (0, 0) if started else (1, 0)}[mode]
            assert (hits, misses) == want, (mode, before, after, result)
            # One whose kernel died has the next cell start another.
            if result.get("kernel_restarted"):
                started.clear()
            else:
                started.append(True)
            assert ("kernel_restarted" in result) == (mode == "kernel"), result
            return result

        run.sid, run.daemon = sid, d
        return run

    return for_mode


# sys.exit(x) → (exit code, what stderr holds), as `python -c "import sys; sys.exit(x)"`.
EXITS = [
    ("sys.exit(256 + 3)", 3, ""),
    ("sys.exit(-1)", 255, ""),
    ("sys.exit(2 ** 70)", 255, ""),  # past a C long: CPython exits with -1
    ("sys.exit('msg')", 1, "msg\n"),
    ("sys.exit(None)", 0, ""),
    ("sys.exit(True)", 1, ""),
    ("sys.exit(False)", 0, ""),
    ("raise SystemExit(1.5)", 1, "1.5\n"),
]


@pytest.mark.parametrize("mode", MODES)
def test_sys_exit_gives_the_exit_code_python_gives(modes, mode):
    run = modes(mode)
    got = []
    for code, _, _ in EXITS:
        r = run(f"import sys\nprint('before')\n{code}\n")
        got.append((code, r["exit_code"], r["stderr"], r["status"], r["stdout"]))
    want = [(code, exit_code, stderr, "ok" if exit_code == 0 else "error", "before\n") for code, exit_code, stderr in EXITS]
    assert got == want
    if mode == "kernel":
        # A cell's sys.exit ends the cell, not the kernel.
        r = run("print('alive')")
        assert (r["stdout"], r["kernel_restarted"]) == ("alive\n", False)


FIGURES = r"""
import matplotlib.pyplot as plt
plt.plot([1, 2]); plt.show()                      # saved by show (1), and closed
fig1 = plt.figure(); plt.plot([1, 2, 3])          # left open: saved at the end (2)
fig2 = plt.figure(); plt.plot([3, 2, 1]); plt.savefig('mine.png')  # saved by the user: not again
fig3 = plt.figure(); plt.plot([1, 1]); plt.close(fig3)            # closed: never resurrected
fig4 = plt.figure()                                                 # empty: skipped
print(len(plt.get_fignums()))
"""


def artifacts(result):
    return sorted((a["kind"], a["path"], a["mime_type"]) for a in result["artifacts"])


@pytest.mark.parametrize("mode", MODES)
def test_the_same_plotting_code_saves_the_same_figures(modes, mode):
    run = modes(mode)
    r = run(FIGURES)
    assert (r["status"], r["stdout"], r["stderr"]) == ("ok", "3\n", ""), r
    run8 = r["run_id"][:8]
    assert artifacts(r) == [
        ("figure", f"figure-{run8}-1.png", "image/png"),
        ("figure", f"figure-{run8}-2.png", "image/png"),
        ("file", "mine.png", "image/png"),
    ]
    data = run.daemon.state / "sessions" / run.sid / "data"
    for n in (1, 2):
        assert (data / f"figure-{run8}-{n}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if mode == "kernel":
        # The cell's figures were closed with it; the next cell saves its own only,
        # numbered from 1 under its own run id, and plt.show() saves again.
        again = run("plt.figure(); plt.plot([5, 6]); plt.show()\n1 + 1")
        assert artifacts(again) == [("figure", f"figure-{again['run_id'][:8]}-1.png", "image/png")]
        assert again["result"] == {"text/plain": "2"}
    # Without autosave nothing is saved, and plt.show() is matplotlib's own.
    off = run("import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()\nplt.plot([2, 1])", autosave_figures=False)
    assert off["status"] == "ok" and artifacts(off) == [], off


# Would end any process that imported it: the support module must come from the rootfs.
IMPOSTOR = b"import os\nos.write(2, b'impostor imported\\n')\nos._exit(42)\n"


@pytest.mark.parametrize("mode", MODES)
def test_a_workspace_file_does_not_replace_the_support_module(modes, mode):
    run = modes(mode)
    # Put there before the run starts (for a kernel: before its first cell starts it).
    r = run("import sys\nsys.exit(259)", files={"sandboxd_outcome.py": IMPOSTOR})
    assert (r["exit_code"], r["stderr"]) == (3, ""), r
    r = run("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nimport sandboxd_outcome\nprint(sandboxd_outcome.__file__)")
    assert (r["status"], r["stdout"], r["stderr"]) == ("ok", "/opt/sandboxd/sandboxd_outcome.py\n", ""), r
    assert [a["path"] for a in r["artifacts"] if a["kind"] == "figure"] == [f"figure-{r['run_id'][:8]}-1.png"]


# User code that breaks what the runner and the kernel need once it has returned:
# both close (or give back) file descriptors with os.close.
BREAKS_OS_CLOSE = """
import os
def close(fd):
    raise RuntimeError("os.close taken away by the user's code")
os.close = close
print("done")
"""


OPEN_OWN_OUTPUT = """
import os, subprocess
for path, text in (("/dev/stdout", "by /dev/stdout"), ("/proc/self/fd/1", "by /proc/self/fd/1"),
                   ("/dev/stderr", "by /dev/stderr")):
    with open(path, "w") as f:
        f.write(text + "\\n")
subprocess.run(["sh", "-c", "echo 'from sh' > /dev/stderr; echo 'from sh' >/dev/stdout"], check=True)
"""


@pytest.mark.parametrize("mode", MODES)
def test_a_run_opens_its_own_output_by_name(modes, mode):
    """`/dev/stdout`, `/dev/stderr` and `/proc/self/fd/N` open the run's output, as in
    a plain process (a shell's `echo x > /dev/stderr` does this): the pipes are the
    sandbox user's, not host root's."""
    r = modes(mode)(OPEN_OWN_OUTPUT)
    assert r["status"] == "ok", r
    assert r["stdout"] == "by /dev/stdout\nby /proc/self/fd/1\nfrom sh\n", r
    assert r["stderr"] == "by /dev/stderr\nfrom sh\n", r


def test_a_pooled_runners_own_failure_says_why_on_stderr(modes):
    run = modes("pooled")
    r = run(BREAKS_OS_CLOSE)
    assert (r["status"], r["exit_code"], r["stdout"]) == ("error", 70, "done\n"), r
    assert r["stderr"].startswith("sandboxd: the runner failed (exit code 70):\nTraceback"), r["stderr"]
    assert "RuntimeError: os.close taken away by the user's code\n" in r["stderr"], r["stderr"]
    # A script run never needs os.close after the user's code: it ends as the user's code did.
    cold = modes("cold")(BREAKS_OS_CLOSE)
    assert (cold["status"], cold["exit_code"], cold["stdout"], cold["stderr"]) == ("ok", 0, "done\n", "")


def test_a_kernels_own_failure_says_why_in_the_cells_stderr(modes):
    run = modes("kernel")
    run("kept = 1")
    r = run(BREAKS_OS_CLOSE)
    # (Its stdout may or may not have been drained before the kernel exited.)
    assert (r["status"], r["exit_code"], r["signal"], r["kernel_restarted"]) == ("error", 70, None, True), r
    err = r["stderr"]
    assert err.startswith("sandboxd: the kernel failed (exit code 70):\nTraceback"), err
    assert "RuntimeError: os.close taken away by the user's code\n" in err, err
    assert err.endswith("sandboxd: the kernel exited with code 70; the kernel was restarted and its variables are gone\n"), err
    after = run("print('kept' in globals())")
    assert (after["stdout"], after["kernel_restarted"]) == ("False\n", False)


def test_a_kernel_out_of_file_descriptors_says_so(modes):
    run = modes("kernel")
    # A cell that leaks file descriptors up to the limit, and keeps taking any that
    # comes free: the next cell cannot even capture its output.
    r = run("""
import os, threading, time
leaked = []
def hoard():
    while True:
        try:
            leaked.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            time.sleep(0.001)
hoard_thread = threading.Thread(target=hoard, daemon=True)
hoard_thread.start()
time.sleep(0.5)
print(len(leaked) > 100)
""")
    assert (r["status"], r["stdout"]) == ("ok", "True\n"), r
    r = run("print('never')")
    assert r["kernel_restarted"] is True and r["stdout"] == "", r
    assert r["stderr"].startswith("sandboxd: the kernel failed (exit code 70):\nTraceback"), r["stderr"]
    assert "OSError: [Errno 24] Too many open files\n" in r["stderr"], r["stderr"]
    assert run("print('fresh')")["stdout"] == "fresh\n"
