"""The daemon's own surface over HTTP: browsers, slow and idle connections, tenants.

A web page in a browser can send requests to a loopback port: a cross-origin
`text/plain` POST once ran code, and any `Host` was accepted (DNS rebinding could read
the answers). Half-open connections stayed open forever. One token could fill every
session, and creating another tenant's id answered 409 (an oracle). Each test asserts
the exact answer and what was (not) left behind."""

import hashlib
import json
import signal
import socket
import threading
import time

from conftest import new_session, read_until_closed, send_request


def error(r):
    return r.status_code, r.json()["error"]["code"]


def uds_ids(d):
    with d.uds() as c:
        return sorted(s["id"] for s in c.get("/v1/sessions").json())


# --- browsers -----------------------------------------------------------------

def test_text_plain_post_is_refused_and_makes_no_session(daemon):
    body = json.dumps({"code": "open('made.txt', 'w').write('x')"}).encode()
    before = uds_ids(daemon)
    with daemon.http() as c:
        r = c.post("/v1/runs", content=body, headers={"Content-Type": "text/plain"})
        assert error(r) == (415, "unsupported_media_type"), r.text
        assert "Content-Type: application/json" in r.json()["error"]["message"]
        # No type at all, a form type, a type that only starts like JSON: the same.
        for headers in ({}, {"Content-Type": "application/x-www-form-urlencoded"},
                        {"Content-Type": "application/jsonp"}):
            assert error(c.post("/v1/runs", content=body, headers=headers)) == (415, "unsupported_media_type")
        assert error(c.post("/v1/sessions", content=b"{}", headers={"Content-Type": "text/plain"})) \
            == (415, "unsupported_media_type")
    with daemon.uds() as u:  # the socket asks for the type too
        assert error(u.post("/v1/runs", content=body, headers={"Content-Type": "text/plain"})) \
            == (415, "unsupported_media_type")
    assert uds_ids(daemon) == before
    with daemon.http() as c:
        sid = new_session(c)
        r = c.post(f"/v1/sessions/{sid}/runs", content=body, headers={"Content-Type": "text/plain"})
        assert error(r) == (415, "unsupported_media_type")
        assert c.get(f"/v1/sessions/{sid}/files").json() == []
        assert not (daemon.state / "sessions" / sid / "data" / "made.txt").exists()
        # The JSON type with parameters is fine; an empty POST /v1/sessions needs no type.
        r = c.post(f"/v1/sessions/{sid}/runs", content=json.dumps({"code": "print(1)"}).encode(),
                   headers={"Content-Type": "Application/JSON; charset=utf-8"})
        assert r.status_code == 200 and r.json()["stdout"] == "1\n", r.text
        r = c.post("/v1/sessions")
        assert r.status_code == 201, r.text
        assert c.delete(f"/v1/sessions/{r.json()['id']}").status_code == 200
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200


def test_foreign_origin_is_refused_and_nothing_runs(daemon):
    evil = {"Origin": "http://evil.example"}
    code = {"code": "open('pwned.txt', 'w').write('x')"}
    before = uds_ids(daemon)
    with daemon.http() as c:
        r = c.post("/v1/runs", json=code, headers=evil)
        assert error(r) == (403, "forbidden"), r.text
        message = r.json()["error"]["message"]
        assert f"127.0.0.1:{daemon.port}" in message and "public_url" in message
        assert uds_ids(daemon) == before
        sid = new_session(c)
        for origin in ("http://evil.example", "null", f"http://localhost:{daemon.port + 1}",
                       f"https://127.0.0.1:{daemon.port}", f"http://127.0.0.1:{daemon.port}.evil.example"):
            r = c.post(f"/v1/sessions/{sid}/runs", json=code, headers={"Origin": origin})
            assert error(r) == (403, "forbidden"), (origin, r.text)
        assert c.get(f"/v1/sessions/{sid}/files").json() == []
        assert not (daemon.state / "sessions" / sid / "data" / "pwned.txt").exists()
        # Reading is refused too (DNS rebinding reads answers).
        assert error(c.get("/v1/sessions", headers=evil)) == (403, "forbidden")
        # MCP refuses the foreign origin as well.
        r = c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
                   headers={**evil, "Accept": "application/json, text/event-stream"})
        assert error(r) == (403, "forbidden")
        # The daemon's own origin is fine.
        r = c.post(f"/v1/sessions/{sid}/runs", json={"code": "print(2)"},
                   headers={"Origin": f"http://localhost:{daemon.port}"})
        assert r.status_code == 200 and r.json()["stdout"] == "2\n", r.text
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200


def test_new_error_codes_are_documented(daemon):
    with daemon.uds() as c:
        codes = c.get("/v1/openapi.json").json()["components"]["schemas"]["Code"]["enum"]
    for code in ("forbidden", "unsupported_media_type", "request_timeout", "max_sessions", "max_runs"):
        assert code in codes, codes


def test_host_must_be_a_served_name(daemon):
    with daemon.http() as c:
        for host in ("evil.example", f"evil.example:{daemon.port}", f"localhost:{daemon.port + 1}", ""):
            r = c.get("/v1/sessions", headers={"Host": host})
            assert error(r) == (403, "forbidden"), (host, r.text)
        assert "public_url" in c.get("/v1/health", headers={"Host": "evil.example"}).json()["error"]["message"]
        for host in (f"localhost:{daemon.port}", f"127.0.0.1:{daemon.port}", "localhost", f"[::1]:{daemon.port}"):
            r = c.get("/v1/sessions", headers={"Host": host})
            assert r.status_code == 200, (host, r.text)
    with daemon.uds() as u:  # no browser reaches the socket: any Host
        assert u.get("/v1/sessions", headers={"Host": "evil.example"}).status_code == 200


def test_public_url_host_is_served(fresh_daemon):
    d = fresh_daemon(args=["--public-url", "https://sandbox.example.org"])
    with d.http() as c:
        assert c.get("/v1/health", headers={"Host": "sandbox.example.org"}).status_code == 200
        r = c.get("/v1/sessions", headers={"Host": "sandbox.example.org", "Origin": "https://sandbox.example.org"})
        assert r.status_code == 200
        assert error(c.get("/v1/sessions", headers={"Origin": "http://sandbox.example.org"})) == (403, "forbidden")


# --- timeouts and the connection cap --------------------------------------------

def _closed_after(sock, limit):
    """Seconds until the daemon closes `sock` (reads until EOF or reset), at most `limit`."""
    start = time.monotonic()
    sock.settimeout(limit)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def test_half_open_and_idle_connections_are_closed(fresh_daemon):
    d = fresh_daemon(args=["--header-timeout-s", "1", "--body-timeout-s", "1"])
    # A partial header, then nothing: closed at the header timeout.
    s = socket.create_connection(("127.0.0.1", d.port))
    s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    took = _closed_after(s, 10)
    assert 0.8 < took < 3, took
    s.close()
    # A finished request, then an idle kept-alive connection: closed as well.
    s = socket.create_connection(("127.0.0.1", d.port))
    s.sendall(f"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1:{d.port}\r\n\r\n".encode())
    s.settimeout(5)
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    took = _closed_after(s, 10)
    assert took < 3, took
    s.close()
    # A JSON body that stops halfway: 408 request_timeout, nothing run.
    before = uds_ids(d)
    s = socket.create_connection(("127.0.0.1", d.port))
    s.sendall(f"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1:{d.port}\r\nContent-Type: application/json\r\n"
              f"Content-Length: 100\r\n\r\n{{\"code\": ".encode())
    s.settimeout(10)
    start = time.monotonic()
    answer = s.recv(65536)
    assert time.monotonic() - start < 4
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b'"request_timeout"' in answer
    s.close()
    assert uds_ids(d) == before
    with d.http() as c:
        assert c.get("/v1/health").status_code == 200


def test_connections_beyond_the_cap_are_closed(fresh_daemon):
    d = fresh_daemon(args=["--max-connections", "4", "--header-timeout-s", "30"])
    # Four clients that each made a request (which claims the connection: it is
    # theirs, never closed for a newcomer) and keep their connection.
    held = []
    for _ in range(4):
        held.append(socket.create_connection(("127.0.0.1", d.port)))
        assert send_request(held[-1], d.port, "GET", "/v1/sessions")[0] == 200
    extra = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(3)]
    for s in extra:
        took = _closed_after(s, 5)
        assert took < 2, took
        s.close()
    # The held ones still work.
    assert send_request(held[0], d.port, "GET", "/v1/health")[0] == 200
    for s in held:
        s.close()
    # Once they are gone, the daemon serves as usual.
    deadline = time.time() + 5
    while True:
        try:
            with d.http(timeout=5) as c:
                if c.get("/v1/health").status_code == 200:
                    break
        except Exception:
            pass
        assert time.time() < deadline, "the daemon did not serve after the held connections closed"
        time.sleep(0.1)
    with d.http() as c:
        assert c.post("/v1/runs", json={"code": "print(3)"}).json()["stdout"] == "3\n"
    log = d.log_text()
    assert log.count("too many open connections") == 1, log  # at most once a second


def test_connections_that_send_nothing_give_way_to_new_ones(fresh_daemon):
    """Connections with a header begun and nothing more are anonymous: past
    max_anonymous_connections, a new connection closes the one waiting longest,
    so they never keep a client out (they once held every place)."""
    d = fresh_daemon(args=["--max-connections", "4", "--max-anonymous-connections", "2", "--header-timeout-s", "30"])
    held = []
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", d.port))
        s.sendall(b"GET /v1/health HTTP/1.1\r\n")
        held.append(s)
        time.sleep(0.2)
    # The first two gave way to the last two.
    for s in held[:2]:
        assert read_until_closed(s, 5) is not None
    for s in held[2:]:
        s.settimeout(0.5)
        try:
            assert s.recv(1) != b"", "closed"
        except socket.timeout:
            pass  # still open, as it should be
    # A client that sends its request gets its answer.
    with d.http() as c:
        assert c.get("/v1/health").status_code == 200
    for s in held:
        s.close()
    assert "closing the ones waiting longest" in d.log_path.read_text()


# --- tenants ----------------------------------------------------------------------

def test_per_token_session_quota(fresh_daemon):
    d = fresh_daemon(tokens=["tok-a", "tok-b"], args=["--max-sessions", "6", "--token-max-sessions", "2"])
    with d.http(token="tok-a") as a, d.http(token="tok-b") as b, d.uds() as op:
        new_session(a)
        new_session(a)
        r = a.post("/v1/sessions", json={})
        assert r.status_code == 429
        assert r.json() == {"error": {"code": "max_sessions", "message": "this token already holds its maximum of 2 sessions (token_max_sessions): close one (DELETE /v1/sessions/ID) or wait for idle ones to expire"}}
        # A one-shot run needs a session too: refused the same way, nothing made.
        r = a.post("/v1/runs", json={"code": "print(1)"})
        assert error(r) == (429, "max_sessions")
        assert len(a.get("/v1/sessions").json()) == 2
        # The other token is not locked out; the operator has no per-token quota.
        new_session(b)
        new_session(b)
        new_session(op)
        assert len(op.get("/v1/sessions").json()) == 5


def test_per_token_run_quota(fresh_daemon):
    d = fresh_daemon(tokens=["tok-a", "tok-b"], args=["--token-max-runs", "1"])
    with d.http(token="tok-a") as a, d.http(token="tok-b") as b:
        s1, s2 = new_session(a), new_session(a)
        box = {}
        t = threading.Thread(target=lambda: box.setdefault(
            "r", d.run("import time; time.sleep(3); print('slept')", client=d.http(token="tok-a"), session_id=s1)))
        t.start()
        deadline = time.time() + 10
        while not a.get(f"/v1/sessions/{s1}").json()["busy"]:
            assert time.time() < deadline
            time.sleep(0.05)
        r = a.post(f"/v1/sessions/{s2}/runs", json={"code": "open('no.txt', 'w')"})
        assert r.status_code == 429
        assert r.json() == {"error": {"code": "max_runs", "message": "this token already has its maximum of 1 runs going at once (token_max_runs): wait for one to finish, or cancel one (DELETE /v1/sessions/ID/run), then retry"}}
        assert a.get(f"/v1/sessions/{s2}/files").json() == []
        sessions_before = sorted(s["id"] for s in a.get("/v1/sessions").json())
        assert error(a.post("/v1/runs", json={"code": "print(1)"})) == (429, "max_runs")
        assert sorted(s["id"] for s in a.get("/v1/sessions").json()) == sessions_before  # no leftover session
        # Another token runs meanwhile.
        assert b.post("/v1/runs", json={"code": "print(5)"}).json()["stdout"] == "5\n"
        assert a.get(f"/v1/sessions/{s1}").json()["busy"] is True  # the race window was real
        t.join(30)
        assert box["r"]["stdout"] == "slept\n"
        assert a.post(f"/v1/sessions/{s2}/runs", json={"code": "print(6)"}).json()["stdout"] == "6\n"


def _same_answer(r1, r2, id1, id2):
    assert r1.status_code == r2.status_code, (r1.text, r2.text)
    assert r1.text.replace(id1, "ID") == r2.text.replace(id2, "ID"), (r1.text, r2.text)


def test_tenants_have_their_own_id_spaces(fresh_daemon):
    d = fresh_daemon(tokens=["tok-a", "tok-b"])
    with d.http(token="tok-a") as a, d.http(token="tok-b") as b, d.uds() as op:
        assert a.post("/v1/sessions", json={"id": "shared"}).status_code == 201
        assert a.put("/v1/sessions/shared/files/mine.txt", content=b"A's").status_code == 201
        assert a.post("/v1/sessions", json={"id": "only-a"}).status_code == 201
        # B creating A's id answers like a fresh id: 201, the id B asked for.
        r_taken = b.post("/v1/sessions", json={"id": "shared"})
        r_fresh = b.post("/v1/sessions", json={"id": "fresh"})
        assert (r_taken.status_code, r_fresh.status_code) == (201, 201)
        taken, fresh = r_taken.json(), r_fresh.json()
        assert taken["id"] == "shared" and fresh["id"] == "fresh"
        assert set(taken) == set(fresh) and taken["policy"] == fresh["policy"]
        # A's session is untouched; B's is its own.
        assert a.get("/v1/sessions/shared/files/mine.txt").content == b"A's"
        assert b.get("/v1/sessions/shared/files").json() == []
        r = b.post("/v1/sessions/shared/runs", json={"code": "open('b.txt', 'w').write('B'); print(open('b.txt').read())"})
        res = r.json()
        assert res["stdout"] == "B\n" and res["session_id"] == "shared"
        url = res["artifacts"][0]["url"]
        assert url.endswith("/v1/sessions/shared/files/b.txt")
        assert b.get(url).content == b"B"
        assert a.get(url).status_code == 404  # A's own "shared" has no b.txt
        assert sorted(p["path"] for p in a.get("/v1/sessions/shared/files").json()) == ["mine.txt"]
        # Another tenant's id and an id never made get the same answer on every route.
        for method, path, kw in [
            ("GET", "/v1/sessions/{}", {}),
            ("POST", "/v1/sessions/{}/runs", {"json": {"code": "open('x', 'w')"}}),
            ("GET", "/v1/sessions/{}/files", {}),
            ("PUT", "/v1/sessions/{}/files/f.txt", {"content": b"x"}),
            ("GET", "/v1/sessions/{}/files/mine.txt", {}),
            ("DELETE", "/v1/sessions/{}/files/mine.txt", {}),
            ("DELETE", "/v1/sessions/{}/run", {}),
            ("DELETE", "/v1/sessions/{}", {}),
        ]:
            _same_answer(b.request(method, path.format("only-a"), **kw),
                         b.request(method, path.format("never-made"), **kw), "only-a", "never-made")
        _same_answer(b.post("/v1/runs", json={"code": "1", "session_id": "only-a"}),
                     b.post("/v1/runs", json={"code": "1", "session_id": "never-made"}), "only-a", "never-made")
        assert a.get("/v1/sessions/only-a").status_code == 200
        assert sorted(p["path"] for p in a.get("/v1/sessions/shared/files").json()) == ["mine.txt"]
        # B closing its "shared" leaves A's.
        assert b.delete("/v1/sessions/shared").status_code == 200
        assert a.get("/v1/sessions/shared/files/mine.txt").content == b"A's"
        # A key is not an id: a token cannot address the operator's form.
        ops = [s["id"] for s in op.get("/v1/sessions").json()]
        key_a = next(k for k in ops if k.endswith(".shared"))
        assert error(b.get(f"/v1/sessions/{key_a}")) == (400, "invalid_session_id")
        # The operator addresses a tenant's session by its key, and its URLs work for it.
        assert op.get(f"/v1/sessions/{key_a}/files/mine.txt").content == b"A's"
        res = op.post(f"/v1/sessions/{key_a}/runs", json={"code": "open('op.txt', 'w').write('op')"}).json()
        assert res["session_id"] == key_a
        assert res["artifacts"][0]["url"].endswith(f"/v1/sessions/{key_a}/files/op.txt")
        # An operator's id may not look like a key.
        assert error(op.post("/v1/sessions", json={"id": key_a})) == (400, "invalid_session_id")


def test_restart_keeps_both_tenants_sessions(fresh_daemon):
    d = fresh_daemon(tokens=["tok-a", "tok-b"])
    with d.http(token="tok-a") as a, d.http(token="tok-b") as b:
        for c, data in ((a, b"from A"), (b, b"from B")):
            assert c.post("/v1/sessions", json={"id": "x"}).status_code == 201
            assert c.put("/v1/sessions/x/files/who.txt", content=data).status_code == 201
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    d.start()
    with d.http(token="tok-a") as a, d.http(token="tok-b") as b, d.uds() as op:
        for c, data in ((a, b"from A"), (b, b"from B")):
            assert [s["id"] for s in c.get("/v1/sessions").json()] == ["x"]
            assert c.get("/v1/sessions/x/files/who.txt").content == data
            r = c.post("/v1/sessions/x/runs", json={"code": "print(open('who.txt').read())"}).json()
            assert r["stdout"] == data.decode() + "\n" and r["session_id"] == "x"
        keys = [s["id"] for s in op.get("/v1/sessions").json()]
        assert len(keys) == 2 and all(k.endswith(".x") for k in keys) and keys[0] != keys[1]
        # Creating "x" again is the tenant's own conflict, nobody else's.
        assert error(a.post("/v1/sessions", json={"id": "x"})) == (409, "session_exists")


def test_a_refused_upload_keeps_the_connection_usable(daemon):
    """An upload refused before its body is read (no such session, a bad path) is
    answered, and its keep-alive connection serves the next request: the body is read
    away, not left to close the connection under the client's next request."""
    body = b"x" * (1 << 20)
    with daemon.http() as c:
        for path in ("/v1/sessions/never-made/files/f.txt", "/v1/sessions/never-made/files/a%252Fb",
                     "/v1/sessions/never-made/files/..%2Fx"):
            for _ in range(20):
                r = c.put(path, content=body)
                assert r.status_code in (400, 404), r.text
                assert r.json()["error"]["code"] in ("session_not_found", "invalid_path"), r.text
                assert c.get("/v1/health").status_code == 200
        # One connection served them all.
        assert c.get("/v1/health").status_code == 200


# --- refusals keep the connection, one Host, owner ids ------------------------------

def test_a_refused_request_keeps_its_connection_usable(fresh_daemon):
    """401 (auth), 415 (the JSON type), 404 (no route) and 405 are answered once the
    request's body is taken in: the same kept-alive connection serves the next
    request (a connection closed on unread bytes was reset under the client)."""
    d = fresh_daemon(tokens=["tok"], args=["--pool-size", "0"])
    body = b"x" * (512 * 1024)
    s = socket.create_connection(("127.0.0.1", d.port))
    try:
        cases = [
            ("POST", "/v1/runs", ["Content-Type: application/json"], 401, "unauthorized"),
            ("PUT", "/v1/sessions/x/files/f", ["Authorization: Bearer wrong"], 401, "unauthorized"),
            ("POST", "/v1/runs", ["Authorization: Bearer tok", "Content-Type: text/plain"], 415, "unsupported_media_type"),
            ("POST", "/v2/nowhere", ["Authorization: Bearer tok"], 404, "not_found"),
            ("PATCH", "/v1/sessions", ["Authorization: Bearer tok"], 405, "method_not_allowed"),
        ]
        for method, path, headers, status, code in cases:
            got, answer_headers, answer = send_request(s, d.port, method, path, headers, body)
            assert (got, json.loads(answer)["error"]["code"]) == (status, code), (method, path, answer)
            assert answer_headers.get("connection") != "close", answer_headers
            # The next request, on the same connection.
            got, _, answer = send_request(s, d.port, "GET", "/v1/sessions", ["Authorization: Bearer tok"])
            assert got == 200 and json.loads(answer) == [], answer
    finally:
        s.close()


def test_a_request_with_two_hosts_is_refused(daemon):
    """Only the first Host was checked: a second one, which a proxy or a framework
    could read instead, is refused."""
    for second in ("evil.example", f"127.0.0.1:{daemon.port}"):
        s = socket.create_connection(("127.0.0.1", daemon.port))
        try:
            status, _, body = send_request(s, daemon.port, "GET", "/v1/sessions", [f"Host: {second}"])
            assert status == 400, body
            error = json.loads(body)["error"]
            assert error == {"code": "invalid_request", "message": "the request has 2 `Host` headers: send exactly "
                             "one (the name and port the daemon is reached by)"}, error
        finally:
            s.close()
    with daemon.http() as c:
        assert c.get("/v1/sessions").status_code == 200


def _tenant_dirs(d):
    return sorted(p.name for p in (d.state / "sessions").iterdir())


def test_owner_ids_are_keyed_and_stable_across_a_restart(fresh_daemon):
    d = fresh_daemon(tokens=["tok-a"])
    plain = hashlib.sha256(b"tok-a").hexdigest()
    with d.http(token="tok-a") as a:
        assert a.post("/v1/sessions", json={"id": "x"}).status_code == 201
        owner = a.get("/v1/sessions/x").json()["owner"]
    # The owner id is not the token's plain hash, and neither is its directory.
    assert len(owner) == 32 and owner != plain[:32]
    assert _tenant_dirs(d) == [f"{owner[:16]}.x"]
    # The secret it is keyed with: root's, 0600, 32 bytes, in the state directory.
    key = d.state / "owner.key"
    st = key.stat()
    assert (st.st_uid, st.st_mode & 0o777, st.st_size) == (0, 0o600, 32)
    log = d.log_text()
    assert "tok-a" not in log and plain[:16] not in log and key.read_bytes().hex()[:16] not in log
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    d.start()
    with d.http(token="tok-a") as a:
        assert a.get("/v1/sessions/x").json()["owner"] == owner
    assert _tenant_dirs(d) == [f"{owner[:16]}.x"]


def test_an_upgrade_keeps_the_sessions_of_old_owner_ids(fresh_daemon):
    """Sessions an earlier daemon left under a token's unsalted hash are moved to
    its keyed id at start: the token finds them, with their files."""
    d = fresh_daemon(tokens=["tok-a"])
    with d.http(token="tok-a") as a:
        assert a.post("/v1/sessions", json={"id": "x"}).status_code == 201
        assert a.put("/v1/sessions/x/files/kept.txt", content=b"from before").status_code == 201
        owner = a.get("/v1/sessions/x").json()["owner"]
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    # As the earlier daemon stored it: owner sha256(token), directory by its first 16 digits.
    old = hashlib.sha256(b"tok-a").hexdigest()[:32]
    sessions = d.state / "sessions"
    (sessions / f"{owner[:16]}.x").rename(sessions / f"{old[:16]}.x")
    path = sessions / f"{old[:16]}.x" / "session.json"
    info = json.loads(path.read_text())
    info["owner"] = old
    path.write_text(json.dumps(info))
    d.start()
    with d.http(token="tok-a") as a:
        assert [s["id"] for s in a.get("/v1/sessions").json()] == ["x"]
        assert a.get("/v1/sessions/x").json()["owner"] == owner
        assert a.get("/v1/sessions/x/files/kept.txt").content == b"from before"
        r = a.post("/v1/sessions/x/runs", json={"code": "print(open('kept.txt').read())"}).json()
        assert r["stdout"] == "from before\n", r
    assert _tenant_dirs(d) == [f"{owner[:16]}.x"]
    assert json.loads((sessions / f"{owner[:16]}.x" / "session.json").read_text())["owner"] == owner
    assert "moved a token's session to its keyed owner id" in d.log_text()
