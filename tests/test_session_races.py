"""A session is reachable by no route before its workspace is mounted, nor after
its teardown began; its id stays taken until the teardown ends.

Each test races real requests against a real daemon for a bounded number of
iterations, counts the requests that really overlapped the window it attacks,
and then asserts the daemon never crossed the line: no 500, every upload that
answered 201 is in the mounted workspace (readable, listed, seen by the
sandbox, so inside the quota's image), and nothing was written on the host
beneath the workspace's mount point.
"""

import subprocess
import threading
import time
import uuid

from conftest import error_code, new_session

CREATE_ITERATIONS = 12
# Requests one hammering thread sends in one iteration, at most.
MAX_REQUESTS = 300


def hidden_below_mount(session_dir):
    """What lies in the session's `data` directory on the host disk, beneath the
    workspace mounted over it: a non-recursive bind of the session directory, in a
    private mount namespace, shows the directory without what is mounted on it."""
    script = ('mount --make-rprivate / && d=$(mktemp -d) && mount --bind "$1" "$d" && '
              'ls -A "$d/data"; s=$?; umount "$d"; rmdir "$d"; exit $s')
    out = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(session_dir)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_session_is_unreachable_until_its_workspace_is_mounted(daemon):
    """Uploads, listings and runs race the creation of the same caller-chosen id."""
    overlapped = {"upload": 0, "list": 0, "run": 0}
    answers = []
    for i in range(CREATE_ITERATIONS):
        sid = f"race-create-{i}-{uuid.uuid4().hex[:8]}"
        window = {}
        created = threading.Event()
        done = []  # (kind, status, code, t0, t1, name)

        def create():
            with daemon.http() as c:
                window["start"] = time.monotonic()
                r = c.post("/v1/sessions", json={"id": sid, "policy": "tiny"})
                window["end"] = time.monotonic()
                window["status"] = r.status_code
            created.set()

        def hammer(kind, tag=""):
            with daemon.http() as c:
                c.get("/v1/health")  # connected before the creation starts
                after = 0
                for n in range(MAX_REQUESTS):
                    name = f"u{tag}{n}.txt"
                    t0 = time.monotonic()
                    if kind == "upload":
                        r = c.put(f"/v1/sessions/{sid}/files/{name}", content=f"{sid}/{name}".encode())
                    elif kind == "list":
                        r = c.get(f"/v1/sessions/{sid}/files")
                    else:
                        r = c.post(f"/v1/sessions/{sid}/runs", json={"code": "print(1)"})
                    done.append((kind, r.status_code, error_code(r), t0, time.monotonic(), name))
                    if created.is_set():
                        after += 1
                        if after >= 2:
                            break

        threads = [threading.Thread(target=hammer, args=a) for a in (("upload", "a"), ("upload", "b"), ("list",),
                                                                         ("run",))]
        for t in threads:
            t.start()
        time.sleep(0.05)
        creator = threading.Thread(target=create)
        creator.start()
        creator.join(120)
        for t in threads:
            t.join(120)
        assert window["status"] == 201, window
        answers += done
        for kind, status, code, t0, t1, _ in done:
            if window["start"] <= t0 and t1 <= window["end"]:
                overlapped[kind] += 1

        # The daemon never crossed the line for this id.
        ok = {"upload": 201, "list": 200, "run": 200}
        for kind, status, code, *_ in done:
            assert status == ok[kind] or (status == 404 and code == "session_not_found"), (kind, status, code)
        uploaded = {name for kind, status, _, _, _, name in done if kind == "upload" and status == 201}
        with daemon.http() as c:
            listed = {f["path"] for f in c.get(f"/v1/sessions/{sid}/files").json()}
            assert listed == uploaded, f"answered 201 but missing: {uploaded - listed}"
            for name in uploaded:
                assert c.get(f"/v1/sessions/{sid}/files/{name}").content == f"{sid}/{name}".encode()
            seen = c.post(f"/v1/sessions/{sid}/runs", json={
                "code": "import os; print(sorted(f for f in os.listdir('/mnt/data') if f.startswith('u')))"}).json()
            assert seen["stdout"].strip() == repr(sorted(uploaded)), seen
        session_dir = daemon.state / "sessions" / sid
        assert hidden_below_mount(session_dir) == [], "written on the host beneath the workspace mount"
        with daemon.http() as c:
            assert c.delete(f"/v1/sessions/{sid}").status_code == 200
        assert not session_dir.exists()

    assert not [a for a in answers if a[1] >= 500], [a for a in answers if a[1] >= 500][:5]
    # The race really happened: requests answered while the session was being made.
    print("requests inside a creation window:", overlapped)
    assert sum(overlapped.values()) >= CREATE_ITERATIONS, overlapped
    assert overlapped["upload"] >= 1 and overlapped["run"] >= 1, overlapped
    daemon.assert_clean()


RECREATE_TRIES = 16


def test_an_id_stays_taken_until_its_teardown_ends(daemon):
    """DELETE and a create of the same id right after it (sequential, then racing,
    some with a run in flight that the teardown must kill first)."""
    # Sequential: the create after the DELETE's answer always makes a fresh session.
    with daemon.http() as c:
        for i in range(4):
            sid = f"race-again-{i}-{uuid.uuid4().hex[:8]}"
            for _ in range(3):
                assert c.post("/v1/sessions", json={"id": sid, "policy": "tiny"}).status_code == 201
                assert c.put(f"/v1/sessions/{sid}/files/old.txt", content=b"old").status_code == 201
                r = c.delete(f"/v1/sessions/{sid}")
                assert r.status_code == 200, r.text
            assert c.get(f"/v1/sessions/{sid}").status_code == 404

    during_teardown = 0
    outcomes = []
    for i in range(RECREATE_TRIES):
        sid = f"race-recreate-{i}-{uuid.uuid4().hex[:8]}"
        with daemon.http() as c:
            new_session(c, id=sid, policy="tiny")
            assert c.put(f"/v1/sessions/{sid}/files/old.txt", content=b"old").status_code == 201
        runner = None
        if i % 2:
            # A run in flight: the teardown kills it first, which takes a while.
            runner = threading.Thread(target=lambda: daemon.run("import time; time.sleep(30)", session_id=sid,
                                                                 expect=200))
            runner.start()
            deadline = time.time() + 30
            while not daemon.http().get(f"/v1/sessions/{sid}").json()["busy"]:
                assert time.time() < deadline
                time.sleep(0.02)
        box = {}

        def delete():
            with daemon.http() as c:
                box["d0"] = time.monotonic()
                r = c.delete(f"/v1/sessions/{sid}")
                box["d1"], box["delete"] = time.monotonic(), r

        def create():
            with daemon.http() as c:
                # Right after the close began (the session is no longer found), or
                # a little earlier on some tries: the create meets the teardown.
                if i % 4:
                    end = time.time() + 10
                    while c.get(f"/v1/sessions/{sid}").status_code != 404 and time.time() < end:
                        pass
                else:
                    c.get("/v1/health")
                box["c0"] = time.monotonic()
                r = c.post("/v1/sessions", json={"id": sid, "policy": "tiny"})
                box["c1"], box["create"] = time.monotonic(), r

        ts = [threading.Thread(target=delete), threading.Thread(target=create)]
        ts[0].start()
        time.sleep(0.005)
        ts[1].start()
        for t in ts:
            t.join(120)
        if runner:
            runner.join(60)
        d, cr = box["delete"], box["create"]
        assert d.status_code == 200, d.text
        assert cr.status_code in (201, 409), cr.text
        with daemon.http() as c:
            got = c.get(f"/v1/sessions/{sid}")
            if cr.status_code == 201:
                # Made after the old session was gone: fresh, nothing of the old one.
                assert got.status_code == 200
                assert c.get(f"/v1/sessions/{sid}/files").json() == []
                assert c.post(f"/v1/sessions/{sid}/runs", json={"code": "print(2)"}).json()["stdout"] == "2\n"
                assert c.delete(f"/v1/sessions/{sid}").status_code == 200
            else:
                # Refused while the old session was still there, which the DELETE then closed.
                assert error_code(cr) == "session_exists"
                assert got.status_code == 404
        outcomes.append(cr.status_code)
        # The create was sent before the DELETE was answered, and got its session.
        if cr.status_code == 201 and box["c0"] < box["d1"]:
            during_teardown += 1
    print("creates answered after waiting for the teardown:", during_teardown, "outcomes:", outcomes)
    assert during_teardown >= 2, outcomes
    daemon.assert_clean()


LOUD_POLICY = """
description = "Lots of output, for a client that does not read it."
timeout_s = 60
output_kb = 16384
"""


def test_a_streaming_client_that_stops_reading_holds_neither_the_run_nor_the_close(fresh_daemon):
    """A client asks for a run's output as events, then never reads: the run still
    ends and the session still closes (the daemon never waits on a client's
    reading; what the client did not take is bounded by the output limit)."""
    import json
    import socket

    # It pauses (unread) for less than send_timeout_s, which would cut it otherwise.
    daemon = fresh_daemon(policies={"loud": LOUD_POLICY}, args=["--send-timeout-s", "300"])
    with daemon.http() as c:
        sid = new_session(c, policy="loud")
        # 12 MiB in 1 KiB writes, each mostly read as a chunk of its own: far more
        # events than the stream's queue and the sockets' buffers hold.
        code = ("import os, time\n"
                "for i in range(12 * 1024):\n"
                "    os.write(1, b'x' * 1023 + b'\\n')\n"
                "    if i % 64 == 0: time.sleep(0.001)\n")
        body = json.dumps({"code": code}).encode()
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", daemon.port))
        s.sendall(b"POST /v1/sessions/%s/runs HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept: text/event-stream\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (sid.encode(), daemon.port, len(body))
                  + body)
        try:
            # The run is going (its session busy), its events unread. Wait until it
            # has written it all and the daemon has read it: no longer busy.
            deadline = time.time() + 30
            while not c.get(f"/v1/sessions/{sid}").json().get("busy"):
                assert time.time() < deadline, "the run never started"
                time.sleep(0.05)
            deadline = time.time() + 90
            while time.time() < deadline:
                info = c.get(f"/v1/sessions/{sid}").json()
                if not info.get("busy"):
                    break
                time.sleep(0.2)
            else:
                raise AssertionError(f"the run still holds its session 90 s later: {info}")
            r = c.delete(f"/v1/sessions/{sid}", timeout=60)
            assert r.status_code == 200, r.text
            assert c.get(f"/v1/sessions/{sid}").status_code == 404
            # The client read nothing all along; what it gets now is the whole
            # output, in order, then the result.
            s.settimeout(60)
            got = bytearray()
            while True:
                more = s.recv(1 << 20)
                if not more:
                    break
                got += more
                if got.endswith(b"\n\n") and b"event: result" in got[-(1 << 16):]:
                    break
            got = bytes(got)
            texts = [json.loads(line[len(b"data: "):])["text"] for line in got.split(b"\n")
                     if line.startswith(b"data: {\"text\"")]
            assert "".join(texts) == ("x" * 1023 + "\n") * 12 * 1024, got[:400]
            assert b"event: result" in got
        finally:
            s.close()
