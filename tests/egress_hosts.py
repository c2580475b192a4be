"""The egress proxy's test hosts: real HTTP and HTTPS servers with a CA of their own, on
documentation addresses in a network namespace this process makes, the names that
lead to them (and to addresses the proxy must refuse) in a hosts file, and a small
upstream proxy. Nothing here leaves the machine, and nothing weakens the daemon's
refusal of loopback and private addresses: the test names simply resolve, through a
hosts file the test daemon alone sees (harness.Daemon(hosts_file=...)), to addresses
that are reachable on this host only.

    with TestHosts() as hosts:               # as root; one at a time per host
        hosts.bundle, hosts.hosts_file       # --ca-bundle and hosts_file of the daemon
        hosts.requests("api.test.example")   # what that server received

What `TestHosts` makes (`start()`, or entering `with`):
  - a network namespace with no name: only this process holds it (a file descriptor
    and the servers' sockets), so it goes away with the process, whatever kills it;
  - a veth pair `sdeg<8 hex>h` (host side: 198.51.100.1/24, fd12::2/64, a route
    10.9.8.7/32) and `sdeg<8 hex>n` (namespace side: 198.51.100.10, .11 and .12/24,
    10.9.8.7/32, fd12::1/64), lo up. The host routes TEST-NET-2 (198.51.100.0/24),
    which nothing else uses here, into it. 10.9.8.7 and fd12::1 are what the names
    `private.test.example` and `ula.test.example` lead to: the proxy must refuse
    them, and if it did not, the connection ends at a canary server here (whose
    record shows it) instead of leaving the machine. 169.254.169.254
    (`linklocal.test.example`) is not taken over: it may be this machine's own
    metadata service, so the proxy must refuse it before it connects;
  - echo servers, HTTP on port 80 and HTTPS on 443, on each of those five addresses.
    Their listening sockets are made inside the namespace; they are served by
    threads of this process (no process of their own to leave behind). HTTPS uses a
    certificate of the test CA for api/data/other.test.example and the three
    addresses; `untrusted.test.example` (SNI) gets one from a second CA that no
    bundle holds, `wrongname.test.example` the main one (which does not name it);
  - files in `hosts.dir` (/run/sandboxd-egress-hosts/<pid>-<hex>/): `ca.pem` (the
    test CA), `untrusted-ca.pem` (the second CA), `bundle.pem` (this host's
    /etc/ssl/certs/ca-certificates.crt, then the test CA: the daemon's --ca-bundle,
    so it trusts the real index and the test servers), `hosts` (the test names, then
    this host's /etc/hosts: localhost still resolves, and unknown names such as
    pypi.org still go to DNS through nsswitch), `requests/<address>.jsonl` (one JSON
    object per request a server received).

Servers (every method; `Connection: keep-alive` works; request bodies by
Content-Length or chunked):
  any path        200, JSON {"host", "method", "path", "headers" (lower-case name ->
                  value, repeats joined by ", "), "body" (text), "server" (the address
                  that answered), "port", "scheme", "sni" (HTTPS: the name the client
                  sent), "client" (the peer's address)}
  /reflect        the raw Authorization header of the request (text/plain)
  /reflect-reason 200 whose status line's reason phrase is that header
  /reflect-name   200 with a header named `X-` and that header (`X-Seen: 1` beside)
  /gzip           the echo, gzip-compressed (Content-Encoding: gzip), whatever the
                  request's Accept-Encoding
  /bytes?n=N      N bytes (b"x"), application/octet-stream
  /slow?s=S       the echo, after S seconds (cut short when the hosts stop)
  /status?code=N  the echo with status N
  /redirect?to=U  302 to U
  /__ready        "ready", not recorded (the readiness check)
Each request but /__ready is recorded before it is answered: `hosts.requests(...)`.

`UpstreamProxy`: an HTTP forward proxy (CONNECT and absolute-form) on 127.0.0.1, a
free port, that counts the connections it served and the targets it was asked for;
for a daemon started with HTTPS_PROXY/HTTP_PROXY = `proxy.url`.

Needs: root; `ip` (iproute2) and `nsenter` (util-linux), which
packaging/host-tools.sh --test installs; trustme (tests/requirements.txt); the host's
CA bundle.

Cleans up on exit (`close()`, also after an exception or Ctrl-C): servers stopped
and their threads joined, the veth pair deleted (its routes and addresses go with
it), the namespace released, `hosts.dir` removed. A process killed outright
(SIGKILL) leaves only `hosts.dir`: its namespace and so its veth pair and routes die
with it. The next `start()` removes what a dead run left (directories below
/run/sandboxd-egress-hosts and links named sdeg<8 hex>h): it holds an exclusive lock
(/run/sandboxd-egress-hosts.lock, which stays: removing a lock file races) for its
whole life, so whatever matches is no live run's. A second TestHosts on the host
waits for that lock (`lock_timeout`), then fails saying which pid holds it.

By hand (as root, with trustme installed):
    python3 tests/egress_hosts.py selftest   # starts the hosts, checks them, checks the clean-up
    python3 tests/egress_hosts.py serve      # starts them and waits (Ctrl-C or SIGTERM ends)
"""

import contextlib
import ctypes
import fcntl
import gzip
import http.client
import http.server
import ipaddress
import json
import os
import re
import secrets
import select
import shutil
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

NET = ipaddress.ip_network("198.51.100.0/24")  # TEST-NET-2: free on the build machines
HOST_SIDE = "198.51.100.1"
API, DATA, OTHER = "198.51.100.10", "198.51.100.11", "198.51.100.12"
# Where private.test.example and ula.test.example lead: routed into the namespace too
# (a /32 and a /64), so that a proxy that failed to refuse them reaches a canary here.
CANARY_V4 = "10.9.8.7"
CANARY_V6 = "fd12::1"
HOST_SIDE_V6 = "fd12::2"
V6_NET = ipaddress.ip_network("fd12::/64")
SERVED = (API, DATA, OTHER, CANARY_V4, CANARY_V6)
PORTS = (80, 443)

TLS_NAMES = ("api.test.example", "data.test.example", "other.test.example")
UNTRUSTED = "untrusted.test.example"  # its certificate comes from a CA no bundle holds
WRONG_NAME = "wrongname.test.example"  # served the main certificate, which does not name it

# name -> addresses, in the order the hosts file lists them.
NAMES = {
    "api.test.example": [API],
    "data.test.example": [DATA],
    "other.test.example": [OTHER],
    UNTRUSTED: [OTHER],
    WRONG_NAME: [OTHER],
    "loopback.test.example": ["127.0.0.1"],
    "private.test.example": [CANARY_V4],
    "linklocal.test.example": ["169.254.169.254"],
    "ula.test.example": [CANARY_V6],
    "mixed.test.example": [DATA, "127.0.0.1"],
    "mapped.test.example": ["::ffff:127.0.0.1"],
}

SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
ROOT = Path(os.environ.get("SANDBOXD_EGRESS_HOSTS_DIR", "/run/sandboxd-egress-hosts"))
# One lock for the host, wherever ROOT is: the addresses and link names are the host's.
LOCK = Path("/run/sandboxd-egress-hosts.lock")
LINK = re.compile(r"^sdeg[0-9a-f]{8}h$")

_libc = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNET = 0x40000000


def _run(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def _in_netns_thread(fn, nsfd=None):
    """fn() in a thread of its own that first enters the network namespace `nsfd`
    (or a new one): a socket belongs to the namespace it was made in, and the
    namespace change ends with the thread, never touching this process's others."""
    out = {}

    def body():
        try:
            rc = _libc.unshare(_CLONE_NEWNET) if nsfd is None else _libc.setns(nsfd, _CLONE_NEWNET)
            if rc != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"{'unshare' if nsfd is None else 'setns'}(CLONE_NEWNET): {os.strerror(err)}")
            out["value"] = fn()
        except BaseException as e:  # handed to the caller
            out["error"] = e

    t = threading.Thread(target=body, name="egress-hosts-netns")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def _links():
    try:
        return os.listdir("/sys/class/net")
    except FileNotFoundError:
        return []


class TestHosts:
    """See the module's notes. Attributes once started:

    dir, ca_pem, untrusted_ca_pem, bundle, hosts_file, records_dir (Paths);
    names ({name: [address, ...]}), served (the addresses with servers),
    link (the host side's veth), ipv6 (whether fd12::1 is served: False on a host
    without IPv6), ca (the trustme CA, e.g. for a client's context)."""

    __test__ = False  # a class named Test* that pytest must not collect
    _active = None

    def __init__(self, lock_timeout=120, system_bundle=SYSTEM_BUNDLE, root=ROOT):
        self.lock_timeout = lock_timeout
        self.system_bundle = Path(system_bundle)
        self.root = Path(root)
        self.token = secrets.token_hex(4)
        self.dir = self.root / f"{os.getpid()}-{self.token}"
        self.ca_pem = self.dir / "ca.pem"
        self.untrusted_ca_pem = self.dir / "untrusted-ca.pem"
        self.bundle = self.dir / "bundle.pem"
        self.hosts_file = self.dir / "hosts"
        self.records_dir = self.dir / "requests"
        self.names = {k: list(v) for k, v in NAMES.items()}
        self.link = f"sdeg{self.token}h"
        self.peer = f"sdeg{self.token}n"
        self.ipv6 = False
        self.served = ()
        self.ca = None
        self._lock_fd = None
        self._nsfd = None
        self._servers = []
        self._record_mu = threading.Lock()
        self.stopping = threading.Event()

    # --- life ------------------------------------------------------------------

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def start(self):
        if self.stopping.is_set():
            raise RuntimeError("a TestHosts starts once: make another")
        if TestHosts._active is not None:
            raise RuntimeError("a TestHosts of this process is running already (198.51.100.0/24 is one per host)")
        TestHosts._active = self
        try:
            self._take_lock()
            self._remove_stale()
            self._check_free()
            self._write_files()
            self._make_network()
            self._start_servers()
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        """Stop everything and remove what start() made; safe to call twice."""
        self.stopping.set()
        stoppers = [threading.Thread(target=s.stop, name="egress-hosts-stop") for s in self._servers]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        self._servers = []
        if self.link in _links():
            subprocess.run(["ip", "link", "del", self.link], capture_output=True)
        if self._nsfd is not None:
            os.close(self._nsfd)
            self._nsfd = None
        # A namespace is torn down by the kernel a moment after its last reference.
        deadline = time.monotonic() + 10
        while self.link in _links() and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                self.root.rmdir()  # when empty; the lock file stays (unlinking a lock races)
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None
        if TestHosts._active is self:
            TestHosts._active = None

    def _take_lock(self):
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                    os.close(fd)
                    raise RuntimeError(f"another TestHosts (pid {holder or '?'}) holds {LOCK}") from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _remove_stale(self):
        """With the lock held, whatever matches our names is a dead run's."""
        for name in _links():
            if LINK.match(name):
                subprocess.run(["ip", "link", "del", name], capture_output=True)
        if self.root.is_dir():
            for d in self.root.iterdir():
                shutil.rmtree(d, ignore_errors=True)

    def _check_free(self):
        """Refuse to start where another owner uses our addresses: a route at least
        as specific as ours, or one of the addresses, anywhere on the host."""
        ours = [NET, ipaddress.ip_network(f"{CANARY_V4}/32"), V6_NET]
        clashes = []
        for fam in ("-4", "-6"):
            for r in json.loads(_run("ip", "-j", fam, "route", "show", "table", "all") or "[]"):
                dst = r.get("dst", "default")
                if dst == "default":
                    continue
                try:
                    net = ipaddress.ip_network(dst, strict=False)
                except ValueError:
                    continue
                if any(net.version == o.version and net.subnet_of(o) for o in ours):
                    clashes.append(f"route {dst} dev {r.get('dev')}")
            for link in json.loads(_run("ip", "-j", fam, "addr", "show") or "[]"):
                for a in link.get("addr_info", []):
                    ip = ipaddress.ip_address(a["local"])
                    if any(ip.version == o.version and ip in o for o in ours):
                        clashes.append(f"address {ip} on {link['ifname']}")
        if clashes:
            raise RuntimeError(
                "the egress test addresses are in use on this host, by something that is not a "
                f"TestHosts: {sorted(set(clashes))}"
            )

    # --- files -----------------------------------------------------------------

    def _write_files(self):
        import trustme  # tests/requirements.txt

        if not self.system_bundle.is_file():
            raise RuntimeError(f"{self.system_bundle} is missing (Debian: apt-get install ca-certificates)")
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        self.dir.mkdir(mode=0o755)
        self.records_dir.mkdir(mode=0o700)
        self.ca = trustme.CA(organization_name="sandboxd egress tests")
        rogue = trustme.CA(organization_name="sandboxd egress tests, untrusted")
        main = self.ca.issue_cert(*TLS_NAMES, API, DATA, OTHER, CANARY_V4, CANARY_V6)
        bad = rogue.issue_cert(UNTRUSTED)
        self.ca.cert_pem.write_to_path(str(self.ca_pem))
        rogue.cert_pem.write_to_path(str(self.untrusted_ca_pem))
        system = self.system_bundle.read_bytes()
        self.bundle.write_bytes(system + (b"" if system.endswith(b"\n") else b"\n") + self.ca.cert_pem.bytes())
        lines = ["# sandboxd's egress test names (tests/egress_hosts.py)"]
        lines += [f"{addr} {name}" for name, addrs in self.names.items() for addr in addrs]
        lines += ["", f"# this host's /etc/hosts"]
        lines += Path("/etc/hosts").read_text().splitlines()
        self.hosts_file.write_text("\n".join(lines) + "\n")
        for f in (self.ca_pem, self.untrusted_ca_pem, self.bundle, self.hosts_file):
            os.chmod(f, 0o644)

        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        main.configure_cert(self._tls)
        untrusted = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        bad.configure_cert(untrusted)
        for ctx in (self._tls, untrusted):
            ctx.set_alpn_protocols(["http/1.1"])

        def sni(sock, name, _ctx):
            sock.sni = name  # the echo shows it
            if name == UNTRUSTED:
                sock.context = untrusted

        self._tls.sni_callback = sni

    # --- network ---------------------------------------------------------------

    def _make_network(self):
        self._nsfd = _in_netns_thread(lambda: os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC))
        ns = self.netns_path
        _run("ip", "link", "add", self.link, "type", "veth", "peer", "name", self.peer, "netns", ns)
        inside = ["nsenter", f"--net={ns}"]
        _run("ip", "addr", "add", f"{HOST_SIDE}/24", "dev", self.link)
        _run("ip", "link", "set", self.link, "up")
        _run("ip", "route", "add", f"{CANARY_V4}/32", "dev", self.link, "src", HOST_SIDE)
        _run(*inside, "ip", "link", "set", "lo", "up")
        for addr in (API, DATA, OTHER):
            _run(*inside, "ip", "addr", "add", f"{addr}/24", "dev", self.peer)
        _run(*inside, "ip", "addr", "add", f"{CANARY_V4}/32", "dev", self.peer)
        # IPv6 where the host has it (a host without it cannot send to fd12::1 either).
        try:
            _run("ip", "-6", "addr", "add", f"{HOST_SIDE_V6}/64", "dev", self.link, "nodad")
            _run(*inside, "ip", "-6", "addr", "add", f"{CANARY_V6}/64", "dev", self.peer, "nodad")
            self.ipv6 = True
        except RuntimeError:
            self.ipv6 = False
        _run(*inside, "ip", "link", "set", self.peer, "up")
        self.served = tuple(a for a in SERVED if self.ipv6 or a != CANARY_V6)

    @property
    def netns_path(self):
        """The namespace as a path (`nsenter --net=PATH`, `ip link ... netns PATH`)."""
        return f"/proc/{os.getpid()}/fd/{self._nsfd}"

    def in_netns(self, *cmd):
        """A command that runs `cmd` inside the hosts' network namespace."""
        return ["nsenter", f"--net={self.netns_path}", *cmd]

    def _start_servers(self):
        def listen():
            socks = []
            for addr in self.served:
                fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
                for port in PORTS:
                    s = socket.socket(fam, socket.SOCK_STREAM)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind((addr, port))
                    s.listen(128)
                    socks.append((addr, port, s))
            return socks

        for addr, port, sock in _in_netns_thread(listen, self._nsfd):
            srv = _EchoServer(self, sock, addr, port, self._tls if port == 443 else None)
            self._servers.append(srv)
            srv.thread.start()

    def _wait_ready(self, timeout=15):
        """Each server answers /__ready from the host's side (through the veth)."""
        client = ssl.create_default_context(cafile=str(self.ca_pem))
        client.check_hostname = False  # the canaries' addresses are named too; the CA is checked
        for addr in self.served:
            for port in PORTS:
                deadline = time.monotonic() + timeout
                while True:
                    cls = http.client.HTTPSConnection if port == 443 else http.client.HTTPConnection
                    kw = {"context": client} if port == 443 else {}
                    conn = cls(addr, port, timeout=2, **kw)
                    try:
                        conn.request("GET", "/__ready")
                        if conn.getresponse().read() == b"ready":
                            break
                    except OSError as e:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"the test host {addr}:{port} did not answer: {e}") from e
                        time.sleep(0.05)
                    finally:
                        conn.close()

    # --- records ---------------------------------------------------------------

    def address(self, name):
        """The first address of a test name (or an address, as it is)."""
        return self.names[name][0] if name in self.names else name

    def records_file(self, server):
        """requests/<address>.jsonl of a server (an address or a test name)."""
        return self.records_dir / f"{self.address(server)}.jsonl"

    def _record(self, addr, entry):
        line = json.dumps(entry, sort_keys=True) + "\n"
        with self._record_mu:
            path = self.records_dir / f"{addr}.jsonl"
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)

    def requests(self, server=None, host=None, path=None, scheme=None):
        """The requests the servers received, oldest first, each
        {"time", "server", "port", "scheme", "sni", "client", "method", "host",
        "path", "headers", "body"}: of one server (an address or a test name:
        "api.test.example" is 198.51.100.10, whatever Host was asked), with a Host
        header naming `host` (any port), a path beginning with `path`, by `scheme`."""
        files = [self.records_file(server)] if server else sorted(self.records_dir.glob("*.jsonl"))
        found = []
        with self._record_mu:
            for f in files:
                try:
                    found += [json.loads(line) for line in f.read_text().splitlines() if line]
                except FileNotFoundError:
                    continue
        found.sort(key=lambda r: r["time"])
        return [
            r for r in found
            if (host is None or (r["host"] or "").rsplit(":", 1)[0] == host or r["host"] == host)
            and (path is None or r["path"].startswith(path))
            and (scheme is None or r["scheme"] == scheme)
        ]

    def reset(self):
        """Forget every record (a test's own start)."""
        with self._record_mu:
            for f in self.records_dir.glob("*.jsonl"):
                f.unlink()


class _EchoServer(http.server.HTTPServer):
    """One listening socket (made in the namespace), served by threads of this
    process; stop() ends its connections and joins their threads."""

    def __init__(self, hosts, sock, addr, port, tls):
        socketserver.BaseServer.__init__(self, (addr, port), _EchoHandler)
        self.socket = sock
        self.server_name, self.server_port = addr, port
        self.hosts, self.addr, self.port, self.tls = hosts, addr, port, tls
        self._mu = threading.Lock()
        self._conns = set()
        self._handlers = set()
        self._stopped = False
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1},
                                       name=f"egress-host-{addr}:{port}", daemon=True)

    def process_request(self, request, client_address):
        t = threading.Thread(target=self._serve, args=(request, client_address), daemon=True,
                             name=f"egress-host-conn-{self.addr}:{self.port}")
        with self._mu:
            if self._stopped:
                request.close()
                return
            self._conns.add(request)
            self._handlers.add(t)
        t.start()

    def _serve(self, request, client_address):
        conn = request
        try:
            if self.tls:
                request.settimeout(10)
                conn = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
                with self._mu:
                    self._conns.discard(request)
                    if self._stopped:
                        return
                    self._conns.add(conn)
                conn.do_handshake()
            self.RequestHandlerClass(conn, client_address, self)
        except (OSError, ssl.SSLError, ValueError):
            pass  # a client that went away or did not speak TLS: nothing to answer
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            with self._mu:
                self._conns.discard(conn)
                self._conns.discard(request)
                self._handlers.discard(threading.current_thread())

    def stop(self):
        if self.thread.is_alive():
            self.shutdown()  # returns once serve_forever did
        self.socket.close()
        with self._mu:
            self._stopped = True
            conns, handlers = list(self._conns), list(self._handlers)
        for c in conns:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(c, socket.SHUT_RDWR)  # the fd, under any TLS state
        for t in handlers:
            t.join(10)


class _EchoHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sandboxd-test-host"
    sys_version = ""
    timeout = 30  # an idle keep-alive connection
    MAX_BODY = 64 << 20

    def log_message(self, *args):
        pass

    def __getattr__(self, name):
        if name.startswith("do_"):  # every method
            return self._answer
        raise AttributeError(name)

    def _read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = b""
            while True:
                size = int(self.rfile.readline(100).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return body
                if len(body) + size > self.MAX_BODY:
                    raise ValueError("body too large")
                body += self.rfile.read(size)
                self.rfile.readline(8)
        length = int(self.headers.get("Content-Length") or 0)
        if length > self.MAX_BODY:
            raise ValueError("body too large")
        return self.rfile.read(length) if length else b""

    def _send(self, status, body, ctype="application/json", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _answer(self):
        srv = self.server
        try:
            body = self._read_body()
        except ValueError:
            self.close_connection = True
            return self._send(413, b"request body too large or malformed\n", "text/plain")
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        try:
            for key, kind in (("n", int), ("code", int), ("s", float)):
                if key in query:
                    kind(query[key])
        except ValueError:
            return self._send(400, f"bad query {url.query!r}\n".encode(), "text/plain")
        if url.path == "/__ready":
            return self._send(200, b"ready", "text/plain")
        headers = {}
        for k, v in self.headers.items():
            k = k.lower()
            headers[k] = f"{headers[k]}, {v}" if k in headers else v
        echo = {
            "host": headers.get("host"),
            "method": self.command,
            "path": self.path,
            "headers": headers,
            "body": body.decode("utf-8", "replace"),
            "server": srv.addr,
            "port": srv.port,
            "scheme": "https" if srv.tls else "http",
            "sni": getattr(self.connection, "sni", None),
            "client": self.client_address[0],
        }
        srv.hosts._record(srv.addr, {"time": time.time(), **echo})
        if url.path == "/reflect":
            return self._send(200, headers.get("authorization", "").encode(), "text/plain")
        if url.path == "/reflect-reason":
            self.send_response(200, headers.get("authorization", "-"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if url.path == "/reflect-name":
            return self._send(200, b"", "text/plain", [("X-" + headers.get("authorization", "none"), "1"), ("X-Seen", "1")])
        if url.path == "/gzip":
            return self._send(200, gzip.compress(json.dumps(echo).encode()), "application/json",
                              [("Content-Encoding", "gzip")])
        if url.path == "/bytes":
            n = max(0, min(int(query.get("n", "0")), 1 << 30))
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(n))
            self.end_headers()
            if self.command != "HEAD":
                chunk = b"x" * 65536
                while n > 0:
                    self.wfile.write(chunk[:n])
                    n -= min(n, len(chunk))
            return None
        if url.path == "/redirect":
            return self._send(int(query.get("code", "302")), b"", "text/plain", [("Location", query.get("to", "/"))])
        status = 200
        if url.path == "/slow":
            srv.hosts.stopping.wait(max(0.0, min(float(query.get("s", "1")), 300.0)))
        elif url.path == "/status":
            status = max(200, min(int(query.get("code", "200")), 599))
        out = json.dumps(echo).encode() if status not in (204, 304) else b""
        return self._send(status, out)


# Code for a sandbox (test_egress.py, test_secrets.py): `fetch(url)` with the standard
# library (which takes HTTP_PROXY and HTTPS_PROXY from the environment, and trusts
# SSL_CERT_FILE): {"status", "body"}, with "reason" for an HTTP error, or {"error"}.
SANDBOX_FETCH = r'''
import json, os, ssl, sys, urllib.request, urllib.error
def fetch(url, data=None, headers=None):
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return {"status": r.status, "body": r.read().decode()}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "reason": e.reason, "body": e.read().decode()}
    except Exception as e:
        return {"error": repr(e)}
'''


# --- an upstream proxy: the daemon's own HTTPS_PROXY ------------------------------

class UpstreamProxy:
    """A forward proxy on 127.0.0.1 (a free port): CONNECT host:port, and requests in
    absolute form (GET http://host/path) sent on with `Connection: close`. Names
    are resolved through `names` ({name: [address, ...]}, e.g. TestHosts.names)
    first, then the host's resolver. With `test_net_only` (the default) it connects
    only to 198.51.100.0/24 and answers 403 for anything else, so no test sends
    traffic off the machine through it. With `auth=(user, password)`, a request
    without that Proxy-Authorization gets 407.

    url (http://127.0.0.1:PORT, with the credentials if any), port;
    connections (client connections accepted); targets (each "host:port" asked for,
    as asked); requests ([{"method", "target" (as on the request line), "hostport",
    "address" (what it connected to, or None), "status"}]); refused (the "host:port"
    it answered 403 or 407)."""

    __test__ = False

    def __init__(self, names=None, test_net_only=True, auth=None):
        self.names = dict(names or {})
        self.test_net_only = test_net_only
        self.auth = auth
        self.connections = 0
        self.targets = []
        self.requests = []
        self.refused = []
        self._mu = threading.Lock()
        self._socks = set()
        self._threads = set()
        self._listener = None
        self._acceptor = None
        self._stopped = False

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    @property
    def url(self):
        cred = f"{self.auth[0]}:{self.auth[1]}@" if self.auth else ""
        return f"http://{cred}127.0.0.1:{self.port}"

    def start(self):
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, name="upstream-proxy", daemon=True)
        self._acceptor.start()
        return self

    def close(self):
        with self._mu:
            self._stopped = True
            socks, threads = list(self._socks), list(self._threads)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
            self._listener.close()
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        for t in threads + [self._acceptor]:
            if t is not None:
                t.join(10)

    def reset(self):
        with self._mu:
            self.connections = 0
            self.targets, self.requests, self.refused = [], [], []

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(client,), daemon=True, name="upstream-proxy-conn")
            with self._mu:
                if self._stopped:
                    client.close()
                    return
                self.connections += 1
                self._socks.add(client)
                self._threads.add(t)
            t.start()

    def _resolve(self, host):
        host = host.strip("[]")
        try:
            return [str(ipaddress.ip_address(host))]
        except ValueError:
            pass
        if host.lower() in self.names:
            return list(self.names[host.lower()])
        return [ai[4][0] for ai in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)]

    def _serve(self, client):
        upstream = None
        try:
            client.settimeout(30)
            head = b""
            while b"\r\n\r\n" not in head:
                more = client.recv(65536)
                if not more or len(head) > 65536:
                    return
                head += more
            head, rest = head.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ", 2)
            headers = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:] if ":" in line]
            entry = {"method": method, "target": target, "address": None, "status": None}
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                path = None
            else:
                u = urllib.parse.urlsplit(target)
                if u.scheme != "http" or not u.hostname:
                    return self._refuse(client, entry, 400, "not an absolute http:// URL")
                host, port = u.hostname, str(u.port or 80)
                path = (u.path or "/") + (f"?{u.query}" if u.query else "")
            entry["hostport"] = f"{host}:{port}"
            with self._mu:
                self.targets.append(entry["hostport"])
                self.requests.append(entry)
            if self.auth:
                import base64
                want = "Basic " + base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
                if dict((k.lower(), v) for k, v in headers).get("proxy-authorization") != want:
                    return self._refuse(client, entry, 407, "proxy authentication required",
                                        [("Proxy-Authenticate", 'Basic realm="test"')])
            try:
                addrs = self._resolve(host)
            except OSError as e:
                return self._refuse(client, entry, 502, f"cannot resolve {host}: {e}")
            if self.test_net_only:
                addrs = [a for a in addrs if ipaddress.ip_address(a) in NET]
                if not addrs:
                    return self._refuse(client, entry, 403, f"{host} is not in {NET} (test_net_only)")
            entry["address"] = addrs[0]
            try:
                upstream = socket.create_connection((addrs[0], int(port)), timeout=10)
            except OSError as e:
                return self._refuse(client, entry, 502, f"cannot connect to {addrs[0]}:{port}: {e}")
            with self._mu:
                self._socks.add(upstream)
            if method == "CONNECT":
                entry["status"] = 200
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                keep = [(k, v) for k, v in headers
                        if k.lower() not in ("proxy-authorization", "proxy-connection", "connection", "keep-alive")]
                out = [f"{method} {path} {version}"] + [f"{k}: {v}" for k, v in keep] + ["Connection: close"]
                upstream.sendall(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
                entry["status"] = "forwarded"
            if rest:
                upstream.sendall(rest)
            self._relay(client, upstream)
        except (OSError, ValueError):
            pass
        finally:
            for s in (client, upstream):
                if s is not None:
                    with self._mu:
                        self._socks.discard(s)
                    s.close()
            with self._mu:
                self._threads.discard(threading.current_thread())

    def _refuse(self, client, entry, status, reason, extra=()):
        entry["status"] = status
        with self._mu:
            if status in (403, 407):
                self.refused.append(entry.get("hostport", entry["target"]))
        body = f"upstream proxy: {reason}\n".encode()
        head = [f"HTTP/1.1 {status} {http.client.responses.get(status, '')}",
                "Content-Type: text/plain", f"Content-Length: {len(body)}", "Connection: close",
                *(f"{k}: {v}" for k, v in extra)]
        client.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)

    @staticmethod
    def _relay(a, b):
        """Bytes both ways until both sides closed (a half-close is passed on)."""
        a.settimeout(None)
        b.settimeout(None)
        open_ = {a: b, b: a}
        while open_:
            ready, _, _ = select.select(list(open_), [], [], 60)
            if not ready:
                return  # idle for a minute
            for s in ready:
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                if data:
                    try:
                        open_[s].sendall(data)
                    except OSError:
                        return
                else:
                    with contextlib.suppress(OSError):
                        open_[s].shutdown(socket.SHUT_WR)
                    del open_[s]


# --- by hand ---------------------------------------------------------------------

def _selftest():  # noqa: C901 (a script)
    """Checks the hosts from the host's side without sandboxd, then the clean-up."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import harness  # the launcher a test daemon uses

    def sh(*cmd, ok=True):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if ok and r.returncode != 0:
            raise AssertionError(f"{cmd}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def state():
        return {
            "links": sorted(n for n in _links() if n.startswith("sdeg")),
            "routes": [line for fam in ("-4", "-6") for line in sh("ip", fam, "route", "show", "table", "all").stdout.splitlines()
                       if "198.51.100." in line or CANARY_V4 in line or "fd12:" in line],
            "netns": sorted(os.readlink(f"/proc/{os.getpid()}/fd/{fd}") for fd in os.listdir(f"/proc/{os.getpid()}/fd")
                            if os.path.exists(f"/proc/{os.getpid()}/fd/{fd}")
                            and os.readlink(f"/proc/{os.getpid()}/fd/{fd}").startswith("net:")),
            "children": sorted(p for p in os.listdir("/proc") if p.isdigit() and _ppid(p) == os.getpid()),
            "threads": sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()),
            "files": sorted(str(p) for p in ROOT.iterdir()) if ROOT.is_dir() else ["(no directory)"],
        }

    before = state()
    print("before:", before)  # what a killed run left (a directory), which start() removes
    assert not before["netns"] and not before["children"] and not before["threads"], before
    t0 = time.monotonic()
    with TestHosts() as h:
        print(f"started in {time.monotonic() - t0:.2f} s: {h.dir} (ipv6 canary: {h.ipv6})")
        during = state()
        print("during:", {k: during[k] for k in ("links", "routes", "netns")})
        assert during["links"] == [h.link] and any("198.51.100.0/24" in r for r in during["routes"]), during

        def curl(*args, ok=True):
            return sh("curl", "-sS", "--max-time", "10", *args, ok=ok)

        r = json.loads(curl("--cacert", str(h.bundle), "--resolve", f"api.test.example:443:{API}",
                            "-H", "Authorization: Bearer real-value", "https://api.test.example/echo").stdout)
        print("https api:", r)
        assert (r["server"], r["scheme"], r["sni"], r["path"], r["host"]) == (API, "https", "api.test.example", "/echo", "api.test.example")
        assert r["client"] == HOST_SIDE
        r = json.loads(curl("-X", "POST", "--data-binary", "hello body", "-H", "Host: data.test.example",
                            f"http://{DATA}/plain?x=1").stdout)
        print("http data:", r)
        assert (r["server"], r["method"], r["body"], r["path"]) == (DATA, "POST", "hello body", "/plain?x=1")
        r = json.loads(curl("-H", "Host: other.test.example", f"http://{OTHER}/o").stdout)
        assert r["server"] == OTHER, r
        # chunked upload, keep-alive (two requests on one connection), HEAD
        r = json.loads(curl("-H", "Transfer-Encoding: chunked", "--data-binary", "chunked!", f"http://{DATA}/c").stdout)
        assert r["body"] == "chunked!" and r["headers"]["transfer-encoding"] == "chunked", r
        two = curl("-v", f"http://{API}/k1", f"http://{API}/k2")
        assert "Re-using existing connection" in two.stderr or "Reusing existing connection" in two.stderr, two.stderr
        head = curl("-I", f"http://{API}/h").stdout.lower()
        assert head.startswith("http/1.1 200") and "content-length: " in head and "content-length: 0\r" not in head, head
        refl = curl("--cacert", str(h.bundle), "--resolve", f"api.test.example:443:{API}",
                    "-H", "Authorization: Bearer s3cret", "https://api.test.example/reflect").stdout
        assert refl == "Bearer s3cret", refl
        n = len(sh("curl", "-sS", f"http://{API}/bytes?n=1234567").stdout.encode())
        assert n == 1234567, n
        t = time.monotonic()
        curl(f"http://{API}/slow?s=0.5")
        assert 0.5 <= time.monotonic() - t < 3
        assert json.loads(curl("-w", "", f"http://{API}/status?code=418").stdout)["path"] == "/status?code=418"
        assert curl("-o", "/dev/null", "-w", "%{http_code} %{redirect_url}", f"http://{API}/redirect?to=http://other.test.example/").stdout \
            == "302 http://other.test.example/"
        # what the bundle must not accept
        bad = curl("--cacert", str(h.bundle), "--resolve", f"{UNTRUSTED}:443:{OTHER}", f"https://{UNTRUSTED}/", ok=False)
        print("untrusted:", bad.returncode, bad.stderr.strip())
        assert bad.returncode == 60, bad
        good = curl("--cacert", str(h.untrusted_ca_pem), "--resolve", f"{UNTRUSTED}:443:{OTHER}", f"https://{UNTRUSTED}/x")
        assert json.loads(good.stdout)["sni"] == UNTRUSTED
        bad = curl("--cacert", str(h.bundle), "--resolve", f"{WRONG_NAME}:443:{OTHER}", f"https://{WRONG_NAME}/", ok=False)
        print("wrong name:", bad.returncode, bad.stderr.strip())
        assert bad.returncode == 60, bad
        # the system CAs are in the bundle too
        assert h.bundle.read_bytes().startswith(SYSTEM_BUNDLE.read_bytes())
        # canaries
        assert json.loads(curl(f"http://{CANARY_V4}/canary").stdout)["server"] == CANARY_V4
        if h.ipv6:
            assert json.loads(curl(f"http://[{CANARY_V6}]/canary").stdout)["server"] == CANARY_V6
        # the records
        api = h.requests("api.test.example")
        print("records of api:", [(x["scheme"], x["method"], x["path"]) for x in api])
        assert [x["path"] for x in api][:1] == ["/echo"] and api[0]["headers"]["authorization"] == "Bearer real-value"
        assert "/__ready" not in [x["path"] for x in h.requests()]
        assert [x["body"] for x in h.requests(DATA, path="/plain")] == ["hello body"]
        assert h.requests(host="other.test.example", path="/o")[0]["server"] == OTHER
        assert h.records_file("api.test.example").read_text().count("\n") == len(api)
        h.reset()
        assert h.requests() == []

        # names: a process with the hosts file bind-mounted on /etc/hosts (the
        # harness's own launcher), and the host's resolver that does not know them
        launch = harness.hosts_file_launcher(h.hosts_file)
        print("launcher:", launch)
        inside = sh(*launch, "sh", "-c", "for n in api.test.example mixed.test.example mapped.test.example "
                    "ula.test.example loopback.test.example localhost pypi.org; do getent ahosts $n | "
                    "awk -v n=$n '$2==\"STREAM\"{print n, $1}'; done").stdout
        print("inside:", inside.replace("\n", "; "))
        for want in (f"api.test.example {API}", f"mixed.test.example {DATA}", "mixed.test.example 127.0.0.1",
                     "mapped.test.example ::ffff:127.0.0.1", "ula.test.example fd12::1",
                     "loopback.test.example 127.0.0.1", "localhost 127.0.0.1", "pypi.org "):
            assert want in inside, (want, inside)
        outside = sh("getent", "ahosts", "api.test.example", ok=False)
        print("host's getent api.test.example: exit", outside.returncode, repr(outside.stdout))
        assert outside.returncode == 2 and outside.stdout == ""
        assert "api.test.example" not in Path("/etc/hosts").read_text()

        # the upstream proxy: CONNECT by name, absolute form, refusals
        with UpstreamProxy(names=h.names) as up:
            r = json.loads(curl("-x", up.url, "--cacert", str(h.bundle), "https://api.test.example/via-connect").stdout)
            assert r["server"] == API and r["sni"] == "api.test.example", r
            r = json.loads(curl("-x", up.url, "http://data.test.example/via-absolute").stdout)
            assert (r["server"], r["path"], r["host"]) == (DATA, "/via-absolute", "data.test.example"), r
            assert "proxy-connection" not in r["headers"] and r["headers"]["connection"] == "close", r
            ref = curl("-x", up.url, "-o", "/dev/null", "-w", "%{http_code}", "http://loopback.test.example/", ok=False)
            assert ref.stdout == "403", ref
            print("upstream:", up.connections, up.targets, up.refused)
            assert up.connections == 3 and up.targets == ["api.test.example:443", "data.test.example:80",
                                                          "loopback.test.example:80"], up.targets
            assert up.refused == ["loopback.test.example:80"]
        with UpstreamProxy(names=h.names, auth=("u", "p")) as up:
            assert curl("-x", f"http://127.0.0.1:{up.port}", "-o", "/dev/null", "-w", "%{http_code}",
                        f"http://{API}/", ok=False).stdout == "407"
            assert json.loads(curl("-x", up.url, f"http://{API}/auth").stdout)["path"] == "/auth"
        # a slow request in flight when the hosts stop
        slow = subprocess.Popen(["curl", "-sS", "--max-time", "30", f"http://{API}/slow?s=60"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 5
        while not h.requests(path="/slow?s=60") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert h.requests(path="/slow?s=60")
        t = time.monotonic()
    print(f"closed in {time.monotonic() - t:.2f} s (a /slow?s=60 in flight)")
    slow.wait(10)
    after = state()
    print("after:", after)
    assert after == {"links": [], "routes": [], "netns": [], "children": [], "threads": [], "files": ["(no directory)"]}, after
    assert not any(LINK.match(n) for n in _links())
    fd = os.open(LOCK, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    os.close(fd)
    print("selftest: ok")


def _ppid(pid):
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "selftest"
    if what == "selftest":
        _selftest()
    elif what == "serve":
        import signal

        def stop(*_):
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, stop)  # also when started in the background, which ignores it
        signal.signal(signal.SIGTERM, stop)
        with TestHosts() as hosts:
            print(f"ready: {hosts.dir} (netns {hosts.netns_path}, link {hosts.link}); Ctrl-C ends", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                threading.Event().wait()
    else:
        sys.exit(f"usage: {sys.argv[0]} [selftest|serve]")
