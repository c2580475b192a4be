"""The v1 API through the real Unix socket and HTTP: routes, shapes, every error
code, sessions, files, artifacts, streaming, tokens, restarts and concurrency."""

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import new_session, stream_run


JSON = {"Content-Type": "application/json"}


def error_code(r):
    return r.json()["error"]["code"]


def test_health_and_openapi(daemon):
    with daemon.uds() as c:
        h = c.get("/v1/health").json()
        assert h["status"] == "ok" and h["version"]
        doc = c.get("/v1/openapi.json").json()
    paths = doc["paths"]
    for p in ["/v1/health", "/v1/runs", "/v1/sessions", "/v1/sessions/{id}", "/v1/sessions/{id}/runs",
              "/v1/sessions/{id}/files", "/v1/sessions/{id}/files/{path}"]:
        assert p in paths, p
    assert set(paths["/v1/sessions/{id}/files/{path}"]) == {"get", "put", "delete"}
    assert "RunResult" in doc["components"]["schemas"]


def test_run_result_shape_and_new_session(daemon):
    with daemon.http() as c:
        r = c.post("/v1/runs", json={"code": "import sys\nprint('out')\nprint('err', file=sys.stderr)"})
        assert r.status_code == 200
        res = r.json()
        assert set(res) == {"run_id", "session_id", "status", "exit_code", "signal", "stdout", "stderr",
                            "stdout_truncated", "stderr_truncated", "duration_ms", "artifacts", "artifacts_truncated", "usage"}
        assert (res["status"], res["exit_code"], res["signal"]) == ("ok", 0, None)
        assert (res["stdout"], res["stderr"]) == ("out\n", "err\n")
        # The new session exists and the next run reuses it.
        assert c.get(f"/v1/sessions/{res['session_id']}").status_code == 200


def test_statuses_error_and_killed(daemon):
    assert daemon.run("import sys; sys.exit(3)")["status"] == "error"
    assert daemon.run("import sys; sys.exit(3)")["exit_code"] == 3
    killed = daemon.run("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert (killed["status"], killed["signal"], killed["exit_code"]) == ("killed", "SIGKILL", None)
    shell = daemon.run("echo hi; exit 4", language="shell")
    assert (shell["status"], shell["exit_code"], shell["stdout"]) == ("error", 4, "hi\n")


def test_invalid_utf8_output_is_decoded_lossily(daemon):
    res = daemon.run("import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe end\\n')")
    assert res["stdout"] == "ok \ufffd\ufffd end\n"


def test_request_errors(daemon):
    with daemon.http() as c:
        cases = [
            (c.post("/v1/runs", content=b"{not json", headers=JSON), 400, "invalid_request"),
            (c.post("/v1/runs", content=b"", headers=JSON), 400, "invalid_request"),
            (c.post("/v1/runs", json={"code": "1", "bogus": 1}), 400, "invalid_request"),
            (c.post("/v1/runs", json={"nocode": 1}), 400, "invalid_request"),
            (c.post("/v1/runs", json={"code": "1", "language": "ruby"}), 400, "invalid_request"),
            (c.post("/v1/runs", json={"code": "1", "timeout_s": 0}), 400, "invalid_request"),
            (c.post("/v1/runs", json={"code": "1", "timeout_s": 10_000}), 400, "invalid_request"),
            (c.post("/v1/runs", json={"code": "1", "policy": "nope"}), 400, "policy_not_found"),
            (c.post("/v1/runs", json={"code": "1", "session_id": "bad id!"}), 400, "invalid_session_id"),
            (c.post("/v1/runs", json={"code": "1", "session_id": "missing"}), 404, "session_not_found"),
            (c.post("/v1/runs", json={"code": "x" * (101 * 1024)}), 413, "code_too_large"),
            (c.get("/v1/nothing"), 404, "not_found"),
            (c.post("/v1/sessions", json={"id": "x" * 65}), 400, "invalid_session_id"),
            (c.post("/v1/sessions", json={"policy": "nope"}), 400, "policy_not_found"),
            (c.post("/v1/sessions", json={"mode": "weird"}), 400, "invalid_request"),
            (c.get("/v1/sessions/missing"), 404, "session_not_found"),
            (c.delete("/v1/sessions/missing"), 404, "session_not_found"),
            (c.post("/v1/sessions/missing/runs", json={"code": "1"}), 404, "session_not_found"),
        ]
        for r, status, code in cases:
            assert r.status_code == status, (r.request.url, r.text)
            body = r.json()
            assert body["error"]["code"] == code, body
            assert len(body["error"]["message"]) > 10
        # The daemon is still healthy after all that.
        assert c.get("/v1/health").status_code == 200


def test_sessions_lifecycle(daemon):
    with daemon.uds() as c:
        r = c.post("/v1/sessions", json={"id": "life-1", "policy": "strict", "ttl_s": 600})
        assert r.status_code == 201
        s = r.json()
        assert (s["id"], s["policy"], s["mode"], s["ttl_s"], s["busy"]) == ("life-1", "strict", "script", 600, False)
        assert s["created_at"].endswith("Z")
        dup = c.post("/v1/sessions", json={"id": "life-1"})
        assert (dup.status_code, error_code(dup)) == (409, "session_exists")
        assert "life-1" in [x["id"] for x in c.get("/v1/sessions").json()]
        assert c.post("/v1/sessions", content=b"").status_code == 201  # an empty body is fine
        r = c.delete("/v1/sessions/life-1")
        assert (r.status_code, r.json()) == (200, {"status": "closed"})
        assert c.get("/v1/sessions/life-1").status_code == 404
        assert not (daemon.state / "sessions" / "life-1").exists()


def test_files_persist_across_runs_and_policy_is_fixed(daemon):
    with daemon.http() as c:
        sid = new_session(c, policy="strict")
        c.post(f"/v1/sessions/{sid}/runs", json={"code": "open('keep.txt','w').write('kept')"})
        r = c.post(f"/v1/sessions/{sid}/runs", json={"code": "print(open('keep.txt').read())"})
        assert r.json()["stdout"] == "kept\n"
        r = c.post(f"/v1/sessions/{sid}/runs", json={"code": "1", "policy": "default"})
        assert (r.status_code, error_code(r)) == (400, "invalid_request")
        r = c.post(f"/v1/sessions/{sid}/runs", json={"code": "1", "session_id": "other"})
        assert (r.status_code, error_code(r)) == (400, "invalid_request")


def test_busy_session_and_close_kills_the_run(daemon):
    with daemon.http() as c:
        sid = new_session(c)
    box = {}

    def long_run():
        box["result"] = daemon.run(
            "import time\nprint('start', flush=True)\nopen('started', 'w').close()\ntime.sleep(30)", session_id=sid
        )

    t = threading.Thread(target=long_run)
    t.start()
    with daemon.http() as c:
        started_marker = daemon.state / "sessions" / sid / "data" / "started"
        deadline = time.time() + 10
        while not started_marker.exists() and time.time() < deadline:
            time.sleep(0.02)
        assert c.get(f"/v1/sessions/{sid}").json()["busy"]
        started = time.time()
        r = c.post(f"/v1/sessions/{sid}/runs", json={"code": "print(1)"})
        assert (r.status_code, error_code(r)) == (409, "session_busy")
        assert time.time() - started < 1
        r = c.delete(f"/v1/sessions/{sid}")
        assert r.json() == {"status": "closed"}
    t.join(15)
    assert box["result"]["status"] == "killed"
    assert box["result"]["stdout"] == "start\n"
    daemon.assert_clean()


def test_max_sessions_and_ttl(fresh_daemon):
    d = fresh_daemon(args=["--max-sessions", "2"])
    with d.http() as c:
        new_session(c, ttl_s=1)
        busy = new_session(c, ttl_s=1)
        r = c.post("/v1/sessions", json={})
        assert (r.status_code, error_code(r)) == (429, "max_sessions")
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("r", d.run("import time; time.sleep(9)", session_id=busy)))
        t.start()
        time.sleep(8)  # the reaper runs every 5 s
        ids = [s["id"] for s in c.get("/v1/sessions").json()]
        assert ids == [busy], "the idle session expires; the busy one never does"
        t.join()
        assert box["r"]["status"] == "ok"
        assert c.post("/v1/sessions", json={}).status_code == 201


def test_upload_download_list_delete(daemon):
    with daemon.http() as c:
        sid = new_session(c)
        r = c.put(f"/v1/sessions/{sid}/files/data/in.csv", content=b"a,b\n1,2\n")
        assert r.status_code == 201 and r.json()["path"] == "data/in.csv"
        again = c.put(f"/v1/sessions/{sid}/files/data/in.csv", content=b"x")
        assert (again.status_code, error_code(again)) == (409, "file_exists")
        assert c.put(f"/v1/sessions/{sid}/files/data/in.csv?overwrite=true", content=b"a,b\n3,4\n").status_code == 201
        run = c.post(f"/v1/sessions/{sid}/runs", json={"code": "import pandas as pd\nprint(pd.read_csv('data/in.csv').a.sum())"})
        assert run.json()["stdout"] == "3\n"
        listing = c.get(f"/v1/sessions/{sid}/files").json()
        entry = next(e for e in listing if e["path"] == "data/in.csv")
        assert entry["size_bytes"] == 8 and entry["mime_type"] == "text/csv"
        assert entry["url"] == f"{daemon.url}/v1/sessions/{sid}/files/data/in.csv" and entry["modified_at"]
        got = c.get(f"/v1/sessions/{sid}/files/data/in.csv")
        assert got.content == b"a,b\n3,4\n"
        assert got.headers["content-type"].startswith("text/csv")
        assert got.headers["content-disposition"].startswith("inline")
        assert c.delete(f"/v1/sessions/{sid}/files/data/in.csv").status_code == 200
        r = c.get(f"/v1/sessions/{sid}/files/data/in.csv")
        assert (r.status_code, error_code(r)) == (404, "not_found")
        r = c.delete(f"/v1/sessions/{sid}/files/data")
        assert (r.status_code, error_code(r)) == (400, "invalid_path")


def test_large_download_streams(daemon):
    with daemon.http() as c:
        sid = new_session(c)
        c.post(f"/v1/sessions/{sid}/runs", json={"code": "open('big.bin','wb').write(bytes(range(256)) * 4096 * 64)"})
        with c.stream("GET", f"/v1/sessions/{sid}/files/big.bin") as r:
            assert r.status_code == 200
            total = sum(len(chunk) for chunk in r.iter_bytes())
        assert total == 256 * 4096 * 64


def raw_request(port, method, path, body=b""):
    """Send a request byte for byte (no client normalises the path); return (status, json)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload or b"null")


def test_path_traversal_in_every_encoding_is_refused(daemon):
    with daemon.http() as c:
        sid = new_session(c)
    for raw in ["..%2f..%2fetc%2fpasswd", "%2e%2e/%2e%2e/etc/passwd", "a%00b", "%2fetc%2fpasswd",
                "a/%2e%2e/%2e%2e/x", "../../etc/passwd", "./a", "a//b", "%2E%2E%2F"]:
        for method in ("GET", "PUT", "DELETE"):
            status, body = raw_request(daemon.port, method, f"/v1/sessions/{sid}/files/{raw}", b"x" if method == "PUT" else b"")
            assert (status, body["error"]["code"]) == (400, "invalid_path"), (method, raw, status, body)
    # Nothing was written anywhere: the session's workspace was not even made
    # (a path is checked before the workspace is mounted).
    session = daemon.state / "sessions" / sid
    assert sorted(p.name for p in session.iterdir()) == ["session.json"]
    data = session / "data"
    # A path is decoded once: what still looks encoded is a name, written in the
    # workspace as that one name (sandboxed code can make such names too).
    for raw, name in [("%252e%252e%252fetc%252fpasswd", "%2e%2e%2fetc%2fpasswd"), ("a%5c..%5cb", "a\\..\\b")]:
        status, body = raw_request(daemon.port, "PUT", f"/v1/sessions/{sid}/files/{raw}", b"x")
        assert (status, body["path"]) == (201, name.replace("\\", "\\\\")), (raw, body)
        assert sorted(p.name for p in data.iterdir()) == [name]
        assert raw_request(daemon.port, "DELETE", f"/v1/sessions/{sid}/files/{raw}")[0] == 200
    assert list(data.iterdir()) == []


def test_upload_limit(daemon):
    with daemon.http() as c:
        sid = new_session(c, policy="tiny")  # upload_mb = 2
        # The client is still sending when the limit is hit: it must read the answer
        # (the daemon drains the rest), never a reset connection. Repeated: it was a race.
        for _ in range(10):
            r = c.put(f"/v1/sessions/{sid}/files/big.bin", content=b"\0" * (3 << 20))
            assert (r.status_code, error_code(r)) == (413, "upload_too_large")
        assert not (daemon.state / "sessions" / sid / "data" / "big.bin").exists()
        assert c.put(f"/v1/sessions/{sid}/files/ok.bin", content=b"\0" * (1 << 20)).status_code == 201


def test_artifacts(daemon):
    with daemon.http() as c:
        sid = new_session(c)
        first = c.post(f"/v1/sessions/{sid}/runs", json={"code": "open('same.txt','w').write('aaaa')\nopen('old.txt','w').write('o')"}).json()
        assert sorted(a["path"] for a in first["artifacts"]) == ["old.txt", "same.txt"]
        # Same size, same second: still found. Sub-directories: found. Untouched: not reported.
        second = c.post(f"/v1/sessions/{sid}/runs", json={"code": (
            "import os\nopen('same.txt','w').write('bbbb')\nos.makedirs('out/deep', exist_ok=True)\n"
            "open('out/deep/r.json','w').write('{}')\nraise SystemExit(5)")}).json()
        assert second["status"] == "error" and second["exit_code"] == 5
        arts = {a["path"]: a for a in second["artifacts"]}
        assert set(arts) == {"same.txt", "out/deep/r.json"}
        a = arts["out/deep/r.json"]
        assert (a["kind"], a["mime_type"], a["size_bytes"]) == ("file", "application/json", 2)
        assert a["url"] == f"{daemon.url}/v1/sessions/{sid}/files/out/deep/r.json"
        assert c.get(a["url"]).content == b"{}"
        # The cap (tiny policy: 5 artifacts), with the flag.
        sid2 = new_session(c, policy="tiny")
        capped = c.post(f"/v1/sessions/{sid2}/runs", json={"code": "for i in range(8): open(f'f{i}','w').write('x')"}).json()
        assert len(capped["artifacts"]) == 5 and capped["artifacts_truncated"] is True


FIGURES = r"""
import matplotlib.pyplot as plt
fig1 = plt.figure(); plt.plot([1, 2, 3])          # left open: saved at exit
fig2 = plt.figure(); plt.plot([3, 2, 1]); plt.savefig('mine.png')  # saved by the user: not again
fig3 = plt.figure(); plt.plot([1, 1]); plt.close(fig3)            # closed: never resurrected
fig4 = plt.figure()                                                 # empty: skipped
"""


def figure_paths(result):
    return sorted(a["path"] for a in result["artifacts"] if a["kind"] == "figure")


def test_figures_are_saved_once_each(daemon):
    res = daemon.run(FIGURES)
    assert res["status"] == "ok", res["stderr"]
    assert res["stdout"] == "" and res["stderr"] == ""
    figs = figure_paths(res)
    assert len(figs) == 1 and figs[0].startswith(f"figure-{res['run_id'][:8]}-")
    files = sorted(a["path"] for a in res["artifacts"] if a["kind"] == "file")
    assert files == ["mine.png"]


def test_plt_show_saves_instead_of_blocking(daemon):
    res = daemon.run("import matplotlib.pyplot as plt\nplt.plot([1,2]); plt.show()\nplt.plot([2,1]); plt.show()\nprint('after')")
    assert res["stdout"] == "after\n" and res["stderr"] == ""
    figs = figure_paths(res)
    assert len(figs) == 2 and len(set(figs)) == 2


def test_figures_can_be_switched_off_and_names_differ_per_run(daemon):
    with daemon.http() as c:
        sid = new_session(c)
    code = "import matplotlib.pyplot as plt\nplt.plot([1,2])"
    assert figure_paths(daemon.run(code, session_id=sid, autosave_figures=False)) == []
    a = figure_paths(daemon.run(code, session_id=sid))
    b = figure_paths(daemon.run(code, session_id=sid))
    assert len(a) == 1 and len(b) == 1 and a != b
    png = (daemon.state / "sessions" / sid / "data" / a[0]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_figures_are_saved_at_the_timeout(daemon):
    res = daemon.run("import matplotlib.pyplot as plt, time\nplt.plot([1,2,3])\ntime.sleep(60)", timeout_s=5)
    assert res["status"] == "timeout"
    assert len(figure_paths(res)) == 1


def test_tracebacks_keep_line_numbers_and_exit_codes(daemon):
    res = daemon.run("x = 1\ny = 2\nraise ValueError('boom')\n")
    assert res["status"] == "error" and res["exit_code"] == 1
    assert 'line 3' in res["stderr"] and "ValueError: boom" in res["stderr"]
    assert "raise ValueError('boom')" in res["stderr"]
    assert "runner.py" not in res["stderr"]
    syntax = daemon.run("x = 1\ndef f(:\n    pass\n")
    assert "line 2" in syntax["stderr"] and "SyntaxError" in syntax["stderr"]
    assert daemon.run("import sys; sys.exit(7)")["exit_code"] == 7
    assert daemon.run("import atexit; atexit.register(lambda: print('bye'))")["stdout"] == "bye\n"


# The runner ends the process without the interpreter's teardown; what a program
# relies on at its end must still happen, in the interpreter's order.
END_OF_RUN = """
import atexit, threading, time
log = open("unclosed.txt", "w")
log.write("flushed at the end")
class Noisy:
    def __del__(self):
        print("finalised")
noisy = Noisy()
def late():
    time.sleep(0.3)
    print("thread done", flush=True)
threading.Thread(target=late).start()
atexit.register(lambda: print("atexit"))
print("main done")
"""


def check_end_of_run(res, client, sid):
    assert res["status"] == "ok", res
    assert res["stdout"] == "main done\nthread done\natexit\nfinalised\n"
    assert [a["path"] for a in res["artifacts"]] == ["unclosed.txt"]
    assert client.get(f"/v1/sessions/{sid}/files/unclosed.txt").content == b"flushed at the end"


def test_threads_atexit_and_open_files_at_the_end_of_a_run(daemon):
    with daemon.http() as c:
        sid = new_session(c)
        check_end_of_run(daemon.run(END_OF_RUN, session_id=sid), c, sid)


def test_matplotlib_has_no_cache_warnings(daemon):
    res = daemon.run("import matplotlib.pyplot as plt\nplt.plot([1])\nplt.savefig('a.png')", language="python")
    assert res["stderr"] == ""
    shell = daemon.run("python -c 'import matplotlib.pyplot as plt; plt.plot([1]); plt.savefig(\"b.png\")'", language="shell")
    assert shell["status"] == "ok" and shell["stderr"] == ""


def test_streaming_events(daemon):
    code = "import time, sys\nfor i in range(3):\n    print(f'line {i}', flush=True)\n    time.sleep(0.3)\nprint('oops', file=sys.stderr)"
    with daemon.http() as c:
        events = stream_run(c, code=code)
        # An error before the run starts is a plain HTTP error.
        r = c.post("/v1/runs", json={"code": "1", "session_id": "missing"}, headers={"Accept": "text/event-stream"})
        assert (r.status_code, error_code(r)) == (404, "session_not_found")
    out = "".join(e["text"] for n, e in events if n == "stdout")
    err = "".join(e["text"] for n, e in events if n == "stderr")
    assert out == "line 0\nline 1\nline 2\n" and err == "oops\n"
    assert [n for n, _ in events].count("stdout") >= 3  # it arrived in pieces, as printed
    name, result = events[-1]
    assert name == "result" and result["status"] == "ok" and result["stdout"] == out


def test_tokens_and_ownership(fresh_daemon):
    d = fresh_daemon(tokens=["tok-a", "tok-b"])
    with d.http() as anon, d.http(token="tok-a") as a, d.http(token="tok-b") as b, d.uds() as local:
        r = anon.post("/v1/runs", json={"code": "1"})
        assert (r.status_code, error_code(r)) == (401, "unauthorized")
        assert d.http(token="wrong").get("/v1/sessions").status_code == 401
        assert anon.get("/v1/health").status_code == 200
        sid = new_session(a)
        assert a.get(f"/v1/sessions/{sid}").status_code == 200
        for r in [b.get(f"/v1/sessions/{sid}"), b.post(f"/v1/sessions/{sid}/runs", json={"code": "1"}),
                  b.get(f"/v1/sessions/{sid}/files"), b.delete(f"/v1/sessions/{sid}")]:
            assert (r.status_code, error_code(r)) == (404, "session_not_found")
        assert [s["id"] for s in b.get("/v1/sessions").json()] == []
        # The socket is trusted: it sees every tenant's sessions, by key (tenant.id).
        assert [s["id"] for s in local.get("/v1/sessions").json() if s["id"].endswith("." + sid)]


def test_unix_socket_serves_the_same_api(daemon):
    with daemon.uds() as c:
        r = c.post("/v1/runs", json={"code": "print(2 + 2)"})
        assert r.json()["stdout"] == "4\n"
    mode = os.stat(daemon.socket).st_mode & 0o777
    assert mode == 0o660


def test_fifty_concurrent_runs_across_sessions(daemon):
    with daemon.http() as c:
        sessions = [new_session(c) for _ in range(10)]

    def one(i):
        sid = sessions[i % 10]
        with daemon.http() as c:
            while True:
                r = c.post(f"/v1/sessions/{sid}/runs", json={"code": f"open('r{i}.txt','w').write('{i}')\nprint({i} * 2)"})
                if r.status_code == 409:  # that session is busy with another of ours
                    time.sleep(0.05)
                    continue
                return i, r.json()

    with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(one, range(50)))
    for i, res in results:
        assert res["status"] == "ok" and res["stdout"] == f"{i * 2}\n", res
        assert [a["path"] for a in res["artifacts"]] == [f"r{i}.txt"]
    for s_index, sid in enumerate(sessions):
        files = sorted(p.name for p in (daemon.state / "sessions" / sid / "data").iterdir())
        assert files == sorted(f"r{i}.txt" for i in range(50) if i % 10 == s_index)
    daemon.assert_clean()


def test_restart_recovery_after_sigkill(fresh_daemon):
    d = fresh_daemon()
    with d.http() as c:
        sid = new_session(c, id="survivor")
        c.put(f"/v1/sessions/{sid}/files/keep.txt", content=b"precious")
    host_uid = d.session_uid(sid)
    t = threading.Thread(target=lambda: _ignore(lambda: d.run("import time; time.sleep(60)", session_id=sid)), daemon=True)
    t.start()
    time.sleep(1.5)
    d.proc.kill()
    d.proc.wait()
    d.start()
    d.assert_clean()
    assert subprocess.run(["pgrep", "-u", str(host_uid)], capture_output=True).stdout == b""
    with d.http() as c:
        s = c.get(f"/v1/sessions/{sid}").json()
        assert s["busy"] is False
        assert c.get(f"/v1/sessions/{sid}/files/keep.txt").content == b"precious"
        assert c.post(f"/v1/sessions/{sid}/runs", json={"code": "print(open('keep.txt').read())"}).json()["stdout"] == "precious\n"


def _ignore(fn):
    try:
        fn()
    except Exception:
        pass


def test_sigterm_lets_running_runs_finish(fresh_daemon):
    d = fresh_daemon()
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", d.run("import time; time.sleep(1.5); print('finished')")))
    t.start()
    time.sleep(0.7)
    d.proc.send_signal(signal.SIGTERM)
    t.join(20)
    assert box["r"]["stdout"] == "finished\n"
    assert d.proc.wait(20) == 0
    assert not d.socket.exists()
    d.assert_clean()


def test_print_config_and_bad_config(tmp_path):
    from harness import BIN
    out = subprocess.run([str(BIN), "--print-config", "--max-sessions", "7", "--tokens", "secret"],
                         capture_output=True, text=True, env={"SANDBOXD_SESSION_TTL_S": "99", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0
    assert "max_sessions = 7" in out.stdout and "session_ttl_s = 99" in out.stdout and "secret" not in out.stdout
    conf = tmp_path / "sandboxd.toml"
    conf.write_text("max_sessions = 3\nhttp = \"0.0.0.0:9999\"\n")
    bad = subprocess.run([str(BIN), "--config", str(conf), "--print-config"], capture_output=True, text=True)
    assert bad.returncode == 2 and "`http`" in bad.stderr and "tokens" in bad.stderr
    conf.write_text("max_sesions = 3\n")
    bad = subprocess.run([str(BIN), "--config", str(conf), "--print-config"], capture_output=True, text=True)
    assert bad.returncode == 2 and "max_sesions" in bad.stderr


def test_bad_policy_is_refused_at_start(fresh_daemon):
    with pytest.raises(RuntimeError) as err:
        fresh_daemon(policies={"broken": "pids = 1\n"})
    assert "broken.toml" in str(err.value) and "`pids`" in str(err.value)


def test_a_method_a_route_does_not_take_answers_405_in_the_error_envelope(daemon):
    with daemon.http() as c:
        for method, path, allow in (("GET", "/v1/runs", "POST"), ("DELETE", "/v1/policies", "GET,HEAD"),
                                    ("PUT", "/v1/sessions", "POST,GET,HEAD")):
            r = c.request(method, path)
            assert r.status_code == 405 and r.headers["allow"] == allow, (method, path, r.headers)
            assert r.json() == {"error": {"code": "method_not_allowed", "message":
                                          f"{method} is not a method of {path}: see GET /v1/openapi.json for the methods each route takes"}}
        # Unknown routes stay 404.
        r = c.get("/v1/nothing")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
