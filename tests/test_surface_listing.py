"""Listings and file names, as sandboxed code shapes them.

A listing is bounded by the JSON it makes (16 MiB: names of control bytes count
sixfold), kept compact between its walk and its answer, and encoded while its
client reads; at most 8 are walked or sent at once in the daemon and 2 per token.
A hard-link farm of control-byte names (130,000 links cost no space) listed by
slow clients once took the daemon past 1.2 GB. Every name a listing shows is
reached by its `url` and named by its `path` alone, whatever its bytes.
"""

import asyncio
import http.client
import json
import os
import socket
import subprocess
import time
from urllib.parse import quote

import pytest

from conftest import new_session
from harness import CTL, TEST_POLICY
from test_mcp import connect, text_of as mcp_text

MAX_JSON = 16 * 1024 * 1024
FARM_LINKS = 130_000
FARM_POLICY = TEST_POLICY.replace("timeout_s = 20", "timeout_s = 120").replace("workspace_mb = 16", "workspace_mb = 64")
CTRL = "\x01" * 20
# What the daemon may add over its resident memory before the listings, while 10
# slow listings of the farm are held and 20 more are refused: each holds its compact
# listing (about 49,000 paths of 26 bytes and 24 bytes each: 2.5 MB) and its
# connection's buffer; up to 8 walks at once each read the directory's 130,000
# names (3.5 MB). Before, one such listing was 45 MiB of JSON, and 16 took 1.24 GB.
RSS_BOUND_KIB = 96 * 1024


def text_of(raw):
    """A name's text form, as the daemon writes a `path`: UTF-8 as it is, each byte
    that is not UTF-8 as \\xHH, a backslash as \\\\."""
    out = []
    for ch in raw.decode("utf-8", "surrogateescape"):
        if "\udc80" <= ch <= "\udcff":
            out.append("\\x%02x" % (ord(ch) - 0xDC00))
        elif ch == "\\":
            out.append("\\\\")
        else:
            out.append(ch)
    return "".join(out)


def request(port, method, path, body=None, token=None):
    """One request with its path sent byte for byte (no client re-encodes it)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    conn.request(method, path, body=body, headers=headers)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), data


def vm(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


class Slow:
    """A client that sends a GET and then reads its answer a few bytes at a time,
    over a socket whose receive buffer is small: the daemon cannot hand it more."""

    def __init__(self, connect, host, path, token=None):
        self.sock = connect()
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}\r\n".encode())
        self.sock.setblocking(False)
        self.started = time.monotonic()
        self.data = b""
        self.status = None
        self.headers = {}
        self.answered_at = None

    def read(self, n=64):
        try:
            got = self.sock.recv(n)
        except BlockingIOError:
            return
        except OSError:
            got = b""
        self.data += got
        if self.status is None and b"\r\n\r\n" in self.data:
            head = self.data.split(b"\r\n\r\n", 1)[0].decode()
            lines = head.split("\r\n")
            self.status = int(lines[0].split()[1])
            self.headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
            self.answered_at = time.monotonic() - self.started

    def body(self):
        return self.data.split(b"\r\n\r\n", 1)[1]

    def close(self):
        self.sock.close()


def tcp(port):
    def connect():
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        return s
    return connect


def unix(path):
    def connect():
        s = socket.socket(socket.AF_UNIX)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(str(path))
        return s
    return connect


def pump(readers, seconds, pid, samples):
    """Read each reader a little, every 50 ms, for `seconds`; the 4xx/5xx answers
    are small and read whole. Samples the daemon's VmRSS (KiB) as it goes."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for r in readers:
            r.read(64 if r.status in (None, 200) else 65536)
        samples.append(vm(pid, "VmRSS"))
        time.sleep(0.05)


def test_slow_listings_of_a_hard_link_farm_hold_little_and_are_limited(fresh_daemon):
    d = fresh_daemon(tokens=["tok-a", "tok-b"], policies={"farm": FARM_POLICY})
    with d.http("tok-a", timeout=300) as a, d.http("tok-b") as b, d.uds() as operator:
        sid = new_session(a, id="farm", policy="farm")
        made = a.post(f"/v1/sessions/{sid}/runs", json={"timeout_s": 120, "code": f'''
import os
for i in range({FARM_LINKS}):
    if i % 60_000 == 0:  # ext4 gives an inode at most 65,000 links
        target = "b%d" % (i // 60_000)
        open(target, "wb").write(b"x")
    os.link(target, {CTRL!r} + "%06d" % i)
print(len(os.listdir(".")))
'''}).json()
        assert made["status"] == "ok" and made["stdout"] == f"{FARM_LINKS + 3}\n", made
        small = new_session(b, id="small")
        assert b.put(f"/v1/sessions/{small}/files/x.txt", content=b"x").status_code == 201
        key = next(s["id"] for s in operator.get("/v1/sessions").json() if s["id"].endswith(".farm"))

    pid = d.proc.pid
    baseline = vm(pid, "VmRSS")
    # The peak resident size, counted from here on.
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    samples = []
    path = f"/v1/sessions/{sid}/files"
    host = f"127.0.0.1:{d.port}"

    # 16 slow listings by one token: 2 are answered and held (the token's most),
    # 14 wait 5 s for a place and are refused with what to do.
    held = [Slow(tcp(d.port), host, path, "tok-a") for _ in range(16)]
    pump(held, 7.5, pid, samples)
    answered = sorted((r.status for r in held), key=str)
    assert answered == [200] * 2 + [429] * 14, answered
    for r in held:
        if r.status == 429:
            assert r.answered_at >= 4.5, r.answered_at
            assert json.loads(r.body())["error"]["code"] == "max_listings", r.body()
            r.close()
    held = [r for r in held if r.status == 200]
    for r in held:
        # Decided before the first byte: the header and the exact length.
        assert r.headers["sandboxd-listing-partial"] == "true", r.headers
        assert MAX_JSON - 4096 < int(r.headers["content-length"]) <= MAX_JSON, r.headers
    # Another token is not held up by them.
    with d.http("tok-b") as b:
        started = time.monotonic()
        r = b.get(f"/v1/sessions/{small}/files")
        assert r.status_code == 200 and r.headers["sandboxd-listing-partial"] == "false"
        assert [f["path"] for f in r.json()] == ["x.txt"] and time.monotonic() - started < 2

    # 8 more by the operator (no token; the daemon's limit of 8): 6 are answered,
    # 2 wait and get 503 with Retry-After.
    more = [Slow(unix(d.socket), "localhost", f"/v1/sessions/{key}/files") for _ in range(8)]
    pump(held + more, 7.5, pid, samples)
    answered = sorted((r.status for r in more), key=str)
    assert answered == [200] * 6 + [503] * 2, answered
    for r in more:
        if r.status == 503:
            assert r.headers["retry-after"] and json.loads(r.body())["error"]["code"] == "unavailable"
            r.close()
    held += [r for r in more if r.status == 200]
    assert len(held) == 8
    # Each held listing has had a few KiB of its ~16 MiB: the rest is still to be
    # made, from the compact listing the daemon keeps.
    assert all(len(r.data) < 256 * 1024 for r in held), [len(r.data) for r in held]
    pump(held, 2, pid, samples)
    peak = vm(pid, "VmHWM")
    assert max(samples) - baseline < RSS_BOUND_KIB, (baseline, max(samples))
    assert peak - baseline < RSS_BOUND_KIB, (baseline, peak)
    print(f"daemon VmRSS: {baseline} KiB before, at most {max(samples)} KiB sampled, VmHWM {peak} KiB")

    # Released: the clients go, and so do their places.
    for r in held:
        r.close()
    time.sleep(0.5)
    with d.http("tok-a", timeout=120) as a:
        for i in range(4):
            started = time.monotonic()
            r = a.get(path)
            assert r.status_code == 200 and time.monotonic() - started < 4, (i, r.status_code)
        assert r.headers["sandboxd-listing-partial"] == "true"
        assert len(r.content) == int(r.headers["content-length"]) <= MAX_JSON
        listed = r.json()
        # The first part, in path order: every link up to where 16 MiB of JSON ends
        # (`b0`, `b1`, `b2` sort after the links).
        assert len(listed) > 40_000, len(listed)
        assert [f["path"] for f in listed] == [f"{CTRL}%06d" % i for i in range(len(listed))]
        assert listed[7]["url"] == f"{d.url}/v1/sessions/{sid}/files/{'%01' * 20}000007"


NAMES = [
    b"dot%2e%2e", b"slash%2fx", b"back%5cx", b"nul%00", b"pct%25", b"%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    b"ctl\x01\x1b[31m\n\t", b"a\xffb", b"\xc3", b"a\\xffb", "a\ufffdb".encode(), b"a\\b", b"a\\\\xffb",
    b"sub/%2e\xfe", "r\u00e9sum\u00e9 \u2603".encode(),
]


def test_every_name_a_listing_shows_is_reached_by_its_url_and_named_by_its_path(daemon):
    """Names sandboxed code can make: ones that look percent-encoded, control bytes,
    bytes that are not UTF-8, and a file literally named like another's escaped
    form (`a\\xffb` beside the bytes 61 ff 62, and the U+FFFD form). Each is listed
    under its own path, downloaded by its url with its own bytes, deleted by it,
    and uploaded again by it."""
    port = daemon.port
    with daemon.http() as c:
        sid = new_session(c)
        made = daemon.run(f"import os\nos.mkdir(b'sub')\nfor n in {NAMES!r}:\n    open(n, 'wb').write(b'content:' + n)\n",
                          session_id=sid)
        assert made["status"] == "ok", made
        r = c.get(f"/v1/sessions/{sid}/files")
        assert r.status_code == 200 and r.headers["sandboxd-listing-partial"] == "false"
        listed = {f["path"]: f for f in r.json()}
        assert sorted(listed) == sorted(text_of(n) for n in NAMES), sorted(listed)
        # The run's artifacts name them the same way, with the same URLs.
        assert not made["artifacts_truncated"], made
        assert sorted((a["path"], a["url"]) for a in made["artifacts"]) == sorted((p, f["url"]) for p, f in listed.items())

    base = f"/v1/sessions/{sid}/files/"
    for name in NAMES:
        entry = listed[text_of(name)]
        url = entry["url"]
        assert url == f"{daemon.url}{base}{quote(name, safe='/')}", (name, url)
        path = url[len(daemon.url):]
        status, _, body = request(port, "GET", path)
        assert (status, body) == (200, b"content:" + name), (name, status, body[:200])
        status, _, body = request(port, "DELETE", path)
        assert (status, json.loads(body)) == (200, {"status": "deleted", "path": text_of(name)}), (name, body)
        status, _, body = request(port, "GET", path)
        assert (status, json.loads(body)["error"]["code"]) == (404, "not_found"), name
    with daemon.http() as c:
        assert c.get(f"/v1/sessions/{sid}/files").json() == []

    # Uploaded by the same URLs, they are those very names on the workspace's disk.
    for name in NAMES:
        status, _, body = request(port, "PUT", base + quote(name, safe="/"), body=b"put:" + name)
        assert (status, json.loads(body)["path"]) == (201, text_of(name)), (name, body)
    data = daemon.state / "sessions" / sid / "data"
    on_disk = sorted([n for n in os.listdir(bytes(data)) if n != b"sub"] +
                     [b"sub/" + n for n in os.listdir(bytes(data / "sub"))])
    assert on_disk == sorted(NAMES)
    # sandboxctl takes a path in the listing's form (what `files ls` shows).
    for name in (b"a\xffb", b"a\\xffb", "a\ufffdb".encode()):
        got = subprocess.run([str(CTL), "--socket", str(daemon.socket), "files", "get", sid, text_of(name)],
                             capture_output=True, timeout=60)
        assert (got.returncode, got.stdout) == (0, b"put:" + name), (name, got.stderr)
    with daemon.http() as c:
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_mcp_tools_take_the_paths_listings_give(daemon, transport):
    """MCP's list_files shows each name's text form, and read_file takes it back to
    the very file: the bytes `61 ff 62`, the file literally named `a\\xffb`, and one
    named `dir\\f.txt` (a backslash that starts no escape stands for itself, the same
    over both transports)."""
    with daemon.http() as c:
        sid = new_session(c)
    made = daemon.run("for n in (b'a\\xffb', b'a\\\\xffb', b'dir\\\\f.txt'):\n    open(n, 'w').write(repr(n))",
                      session_id=sid)
    assert made["status"] == "ok", made
    paths = ["a\\\\xffb", "a\\xffb", "dir\\\\f.txt"]

    async def go():
        async with connect(daemon, transport) as s:
            listed = json.loads(mcp_text(await s.call_tool("list_files", {"session_id": sid})))
            assert sorted(f["path"] for f in listed) == paths
            for path, content in (("a\\xffb", "b'a\\xffb'"), ("a\\\\xffb", "b'a\\\\xffb'"),
                                  ("dir\\\\f.txt", "b'dir\\\\f.txt'"), ("dir\\f.txt", "b'dir\\\\f.txt'")):
                got = await s.call_tool("read_file", {"session_id": sid, "path": path})
                assert not got.is_error and mcp_text(got) == content, (path, mcp_text(got))
            gone = await s.call_tool("read_file", {"session_id": sid, "path": "a\\xff"})
            assert gone.is_error and "not_found" in mcp_text(gone), mcp_text(gone)
    asyncio.run(go())
    with daemon.http() as c:
        assert sorted(f["path"] for f in c.get(f"/v1/sessions/{sid}/files").json()) == paths
        c.delete(f"/v1/sessions/{sid}")
