"""`GET /metrics`: the Prometheus text format, parsed with the Prometheus project's
own parser. Runs of each outcome move their counters by exactly that much; with
`tokens`, HTTP needs one; `metrics_listen` serves the route alone, without a token."""

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import error_code, new_session
from harness import free_port

PARTS = ("_bucket", "_count", "_sum", "_total", "_created")


def scrape(client):
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4"), r.headers
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def moved(before, after):
    """{(name, labels): delta} of every sample that changed (histogram parts aside)."""
    out = {}
    for key in set(before) | set(after):
        d = after.get(key, 0.0) - before.get(key, 0.0)
        if d and not key[0].endswith(("_bucket", "_sum", "_created")):
            out[key] = d
    return out


@pytest.fixture
def own(fresh_daemon):
    """A daemon of the test's own: nothing else moves its counters."""
    d = fresh_daemon(args=["--pool-size", "1"])
    d.wait_pool_ready(count=1)
    return d




def runs(status, language="python", mode="cold"):
    return ("sandboxd_runs_total", tuple(sorted({"status": status, "language": language, "mode": mode}.items())))


def test_each_outcome_moves_its_counters_by_exactly_one(own):
    with own.uds() as c:
        before = scrape(c)
        assert before[("sandboxd_pool_idle_templates", (("policy", "default"),))] == 1
        # A pooled hit (the pool holds one ready template of the default policy).
        r = own.run("print(1)", client=own.uds())
        assert r["status"] == "ok", r
        # Shell runs are cold: ok, error, timeout.
        assert own.run("true", language="shell", client=own.uds())["status"] == "ok"
        assert own.run("exit 3", language="shell", client=own.uds())["status"] == "error"
        assert own.run("sleep 5", language="shell", timeout_s=0.5, client=own.uds())["status"] == "timeout"
        # An OOM in the harness's "tiny" policy (the pool keeps no template for it yet: cold).
        hog = "blocks = []\nwhile True:\n    blocks.append(b'x' * (16 << 20))\n"
        oom = own.run(hog, policy="tiny", client=own.uds())
        assert oom["status"] == "oom", oom
        # A 404 of the API.
        assert error_code(c.get("/v1/sessions/nope")) == "session_not_found"
        after = scrape(c)

    got = moved(before, after)
    want = {
        runs("ok", mode="pooled"): 1,
        runs("ok", "shell"): 1,
        runs("error", "shell"): 1,
        runs("timeout", "shell"): 1,
        runs("oom"): 1,
        ("sandboxd_oom_kills_total", ()): 1,
        ("sandboxd_timeouts_total", ()): 1,
        ("sandboxd_api_errors_total", (("code", "session_not_found"),)): 1,
        ("sandboxd_pool_hits_total", ()): 1,
        # The OOM run found no template of its policy.
        ("sandboxd_pool_misses_total", ()): 1,
        # Each run above made a session of its own.
        ("sandboxd_sessions", (("mode", "script"),)): 5,
        # The latency histograms saw each run once.
        ("sandboxd_run_queue_wait_seconds_count", (("mode", "pooled"),)): 1,
        ("sandboxd_run_setup_seconds_count", (("mode", "pooled"),)): 1,
        ("sandboxd_run_execution_seconds_count", (("mode", "pooled"),)): 1,
        ("sandboxd_run_queue_wait_seconds_count", (("mode", "cold"),)): 4,
        ("sandboxd_run_setup_seconds_count", (("mode", "cold"),)): 4,
        ("sandboxd_run_execution_seconds_count", (("mode", "cold"),)): 4,
        ("sandboxd_run_workspace_walk_seconds_count", (("mode", "pooled"), ("when", "before"))): 1,
        ("sandboxd_run_workspace_walk_seconds_count", (("mode", "pooled"), ("when", "after"))): 1,
        ("sandboxd_run_workspace_walk_seconds_count", (("mode", "cold"), ("when", "before"))): 4,
        ("sandboxd_run_workspace_walk_seconds_count", (("mode", "cold"), ("when", "after"))): 4,
        # Each run's whole time in the daemon, once.
        ("sandboxd_run_handling_seconds_count", ()): 5,
    }
    # The pool's idle gauges may move while it refills: compare the rest exactly.
    got = {k: v for k, v in got.items() if k[0] not in ("sandboxd_pool_idle_templates", "sandboxd_ready_sandboxes")}
    assert got == want


def ready_sandboxes(client, want, within=10.0):
    """The ready slots, once they are `want` (or what they are after `within` s)."""
    deadline = time.monotonic() + within
    while True:
        n = value(scrape(client), "sandboxd_ready_sandboxes")
        if n == want or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


def test_the_ready_sandboxes_are_made_again_after_runs_take_them_or_use_them_up(fresh_daemon):
    """`ready_sandboxes` slots are kept made: a cold run takes one and another is
    made behind it; a run whose slot held many tasks (an install's uv, a program
    that forks), which cannot be used again, is replaced too."""
    d = fresh_daemon(args=["--ready-sandboxes", "3", "--pool-size", "0"])
    with d.uds() as c:
        assert ready_sandboxes(c, 3) == 3
        # Twenty processes at once: the slot's task peak is past what a reused slot may keep.
        busy = d.run("for i in $(seq 20); do sleep 0.2 & done; wait", language="shell", client=d.uds())
        assert busy["status"] == "ok" and busy["usage"]["pids_peak"] >= 20, busy
        assert ready_sandboxes(c, 3) == 3
        for _ in range(3):
            assert d.run("true", language="shell", client=d.uds())["status"] == "ok"
        assert ready_sandboxes(c, 3) >= 3


def test_kernel_cells_are_counted_by_mode(own):
    with own.uds() as c:
        sid = new_session(c, mode="kernel")
        before = scrape(c)
        assert value(before, "sandboxd_sessions", mode="kernel") == 1
        for code in ("x = 1", "x", "1/0"):
            own.run(code, session_id=sid, client=own.uds())
        after = scrape(c)
    got = moved(before, after)
    assert got[runs("ok", mode="kernel")] == 2 and got[runs("error", mode="kernel")] == 1, got
    assert got[("sandboxd_run_execution_seconds_count", (("mode", "kernel"),))] == 3, got


def test_an_operator_token_is_needed_over_http_and_not_on_the_metrics_address(fresh_daemon):
    """The metrics are every tenant's figures: with tokens, HTTP needs an operator
    token (a tenant's is 403); the socket without a token and the metrics_listen
    address (the operator chose to expose it) need none."""
    port = free_port()
    d = fresh_daemon(tokens=["t0ken"], args=["--operator-tokens", "0perator", "--metrics-listen", f"127.0.0.1:{port}",
                                             "--pool-size", "0"])
    with d.http() as c:
        r = c.get("/metrics")
        assert r.status_code == 401 and error_code(r) == "unauthorized", r.text
    with d.http(token="wrong") as c:
        assert c.get("/metrics").status_code == 401
    with d.http(token="t0ken") as c:
        r = c.get("/metrics")
        assert r.status_code == 403 and error_code(r) == "forbidden", r.text
        assert "operator_tokens" in r.json()["error"]["message"]
        # The tenant's own routes work.
        assert c.get("/v1/sessions").status_code == 200
    with d.http(token="0perator") as c:
        samples = scrape(c)
        assert value(samples, "sandboxd_api_errors_total", code="unauthorized") == 2
        assert value(samples, "sandboxd_api_errors_total", code="forbidden") == 1
        # An operator token is also an API token, with an id space of its own.
        assert c.post("/v1/sessions", json={"id": "mine"}).status_code == 201
    with d.http(token="t0ken") as c:
        assert c.get("/v1/sessions/mine").status_code == 404
    # The Unix socket (its file mode is the access control) needs no token.
    with d.uds() as c:
        scrape(c)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as m:
        samples = scrape(m)
        assert value(samples, "sandboxd_api_errors_total", code="unauthorized") == 2
        # Only /metrics is served there: no API.
        r = m.get("/v1/sessions")
        assert r.status_code == 404 and error_code(r) == "not_found", r.text
        assert m.post("/v1/runs", json={"code": "print(1)"}).status_code in (404, 405)
        # The surface guard still checks Host (DNS rebinding).
        r = m.get("/metrics", headers={"Host": "evil.example"})
        assert r.status_code == 403 and error_code(r) == "forbidden", r.text
