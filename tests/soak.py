#!/usr/bin/env python3
"""Soak: mixed workloads from 8 concurrent clients against one real daemon, with a
SIGKILL + restart and a SIGTERM (graceful stop) + restart in the middle.

Asserts 0 wrong results (every run's code prints something derived from a random
nonce, checked exactly), 0 results lost outside the two faults (a request in flight
while the daemon is down may fail with a connection error or 503: counted apart),
sessions and their files intact across the restarts (read back with the same hash),
and after the final stop nothing of the daemon's instance left on the host:
processes, mounts under its directory, loop devices backed by its files, cgroup
directories of its --instance in any hierarchy.

    tests/soak.py --runs 2000        (make soak)
    tests/soak.py --duration 300     (stop starting new work after 300 s)

tests/test_soak.py runs a short version in the suite.
"""

import argparse
import collections
import hashlib
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import UID_SPAN, Daemon, scratch_dir  # noqa: E402

CLIENTS = 8
# kind -> weight
MIX = {
    "script": 14, "pooled": 22, "kernel": 14, "shell": 10, "file": 14, "readback": 8,
    "plot": 5, "timeout": 2, "oom": 2, "session": 5, "oneshot": 4,
}


class Down(Exception):
    """The daemon did not answer (connection error, or 503 while it drains)."""


class Wrong(Exception):
    """The daemon answered, and the answer is not what the code must produce."""


def nonce():
    return random.randrange(10**6, 10**9)


def sha(data):
    return hashlib.sha256(data).hexdigest()


class Soak:
    def __init__(self, runs, duration, log=print):
        self.runs = runs
        self.duration = duration
        self.log = log
        self.daemon = Daemon(scratch_dir("soak-"))
        self.lock = threading.Lock()
        self.started = 0
        self.finished = 0
        self.epoch = 0  # bumped when a fault begins and when it ends
        self.up = threading.Event()
        self.outcomes = collections.Counter()  # (kind, outcome)
        self.problems = []  # (kind, outcome, detail), first few
        self.workers = {}  # worker -> {"sid", "kernel", "files": {path: hash}}
        self.faults = []
        self.checks = collections.Counter()
        self.drain = []  # what new clients got while SIGTERM drained
        self.held = None  # how the run in flight when SIGTERM came ended

    # --- work ---------------------------------------------------------------

    def client(self):
        return self.daemon.http(timeout=120)

    def call(self, c, method, url, expect, **kw):
        try:
            r = c.request(method, url, **kw)
        except httpx.TransportError as e:
            raise Down(f"{method} {url}: {type(e).__name__}") from e
        if r.status_code == 503:
            raise Down(f"{method} {url}: 503 {r.text[:200]}")
        if r.status_code != expect:
            raise Wrong(f"{method} {url}: {r.status_code} (want {expect}) {r.text[:300]}")
        return r

    def run(self, c, body, sid=None):
        url = f"/v1/sessions/{sid}/runs" if sid else "/v1/runs"
        return self.call(c, "POST", url, 200, json=body).json()

    @staticmethod
    def want(res, status, stdout=None, contains=None):
        if res.get("status") != status:
            raise Wrong(f"status {res.get('status')} (want {status}): {str(res)[:400]}")
        if stdout is not None and res.get("stdout") != stdout:
            raise Wrong(f"stdout {res.get('stdout')!r} (want {stdout!r})")
        if contains is not None and contains not in res.get("stdout", ""):
            raise Wrong(f"stdout {res.get('stdout')!r} lacks {contains!r}")

    def op(self, w, kind, c):
        me = self.workers[w]
        n = nonce()
        if kind == "script":  # the small policy (its own templates)
            res = self.run(c, {"code": f"n = {n}\nprint(n * 7 + 3)"}, me["tiny"])
            self.want(res, "ok", f"{n * 7 + 3}\n")
        elif kind == "pooled":
            res = self.run(c, {"code": f"import numpy as np\nn = {n}\nprint(int(np.int64(n) * 3 - 1))"}, me["sid"])
            self.want(res, "ok", f"{n * 3 - 1}\n")
        elif kind == "kernel":
            res = self.run(c, {"code": f"x = {n}\nprint(x * 5)\nx - 1"}, me["kernel"])
            self.want(res, "ok", f"{n * 5}\n")
            if (res.get("result") or {}).get("text/plain") != str(n - 1):
                raise Wrong(f"kernel result {res.get('result')!r} (want {n - 1})")
        elif kind == "shell":
            res = self.run(c, {"code": f"echo $(( {n} * 3 )) soak", "language": "shell"}, me["sid"])
            self.want(res, "ok", f"{n * 3} soak\n")
        elif kind == "file":
            files = me["files"]
            if len(files) > 12:  # stay far below the workspace quota
                path = random.choice(sorted(set(files) - {"keep.bin"}))
                self.call(c, "DELETE", f"/v1/sessions/{me['sid']}/files/{path}", 200)
                del files[path]
            data = os.urandom(random.randrange(1, 8192))
            path = f"up/{n}.bin"
            r = self.call(c, "PUT", f"/v1/sessions/{me['sid']}/files/{path}", 201, content=data)
            if r.json().get("path") != path:
                raise Wrong(f"upload answered {r.text[:200]}")
            files[path] = sha(data)
            got = self.call(c, "GET", f"/v1/sessions/{me['sid']}/files/{path}", 200).content
            if sha(got) != files[path]:
                raise Wrong(f"{path}: downloaded {len(got)} bytes, not what was uploaded ({len(data)})")
            listing = {e["path"]: e for e in self.call(c, "GET", f"/v1/sessions/{me['sid']}/files", 200).json()}
            if path not in listing or listing[path]["size_bytes"] != len(data):
                raise Wrong(f"{path} missing or wrong size in the listing")
        elif kind == "readback":  # the sandbox sees what was uploaded, byte for byte
            files = me["files"]
            if not files:
                return self.op(w, "file", c)
            path = random.choice(sorted(files))
            code = f"import hashlib\nprint(hashlib.sha256(open({path!r}, 'rb').read()).hexdigest(), {n})"
            res = self.run(c, {"code": code}, me["sid"])
            self.want(res, "ok", f"{files[path]} {n}\n")
        elif kind == "plot":
            code = (f"import matplotlib.pyplot as plt\nplt.plot([1, {n % 97}, 3])\n"
                    f"plt.savefig('plot-{n}.png')\nprint({n})")
            res = self.run(c, {"code": code}, me["sid"])
            self.want(res, "ok", f"{n}\n")
            names = [a.get("path") or a.get("name") for a in res.get("artifacts", [])]
            if f"plot-{n}.png" not in names:
                raise Wrong(f"plot-{n}.png not among the artifacts {names}")
            png = self.call(c, "GET", f"/v1/sessions/{me['sid']}/files/plot-{n}.png", 200).content
            if not png.startswith(b"\x89PNG"):
                raise Wrong("the plot is not a PNG")
            self.call(c, "DELETE", f"/v1/sessions/{me['sid']}/files/plot-{n}.png", 200)
        elif kind == "timeout":
            code = f"import time\nprint({n}, flush=True)\ntime.sleep(60)"
            res = self.run(c, {"code": code, "timeout_s": 2}, me["sid"])
            self.want(res, "timeout", contains=f"{n}\n")
        elif kind == "oom":
            code = f"print({n}, flush=True)\nb = []\nwhile True:\n    b.append(b'x' * (16 << 20))\n"
            res = self.run(c, {"code": code}, me["tiny"])
            self.want(res, "oom", contains=f"{n}\n")
        elif kind == "session":  # create, use, delete, gone
            sid = self.call(c, "POST", "/v1/sessions", 201, json={}).json()["id"]
            data = os.urandom(512)
            self.call(c, "PUT", f"/v1/sessions/{sid}/files/in.bin", 201, content=data)
            code = f"import hashlib\nprint(hashlib.sha256(open('in.bin', 'rb').read()).hexdigest(), {n})"
            self.want(self.run(c, {"code": code}, sid), "ok", f"{sha(data)} {n}\n")
            self.call(c, "DELETE", f"/v1/sessions/{sid}", 200)
            self.call(c, "GET", f"/v1/sessions/{sid}", 404)
        elif kind == "oneshot":  # no session: the daemon makes one; we delete it
            res = self.run(c, {"code": f"print({n} + 1)"})
            self.want(res, "ok", f"{n + 1}\n")
            self.call(c, "DELETE", f"/v1/sessions/{res['session_id']}", 200)

    def worker(self, w, deadline):
        kinds, weights = zip(*MIX.items())
        rng = random.Random()
        with self.client() as c:
            while True:
                self.up.wait()
                with self.lock:
                    if self.started >= self.runs or time.time() > deadline:
                        return
                    self.started += 1
                    epoch = self.epoch
                kind = rng.choices(kinds, weights)[0]
                try:
                    self.op(w, kind, c)
                    outcome, detail = "ok", None
                except Down as e:
                    # Allowed only if a fault began while this request was in flight.
                    with self.lock:
                        moved = self.epoch != epoch or not self.up.is_set()
                    outcome, detail = ("interrupted" if moved else "lost"), str(e)
                except Wrong as e:
                    # A run still going when SIGTERM's grace ended is killed by the
                    # drain (the daemon says so): in flight during the fault, allowed.
                    with self.lock:
                        moved = self.epoch != epoch or not self.up.is_set()
                    drained = moved and str(e).startswith("status killed")
                    outcome, detail = ("interrupted" if drained else "wrong"), str(e)
                except Exception as e:  # noqa: BLE001 - a bug in the daemon's answer shape
                    outcome, detail = "wrong", f"{type(e).__name__}: {e}"
                with self.lock:
                    self.finished += 1
                    self.outcomes[(kind, outcome)] += 1
                    if detail and len(self.problems) < 40:
                        self.problems.append((kind, outcome, detail))

    # --- faults and checks ---------------------------------------------------

    def setup(self):
        with self.client() as c:
            for w in range(CLIENTS):
                sid = self.call(c, "POST", "/v1/sessions", 201, json={"id": f"soak-{w}"}).json()["id"]
                tiny = self.call(c, "POST", "/v1/sessions", 201, json={"id": f"soak-t{w}", "policy": "tiny"}).json()["id"]
                kern = self.call(c, "POST", "/v1/sessions", 201, json={"id": f"soak-k{w}", "mode": "kernel"}).json()["id"]
                keep = os.urandom(4096)
                self.call(c, "PUT", f"/v1/sessions/{sid}/files/keep.bin", 201, content=keep)
                self.workers[w] = {"sid": sid, "tiny": tiny, "kernel": kern, "files": {"keep.bin": sha(keep)}}

    def check_intact(self, when):
        """Every session is there, and every file whose upload was answered 201 reads
        back with its hash (through the API, and for keep.bin from inside a sandbox)."""
        with self.client() as c:
            for w, me in self.workers.items():
                for sid in (me["sid"], me["tiny"], me["kernel"]):
                    r = c.get(f"/v1/sessions/{sid}")
                    assert r.status_code == 200, f"{when}: session {sid} gone: {r.status_code} {r.text}"
                    self.checks["sessions"] += 1
                for path, h in me["files"].items():
                    r = c.get(f"/v1/sessions/{me['sid']}/files/{path}")
                    assert r.status_code == 200 and sha(r.content) == h, \
                        f"{when}: {me['sid']}/{path}: {r.status_code}, hash {'same' if sha(r.content) == h else 'differs'}"
                    self.checks["files"] += 1
                n = nonce()
                code = f"import hashlib\nprint(hashlib.sha256(open('keep.bin', 'rb').read()).hexdigest(), {n})"
                r = c.post(f"/v1/sessions/{me['sid']}/runs", json={"code": code})
                assert r.status_code == 200 and r.json()["stdout"] == f"{me['files']['keep.bin']} {n}\n", \
                    f"{when}: keep.bin seen from a sandbox: {r.text[:300]}"
                r = c.post(f"/v1/sessions/{me['kernel']}/runs", json={"code": f"print({n})"})
                assert r.status_code == 200 and r.json()["stdout"] == f"{n}\n", f"{when}: kernel: {r.text[:300]}"
                self.checks["sandbox reads"] += 1

    def fault(self, sig):
        d = self.daemon
        with self.lock:
            self.epoch += 1
            at = self.finished
        self.up.clear()
        t0 = time.time()
        if sig == signal.SIGTERM:
            # A run in flight that outlasts the probe's first try, so the drain is
            # there to be seen however quickly the workers' runs end (pooled ones
            # end in milliseconds); the drain lets it finish.
            held = {}

            def hold():
                try:
                    with d.http(timeout=60) as c:
                        held["status"] = c.post("/v1/runs", json={"code": "import time\ntime.sleep(2)\nprint('held')"}).json()["status"]
                except (httpx.TransportError, ValueError, KeyError) as e:
                    held["status"] = type(e).__name__
            holder = threading.Thread(target=hold, daemon=True)
            holder.start()
            time.sleep(0.5)  # it is running
            d.proc.send_signal(sig)
            self.probe_drain()
            holder.join(timeout=60)
            self.held = held.get("status")
        d.stop(sig, timeout=60)
        stopped = time.time() - t0
        with self.lock:
            self.epoch += 1
        d.start()
        self.faults.append((signal.Signals(sig).name, at, round(stopped, 1), round(time.time() - t0, 1)))
        self.check_intact(f"after {signal.Signals(sig).name}")
        self.up.set()

    def probe_drain(self):
        """While SIGTERM drains the runs in flight, a new client must be answered 503
        `unavailable` with Retry-After (DESIGN §4), not refused. Each probe is a new
        connection; the first answer after the signal is the one asserted."""
        d = self.daemon
        time.sleep(0.2)  # the daemon has seen the signal
        while d.proc.poll() is None:
            try:
                with d.http(timeout=10) as c:
                    r = c.post("/v1/runs", json={"code": "print(1)"})
                if r.status_code == 503 and "retry-after" in r.headers and '"unavailable"' in r.text:
                    self.drain.append("503")
                else:
                    self.drain.append(str(r.status_code))
            except httpx.TransportError as e:
                self.drain.append(type(e).__name__)
            time.sleep(0.05)

    def wait_finished(self, count, deadline, threads):
        while self.finished < count and time.time() < deadline and any(t.is_alive() for t in threads):
            time.sleep(0.05)

    def main(self):
        d = self.daemon
        d.start()
        self.setup()
        self.up.set()
        start = time.time()
        deadline = start + self.duration
        threads = [threading.Thread(target=self.worker, args=(w, deadline), daemon=True) for w in range(CLIENTS)]
        for t in threads:
            t.start()
        # The faults come a third and two thirds of the way, while all clients are busy.
        for frac, sig in ((1 / 3, signal.SIGKILL), (2 / 3, signal.SIGTERM)):
            self.wait_finished(int(self.runs * frac), start + self.duration * frac, threads)
            self.fault(sig)
        for t in threads:
            t.join()
        self.check_intact("at the end")
        elapsed = time.time() - start
        d.stop(signal.SIGTERM, timeout=60)
        # Killed processes may take a moment to finish exiting after the daemon
        # has (a large memory to free): what is left 5 s later was left.
        settle = time.time() + 5
        while True:
            self.leftovers = leftovers(d)
            if not any(self.leftovers.values()) or time.time() > settle:
                break
            time.sleep(0.1)
        return elapsed

    # --- report ---------------------------------------------------------------

    def summary(self, elapsed):
        kinds = sorted({k for k, _ in self.outcomes})
        cols = ["ok", "interrupted", "lost", "wrong"]
        lines = [f"soak: {self.finished} runs in {elapsed:.0f} s, {CLIENTS} clients, instance {self.daemon.instance}",
                 f"{'kind':<10}" + "".join(f"{c:>13}" for c in cols)]
        for k in kinds:
            lines.append(f"{k:<10}" + "".join(f"{self.outcomes[(k, c)]:>13}" for c in cols))
        lines.append(f"{'total':<10}" + "".join(f"{self.total(c):>13}" for c in cols))
        for name, at, stopped, back in self.faults:
            lines.append(f"fault {name} after {at} runs: stopped in {stopped} s, healthy again after {back} s")
        lines.append("new clients while SIGTERM drained: "
                     + ", ".join(f"{v} {k}" for k, v in collections.Counter(self.drain).items()))
        lines.append("intact across restarts: " + ", ".join(f"{v} {k}" for k, v in self.checks.items()))
        for what in ("processes", "mounts", "loop devices", "cgroups"):
            items = self.leftovers.get(what, [])
            lines.append(f"left after the stop: {what:<12} {len(items)}")
            lines.extend(f"    {i}" for i in items[:20])
        for p in self.problems:
            lines.append(f"  {p[0]} {p[1]}: {p[2]}")
        return "\n".join(lines)

    def total(self, outcome):
        return sum(v for (_, o), v in self.outcomes.items() if o == outcome)

    def failures(self):
        bad = []
        if self.total("wrong"):
            bad.append(f"{self.total('wrong')} wrong results")
        if self.total("lost"):
            bad.append(f"{self.total('lost')} results lost outside the faults")
        if self.total("ok") == 0:
            bad.append("no run succeeded")
        if not self.drain or self.drain[0] != "503":
            bad.append(f"while SIGTERM drained, the first new client got {self.drain[:1]}, not 503 unavailable")
        if self.held != "ok":
            bad.append(f"the run in flight when SIGTERM came ended {self.held}, not ok (the drain lets it finish)")
        for what, items in self.leftovers.items():
            if items:
                bad.append(f"{len(items)} {what} left after the stop")
        return bad


def leftovers(d):
    """What the stopped daemon's instance left on the host (d.proc has exited)."""
    base = str(d.base)
    found = {"processes": [], "mounts": [], "loop devices": [], "cgroups": []}
    uids = range(d.uid_base, d.uid_base + UID_SPAN)
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            status = (p / "status").read_text()
            uid = int(status.split("Uid:")[1].split()[1])
            cgroups = (p / "cgroup").read_text()
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
        except (OSError, IndexError, ValueError):
            continue
        try:
            root = os.readlink(p / "root")
        except OSError:
            root = ""
        if uid in uids or d.instance in cgroups or root.startswith(base) or base in cmd:
            found["processes"].append(f"{p.name} uid={uid} {cmd}")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if base in line:
            found["mounts"].append(line)
    for dev in Path("/sys/block").glob("loop*"):
        try:
            backing = (dev / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        if backing.startswith(base):
            found["loop devices"].append(f"/dev/{dev.name} -> {backing}")
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        if not hierarchy.is_dir() or hierarchy.is_symlink():
            continue
        for dirpath, dirnames, _ in os.walk(hierarchy):
            for name in dirnames:
                if d.instance in name:
                    found["cgroups"].append(os.path.join(dirpath, name))
            dirnames[:] = [n for n in dirnames if d.instance not in n]
    return found


def soak(runs, duration, log=print):
    s = Soak(runs, duration, log)
    try:
        elapsed = s.main()
    finally:
        s.daemon.stop(signal.SIGKILL)
    text = s.summary(elapsed)
    log(text)
    return s, text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2000, help="requests to make in all (default 2000)")
    ap.add_argument("--duration", type=float, default=1800, help="stop starting new ones after this many seconds")
    a = ap.parse_args()
    s, _ = soak(a.runs, a.duration)
    bad = s.failures()
    print("FAIL: " + "; ".join(bad) if bad else "PASS")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
