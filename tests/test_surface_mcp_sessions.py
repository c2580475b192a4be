"""MCP protocol sessions (streamable HTTP's Mcp-Session-Id): what one token can hold.

9,000 `initialize` calls in 8 s took the daemon from 14 MB to 771 MB (about 83 KB a
session, kept for 300 s), and a session answered any token that knew its id. Now
sessions are capped per token (`token_mcp_max_sessions`) and in the daemon
(`mcp_max_sessions`), initializes in flight included, with a 429 `max_sessions`
that says what to do; and a session answers only the token that made it: another
token's id gets exactly what an unknown id gets."""

import asyncio
import time

import httpx
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "flood", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LIST_TOOLS = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
UNKNOWN = "00000000-0000-4000-8000-000000000000"


def headers(token, sid=None):
    h = {**MCP_HEADERS, "Authorization": f"Bearer {token}"}
    if sid:
        h.update({"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-06-18"})
    return h


def initialize(client, token):
    """One initialize and its `initialized` notification; the response (its session id in the header)."""
    r = client.post("/mcp", json=INIT, headers=headers(token))
    if r.status_code == 200:
        sid = r.headers["mcp-session-id"]
        assert client.post("/mcp", json=INITIALIZED, headers=headers(token, sid)).status_code == 202
    return r


async def flood(url, token, count, concurrency=48):
    """`count` initializes from `concurrency` connections at once: [(status, session id, body)]."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:
        gate = asyncio.Semaphore(concurrency)

        async def one():
            async with gate:
                r = await c.post("/mcp", json=INIT, headers=headers(token))
                return r.status_code, r.headers.get("mcp-session-id"), r.headers.get("retry-after"), r.text

        return await asyncio.gather(*[one() for _ in range(count)])


def assert_full(answer, whose, limit, key):
    status, _, retry_after, body = answer
    assert status == 429, answer
    import json
    err = json.loads(body)["error"]
    assert err["code"] == "max_sessions", err
    assert err["message"].startswith(f"{whose} {limit} MCP sessions, its most ({key}): "), err
    assert "DELETE /mcp and its Mcp-Session-Id header" in err["message"], err
    assert retry_after is not None and 1 <= int(retry_after) <= 300, answer


def test_an_initialize_flood_is_capped_and_memory_stays_bounded(fresh_daemon):
    """3,000 initializes from 48 connections at once: exactly the token's cap of
    sessions is made (a burst does not pass it), every other one is 429
    max_sessions with Retry-After, and the daemon grows by the cap's worth (the
    uncapped daemon held ~83 KB per initialize: 240 MB here). A second token still
    initializes while the first is at its cap, up to the daemon's cap."""
    d = fresh_daemon(tokens=["tok-a", "tok-b"], args=[
        "--mcp-max-sessions", "150", "--token-mcp-max-sessions", "100", "--pool-size", "0"])
    with d.http(token="tok-a") as c:  # warm the listener and MCP once, then measure
        r = initialize(c, "tok-a")
        assert r.status_code == 200, r.text
        assert c.delete("/mcp", headers=headers("tok-a", r.headers["mcp-session-id"])).status_code == 202
    time.sleep(0.5)
    before = d.rss_kib()
    started = time.monotonic()
    answers = asyncio.run(flood(d.url, "tok-a", 3000))
    elapsed = time.monotonic() - started
    made = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] != 200]
    assert len(made) == 100 and len({a[1] for a in made}) == 100, (len(made), refused[:1])
    assert len(refused) == 2900
    for a in refused:
        assert_full(a, "this token holds", 100, "token_mcp_max_sessions")
    grown_mib = (d.rss_kib() - before) / 1024
    print(f"3000 initializes in {elapsed:.1f} s: {len(made)} sessions, daemon grew {grown_mib:.1f} MiB")
    assert grown_mib < 40, f"the daemon grew by {grown_mib:.0f} MiB"

    # Token B is not locked out by A: it initializes, up to the daemon's cap (150).
    answers = asyncio.run(flood(d.url, "tok-b", 80, concurrency=16))
    assert sum(a[0] == 200 for a in answers) == 50, [a[:2] for a in answers if a[0] != 200][:3]
    for a in (a for a in answers if a[0] != 200):
        assert_full(a, "the daemon holds", 150, "mcp_max_sessions")

    # A session deleted gives its place back, to its own token.
    with d.http(token="tok-a") as c:
        assert c.delete("/mcp", headers=headers("tok-a", made[0][1])).status_code == 202
        assert c.post("/mcp", json=LIST_TOOLS, headers=headers("tok-a", made[0][1])).status_code == 404
        r = initialize(c, "tok-a")
        assert r.status_code == 200, r.text
        assert initialize(c, "tok-a").status_code == 429
    grown_mib = (d.rss_kib() - before) / 1024
    assert grown_mib < 40, f"the daemon grew by {grown_mib:.0f} MiB"


def test_idle_sessions_expire_and_free_their_places(fresh_daemon):
    """With mcp_session_idle_s 3, a token at its cap is told when to retry, and after
    that its idle sessions are gone (404) and it initializes again."""
    d = fresh_daemon(tokens=["tok-a"], args=[
        "--mcp-max-sessions", "4", "--mcp-session-idle-s", "3", "--pool-size", "0"])
    with d.http(token="tok-a") as c:
        sids = [initialize(c, "tok-a").headers["mcp-session-id"] for _ in range(2)]
        full = c.post("/mcp", json=INIT, headers=headers("tok-a"))
        assert (full.status_code, full.json()["error"]["code"]) == (429, "max_sessions"), full.text
        assert full.headers["retry-after"] in ("1", "2", "3"), full.headers
        assert "(a session is closed once it has had no request for 3 s)" in full.json()["error"]["message"]
        # Used now: still there after a second; idle 3 s: gone.
        time.sleep(1)
        assert c.post("/mcp", json=LIST_TOOLS, headers=headers("tok-a", sids[0])).status_code == 200
        time.sleep(4.5)
        for sid in sids:
            gone = c.post("/mcp", json=LIST_TOOLS, headers=headers("tok-a", sid))
            assert (gone.status_code, gone.json()["error"]["code"]) == (404, "session_not_found"), gone.text
        assert initialize(c, "tok-a").status_code == 200
        assert initialize(c, "tok-a").status_code == 200


def test_a_call_longer_than_the_idle_time_keeps_its_session(fresh_daemon):
    """A session is idle only with no request in flight: a 6 s run under an idle time
    of 3 s (and no progress notifications) answers, and the session stays usable
    (rmcp's own keep-alive, which counted only messages, closed it mid-call); then,
    idle, it expires."""
    d = fresh_daemon(tokens=["tok-a"], args=["--mcp-session-idle-s", "3", "--pool-size", "0"])
    call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": "run_python", "arguments": {"code": "import time; time.sleep(6); print('slept')"}}}
    with d.http(token="tok-a") as c:
        sid = initialize(c, "tok-a").headers["mcp-session-id"]
        started = time.monotonic()
        r = c.post("/mcp", json=call, headers=headers("tok-a", sid), timeout=60)
        assert r.status_code == 200 and "slept" in r.text, r.text
        assert time.monotonic() - started >= 6
        assert c.post("/mcp", json=LIST_TOOLS, headers=headers("tok-a", sid)).status_code == 200
        time.sleep(5)
        gone = c.post("/mcp", json=LIST_TOOLS, headers=headers("tok-a", sid))
        assert (gone.status_code, gone.json()["error"]["code"]) == (404, "session_not_found"), gone.text
        # The run's session (made for the call) is kept and named, as the result said.
        made = r.text.split("note: this call made session ")[1].split()[0]
        assert c.delete(f"/v1/sessions/{made}").status_code == 200


def test_another_tokens_session_id_gets_the_unknown_id_answer(fresh_daemon):
    """Token B sends token A's session id on POST, GET and DELETE: each answer is
    exactly the answer to an id nobody has; A's session keeps working."""
    d = fresh_daemon(tokens=["tok-a", "tok-b"], args=["--pool-size", "0"])
    with d.http() as c:
        sid = initialize(c, "tok-a").headers["mcp-session-id"]
        sse = {**headers("tok-b", sid), "Accept": "text/event-stream"}

        def answers(token, session):
            h = headers(token, session)
            return [
                c.post("/mcp", json=LIST_TOOLS, headers=h),
                c.get("/mcp", headers={**h, "Accept": "text/event-stream"}),
                c.delete("/mcp", headers=h),
            ]

        def shape(r):
            return r.status_code, r.headers.get("content-type"), r.text

        foreign = answers("tok-b", sid)
        unknown = answers("tok-b", UNKNOWN)
        own_unknown = answers("tok-a", UNKNOWN)
        assert [shape(r) for r in foreign] == [shape(r) for r in unknown] == [shape(r) for r in own_unknown]
        assert foreign[0].status_code == 404 and foreign[0].json()["error"]["code"] == "session_not_found"
        assert sid not in foreign[0].text
        assert c.get("/mcp", headers=sse).status_code == 404
        # A's session was neither used nor deleted by B.
        r = c.post("/mcp", json=LIST_TOOLS, headers=headers("tok-a", sid))
        assert r.status_code == 200 and "run_python" in r.text, r.text
        assert c.delete("/mcp", headers=headers("tok-a", sid)).status_code == 202
        assert c.post("/mcp", json=LIST_TOOLS, headers=headers("tok-a", sid)).status_code == 404
        # Two Mcp-Session-Id headers are refused, whichever is first.
        two = c.post("/mcp", json=LIST_TOOLS, headers=[*headers("tok-a").items(), ("Mcp-Session-Id", UNKNOWN),
                                                       ("Mcp-Session-Id", sid)])
        assert (two.status_code, two.json()["error"]["code"]) == (400, "invalid_request"), two.text


def test_the_official_sdk_meets_the_cap_and_its_closes_free_places(fresh_daemon):
    """The MCP Python SDK (a client this project did not write): with a token at its
    cap of 2, a third client is refused (the SDK surfaces the 429 and its message);
    clients that exit send DELETE, and new ones then connect and call tools."""
    d = fresh_daemon(tokens=["tok-a"], args=["--mcp-max-sessions", "4", "--token-mcp-max-sessions", "2",
                                             "--pool-size", "0"])

    def sdk_client():
        return httpx2.AsyncClient(headers={"Authorization": "Bearer tok-a"}, timeout=60)

    async def go():
        async with sdk_client() as h1, sdk_client() as h2, sdk_client() as h3:
            async with streamable_http_client(f"{d.url}/mcp", http_client=h1) as s1, \
                    streamable_http_client(f"{d.url}/mcp", http_client=h2) as s2:
                async with ClientSession(*s1[:2]) as a, ClientSession(*s2[:2]) as b:
                    await a.initialize()
                    await b.initialize()
                    refused = None
                    try:
                        async with streamable_http_client(f"{d.url}/mcp", http_client=h3) as s3:
                            async with ClientSession(*s3[:2]) as c:
                                await asyncio.wait_for(c.initialize(), 30)
                    except BaseException as e:  # the SDK raises (or wraps) the HTTP error
                        refused = e
                    assert refused is not None
                    assert len((await a.list_tools()).tools) == 9
        async with sdk_client() as h4, sdk_client() as h5:
            async with streamable_http_client(f"{d.url}/mcp", http_client=h4) as s4, \
                    streamable_http_client(f"{d.url}/mcp", http_client=h5) as s5:
                async with ClientSession(*s4[:2]) as a, ClientSession(*s5[:2]) as b:
                    await a.initialize()
                    await b.initialize()
                    r = await a.call_tool("list_sessions", {})
                    assert not r.is_error
        return refused

    refused = asyncio.run(go())
    print(f"the SDK's refusal: {refused!r}")
    with d.http(token="tok-a") as c:
        # Every SDK client ended its session: the token has its 2 places.
        assert initialize(c, "tok-a").status_code == 200
        assert initialize(c, "tok-a").status_code == 200
        assert initialize(c, "tok-a").status_code == 429
