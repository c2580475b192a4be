"""The pool of template interpreters: a pooled run (a fork of a template, in a
sandbox of its own) behaves like a cold one, nothing crosses from one run to the
next, the template is out of the runs' reach, and under load the pool gives way to
cold sandboxes instead of errors or reuse."""

import concurrent.futures
import json
import os
import time
from pathlib import Path

import pytest

from conftest import new_session, stream_run
from test_api import END_OF_RUN, check_end_of_run
from test_security import PRELUDE

# Code that names a module outside the standard library (`tabulate`, which it never
# imports) goes to one of its policy's own templates, which hold the preloads; code
# that imports only the standard library goes to a bare one (pool/tier.rs).
OWN = "if False: import tabulate\n"
# Which of the default policy's preloads the run's interpreter holds.
PRELOADED = OWN + "import sys\nprint(json.dumps(sorted(m for m in ('numpy', 'pandas', 'matplotlib.pyplot') if m in sys.modules)))\n"


def pooled_run(daemon, code, **fields):
    """Run `code` in a sandbox from the pool (asserted through the pool's counters)."""
    daemon.wait_pool_ready()
    before = daemon.pool()
    result = daemon.run(code, **fields)
    after = daemon.pool()
    assert after["hits"] == before["hits"] + 1 and after["misses"] == before["misses"], (before, after, result)
    return result


@pytest.fixture(autouse=True)
def nothing_left_behind(daemon):
    yield
    daemon.assert_clean()


def test_health_reports_the_pool(daemon):
    pool = daemon.wait_pool_ready()
    assert pool["size_per_policy"] == 2 and pool["ready"] >= 2
    # Each ready sandbox holds an interpreter with numpy, pandas and pyplot imported.
    assert pool["memory_bytes"] > pool["ready"] * 30 * 2**20, pool


def test_a_pooled_run_has_the_preloads_and_the_sessions_workspace(daemon):
    with daemon.http() as c:
        sid = new_session(c)
        assert c.put(f"/v1/sessions/{sid}/files/in.txt", content=b"from the host").status_code in (200, 201)
        r = pooled_run(daemon, "import json, os\n" + PRELOADED + r'''
print(os.getcwd(), os.getuid(), os.getgid())
print(open("in.txt").read())
with open("out.txt", "w") as f:
    f.write("from the sandbox")
os.mkdir("sub")
''', session_id=sid)
        assert r["status"] == "ok", r
        lines = r["stdout"].splitlines()
        assert json.loads(lines[0]) == ["matplotlib.pyplot", "numpy", "pandas"]
        assert lines[1] == "/mnt/data 1000 1000"
        assert lines[2] == "from the host"
        assert sorted(a["path"] for a in r["artifacts"]) == ["out.txt"]
        assert c.get(f"/v1/sessions/{sid}/files/out.txt").content == b"from the sandbox"
    # On the host the new files belong to the session's uid, as after a cold run.
    data = daemon.state / "sessions" / sid / "data"
    uid = daemon.session_uid(sid)
    for name in ("out.txt", "sub"):
        st = os.stat(data / name)
        assert (st.st_uid, st.st_gid) == (uid, uid), name


def test_code_that_imports_only_the_standard_library_runs_in_a_bare_template(daemon):
    # Both are pooled (the pool's hit counter); only the code that imports beyond the
    # standard library gets the policy's preloads, and a bare fork imports what it
    # asks for as a cold interpreter would.
    daemon.wait_pool_ready("default/bare")
    look = "import json, sys\nprint(json.dumps(sorted(m for m in ('numpy', 'pandas', 'matplotlib.pyplot') if m in sys.modules)))\n"
    assert json.loads(pooled_run(daemon, look)["stdout"]) == []
    assert json.loads(pooled_run(daemon, OWN + look)["stdout"]) == ["matplotlib.pyplot", "numpy", "pandas"]
    r = pooled_run(daemon, "import json, sys\nprint('numpy' in sys.modules)\n__import__('numpy')\nprint('numpy' in sys.modules)")
    assert r["stdout"] == "True\nTrue\n", r  # a computed import goes to the policy's own
    r = pooled_run(daemon, "import importlib, sys\nprint('numpy' in sys.modules)\nprint(importlib.import_module('numpy').__name__)")
    assert r["stdout"] == "True\nnumpy\n", r
    # A bare fork is a sandbox like any other: the same limits, workspace and report.
    r = pooled_run(daemon, "import os, resource\nprint(os.getcwd(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\nraise SystemExit(4)")
    assert (r["status"], r["exit_code"], r["stdout"]) == ("error", 4, "/mnt/data 1024\n"), r


def test_the_pools_standard_library_list_is_the_rootfs_pythons(daemon):
    # pool/tier.rs sends code to a bare template by this list; a rootfs with another
    # Python needs it refreshed (print(*sorted(sys.stdlib_module_names), sep="\n")).
    listed = (Path(__file__).resolve().parents[1] / "sandboxd/src/pool/stdlib.txt").read_text().split()
    r = daemon.run("import sys\nprint(*sorted(sys.stdlib_module_names), sep='\\n')")
    assert r["stdout"].split() == listed


def test_a_pooled_run_reports_like_a_cold_one(daemon):
    r = pooled_run(daemon, "import atexit\natexit.register(lambda: print('bye'))\nprint('hi')\nraise SystemExit(3)")
    assert (r["status"], r["exit_code"], r["stdout"]) == ("error", 3, "hi\nbye\n")
    r = pooled_run(daemon, "x = 1\n\n1 / 0\n")
    assert r["status"] == "error" and r["exit_code"] == 1
    assert 'File "<code>", line 3' in r["stderr"] and "ZeroDivisionError" in r["stderr"]
    # pyplot was imported before the run: its figures are still saved.
    r = pooled_run(daemon, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\n")
    assert [a["kind"] for a in r["artifacts"]] == ["figure"] and r["artifacts"][0]["mime_type"] == "image/png"
    r = pooled_run(daemon, "import sys\nsys.stdout.write('x' * 300_000)")
    assert r["stdout_truncated"] and len(r["stdout"]) == 100 * 1024


def test_a_pooled_run_ends_like_a_cold_one(daemon):
    with daemon.http() as c:
        sid = new_session(c)
        check_end_of_run(pooled_run(daemon, END_OF_RUN, session_id=sid), c, sid)


def test_a_pooled_run_times_out_and_runs_out_of_memory_as_a_cold_one(daemon):
    r = pooled_run(daemon, "while True: pass", timeout_s=1)
    assert r["status"] == "timeout" and r["signal"] in ("SIGTERM", "SIGKILL"), r
    r = pooled_run(daemon, "x = bytearray(600 * 2**20)\nx[::4096] = b'y' * len(x[::4096])")
    assert r["status"] == "oom", r
    # The OOM killer may have picked the template: it is replaced, and the pool serves on.
    assert pooled_run(daemon, "print(1)")["stdout"] == "1\n"


def template_pids(daemon):
    """Host pids of the template interpreters: pooled Pythons whose parent is their
    sandbox's init (a fork's processes descend from the template instead)."""
    pids = []
    for p in os.listdir("/proc"):
        if not (p.isdigit() and daemon.is_pooled_python(p)):
            continue
        try:
            ppid = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        if daemon.is_pooled_python(ppid, init=True):
            pids.append(int(p))
    return sorted(pids)


FRESH = r'''
import json, os, random, numpy
print(json.dumps({"pid": os.getpid(), "tmp": os.listdir("/tmp"), "random": random.random(),
                  "numpy": float(numpy.random.rand()), "urandom": os.urandom(8).hex()}))
open("/tmp/mark", "w").write("x")
'''


def test_one_template_serves_run_after_run_each_in_a_fresh_sandbox(fresh_daemon):
    d = fresh_daemon(args=["--pool-size", "1"])
    d.wait_pool_ready()
    d.wait_pool_ready("default/bare")
    # One of the policy's own (FRESH imports numpy) and one bare template.
    template = template_pids(d)
    assert len(template) == 2
    outs = [json.loads(pooled_run(d, FRESH)["stdout"]) for _ in range(4)]
    assert [o["pid"] for o in outs] == [2] * 4 and [o["tmp"] for o in outs] == [[]] * 4
    # Each fork has its own randomness, numpy's global generator included.
    for key in ("random", "numpy", "urandom"):
        assert len({o[key] for o in outs}) == 4, key
    assert template_pids(d) == template and d.pool()["failures"] == 0
    d.assert_clean()


def test_a_run_cannot_reach_its_template(fresh_daemon):
    d = fresh_daemon(args=["--pool-size", "1"])
    d.wait_pool_ready()
    template = template_pids(d)
    # The template shares no writable memory with its forks: they get copies.
    maps = Path(f"/proc/{template[0]}/maps").read_text().splitlines()
    assert [m for m in maps if m.split()[1][1] == "w" and m.split()[1][3] == "s"] == []
    # Everything a run can signal is in its own sandbox; the template serves on.
    r = pooled_run(d, r'''
import errno, json, os, signal
def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
        return "sent"
    except OSError as e:
        return errno.errorcode[e.errno]
procs = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print(json.dumps([procs, kill(-1), kill(1)]), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
''')
    # Its /proc shows its init and itself; no other process it may signal (ESRCH);
    # its init is outside its Landlock domain (EPERM).
    assert json.loads(r["stdout"]) == [[1, 2], "ESRCH", "EPERM"] and r["signal"] == "SIGKILL", r
    assert pooled_run(d, "print(1)")["stdout"] == "1\n"
    assert template_pids(d) == template and d.pool()["failures"] == 0
    d.assert_clean()


def test_a_pooled_run_streams(daemon):
    daemon.wait_pool_ready()
    hits = daemon.pool()["hits"]
    with daemon.http() as c:
        events = [name for name, _ in stream_run(c, code="import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.2)")]
    assert events.count("stdout") >= 2 and events[-1] == "result", events
    assert daemon.pool()["hits"] == hits + 1


def test_the_pooled_sandbox_is_locked_down_like_a_cold_one(daemon):
    r = pooled_run(daemon, PRELUDE + r'''
import json
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
print(json.dumps({
    "caps": status["CapEff"].strip(), "nnp": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
    "etc": err(lambda: open("/etc/x", "w")),
    "mnt": err(lambda: open("/mnt/x", "w")),
    "umount": "ok" if libc.umount2(b"/mnt/data", 2) == 0 else errno.errorcode[ctypes.get_errno()],
    "inet": err(lambda: socket.create_connection(("1.1.1.1", 53), timeout=1)),
    "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
}))
''')
    out = json.loads(r["stdout"].splitlines()[-1])
    assert out["caps"] == "0000000000000000" and out["nnp"] == "1" and out["seccomp"] == "2"
    assert out["etc"] == "EROFS"
    assert out["mnt"] == "EROFS"  # /mnt is on the read-only rootfs
    assert out["umount"] == "EPERM"
    assert out["inet"] == "EACCES"  # Landlock denies TCP connect
    # Only the sandbox's init and this interpreter.
    assert out["procs"] == [1, 2]


def test_a_pooled_run_owns_its_proc_files_as_an_execd_one_does(daemon):
    # A cold program is made dumpable by its exec; a fork has none, and once was left
    # non-dumpable: its /proc/self files were root's, so it could not read its own
    # environ (a CI run failed on it) nor list its own fds.
    r = pooled_run(daemon, r'''
import ctypes, json, os
print(json.dumps({
    "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0),
    "environ_owner": os.stat("/proc/self/environ").st_uid,
    "environ_has_home": b"HOME=/tmp" in open("/proc/self/environ", "rb").read().split(b"\0"),
    "fds": all(str(fd) in os.listdir("/proc/self/fd") for fd in (0, 1, 2)),
}))
''')
    assert r["status"] == "ok", r["stderr"]
    out = json.loads(r["stdout"].splitlines()[-1])
    assert out == {"dumpable": 1, "environ_owner": 1000, "environ_has_home": True, "fds": True}


def test_nothing_crosses_from_one_pooled_run_to_the_next(daemon):
    first = pooled_run(daemon, r'''
import os, subprocess, numpy
open("/tmp/left-in-tmp", "w").write("x")
open("/dev/shm/left-in-shm", "w").write("x")
open("/mnt/data/first-session-file", "w").write("x")
numpy.left_in_module = True
os.environ["LEFT_IN_ENV"] = "1"
subprocess.Popen(["sleep", "300"], start_new_session=True)
print(os.getpid())
''')
    assert first["status"] == "ok", first
    second = pooled_run(daemon, r'''
import json, os, numpy
print(json.dumps({
    "tmp": sorted(os.listdir("/tmp")),
    "shm": os.listdir("/dev/shm"),
    "workspace": os.listdir("/mnt/data"),
    "module": hasattr(numpy, "left_in_module"),
    "env": "LEFT_IN_ENV" in os.environ,
    "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
}))
''')
    out = json.loads(second["stdout"])
    assert second["session_id"] != first["session_id"]
    assert "left-in-tmp" not in out["tmp"] and out["shm"] == [] and out["module"] is False and out["env"] is False
    assert out["workspace"] == ["lost+found"] or out["workspace"] == []
    assert out["procs"] == [1, 2]
    # The first run's background process died with its sandbox (assert_clean checks
    # the host too, after every test).


def test_under_load_the_pool_gives_way_to_cold_sandboxes(fresh_daemon):
    d = fresh_daemon(args=["--pool-size", "1"])
    d.wait_pool_ready()
    # Runs far longer than a cold sandbox's extra cost: the others cannot queue for
    # the busy template (they wait at most that long, then build cold sandboxes).
    code = OWN + "import os, sys, time\nassert not os.path.exists('/tmp/mark')\nopen('/tmp/mark', 'w')\ntime.sleep(3)\nprint('pandas' in sys.modules)"
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda _: d.run(code), range(8)))
    assert [r["status"] for r in results] == ["ok"] * 8, results
    preloaded = [r["stdout"] == "True\n" for r in results]
    pool = d.pool()
    assert pool["hits"] == sum(preloaded) and pool["hits"] >= 1
    assert pool["misses"] == 8 - pool["hits"] and pool["misses"] >= 1
    d.wait_pool_ready()
    d.assert_clean()


SHORT = OWN + "import os, sys\nassert not os.path.exists('/tmp/mark')\nopen('/tmp/mark', 'w')\nprint('pandas' in sys.modules)"


def burst(d, n, code=SHORT):
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        results = list(ex.map(lambda _: d.run(code), range(n)))
    assert [r["status"] for r in results] == ["ok"] * n, results
    return results


def test_a_burst_of_short_runs_waits_for_the_template_instead_of_building_cold_sandboxes(fresh_daemon):
    # One template and four short runs at once: each waits in line for the template
    # back from the run before (a cold sandbox would cost far more than the wait),
    # and each gets a fresh sandbox of its own (the mark is never there).
    d = fresh_daemon(args=["--pool-size", "1", "--pool-idle-s", "3600"])
    d.wait_pool_ready()
    results = burst(d, 4)
    assert [r["stdout"] for r in results] == ["True\n"] * 4
    pool = d.pool()
    assert (pool["hits"], pool["misses"], pool["failures"]) == (4, 0, 0), pool
    d.assert_clean()


def test_the_pool_grows_with_demand_and_shrinks_back_when_it_falls_off(fresh_daemon):
    d = fresh_daemon(args=["--pool-size", "1", "--pool-idle-s", "10"])
    d.wait_pool_ready()
    d.wait_pool_ready("default/bare")
    # One of the policy's own, and one bare that this test's runs leave alone.
    assert d.pool()["templates"] == 2
    # Four runs at once, each long enough that the others find the template busy.
    burst(d, 4, code=SHORT + "\nimport time\ntime.sleep(0.3)")
    # Four were wanted at once: the pool grows to four (one at a time, in the
    # background; the peak holds 10 s)...
    grown = d.wait_pool_ready(count=4, timeout=10)
    assert grown["templates"] == 5 and grown["memory_held_bytes"] <= grown["memory_budget_bytes"], grown
    # ...then, with nothing asked of it, gives one back every 10 s, down to its size.
    deadline = time.time() + 120
    while d.pool()["templates"] > 2:
        assert time.time() < deadline, d.pool()
        time.sleep(0.2)
    pool = d.pool()
    assert (pool["templates"], pool["ready"], pool["failures"]) == (2, 2, 0), pool
    assert "the pool shrinks" in d.log_text()
    d.assert_clean()


def test_the_pool_never_holds_more_than_its_memory_budget(fresh_daemon):
    # A budget the size asked for cannot fit: four interpreters with pandas,
    # numpy and matplotlib imported hold well over 50 MiB each (the policy's bare
    # templates, four of them, hold far less: they share the budget).
    d = fresh_daemon(args=["--pool-size", "4", "--pool-memory-mb", "200"])
    d.wait_pool_ready(count=1)
    time.sleep(8)  # the refill has had time for the others, had they fitted
    pool = d.pool()
    own = pool["ready_by_policy"].get("default", 0)
    assert pool["memory_budget_bytes"] == 200 << 20
    assert 1 <= own < 4 and pool["memory_held_bytes"] <= pool["memory_budget_bytes"], pool
    # No more would fit, at the footprint the pool measured.
    assert pool["memory_budget_bytes"] - pool["memory_held_bytes"] < 50 << 20, pool
    # What the idle templates really hold stays within it too.
    assert pool["memory_bytes"] <= pool["memory_budget_bytes"], pool
    # Runs are still served by the templates there are.
    results = burst(d, 3)
    assert all(r["stdout"] == "True\n" for r in results)
    assert d.pool()["ready_by_policy"].get("default", 0) < 4
    d.assert_clean()


def test_the_pool_refills_for_each_policy_in_use_and_can_be_turned_off(fresh_daemon):
    d = fresh_daemon()
    d.wait_pool_ready()
    # The strict policy preloads nothing: its first run is cold, then it has a pool too.
    r = d.run("import sys\nprint('pandas' in sys.modules)", policy="strict")
    assert r["stdout"] == "False\n"
    pool = d.wait_pool_ready("strict")
    assert pool["ready_by_policy"]["strict"] == 2
    before = d.pool()["hits"]
    r = d.run("print(1)", policy="strict")
    assert r["stdout"] == "1\n" and d.pool()["hits"] == before + 1
    d.stop()

    off = fresh_daemon(args=["--pool-size", "0"])
    assert off.run("print(2)")["stdout"] == "2\n"
    pool = off.pool()
    assert (pool["size_per_policy"], pool["ready"], pool["hits"], pool["misses"]) == (0, 0, 0, 0)
    off.assert_clean()


def test_stopping_the_daemon_leaves_no_pooled_sandbox(fresh_daemon):
    d = fresh_daemon()
    d.wait_pool_ready()
    d.stop()
    d.assert_clean()
    assert not any(
        Path(f"/proc/{p}/cmdline").exists() and d.is_pooled_python(p) for p in os.listdir("/proc") if p.isdigit()
    )
