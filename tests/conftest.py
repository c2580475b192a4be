"""pytest fixtures over the harness: one shared daemon, and daemons of a test's own."""

import json
import os
import shutil

import pytest

from egress_hosts import TestHosts, UpstreamProxy
from harness import BIN, IN_CI, TARBALL, Daemon, scratch_dir


def require(condition, reason):
    """A kernel feature the test needs: fail in CI, skip (with the reason) elsewhere."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required feature missing in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session", autouse=True)
def built():
    assert BIN.exists(), f"{BIN} is missing: build with `cargo build --release --locked` (make build)"
    assert TARBALL.exists(), f"{TARBALL} is missing: build it with `make rootfs`"
    assert os.geteuid() == 0, "the tests start sandboxd, which must run as root"


@pytest.fixture(scope="session")
def daemon():
    d = Daemon(scratch_dir("shared-")).start()
    yield d
    d.stop()
    d.assert_clean()
    shutil.rmtree(d.base, ignore_errors=True)


def _own_daemons(prefix, check_clean=False, kwargs=None):
    """Yield a maker of daemons (`make(**Daemon kwargs)` starts one; `kwargs(**kw)`,
    if given, makes the Daemon kwargs of what make() was called with); stop them all
    afterwards (and check each left nothing on the host, if asked)."""
    made = []
    base = scratch_dir(prefix)

    def make(**kw):
        d = Daemon(base / f"d{len(made)}", **(kwargs(**kw) if kwargs else kw))
        made.append(d)
        return d.start()

    yield make
    for d in made:
        d.stop()
        if check_clean:
            d.assert_clean()
        d.release_namespace()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def fresh_daemon():
    """A daemon of the test's own, for tests that stop, restart or reconfigure it."""
    yield from _own_daemons("own-")


@pytest.fixture(scope="module")
def fresh_daemon_module():
    """Daemons shared by one module's tests, each checked to leave nothing behind."""
    yield from _own_daemons("module-", check_clean=True)


# --- the egress tests: their own hosts, names and CA (tests/egress_hosts.py) ---------

@pytest.fixture(scope="module")
def test_hosts():
    """The egress tests' hosts for one module (tests/egress_hosts.py): HTTP and HTTPS
    echo servers on 198.51.100.10 (api.test.example), .11 (data.), .12 (other.), the
    names of addresses the proxy must refuse, `test_hosts.bundle` (this host's CAs
    and the test CA: a daemon's --ca-bundle), `test_hosts.hosts_file` (a daemon's
    hosts_file), `test_hosts.requests(...)` (what the servers received)."""
    require(shutil.which("ip") and shutil.which("nsenter"), "iproute2's ip and util-linux's nsenter (host-tools.sh --test)")
    with TestHosts() as hosts:
        yield hosts


def egress_daemon_kwargs(hosts, policy=None, name="egress", policies=None, args=(), **kw):
    """harness.Daemon kwargs for a daemon that reaches the test hosts: `policy` (a
    policy file's text) as policies/<name>.toml (and/or `policies`: {name: text}),
    `--ca-bundle` the hosts' bundle, names resolved through their hosts file. The
    rest (`env` for HTTPS_PROXY, `tokens`, ...) as Daemon takes it."""
    policies = dict(policies or {})
    if policy is not None:
        policies[name] = policy
    return {"policies": policies, "args": ["--ca-bundle", str(hosts.bundle), *args], "hosts_file": hosts.hosts_file, **kw}


@pytest.fixture(scope="module")
def egress_daemon(test_hosts):
    """Starts daemons that reach the module's test hosts: `egress_daemon(policy=TEXT,
    name="egress", args=(), env=None, ...)` (see egress_daemon_kwargs) returns a
    running harness.Daemon; after the module each is stopped and checked to have left
    nothing behind (its mounts are read in its own mount namespace)."""
    yield from _own_daemons("egress-", check_clean=True, kwargs=lambda **kw: egress_daemon_kwargs(test_hosts, **kw))


@pytest.fixture
def upstream_proxy(test_hosts):
    """An HTTP forward proxy on 127.0.0.1 that knows the test names and connects only to
    198.51.100.0/24: start a daemon with env={"HTTPS_PROXY": upstream_proxy.url,
    "HTTP_PROXY": upstream_proxy.url}; `.connections`, `.targets` and `.refused` tell
    what it did (tests/egress_hosts.py, UpstreamProxy)."""
    with UpstreamProxy(names=test_hosts.names) as proxy:
        yield proxy


def error_code(r):
    """The error envelope's code of an answer, or None when it has none."""
    try:
        return r.json()["error"]["code"]
    except Exception:
        return None


def new_session(client, **fields):
    """Create a session through the API and return its id."""
    r = client.post("/v1/sessions", json=fields)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def stream_run(client, **body):
    """POST /v1/runs asking for server-sent events; returns [(event name, data)]."""
    return stream_events(client, "/v1/runs", body)


def stream_events(client, path, body):
    """POST `body` to `path` asking for server-sent events; returns [(event name,
    data)], the stream read to its end."""
    events, name = [], None
    with client.stream("POST", path, json=body, headers={"Accept": "text/event-stream"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.read()
        for line in r.iter_lines():
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line.split(":", 1)[1])))
    return events


@pytest.fixture(scope="module")
def llm():
    """A scripted stand-in for the user's LLM (tests/llm_standin.py), for the chat."""
    from llm_standin import StandIn
    s = StandIn()
    yield s
    s.close()


@pytest.fixture
def kernel(daemon):
    """Makes kernel-mode sessions on the shared daemon (`kernel(**fields)` → id); after
    the test each is closed, its kernel with it, and the host is checked clean."""
    made = []

    def make(**fields):
        with daemon.http() as c:
            sid = new_session(c, mode="kernel", **fields)
        made.append(sid)
        return sid

    yield make
    with daemon.http() as c:
        for sid in made:
            c.delete(f"/v1/sessions/{sid}")
    daemon.wait_pool_ready()  # a template still starting is not a leftover
    daemon.assert_clean()


# --- raw HTTP/1.1 on a socket: for tests of what one connection holds ------------

def read_response(sock, timeout=10):
    """One answer with a Content-Length: (status, headers (lowercase names), body)."""
    sock.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        more = sock.recv(65536)
        if not more:
            raise ConnectionError(f"closed before an answer: {buf!r}")
        buf += more
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        more = sock.recv(65536)
        if not more:
            raise ConnectionError("closed in the middle of an answer")
        rest += more
    return status, headers, rest[:length]


def send_request(sock, port, method, path, headers=(), body=None):
    """Send one request on `sock` (Host 127.0.0.1:port) and read its answer."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *headers]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
    return read_response(sock)


def read_until_closed(sock, limit):
    """Bytes read until the daemon closes `sock` (EOF or reset), reading for at
    most `limit` seconds; None if it was still open then."""
    import socket as socketlib
    import time as timelib
    total = 0
    end = timelib.monotonic() + limit
    sock.settimeout(0.5)
    while timelib.monotonic() < end:
        try:
            more = sock.recv(1 << 20)
        except socketlib.timeout:
            continue
        except ConnectionResetError:
            return total
        if not more:
            return total
        total += len(more)
    return None


def loop_devices(image):
    """The loop devices whose backing file is `image` (still there or deleted)."""
    from pathlib import Path
    found = []
    for f in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            backing = f.read_text().strip()
        except OSError:
            continue
        if backing in (str(image), f"{image} (deleted)"):
            found.append(f.parts[3])
    return found
