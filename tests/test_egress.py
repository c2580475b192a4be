"""Network by policy: a sandbox whose policy says `network = "allowlist"` reaches the
hosts it names, and nothing else, through the daemon's egress proxy; the proxy
resolves names itself and refuses every name that leads to the host, its networks
or a metadata address, whatever the policy allows; `network = "none"` has no proxy
at all.

The hosts are the test's own (tests/egress_hosts.py): echo servers on documentation
addresses in a network namespace this process makes, their names in a hosts file
only the test daemon resolves through, and a CA of their own in the daemon's
--ca-bundle. Each case asserts what the sandbox saw (status line, errno), what the
run's `usage.net` and stderr say, and what the servers received (or did not).
"""

import json
import re
import socket
import time

import httpx
import pytest

from conftest import require
from egress_hosts import SANDBOX_FETCH

# Every name of the test hosts the policy allows: the reachable ones, and those that
# lead where no sandbox may go (the proxy must refuse them by address).
NET_POLICY = """
description = "The egress tests' hosts."
timeout_s = 30
network = "allowlist"
allow_hosts = ["api.test.example", "data.test.example", "loopback.test.example", "private.test.example",
               "linklocal.test.example", "ula.test.example", "mixed.test.example", "mapped.test.example",
               "untrusted.test.example", "198.51.100.1", "169.254.169.254"]
allow_ports = [80, 443]
packages_mb = 0
"""

FETCH = SANDBOX_FETCH


def fetch(daemon, calls, **fields):
    """Run FETCH + `calls` (Python that prints json.dumps(...)); its printed object, and
    the whole result."""
    result = daemon.run(FETCH + calls, **fields)
    assert result["status"] == "ok", result
    return json.loads(result["stdout"].strip().splitlines()[-1]), result


# A private mirror that is down: its host is allowed, nothing listens on its port.
MIRROR_DOWN_POLICY = """
network = "allowlist"
allow_hosts = ["api.test.example"]
allow_ports = [8443]
index_url = "https://api.test.example:8443/simple"
packages_mb = 16
install_timeout_s = 60
"""


@pytest.fixture(scope="module")
def net(egress_daemon):
    return egress_daemon(policy=NET_POLICY, name="net", policies={"mirror-down": MIRROR_DOWN_POLICY})


def test_allowed_hosts_are_reached_over_https_and_plain_http(net, test_hosts):
    test_hosts.reset()
    out, result = fetch(net, '''
print(json.dumps({
    "https": fetch("https://api.test.example/echo?x=1"),
    "http": fetch("http://data.test.example/echo", data=b"hello", headers={"X-Test": "1"}),
}))
''', policy="net")
    https = json.loads(out["https"]["body"])
    assert (out["https"]["status"], https["server"], https["scheme"], https["sni"]) == (200, "198.51.100.10", "https", "api.test.example")
    assert https["path"] == "/echo?x=1"
    http = json.loads(out["http"]["body"])
    assert (http["server"], http["scheme"], http["body"], http["headers"]["x-test"]) == ("198.51.100.11", "http", "hello", "1")
    # The request came from the daemon (the host's side of the test link), not the sandbox.
    assert https["client"] == "198.51.100.1"
    # Proxy headers are not passed on; the Host is the one the request was checked for.
    assert "proxy-connection" not in http["headers"] and http["host"] == "data.test.example"
    assert len(test_hosts.requests("api.test.example", path="/echo?x=1")) == 1
    got = result["usage"]["net"]
    assert got["hosts"] == ["api.test.example:443", "data.test.example:80"]
    assert got["connections"] == 2 and got["refused"] == [] and got["refused_total"] == 0
    assert got["bytes_in"] > 500 and got["bytes_out"] > 100 and got["cached_bytes"] == 0


def test_a_host_the_policy_does_not_name_is_refused_with_its_reason(net, test_hosts):
    test_hosts.reset()
    out, result = fetch(net, '''
print(json.dumps({"https": fetch("https://other.test.example/"), "http": fetch("http://other.test.example/")}))
''', policy="net")
    reason = ('host_not_allowed: other.test.example is not in allow_hosts of policy "net" (api.test.example, '
              'data.test.example, loopback.test.example, private.test.example, linklocal.test.example, ula.test.example, '
              'mixed.test.example, mapped.test.example and 3 more); only those hosts are reachable')
    # urllib prints a refused CONNECT's status line: the reason is in it.
    assert out["https"]["error"] == f"URLError(OSError('Tunnel connection failed: 403 {reason}'))"
    assert (out["http"]["status"], out["http"]["reason"], out["http"]["body"]) == (403, reason, reason + "\n")
    assert test_hosts.requests("other.test.example") == []
    net_usage = result["usage"]["net"]
    assert [(r["host"], r["code"]) for r in net_usage["refused"]] == [
        ("other.test.example:443", "host_not_allowed"), ("other.test.example:80", "host_not_allowed")]
    assert net_usage["refused_total"] == 2 and net_usage["hosts"] == []
    # Clients that print only "403" (curl, uv) still show why: the run's stderr says.
    assert f"sandboxd: the egress proxy refused other.test.example:443: {reason}\n" in result["stderr"]


@pytest.mark.parametrize("name,address,why", [
    ("loopback.test.example", "127.0.0.1", "a loopback address"),
    ("private.test.example", "10.9.8.7", "a private address"),
    ("linklocal.test.example", "169.254.169.254", "a link-local address (the cloud metadata service is one)"),
    ("ula.test.example", "fd12::1", "a unique-local (private) address"),
    ("mixed.test.example", "127.0.0.1", "a loopback address"),
    ("mapped.test.example", "::ffff:127.0.0.1", "a loopback address"),
])
def test_a_name_that_leads_to_the_host_or_a_private_network_is_refused(net, test_hosts, name, address, why):
    test_hosts.reset()
    out, result = fetch(net, f'''
print(json.dumps({{"https": fetch("https://{name}/"), "http": fetch("http://{name}/")}}))
''', policy="net")
    reason = f"address_not_allowed: {name} resolves to {address}, {why}; sandboxes never reach it"
    assert out["https"]["error"] == f"URLError(OSError('Tunnel connection failed: 403 {reason}'))"
    assert out["http"]["status"] == 403 and out["http"]["reason"] == reason
    assert [r["code"] for r in result["usage"]["net"]["refused"]] == ["address_not_allowed"] * 2
    # The canaries behind the private addresses (and the mixed name's public one)
    # never saw a connection.
    assert test_hosts.requests() == []


def test_addresses_of_the_host_itself_and_the_metadata_service_are_refused_as_literals(net, test_hosts):
    test_hosts.reset()
    out, result = fetch(net, '''
print(json.dumps({"own": fetch("http://198.51.100.1/"), "metadata": fetch("http://169.254.169.254/latest/meta-data/")}))
''', policy="net")
    assert out["own"]["reason"] == ("address_not_allowed: 198.51.100.1 is an address of the sandboxd host itself; "
                                    "sandboxes never reach it")
    assert out["metadata"]["reason"] == ("address_not_allowed: 169.254.169.254 is a link-local address (the cloud "
                                         "metadata service is one); sandboxes never reach it")
    assert test_hosts.requests() == []


def test_a_port_the_policy_does_not_name_is_refused(net, test_hosts):
    out, result = fetch(net, 'print(json.dumps({"r": fetch("https://api.test.example:8443/")}))', policy="net")
    reason = 'port_not_allowed: port 8443 of api.test.example is not in allow_ports of policy "net" (80, 443)'
    assert out["r"]["error"] == f"URLError(OSError('Tunnel connection failed: 403 {reason}'))"


def test_a_server_the_host_bundle_does_not_vouch_for_fails_tls_in_the_sandbox(net, test_hosts):
    # The tunnel is relayed as it is: the sandbox's own client checks the server
    # against the bundle it was given (the host's CAs, the proxy's), and refuses.
    out, _ = fetch(net, 'print(json.dumps({"r": fetch("https://untrusted.test.example/")}))', policy="net")
    assert "CERTIFICATE_VERIFY_FAILED" in out["r"]["error"], out


def test_a_tunnel_must_ask_its_tls_for_the_host_it_named(net, test_hosts):
    """No domain fronting through a relayed CONNECT: the TLS inside must name the
    CONNECT's host (and be TLS at all); otherwise the tunnel is closed before a byte
    reaches the server, and the run is told why."""
    test_hosts.reset()
    out, result = fetch(net, r'''
import socket
def tunnel(target, first=None, sni=None, path="/fronted"):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    answer = s.recv(4096).split(b"\r\n")[0].decode()
    try:
        if first is not None:
            s.sendall(first)
            return [answer, s.recv(4096).decode()]
        ctx = ssl.create_default_context()
        with ctx.wrap_socket(s, server_hostname=sni) as t:
            t.sendall(f"GET {path} HTTP/1.1\r\nHost: {sni}\r\n\r\n".encode())
            return [answer, t.recv(4096).decode()[:12]]
    except OSError as e:
        return [answer, type(e).__name__]
print(json.dumps({
    "fronted": tunnel("api.test.example:443", sni="data.test.example"),
    "plain": tunnel("data.test.example:80", first=b"GET /inside HTTP/1.1\r\nHost: data.test.example\r\n\r\n"),
    "honest": tunnel("api.test.example:443", sni="api.test.example", path="/honest"),
}))
''', policy="net")
    assert out["honest"] == ["HTTP/1.1 200 OK", "HTTP/1.1 200"], out
    # The 200 was sent before the hello came: the refusal can only close the tunnel.
    assert out["fronted"][0] == "HTTP/1.1 200 OK" and out["fronted"][1] in ("SSLEOFError", "SSLZeroReturnError", "ConnectionResetError"), out
    assert out["plain"] == ["HTTP/1.1 200 OK", ""], out
    assert test_hosts.requests(path="/fronted") == [] and test_hosts.requests(path="/inside") == []
    assert test_hosts.requests("api.test.example", path="/honest")[0]["sni"] == "api.test.example"
    refused = {r["host"]: r for r in result["usage"]["net"]["refused"]}
    assert refused["api.test.example:443"]["code"] == "tunnel_refused"
    assert refused["api.test.example:443"]["message"] == "the tunnel to api.test.example asks its TLS for data.test.example"
    assert refused["data.test.example:80"]["code"] == "tunnel_refused"
    assert refused["data.test.example:80"]["message"].startswith("the proxy relays only TLS through CONNECT (")
    assert "sandboxd: the egress proxy refused api.test.example:443: tunnel_refused: " in result["stderr"]


def test_the_proxy_port_is_the_only_one_reachable_from_inside(net, test_hosts):
    with net.http() as c:
        require(c.get("/v1/health").json()["landlock_abi"] >= 4, "Landlock ABI 4 (TCP rules)")
    test_hosts.reset()
    result = net.run(f'''
import errno, json, os, socket
def err(f, *a):
    try:
        f(*a)
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def connect(host, port):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(3)
    try:
        return err(s.connect, (host, port))
    finally:
        s.close()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
listening = [l.split()[1] for l in open("/proc/net/tcp").read().splitlines()[1:] if l.split()[3] == "0A"]
try:
    socket.getaddrinfo("api.test.example", 443)
    dns = "resolved"
except socket.gaierror as e:
    dns = e.errno
print(json.dumps({{
    "proxy": connect("127.0.0.1", 3128),
    "others": sorted({{p: connect("127.0.0.1", p) for p in (22, 80, 443, 3127, 3129, 8080, {net.port}, 65535)}}.items()),
    "test_host_direct": connect("198.51.100.10", 443),
    "test_host_direct6": connect("fd12::1", 443),
    "udp": err(udp.sendto, b"x", ("198.51.100.10", 53)),
    "bind": err(socket.socket().bind, ("127.0.0.1", 8080)),
    "dns": dns,
    "listening": listening,
    "env": {{k: os.environ.get(k) for k in ("HTTPS_PROXY", "http_proxy", "NO_PROXY", "SSL_CERT_FILE")}},
}}))
''', policy="net")
    out = json.loads(result["stdout"])
    assert out["proxy"] == "ok"
    assert out["others"] == [[p, "EACCES"] for p in sorted({22, 80, 443, 3127, 3129, 8080, net.port, 65535})]
    assert (out["test_host_direct"], out["test_host_direct6"], out["bind"]) == ("EACCES", "EACCES", "EACCES")
    assert out["udp"] == "ENETUNREACH" and out["dns"] == socket.EAI_AGAIN
    # The one socket listening in the sandbox's namespace is the proxy's, on 127.0.0.1:3128.
    assert out["listening"] == ["0100007F:0C38"]
    assert out["env"] == {"HTTPS_PROXY": "http://127.0.0.1:3128", "http_proxy": "http://127.0.0.1:3128",
                          "NO_PROXY": "localhost,127.0.0.1,::1", "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}
    assert test_hosts.requests() == []


def test_a_policy_without_network_has_no_proxy_at_all(net):
    result = net.run(r'''
import errno, json, os, socket
s = socket.socket()
try:
    s.connect(("127.0.0.1", 3128))
    r = "ok"
except OSError as e:
    r = errno.errorcode[e.errno]
listening = [l.split()[1] for l in open("/proc/net/tcp").read().splitlines()[1:] if l.split()[3] == "0A"]
print(json.dumps({"proxy": r, "listening": listening, "proxy_env": [k for k in os.environ if "PROXY" in k.upper()]}))
''', policy="strict")
    assert json.loads(result["stdout"]) == {"proxy": "EACCES", "listening": [], "proxy_env": []}
    assert "net" not in result["usage"]


@pytest.mark.parametrize("mode", ["pooled", "kernel"])
def test_pooled_and_kernel_sandboxes_go_through_the_proxy_too(net, test_hosts, mode):
    test_hosts.reset()
    with net.http() as c:
        body = {"policy": "net"}
        if mode == "kernel":
            body["mode"] = "kernel"
        sid = c.post("/v1/sessions", json=body).json()["id"]
        if mode == "pooled":
            net.wait_pool_ready("net")
        before = c.get("/metrics").text
        runs = []
        for i in range(2):
            r = c.post(f"/v1/sessions/{sid}/runs", json={"code": FETCH + f'''
print(json.dumps(fetch("https://api.test.example/echo/{mode}/{i}")["status"]))
print(json.dumps(fetch("https://other.test.example/")))
'''})
            assert r.status_code == 200, r.text
            runs.append(r.json())
        after = c.get("/metrics").text
    for i, r in enumerate(runs):
        assert r["status"] == "ok" and r["stdout"].splitlines()[0] == "200", r
        assert r["usage"]["net"]["hosts"] == ["api.test.example:443"]
        # Each run (or cell) counts its own use, the first cell's not again.
        assert r["usage"]["net"]["connections"] == 2 and r["usage"]["net"]["refused_total"] == 1
        assert len(test_hosts.requests("api.test.example", path=f"/echo/{mode}/{i}")) == 1
    want = {"pooled": 'mode="pooled"', "kernel": 'mode="kernel"'}[mode]
    count = lambda text: sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith("sandboxd_runs_total{") and want in l)
    assert count(after) - count(before) == 2


def test_connections_are_logged_with_their_session_and_run_and_counted(net, test_hosts):
    with net.http() as c:
        before = c.get("/metrics").text
    _, result = fetch(net, 'print(json.dumps([fetch("https://api.test.example/"), fetch("https://other.test.example/")]))',
                      policy="net")
    with net.http() as c:
        after = c.get("/metrics").text
    log = net.log_text()
    connection = [l for l in log.splitlines() if "egress connection" in l and result["run_id"] in l]
    assert connection and "api.test.example:443" in connection[0] and result["session_id"] in connection[0]
    refused = [l for l in log.splitlines() if "egress refused" in l and result["run_id"] in l]
    assert refused and "host_not_allowed" in refused[0]

    def metric(text, name):
        return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name))
    assert metric(after, "sandboxd_egress_connections_total") - metric(before, "sandboxd_egress_connections_total") == 1
    key = 'sandboxd_egress_refusals_total{code="host_not_allowed"}'
    assert metric(after, key) - metric(before, key) == 1
    grew = metric(after, 'sandboxd_egress_bytes_total{direction="in"}') - metric(before, 'sandboxd_egress_bytes_total{direction="in"}')
    assert grew >= result["usage"]["net"]["bytes_in"] > 0


def test_the_daemons_own_outbound_proxy_is_honoured(egress_daemon, test_hosts, upstream_proxy):
    d = egress_daemon(policy=NET_POLICY, name="net",
                      env={"HTTPS_PROXY": upstream_proxy.url, "HTTP_PROXY": upstream_proxy.url})
    test_hosts.reset()
    out, _ = fetch(d, 'print(json.dumps([fetch("https://api.test.example/via"), fetch("http://data.test.example/via")]))',
                   policy="net")
    assert [o["status"] for o in out] == [200, 200], out
    # Asked for the address the daemon checked, never the name (the upstream's own
    # resolution could lead elsewhere).
    checked = {f"{test_hosts.address('api.test.example')}:443", f"{test_hosts.address('data.test.example')}:80"}
    assert set(upstream_proxy.targets) >= checked, upstream_proxy.targets
    assert not any(t.split(":")[0].endswith(".example") for t in upstream_proxy.targets)
    # Names leading to the host are still refused before anything is asked of it.
    out, _ = fetch(d, 'print(json.dumps(fetch("http://loopback.test.example/")))', policy="net")
    assert out["status"] == 403 and "address_not_allowed" in out["reason"]
    assert not any(t.startswith("loopback.") for t in upstream_proxy.targets)


def test_a_policy_that_allows_no_host_does_not_load(fresh_daemon):
    with pytest.raises(RuntimeError) as e:
        fresh_daemon(policies={"bad": 'network = "allowlist"\nallow_hosts = []\n'})
    assert 'field `allow_hosts` is [] with network = "allowlist"; allowed: at least one host (or network = "none")' in str(e.value)


def test_an_index_that_is_down_fails_the_install_saying_so_and_installs_nothing(net):
    with net.http() as c:
        sid = c.post("/v1/sessions", json={"policy": "mirror-down"}).json()["id"]
        r = c.post(f"/v1/sessions/{sid}/packages", json={"packages": ["six==1.16.0"]}, timeout=120)
        assert r.status_code == 422 and r.json()["error"]["code"] == "package_install_failed", r.text
        message = r.json()["error"]["message"]
        # The installer's words, then the proxy's: the mirror's port refused the connection.
        assert message.startswith("installing six==1.16.0 failed:"), message
        assert "nothing was installed, the session's packages are as they were" in message
        assert ("sandboxd: the egress proxy refused api.test.example:8443: connect_failed: "
                "api.test.example:8443: ") in message and "refused" in message.rsplit("connect_failed", 1)[1], message
        # Nothing half-made: the layer holds nothing, and a run imports nothing of it.
        # (Its empty site directory is made by the interpreter that looks for it.)
        after = c.post(f"/v1/sessions/{sid}/runs", json={"code": "import os\nprint([os.path.join(r, f) for r, _, fs in os.walk('/opt/packages') for f in fs])\nimport six"}).json()
        assert after["stdout"] == "[]\n", after
        assert "ModuleNotFoundError: No module named 'six'" in after["stderr"]
        c.delete(f"/v1/sessions/{sid}")
