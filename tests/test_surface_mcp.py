"""The daemon's own surface, through MCP: what a run writes is read with limits, and
what a tool call makes is what it says.

Files in a run's workspace are written by sandboxed code, and the MCP server runs in
the daemon: an image it inlines is read and decoded only within fixed bounds, so a
run cannot make the daemon read or allocate without limit. A run or an upload
without `session_id` is checked before a session is made for it: a refused call
makes nothing (18 refused calls once left 18 sessions, none named), and a call
that keeps the session it made names it."""

import asyncio
import base64
import threading
import time
from contextlib import asynccontextmanager

import anyio
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from conftest import new_session
from harness import CTL, REPO
from test_mcp import connect, images_of, session_id, text_of

BIG = 1000 * 1024 * 1024

PLOT_AND_SPARSE_PNGS = f"""
import matplotlib.pyplot as plt
plt.plot([1, 2, 3])
for i in range(4):
    with open(f"big{{i}}.png", "wb") as f:
        f.truncate({BIG})  # sparse: no workspace space used
"""


def test_huge_sparse_images_are_named_not_read(daemon):
    """Four sparse 1000 MiB .png files (which took the daemon to 2.5 GB and 25 s in
    one call) are left out by their size, with a note saying where to fetch them;
    the run's real figure is still shown."""
    before = daemon.rss_kib()

    async def go():
        async with connect(daemon, "http") as s:
            started = time.monotonic()
            r = await s.call_tool("run_python", {"code": PLOT_AND_SPARSE_PNGS})
            return r, time.monotonic() - started

    result, elapsed = asyncio.run(go())
    text = text_of(result)
    assert not result.is_error, text
    images = images_of(result)
    assert len(images) == 1, text  # the figure (figures come first)
    # Three of the big files are considered (4 images at most), each named with its URL.
    noted = [l for l in text.splitlines() if l.startswith("note: image big") and "larger than" in l]
    assert len(noted) == 3, text
    sid = session_id(result)
    assert all(f"/v1/sessions/{sid}/files/big" in l for l in noted), noted
    assert "more than 4 images" in text, text
    grown_mib = (daemon.rss_kib() - before) / 1024
    assert grown_mib < 64, f"the daemon grew by {grown_mib:.0f} MiB"
    assert elapsed < 20, f"the call took {elapsed:.1f} s"


def test_read_file_never_inlines_past_the_limit(daemon):
    """read_file refuses a file over the inline limit with artifact_too_large, and
    reads nothing of it (the daemon does not grow)."""
    async def go():
        async with connect(daemon, "http") as s:
            r = await s.call_tool("run_python", {"code": f"open('huge.bin', 'wb').truncate({BIG})"})
            sid = session_id(r)
            before = daemon.rss_kib()
            refused = await s.call_tool("read_file", {"session_id": sid, "path": "huge.bin"})
            return refused, before

    refused, before = asyncio.run(go())
    assert refused.is_error
    assert text_of(refused).startswith("error artifact_too_large: huge.bin is 1048576000 bytes"), text_of(refused)
    assert (daemon.rss_kib() - before) / 1024 < 64


# --- sessions made by tool calls -------------------------------------------------

SMALL_UPLOADS = (REPO / "policies" / "default.toml").read_text().replace("upload_mb = 50", "upload_mb = 1").replace(
    "workspace_mb = 1024", "workspace_mb = 128")


@asynccontextmanager
async def connect_as(daemon, transport, token):
    """The official SDK's client, as `token`, over HTTP or `sandboxctl mcp`."""
    if transport == "http":
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as h:
            async with streamable_http_client(f"{daemon.url}/mcp", http_client=h) as streams:
                async with ClientSession(streams[0], streams[1]) as s:
                    await s.initialize()
                    yield s
    else:
        params = StdioServerParameters(command=str(CTL), args=["--socket", str(daemon.socket), "--token", token, "mcp"])
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                yield s


def sessions_of(daemon, token):
    with daemon.http(token=token) as c:
        return sorted(s["id"] for s in c.get("/v1/sessions").json())


@pytest.fixture(scope="module")
def quota_daemon(fresh_daemon_module):
    """Tokens, one run at a time per token, and a default policy of 1 MiB uploads."""
    return fresh_daemon_module(tokens=["tok-a", "tok-b"], policies={"default": SMALL_UPLOADS},
                               args=["--token-max-runs", "1", "--pool-size", "0"])


REFUSED = [
    ("run_python", {"code": "x" * (100 * 1024 + 1)}, "code_too_large"),
    ("run_python", {"code": "print(1)\0"}, "invalid_request"),
    ("run_python", {"code": "1", "timeout_s": -5}, "invalid_request"),
    ("run_python", {"code": "1", "timeout_s": 100000}, "invalid_request"),
    ("run_shell", {"command": "true", "timeout_s": 61}, "invalid_request"),
    ("run_python", {"code": "1", "session_id": "no such!"}, "invalid_session_id"),
    ("upload_file", {"path": "../x", "content_base64": "eA=="}, "invalid_path"),
    ("upload_file", {"path": "/etc/x", "content_base64": "eA=="}, "invalid_path"),
    ("upload_file", {"path": "", "content_base64": "eA=="}, "invalid_path"),
    ("upload_file", {"path": "a.txt", "content_base64": "***not base64***"}, "invalid_request"),
    ("upload_file", {"path": "big.bin", "content_base64": base64.b64encode(b"\1" * (3 << 19)).decode()},
     "upload_too_large"),
]


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_refused_calls_without_a_session_make_none(quota_daemon, transport):
    """Runs and uploads without session_id that the policy refuses (code size, NUL,
    timeouts, bad paths, bad base64, a 1.5 MiB upload against 1 MiB) each answer
    their error and leave the token's sessions as they were: none (18 such calls
    once left 18 sessions, and 32 filled max_sessions for the TTL)."""
    d = quota_daemon
    assert sessions_of(d, "tok-a") == []

    async def go():
        async with connect_as(d, transport, "tok-a") as s:
            return [(name, code, await s.call_tool(name, args)) for name, args, code in REFUSED]

    for name, code, r in asyncio.run(go()):
        assert r.is_error and text_of(r).startswith(f"error {code}: "), (name, code, text_of(r))
    assert sessions_of(d, "tok-a") == []


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_a_call_that_keeps_its_new_session_names_it(quota_daemon, transport):
    """A run or an upload without session_id that is accepted keeps the session it
    made and says so: its id, and how to use and close it."""
    d = quota_daemon

    async def go():
        async with connect_as(d, transport, "tok-a") as s:
            ran = await s.call_tool("run_python", {"code": "print('hi')"})
            up = await s.call_tool("upload_file", {"path": "in/x.txt", "content_base64": "eA=="})
            return ran, up

    ran, up = asyncio.run(go())
    made = []
    for r, sid in ((ran, session_id(ran)), (up, text_of(up).split("to session ")[1].split()[0])):
        text = text_of(r)
        assert not r.is_error, text
        assert f"note: this call made session {sid} (policy default); pass session_id {sid}" in text, text
        assert "close_session" in text, text
        made.append(sid)
    made.sort()
    assert sessions_of(d, "tok-a") == made
    with d.http(token="tok-a") as c:
        for sid in made:
            assert c.delete(f"/v1/sessions/{sid}").status_code == 200


def test_a_run_refused_after_its_session_was_made_closes_it(quota_daemon):
    """The policy passes, the session is made, then the run is refused (the token
    already has its one run going: max_runs): the session made for it is closed,
    and the error is the run's."""
    d = quota_daemon
    with d.http(token="tok-a") as c:
        busy = new_session(c)
    blocker = threading.Thread(target=lambda: d.run("import time; time.sleep(6)", client=d.http(token="tok-a"),
                                                      session_id=busy))
    blocker.start()
    try:
        with d.http(token="tok-a") as c:
            deadline = time.time() + 10
            while not c.get(f"/v1/sessions/{busy}").json()["busy"]:
                assert time.time() < deadline
                time.sleep(0.05)

        async def go():
            async with connect_as(d, "http", "tok-a") as s:
                return await s.call_tool("run_python", {"code": "print(1)"})

        r = asyncio.run(go())
        assert r.is_error and text_of(r).startswith("error max_runs: "), text_of(r)
        assert sessions_of(d, "tok-a") == [busy]
    finally:
        blocker.join()
    with d.http(token="tok-a") as c:
        assert c.delete(f"/v1/sessions/{busy}").status_code == 200


def test_a_cancelled_run_without_a_session_leaves_none(quota_daemon):
    """A run_python without session_id that the client cancels: the run is stopped and
    the session made for it closed."""
    d = quota_daemon

    async def go():
        async with connect_as(d, "http", "tok-b") as s:
            with anyio.move_on_after(2):
                await s.call_tool("run_python", {"code": "import time; time.sleep(30)"})

    asyncio.run(go())
    deadline = time.time() + 10
    while sessions_of(d, "tok-b") and time.time() < deadline:
        time.sleep(0.1)
    assert sessions_of(d, "tok-b") == []
    d.assert_clean()
