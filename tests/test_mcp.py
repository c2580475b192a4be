"""MCP through both transports, driven by the official MCP Python SDK (a client
this project did not write): streamable HTTP at /mcp, and stdio via `sandboxctl mcp`."""

import asyncio
import base64
import struct
import subprocess
import time
from contextlib import asynccontextmanager

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from harness import CTL

TOOLS = {"run_python", "run_shell", "create_session", "list_sessions", "close_session", "install_packages", "upload_file",
         "list_files", "read_file"}


@asynccontextmanager
async def connect(daemon, transport):
    if transport == "http":
        async with streamable_http_client(f"{daemon.url}/mcp") as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                yield s
    else:
        params = StdioServerParameters(command=str(CTL), args=["--socket", str(daemon.socket), "mcp"])
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                yield s


def text_of(result):
    return "\n".join(c.text for c in result.content if c.type == "text")


def images_of(result):
    return [c for c in result.content if c.type == "image"]


def png_size(b64):
    data = base64.b64decode(b64)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def session_id(result):
    line = next(l for l in text_of(result).splitlines() if l.startswith("session_id:"))
    return line.split(":", 1)[1].strip()


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_tools_are_listed_with_schemas_descriptions_and_annotations(daemon, transport):
    async def go():
        async with connect(daemon, transport) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == TOOLS
            run = tools["run_python"]
            assert "code" in run.input_schema["properties"] and run.input_schema["required"] == ["code"]
            assert "persist" in run.description and "figures" in run.description
            assert run.annotations.read_only_hint is False and run.annotations.destructive_hint is True
            assert tools["list_files"].annotations.read_only_hint is True
            assert tools["close_session"].annotations.destructive_hint is True
            # The default policy's network, said to the model.
            assert "Network: only pypi.org, files.pythonhosted.org (through a proxy)" in run.description
            install = tools["install_packages"]
            assert install.input_schema["required"] == ["packages"]
            assert "A session holds up to 64 MiB of packages." in install.description  # the suite's default policy
    asyncio.run(go())


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_install_packages_then_import_them(daemon, transport):
    async def go():
        async with connect(daemon, transport) as s:
            made = await s.call_tool("install_packages", {"packages": ["six==1.16.0"]})
            assert not made.is_error, text_of(made)
            text = text_of(made)
            assert text.startswith("note: this call made session ") and "installed: six==1.16.0" in text, text
            sid = session_id(made)
            run = await s.call_tool("run_python", {"session_id": sid, "code": "import six; print(six.__version__)"})
            assert "--- stdout ---\n1.16.0" in text_of(run), text_of(run)
            bad = await s.call_tool("install_packages", {"session_id": sid, "packages": ["six==0.0.0"]})
            assert bad.is_error and text_of(bad).startswith("error package_install_failed: installing six==0.0.0 failed")
            assert "Next: read the installer's message above" in text_of(bad)
            # A refused install makes no session.
            before = text_of(await s.call_tool("list_sessions", {}))
            refused = await s.call_tool("install_packages", {"packages": ["--index-url=http://evil"]})
            assert refused.is_error and "error invalid_request" in text_of(refused)
            assert text_of(await s.call_tool("list_sessions", {})) == before
    asyncio.run(go())


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_every_tool_and_a_second_call_on_the_same_session(daemon, transport):
    async def go():
        async with connect(daemon, transport) as s:
            created = await s.call_tool("create_session", {"policy": "default"})
            assert not created.is_error
            sid = session_id(created)
            data = base64.b64encode(b"x,y\n1,2\n3,4\n").decode()
            up = await s.call_tool("upload_file", {"session_id": sid, "path": "in/data.csv", "content_base64": data})
            assert not up.is_error and "in/data.csv" in text_of(up)
            run = await s.call_tool("run_python", {"session_id": sid, "code": "import pandas as pd\ndf = pd.read_csv('in/data.csv')\nprint(df.y.sum())\ndf.to_csv('out.csv')"})
            assert not run.is_error, text_of(run)
            assert "status: ok" in text_of(run) and "--- stdout ---\n6" in text_of(run) and "out.csv" in text_of(run)
            again = await s.call_tool("run_shell", {"session_id": sid, "command": "ls in; wc -l < out.csv"})
            assert text_of(again).split("--- stdout ---\n")[1].startswith("data.csv\n3\n")
            files = text_of(await s.call_tool("list_files", {"session_id": sid}))
            assert '"path": "in/data.csv"' in files and '"path": "out.csv"' in files
            read = await s.call_tool("read_file", {"session_id": sid, "path": "in/data.csv"})
            assert text_of(read) == "x,y\n1,2\n3,4\n"
            listed = text_of(await s.call_tool("list_sessions", {}))
            assert sid in listed
            closed = await s.call_tool("close_session", {"session_id": sid})
            assert not closed.is_error
            gone = await s.call_tool("list_files", {"session_id": sid})
            assert gone.is_error and "session_not_found" in text_of(gone) and "create_session" in text_of(gone)
    asyncio.run(go())


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_plots_return_images_of_this_run_only_and_bounded(daemon, transport):
    async def go():
        async with connect(daemon, transport) as s:
            plot = await s.call_tool("run_python", {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])"})
            assert not plot.is_error
            imgs = images_of(plot)
            assert len(imgs) == 1 and imgs[0].mime_type == "image/png"
            sid = session_id(plot)
            plain = await s.call_tool("run_python", {"session_id": sid, "code": "print('no plot')"})
            assert images_of(plain) == []
            huge = await s.call_tool("run_python", {"session_id": sid, "code": (
                "import matplotlib.pyplot as plt\n"
                "for i in range(6):\n    plt.figure(figsize=(40, 30), dpi=100); plt.plot(range(i + 2))\n")})
            imgs = images_of(huge)
            assert 1 <= len(imgs) <= 4
            for img in imgs:
                assert len(base64.b64decode(img.data)) <= 1024 * 1024
                if img.mime_type == "image/png":
                    w, h = png_size(img.data)
                    assert w <= 1568 and h <= 1568
    asyncio.run(go())


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_bad_input_is_a_tool_error_and_the_transport_stays_healthy(daemon, transport):
    async def go():
        async with connect(daemon, transport) as s:
            cases = [
                ("run_python", {}),
                ("run_python", {"code": "1", "session_id": "no such session!"}),
                ("run_python", {"code": "1", "session_id": "missing"}),
                ("upload_file", {"path": "a.txt", "content_base64": "***not base64***"}),
                ("upload_file", {"path": "../escape", "content_base64": "eA=="}),
                ("read_file", {"session_id": "missing", "path": "x"}),
                ("run_python", {"code": "1", "timeout_s": -5}),
            ]
            for name, args in cases:
                r = await s.call_tool(name, args)
                assert r.is_error, (name, args)
                assert text_of(r).startswith("error ") or "missing field" in text_of(r), text_of(r)
            failing = await s.call_tool("run_python", {"code": "raise ValueError('nope')"})
            assert failing.is_error and "status: error (exit code 1)" in text_of(failing) and "ValueError: nope" in text_of(failing)
            assert len((await s.list_tools()).tools) == len(TOOLS)
            ok = await s.call_tool("run_python", {"code": "print(2 + 2)"})
            assert "--- stdout ---\n4" in text_of(ok)
    asyncio.run(go())


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_progress_and_cancellation(daemon, transport):
    async def go():
        async with connect(daemon, transport) as s:
            seen = []

            async def on_progress(progress, total, message):
                seen.append((progress, message))

            r = await s.call_tool("run_python", {"code": "import time; time.sleep(2.5); print('done')"}, progress_callback=on_progress)
            assert "done" in text_of(r)
            assert len(seen) >= 2 and all("running for" in m for _, m in seen)

            sid = session_id(await s.call_tool("create_session", {}))
            with anyio.move_on_after(2):
                await s.call_tool("run_python", {"session_id": sid, "code": "import time; time.sleep(60)"})
            return sid

    sid = asyncio.run(go())
    # The cancelled run is stopped: the session frees up and nothing is left behind.
    with daemon.http() as c:
        deadline = time.time() + 10
        while c.get(f"/v1/sessions/{sid}").json()["busy"] and time.time() < deadline:
            time.sleep(0.1)
        assert c.get(f"/v1/sessions/{sid}").json()["busy"] is False
    uid = daemon.session_uid(sid)
    left = subprocess.run(["ps", "-o", "pid,stat,etimes,args", "-u", str(uid)], capture_output=True, text=True).stdout
    assert len(left.strip().splitlines()) == 1, left
    daemon.assert_clean()

    async def reuse():
        async with connect(daemon, transport) as s:
            r = await s.call_tool("run_python", {"session_id": sid, "code": "print('still usable')"})
            assert "still usable" in text_of(r)
    asyncio.run(reuse())


def test_stdio_writes_only_protocol_to_stdout(daemon):
    init = (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
            b'"capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}\n')
    out = subprocess.run([str(CTL), "--socket", str(daemon.socket), "mcp"], input=init, capture_output=True, timeout=30)
    lines = [l for l in out.stdout.splitlines() if l.strip()]
    assert lines, out.stderr
    import json
    for line in lines:
        msg = json.loads(line)
        assert msg["jsonrpc"] == "2.0"
    assert json.loads(lines[0])["result"]["serverInfo"]["name"] == "sandboxd"


def test_kernel_sessions_through_mcp(daemon):
    async def go():
        async with connect(daemon, "http") as s:
            sid = session_id(await s.call_tool("create_session", {"mode": "kernel"}))
            await s.call_tool("run_python", {"session_id": sid, "code": "x = 20"})
            r = await s.call_tool("run_python", {"session_id": sid, "code": "x + 22"})
            assert "--- result ---\n42" in text_of(r)
            assert not (await s.call_tool("close_session", {"session_id": sid})).is_error
    asyncio.run(go())
    daemon.assert_clean()


def test_stdio_bridges_over_http_with_a_url_too(daemon):
    """`sandboxctl --url ... mcp` bridges to /mcp over HTTP, as over the socket."""
    async def go():
        params = StdioServerParameters(command=str(CTL), args=["--url", daemon.url, "mcp"])
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                assert {t.name for t in (await s.list_tools()).tools} == TOOLS
                ran = await s.call_tool("run_python", {"code": "print(6 * 7)"})
                assert "--- stdout ---\n42" in text_of(ran), text_of(ran)
                refused = await s.call_tool("run_python", {"code": "1", "policy": "strict"})
                assert refused.is_error and "unknown field `policy`" in text_of(refused), text_of(refused)
    asyncio.run(go())
