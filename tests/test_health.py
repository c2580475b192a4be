"""GET /v1/health says what is degraded: "ok" with no problems on a healthy daemon,
"degraded" with each problem named (and what to do) when a real fault is there."""

import re
import subprocess
import time

POOL_FIX = ("see the daemon's log for `could not start a pooled sandbox`; "
            "check the policy's memory_mb, pids and preload")


def health(d):
    r = d.uds().get("/v1/health")
    assert r.status_code == 200, r.text
    return r.json()


def wait_degraded(d, timeout=120):
    deadline = time.time() + timeout
    while True:
        h = health(d)
        if h["status"] != "ok":
            return h
        assert time.time() < deadline, f"health never degraded: {h}\n{d.log_text()}"
        time.sleep(0.5)


def test_a_healthy_daemon_is_ok(daemon):
    h = health(daemon)
    assert h["status"] == "ok" and h["problems"] == [], h
    # The fields that were there before are still there.
    assert re.fullmatch(r"[0-9a-f]{64}", h["rootfs_sha256"]), h
    assert h["cgroup"].startswith("cgroup v") and h["version"] and h["landlock_abi"] >= 0
    assert {"sessions", "busy_sessions", "pool"} <= set(h)
    schema = daemon.uds().get("/v1/openapi.json").json()["components"]["schemas"]
    assert {"status", "problems"} <= set(schema["Health"]["properties"])
    assert set(schema["Problem"]["properties"]) == {"name", "found", "fix"}


def test_a_pool_whose_templates_cannot_start_is_reported(fresh_daemon):
    # 16 MiB cannot hold an interpreter importing numpy, pandas and pyplot: the
    # kernel's OOM killer ends each template before it is ready.
    d = fresh_daemon(policies={"default": 'description = "too small for its preloads"\nmemory_mb = 16\n'},
                     args=["--pool-size", "1"])
    h = wait_degraded(d)
    assert h["status"] == "degraded"
    assert h["problems"] == [{
        "name": "pool",
        "found": "pooled sandboxes of policy `default` fail to start (the interpreter ended before it was ready); "
                 "its Python runs use cold sandboxes",
        "fix": POOL_FIX,
    }], h
    # Its bare templates (pool/tier.rs), which import nothing, may fit; none of its own does.
    assert h["pool"]["failures"] >= 1 and h["pool"]["ready_by_policy"].get("default", 0) == 0
    assert "could not start a pooled sandbox" in d.log_text()


def test_an_unmounted_rootfs_is_reported(fresh_daemon):
    d = fresh_daemon(args=["--pool-size", "0"])
    assert health(d)["status"] == "ok"
    rootfs = d.state / "mnt" / "rootfs"
    subprocess.run(["umount", "-l", str(rootfs)], check=True)
    h = health(d)
    assert h["status"] == "degraded"
    assert h["problems"] == [{
        "name": "rootfs",
        "found": f"the rootfs is not mounted at {rootfs}: no sandbox can start",
        "fix": "restart sandboxd (it mounts the rootfs at start); see its log if it does not come back",
    }], h
    # The rest of the report is intact.
    assert re.fullmatch(r"[0-9a-f]{64}", h["rootfs_sha256"])


def test_without_a_token_health_says_only_up_or_down(fresh_daemon):
    """With tokens, the full report (counts, pool figures, cgroup paths, the
    rootfs) needs a token; without one, over HTTP, only status and version."""
    d = fresh_daemon(tokens=["tok"], args=["--operator-tokens", "op", "--pool-size", "0"])
    full = set(health(d))
    assert {"cgroup", "sessions", "pool", "rootfs_sha256", "problems"} <= full  # the socket: everything
    with d.http() as c:
        r = c.get("/v1/health")
        assert r.status_code == 200 and r.json() == {"status": "ok", "version": health(d)["version"]}, r.text
        assert c.get("/v1/health", headers={"Authorization": "Bearer wrong"}).json().keys() == {"status", "version"}
        for token in ("tok", "op"):
            r = c.get("/v1/health", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200 and set(r.json()) == full, (token, r.text)
    # Without tokens, the HTTP listener is loopback-only and shows it all.
    open_daemon = fresh_daemon(args=["--pool-size", "0"])
    with open_daemon.http() as c:
        assert set(c.get("/v1/health").json()) == full
