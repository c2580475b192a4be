"""A clean stop (SIGTERM): the drain keeps answering, and nothing is left behind."""

import signal
import threading
import time
from pathlib import Path

import httpx

from conftest import error_code, new_session


def test_the_drain_answers_503_with_retry_after_until_the_runs_end(fresh_daemon):
    d = fresh_daemon()  # the harness gives it a 3 s grace period
    box = {}
    runner = threading.Thread(target=lambda: box.setdefault("r", d.run(
        "import time; time.sleep(1.5); print('finished')")))
    runner.start()
    kept = {"http": d.http(), "unix": d.uds()}
    for c in kept.values():
        assert c.get("/v1/health").status_code == 200  # a kept-alive connection from before the stop
    deadline = time.time() + 60
    while d.uds().get("/v1/health").json()["busy_sessions"] < 1:
        assert time.time() < deadline
        time.sleep(0.02)
    d.proc.send_signal(signal.SIGTERM)
    while d.uds().get("/v1/health").json()["status"] != "draining":
        assert time.time() < deadline
        time.sleep(0.01)

    seen = []
    while runner.is_alive():
        for name, fresh in (("http", d.http), ("unix", d.uds)):
            for c, connection in ((fresh(), "new"), (kept[name], "kept")):
                try:
                    r = c.post("/v1/runs", json={"code": "print(1)"})
                    files = c.get("/v1/sessions")
                    health = c.get("/v1/health")
                except httpx.TransportError as e:
                    # The drain ends when the run does, a moment before its answer
                    # reaches the runner thread: a refusal then is the stop, not the
                    # drain. One while the run still had time to go is a failure.
                    runner.join(0.5)
                    if not runner.is_alive():
                        break
                    raise AssertionError(f"{name} ({connection} connection) refused during the drain: {e!r}")
                seen.append((name, connection, r, files, health))
                if connection == "new":
                    c.close()
        time.sleep(0.05)
    runner.join(30)
    assert box["r"]["status"] == "ok" and box["r"]["stdout"] == "finished\n", box
    for name in ("http", "unix"):
        for connection in ("new", "kept"):
            assert any(s[:2] == (name, connection) for s in seen), f"no request on {name} ({connection}) during the drain"
    for name, connection, r, files, health in seen:
        for refused in (r, files):
            assert refused.status_code == 503 and error_code(refused) == "unavailable", (name, connection, refused.text)
            assert int(refused.headers["retry-after"]) > 0
            assert "retry" in refused.json()["error"]["message"]
        assert health.status_code == 200 and health.json()["status"] == "draining", health.text
    assert d.proc.wait(30) == 0
    for c in kept.values():
        c.close()
    d.assert_clean()


def own_cgroup_dirs():
    """This process's directory in every mounted cgroup hierarchy (v1 and v2)."""
    mounts = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        fstype, _, options = right.split(" ", 2)
        if fstype in ("cgroup", "cgroup2"):
            point = Path(left.split(" ")[4])
            ctrls = set(options.split(",")) if fstype == "cgroup" else set()
            mounts[point] = (fstype, ctrls)
    dirs = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        wanted = set(ctrls.split(",")) if ctrls else set()
        for point, (fstype, have) in mounts.items():
            if (not wanted and fstype == "cgroup2") or (wanted and wanted <= have):
                dirs.append(point / path.lstrip("/"))
    return dirs


def test_a_clean_stop_leaves_no_cgroup_directory(fresh_daemon):
    d = fresh_daemon()
    d.wait_pool_ready()
    assert d.run("print('pooled')")["stdout"] == "pooled\n"
    assert d.run("echo cold", language="shell")["stdout"] == "cold\n"
    with d.http() as c:
        sid = new_session(c, mode="kernel")
        assert c.post(f"/v1/sessions/{sid}/runs", json={"code": "x = 41"}).status_code == 200
        assert c.post(f"/v1/sessions/{sid}/runs", json={"code": "x + 1"}).json()["result"]["text/plain"] == "42"
    hierarchies = own_cgroup_dirs()
    made = [h / d.instance for h in hierarchies if (h / d.instance).is_dir()]
    # memory, cpu, pids and the controller-less cgroup2 of a hybrid host (or one, on v2)
    assert made, f"the daemon made no instance directory in {hierarchies}"
    d.stop()
    assert d.proc.returncode == 0
    left = [str(h / d.instance) for h in hierarchies if (h / d.instance).exists()]
    assert left == [], f"cgroup directories left after a clean stop: {left}"
