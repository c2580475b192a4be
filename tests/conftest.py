"""pytest fixtures over the harness: one shared daemon, and daemons of a test's own."""

import json
import os
import shutil

import pytest

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


def _own_daemons(prefix, check_clean=False):
    """Yield a maker of daemons (`make(**Daemon kwargs)` starts one); stop them all
    afterwards (and check each left nothing on the host, if asked)."""
    made = []
    base = scratch_dir(prefix)

    def make(**kw):
        d = Daemon(base / f"d{len(made)}", **kw)
        made.append(d)
        return d.start()

    yield make
    for d in made:
        d.stop()
        if check_clean:
            d.assert_clean()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def fresh_daemon():
    """A daemon of the test's own, for tests that stop, restart or reconfigure it."""
    yield from _own_daemons("own-")


@pytest.fixture(scope="module")
def fresh_daemon_module():
    """Daemons shared by one module's tests, each checked to leave nothing behind."""
    yield from _own_daemons("module-", check_clean=True)


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
    events, name = [], None
    with client.stream("POST", "/v1/runs", json=body, headers={"Accept": "text/event-stream"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.status_code
        for line in r.iter_lines():
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line.split(":", 1)[1])))
    return events


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
