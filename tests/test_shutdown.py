"""A clean stop (SIGTERM): the drain keeps answering, and nothing is left behind."""

import signal
import threading
import time

import httpx



def error_code(r):
    try:
        return r.json()["error"]["code"]
    except Exception:
        return None


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
                    if not runner.is_alive():
                        break  # the drain ended meanwhile: the listener may close now
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
