"""MCP and the CLI over the typed service layer (issue 12).

MCP used to paste a tool's `session_id` into a URL of the daemon's own API, so
`S/files/x` reached another route (a close_session call deleted file `x` and
reported success) and an id with a space came back as `unavailable: invalid uri
character`. Tool arguments are now checked as typed values first: whatever a
session_id holds, it is refused as `invalid_session_id` and nothing is touched.
Tool descriptions state the limits of the daemon's loaded default policy."""

import asyncio
import base64
import subprocess

import pytest

from conftest import new_session
from harness import CTL, REPO
from test_mcp import connect, text_of

INVALID_IDS = ["{sid}/files/x", "../{sid}", "{sid} x", "{sid}/run", "{sid}?x=1", "{sid}#x", "{sid}%2Ffiles%2Fx"]
ID_ERROR = "error invalid_session_id: invalid session id "


def session_with_file(daemon):
    """A session holding file `x`; returns its id."""
    with daemon.http() as c:
        sid = new_session(c)
        r = c.put(f"/v1/sessions/{sid}/files/x", content=b"keep me")
        assert r.status_code == 201, r.text
    return sid


def assert_intact(daemon, sid):
    with daemon.http() as c:
        r = c.get(f"/v1/sessions/{sid}")
        assert r.status_code == 200 and r.json()["busy"] is False, r.text
        r = c.get(f"/v1/sessions/{sid}/files/x")
        assert (r.status_code, r.content) == (200, b"keep me")


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_close_session_with_a_path_in_the_id_touches_nothing(daemon, transport):
    """`<id>/files/x` was routed to DELETE /v1/sessions/<id>/files/x: it is now the
    structured invalid-id error, and the session and its file `x` both remain."""
    sid = session_with_file(daemon)

    async def go():
        async with connect(daemon, transport) as s:
            return await s.call_tool("close_session", {"session_id": f"{sid}/files/x"})

    r = asyncio.run(go())
    assert r.is_error
    assert text_of(r).startswith(f'{ID_ERROR}"{sid}/files/x": use 1 to 64 letters, digits, `-` or `_`.'), text_of(r)
    assert_intact(daemon, sid)


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_every_session_tool_refuses_a_malformed_id_the_same_way(daemon, transport):
    """Spaces, paths, query and fragment characters and encoded slashes in a
    session_id, for every tool that takes one: the same invalid_session_id error
    (never `unavailable: invalid uri character`), and the session is untouched."""
    sid = session_with_file(daemon)
    data = base64.b64encode(b"overwritten").decode()
    with daemon.http() as c:
        before = sorted(x["id"] for x in c.get("/v1/sessions").json())

    async def go():
        answers = []
        async with connect(daemon, transport) as s:
            for pattern in INVALID_IDS:
                bad = pattern.format(sid=sid)
                for name, args in [
                    ("close_session", {"session_id": bad}),
                    ("list_files", {"session_id": bad}),
                    ("read_file", {"session_id": bad, "path": "x"}),
                    ("run_python", {"session_id": bad, "code": "open('x', 'w').write('gone')"}),
                    ("run_shell", {"session_id": bad, "command": "rm -f x"}),
                    ("upload_file", {"session_id": bad, "path": "x", "content_base64": data, "overwrite": True}),
                ]:
                    answers.append((bad, name, await s.call_tool(name, args)))
        return answers

    answers = asyncio.run(go())
    assert len(answers) == len(INVALID_IDS) * 6
    for bad, name, r in answers:
        text = text_of(r)
        assert r.is_error, (bad, name, text)
        assert text.startswith(f"{ID_ERROR}{bad!r}".replace("'", '"')), (bad, name, text)
        assert "uri" not in text.lower(), (bad, name, text)
    # No session was made for a refused run or upload, none was closed, and the
    # real one still holds its file.
    with daemon.http() as c:
        assert sorted(x["id"] for x in c.get("/v1/sessions").json()) == before
    assert_intact(daemon, sid)


def test_the_cli_sends_a_session_id_as_one_path_segment(daemon):
    """`sandboxctl sessions rm S/files/x` is the id `S/files/x`, refused by the
    daemon (exit 2, invalid_session_id), not DELETE of file x."""
    sid = session_with_file(daemon)
    for bad in [f"{sid}/files/x", f"{sid} x", f"../{sid}"]:
        r = subprocess.run([str(CTL), "--socket", str(daemon.socket), "sessions", "rm", bad],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert "(invalid_session_id)" in r.stderr and "invalid session id" in r.stderr, r.stderr
    r = subprocess.run([str(CTL), "--socket", str(daemon.socket), "files", "rm", f"{sid}/files", "x"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "(invalid_session_id)" in r.stderr, r.stderr
    assert_intact(daemon, sid)


def test_tool_descriptions_state_the_loaded_default_policy(fresh_daemon):
    """A daemon whose default policy has other limits says so in its tool
    descriptions, over HTTP and over stdio (read when the server starts)."""
    text = (REPO / "policies" / "default.toml").read_text()
    changed = {"timeout_s = 60": "timeout_s = 17", "memory_mb = 512": "memory_mb = 384",
               "output_kb = 100": "output_kb = 33", "upload_mb = 50": "upload_mb = 7",
               "mcp_inline_mb = 10": "mcp_inline_mb = 3"}
    for old, new in changed.items():
        assert old in text, old
        text = text.replace(old, new)
    d = fresh_daemon(policies={"default": text})

    async def descriptions(transport):
        async with connect(d, transport) as s:
            return {t.name: t.description for t in (await s.list_tools()).tools}

    for transport in ["http", "stdio"]:
        tools = asyncio.run(descriptions(transport))
        run = tools["run_python"]
        assert 'Limits per run (policy "default", the default): 17 s, 384 MiB memory, 1 CPU, 33 KiB of output per stream.' in run, (transport, run)
        assert "60 s" not in run and "512 MiB" not in run, (transport, run)
        assert "17 s" in tools["run_shell"], (transport, tools["run_shell"])
        assert "Up to 7 MiB by default; a tool call over MCP's HTTP transport carries at most 4 MiB" in tools["upload_file"], (transport, tools["upload_file"])
        assert "(3 MiB by default)" in tools["read_file"], (transport, tools["read_file"])
        assert "30 minutes" not in tools["create_session"], tools["create_session"]

    # The limit described is the one enforced.
    async def too_long():
        async with connect(d, "http") as s:
            return await s.call_tool("run_python", {"code": "1", "timeout_s": 18})

    r = asyncio.run(too_long())
    assert r.is_error and text_of(r).startswith("error invalid_request: timeout_s is 18; policy \"default\" allows more than 0 and at most 17 seconds"), text_of(r)
